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
        # Comparisons: 1 where they hold, 0 where not; a chain holds where every link does.
        ("t > 350", [0.0, 0.0, 1.0]),
        ("t >= 350", [0.0, 1.0, 1.0]),
        ("v < 50", [1.0, 0.0, 0.0]),
        ("v <= 50", [1.0, 1.0, 0.0]),
        ("300 < t <= 400", [0.0, 1.0, 1.0]),
        ("(t - 320) * (t > 320) + 10 * (v >= 100)", [0.0, 30.0, 90.0]),
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
        "t == 3",
        "t != 3",
        "t > 3 and t < 4",
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


# ----- hostile input: every one is a ValueError saying what is wrong, never a crash -------
@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("1" + "0" * 400, "401-digit number literal is larger than a float64"),
        ("1e400", "number literal is larger than a float64"),
        ("-" * 995 + "t", "nested 995 levels deep, more than 100"),
        ("~" * 995 + "t", "nested 995 levels deep, more than 100"),
        ("(" * 150 + "t" + ")" * 150, "nested 150 levels deep"),
        ("abs(" * 120 + "t" + ")" * 120, "nested 120 levels deep"),
        ("t" + " + t" * 150, "nested 150 levels deep"),
        ("t ** " * 120 + "t", "nested 120 levels deep"),
        ("t.__class__", "is not allowed"),
        ("system(t)", "is not allowed"),
        ("np.exp(t)", "is not allowed"),
        ("(lambda: t)()", "is not allowed"),
        ("[t for t in v]", "is not allowed"),
    ],
)
def test_hostile_expressions_are_value_errors_that_say_why(source, message):
    with pytest.raises(ValueError, match=message):
        Expression(source)


def test_the_deepest_accepted_nesting_compiles_and_evaluates_on_a_deep_stack():
    def on_a_deep_stack(depth, run):
        return run() if depth == 0 else on_a_deep_stack(depth - 1, run)

    nested = "max(" * 99 + "t" + ", 0)" * 99
    expression = on_a_deep_stack(300, lambda: Expression(nested))
    values = on_a_deep_stack(300, lambda: expression.evaluate(COLUMNS, 3))
    np.testing.assert_allclose(values, COLUMNS["t"])
    assert Expression("-" * 100 + "t").evaluate(COLUMNS, 3).tolist() == [300.0, 350.0, 400.0]


def test_a_huge_exponent_is_infinity_not_an_endless_computation():
    # Computed, not written: the caller reports the row where it is not finite.
    assert np.isinf(Expression("10 ** 10 ** 10 ** 10").evaluate(COLUMNS, 3)).all()
    assert np.isinf(Expression("t ** 1e300").evaluate(COLUMNS, 3)).all()
