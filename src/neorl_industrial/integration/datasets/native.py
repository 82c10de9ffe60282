"""The native format: a directory of ``.npy`` arrays plus ``dataset.json`` (the card).

::

    my-dataset/
      dataset.json          card: provenance, sizes, schema (dtype, shape), sha256 per file
      observations.npy      [N + E, obs] float32, episode-major, final observation appended
                            (stacked observations: [N + E H, obs / H] frames, H in the card)
      actions.npy           [N, act] float32, or [N] int32 (discrete)
      rewards.npy           [N] float32
      costs.npy             [N, n_costs] float32
      terminals.npy         [N] bool
      timeouts.npy          [N] bool
      episode_lengths.npy   [E] int32

Plain ``.npy`` files can be memory-mapped, which is what makes
:class:`~neorl_industrial.integration.datasets.memmap.MemmapSampler` possible.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.functional.state_management.dataset import episodes_dataset
from neorl_industrial.functional.transformations.data_parallel import (
    ShardPlan,
    local_shard_ids,
    plan_shards,
)
from neorl_industrial.integration.datasets.arrays import (
    STORED_ARRAYS,
    check_consistent,
    dataset_arrays,
    dataset_from_arrays,
)
from neorl_industrial.integration.datasets.card import ArraySpec, DatasetCard
from neorl_industrial.integration.datasets.errors import DatasetFormatError
from neorl_industrial.wrappers.hostio import atomic_directory, remove_stale_staging

CARD_FILE = "dataset.json"
#: Staging entries older than this (seconds) were left by a writer that was killed; a
#: younger one may belong to a writer still at work in the same directory.
STALE_STAGING_AGE = 3600.0


class _HashingWriter:
    """A write-only file wrapper that hashes what passes through it, so a checksum costs
    no second read of the file."""

    def __init__(self, file: BinaryIO):
        self._file = file
        self._hash = hashlib.sha256()

    def write(self, data: Any) -> int:
        self._hash.update(data)
        return self._file.write(data)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def clear_stale_staging(directory: str | os.PathLike[str], *, warn: bool = True) -> int:
    """Removes the hidden staging entries (``.<name>.*.tmp``) that writers killed in the
    middle of a save left in ``directory``, if older than :data:`STALE_STAGING_AGE`.

    Args:
        directory: where a dataset is about to be written (its parent directory).
        warn: say with a warning what was removed (a command line prints it instead).

    Returns:
        How many entries were removed.
    """
    directory = Path(directory).absolute()
    removed = remove_stale_staging(directory, older_than=STALE_STAGING_AGE)
    if removed and warn:
        warnings.warn(stale_staging_message(directory, removed), stacklevel=2)
    return removed


def stale_staging_message(directory: Path, removed: int) -> str:
    """What :func:`clear_stale_staging` removed, in words."""
    return (
        f"{directory}: removed {removed} staging entr{'y' if removed == 1 else 'ies'} "
        "(.<name>.*.tmp) left by interrupted writes"
    )


def is_native(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory holding a native dataset card."""
    return Path(path, CARD_FILE).is_file()


def save_native(
    dataset: Dataset,
    path: str | os.PathLike[str],
    card: DatasetCard | None = None,
    *,
    overwrite: bool = False,
) -> DatasetCard:
    """Writes ``dataset`` as a native directory, atomically.

    Args:
        dataset: the dataset to write.
        path: the directory to create.
        card: provenance to store with it; sizes, schema and checksums are filled in.
        overwrite: replace an existing native dataset at ``path`` (never a directory
            that is not one).

    Returns:
        The card as written.

    Raises:
        FileExistsError: if ``path`` exists and ``overwrite`` is false.
        ValueError: if the card's cost names do not match the data.

    Staging left next to ``path`` by saves that were killed is removed first (with a
    warning), see :func:`clear_stale_staging`.
    """
    path = Path(path)
    clear_stale_staging(path.absolute().parent)
    card = (card or DatasetCard(name=path.name)).with_sizes(dataset)
    arrays = dataset_arrays(dataset)
    with atomic_directory(
        path, overwrite=overwrite, replaceable=is_native, refusal="does not look like a dataset"
    ) as staging:
        schema, checksums = {}, {}
        for name, array in arrays.items():
            with open(staging / f"{name}.npy", "wb") as file:
                writer = _HashingWriter(file)
                # A non-file writer makes numpy stream the array in chunks through it.
                np.save(writer, array, allow_pickle=False)  # type: ignore[arg-type]
            schema[name] = ArraySpec(dtype=array.dtype.str, shape=list(array.shape))
            checksums[f"{name}.npy"] = writer.hexdigest()
        card = card.model_copy(update={"array_schema": schema, "checksums": checksums})
        (staging / CARD_FILE).write_text(card.to_json(), encoding="utf-8")
    return card


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def read_native_arrays(
    path: str | os.PathLike[str], *, verify: bool = True, mmap: bool = False
) -> tuple[dict[str, np.ndarray], DatasetCard]:
    """Opens the arrays of a native dataset after checking them against its card.

    Args:
        path: the dataset directory.
        verify: compare every file's sha256 with the card (reads every byte once).
        mmap: memory-map the arrays (read-only) instead of reading them into memory.

    Raises:
        DatasetFormatError: naming the file that is missing, corrupt, or whose dtype or
            shape disagrees with the card.
    """
    path = Path(path)
    if not path.is_dir():
        raise DatasetFormatError("not a directory (a native dataset is one)", path=path)
    card = DatasetCard.read(path / CARD_FILE)
    arrays = {}
    for name in STORED_ARRAYS:
        file = path / f"{name}.npy"
        if not file.is_file():
            raise DatasetFormatError(f"missing array file {file.name}", path=path)
        if verify:
            _verify_checksum(file, card)
        try:
            array = np.load(file, mmap_mode="r" if mmap else None, allow_pickle=False)
        except ValueError as error:
            raise DatasetFormatError(f"unreadable .npy file: {error}", path=file) from error
        _check_against_schema(file, name, array, card)
        arrays[name] = array
    frame_stack = card.frame_stack
    if card.sizes is not None and arrays["observations"].ndim == 2:
        stored = arrays["observations"].shape[1] * frame_stack
        if stored != card.sizes.observation_size:
            raise DatasetFormatError(
                f"{frame_stack} frame(s) of {arrays['observations'].shape[1]} values make "
                f"observations of {stored}, but {CARD_FILE} declares "
                f"{card.sizes.observation_size}",
                path=path / "observations.npy",
            )
    check_consistent(arrays, path, frame_stack)
    return arrays, card


