"""The stored arrays of a dataset and the episode indices rebuilt from them.

On disk a dataset is seven flat arrays; the sampling indices of the
:class:`~neorl_industrial.functional.state_management.Dataset` follow from the episode
lengths alone, so they are recomputed on load (a few vectorized numpy passes) instead of
being stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from os import PathLike

import numpy as np

from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.integration.datasets.errors import DatasetFormatError

# Order is the file order of the native format and of the card's schema.
STORED_ARRAYS = (
    "observations",
    "actions",
    "rewards",
    "costs",
    "terminals",
    "timeouts",
    "episode_lengths",
)


def dataset_arrays(dataset: Dataset, *, frames: bool = True) -> dict[str, np.ndarray]:
    """Host copies of the arrays that define ``dataset`` (indices excluded); see
    :meth:`Dataset.stored_arrays` (``frames=False``: whole observations, for readers that
    know no frames)."""
    return dataset.stored_arrays(frames=frames)


def episode_bounds(episode_lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, ends)`` transition index of each episode's first step and one past its
    last, as int64 (``ends`` is the cumulative sum of the lengths)."""
    ends = np.cumsum(np.asarray(episode_lengths, np.int64))
    return ends - episode_lengths, ends


def check_consistent(
    arrays: Mapping[str, np.ndarray], path: str | PathLike[str], frame_stack: int = 1
) -> None:
    """Checks that the stored arrays describe one set of episodes (observations stored as
    frames when ``frame_stack > 1``: ``N + E frame_stack`` rows).

    Raises:
        DatasetFormatError: naming the array whose length disagrees with the episode
            lengths.
    """
    lengths = arrays["episode_lengths"]
    if lengths.ndim != 1 or len(lengths) == 0:
        raise DatasetFormatError(
            f"expected a non-empty 1-D array, got shape {lengths.shape}",
            path=path,
            column="episode_lengths",
        )
    if np.any(lengths < 1):
        row = int(np.argmax(lengths < 1))
        raise DatasetFormatError(
            f"episode length {int(lengths[row])}; every episode needs at least one step",
            path=path,
            column="episode_lengths",
            row=row,
        )
    n_transitions = int(lengths.sum(dtype=np.int64))
    n_episodes = len(lengths)
    expected = {"observations": n_transitions + n_episodes * frame_stack}
    expected |= {name: n_transitions for name in STORED_ARRAYS[1:-1]}
    for name, rows in expected.items():
        if arrays[name].shape[0] != rows:
            raise DatasetFormatError(
                f"{arrays[name].shape[0]} rows, but the episode lengths sum to "
                f"{n_transitions} transitions in {n_episodes} episodes, so {rows} are needed",
                path=path,
                column=name,
            )
    if arrays["observations"].ndim != 2 or arrays["costs"].ndim != 2:
        raise DatasetFormatError(
            "observations and costs must be 2-D ([rows, size])", path=path, column="observations"
        )


def dataset_from_arrays(arrays: Mapping[str, np.ndarray], frame_stack: int | None = 1) -> Dataset:
    """Builds the on-device :class:`Dataset` from the stored arrays (see
    :data:`STORED_ARRAYS`), recomputing its sampling indices; ``frame_stack=None`` finds
    stacked frames in whole observations (see :meth:`Dataset.from_arrays`).

    The arrays may be memory-mapped: each is read once, straight into device memory.
    Call :func:`check_consistent` first on untrusted input.
    """
    return Dataset.from_arrays(
        **{name: arrays[name] for name in STORED_ARRAYS}, frame_stack=frame_stack
    )
