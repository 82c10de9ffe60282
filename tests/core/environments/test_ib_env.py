"""The functional Industrial Benchmark environment: API, semantics and bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.environments import IndustrialBenchmark, make, registered_envs
from neorl_industrial.core.environments.industrial_benchmark import DISCRETE_ACTIONS

KEY = jax.random.PRNGKey(0)


def test_registry_lists_the_ib_variants():
    assert {"IB-v0", "IB-classic-v0", "IB-discrete-v0", "IB-nonstationary-v0"} <= set(
        registered_envs()
    )


@pytest.mark.parametrize(
    ("env_id", "obs_size", "discrete"),
    [("IB-v0", 180, False), ("IB-classic-v0", 6, False), ("IB-discrete-v0", 180, True)],
)
def test_reset_and_step_shapes(env_id, obs_size, discrete):
    env, params = make(env_id)
    assert env.observation_size == obs_size
    assert env.discrete is discrete
    state, ts = env.reset(KEY, params)
    assert ts.observation.shape == (obs_size,)
    assert ts.observation.dtype == jnp.float32
    assert ts.cost.shape == (2,)
    action = jnp.asarray(5) if discrete else jnp.zeros(3)
    state, ts = env.step(KEY, state, action, params)
    assert ts.reward.shape == () and ts.reward.dtype == jnp.float32
    assert ts.terminated.dtype == jnp.bool_ and not bool(ts.terminated)
    assert np.all(ts.observation >= env.observation_low)
    assert np.all(ts.observation <= env.observation_high)


def test_reward_is_minus_weighted_fatigue_and_consumption():
    env, params = make("IB-classic-v0")
    state, _ = env.reset(KEY, params)
    state, ts = env.step(KEY, state, jnp.array([0.3, -0.2, 0.5]), params)
    fatigue, consumption = ts.observation[4], ts.observation[5]
    np.testing.assert_allclose(ts.reward, -(3.0 * fatigue + consumption), rtol=1e-6)


def test_include_past_history_is_newest_first_and_tiled_at_reset():
    env, params = make("IB-v0")
    state, ts = env.reset(KEY, params)
    frames = ts.observation.reshape(30, 6)
    np.testing.assert_array_equal(frames, np.tile(frames[0], (30, 1)))
    state, ts1 = env.step(jax.random.PRNGKey(1), state, jnp.array([1.0, 1.0, 1.0]), params)
    state, ts2 = env.step(jax.random.PRNGKey(2), state, jnp.array([1.0, 1.0, 1.0]), params)
    frames = ts2.observation.reshape(30, 6)
    np.testing.assert_array_equal(frames[1], ts1.observation.reshape(30, 6)[0])
    np.testing.assert_array_equal(frames[2], ts.observation[:6])
    # The newest frame is the plant's current observable state.
    np.testing.assert_array_equal(frames[0], state.plant.observation())
    assert frames[0][1] == 52.0  # velocity moved +1 twice from 50


def test_truncation_at_horizon_and_auto_reset_keeps_final_observation():
    env, params = make("IB-classic-v0", horizon=3)
    state, ts = env.reset(KEY, params)
    step = jax.jit(env.step)
    action = jnp.array([1.0, 0.0, 0.0])
    for t in range(1, 4):
        state, ts = step(jax.random.PRNGKey(t), state, action, params)
        assert bool(ts.truncated) == (t == 3)
    # The episode restarted: velocity is back at 50 in the returned observation, while
    # the final observation still shows the three +1 velocity steps.
    assert float(ts.observation[1]) == 50.0
    assert float(ts.info.final_observation[1]) == 53.0
    assert int(state.time) == 0


def test_without_auto_reset_the_episode_just_ends():
    env, params = make("IB-classic-v0", horizon=2, auto_reset=False)
    state, _ = env.reset(KEY, params)
    for t in range(2):
        state, ts = env.step(jax.random.PRNGKey(t), state, jnp.ones(3), params)
    assert bool(ts.truncated)
    assert float(ts.observation[1]) == 52.0


def test_jit_and_no_jit_agree():
    env, params = make("IB-nonstationary-v0")
    state, _ = env.reset(KEY, params)
    action = jnp.array([0.4, -0.7, 0.9])
    eager = env.step(jax.random.PRNGKey(3), state, action, params)
    jitted = jax.jit(env.step)(jax.random.PRNGKey(3), state, action, params)
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_step_does_not_recompile_for_new_states():
    env, params = make("IB-classic-v0")
    traces = []

    def traced_step(key, state, action, params):
        traces.append(1)
        return env.step(key, state, action, params)

    step = jax.jit(traced_step)
    state, _ = env.reset(KEY, params)
    for t in range(5):
        action = jnp.full(3, 0.1 * t, dtype=jnp.float32)
        state, _ = step(jax.random.PRNGKey(t), state, action, params)
    state, _ = step(
        KEY, state, jnp.zeros(3, jnp.float32), params.replace(setpoint=jnp.float32(20.0))
    )
    assert len(traces) == 1


def test_params_vmap_over_setpoints():
    env, params = make("IB-classic-v0")
    setpoints = jnp.array([10.0, 50.0, 90.0])
    batched = jax.tree.map(lambda leaf: jnp.broadcast_to(leaf, (3, *leaf.shape)), params)
    batched = batched.replace(setpoint=setpoints)
    _, ts = jax.vmap(env.reset, in_axes=(None, 0))(KEY, batched)
    np.testing.assert_array_equal(ts.observation[:, 0], setpoints)
    assert len(set(np.asarray(ts.observation[:, 5]).round(3))) == 3


def test_nan_and_infinite_actions_are_zero_change_and_flagged():
    env, params = make("IB-classic-v0")
    state, _ = env.reset(KEY, params)
    key = jax.random.PRNGKey(11)
    _, reference = env.step(key, state, jnp.zeros(3), params)
    for bad in ([jnp.nan, 0.5, 0.5], [0.5, jnp.inf, 0.5], [0.5, 0.5, -jnp.inf]):
        _, ts = env.step(key, state, jnp.array(bad), params)
        assert bool(ts.info.action_invalid)
        np.testing.assert_array_equal(ts.observation, reference.observation)
    _, ts = env.step(key, state, jnp.array([0.5, 0.5, 0.5]), params)
    assert not bool(ts.info.action_invalid)


def test_out_of_bound_actions_are_clipped():
    env, params = make("IB-classic-v0")
    state, _ = env.reset(KEY, params)
    _, big = env.step(KEY, state, jnp.array([7.0, -9.0, 3.0]), params)
    _, unit = env.step(KEY, state, jnp.array([1.0, -1.0, 1.0]), params)
    np.testing.assert_array_equal(big.observation, unit.observation)
    assert not bool(big.info.action_invalid)


def test_discrete_actions_match_their_continuous_deltas():
    discrete, params = make("IB-discrete-v0", observation="classic")
    continuous, _ = make("IB-classic-v0")
    state, _ = discrete.reset(KEY, params)
    for index in (0, 13, 26, 7):
        _, d = discrete.step(KEY, state, jnp.asarray(index), params)
        _, c = continuous.step(KEY, state, jnp.asarray(DISCRETE_ACTIONS[index]), params)
        np.testing.assert_array_equal(d.observation, c.observation)
    _, bad = discrete.step(KEY, state, jnp.asarray(27), params)
    _, neutral = discrete.step(KEY, state, jnp.asarray(13), params)
    assert bool(bad.info.action_invalid)
    np.testing.assert_array_equal(bad.observation, neutral.observation)
    assert DISCRETE_ACTIONS.shape == (27, 3)
    np.testing.assert_array_equal(DISCRETE_ACTIONS[13], [0, 0, 0])


def test_cost_vector_follows_the_limits():
    env, params = make("IB-classic-v0")
    state, _ = env.reset(KEY, params)
    action = jnp.zeros(3)
    _, strict = env.step(KEY, state, action, params.replace(fatigue_limit=jnp.float32(-1.0)))
    _, loose = env.step(KEY, state, action, params.replace(consumption_limit=jnp.float32(1e9)))
    np.testing.assert_array_equal(strict.cost, [1.0, 0.0])  # default consumption is safe here
    np.testing.assert_array_equal(loose.cost, [0.0, 0.0])
    fatigue = float(strict.observation[4])
    _, at_limit = env.step(KEY, state, action, params.replace(fatigue_limit=jnp.float32(fatigue)))
    assert float(at_limit.cost[0]) == 0.0  # the limit itself is allowed


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"setpoint": 150.0}, "setpoint"),
        ({"setpoint": -1}, "setpoint"),
        ({"setpoint": float("nan")}, "setpoint"),
        ({"setpoint": "high"}, "setpoint"),
        ({"horizon": 0}, "horizon"),
        ({"horizon": 2.5}, "horizon"),
        ({"fatigue_limit": float("inf")}, "fatigue_limit"),
        ({"observation": "pixels"}, "observation"),
        ({"action_type": "hybrid"}, "action_type"),
        ({"n_past": 0}, "n_past"),
        ({"temperature": 3.0}, "temperature"),
    ],
)
def test_invalid_configuration_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        make("IB-v0", **overrides)


def test_unknown_environment_id_is_a_clear_error():
    with pytest.raises(ValueError, match="IB-v9"):
        make("IB-v9")


def test_environments_are_hashable_by_configuration():
    a, _ = make("IB-v0")
    b, _ = make("IB-v0")
    c, _ = make("IB-classic-v0")
    assert a == b and hash(a) == hash(b)
    assert a != c
    assert repr(IndustrialBenchmark(observation="classic")).startswith("IndustrialBenchmark(")


def test_step_batch_matches_per_environment_semantics():
    env, params = make("IB-classic-v0", horizon=4)
    states, ts = env.reset_batch(KEY, 5, params)
    actions = jnp.tile(jnp.array([1.0, 0.0, 0.0]), (5, 1))
    step_batch = jax.jit(env.step_batch)
    for t in range(4):
        states, ts = step_batch(jax.random.PRNGKey(t), states, actions, params)
    assert bool(ts.truncated.all())
    np.testing.assert_array_equal(ts.observation[:, 1], 50.0)
    np.testing.assert_array_equal(ts.info.final_observation[:, 1], 54.0)
    np.testing.assert_array_equal(states.time, 0)
    # Different environments in a batch draw different noise.
    assert len(set(np.asarray(ts.info.final_observation[:, 5]).round(4))) == 5
