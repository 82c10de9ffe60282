"""Batched rollouts."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from neorl_industrial.core.environments import (
    constant_policy,
    make,
    rollout,
    scan_single,
    uniform_random_policy,
)


def test_rollout_records_consistent_transitions():
    env, params = make("IB-v0", horizon=10)
    policy = uniform_random_policy(env)
    result = jax.jit(lambda k: rollout(k, env, params, policy, 3, 25, record=True))(
        jax.random.PRNGKey(0)
    )
    tr = result.transitions
    assert tr.observation.shape == (25, 3, 180)
    assert tr.action.shape == (25, 3, 3)
    assert tr.cost.shape == (25, 3, 2)
    assert np.all(np.abs(tr.action) <= 1.0)
    np.testing.assert_allclose(result.total_reward, tr.reward.sum(0), rtol=1e-5)
    np.testing.assert_allclose(result.total_cost, tr.cost.sum(0))
    np.testing.assert_array_equal(result.episodes, [2, 2, 2])  # 25 steps, horizon 10
    np.testing.assert_array_equal(tr.truncated.sum(0), [2, 2, 2])
    # Within an episode the next observation is the following step's observation.
    np.testing.assert_array_equal(tr.next_observation[:8], tr.observation[1:9])
    # Completed-episode returns are the sums of their steps.
    np.testing.assert_allclose(result.episode_return_sum, tr.reward[:20].sum(0), rtol=1e-5)


def test_rollout_is_deterministic_per_key():
    env, params = make("IB-classic-v0")
    policy = uniform_random_policy(env)
    run = jax.jit(lambda k: rollout(k, env, params, policy, 4, 50).total_reward)
    np.testing.assert_array_equal(run(jax.random.PRNGKey(1)), run(jax.random.PRNGKey(1)))
    assert not np.allclose(run(jax.random.PRNGKey(1)), run(jax.random.PRNGKey(2)))


def test_policy_params_reach_the_policy():
    env, params = make("IB-classic-v0", horizon=5)

    def proportional(gain, observation, _key):
        # Push velocity towards 60: a policy with parameters.
        return jnp.array([gain * (60.0 - observation[1]), 0.0, 0.0])

    result = rollout(
        jax.random.PRNGKey(0), env, params, proportional, 2, 4, policy_params=1.0, record=True
    )
    np.testing.assert_array_equal(result.transitions.next_observation[-1, :, 1], 54.0)


def test_scan_single_matches_reward_scale_of_rollout():
    env, params = make("IB-classic-v0")
    policy = constant_policy(jnp.zeros(3))
    _, total = jax.jit(lambda k: scan_single(k, env, params, policy, 200))(jax.random.PRNGKey(0))
    batched = rollout(jax.random.PRNGKey(0), env, params, policy, 8, 200)
    per_step_single = float(total) / 200
    per_step_batch = float(batched.total_reward.mean()) / 200
    assert abs(per_step_single - per_step_batch) < 0.1 * abs(per_step_batch)


def test_discrete_random_policy_stays_in_range():
    env, params = make("IB-discrete-v0")
    result = rollout(
        jax.random.PRNGKey(0), env, params, uniform_random_policy(env), 4, 30, record=True
    )
    actions = np.asarray(result.transitions.action)
    assert actions.min() >= 0 and actions.max() <= 26
    assert len(np.unique(actions)) > 10
    assert int(result.invalid_actions.sum()) == 0


def test_scan_single_auto_resets_with_presampled_noise():
    env, params = make("IB-classic-v0", horizon=5)
    state, _ = scan_single(jax.random.PRNGKey(0), env, params, constant_policy(jnp.ones(3)), 12)
    assert int(state.time) == 2  # two episodes of 5 steps, then 2 steps into the third
    assert float(state.plant.velocity) == 52.0


def test_presampled_steps_are_deterministic_and_distinct():
    env, params = make("IB-classic-v0")
    state, _ = env.reset(jax.random.PRNGKey(0), params)
    samples = env.presample(jax.random.PRNGKey(1), 3)
    first = jax.tree.map(lambda leaf: leaf[0], samples)
    second = jax.tree.map(lambda leaf: leaf[1], samples)
    action = jnp.zeros(3)
    _, a = env.step_presampled(first, state, action, params)
    _, b = env.step_presampled(first, state, action, params)
    _, c = env.step_presampled(second, state, action, params)
    np.testing.assert_array_equal(a.observation, b.observation)
    assert float(a.observation[5]) != float(c.observation[5])


def _reckless_policy(policy_params, observation, key):
    """Proposes moves far outside the constraints, and NaN one time in ten."""
    move_key, nan_key = jax.random.split(key)
    action = jax.random.uniform(move_key, (3,), minval=-3.0, maxval=3.0)
    return jnp.where(jax.random.uniform(nan_key) < 0.1, jnp.nan, action)


def test_shielded_rollout_never_applies_a_violating_action():
    env, params = make("IB-v0", horizon=20)
    constraints = env.compile_constraints()
    run = jax.jit(
        lambda k, shield_actions: rollout(
            k,
            env,
            params,
            _reckless_policy,
            4,
            50,
            record=True,
            constraints=constraints,
            shield_actions=shield_actions,
        ),
        static_argnums=1,
    )
    shielded = run(jax.random.PRNGKey(3), True)
    safety = shielded.safety
    n_hard = len(constraints.names)
    assert safety.violations.shape == (4, n_hard)
    assert int(safety.violations.sum()) > 0  # the policy does propose unsafe moves
    assert int(safety.applied_violations.sum()) == 0
    assert int(safety.infeasible.sum()) == 0
    np.testing.assert_array_equal(safety.decisions, [50] * 4)
    assert 0 < float(safety.override_rate()) <= 1.0
    assert int(safety.fallbacks.sum()) > 0  # the NaN proposals
    assert np.all(np.isfinite(shielded.transitions.action))
    assert np.all(np.abs(shielded.transitions.action) <= 1.0)

    checked = run(jax.random.PRNGKey(3), False)
    # Without the shield the same proposals reach the plant (the env neutralizes NaN).
    assert int(checked.safety.applied_violations.sum()) > 0
    assert int(checked.safety.overrides.sum()) == 0


def test_rate_limits_see_the_previous_applied_action():
    env, params = make("IB-v0", horizon=1000)
    constraints = env.compile_constraints()

    def flip(policy_params, observation, key):
        # +1 / -1 alternately by the sign of a coin: moves of 2 break the rate limit of 1.
        return jnp.where(jax.random.bernoulli(key), 1.0, -1.0) * jnp.ones(3)

    result = rollout(
        jax.random.PRNGKey(0), env, params, flip, 2, 40, record=True, constraints=constraints
    )
    actions = np.asarray(result.transitions.action)  # [steps, envs, 3]
    assert np.all(np.abs(np.diff(actions[:, :, :2], axis=0)) <= 1.0 + 1e-5)
    assert int(result.safety.overrides.sum()) > 0
