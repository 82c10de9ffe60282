"""ADR-0003: the losses assert their inputs' dtypes at entry (at trace time, free after):
an integer where a value belongs, or a float where an action index belongs, fails there
with the argument named, not as a silent cast inside the loss."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from neorl_industrial.core.agents.discrete import cross_entropy_loss, discrete_cql_loss
from neorl_industrial.core.agents.fqe import fqe_loss
from neorl_industrial.core.agents.losses import critic_loss, expectile_loss

F = jnp.float32
INT = jnp.int32


@pytest.mark.parametrize(
    ("loss", "args"),
    [
        (critic_loss, (jnp.zeros(2, F), jnp.zeros((), F))),
        (expectile_loss, (jnp.zeros((), F), 0.7)),
        (fqe_loss, (jnp.zeros((2, 3), F), jnp.zeros(3, F))),
        (cross_entropy_loss, (jnp.zeros(4, F), jnp.zeros((), INT))),
        (
            lambda q, a, t: discrete_cql_loss(q, a, t, 1.0),
            (jnp.zeros(4, F), jnp.zeros((), INT), jnp.zeros((), F)),
        ),
    ],
    ids=["critic", "expectile", "fqe", "cross_entropy", "discrete_cql"],
)
def test_the_right_dtypes_pass_under_jit_and_a_wrong_one_fails_at_trace_time(loss, args):
    jax.jit(loss)(*args)
    for position, arg in enumerate(args):
        if not isinstance(arg, jax.Array):
            continue
        wrong = arg.astype(F if jnp.issubdtype(arg.dtype, jnp.integer) else INT)
        bad = (*args[:position], wrong, *args[position + 1 :])
        with pytest.raises(AssertionError, match="assert_type"):
            jax.jit(loss)(*bad)
