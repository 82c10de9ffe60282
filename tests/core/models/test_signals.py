"""The expression language's one parser, with numpy and with JAX: the same limits and
messages for both, literals that overflow to infinity, and JAX literals that take the
columns' precision."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.models.signals import MAX_DEPTH, MAX_LENGTH, compile_expression
from neorl_industrial.integration.datasets import expressions


def test_the_log_evaluates_the_language_of_the_model():
    # One owner: the log's limits are the model's, not a copy of them.
    assert (expressions.MAX_LENGTH, expressions.MAX_DEPTH) == (MAX_LENGTH, MAX_DEPTH)


@pytest.mark.parametrize("xp", [np, jnp], ids=["numpy", "jax"])
@pytest.mark.parametrize(
    ("source", "message"),
    [
        # Refused from the text, before the parser recurses through it.
        ("-" * 995 + "t", "nested 995 levels deep, more than 100"),
        ("(" * 400 + "t" + ")" * 400, "nested 400 levels deep, more than 100"),
        # Refused from the tree, before compiling recurses through it.
        ("t" + " + t" * 150, "nested 150 levels deep, more than 100"),
        ("1" + "0" * 400, "401-digit number literal is larger than a float64"),
        ("t +", "not a valid expression"),
        ("t" * (MAX_LENGTH + 1), f"longer than {MAX_LENGTH}"),
        ("t.__class__", "is not allowed"),
    ],
)
def test_both_array_modules_refuse_the_same_text_with_the_same_message(xp, source, message):
    with pytest.raises(ValueError, match=message):
        compile_expression(source, xp)
    with pytest.raises(ValueError, match=message):
        expressions.Expression(source)


@pytest.mark.parametrize("xp", [np, jnp], ids=["numpy", "jax"])
def test_literals_overflow_to_infinity_instead_of_raising_or_hanging(xp):
    for source in ("10 ** 10 ** 10", "1 / 0", "0 - 1 / 0"):
        function, names = compile_expression(source, xp)
        with np.errstate(all="ignore"):
            value = np.asarray(function({}))
        assert names == frozenset() and np.isinf(value), source


def test_a_jax_literal_takes_the_precision_of_the_columns():
    function, _ = compile_expression("0.1 * t + max(t, 2.5)", jnp)
    columns = {"t": jnp.asarray([1.0, 3.0], jnp.float32)}
    value = function(columns)
    assert value.dtype == jnp.float32
    np.testing.assert_allclose(value, [2.6, 3.3], rtol=1e-6)


def test_a_numpy_literal_is_a_float64():
    function, _ = compile_expression("t + 0.1", np)
    value = function({"t": np.asarray([1.0], np.float32)})
    assert value.dtype == np.float64
    assert value[0] == 1.1  # the literal is not rounded to float32


@pytest.mark.parametrize("xp", [np, jnp], ids=["numpy", "jax"])
def test_a_comparison_is_one_where_it_holds_in_both_array_modules(xp):
    # An alarm threshold as a cost: 1 where the reading is above it, 0 where not; a NaN
    # reading (a sensor fault) compares false in both modules.
    function, names = compile_expression("(temperature > 420) + (0 < valve <= 5)", xp)
    columns = {
        "temperature": xp.asarray([400.0, 420.0, 421.0, np.nan], xp.float32),
        "valve": xp.asarray([3.0, 0.0, 5.0, 6.0], xp.float32),
    }
    value = function(columns)
    assert names == frozenset({"temperature", "valve"})
    # A float as every other value of the language (numpy's a float64, as its literals).
    assert value.dtype == (np.float64 if xp is np else jnp.float32)
    np.testing.assert_array_equal(np.asarray(value), [1.0, 0.0, 2.0, 0.0])