def _verify_checksum(file: Path, card: DatasetCard) -> None:
    recorded = card.checksums.get(file.name)
    if recorded is None:
        raise DatasetFormatError(
            f"{CARD_FILE} records no checksum for this file; load with verify=False to skip "
            "the check",
            path=file,
        )
    actual = file_sha256(file)
    if actual != recorded:
        raise DatasetFormatError(
            f"sha256 mismatch: the file hashes to {actual}, {CARD_FILE} records {recorded}; "
            "the file is corrupt or was changed after the dataset was saved",
            path=file,
        )


def _check_against_schema(file: Path, name: str, array: np.ndarray, card: DatasetCard) -> None:
    spec = card.array_schema.get(name)
    if spec is None:
        return
    if np.dtype(spec.dtype) != array.dtype or list(array.shape) != spec.shape:
        raise DatasetFormatError(
            f"holds {array.dtype.str} {list(array.shape)}, but {CARD_FILE} declares "
            f"{spec.dtype} {spec.shape}",
            path=file,
        )


def load_native(
    path: str | os.PathLike[str], *, verify: bool = True, mmap: bool = False
) -> tuple[Dataset, DatasetCard]:
    """Loads a native dataset onto the device.

    Args:
        path: the dataset directory.
        verify: check every file's sha256 against the card.
        mmap: memory-map the files, so the only full copy made is the device's (no
            intermediate host copy of every array).

    Returns:
        ``(dataset, card)``.

    Raises:
        DatasetFormatError: naming the file that is missing, corrupt or inconsistent.
    """
    arrays, card = read_native_arrays(path, verify=verify, mmap=mmap)
    frame_stack = card.frame_stack
    # A dataset saved with whole observations gets its stacked frames found on load.
    return dataset_from_arrays(arrays, frame_stack if frame_stack > 1 else None), card


def load_native_shards(
    path: str | os.PathLike[str],
    n_shards: int,
    shard_ids: Sequence[int] | None = None,
    *,
    verify: bool = True,
) -> tuple[list[Dataset], ShardPlan, DatasetCard]:
    """Loads only some shards of a native dataset (contiguous, transition-balanced ranges
    of whole episodes, see :func:`plan_shards`) for data-parallel training: the files are
    memory-mapped and only the chosen episodes' rows are read.

    Args:
        path: the dataset directory.
        n_shards: how many shards the whole dataset is split into.
        shard_ids: the shards to load (default: this process's share,
            :func:`local_shard_ids`).
        verify: check every file's sha256 first (reads each file once, holds nothing).

    Returns:
        ``(shards, plan, card)``: every process that makes the plan from the same files
        gets the same plan.

    Raises:
        DatasetFormatError: as :func:`load_native`.
        DataParallelError: for more shards than episodes or shards that do not divide
            over the processes.
    """
    arrays, card = read_native_arrays(path, verify=verify, mmap=True)
    plan = plan_shards(np.asarray(arrays["episode_lengths"]), n_shards, card.frame_stack)
    ids = local_shard_ids(plan) if shard_ids is None else shard_ids
    shards = [
        episodes_dataset(arrays, *plan.episodes(int(shard)), card.frame_stack) for shard in ids
    ]
    return shards, plan, card
