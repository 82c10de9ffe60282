"""Implicit Q-Learning."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.agents.bc import BCConfig, make_bc
from neorl_industrial.core.agents.iql import (
    IQLConfig,
    awr_loss,
    expectile_loss,
    make_iql,
)
from neorl_industrial.functional.state_management import Dataset, sample
from neorl_industrial.functional.transformations.offline import Schedule, train_offline

OBS, ACT = 4, 2
BIAS = 0.4


def _biased_bandit(n=4000, seed=0):
    """One-step episodes with reward -||a - a*(s)||^2. The behaviour policy is biased by
    +0.4 in every action dimension and noisy, so cloning it keeps the bias while a
    value-based learner can remove it."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=(OBS, ACT)) / np.sqrt(OBS) * 0.5
    observations = rng.normal(size=(n, 2, OBS)).astype(np.float32)
    best = np.tanh(observations[:, 0] @ weights)
    actions = np.clip(best + BIAS + rng.normal(scale=0.4, size=best.shape), -1, 1)
    rewards = -np.sum((actions - best) ** 2, axis=1)
    dataset = Dataset.from_trajectories(
        observations,
        actions.astype(np.float32)[:, None],
        rewards.astype(np.float32)[:, None],
        np.zeros((n, 1, 1), np.float32),
        np.ones((n, 1), bool),
    )
    return dataset, weights


def _regret(algorithm, states, weights):
    policy = jax.tree.map(lambda leaf: leaf[0], states.agent.policy)
    observations = np.random.default_rng(1).normal(size=(512, OBS)).astype(np.float32)
    best = np.tanh(observations @ weights)
    return float(np.sum((np.asarray(algorithm.act(policy, observations)) - best) ** 2, 1).mean())


def test_per_transition_losses():
    np.testing.assert_allclose(expectile_loss(jnp.asarray(2.0), 0.7), 0.7 * 4.0)
    np.testing.assert_allclose(expectile_loss(jnp.asarray(-2.0), 0.7), 0.3 * 4.0)
    np.testing.assert_allclose(awr_loss(jnp.asarray(-1.0), jnp.asarray(0.0), 3.0, 100.0), 1.0)
    np.testing.assert_allclose(awr_loss(jnp.asarray(-1.0), jnp.asarray(10.0), 3.0, 100.0), 100.0)
    with pytest.raises(AssertionError):
        expectile_loss(jnp.zeros(2), 0.7)


def test_update_is_the_same_with_and_without_jit():
    dataset, _ = _biased_bandit(n=64)
    iql = make_iql(IQLConfig(hidden=(16,)), OBS, ACT)
    state = iql.init(jax.random.PRNGKey(0))
    batch = sample(dataset, jax.random.PRNGKey(1), 32)
    eager, eager_metrics = iql.update(state, batch, jax.random.PRNGKey(2))
    jitted, jitted_metrics = jax.jit(iql.update)(state, batch, jax.random.PRNGKey(2))
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    for name in eager_metrics:
        np.testing.assert_allclose(eager_metrics[name], jitted_metrics[name], rtol=1e-4)


def test_iql_removes_the_behaviour_bias_that_cloning_keeps():
    dataset, weights = _biased_bandit()
    run = dict(seeds=(0,), schedule=Schedule(n_updates=1600, chunk_updates=800, batch_size=128))
    iql = make_iql(IQLConfig(hidden=(64, 64), expectile=0.9, beta=10.0), OBS, ACT)
    iql_states, history = train_offline(iql, dataset, **run)
    bc = make_bc(BCConfig(hidden=(64, 64), learning_rate=1e-3), OBS, ACT)
    bc_states, _ = train_offline(bc, dataset, **run)
    iql_regret = _regret(iql, iql_states, weights)
    bc_regret = _regret(bc, bc_states, weights)
    assert bc_regret > 0.2  # cloning keeps most of the 2 x 0.4^2 bias
    assert iql_regret < 0.6 * bc_regret, (iql_regret, bc_regret)
    assert np.isfinite(history[-1]["metrics"]["actor_loss"][0])


def test_stochastic_actions_need_a_key_and_config_errors_name_the_field():
    iql = make_iql(IQLConfig(hidden=(8,)), OBS, ACT)
    policy = iql.init(jax.random.PRNGKey(0)).policy
    with pytest.raises(ValueError, match="key"):
        iql.act(policy, jnp.zeros(OBS), deterministic=False)
    action = iql.act(policy, jnp.zeros(OBS), jax.random.PRNGKey(1), deterministic=False)
    assert action.shape == (ACT,) and np.all(np.abs(action) <= 1.0)
    with pytest.raises(ValueError, match="expectile"):
        IQLConfig(expectile=1.0)


def _layers(params):
    """``(kernel, bias)`` of every dense layer in ``params``."""
    leaves = {
        jax.tree_util.keystr(path): leaf
        for path, leaf in jax.tree_util.tree_leaves_with_path(params)
    }
    return [
        (leaf, leaves[path.replace("kernel", "bias")])
        for path, leaf in leaves.items()
        if "kernel" in path
    ]


def test_networks_start_from_pytorch_s_layers_unless_told_otherwise():
    """IQL's actor, value and critics start as d3rlpy's and CORL's (weights and biases
    uniform in ±1/sqrt(fan_in)); on Pipeline-v0 flax's LeCun normal scattered the seeds."""
    assert IQLConfig().weight_init == "uniform"
    state = make_iql(IQLConfig(hidden=(32, 32)), OBS, ACT).init(jax.random.PRNGKey(0))
    every = _layers((state.policy.actor, state.value, state.critic))
    assert len(every) == 3 + 3 + 3
    for kernel, bias in every:  # the critics' kernels are [members, fan_in, width]
        bound = 1.0 / np.sqrt(kernel.shape[-2]) + 1e-6
        assert np.max(np.abs(kernel)) <= bound and np.max(np.abs(bias)) <= bound
        assert np.all(bias != 0.0)  # drawn, not flax's zeros
    np.testing.assert_array_equal(state.policy.actor["params"]["log_std"], 0.0)
    lecun = make_iql(IQLConfig(hidden=(32, 32), weight_init="lecun"), OBS, ACT)
    lecun_state = lecun.init(jax.random.PRNGKey(0))
    layers = _layers((lecun_state.policy.actor, lecun_state.value, lecun_state.critic))
    assert all(not bias.any() for _, bias in layers)
