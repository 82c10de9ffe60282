"""The action scaler between a plant's units and the policy's [-1, 1]."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.agents.types import Algorithm
from neorl_industrial.functional.state_management import ActionScaler, with_action_scaling


def test_scale_and_unscale_are_inverse_and_map_the_bounds_to_the_unit_box():
    scaler = ActionScaler.create([0.0, 10.0], [100.0, 100.0], ["valve", "pump"])
    actions = jnp.asarray([[0.0, 10.0], [100.0, 100.0], [16.6, 62.0]])
    scaled = scaler.scale(actions)
    np.testing.assert_allclose(np.asarray(scaled[:2]), [[-1, -1], [1, 1]])
    np.testing.assert_allclose(np.asarray(scaler.unscale(scaled)), np.asarray(actions), rtol=1e-6)
    assert float(jnp.max(jnp.abs(scaler.scale(jnp.asarray([[1e9, -1e9]]))))) == 1.0


@pytest.mark.parametrize(
    ("low", "high", "message"),
    [
        ([0.0, 5.0], [100.0, 5.0], "'pump' has a zero-width range"),
        ([0.0, 0.0], [np.inf, 1.0], "'valve' needs a finite range"),
    ],
)
def test_ranges_a_scaler_cannot_use_are_refused_naming_the_action(low, high, message):
    with pytest.raises(ValueError, match=message):
        ActionScaler.create(low, high, ["valve", "pump"])


def test_the_scaled_algorithm_acts_in_plant_units():
    algorithm = Algorithm(
        init=lambda key: None,
        update=lambda state, batch, key: (state, {}),
        act=lambda params, observation, key=None, deterministic=True: jnp.tanh(observation),
    )
    scaler = ActionScaler.create([0.0, 0.0], [100.0, 50.0])
    scaled = with_action_scaling(algorithm, scaler)
    action = jax.jit(lambda o: scaled.act(None, o))(jnp.asarray([100.0, -100.0]))
    np.testing.assert_allclose(np.asarray(action), [100.0, 0.0], atol=1e-4)
    assert with_action_scaling(algorithm, None) is algorithm
    assert ActionScaler.is_identity([-1, -1], [1, 1]) and not ActionScaler.is_identity([0], [1])
