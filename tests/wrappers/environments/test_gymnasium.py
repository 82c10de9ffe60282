"""The Gymnasium Env and VectorEnv shells."""

from __future__ import annotations

import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import neorl_industrial.wrappers.environments  # noqa: F401  (registers the Gymnasium ids)
from neorl_industrial.wrappers.environments import GymnasiumEnv, VectorEnv


@pytest.mark.parametrize("env_id", ["neorl_industrial/IB-v0", "neorl_industrial/IB-discrete-v0"])
def test_check_env_passes_without_warnings(env_id):
    env = gymnasium.make(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped, skip_render_check=True)


def test_make_with_overrides_and_seeded_reset_is_reproducible():
    env = gymnasium.make("neorl_industrial/IB-v0", observation="classic", setpoint=30.0)
    obs_a, _ = env.reset(seed=3)
    steps_a = [env.step(np.array([0.5, -0.5, 0.1], np.float32))[0] for _ in range(5)]
    obs_b, _ = env.reset(seed=3)
    steps_b = [env.step(np.array([0.5, -0.5, 0.1], np.float32))[0] for _ in range(5)]
    assert obs_a.shape == (6,) and obs_a[0] == 30.0
    np.testing.assert_array_equal(obs_a, obs_b)
    np.testing.assert_array_equal(np.stack(steps_a), np.stack(steps_b))
    env.reset(seed=4)
    env.step(np.zeros(3, np.float32))
    assert not np.array_equal(env.step(np.zeros(3, np.float32))[0], steps_a[1])


def test_step_returns_gymnasium_types_and_cost_in_info():
    env = GymnasiumEnv("IB-v0", horizon=3)
    env.reset(seed=0)
    for _ in range(3):
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert isinstance(reward, float) and isinstance(truncated, bool)
        assert obs.dtype == np.float32 and obs.shape == (180,)
        assert info["cost"].shape == (2,)
    assert truncated and not terminated


def test_bad_actions_are_clear_errors_or_flags():
    env = GymnasiumEnv("IB-classic-v0")
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(3))
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action"):
        env.step(np.zeros(4))
    with pytest.raises(ValueError, match="action"):
        env.step("fast")
    _, _, _, _, info = env.step(np.array([np.nan, 0.0, 0.0]))
    assert bool(info["action_invalid"])
    with pytest.raises(ValueError, match="render_mode"):
        GymnasiumEnv("IB-v0", render_mode="human")


def test_vector_env_steps_batches_and_auto_resets_same_step():
    envs = gymnasium.make_vec(
        "neorl_industrial/IB-classic-v0",
        num_envs=4,
        vectorization_mode="vector_entry_point",
        horizon=2,
    )
    if hasattr(gymnasium.vector, "AutoresetMode"):  # named from Gymnasium 1.1 on
        assert envs.metadata["autoreset_mode"] == gymnasium.vector.AutoresetMode.SAME_STEP
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (4, 6)
    actions = np.tile(np.array([1.0, 0.0, 0.0], np.float32), (4, 1))
    obs, reward, terminated, truncated, info = envs.step(actions)
    assert "final_obs" not in info and reward.shape == (4,)
    obs, reward, terminated, truncated, info = envs.step(actions)
    assert truncated.all() and not terminated.any()
    np.testing.assert_array_equal(info["_final_obs"], True)
    np.testing.assert_array_equal(info["final_obs"][:, 1], 52.0)
    np.testing.assert_array_equal(obs[:, 1], 50.0)
    assert info["cost"].shape == (4, 2)


def test_vector_env_is_reproducible_and_validates_input():
    a = VectorEnv(3, "IB-v0")
    b = VectorEnv(3, "IB-v0")
    np.testing.assert_array_equal(a.reset(seed=5)[0], b.reset(seed=5)[0])
    actions = a.action_space.sample()
    np.testing.assert_array_equal(a.step(actions)[0], b.step(actions)[0])
    with pytest.raises(ValueError, match="action"):
        a.step(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="num_envs"):
        VectorEnv(0)


def test_discrete_vector_env_takes_indices():
    envs = VectorEnv(2, "IB-discrete-v0")
    envs.reset(seed=0)
    obs, *_ = envs.step(np.array([26, 0]))
    frames = obs.reshape(2, 30, 6)[:, 0]
    np.testing.assert_array_equal(frames[:, 1], [51.0, 49.0])


def test_plant_unit_actions_are_normalized_for_gymnasium_by_default():
    """Tasks in plant units act in [-1, 1] through Gymnasium (mapped linearly to their
    bounds, as pc-gym does); ``normalize_actions=False`` keeps the plant's units."""
    env = gymnasium.make("neorl_industrial/FourTank-v0")
    assert env.unwrapped.normalize_actions
    np.testing.assert_array_equal(env.action_space.low, [-1.0, -1.0])
    env.reset(seed=0)
    _, _, _, _, info = env.step(np.array([-1.0, 1.0], np.float32))
    np.testing.assert_allclose(info["control"], [0.1, 10.0], rtol=1e-6)

    plant = gymnasium.make("neorl_industrial/FourTank-v0", normalize_actions=False)
    assert not plant.unwrapped.normalize_actions
    np.testing.assert_allclose(plant.action_space.low, [0.1, 0.1], rtol=1e-6)
    assert not gymnasium.make("neorl_industrial/IB-v0").unwrapped.normalize_actions
    with pytest.raises(ValueError, match="normalize_actions"):
        GymnasiumEnv("IB-discrete-v0", normalize_actions=True)
    with pytest.raises(ValueError, match="normalize_actions"):
        GymnasiumEnv("FourTank-v0", normalize_actions="yes")

    vector = VectorEnv(3, "FourTank-v0")
    np.testing.assert_array_equal(vector.single_action_space.high, [1.0, 1.0])
    vector.reset(seed=0)
    _, _, _, _, info = vector.step(np.zeros((3, 2), np.float32))
    assert np.all(np.isfinite(info["cost"]))


def test_the_shield_works_in_plant_units_behind_a_normalized_shell():
    from neorl_industrial.wrappers.environments import ShieldWrapper

    env = ShieldWrapper(gymnasium.make("neorl_industrial/FourTank-v0").unwrapped)
    env.reset(seed=0)
    # 1.0 is the pumps' top (10 V): within the spec's bounds, so it passes unchanged.
    _, _, _, _, info = env.step(np.array([1.0, 1.0], np.float32))
    np.testing.assert_allclose(info["safety"]["proposed_action"], [10.0, 10.0], rtol=1e-6)
    np.testing.assert_allclose(info["control"], [10.0, 10.0], rtol=1e-6)
    # 3.0 maps to 29.8 V: the shield brings it back to the bound in volts.
    _, _, _, _, info = env.step(np.array([3.0, 1.0], np.float32))
    assert info["safety"]["overridden"]
    np.testing.assert_allclose(info["control"][0], 10.0, rtol=1e-6)
