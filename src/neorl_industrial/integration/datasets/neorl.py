"""The NeoRL ``.npz`` layout: flat transitions plus the start row of every trajectory.

Keys: ``obs`` ``[N, obs]``, ``next_obs`` ``[N, obs]``, ``action`` ``[N, act]``, ``reward``
``[N, 1]`` (or ``[N]``), ``done`` ``[N, 1]`` (or ``[N]``), ``index`` ``[E]`` (first row of
each trajectory, NeoRL's convention) and, an extension of ours, an optional ``cost``
``[N, n_costs]``. A trajectory that ends without ``done`` was cut off (a timeout).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.integration.datasets.errors import DatasetFormatError
from neorl_industrial.wrappers.hostio import atomic_file

_REQUIRED_KEYS = ("obs", "next_obs", "action", "reward", "done")


def load_neorl_npz(path: str | os.PathLike[str]) -> Dataset:
    """Reads a NeoRL-style ``.npz`` file.

    Trajectories are split at ``index``; within one, an episode also ends at ``done`` or
    where ``next_obs`` does not continue into the next row's ``obs``. Without ``index``
    only the latter two split episodes.

    Raises:
        DatasetFormatError: naming the file, key and row of a missing key, a length that
            disagrees, a NaN or an infinite value, or a bad ``index``.
    """
    path = Path(path)
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise DatasetFormatError(f"not a readable .npz file: {error}", path=path) from error
    with archive:
        missing = [key for key in _REQUIRED_KEYS if key not in archive.files]
        if missing:
            raise DatasetFormatError(
                f"missing key(s) {missing}; the file has {sorted(archive.files)}", path=path
            )
        try:
            data = {key: archive[key] for key in archive.files}
        except ValueError as error:
            raise DatasetFormatError(f"unreadable array: {error}", path=path) from error
    n = len(data["obs"])
    for key in (*_REQUIRED_KEYS, "cost"):
        if key in data:
            _check_array(path, key, data[key], n)
    rewards = _column(path, "reward", data["reward"])
    done = _column(path, "done", data["done"]).astype(bool)
    actions = data["action"]
    if np.issubdtype(actions.dtype, np.integer) and actions.ndim == 2 and actions.shape[1] == 1:
        actions = actions[:, 0]
    timeouts = np.zeros(n, bool)
    if "index" in data:
        starts = _trajectory_starts(path, data["index"], n)
        timeouts[np.append(starts[1:], n) - 1] = True
        timeouts &= ~done
    try:
        return Dataset.from_flat(
            observations=_matrix(data["obs"]),
            actions=actions,
            rewards=rewards,
            next_observations=_matrix(data["next_obs"]),
            terminals=done,
            timeouts=timeouts,
            costs=data.get("cost"),
            name=str(path),
        )
    except ValueError as error:
        raise DatasetFormatError(str(error)) from error


def _check_array(path: Path, key: str, array: np.ndarray, n: int) -> None:
    if array.dtype.kind not in "biuf":
        raise DatasetFormatError(
            f"dtype {array.dtype} is not numeric or boolean", path=path, column=key
        )
    if array.ndim == 0 or len(array) != n:
        rows = "a scalar" if array.ndim == 0 else f"{len(array)} rows"
        raise DatasetFormatError(
            f"{rows}, but 'obs' has {n}; every key needs one row per transition",
            path=path,
            column=key,
        )
    if array.dtype.kind == "f":
        finite = np.isfinite(array).reshape(n, -1).all(axis=1)
        if not finite.all():
            row = int(np.argmin(finite))
            raise DatasetFormatError("NaN or infinite value", path=path, column=key, row=row)


def _column(path: Path, key: str, array: np.ndarray) -> np.ndarray:
    if array.ndim == 2 and array.shape[1] == 1:
        return array[:, 0]
    if array.ndim != 1:
        raise DatasetFormatError(
            f"shape {array.shape}; expected [N] or [N, 1]", path=path, column=key
        )
    return array


def _matrix(array: np.ndarray) -> np.ndarray:
    return array.reshape(len(array), -1)


def _trajectory_starts(path: Path, index: np.ndarray, n: int) -> np.ndarray:
    index = np.asarray(index).reshape(-1)
    if not np.issubdtype(index.dtype, np.integer) or len(index) == 0:
        raise DatasetFormatError(
            f"expected a non-empty integer array of trajectory start rows, got {index.dtype} "
            f"{index.shape}",
            path=path,
            column="index",
        )
    if index[0] != 0:
        raise DatasetFormatError(
            f"the first trajectory starts at row {int(index[0])}; it must start at row 0",
            path=path,
            column="index",
            row=0,
        )
    increasing = np.diff(index) > 0
    if not increasing.all():
        row = int(np.argmin(increasing)) + 1
        raise DatasetFormatError(
            f"start row {int(index[row])} does not follow {int(index[row - 1])}; start rows "
            "must increase",
            path=path,
            column="index",
            row=row,
        )
    if index[-1] >= n:
        raise DatasetFormatError(
            f"start row {int(index[-1])} is past the last transition (row {n - 1})",
            path=path,
            column="index",
            row=len(index) - 1,
        )
    return index.astype(np.int64)


def save_neorl_npz(
    dataset: Dataset, path: str | os.PathLike[str], *, overwrite: bool = False
) -> None:
    """Writes ``dataset`` in the NeoRL ``.npz`` layout, atomically (temporary file, then
    rename). Costs are written as ``cost`` when the dataset has any.

    Raises:
        FileExistsError: if ``path`` exists and ``overwrite`` is false.
    """
    flat = dataset.to_flat()
    n = dataset.n_transitions
    arrays = {
        "obs": flat["observations"],
        "next_obs": flat["next_observations"],
        "action": flat["actions"],
        "reward": flat["rewards"].reshape(n, 1),
        "done": flat["terminals"].reshape(n, 1),
        "index": np.asarray(dataset.episode_starts, np.int64),
    }
    if dataset.n_costs:
        arrays["cost"] = flat["costs"]
    with atomic_file(path, overwrite=overwrite) as staging, open(staging, "wb") as file:
        np.savez(file, **arrays)
