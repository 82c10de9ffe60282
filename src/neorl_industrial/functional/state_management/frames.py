"""Stacked observations stored as frames: an episode holds its first observation's
``H`` frames (oldest first) and then one new frame per step, and an observation is the
``H`` stored rows ending at its newest frame (newest first). Finding the stacking in the
data, converting stacked observations to frames, and the row arithmetic of gathering
them back."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

__all__ = [
    "find_frame_stack",
    "gather_stacked",
    "observation_rows",
    "padded_frames",
    "stored_rows",
    "to_frames",
]


def gather_stacked(frames: Any, rows: Any, frame_stack: int) -> Any:
    """``[..., frame_stack * F]`` observations ending at stored ``rows`` of ``frames``
    (``[R, F]``), newest frame first; plain rows when ``frame_stack`` is 1. numpy in,
    numpy out (memory-mapped files included); otherwise jax."""
    if frame_stack == 1:
        return frames[rows]
    xp = np if isinstance(frames, np.ndarray) else jnp
    rows = xp.asarray(rows)
    stacked = frames[rows[..., None] - xp.arange(frame_stack)]
    return stacked.reshape(*rows.shape, frame_stack * frames.shape[1])


def stored_rows(indices: Any, episode: Any, frame_stack: int) -> Any:
    """Stored row of the observation of transition ``indices`` in episode ``episode``:
    each earlier episode stored one final observation and ``frame_stack - 1`` history
    frames more than it has transitions."""
    return indices + episode * frame_stack + frame_stack - 1


def observation_rows(episode_lengths: Any, frame_stack: int) -> np.ndarray:
    """``[N + E]`` stored row of every observation, episode-major: episode ``e`` stored
    ``frame_stack - 1`` history frames more than observations before each of its own."""
    lengths = np.asarray(episode_lengths, np.int64)
    episode = np.repeat(np.arange(len(lengths)), lengths + 1)
    return np.arange(len(episode)) + (episode + 1) * (frame_stack - 1)


#: Rows compared at once while looking for stacked frames (bounds the temporary memory).
_FRAME_CHECK_ROWS = 1 << 15


def find_frame_stack(observations: Any, episode_lengths: Any) -> int:
    """How many frames each observation stacks, found in the data: the largest ``H > 1``
    dividing the observation size such that, within every episode, each observation is the
    previous one shifted by one frame of ``size / H`` values (newest frame first), compared
    exactly; 1 when no such ``H`` exists (or episodes are too short to tell).

    ``observations`` is ``[N + E, size]``, episode-major with each final observation, as
    :meth:`Dataset.from_arrays` takes them. Reads the rows in blocks, so a memory-mapped
    array is never copied whole.
    """
    size = int(observations.shape[1]) if np.ndim(observations) == 2 else 0
    candidates = [f for f in range(1, size // 2 + 1) if size % f == 0]
    lengths = np.asarray(episode_lengths, np.int64)
    # Pairs (row, row + 1) inside one episode: every row but each episode's last.
    last = np.cumsum(lengths + 1) - 1
    if not candidates or len(last) == 0 or int(lengths.sum()) < 2:
        return 1
    n_rows = int(last[-1]) + 1
    for frame in candidates:
        if _shifted_everywhere(observations, n_rows, last, frame):
            return size // frame
    return 1


def _shifted_everywhere(observations: Any, n_rows: int, last: np.ndarray, frame: int) -> bool:
    # A small first block rejects most sizes after a few rows.
    bounds = [0, *range(min(256, n_rows - 1), n_rows - 1, _FRAME_CHECK_ROWS)]
    for begin, end in zip(bounds, [*bounds[1:], n_rows - 1], strict=True):
        stop = end + 1
        block = np.asarray(observations[begin:stop])
        same = block[1:, frame:] == block[:-1, :-frame]
        inside = np.ones(len(block) - 1, bool)
        ends = last[(last >= begin) & (last < stop - 1)] - begin
        inside[ends] = False
        if not np.all(same[inside]):
            return False
    return True


def padded_frames(rows: np.ndarray, episode_lengths: Any, frame_stack: int) -> np.ndarray:
    """``[N + E H, F]`` frames of ``[N + E, F]`` single-frame rows (episode-major, each
    episode's final row included) for observations of ``frame_stack`` rows: each episode's
    first row repeated ``H - 1`` times as the history before it, then its rows."""
    lengths = np.asarray(episode_lengths, np.int64)
    firsts = np.cumsum(lengths + 1) - (lengths + 1)
    copies = np.ones(len(rows), np.int64)
    copies[firsts] = frame_stack
    return np.repeat(np.asarray(rows), copies, axis=0)


def to_frames(observations: np.ndarray, episode_lengths: Any, frame_stack: int) -> np.ndarray:
    """``[N + E H, size / H]`` frames of stacked ``[N + E, size]`` observations (see
    :func:`find_frame_stack`): per episode its first observation's frames, oldest first,
    then each later observation's newest frame."""
    lengths = np.asarray(episode_lengths, np.int64)
    frame = observations.shape[1] // frame_stack
    firsts = np.cumsum(lengths + 1) - (lengths + 1)  # first observation row of each episode
    frames = np.empty((int(lengths.sum()) + len(lengths) * frame_stack, frame), np.float32)
    frame_starts = firsts + np.arange(len(lengths)) * (frame_stack - 1)
    history = observations[firsts].reshape(len(lengths), frame_stack, frame)[:, ::-1]
    frames[(frame_starts[:, None] + np.arange(frame_stack)).reshape(-1)] = history.reshape(
        -1, frame
    )
    later = np.ones(len(observations), bool)
    later[firsts] = False
    frames[observation_rows(lengths, frame_stack)[later]] = observations[later, :frame]
    return frames
