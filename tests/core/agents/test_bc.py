"""Behaviour cloning and the scan-fused offline training loop."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.agents.bc import BCConfig, bc_loss, make_bc
from neorl_industrial.functional.state_management import Dataset, init_train_state, sample
from neorl_industrial.functional.transformations.offline import (
    Schedule,
    init_seeds,
    make_chunk,
    train_offline,
)

OBS, ACT = 8, 3


def _expert_dataset(n_episodes=20, length=50, seed=0):
    """Actions of a fixed nonlinear expert: tanh of a linear map of the observation."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=(OBS, ACT)) / np.sqrt(OBS)
    observations = rng.normal(size=(n_episodes, length + 1, OBS)).astype(np.float32)
    actions = np.tanh(observations[:, :-1] @ weights).astype(np.float32)
    dataset = Dataset.from_trajectories(
        observations,
        actions,
        np.zeros((n_episodes, length), np.float32),
        np.zeros((n_episodes, length, 1), np.float32),
        np.zeros((n_episodes, length), bool),
    )
    return dataset, weights


def test_bc_loss_is_the_mean_squared_error_of_one_transition():
    np.testing.assert_allclose(bc_loss(jnp.array([0.5, -1.0]), jnp.array([0.0, 1.0])), 2.125)
    with pytest.raises(AssertionError):
        bc_loss(jnp.zeros(3), jnp.zeros(2))


def test_bc_imitates_the_expert():
    dataset, weights = _expert_dataset()
    bc = make_bc(BCConfig(hidden=(64, 64), learning_rate=1e-3), OBS, ACT)
    states, history = train_offline(
        bc,
        dataset,
        seeds=(0,),
        schedule=Schedule(n_updates=2000, chunk_updates=500, batch_size=128),
    )
    losses = [float(entry["metrics"]["bc_loss"][0]) for entry in history]
    assert losses[-1] < 0.1 * losses[0]
    policy = jax.tree.map(lambda leaf: leaf[0], states.agent.policy)
    test_obs = np.random.default_rng(1).normal(size=(256, OBS)).astype(np.float32)
    error = np.abs(bc.act(policy, test_obs) - np.tanh(test_obs @ weights)).mean()
    assert error < 0.08, error


def test_update_is_the_same_with_and_without_jit():
    dataset, _ = _expert_dataset(n_episodes=2, length=10)
    bc = make_bc(BCConfig(hidden=(16,)), OBS, ACT)
    state = bc.init(jax.random.PRNGKey(0))
    batch = sample(dataset, jax.random.PRNGKey(1), 32)
    eager, eager_metrics = bc.update(state, batch, jax.random.PRNGKey(2))
    jitted, jitted_metrics = jax.jit(bc.update)(state, batch, jax.random.PRNGKey(2))
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(eager_metrics["bc_loss"], jitted_metrics["bc_loss"], rtol=1e-5)


def test_a_second_chunk_does_not_trace_again():
    dataset, _ = _expert_dataset(n_episodes=2, length=10)
    bc = make_bc(BCConfig(hidden=(16,)), OBS, ACT)
    traces = []
    inner = make_chunk(bc, 32, 5)

    def counted(state, data, key):
        traces.append(1)
        return inner(state, data, key)

    chunk = jax.jit(counted)
    state = bc.init(jax.random.PRNGKey(0))
    for i in range(3):
        state, _ = chunk(state, dataset, jax.random.PRNGKey(i))
    assert len(traces) == 1 and int(state.step) == 15


def test_seeds_are_reproducible_independent_and_vmapped_faithfully():
    dataset, _ = _expert_dataset(n_episodes=4, length=20)
    bc = make_bc(BCConfig(hidden=(16,)), OBS, ACT)
    run = dict(schedule=Schedule(n_updates=20, chunk_updates=10, batch_size=16))
    together, _ = train_offline(bc, dataset, seeds=(3, 4, 5), **run)
    again, _ = train_offline(bc, dataset, seeds=(3, 4, 5), **run)
    alone, _ = train_offline(bc, dataset, seeds=(4,), **run)
    leaves = jax.tree.leaves(together.agent.policy.actor)
    for a, b in zip(leaves, jax.tree.leaves(again.agent.policy.actor), strict=True):
        np.testing.assert_array_equal(a, b)
    # Seed 4 trained among others equals seed 4 trained alone: separate parameters.
    for a, b in zip(leaves, jax.tree.leaves(alone.agent.policy.actor), strict=True):
        np.testing.assert_allclose(a[1], b[0], rtol=1e-5, atol=1e-6)
    assert not np.allclose(leaves[0][0], leaves[0][1])
    states = init_seeds(bc, [0, 1])
    assert jax.tree.leaves(states.policy.actor)[0].shape[0] == 2


def test_training_resumes_exactly_from_a_saved_train_state():
    dataset, _ = _expert_dataset(n_episodes=4, length=20)
    bc = make_bc(BCConfig(hidden=(16,)), OBS, ACT)

    def run(n_updates: int) -> Schedule:
        return Schedule(n_updates=n_updates, chunk_updates=10, batch_size=16)

    straight, _ = train_offline(bc, dataset, run(30), seeds=(1, 2))
    first, _ = train_offline(bc, dataset, run(10), seeds=(1, 2))
    # A round trip through host memory, as a checkpoint would make.
    saved = jax.tree.map(np.asarray, first)
    resumed, history = train_offline(bc, dataset, run(20), state=saved)
    assert [entry["updates"] for entry in history] == [20, 30]
    np.testing.assert_array_equal(resumed.updates, [30, 30])
    for a, b in zip(jax.tree.leaves(straight), jax.tree.leaves(resumed), strict=True):
        np.testing.assert_array_equal(a, b)
    # The state handed in is left as it was (donation works on a copy).
    np.testing.assert_array_equal(first.updates, [10, 10])
    with pytest.raises(ValueError, match="leading seed axis"):
        train_offline(bc, dataset, run(10), state=init_train_state(bc, 0))
    # Fewer updates than a chunk: exactly those, in one chunk of their own length.
    short, history = train_offline(
        bc,
        dataset,
        seeds=(1,),
        schedule=Schedule(n_updates=7, batch_size=16),
    )
    assert [entry["updates"] for entry in history] == [7]
    np.testing.assert_array_equal(short.updates, [7])


def test_bad_loop_settings_are_named():
    dataset, _ = _expert_dataset(n_episodes=2, length=10)
    bc = make_bc(BCConfig(hidden=(16,)), OBS, ACT)
    with pytest.raises(ValueError, match="chunk_updates"):
        train_offline(
            bc,
            dataset,
            schedule=Schedule(n_updates=10, chunk_updates=0),
        )
    with pytest.raises(ValueError, match="seeds"):
        train_offline(
            bc,
            dataset,
            seeds=(),
            schedule=Schedule(n_updates=10),
        )
    with pytest.raises(ValueError, match="learning_rate"):
        BCConfig(learning_rate=0.0)
