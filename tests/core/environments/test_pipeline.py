"""Pipeline-v0 against NeoRL-2's Pipeline task.

The reference package cannot run (PyPI's ``neorl2==0.0.1`` lacks its reward module), so the
task is checked against the reference's published equations and its own recorded numbers:
``references/pipeline_neorl2_train_0to2.npz`` holds the first three trajectories (3000
rows, float32: ``obs``, ``action``, ``next_obs``, ``reward``) of NeoRL-2's
``Pipeline-high-100000-train.npz`` (GitHub ``polixir/neorl2_dataset``, commit
1971631002b44d5f370f7600392caaeb2037aa5b). Those data predate the benchmark's hosted files
(their MD5 differs from the one NeoRL-2's ``info.py`` lists, and every episode starts at
target 50), so they are used for the mechanics (delay, layout, reward, random draws), not
for returns. Trajectory ``i`` was recorded after ``reset(seed=i)``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import neorl_industrial.wrappers.environments  # noqa: F401  (registers the Gymnasium ids)
from neorl_industrial.core.environments import Task, make, rollout, uniform_random_policy
from neorl_industrial.core.environments.pipeline import (
    DEFAULT_EPISODE_COST_LIMIT,
    REFERENCE_SCORES,
    Pipeline,
    PipelineBatchState,
    PipelineState,
    next_target,
    normalized_score,
)
from neorl_industrial.wrappers.constraint_files import load_constraint_spec

ROOT = Path(__file__).resolve().parents[3]
RECORDED = Path(__file__).parent / "references" / "pipeline_neorl2_train_0to2.npz"
KEY = jax.random.key(0)
LEVELS = (50.0, 80.0, 110.0, 140.0)
EPISODE = 1000


@pytest.fixture(scope="module")
def pipe():
    env, params = make("Pipeline-v0")
    step = jax.jit(env.step_env)
    reset = jax.jit(env.reset_env)
    return env, params, step, reset


@pytest.fixture(scope="module")
def recorded():
    return dict(np.load(RECORDED))


def _held(params, flow, target):
    """``params`` with a fixed initial flow and target and no target switching."""
    return params.replace(
        initial_flow_range=jnp.array([flow, flow], jnp.float32),
        initial_target=jnp.asarray(target, jnp.float32),
        switch_probability=jnp.zeros((), jnp.float32),
    )


def test_delay_rewards_and_the_reset_observation(pipe):
    """x0 = 100, T = 110, gate change +1 held: the outlet stays at 100 for 19 steps, then
    rises by 1 per step; the rewards are NeoRL-2's (0.01 (200 - |d - T|))^2 - 3."""
    _, params, step, reset = pipe
    held = _held(params, 100.0, 110.0)
    state, first = reset(KEY, held)
    np.testing.assert_array_equal(first.observation, [100.0, 110.0] + [100.0] * 25 + [0.0] * 25)
    downstream, rewards = [], []
    for _ in range(25):
        state, timestep = step(KEY, state, jnp.ones(1), held)
        downstream.append(float(timestep.observation[0]))
        rewards.append(float(timestep.reward))
    assert downstream == [100.0] * 19 + [101.0, 102.0, 103.0, 104.0, 105.0, 106.0]
    np.testing.assert_allclose(rewards[:19], 0.61, atol=1e-6)
    np.testing.assert_allclose(
        [rewards[19], rewards[20], rewards[24]], [0.6481, 0.6864, 0.8416], atol=1e-6
    )
    np.testing.assert_array_equal(timestep.observation[27:52], np.ones(25))
    np.testing.assert_array_equal(timestep.observation[2:7], [105.0, 104.0, 103.0, 102.0, 101.0])
    assert not timestep.terminated and not timestep.truncated


def test_the_gate_saturates_at_the_channel_capacity(pipe):
    _, params, step, reset = pipe
    state, _ = reset(KEY, _held(params, 199.5, 140.0))
    state, timestep = step(KEY, state, jnp.array([5.0]), params)
    assert float(state.channel[0]) == 200.0 and float(timestep.observation[27]) == 1.0
    # Held at full rate for 60 steps, the outlet reaches the capacity, or 0, and stays.
    for flow, change, limit in ((195.0, 1.0, 200.0), (5.0, -1.0, 0.0)):
        state, _ = reset(KEY, _held(params, flow, 110.0))
        outlet = []
        for _ in range(60):
            state, timestep = step(KEY, state, jnp.array([change]), params)
            outlet.append(float(timestep.observation[0]))
        assert outlet[-1] == limit and min(outlet) >= 0.0 and max(outlet) <= 200.0


