"""Off-policy evaluation with ``fitted_q_evaluation``: estimates in the dataset's units."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.functional.transformations.offline import Schedule
from neorl_industrial.functional.transformations.ope import (
    SignalScales,
    fitted_q_evaluation,
    signal_scales,
)
from tests.core.agents.test_fqe import (
    CONFIG,
    GAMMA,
    state_policy,
    two_state_dataset,
    two_state_values,
)


def _offset(dataset: Dataset, reward_offset: float, cost_factor: float) -> Dataset:
    """The same data with rewards far from zero and costs in other units."""
    return dataset.replace(
        rewards=dataset.rewards + reward_offset, costs=dataset.costs * cost_factor
    )


def test_estimates_in_the_datasets_units_per_seed_and_mean():
    """Rewards around -200 and costs in tens: the result undoes the shift and scales."""
    dataset = _offset(two_state_dataset(), -200.0, 10.0)
    result = fitted_q_evaluation(
        dataset,
        state_policy(0.6, -0.6),
        schedule=Schedule(n_updates=3000),
        seeds=(0, 1),
        config=CONFIG,
    )
    expected = two_state_values(0.6, -0.6)
    assert result.returns.shape == (2,) and result.costs.shape == (2, 2)
    np.testing.assert_allclose(result.return_mean, result.returns.mean())
    np.testing.assert_allclose(result.cost_mean, result.costs.mean(axis=0))
    np.testing.assert_allclose(result.returns, expected[0] - 200.0 / (1 - GAMMA), atol=0.3)
    np.testing.assert_allclose(result.costs, np.broadcast_to(10.0 * expected[1:], (2, 2)), atol=2.5)
    assert result.reward_shift == pytest.approx(float(np.mean(dataset.rewards)))
    # elsewhere: state 1, whose value is the signal there plus γ V(0)
    in_one = result.values(jnp.ones((1, 1)))
    assert in_one.shape == (2, 1, 3)
    expected_in_one = np.array([1.1 - 200.0, 0.0, 10.0]) + GAMMA * np.array(
        [expected[0] - 200.0 / (1 - GAMMA), 10.0 * expected[1], 10.0 * expected[2]]
    )
    np.testing.assert_allclose(in_one[:, 0], np.broadcast_to(expected_in_one, (2, 3)), atol=5.0)


def test_scales_follow_the_data():
    dataset = _offset(two_state_dataset(n_episodes=20), -200.0, 10.0)
    shift, scale, cost_scales = signal_scales(dataset, GAMMA)
    rewards = np.asarray(dataset.rewards, np.float64)
    assert shift == pytest.approx(rewards.mean())
    assert scale == pytest.approx(np.sqrt(1 - GAMMA) / rewards.std(), rel=1e-5)
    # cost 1 is 0 or 10, half the time each: a spread of 5
    assert cost_scales[1] == pytest.approx(np.sqrt(1 - GAMMA) / 5.0)
    assert signal_scales(dataset, GAMMA, cost_scale=2.0)[2].tolist() == [2.0, 2.0]


def test_initial_observations_are_the_episode_starts():
    dataset = two_state_dataset(n_episodes=3, length=4)
    np.testing.assert_array_equal(dataset.initial_observations(), np.zeros((3, 1)))


def test_bad_input_names_the_argument():
    dataset = two_state_dataset(n_episodes=4)
    policy = state_policy(0.6, -0.6)
    run = {"schedule": Schedule(n_updates=10), "config": CONFIG}
    with pytest.raises(ValueError, match=r"policy: expected actions of shape \[B, 1\]"):
        fitted_q_evaluation(dataset, lambda obs: jnp.zeros((obs.shape[0], 2)), **run)
    with pytest.raises(ValueError, match=r"initial_observations: expected shape \[n, 1\]"):
        fitted_q_evaluation(dataset, policy, initial_observations=np.zeros((3, 2)), **run)
    with pytest.raises(ValueError, match="cost_scale: expected one number or one scale"):
        fitted_q_evaluation(dataset, policy, scales=SignalScales(cost_scale=(1.0, 1.0, 1.0)), **run)
    with pytest.raises(ValueError, match="reward_scale"):
        fitted_q_evaluation(dataset, policy, scales=SignalScales(reward_scale=0.0), **run)
    with pytest.raises(ValueError, match="n_updates"):
        fitted_q_evaluation(dataset, policy, Schedule(n_updates=0), config=CONFIG)
    terminated = np.zeros((4, 3), bool)
    terminated[:, -1] = True
    ending = Dataset.from_trajectories(
        np.zeros((4, 4, 1), np.float32),
        np.zeros((4, 3, 1), np.float32),
        np.ones((4, 3), np.float32),
        np.zeros((4, 3, 0), np.float32),
        terminated,
    )
    with pytest.raises(ValueError, match="reward_shift: must be 0 for data with terminal"):
        fitted_q_evaluation(ending, policy, scales=SignalScales(reward_shift=1.0), **run)
    assert signal_scales(ending, GAMMA)[0] == 0.0  # no automatic shift either
    discrete = Dataset.from_trajectories(
        np.zeros((2, 3, 1), np.float32),
        np.zeros((2, 2), np.int32),
        np.zeros((2, 2), np.float32),
        np.zeros((2, 2, 0), np.float32),
        np.zeros((2, 2), bool),
    )
    with pytest.raises(ValueError, match="dataset: has discrete actions"):
        fitted_q_evaluation(discrete, policy, **run)


def test_a_batch_of_policies_is_evaluated_like_one_policy_at_a_time():
    from neorl_industrial.functional.transformations.ope import (
        fitted_q_evaluation_values,
        start_estimates,
    )

    dataset = _offset(two_state_dataset(), -200.0, 10.0)
    gains = jnp.asarray([[0.0], [0.5], [-0.5]])

    def act(gain, observations):
        return jnp.tanh(gain * observations[:, :1]) * jnp.ones((1, dataset.action_size))

    config = CONFIG
    values = fitted_q_evaluation_values(
        dataset, act, gains, Schedule(n_updates=200, batch_size=64), seeds=(0, 1), config=config
    )
    returns, costs = start_estimates(values, dataset.initial_observations(), 3)
    assert returns.shape == (3, 2) and costs.shape == (3, 2, dataset.n_costs)
    for i in range(3):
        one = fitted_q_evaluation(
            dataset,
            lambda o, gain=gains[i]: act(gain, o),
            schedule=Schedule(n_updates=200, batch_size=64),
            seeds=(0, 1),
            config=config,
        )
        np.testing.assert_allclose(returns[i], one.returns, rtol=1e-4)
        np.testing.assert_allclose(costs[i], one.costs, rtol=1e-4, atol=1e-5)
