"""Units of measurement, parsed, compared and converted by pint.

A unit is text as a dataset card, a map file or an OPC UA server states it. These
spellings are understood (each one names the same unit as the others in its row):

* pint's own: ``degC``, ``m**3/h``, ``m^3/h``, ``percent``, ``kPa``;
* the project's: a power written as digits after the unit, ``m3/h``, ``s-1``;
* the UNECE display names OPC UA servers send in ``EUInformation.DisplayName``: ``°C``,
  ``m³/h``, ``%``, ``‰``, ``min⁻¹``, ``N·m``, ``r/min``;
* the UNECE common codes of Recommendation 20 (``CEL``, ``MQH``, ``P1``), which OPC UA
  servers send as ``EUInformation.UnitId`` (the code's characters as one integer) in the
  namespace :data:`UNECE_NAMESPACE`: :func:`unece_unit` reads them.

Two texts are the same unit when converting one into the other changes no number
(``°C`` and ``degC``, ``l/min`` and ``dm³/min``). Any other pair is either a real
conversion, linear (``bar`` to ``kPa``: x 100) or affine (``degF`` to ``degC``), which
:func:`conversion` gives and the caller applies only where told to, or no conversion at
all (a flow and a level). Pressures stated as gauge (``bar(g)``, ``barg``, ``psig``) or
absolute (``bar(a)``, ``bara``, ``psia``) differ from each other and from a pressure that
states neither: they differ by the atmosphere's pressure, which no unit knows.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any

__all__ = [
    "UNECE_CODES",
    "UNECE_NAMESPACE",
    "Conversion",
    "IncompatibleUnitsError",
    "Unit",
    "UnitError",
    "conversion",
    "parse_unit",
    "same_unit",
    "unece_code",
    "unece_unit",
    "unit_id",
]

#: The namespace of ``EUInformation.UnitId`` values that are UNECE common codes.
UNECE_NAMESPACE = "http://www.opcfoundation.org/UA/units/un/cefact"

#: UNECE Recommendation 20 common codes of the units process plants report, with the
#: display name OPC UA gives each.
UNECE_CODES: dict[str, str] = {
    # temperature
    "CEL": "°C",
    "FAH": "°F",
    "KEL": "K",
    # length, area, volume
    "MTR": "m",
    "CMT": "cm",
    "MMT": "mm",
    "4H": "µm",
    "FOT": "ft",
    "INH": "in",
    "MTK": "m²",
    "MTQ": "m³",
    "LTR": "l",
    # flow
    "MQH": "m³/h",
    "MQS": "m³/s",
    "L2": "l/min",
    "E32": "l/h",
    "KGS": "kg/s",
    "E93": "kg/h",
    "E18": "t/h",
    # mass
    "KGM": "kg",
    "GRM": "g",
    "TNE": "t",
    # pressure
    "PAL": "Pa",
    "A97": "hPa",
    "KPA": "kPa",
    "MPA": "MPa",
    "BAR": "bar",
    "MBR": "mbar",
    "PS": "lbf/in²",
    # ratios
    "P1": "%",
    "C62": "1",
    "59": "ppm",
    # time, frequency, speed
    "SEC": "s",
    "MIN": "min",
    "HUR": "h",
    "HTZ": "Hz",
    "MTS": "m/s",
    "DD": "°",
    # electrical, power, energy
    "AMP": "A",
    "4K": "mA",
    "VLT": "V",
    "2Z": "mV",
    "WTT": "W",
    "KWT": "kW",
    "MAW": "MW",
    "KWH": "kW·h",
}

#: A pressure reference after the unit: ``bar(g)``, ``kPa (abs)``; or glued to it:
#: ``barg``, ``psia``.
_REFERENCE = re.compile(r"^(?P<unit>.+?)\s*\(\s*(?P<ref>g|a|abs|gauge|absolute)\s*\)$", re.I)
_GLUED = re.compile(r"^(?P<unit>bar|mbar|psi|kPa|MPa|Pa)(?P<ref>g|a)$")
_REFERENCES = {"g": "gauge", "gauge": "gauge", "a": "absolute", "abs": "absolute"}
_REFERENCES["absolute"] = "absolute"
#: A power as digits right after a unit's letters (``m3``, ``s-1``), not inside a
#: number (``1e3``).
_DIGIT_POWER = re.compile(r"(?<![\w.])([A-Za-zµμΩ]+)(-?[0-9]+)(?![\w.])")
#: What a unit's text may hold: letters, digits, the operators and the symbols of units.
_ALLOWED = re.compile(r"^[\w\s.*/^()·⋅%‰°µμΩ²³¹⁰⁴⁵⁶⁷⁸⁹⁻+\-'\"]*$")
MAX_LENGTH = 64
#: Numbers within this relative distance are equal (pint computes factors in floats).
_EXACT = 1e-9


class UnitError(ValueError):
    """Text that is not a unit of measurement."""


class IncompatibleUnitsError(UnitError):
    """Two units that no conversion relates (different quantities, or a gauge pressure
    and an absolute one)."""


@functools.cache
def _registry() -> Any:
    import pint

    registry = pint.UnitRegistry(autoconvert_offset_to_baseunit=False)
    # UNECE writes revolutions per minute r/min.
    registry.define("@alias revolution = rev = r")
    return registry


@dataclasses.dataclass(frozen=True)
class Unit:
    """A parsed unit: the text as given, pint's reading of it and, for a pressure, the
    reference it states (``gauge``, ``absolute``, or ``None``)."""

    text: str
    expression: str
    reference: str | None
    pint_unit: Any = dataclasses.field(compare=False, repr=False)

    @property
    def dimensionality(self) -> str:
        return str(self.pint_unit.dimensionality)

    def __str__(self) -> str:
        suffix = f" ({self.reference})" if self.reference else ""
        return f"{self.text!r} ({self.expression}{suffix})"


def _normalise(text: str) -> tuple[str, str | None]:
    """The expression pint reads and the pressure reference of ``text``."""
    reference = None
    match = _REFERENCE.match(text) or _GLUED.match(text)
    if match:
        reference = _REFERENCES[match["ref"].lower()]
        text = match["unit"].strip()
    if text in ("", "1", "-"):
        return "dimensionless", reference
    text = text.replace("⋅", "·").replace("μ", "µ")
    return _DIGIT_POWER.sub(r"\1**\2", text), reference


@functools.lru_cache(maxsize=1024)
def parse_unit(text: str) -> Unit:
    """The unit ``text`` states.

    Raises:
        UnitError: naming the text and why it is not a unit.
    """
    import pint

    if not isinstance(text, str):
        raise UnitError(f"unit {text!r}: expected text, got {type(text).__name__}")
    stripped = text.strip()
    if len(stripped) > MAX_LENGTH:
        raise UnitError(f"unit {stripped[:20]!r}...: longer than {MAX_LENGTH} characters")
    if not stripped.isprintable() or not _ALLOWED.match(stripped):
        raise UnitError(
            f"unit {stripped!r}: holds characters no unit has (control characters, "
            "escape codes or line breaks)"
        )
    expression, reference = _normalise(stripped)
    try:
        unit = _registry().Unit(expression)
    except (pint.errors.PintError, ValueError, TypeError, AttributeError) as error:
        raise UnitError(f"unit {stripped!r}: not a unit pint knows ({error})") from None
    except Exception as error:  # pint's parser raises bare errors on odd operators
        raise UnitError(f"unit {stripped!r}: cannot be read as a unit ({error})") from None
    if reference is not None and unit.dimensionality != _registry().Unit("Pa").dimensionality:
        raise UnitError(
            f"unit {stripped!r}: a gauge or absolute reference is for pressures, and "
            f"{expression!r} is not one"
        )
    return Unit(stripped, f"{unit:~}" or "1", reference, unit)


@dataclasses.dataclass(frozen=True)
class Conversion:
    """``value in target = scale * value in source + offset``."""

    source: str
    target: str
    scale: float
    offset: float = 0.0

    @property
    def identity(self) -> bool:
        """True when the conversion changes no number: the two are the same unit."""
        return abs(self.scale - 1.0) <= _EXACT and abs(self.offset) <= _EXACT * max(
            1.0, abs(self.scale)
        )

    @property
    def affine(self) -> bool:
        return abs(self.offset) > _EXACT * max(1.0, abs(self.scale))

    def __call__(self, value: Any) -> Any:
        """``value`` (a number or an array) from the source unit into the target unit."""
        if self.identity:
            return value
        return value * self.scale + self.offset

    def inverse(self, value: Any) -> Any:
        """``value`` from the target unit back into the source unit."""
        if self.identity:
            return value
        return (value - self.offset) / self.scale

    def describe(self) -> str:
        """In words: ``degC = 0.5556 * degF - 17.78``."""
        text = f"{self.target} = {self.scale:.6g} * {self.source}"
        if self.affine:
            text += f" {'-' if self.offset < 0 else '+'} {abs(self.offset):.6g}"
        return text


def conversion(source: str, target: str) -> Conversion:
    """How a value in ``source`` becomes one in ``target``.

    Raises:
        UnitError: a text that is not a unit.
        IncompatibleUnitsError: no conversion relates the two, naming both.
    """
    import pint

    a, b = parse_unit(source), parse_unit(target)
    if a.reference != b.reference:
        raise IncompatibleUnitsError(
            f"{source!r} is a {a.reference or 'pressure without reference'} and {target!r} a "
            f"{b.reference or 'pressure without reference'}: they differ by the atmosphere's "
            "pressure, which no unit states"
        )
    if a.pint_unit == b.pint_unit:
        return Conversion(a.text, b.text, 1.0, 0.0)
    quantity = _registry().Quantity
    try:
        at_zero = float(quantity(0.0, a.pint_unit).to(b.pint_unit).magnitude)
        at_one = float(quantity(1.0, a.pint_unit).to(b.pint_unit).magnitude)
    except (pint.errors.PintError, ValueError, TypeError) as error:
        raise IncompatibleUnitsError(
            f"{source!r} ({a.dimensionality}) cannot be converted into {target!r} "
            f"({b.dimensionality}): {error}"
        ) from None
    scale = at_one - at_zero
    if not (math.isfinite(scale) and math.isfinite(at_zero)) or scale == 0.0:
        raise IncompatibleUnitsError(f"{source!r} cannot be converted into {target!r}")
    return Conversion(a.text, b.text, scale, at_zero)


def same_unit(first: str | None, second: str | None) -> bool:
    """True when the two texts state the same unit (``°C`` and ``degC``); texts that are
    not units are the same only when equal as written. ``None`` (no unit stated) is the
    same only as ``None``."""
    if first is None or second is None:
        return first is None and second is None
    if first.strip() == second.strip():
        return True
    try:
        return conversion(first, second).identity
    except UnitError:
        return False


def unit_id(code: str) -> int:
    """The ``EUInformation.UnitId`` of a UNECE common code: its characters, as bytes of
    one big-endian integer (``CEL``: 4408652)."""
    value = 0
    for character in code.strip().upper():
        value = (value << 8) | ord(character)
    return value


def unece_code(identifier: int) -> str | None:
    """The UNECE common code an ``EUInformation.UnitId`` encodes (``None`` for -1 or an
    integer that is no code's)."""
    if not isinstance(identifier, int) or identifier <= 0 or identifier >= 1 << 24:
        return None
    characters = []
    while identifier:
        characters.append(chr(identifier & 0xFF))
        identifier >>= 8
    code = "".join(reversed(characters))
    return code if code.isascii() and code.isalnum() else None


def unece_unit(code: str | int) -> str | None:
    """The unit of a UNECE common code (``CEL`` or its UnitId 4408652: ``°C``); ``None``
    for a code this module does not list."""
    if isinstance(code, int):
        code = unece_code(code) or ""
    return UNECE_CODES.get(code.strip().upper())
