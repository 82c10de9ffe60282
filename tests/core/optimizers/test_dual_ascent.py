"""The dual ascent on Lagrange multipliers: the PID controller's own arithmetic, gradient
ascent on log λ, both as optax transformations stepped by the one apply_gradients; and the
per-step threshold of traced cost limits is the one of the same numbers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from neorl_industrial.core.agents.cost import per_step_cost_threshold
from neorl_industrial.core.optimizers import (
    GradientAscentConfig,
    PIDConfig,
    ascend,
    gradient_ascent,
    pid_ascent,
)


def _run(dual_ascent, initial, violations):
    multiplier = jnp.full((2,), initial, jnp.float32)
    opt_state = dual_ascent.init(multiplier)
    step = jax.jit(lambda m, s, v: ascend(dual_ascent, m, s, v))
    for violation in violations:
        multiplier, opt_state = step(multiplier, opt_state, jnp.asarray(violation))
    return multiplier, opt_state


def test_pid_follows_the_controllers_arithmetic():
    config = PIDConfig(kp=1.0, ki=0.5, kd=0.2)
    multiplier, state = _run(pid_ascent(config), 0.0, [[1.0, -1.0]] * 3)
    # Over the limit by 1: P = 1, I = 3 (integral of +1 three times) * 0.5, D = 0 after
    # the first step (the error did not change).
    np.testing.assert_allclose(multiplier, [1.0 + 1.5, 0.0])
    np.testing.assert_allclose(state.integral, [3.0, 0.0])
    # The first step's derivative: 0.2 * (1 - 0).
    first, _ = _run(pid_ascent(config), 0.0, [[1.0, -1.0]])
    np.testing.assert_allclose(first, [1.0 + 0.5 + 0.2, 0.0])
    # Under the limit the integral winds down, never below zero, and so does λ.
    multiplier, state = _run(pid_ascent(config), 0.0, [[1.0, -1.0]] * 3 + [[-1.0, -1.0]] * 5)
    np.testing.assert_allclose(state.integral, [0.0, 0.0])
    np.testing.assert_allclose(multiplier, [0.0, 0.0])


def test_pid_is_capped():
    multiplier, _ = _run(pid_ascent(PIDConfig(kp=10.0, max_multiplier=4.0)), 0.0, [[5.0, 0.0]])
    np.testing.assert_allclose(multiplier, [4.0, 0.0])


def test_gradient_ascent_rises_over_the_limit_falls_under_and_stays_positive():
    multiplier, state = _run(gradient_ascent(0.1), 1.0, [[1.0, -1.0]] * 20)
    assert float(multiplier[0]) > 2.0 and 0.0 < float(multiplier[1]) < 0.5
    # λ is exp(log λ) of the inner optimizer's parameters.
    np.testing.assert_allclose(multiplier, np.exp(state.log_multiplier), rtol=1e-6)


def test_gradient_ascent_is_adam_on_log_lambda():
    # One step by hand: the gradient of -λ v in log λ is -λ v; Adam's first step moves
    # log λ by lr against its sign.
    multiplier, _ = _run(gradient_ascent(optax.sgd(0.5)), 2.0, [[1.0, -3.0]])
    np.testing.assert_allclose(
        multiplier, 2.0 * np.exp(0.5 * 2.0 * np.array([1.0, -3.0])), rtol=1e-6
    )


def test_a_dual_ascent_needs_the_multipliers():
    dual_ascent = pid_ascent()
    state = dual_ascent.init(jnp.zeros(2))
    with pytest.raises(ValueError, match="params"):
        dual_ascent.update(jnp.zeros(2), state)


def test_settings_errors_name_the_field():
    with pytest.raises(ValueError, match=r"pid\.ki"):
        PIDConfig(ki=-1.0)
    with pytest.raises(ValueError, match=r"gradient\.initial"):
        GradientAscentConfig(initial=0.0)


def test_the_threshold_of_traced_limits_is_the_one_of_numbers():
    limits = jnp.asarray([100.0, 5.0])
    traced = per_step_cost_threshold(limits, 0.99, 1000)
    numbers = [per_step_cost_threshold(float(x), 0.99, 1000) for x in limits]
    np.testing.assert_allclose(traced, numbers, rtol=1e-6)
