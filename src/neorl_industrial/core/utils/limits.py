"""The sane ranges of the numbers a file or flag may set: bounds, limits, periods, text.

A number that looks like a limit but overflows float32 (``1e308``), or a period of
``.inf``, switches a check off as surely as leaving it out would, without saying so. Every
schema, spec and configuration checks its numbers here, so the ranges are one fact and
every refusal says the allowed range.
"""

from __future__ import annotations

import math
import unicodedata

__all__ = [
    "MAX_MAGNITUDE",
    "MAX_SECONDS",
    "MIN_COEFFICIENT",
    "check_coefficient",
    "check_magnitude",
    "check_seconds",
    "check_text",
]

#: The largest magnitude of a plant quantity in its own unit (a bound, threshold, limit,
#: rate): far inside float32 (3.4e38) so that sums and products of a few of them stay
#: finite where the shield computes in float32. A quantity beyond it wants another unit
#: (MPa, not Pa).
MAX_MAGNITUDE = 1e12
#: The smallest magnitude of a non-zero coefficient: below it float32 rounds it to 0 (or
#: a subnormal that XLA flushes to 0), and a rule would silently lose its term.
MIN_COEFFICIENT = 1e-12
#: The longest duration in seconds any period, timeout or tolerance may state: one week.
MAX_SECONDS = 7 * 24 * 3600.0


def _at(what: str) -> str:
    # Inside a pydantic validator the field path is said by the error's location.
    return f"{what}: " if what else ""


def check_magnitude(value: float, what: str, *, low: float = -MAX_MAGNITUDE) -> float:
    """``value`` if it is a finite number in ``[low, MAX_MAGNITUDE]``.

    Raises:
        ValueError: ``"<what>: <value> is outside the allowed range [low, 1e+12] ..."``.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{_at(what)}expected a number, got {value!r}")
    if not (math.isfinite(value) and low <= value <= MAX_MAGNITUDE):
        raise ValueError(
            f"{_at(what)}{value} is outside the allowed range [{low:g}, {MAX_MAGNITUDE:g}] "
            "(a finite plant quantity; state a larger one in a larger unit)"
        )
    return value


def check_coefficient(value: float, what: str) -> float:
    """``value`` if it is 0 or a finite number with ``1e-12 <= |value| <= 1e12``.

    Raises:
        ValueError: naming ``what``, the value and the allowed range.
    """
    check_magnitude(value, what)
    if value != 0.0 and abs(value) < MIN_COEFFICIENT:
        raise ValueError(
            f"{_at(what)}{value} is too small to keep in float32; expected 0 or "
            f"{MIN_COEFFICIENT:g} <= |value| <= {MAX_MAGNITUDE:g} (rescale the rule)"
        )
    return value


def check_seconds(
    value: float, what: str, *, low: float = 0.0, high: float = MAX_SECONDS, open_low: bool = True
) -> float:
    """``value`` if it is a finite duration in seconds in ``(low, high]`` (``[low, high]``
    with ``open_low=False``).

    Raises:
        ValueError: naming ``what``, the value and the allowed range.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{_at(what)}expected a number of seconds, got {value!r}")
    above_low = value > low if open_low else value >= low
    if not (math.isfinite(value) and above_low and value <= high):
        bracket = "(" if open_low else "["
        raise ValueError(
            f"{_at(what)}{value} s is outside the allowed range {bracket}{low:g}, {high:g}] s"
        )
    return value


def check_text(value: str, what: str, *, max_length: int = 200, allow: str = "") -> str:
    """``value`` if it holds no control or format character (escape codes, newlines,
    tabs, NUL, bidirectional overrides) and at most ``max_length`` characters: a name or
    unit is printed in reports and logs, where an escape code would rewrite the terminal
    and a newline forge a line. ``allow``: characters accepted all the same (a
    description's newlines).

    Raises:
        ValueError: naming ``what``, the first control character and its position.
    """
    for position, character in enumerate(value):
        if unicodedata.category(character).startswith("C") and character not in allow:
            raise ValueError(
                f"{_at(what)}control character U+{ord(character):04X} at position {position}; "
                "expected printable text (no escape codes, newlines or tabs)"
            )
    if len(value) > max_length:
        raise ValueError(f"{_at(what)}{len(value)} characters; at most {max_length} allowed")
    return value