def test_the_recorded_random_draws_are_the_reference_process(recorded):
    """The reference's own stream (``numpy.random.default_rng(seed)``: the initial flow
    from U(80, 120), then per step a draw < 0.003 picking a new level before the flow
    moves) reproduces the recorded initial flows and every recorded target."""
    for seed in range(3):
        rows = slice(seed * EPISODE, (seed + 1) * EPISODE)
        rng = np.random.default_rng(seed)
        assert np.float32(rng.uniform(80, 120)) == recorded["obs"][rows][0, 0]
        target = 50.0  # the recorded episodes all start at 50 (module docstring)
        if rng.random() < 0.003:
            target = rng.choice(LEVELS)
        targets = []
        for _ in range(EPISODE):
            if rng.random() < 0.003:
                target = rng.choice(LEVELS)
            targets.append(target)
        np.testing.assert_array_equal(recorded["next_obs"][rows, 1], targets)


def test_replaying_the_recorded_actions_reproduces_every_observation(pipe, recorded):
    """From each recorded initial flow, with the recorded targets injected, the recorded
    actions give the recorded next observations bit for bit (float32 gate accumulation,
    19-step delay, both histories) and the recorded rewards to 1e-5."""
    env, params, _, _ = pipe
    obs = recorded["obs"].reshape(3, EPISODE, 52)
    actions = recorded["action"].reshape(3, EPISODE, 1)
    next_obs = recorded["next_obs"].reshape(3, EPISODE, 52)

    def replay(first, actions, targets):
        held = _held(params, first[0], first[1])
        state, timestep = env.reset_env(KEY, held)

        def one(state, inputs):
            action, target = inputs
            state, timestep = env.step_env(KEY, state.replace(target=target), action, held)
            return state, (timestep.observation, timestep.reward)

        return timestep.observation, jax.lax.scan(one, state, (actions, targets))[1]

    first, (observations, rewards) = jax.jit(jax.vmap(replay))(
        jnp.asarray(obs[:, 0]), jnp.asarray(actions), jnp.asarray(next_obs[:, :, 1])
    )
    np.testing.assert_array_equal(first, obs[:, 0])
    np.testing.assert_array_equal(observations, next_obs)
    np.testing.assert_allclose(rewards.reshape(-1), recorded["reward"], atol=1e-5)
    # The layout's shift identities, on the recorded rows and so on the replay.
    assert np.array_equal(recorded["next_obs"][:, 2], recorded["obs"][:, 0])
    assert np.array_equal(recorded["next_obs"][:, 3:27], recorded["obs"][:, 2:26])
    assert np.array_equal(recorded["next_obs"][:, 27], recorded["action"][:, 0])
    assert np.array_equal(recorded["next_obs"][:, 28:52], recorded["obs"][:, 27:51])
    # Independently of the environment: the gate accumulated in float32 and delayed by
    # 19 steps is the recorded outlet exactly; a delay of 18 or 20 is not.
    gate = np.empty((3, EPISODE), np.float32)
    flow = obs[:, 0, 0].copy()
    for k in range(EPISODE):
        flow = np.clip(flow + actions[:, k, 0], np.float32(0.0), np.float32(200.0))
        gate[:, k] = flow
    np.testing.assert_array_equal(next_obs[:, 19:, 0], gate[:, : EPISODE - 19])
    for delay in (18, 20):
        assert np.max(np.abs(next_obs[:, delay:, 0] - gate[:, : EPISODE - delay])) > 1e-3


