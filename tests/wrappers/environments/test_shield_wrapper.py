"""The opt-in shield around the Gymnasium environment."""

from __future__ import annotations

import numpy as np
import pytest

from neorl_industrial.core.safety import ConstraintSpec, satisfies
from neorl_industrial.wrappers.environments import GymnasiumEnv, ShieldWrapper


def test_every_applied_action_keeps_the_constraints():
    env = ShieldWrapper(GymnasiumEnv("IB-v0"))
    observation, _ = env.reset(seed=0)
    prev = np.zeros(3, np.float32)
    overrides = 0
    rng = np.random.default_rng(0)
    for step in range(30):
        proposed = rng.uniform(-3, 3, 3).astype(np.float32)
        if step == 5:
            proposed[0] = np.nan
        next_observation, reward, _, _, info = env.step(proposed)
        safety = info["safety"]
        applied = safety["applied_action"]
        assert bool(satisfies(env.constraints, observation, applied, prev))
        overrides += safety["overridden"]
        if step == 5:
            assert safety["fallback"] and "bounds/velocity" in safety["violated"]
        assert np.isfinite(reward) and "cost" in info
        observation, prev = next_observation, applied
    assert overrides > 0


def test_a_safe_action_reaches_the_plant_unchanged_and_specs_are_accepted():
    spec = ConstraintSpec.from_dict({"action_bounds": {"gain": [-0.5, 0.5]}})
    env = ShieldWrapper(GymnasiumEnv("IB-v0"), spec)
    env.reset(seed=1)
    _, _, _, _, info = env.step(np.asarray([0.9, 0.2, -0.9], np.float32))
    assert not info["safety"]["overridden"]
    np.testing.assert_array_equal(
        info["safety"]["applied_action"], np.asarray([0.9, 0.2, -0.9], np.float32)
    )
    _, _, _, _, info = env.step(np.asarray([0.0, 0.9, 0.0], np.float32))
    np.testing.assert_allclose(info["safety"]["applied_action"], [0.0, 0.5, 0.0])


def test_bad_setups_are_named():
    with pytest.raises(ValueError, match="continuous actions"):
        ShieldWrapper(GymnasiumEnv("IB-v0", action_type="discrete"))
    compiled = ConstraintSpec.from_dict({"action_bounds": {"action_0": [0, 1]}}).compile(4, 1)
    with pytest.raises(ValueError, match="compiled for 1 actions"):
        ShieldWrapper(GymnasiumEnv("IB-v0"), compiled)
    with pytest.raises(RuntimeError, match="before reset"):
        ShieldWrapper(GymnasiumEnv("IB-v0")).step(np.zeros(3))
