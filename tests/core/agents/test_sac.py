"""Soft Actor-Critic and its networks."""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.agents.networks import (
    Critic,
    CriticEnsemble,
    ObservationNormalizer,
    TanhGaussianActor,
    tanh_gaussian_log_prob,
    tanh_gaussian_sample,
)
from neorl_industrial.core.agents.sac import Batch, SACConfig, make_sac

OBS_SIZE = 5
ACTION_SIZE = 2
SMALL = SACConfig(hidden=(32, 32))
# One algorithm and one compiled update shared by the tests, so each compiles once.
SAC = make_sac(SMALL, OBS_SIZE, ACTION_SIZE)
INIT = jax.jit(SAC.init)
UPDATE = jax.jit(SAC.update)


def _batch(key: jax.Array, batch_size: int = 16) -> Batch:
    keys = jax.random.split(key, 5)
    return Batch(
        observations=jax.random.normal(keys[0], (batch_size, OBS_SIZE)),
        actions=jax.random.uniform(keys[1], (batch_size, ACTION_SIZE), minval=-1, maxval=1),
        rewards=jax.random.normal(keys[2], (batch_size,)),
        next_observations=jax.random.normal(keys[3], (batch_size, OBS_SIZE)),
        discounts=(jax.random.uniform(keys[4], (batch_size,)) > 0.1).astype(jnp.float32),
    )


def _run_updates(seed: int, n_updates: int = 3):
    state = INIT(jax.random.key(seed))
    for i in range(n_updates):
        state, _ = UPDATE(state, _batch(jax.random.key(100 + i)), jax.random.key(200 + i))
    return state