def test_targets_and_initial_flows_follow_the_reference_statistics(pipe):
    env, params, _, _ = pipe
    n_envs, n_steps = 256, EPISODE

    def targets(key):
        reset_key, step_key = jax.random.split(key)
        state, _ = env.reset_env(reset_key, params)

        def one(state, key):
            state, _ = env.step_env(key, state, jnp.zeros(1), params)
            return state, state.target

        return state, jax.lax.scan(one, state, jax.random.split(step_key, n_steps))[1]

    first, trace = jax.jit(jax.vmap(targets))(jax.random.split(jax.random.key(5), n_envs))
    trace = np.asarray(trace)
    assert set(np.unique(trace)) <= set(LEVELS)
    changes = int(np.sum(trace[:, 1:] != trace[:, :-1]))
    # A new target with probability 0.003, a different one 3 times in 4: p = 0.00225 over
    # 255,744 steps, mean 575.4 and standard deviation 24.0. The band 480..672 is +-4 sigma;
    # p = 0.003 (767) or p = 0.0015 (384) would fall outside it.
    assert 480 <= changes <= 672
    flows = np.asarray(first.channel)
    assert np.all((flows >= 80.0) & (flows <= 120.0))
    assert np.all(flows == flows[:, :1])  # the whole channel starts at the initial flow
    keys = jax.random.split(jax.random.key(6), 4000)
    states, _ = jax.jit(jax.vmap(env.reset_env, in_axes=(0, None)))(keys, params)
    initial = np.asarray(states.channel[:, 0])
    assert abs(initial.mean() - 100.0) < 1.0  # U(80, 120): standard error 0.18
    shares = [np.mean(np.asarray(states.target) == level) for level in LEVELS]
    np.testing.assert_allclose(shares, 0.25, atol=0.03)  # standard deviation 0.0068
    states, _ = jax.jit(jax.vmap(env.reset_env, in_axes=(0, None)))(
        keys[:8], env.default_params(initial_target=50.0)
    )
    np.testing.assert_array_equal(states.target, np.full(8, 50.0))


def test_batched_and_presampled_draws_follow_the_reference_statistics(pipe):
    """A batch draws its randomness in one call, and ``scan_single`` all of an episode's
    in advance: both keep the reference's switching rate and uniform levels."""
    env, params, _, _ = pipe
    n_envs = 256
    states, _ = env.reset_batch(jax.random.key(7), n_envs, params)

    def one(states, key):
        states, _ = env.step_env_batch(key, states, jnp.zeros((n_envs, 1)), params)
        return states, states.target

    _, trace = jax.jit(
        lambda s: jax.lax.scan(one, s, jax.random.split(jax.random.key(8), EPISODE))
    )(states)
    trace = np.asarray(trace)
    changes = int(np.sum(trace[1:] != trace[:-1]))
    assert 480 <= changes <= 672  # as in the test above: p = 0.00225, +-4 sigma
    shares = [np.mean(trace == level) for level in LEVELS]
    np.testing.assert_allclose(shares, 0.25, atol=0.05)
    # Presampled: 256,000 steps of one environment, the same band.
    reset_keys, uniforms = env.presample(jax.random.key(9), n_envs * EPISODE)
    assert reset_keys.shape[0] == uniforms.shape[0] == n_envs * EPISODE
    new_target = np.asarray(uniforms[:, 0]) < 0.003
    assert 575 <= int(new_target.sum()) <= 960  # p = 0.003: mean 768, +-7 sigma
    # One uniform decides both: below p, u / p picks the level uniformly. 4M draws give
    # about 12,000 new targets, each level's share within 0.02 of a quarter (5 sigma).
    _, many = env.presample(jax.random.key(10), 4_000_000)
    switching = np.asarray(many[:, 0])
    switching = switching[switching < 0.003]
    levels = np.minimum((switching / np.float32(0.003) * 4).astype(int), 3)
    np.testing.assert_allclose(np.bincount(levels, minlength=4) / levels.size, 0.25, atol=0.02)
    drawn = np.asarray(
        jax.vmap(lambda u: next_target(u, jnp.float32(-1.0), params))(jnp.asarray(switching))
    )
    np.testing.assert_array_equal(drawn, np.asarray(params.target_levels)[levels])
    always = _held(params, 100.0, 110.0).replace(switch_probability=jnp.float32(1.0))
    state, _ = env.reset_env(KEY, always)
    after, _ = env.step_from_uniforms(jnp.array([0.8]), state, jnp.ones(1), always)
    assert float(after.target) == 140.0 and float(after.channel[0]) == 101.0


