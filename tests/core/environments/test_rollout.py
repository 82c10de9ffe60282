"""Batched rollouts."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from neorl_industrial.core.environments import (
    BatchPolicy,
    constant_policy,
    make,
    rollout,
    scan_single,
    uniform_random_batch_policy,
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

    result = jax.jit(
        lambda key, gain: rollout(
            key, env, params, proportional, 2, 4, policy_params=gain, record=True
        )
    )(jax.random.PRNGKey(0), 1.0)
    np.testing.assert_array_equal(result.transitions.next_observation[-1, :, 1], 54.0)


def test_scan_single_matches_reward_scale_of_rollout():
    env, params = make("IB-classic-v0")
    policy = constant_policy(jnp.zeros(3))
    _, total = jax.jit(lambda k: scan_single(k, env, params, policy, 200))(jax.random.PRNGKey(0))
    batched = jax.jit(lambda k: rollout(k, env, params, policy, 8, 200))(jax.random.PRNGKey(0))
    per_step_single = float(total) / 200
    per_step_batch = float(batched.total_reward.mean()) / 200
    assert abs(per_step_single - per_step_batch) < 0.1 * abs(per_step_batch)


def test_a_batch_policy_acts_on_the_whole_batch_once_a_step():
    """A :class:`BatchPolicy` gets every environment's observation and one key a step;
    the rollout is the per-environment policy's where both compute the same actions."""
    env, params = make("IB-classic-v0", horizon=5)
    seen = []

    def batch_proportional(gain, observations, key):
        seen.append((observations.shape, key.shape))
        return jnp.stack(
            [
                gain * (60.0 - observations[:, 1]),
                jnp.zeros(len(observations)),
                jnp.zeros(len(observations)),
            ],
            axis=1,
        )

    def proportional(gain, observation, _key):
        return jnp.array([gain * (60.0 - observation[1]), 0.0, 0.0])

    @jax.jit
    def both(key):
        batched = rollout(
            key, env, params, BatchPolicy(batch_proportional), 3, 4, policy_params=1.0, record=True
        )
        per_env = rollout(key, env, params, proportional, 3, 4, policy_params=1.0, record=True)
        # scan_single takes it too, as a batch of one.
        _, total = scan_single(
            key, env, params, BatchPolicy(batch_proportional), 4, policy_params=1.0
        )
        _, expected = scan_single(key, env, params, proportional, 4, policy_params=1.0)
        return batched, per_env, total, expected

    key = jax.random.PRNGKey(0)
    batched, per_env, total, expected = both(key)
    assert seen and seen[0] == ((3, env.observation_size), key.shape)
    np.testing.assert_array_equal(batched.transitions.action, per_env.transitions.action)
    np.testing.assert_array_equal(batched.total_reward, per_env.total_reward)
    assert float(total) == float(expected)


def test_uniform_batch_policy_draws_the_action_space_uniformly():
    """One draw of the whole batch's actions a step: inside the bounds, spread over
    them, independent across environments; discrete actions cover the choices."""

    def actions_of(env_id: str, n_envs: int, n_steps: int) -> np.ndarray:
        env, params = make(env_id)
        policy = uniform_random_batch_policy(env)
        run = jax.jit(lambda k: rollout(k, env, params, policy, n_envs, n_steps, record=True))
        return np.asarray(run(jax.random.PRNGKey(3)).transitions.action)

    actions = actions_of("Pipeline-v0", 512, 40)[..., 0]  # [40, 512]
    assert actions.min() >= -1.0 and actions.max() <= 1.0
    assert abs(actions.mean()) < 0.02 and abs(actions.var() - 1.0 / 3.0) < 0.01
    assert len(np.unique(actions[0])) == 512  # not one action broadcast to the batch
    assert abs(np.corrcoef(actions[:, 0], actions[:, 1])[0, 1]) < 0.5
    picks = actions_of("IB-discrete-v0", 64, 30)
    assert picks.min() >= 0 and picks.max() <= 26 and len(np.unique(picks)) == 27


def test_discrete_random_policy_stays_in_range():
    env, params = make("IB-discrete-v0")
    policy = uniform_random_policy(env)
    result = jax.jit(lambda k: rollout(k, env, params, policy, 4, 30, record=True))(
        jax.random.PRNGKey(0)
    )
    actions = np.asarray(result.transitions.action)
    assert actions.min() >= 0 and actions.max() <= 26
    assert len(np.unique(actions)) > 10
    assert int(result.invalid_actions.sum()) == 0


def test_scan_single_auto_resets_with_presampled_noise():
    env, params = make("IB-classic-v0", horizon=5)
    policy = constant_policy(jnp.ones(3))
    state, _ = jax.jit(lambda k: scan_single(k, env, params, policy, 12))(jax.random.PRNGKey(0))
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

    result = jax.jit(
        lambda k: rollout(k, env, params, flip, 2, 40, record=True, constraints=constraints)
    )(jax.random.PRNGKey(0))
    actions = np.asarray(result.transitions.action)  # [steps, envs, 3]
    assert np.all(np.abs(np.diff(actions[:, :, :2], axis=0)) <= 1.0 + 1e-5)
    assert int(result.safety.overrides.sum()) > 0


def rollouts_with_and_without_compiler_options() -> dict:
    """Each environment with compiler options: a rollout compiled with them and with
    XLA's defaults (the total rewards and final observations of both)."""
    import neorl_industrial.wrappers.environments  # noqa: F401  (registers the ids)

    out = {}
    for env_id in ("Pipeline-v0", "FourTank-v0", "DMSD-v0", "CSTR-v0", "IB-classic-v0"):
        env, params = make(env_id)
        policy = uniform_random_batch_policy(env)

        def fn(key, env=env, params=params, policy=policy):
            result = rollout(key, env, params, policy, 16, 40)
            return result.total_reward, result.final_observation

        key = jax.random.PRNGKey(5)
        options = env.compiler_options
        if not options:  # compiled as the defaults: nothing to compare
            out[env_id] = (options, None)
            continue
        tuned = jax.jit(fn, compiler_options=options)(key)
        default = jax.jit(fn)(key)
        out[env_id] = (options, [np.asarray(x) for x in (*tuned, *default)])
    return out


def test_compiler_options_change_the_code_not_the_results():
    """The environments that compile with XLA:CPU's older fusion code generator (faster
    rollouts, measured in benchmarks.env_throughput) give what the defaults give; the
    others have no options. Run as a user's programs compile (the suite itself compiles
    with the older generator)."""
    from tests.processes import run_shipped

    out = run_shipped(
        "from tests.core.environments.test_rollout import "
        "rollouts_with_and_without_compiler_options\n"
        "result = rollouts_with_and_without_compiler_options()\n"
    )
    older = {"xla_cpu_use_fusion_emitters": False}
    assert {env_id: options for env_id, (options, _) in out.items()} == {
        "Pipeline-v0": older,
        "FourTank-v0": older,
        "DMSD-v0": older,
        "CSTR-v0": {},
        "IB-classic-v0": {},
    }
    for env_id, (options, arrays) in out.items():
        if not options:
            continue
        reward, observation, default_reward, default_observation = arrays
        np.testing.assert_allclose(reward, default_reward, rtol=1e-5, err_msg=env_id)
        np.testing.assert_allclose(observation, default_observation, rtol=1e-5, atol=1e-6)
