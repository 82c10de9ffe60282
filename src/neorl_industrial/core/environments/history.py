"""Observations that carry the plant's recent past: the newest row's features under their
own names, then each earlier row's as ``name@t-1``, ``name@t-2``, ... (newest first).

A plant whose next state depends on more than one row shows (a transport delay, a slow
sensor, a hidden drift) gets its last rows stacked into one observation (a plant log's
``history: H``; the Industrial Benchmark's ``include_past``). The names say how the
observation is laid out, so a server, a shadow loop or an edge box keeping the last rows
knows which rows to stack, from the task alone.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["frame_of", "stacked_names"]


def stacked_names(frame: Sequence[str], history: int) -> tuple[str, ...]:
    """The observation names of ``history`` stacked rows of features ``frame``."""
    names = list(frame)
    for age in range(1, history):
        names += [f"{name}@t-{age}" for name in frame]
    return tuple(names)


def frame_of(names: Sequence[str]) -> tuple[tuple[str, ...], int]:
    """``(frame names, history)`` of observation ``names``: the shortest leading frame
    whose :func:`stacked_names` they are; ``(names, 1)`` when they stack no history."""
    names = tuple(names)
    for size in range(1, len(names) // 2 + 1):
        if len(names) % size == 0:
            frame = names[:size]
            history = len(names) // size
            if stacked_names(frame, history) == names:
                return frame, history
    return names, 1