@pytest.mark.parametrize("auto_reset", [True, False])
def test_batch_rings_step_as_the_shift_registers_bit_for_bit(auto_reset):
    """``reset_batch``'s time-major rings (one row written per step, shared cursors,
    resets that leave the rings alone) against the per-environment shift registers
    (stacked ``PipelineState``, stepped one by one): 240 steps, more than five turns of
    the 45-slot flow ring and nine of the 25-slot change ring, through episodes of 70
    steps, frequent target draws and invalid actions. Observations, final observations,
    rewards, costs, flags and the state's channel and histories agree bit for bit."""
    env, params = make("Pipeline-v0", horizon=70, auto_reset=auto_reset)
    params = params.replace(switch_probability=jnp.float32(0.05))
    n_envs, key = 12, jax.random.key(3)
    rings, first = env.reset_batch(key, n_envs, params)
    assert isinstance(rings, PipelineBatchState)
    stacked, expected_first = jax.vmap(env.reset_env, in_axes=(0, None))(
        jax.random.split(key, n_envs), params
    )
    assert isinstance(stacked, PipelineState)
    np.testing.assert_array_equal(first.observation, expected_first.observation)
    step = jax.jit(env.step_batch)
    actions = np.random.default_rng(0).uniform(-1.5, 1.5, (240, n_envs, 1)).astype(np.float32)
    actions[::37, 3] = np.nan
    for index, action in enumerate(actions):
        step_key = jax.random.fold_in(key, index)
        rings, ours = step(step_key, rings, jnp.asarray(action), params)
        stacked, theirs = step(step_key, stacked, jnp.asarray(action), params)
        for got, want in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
            np.testing.assert_array_equal(got, want, err_msg=f"step {index}")
        for field in ("channel", "downstream_history", "action_history", "target", "time"):
            np.testing.assert_array_equal(
                getattr(rings, field), getattr(stacked, field), err_msg=f"{field}, step {index}"
            )
    assert int(rings.time.max()) == (240 % 70 if auto_reset else 240)


def test_costs_separate_a_predictive_controller_from_random_gate_changes(pipe):
    """``flow_off_target`` is 1 while |outlet - target| > 30. A controller that predicts
    the gate flow (the outlet plus the 19 changes still in the channel) and moves at full
    rate stays within the episode limit of 200 in most episodes; random changes do not."""
    env, params, step, reset = pipe
    state, _ = reset(KEY, _held(params, 100.0, 140.0))
    _, timestep = step(KEY, state, jnp.zeros(1), params)
    np.testing.assert_array_equal(timestep.cost, [1.0])  # 40 off target
    state, _ = reset(KEY, _held(params, 100.0, 110.0))
    _, timestep = step(KEY, state, jnp.zeros(1), params)
    np.testing.assert_array_equal(timestep.cost, [0.0])  # 10 off target

    random_policy = uniform_random_policy(env)

    def policy(predictive, observation, key):
        gate = observation[0] + jnp.sum(observation[27:46])
        tracking = jnp.clip(observation[1] - gate, -1.0, 1.0)[None]
        return jnp.where(predictive, tracking, random_policy(None, observation, key))

    run = jax.jit(lambda flag: rollout(KEY, env, params, policy, 128, EPISODE, policy_params=flag))
    over = {
        name: np.mean(
            np.asarray(run(jnp.asarray(flag)).total_cost)[:, 0] > DEFAULT_EPISODE_COST_LIMIT
        )
        for name, flag in (("predictive", True), ("random", False))
    }
    assert over["predictive"] < 0.15 and over["random"] > 0.5


def test_default_constraints_are_the_shipped_yaml(pipe):
    env, params, _, _ = pipe
    shipped = load_constraint_spec(ROOT / "configs" / "constraints" / "pipeline.yaml")
    expected = {**shipped.model_dump(), "description": ""}  # the file's prose alone differs
    assert env.default_constraints(params).model_dump() == expected
    assert env.default_constraints().model_dump() == expected


