"""Discrete behaviour cloning and discrete CQL."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.agents.discrete import (
    DiscreteBCConfig,
    DiscreteCQLConfig,
    cross_entropy_loss,
    discrete_cql_loss,
    make_discrete_bc,
    make_discrete_cql,
)
from neorl_industrial.functional.state_management import Dataset, sample
from neorl_industrial.functional.transformations.offline import Schedule, train_offline

OBS, N_ACTIONS = 4, 5


def _biased_bandit(n=3000, seed=0):
    """One-step episodes. The best action is ``argmax(W s)`` (reward 1, others 0); the
    behaviour takes a habitual *wrong* action (``best + 1``) half of the time, the best
    one 30 % of the time and a uniform one otherwise. Cloning copies the habit; CQL,
    which sees the rewards, picks the best action."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=(OBS, N_ACTIONS))
    observations = rng.normal(size=(n, 2, OBS)).astype(np.float32)
    best = np.argmax(observations[:, 0] @ weights, axis=1)
    draw = rng.random(n)
    actions = np.where(
        draw < 0.5,
        (best + 1) % N_ACTIONS,
        np.where(draw < 0.8, best, rng.integers(0, N_ACTIONS, n)),
    ).astype(np.int32)
    rewards = (actions == best).astype(np.float32)
    dataset = Dataset.from_trajectories(
        observations,
        actions[:, None],
        rewards[:, None],
        np.zeros((n, 1, 1), np.float32),
        np.ones((n, 1), bool),
    )
    return dataset, weights


def _accuracy(algorithm, state, weights):
    policy = jax.tree.map(lambda leaf: leaf[0], state.agent.policy)
    test_obs = np.random.default_rng(7).normal(size=(1000, OBS)).astype(np.float32)
    chosen = np.asarray(algorithm.act(policy, test_obs))
    return float(np.mean(chosen == np.argmax(test_obs @ weights, axis=1)))


def test_losses_of_one_transition():
    logits = jnp.array([0.0, 1.0, 2.0])
    expected = -(1.0 - np.log(np.exp(0.0) + np.exp(1.0) + np.exp(2.0)))
    np.testing.assert_allclose(cross_entropy_loss(logits, jnp.asarray(1)), expected, rtol=1e-6)
    lse = np.log(np.exp(0.0) + np.exp(1.0) + np.exp(2.0))
    loss, gap = discrete_cql_loss(logits, jnp.asarray(2), jnp.asarray(1.5), 2.0, "squared")
    np.testing.assert_allclose(gap, lse - 2.0, rtol=1e-6)
    np.testing.assert_allclose(loss, 0.25 + 2.0 * (lse - 2.0), rtol=1e-6)
    # Huber (the default): d^2 / 2 within 1, |d| - 1/2 beyond.
    near, _ = discrete_cql_loss(logits, jnp.asarray(2), jnp.asarray(1.5), 2.0)
    np.testing.assert_allclose(near, 0.125 + 2.0 * (lse - 2.0), rtol=1e-6)
    far, _ = discrete_cql_loss(logits, jnp.asarray(2), jnp.asarray(5.0), 0.0)
    np.testing.assert_allclose(far, 2.5, rtol=1e-6)
    with pytest.raises(ValueError, match="td_loss: expected one of"):
        DiscreteCQLConfig(td_loss="l1")
    with pytest.raises(AssertionError):
        cross_entropy_loss(logits, jnp.array([1]))


def test_cloning_copies_the_habit_and_cql_finds_the_best_action():
    dataset, weights = _biased_bandit()
    bc = make_discrete_bc(DiscreteBCConfig(hidden=(64, 64)), OBS, N_ACTIONS)
    bc_state, _ = train_offline(
        bc,
        dataset,
        schedule=Schedule(n_updates=1500, chunk_updates=500, batch_size=256),
    )
    cql = make_discrete_cql(DiscreteCQLConfig(hidden=(64, 64), learning_rate=1e-3), OBS, N_ACTIONS)
    cql_state, history = train_offline(
        cql,
        dataset,
        schedule=Schedule(n_updates=1500, chunk_updates=500, batch_size=256),
    )
    bc_accuracy = _accuracy(bc, bc_state, weights)
    cql_accuracy = _accuracy(cql, cql_state, weights)
    # The habit is the data's most frequent action: cloning picks the best one rarely.
    assert bc_accuracy < 0.4, bc_accuracy
    assert cql_accuracy > 0.8, cql_accuracy
    assert history[-1]["metrics"]["loss"][0] < history[0]["metrics"]["loss"][0]


def test_updates_agree_with_and_without_jit_and_actions_are_indices():
    dataset, _ = _biased_bandit(n=64)
    batch = sample(dataset, jax.random.PRNGKey(1), 32)
    for algorithm in (
        make_discrete_bc(DiscreteBCConfig(hidden=(16,)), OBS, N_ACTIONS),
        make_discrete_cql(DiscreteCQLConfig(hidden=(16,)), OBS, N_ACTIONS),
    ):
        state = algorithm.init(jax.random.PRNGKey(0))
        eager, _ = algorithm.update(state, batch, jax.random.PRNGKey(2))
        jitted, _ = jax.jit(algorithm.update)(state, batch, jax.random.PRNGKey(2))
        for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
        actions = algorithm.act(jitted.policy, batch.observations)
        assert actions.dtype == jnp.int32 and actions.shape == (32,)
        assert int(actions.min()) >= 0 and int(actions.max()) < N_ACTIONS
        sampled = algorithm.act(jitted.policy, batch.observations, jax.random.PRNGKey(3), False)
        assert sampled.shape == (32,)
        with pytest.raises(ValueError, match="key"):
            algorithm.act(jitted.policy, batch.observations, None, False)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="num_actions"):
        make_discrete_bc(DiscreteBCConfig(), OBS, 1)
    with pytest.raises(ValueError, match="cql_alpha"):
        DiscreteCQLConfig(cql_alpha=-1.0)
    with pytest.raises(ValueError, match="learning_rate"):
        DiscreteBCConfig(learning_rate=0.0)
    for config in (DiscreteBCConfig, DiscreteCQLConfig):
        with pytest.raises(ValueError, match="weight_init: expected one of"):
            config(weight_init="zeros")


def test_networks_start_from_pytorch_s_default_layers_unless_told_otherwise():
    from tests.core.agents.test_cql import layers_of

    for make, config in (
        (make_discrete_bc, DiscreteBCConfig),
        (make_discrete_cql, DiscreteCQLConfig),
    ):
        state = make(config(hidden=(16,)), OBS, 5).init(jax.random.PRNGKey(1))
        layers = layers_of(state.policy.actor)
        assert [kernel.shape for kernel, _ in layers] == [(OBS, 16), (16, 5)]
        for kernel, bias in layers:
            bound = 1.0 / np.sqrt(kernel.shape[0]) + 1e-6
            assert np.abs(kernel).max() <= bound and np.abs(bias).max() <= bound
            assert bias.any()
        flax_default = make(config(hidden=(16,), weight_init="lecun"), OBS, 5)
        lecun = layers_of(flax_default.init(jax.random.PRNGKey(1)).policy.actor)
        assert all(not bias.any() for _, bias in lecun)
