"""Dataset generation with behaviour policies."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.environments import make
from neorl_industrial.functional.state_management import Dataset, gather_transitions
from neorl_industrial.functional.transformations.generation import (
    behaviour_policy,
    generate_trajectories,
)


def _linear_policy():
    def mean_action(weights, observation):
        return jnp.tanh(weights @ observation[:6] / 100.0)

    def sampled_action(weights, observation, key):
        return jnp.clip(mean_action(weights, observation) + jax.random.normal(key, (3,)), -1, 1)

    return mean_action, sampled_action


def test_behaviour_policy_mixes_mean_and_sampled_actions():
    mean_action, sampled_action = _linear_policy()
    policy = behaviour_policy(mean_action, sampled_action, sample_probability=0.2)
    weights = jnp.ones((3, 6))
    observation = jnp.arange(180.0)
    keys = jax.random.split(jax.random.PRNGKey(0), 4000)
    actions = jax.vmap(lambda k: policy(weights, observation, k))(keys)
    is_mean = np.all(np.isclose(actions, mean_action(weights, observation)), axis=1)
    assert 0.75 < is_mean.mean() < 0.85


def test_generated_trajectories_build_a_consistent_dataset():
    env, params = make("IB-v0")
    mean_action, sampled_action = _linear_policy()
    policy = behaviour_policy(mean_action, sampled_action)
    trajectories = jax.jit(
        lambda k: generate_trajectories(
            k, env, params, policy, 3, 40, policy_params=jnp.ones((3, 6))
        )
    )(jax.random.PRNGKey(0))
    assert trajectories.observations.shape == (3, 41, 180)
    assert trajectories.actions.shape == (3, 40, 3)
    dataset = Dataset.from_trajectories(
        trajectories.observations,
        trajectories.actions,
        trajectories.rewards,
        trajectories.costs,
        trajectories.terminated,
    )
    assert dataset.n_episodes == 3 and dataset.n_transitions == 120
    np.testing.assert_array_equal(dataset.timeouts.reshape(3, 40)[:, -1], True)
    batch = gather_transitions(dataset, jnp.arange(120))
    # Each next observation's newest frame is the following observation's newest frame,
    # and the history shifts by one frame per step.
    np.testing.assert_array_equal(batch.next_observations[:39], batch.observations[1:40])
    np.testing.assert_array_equal(batch.next_observations[:, 6:], batch.observations[:, :-6])
    # The reward is minus 3 fatigue minus consumption of the next observation's newest frame.
    newest = np.asarray(batch.next_observations[:, :6])
    np.testing.assert_allclose(batch.rewards, -(3 * newest[:, 4] + newest[:, 5]), rtol=1e-5)


def test_early_terminals_cut_the_trajectory():
    observations = np.arange(2 * 5 * 1, dtype=np.float32).reshape(2, 5, 1)
    terminated = np.array([[False, True, False, False], [False, False, False, False]])
    dataset = Dataset.from_trajectories(
        observations, np.zeros((2, 4, 1)), np.ones((2, 4)), np.zeros((2, 4, 1)), terminated
    )
    np.testing.assert_array_equal(dataset.episode_lengths, [2, 4])
    np.testing.assert_array_equal(dataset.terminals, [0, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(dataset.next_observations()[:2, 0], [1, 2])


def test_trajectory_shapes_and_values_are_checked():
    with pytest.raises(ValueError, match="expected"):
        Dataset.from_trajectories(
            np.zeros((2, 4, 1)),
            np.zeros((2, 4, 1)),
            np.zeros((2, 4)),
            np.zeros((2, 4, 1)),
            np.zeros((2, 4), bool),
        )
    rewards = np.zeros((2, 4))
    rewards[1, 2] = np.nan
    with pytest.raises(ValueError, match="trajectory 1, rewards step 2"):
        Dataset.from_trajectories(
            np.zeros((2, 5, 1)),
            np.zeros((2, 4, 1)),
            rewards,
            np.zeros((2, 4, 1)),
            np.zeros((2, 4), bool),
        )