def test_bad_parameters_name_the_field():
    env, _ = make("Pipeline-v0")
    with pytest.raises(ValueError, match=r"target_levels\[2\]"):
        env.default_params(target_levels=(50.0, 80.0, 250.0))
    with pytest.raises(ValueError, match=r"target_levels\[0\]"):
        env.default_params(target_levels=(-5.0, 80.0))
    with pytest.raises(ValueError, match="switch_probability"):
        env.default_params(switch_probability=-0.1)
    with pytest.raises(ValueError, match="initial_flow_range"):
        env.default_params(initial_flow_range=(120.0, 80.0))
    with pytest.raises(ValueError, match="initial_target"):
        env.default_params(initial_target=300.0)
    with pytest.raises(ValueError, match="cost_band"):
        env.default_params(cost_band=0.0)
    with pytest.raises(ValueError, match="targt_levels"):
        env.default_params(targt_levels=LEVELS)
    with pytest.raises(ValueError, match="horizon"):
        make("Pipeline-v0", horizon=0)
    with pytest.raises(ValueError, match="delay"):
        Pipeline(delay=0)


def test_invalid_actions_leave_the_gate_and_finite_ones_saturate(pipe):
    _, params, step, reset = pipe
    state, _ = reset(KEY, _held(params, 100.0, 110.0))
    for bad in (jnp.nan, jnp.inf, -jnp.inf):
        after, timestep = step(KEY, state, jnp.array([bad]), params)
        assert bool(timestep.info.action_invalid)
        assert float(after.channel[0]) == 100.0 and float(timestep.observation[27]) == 0.0
    after, timestep = step(KEY, state, jnp.array([-7.0]), params)
    assert not bool(timestep.info.action_invalid)
    assert float(after.channel[0]) == 99.0 and float(timestep.observation[27]) == -1.0


def test_batched_steps_rollouts_truncation_and_one_compilation_for_a_sweep(pipe):
    env, params, _, _ = pipe
    states, _ = env.reset_batch(KEY, 4, params)
    states, timesteps = jax.jit(env.step_batch)(
        KEY, states, jnp.array([[1.0], [-1.0], [jnp.nan], [0.5]]), params
    )
    assert np.all(np.isfinite(np.asarray(timesteps.observation)))
    np.testing.assert_array_equal(timesteps.info.action_invalid, [False, False, True, False])
    short, short_params = make("Pipeline-v0", horizon=10)
    result = jax.jit(
        lambda key: rollout(key, short, short_params, uniform_random_policy(short), 8, 30)
    )(KEY)
    assert np.all(np.asarray(result.episodes) == 3)
    assert np.all(np.isfinite(np.asarray(result.final_observation)))
    switching = env.default_params(switch_probability=0.1, cost_band=10.0)
    both = jax.tree.map(lambda a, b: jnp.stack([a, b]), params, switching)
    traces = []

    def run(p):
        traces.append(1)
        result = rollout(KEY, env, p, uniform_random_policy(env), 4, 50)
        return result.total_cost.sum()

    totals = jax.jit(jax.vmap(run))(both)
    assert len(traces) == 1 and np.all(np.isfinite(totals)) and totals[0] != totals[1]


def test_gymnasium_check_env_with_warnings_as_errors():
    env = gymnasium.make("neorl_industrial/Pipeline-v0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped, skip_render_check=True)


def test_task_and_published_normalization():
    task = Task.from_env("Pipeline-v0")
    assert task.observation_size == 52 and task.action_names == ("gate_change",)
    assert task.observation_names[:3] == ("downstream_flow", "target_flow", "downstream_flow_lag1")
    assert task.observation_names[-1] == "gate_change_lag24"
    assert task.observation_units == (None,) * 52 and task.action_units == (None,)
    assert task.action_low == (-1.0,) and task.action_high == (1.0,)
    assert task.cost_names == ("flow_off_target",) and task.episode_length == 1000
    # the cost a spec cannot express still carries its episode limit, into cards and runs
    assert task.cost_limits == {"flow_off_target": 200.0}
    assert REFERENCE_SCORES == {"min": -296.0, "max": 751.0}
    assert normalized_score(429.0072265625) == pytest.approx(69.246, abs=1e-3)
