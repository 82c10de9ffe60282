"""Units by pint: the spellings datasets, maps and OPC UA servers use name the same unit;
a real conversion is computed exactly (affine for temperatures) and never taken for the
same unit; gauge and absolute pressures and different quantities are refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from neorl_industrial.core.units import (
    UNECE_CODES,
    IncompatibleUnitsError,
    UnitError,
    conversion,
    parse_unit,
    same_unit,
    unece_code,
    unece_unit,
    unit_id,
)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("°C", "degC"),
        ("m³/h", "m3/h"),
        ("m³/h", "m**3/h"),
        ("m^3/h", "m3/h"),
        ("%", "percent"),
        ("l/min", "dm³/min"),
        ("L/min", "l/min"),
        ("min⁻¹", "1/min"),
        ("r/min", "rpm"),
        ("kg/m³", "kg/m3"),
        ("N·m", "N*m"),
        ("lbf/in²", "psi"),
        ("bar(g)", "barg"),
        ("1", ""),
    ],
)
def test_spellings_of_one_unit_are_the_same_unit(first, second):
    assert same_unit(first, second) and same_unit(second, first)
    assert conversion(first, second).identity


@pytest.mark.parametrize(
    ("source", "target", "value", "expected"),
    [
        ("degF", "degC", 212.0, 100.0),
        ("°F", "degC", 32.0, 0.0),
        ("degC", "K", 0.0, 273.15),
        ("bar", "kPa", 1.5, 150.0),
        ("m³/h", "l/min", 1.0, 1000.0 / 60.0),
        ("%", "1", 50.0, 0.5),
        ("ft", "m", 10.0, 3.048),
    ],
)
def test_a_real_conversion_is_exact_and_not_the_same_unit(source, target, value, expected):
    found = conversion(source, target)
    assert not found.identity and not same_unit(source, target)
    assert found(value) == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert found.inverse(found(value)) == pytest.approx(value, rel=1e-12, abs=1e-12)
    values = np.array([value, 2 * value])
    np.testing.assert_allclose(found(values), [found(value), found(2 * value)])
    assert found.affine == source.endswith(("F", "degC"))


def test_the_conversion_says_itself():
    assert conversion("degF", "degC").describe() == "degC = 0.555556 * degF - 17.7778"
    assert conversion("bar", "kPa").describe() == "kPa = 100 * bar"


@pytest.mark.parametrize(
    ("source", "target", "message"),
    [
        ("m", "m3/h", r"'m' \(\[length\]\) cannot be converted into 'm3/h'"),
        ("bar", "barg", "differ by the atmosphere's pressure"),
        ("bar(a)", "bar(g)", "'bar\\(a\\)' is a absolute and 'bar\\(g\\)' a gauge"),
        ("degC", "%", "cannot be converted"),
    ],
)
def test_units_no_conversion_relates_are_refused_by_name(source, target, message):
    with pytest.raises(IncompatibleUnitsError, match=message):
        conversion(source, target)
    assert not same_unit(source, target)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("widgets per shift", "not a unit pint knows"),
        ("degC\x1b[31m", "control characters"),
        ("m\nh", "control characters"),
        ("m" * 65, "longer than 64"),
        ("kg(g)", "for pressures"),
    ],
)
def test_text_that_is_not_a_unit_is_named(text, message):
    with pytest.raises(UnitError, match=message):
        parse_unit(text)


def test_unknown_units_are_the_same_only_as_written():
    assert same_unit("vendor-units", "vendor-units")
    assert not same_unit("vendor-units", "other-units")
    assert same_unit(None, None) and not same_unit("m", None)


def test_unece_common_codes_and_their_unit_ids():
    # EUInformation.UnitId: the code's characters as one big-endian integer.
    assert unit_id("CEL") == 4408652 and unece_code(4408652) == "CEL"
    assert unit_id("P1") == 20529 and unece_unit(20529) == "%"
    assert unece_unit("mqh") == "m³/h" and unece_unit(unit_id("FAH")) == "°F"
    assert unece_unit(-1) is None and unece_unit("ZZZ") is None and unece_code(0) is None
    for code, display in UNECE_CODES.items():
        assert unece_code(unit_id(code)) == code
        parse_unit(display)  # every display name is a unit the library reads
    assert same_unit(unece_unit("CEL"), "degC") and same_unit(unece_unit("MQH"), "m3/h")
    assert same_unit(unece_unit("KPA"), "kPa") and not same_unit(unece_unit("BAR"), "kPa")
