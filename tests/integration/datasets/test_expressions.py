"""The restricted expression language for rewards and costs."""

from __future__ import annotations

import numpy as np
import pytest

from neorl_industrial.integration.datasets import Expression

COLUMNS = {"t": np.asarray([300.0, 350.0, 400.0]), "v": np.asarray([0.0, 50.0, 100.0])}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("t", [300.0, 350.0, 400.0]),
        ("-abs(t - 350) - 0.01 * v", [-50.0, -0.5, -51.0]),
        ("(t - 300) ** 2 / 100", [0.0, 25.0, 100.0]),
        ("max(t - 320, 0, v - 60)", [0.0, 30.0, 80.0]),
        ("min(t, 350)", [300.0, 350.0, 350.0]),
        ("sqrt(v) + exp(0) + log(1) + +1", [2.0, np.sqrt(50) + 2, 12.0]),
        ("2", [2.0, 2.0, 2.0]),
    ],
)
def test_evaluates_the_allowed_language(source, expected):
    expression = Expression(source)
    np.testing.assert_allclose(expression.evaluate(COLUMNS, 3), expected)


def test_names_are_the_columns_used_but_not_the_functions():
    assert Expression("max(t, 0) + abs(v) * t").names == {"t", "v"}


@pytest.mark.parametrize(
    "source",
    [
        "__import__('os')",
        "t.real",
        "COLUMNS['t']",
        "t if v else 0",
        "t > 3",
        "lambda: 0",
        "round(t)",
        "max(*t)",
        "abs(t, key=v)",
        "'text'",
        "True",
        "t // 2",
        "not t",
    ],
)
def test_everything_else_is_rejected_before_evaluation(source):
    with pytest.raises(ValueError, match="is not allowed"):
        Expression(source)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("t +", "not a valid expression"),
        ("abs(t, v)", "abs takes one argument"),
        ("max(t)", "max takes two or more arguments"),
        ("t" * 1001, "longer than 1000"),
    ],
)
def test_malformed_expressions_say_why(source, message):
    with pytest.raises(ValueError, match=message):
        Expression(source)


def test_huge_constants_overflow_instead_of_hanging_or_raising():
    assert np.isinf(Expression("10 ** 10 ** 10").evaluate({}, 2)).all()
    assert np.isinf(Expression("1 / 0").evaluate({}, 1)).all()
    assert np.isnan(Expression("log(0 - 1)").evaluate({}, 1)).all()
