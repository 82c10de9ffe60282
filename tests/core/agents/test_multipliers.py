"""The multipliers' one interface agrees with the PID controller's own step, and the
per-step threshold of traced cost limits is the one of the same numbers."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from neorl_industrial.core.agents.cost import per_step_cost_threshold
from neorl_industrial.core.agents.multipliers import PIDConfig, pid_init, pid_multiplier, pid_update


def test_pid_through_the_interface_matches_the_controller_step():
    config = PIDConfig(kp=1.0, ki=0.5, kd=0.2)
    multiplier = pid_multiplier(config)
    by_interface = multiplier.init(2)
    by_function = pid_init(2)
    threshold = jnp.asarray([1.0, 1.0])
    for cost_value in ([2.0, 0.0], [3.0, 0.5], [0.0, 0.0]):
        by_interface = multiplier.update(by_interface, jnp.asarray(cost_value), threshold)
        by_function = pid_update(config, by_function, jnp.asarray(cost_value), threshold)
        np.testing.assert_array_equal(by_interface.multiplier, by_function.multiplier)
    assert float(by_function.multiplier[0]) > 0.0


def test_the_threshold_of_traced_limits_is_the_one_of_numbers():
    limits = jnp.asarray([100.0, 5.0])
    traced = per_step_cost_threshold(limits, 0.99, 1000)
    numbers = [per_step_cost_threshold(float(x), 0.99, 1000) for x in limits]
    np.testing.assert_allclose(traced, numbers, rtol=1e-6)
