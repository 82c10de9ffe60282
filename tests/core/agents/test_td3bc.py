"""TD3+BC."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.agents.losses import critic_loss
from neorl_industrial.core.agents.td3bc import TD3BCConfig, actor_loss, make_td3bc
from neorl_industrial.functional.state_management import Dataset, sample
from neorl_industrial.functional.transformations.offline import Schedule, train_offline

OBS, ACT = 4, 2


def _bandit_dataset(n=4000, seed=0):
    """One-step episodes: reward -||a - a*(s)||^2 with a*(s) = tanh(W s); the data's actions
    are the best action plus wide noise, so behaviour cloning alone copies the noise's
    mean while the critic points at the best action."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=(OBS, ACT)) / np.sqrt(OBS)
    observations = rng.normal(size=(n, 2, OBS)).astype(np.float32)
    best = np.tanh(observations[:, 0] @ weights)
    actions = np.clip(best + rng.normal(scale=0.5, size=best.shape), -1, 1).astype(np.float32)
    rewards = -np.sum((actions - best) ** 2, axis=1).astype(np.float32)
    dataset = Dataset.from_trajectories(
        observations,
        actions[:, None],
        rewards[:, None],
        np.zeros((n, 1, 1), np.float32),
        np.ones((n, 1), bool),
    )
    return dataset, weights


def test_per_transition_losses():
    np.testing.assert_allclose(critic_loss(jnp.array([1.0, 3.0]), jnp.asarray(2.0)), 2.0)
    np.testing.assert_allclose(
        actor_loss(jnp.asarray(2.0), jnp.array([0.5, 0.0]), jnp.array([0.0, 0.0]), 0.5), -0.875
    )
    # The BC term is a mean over action dimensions: repeating every dimension three times
    # leaves the loss (and so the effective alpha) unchanged.
    one = actor_loss(jnp.asarray(2.0), jnp.array([0.5, -0.2]), jnp.array([0.1, 0.3]), 0.5)
    three = actor_loss(
        jnp.asarray(2.0),
        jnp.tile(jnp.array([0.5, -0.2]), 3),
        jnp.tile(jnp.array([0.1, 0.3]), 3),
        0.5,
    )
    np.testing.assert_allclose(one, three, rtol=1e-6)
    with pytest.raises(AssertionError):
        critic_loss(jnp.zeros(2), jnp.zeros(2))


def test_update_is_the_same_with_and_without_jit():
    dataset, _ = _bandit_dataset(n=64)
    td3bc = make_td3bc(TD3BCConfig(hidden=(16,)), OBS, ACT)
    state = td3bc.init(jax.random.PRNGKey(0))
    batch = sample(dataset, jax.random.PRNGKey(1), 32)
    for step in range(2):  # a critic-and-policy step, then a critic-only step
        eager, _ = td3bc.update(state, batch, jax.random.PRNGKey(step))
        jitted, jitted_metrics = jax.jit(td3bc.update)(state, batch, jax.random.PRNGKey(step))
        for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
        state = jitted
    assert float(jitted_metrics["actor_loss"]) == 0.0  # the delayed policy did not move
    assert int(state.step) == 2


def test_td3bc_finds_better_actions_than_the_data():
    dataset, weights = _bandit_dataset()
    td3bc = make_td3bc(TD3BCConfig(hidden=(64, 64), actor_lr=1e-3, critic_lr=1e-3), OBS, ACT)
    states, history = train_offline(
        td3bc,
        dataset,
        seeds=(0,),
        schedule=Schedule(n_updates=1600, chunk_updates=800, batch_size=128),
    )
    assert history[-1]["metrics"]["critic_loss"][0] < history[0]["metrics"]["critic_loss"][0]
    policy = jax.tree.map(lambda leaf: leaf[0], states.agent.policy)
    test_obs = np.random.default_rng(1).normal(size=(512, OBS)).astype(np.float32)
    best = np.tanh(test_obs @ weights)
    policy_regret = np.sum((np.asarray(td3bc.act(policy, test_obs)) - best) ** 2, axis=1).mean()
    data_regret = -float(dataset.rewards.mean())
    assert policy_regret < 0.5 * data_regret, (policy_regret, data_regret)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="tau"):
        TD3BCConfig(tau=0.0)
    with pytest.raises(ValueError, match="policy_freq"):
        TD3BCConfig(policy_freq=0)
