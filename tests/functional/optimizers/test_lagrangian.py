"""``functional.optimizers`` is where the docs send people for the Lagrange multipliers:
it re-exports the core's one interface and both multipliers."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from neorl_industrial.core.agents import cost, multipliers
from neorl_industrial.functional import optimizers


def test_the_multipliers_are_the_cores():
    assert optimizers.Multiplier is multipliers.Multiplier
    assert optimizers.LagrangeMultiplier is multipliers.Multiplier
    assert optimizers.MultiplierState is multipliers.GradientMultiplierState
    assert optimizers.pid_multiplier is multipliers.pid_multiplier
    assert optimizers.gradient_ascent_multiplier is multipliers.gradient_ascent_multiplier
    assert optimizers.per_step_cost_threshold is cost.per_step_cost_threshold


def test_pid_through_the_interface_matches_the_controller_step():
    config = optimizers.PIDConfig(kp=1.0, ki=0.5, kd=0.2)
    multiplier = optimizers.pid_multiplier(config)
    by_interface = multiplier.init(2)
    by_function = optimizers.pid_init(2)
    threshold = jnp.asarray([1.0, 1.0])
    for cost_value in ([2.0, 0.0], [3.0, 0.5], [0.0, 0.0]):
        by_interface = multiplier.update(by_interface, jnp.asarray(cost_value), threshold)
        by_function = optimizers.pid_update(config, by_function, jnp.asarray(cost_value), threshold)
        np.testing.assert_array_equal(by_interface.multiplier, by_function.multiplier)


def test_the_threshold_of_traced_limits_is_the_one_of_numbers():
    limits = jnp.asarray([100.0, 5.0])
    traced = optimizers.per_step_cost_threshold(limits, 0.99, 1000)
    numbers = [optimizers.per_step_cost_threshold(float(x), 0.99, 1000) for x in limits]
    np.testing.assert_allclose(traced, numbers, rtol=1e-6)
