"""Host-side checks of environment parameters: a bad value fails at construction, naming
the field, before anything is traced."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def with_overrides(
    what: str, defaults: dict[str, Any], overrides: dict[str, Any]
) -> dict[str, Any]:
    """``defaults`` updated with ``overrides``; an unknown field fails, naming it and the
    fields ``what`` (a task's name) has."""
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise ValueError(
            f"{unknown[0]}: unknown {what} parameter; expected one of {sorted(defaults)}"
        )
    return {**defaults, **overrides}


def finite_number(
    field: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    positive: bool = False,
) -> float:
    """``value`` as a float, checked to be finite and within ``[low, high]``.

    Raises:
        ValueError: naming ``field``, the value, and the range it must lie in.
    """
    if isinstance(value, bool):
        raise ValueError(f"{field}: expected a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{field}: expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{field}: expected a finite number, got {value!r}")
    if positive and number <= 0.0:
        raise ValueError(f"{field}: must be positive, got {number}")
    if (low is not None and number < low) or (high is not None and number > high):
        raise ValueError(
            f"{field}: must lie in [{'-inf' if low is None else low}, "
            f"{'inf' if high is None else high}], got {number}"
        )
    return number


def positive_int(field: str, value: Any) -> int:
    """``value`` as a positive int (bools and floats refused).

    Raises:
        ValueError: naming ``field`` and the value.
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{field}: expected a positive integer, got {value!r}")
    return int(value)


def finite_array(
    field: str,
    value: Any,
    shape: tuple[int | None, ...],
    *,
    low: np.ndarray | float | None = None,
    high: np.ndarray | float | None = None,
    positive: bool = False,
) -> np.ndarray:
    """``value`` as a float64 array of ``shape`` (``None``: any length), finite, within
    ``[low, high]`` elementwise, and above 0 where ``positive``.

    Raises:
        ValueError: naming ``field``, the index of the first bad element and its value.
    """
    try:
        array = np.asarray(value, np.float64)
    except (TypeError, ValueError):
        raise ValueError(
            f"{field}: expected numbers of shape {list(shape)}, got {value!r}"
        ) from None
    if array.ndim != len(shape) or any(
        want is not None and got != want for got, want in zip(array.shape, shape, strict=True)
    ):
        raise ValueError(f"{field}: expected shape {list(shape)}, got {list(array.shape)}")
    bad = ~np.isfinite(array)
    if low is not None:
        bad |= array < low
    if high is not None:
        bad |= array > high
    if positive:
        bad |= array <= 0.0
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        where = index[0] if len(index) == 1 else list(index)
        bounds = ""
        if low is not None or high is not None:
            low_at = None if low is None else np.broadcast_to(low, array.shape)[index]
            high_at = None if high is None else np.broadcast_to(high, array.shape)[index]
            bounds = f" in [{low_at}, {high_at}]"
        if positive:
            bounds += " above 0"
        raise ValueError(f"{field}[{where}]: expected a finite number{bounds}, got {array[index]}")
    return array