def test_one_update_is_the_same_with_and_without_jit():
    state = INIT(jax.random.key(0))
    batch, key = _batch(jax.random.key(1)), jax.random.key(2)
    jitted_state, jitted_metrics = UPDATE(state, batch, key)
    eager_state, eager_metrics = SAC.update(state, batch, key)
    chex.assert_trees_all_close(jitted_state, eager_state, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(jitted_metrics, eager_metrics, rtol=1e-5, atol=1e-6)
    # The update changed every trained part.
    assert int(jitted_state.step) == 1
    for before, after in [
        (state.critic, jitted_state.critic),
        (state.policy.actor, jitted_state.policy.actor),
        (state.target_critic, jitted_state.target_critic),
    ]:
        assert not np.allclose(jax.tree.leaves(before)[0], jax.tree.leaves(after)[0])
    assert float(jitted_state.log_alpha) != float(state.log_alpha)


def test_same_seed_gives_identical_parameters_and_another_seed_does_not():
    first = _run_updates(seed=3)
    second = _run_updates(seed=3)
    chex.assert_trees_all_equal(first, second)
    other = _run_updates(seed=4)
    assert not np.array_equal(
        jax.tree.leaves(first.policy.actor)[0], jax.tree.leaves(other.policy.actor)[0]
    )


def test_critic_ensemble_is_vmapped_over_independent_critics():
    ensemble = CriticEnsemble(hidden=(16,), n_critics=3)
    observations, actions = jnp.ones((7, OBS_SIZE)), jnp.zeros((7, ACTION_SIZE))
    params = ensemble.init(jax.random.key(0), observations, actions)
    values = ensemble.apply(params, observations, actions)
    assert values.shape == (3, 7)
    # Parameters are stacked on a leading axis, and each slice is a plain critic.
    for leaf in jax.tree.leaves(params):
        assert leaf.shape[0] == 3
    for i in range(3):
        single = jax.tree.map(lambda leaf, i=i: leaf[i], params["params"])
        expected = Critic(hidden=(16,)).apply({"params": single}, observations, actions)
        np.testing.assert_allclose(values[i], expected, rtol=1e-6)
    assert not np.allclose(values[0], values[1])


def test_critic_ensemble_layouts_broadcasting_and_members_agree():
    ensemble = CriticEnsemble(hidden=(16, 8), n_critics=2)
    observations = jax.random.normal(jax.random.key(1), (5, OBS_SIZE))
    actions = jax.random.uniform(jax.random.key(2), (4, 5, ACTION_SIZE), minval=-1, maxval=1)
    params = ensemble.init(jax.random.key(0), observations, actions[0])
    looped = CriticEnsemble((16, 8), 2, batched=False).apply(params, observations, actions)
    batched = CriticEnsemble((16, 8), 2, batched=True).apply(params, observations, actions)
    assert looped.shape == (2, 4, 5)
    np.testing.assert_allclose(looped, batched, rtol=1e-5, atol=1e-6)
    # One observation shared by four actions equals the observation repeated four times.
    repeated = jnp.broadcast_to(observations, (4, 5, OBS_SIZE))
    np.testing.assert_allclose(
        ensemble.apply(params, repeated, actions), looped, rtol=1e-5, atol=1e-6
    )
    # The first layer on [obs, action] is one Dense on the concatenation.
    first = ensemble.apply(params, observations, actions[0], members=1)
    np.testing.assert_allclose(first, looped[:1, 0], rtol=1e-6)
    kernel = params["params"]["layer_0_kernel"][0]
    inputs = jnp.concatenate([observations, actions[0]], axis=-1)
    hidden = jax.nn.relu(inputs @ kernel + params["params"]["layer_0_bias"][0])
    hidden = jax.nn.relu(
        hidden @ params["params"]["layer_1_kernel"][0] + params["params"]["layer_1_bias"][0]
    )
    value = hidden @ params["params"]["layer_2_kernel"][0] + params["params"]["layer_2_bias"][0]
    np.testing.assert_allclose(first[0], value[:, 0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="members"):
        ensemble.apply(params, observations, actions[0], members=3)


def test_tanh_gaussian_log_prob_matches_the_change_of_variables():
    mean = jnp.array([[0.3, -1.2], [0.0, 2.0]])
    log_std = jnp.array([[-0.5, 0.2], [-1.0, -2.0]])
    keys = jax.random.split(jax.random.key(0), 1000)
    actions, log_probs = jax.vmap(tanh_gaussian_sample, in_axes=(None, None, 0))(
        mean, log_std, keys
    )
    assert actions.shape == (1000, 2, 2) and log_probs.shape == (1000, 2)
    # Independent float64 computation: log N(atanh a) - log(1 - a^2), summed over the action.
    a = np.asarray(actions, np.float64)
    u = np.arctanh(a)
    std = np.exp(np.asarray(log_std, np.float64))
    gaussian = (
        -0.5 * ((u - np.asarray(mean)) / std) ** 2 - np.log(std) - 0.5 * math.log(2 * math.pi)
    )
    expected = (gaussian - np.log1p(-(a**2))).sum(-1)
    # Actions that round to within float32 precision of ±1 make atanh ill-conditioned.
    well_conditioned = np.all(np.abs(a) < 0.999, axis=-1)
    assert well_conditioned.mean() > 0.9
    np.testing.assert_allclose(
        np.asarray(log_probs)[well_conditioned], expected[well_conditioned], rtol=2e-3, atol=2e-3
    )
    # Evaluating the density at the sampled actions gives the sampler's log-probability.
    np.testing.assert_allclose(
        tanh_gaussian_log_prob(mean, log_std, actions)[well_conditioned],
        np.asarray(log_probs)[well_conditioned],
        rtol=2e-3,
        atol=2e-3,
    )


def test_tanh_gaussian_density_integrates_to_one_and_matches_samples():
    mean, log_std = jnp.array([0.4]), jnp.array([-0.3])
    grid = jnp.linspace(-1.0, 1.0, 200_001, dtype=jnp.float32)[1:-1]
    density = jnp.exp(tanh_gaussian_log_prob(mean, log_std, grid[:, None]))
    assert float(jnp.trapezoid(density, grid)) == pytest.approx(1.0, abs=2e-3)
    # Monte-Carlo: the fraction of samples in a bin matches the density's mass there.
    samples, _ = jax.vmap(tanh_gaussian_sample, in_axes=(None, None, 0))(
        mean, log_std, jax.random.split(jax.random.key(1), 200_000)
    )
    edges = np.linspace(-1.0, 1.0, 11)
    counts, _ = np.histogram(np.asarray(samples[:, 0]), bins=edges)
    grid_np, density_np = np.asarray(grid), np.asarray(density)
    for low, high, count in zip(edges[:-1], edges[1:], counts, strict=True):
        inside = (grid_np >= low) & (grid_np < high)
        mass = np.trapezoid(density_np[inside], grid_np[inside])
        assert count / samples.shape[0] == pytest.approx(mass, abs=5e-3)


def test_actor_log_std_is_bounded_and_mean_action_is_squashed():
    actor = TanhGaussianActor(ACTION_SIZE, hidden=(8,), log_std_min=-3.0, log_std_max=1.0)
    observations = 1e4 * jax.random.normal(jax.random.key(0), (64, OBS_SIZE))
    params = actor.init(jax.random.key(1), observations)
    mean, log_std = actor.apply(params, observations)
    assert float(log_std.min()) >= -3.0 and float(log_std.max()) <= 1.0
    action = actor.mean_action(params, observations)
    np.testing.assert_allclose(action, jnp.tanh(mean))
    sampled, log_prob = actor.sample(params, observations, jax.random.key(2))
    assert sampled.shape == (64, ACTION_SIZE) and log_prob.shape == (64,)
    assert np.all(np.isfinite(log_prob)) and np.all(np.abs(sampled) <= 1.0)


def test_act_normalizes_observations_and_is_deterministic_on_request():
    mean, std = np.arange(OBS_SIZE, dtype=np.float32), np.full(OBS_SIZE, 10.0, np.float32)
    sac = make_sac(
        SACConfig.create(hidden=(16,), obs_mean=mean, obs_std=std), OBS_SIZE, ACTION_SIZE
    )
    policy = jax.jit(sac.init)(jax.random.key(0)).policy
    observation = jnp.linspace(-5.0, 5.0, OBS_SIZE)
    expected = TanhGaussianActor(ACTION_SIZE, (16,)).mean_action(
        policy.actor, (observation - mean) / std
    )
    np.testing.assert_allclose(sac.act(policy, observation, deterministic=True), expected)
    first = sac.act(policy, observation, jax.random.key(1))
    second = sac.act(policy, observation, jax.random.key(2))
    assert not np.allclose(first, second)
    with pytest.raises(ValueError, match="key"):
        sac.act(policy, observation)


def test_config_rejects_bad_values_by_name():
    with pytest.raises(ValueError, match="gamma"):
        SACConfig(gamma=1.5)
    with pytest.raises(ValueError, match="obs_std"):
        SACConfig.create(obs_mean=np.zeros(3), obs_std=np.ones(4))
    with pytest.raises(ValueError, match="obs_mean"):
        make_sac(SACConfig.create(obs_mean=np.zeros(3), obs_std=np.ones(3)), OBS_SIZE, ACTION_SIZE)
    # Statistics given as arrays are stored as tuples, so the config stays hashable.
    config = SACConfig.create(obs_mean=np.zeros(3), obs_std=np.ones(3))
    assert hash(config) == hash(SACConfig(obs_mean=(0.0, 0.0, 0.0), obs_std=(1.0, 1.0, 1.0)))
    normalizer = ObservationNormalizer.create([1.0, 5.0], [0.0, 2.0])
    np.testing.assert_allclose(normalizer(jnp.array([3.0, 9.0])), [2.0, 2.0])


def test_sac_learns_a_contextual_bandit():
    """One-step task: the best action is ``0.5 * context``; data come from a random policy."""
    sac = make_sac(SACConfig(hidden=(64, 64), gamma=0.0, actor_lr=1e-3, critic_lr=1e-3), 1, 1)

    def random_batch(key: jax.Array) -> Batch:
        context_key, action_key = jax.random.split(key)
        context = jax.random.uniform(context_key, (128, 1), minval=-1.0, maxval=1.0)
        action = jax.random.uniform(action_key, (128, 1), minval=-1.0, maxval=1.0)
        reward = -4.0 * jnp.square(action[:, 0] - 0.5 * context[:, 0])
        return Batch(context, action, reward, context, jnp.zeros((128,)))

    def train(state, key):
        batch_key, update_key = jax.random.split(key)
        return sac.update(state, random_batch(batch_key), update_key)

    state = sac.init(jax.random.key(0))
    state, metrics = jax.jit(lambda s, k: jax.lax.scan(train, s, jax.random.split(k, 1500)))(
        state, jax.random.key(1)
    )
    contexts = jnp.linspace(-1.0, 1.0, 21)[:, None]
    actions = sac.act(state.policy, contexts, deterministic=True)
    error = np.abs(np.asarray(actions[:, 0]) - 0.5 * np.asarray(contexts[:, 0]))
    assert error.max() < 0.1, error
    assert np.all(np.isfinite(metrics["critic_loss"]))
