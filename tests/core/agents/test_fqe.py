"""Fitted Q Evaluation on small MDPs whose values are known in closed form."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.agents.fqe import (
    FQEConfig,
    fqe_loss,
    fqe_target,
    make_fqe,
)
from neorl_industrial.functional.state_management import Dataset, sample
from neorl_industrial.functional.transformations.offline import Schedule, train_offline

GAMMA = 0.9
#: Small and fast: (32, 32) critics, a target copy every 50 updates.
CONFIG = FQEConfig(hidden=(32, 32), learning_rate=1e-3, discount=GAMMA, target_update_period=50)


def two_state_dataset(n_episodes: int = 200, length: int = 10, seed: int = 0) -> Dataset:
    """A process that alternates between two states, ``s = 0, 1, 0, ...`` (observation
    ``[s]``), whatever the action. Actions are uniform in [-1, 1]; the reward is ``a`` in
    state 0 and ``0.5 - a`` in state 1; cost 0 is ``a > 0`` and cost 1 is ``s``. Episodes
    start in state 0 and time out after ``length`` steps (no terminal state)."""
    rng = np.random.default_rng(seed)
    states = np.arange(length + 1) % 2
    observations = np.broadcast_to(states[None, :, None], (n_episodes, length + 1, 1))
    actions = rng.uniform(-1.0, 1.0, size=(n_episodes, length, 1))
    in_one = states[None, :length]
    rewards = np.where(in_one == 0, actions[..., 0], 0.5 - actions[..., 0])
    costs = np.stack([actions[..., 0] > 0, np.broadcast_to(in_one, rewards.shape)], axis=-1)
    return Dataset.from_trajectories(
        observations.astype(np.float32),
        actions.astype(np.float32),
        rewards.astype(np.float32),
        costs.astype(np.float32),
        np.zeros((n_episodes, length), bool),
    )


def two_state_values(action_in_0: float, action_in_1: float) -> np.ndarray:
    """``[return, cost 0, cost 1]`` from state 0 of the policy that plays the given
    actions forever: ``V(0) = (x(0) + γ x(1)) / (1 - γ²)`` for every signal ``x``."""
    signal_0 = np.array([action_in_0, float(action_in_0 > 0), 0.0])
    signal_1 = np.array([0.5 - action_in_1, float(action_in_1 > 0), 1.0])
    return (signal_0 + GAMMA * signal_1) / (1.0 - GAMMA**2)


def state_policy(action_in_0: float, action_in_1: float):
    def policy(observations: jax.Array) -> jax.Array:
        return jnp.where(observations[:, :1] < 0.5, action_in_0, action_in_1)

    return policy


def _train(dataset: Dataset, policy, n_costs: int, n_updates: int = 3000):
    fqe = make_fqe(CONFIG, dataset.observation_size, dataset.action_size, n_costs, policy)
    state, history = train_offline(
        fqe,
        dataset,
        seeds=(0,),
        schedule=Schedule(n_updates=n_updates, chunk_updates=n_updates),
        sampler=functools.partial(sample, gamma=GAMMA),
    )
    return fqe, jax.tree.map(lambda leaf: leaf[0], state.agent), history


def test_per_transition_target_and_loss():
    target = fqe_target(
        jnp.asarray(1.0), jnp.array([0.0, 2.0]), jnp.asarray(0.5), jnp.array([[2.0, 4.0, 6.0]])
    )
    np.testing.assert_allclose(target, [2.0, 2.0, 5.0])
    # two critics: the target bootstraps from their mean
    target = fqe_target(jnp.asarray(0.0), jnp.zeros(0), jnp.asarray(1.0), jnp.array([[1.0], [3.0]]))
    np.testing.assert_allclose(target, [2.0])
    np.testing.assert_allclose(fqe_loss(jnp.array([[1.0, 3.0]]), jnp.array([0.0, 1.0])), 2.5)
    with pytest.raises(AssertionError):
        fqe_loss(jnp.zeros(2), jnp.zeros(2))
    with pytest.raises(AssertionError):  # one head per signal: 1 + n_costs
        fqe_target(jnp.asarray(0.0), jnp.zeros(2), jnp.asarray(1.0), jnp.zeros((1, 2)))


def test_update_is_the_same_with_and_without_jit():
    dataset = two_state_dataset(n_episodes=8)
    config = FQEConfig(hidden=(8,), discount=GAMMA, target_update_period=2)
    fqe = make_fqe(config, 1, 1, 2, state_policy(0.6, -0.6))
    state = fqe.init(jax.random.PRNGKey(0))
    batch = sample(dataset, jax.random.PRNGKey(1), 16, gamma=GAMMA)
    for step in range(2):  # the second update copies the online critic into the target
        eager, _ = fqe.update(state, batch, jax.random.PRNGKey(step))
        jitted, metrics = jax.jit(fqe.update)(state, batch, jax.random.PRNGKey(step))
        for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        state = jitted
    assert int(state.step) == 2
    for online, target in zip(
        jax.tree.leaves(state.critic), jax.tree.leaves(state.target_critic), strict=True
    ):
        np.testing.assert_array_equal(online, target)
    assert set(metrics) == {"loss", "q_return", "target_return", "q_cost"}


def test_estimates_the_return_and_costs_of_two_policies():
    """Each policy's own values, not the data's: the policies act differently in the
    same data, and bootstrapping must use the policy's next action."""
    dataset = two_state_dataset()
    start = jnp.zeros((1, 1), jnp.float32)
    estimates = {}
    for actions in ((0.6, -0.6), (-0.6, -0.6)):
        fqe, state, history = _train(dataset, state_policy(*actions), n_costs=2)
        estimates[actions] = np.asarray(fqe.estimate(state, start))[0]
        expected = two_state_values(*actions)
        # 5 % of the largest value (the return of the first policy is 8.4)
        np.testing.assert_allclose(estimates[actions], expected, atol=0.42)
        assert np.isfinite(history[-1]["metrics"]["loss"]).all()
    difference = estimates[(0.6, -0.6)] - estimates[(-0.6, -0.6)]
    np.testing.assert_allclose(difference[:2], [6.32, 5.26], atol=0.6)


def test_terminal_states_end_the_value_and_timeouts_do_not():
    """Reward 1 per step for 5 steps. Ending in a terminal state, the value from the start
    is the finite sum ``(1 - γ^5) / (1 - γ)``; cut off by a timeout in a process that
    could go on, it is ``1 / (1 - γ)``."""
    n, length = 200, 5
    rewards = np.ones((n, length), np.float32)
    actions = np.random.default_rng(0).uniform(-1, 1, (n, length, 1)).astype(np.float32)
    costs = np.zeros((n, length, 0), np.float32)
    clock = np.broadcast_to((np.arange(length + 1) / length)[None, :, None], (n, length + 1, 1))
    terminated = np.zeros((n, length), bool)
    terminated[:, -1] = True
    finite = Dataset.from_trajectories(
        clock.astype(np.float32), actions, rewards, costs, terminated
    )
    endless = Dataset.from_trajectories(
        np.zeros((n, length + 1, 1), np.float32), actions, rewards, costs, np.zeros_like(terminated)
    )
    policy = state_policy(0.0, 0.0)
    start = jnp.zeros((1, 1), jnp.float32)
    fqe, state, _ = _train(finite, policy, n_costs=0, n_updates=2000)
    np.testing.assert_allclose(fqe.estimate(state, start)[0, 0], (1 - GAMMA**5) / (1 - GAMMA), 0.05)
    fqe, state, _ = _train(endless, policy, n_costs=0, n_updates=4000)
    np.testing.assert_allclose(fqe.estimate(state, start)[0, 0], 1 / (1 - GAMMA), 0.05)


def test_estimate_keeps_leading_axes():
    fqe = make_fqe(FQEConfig(hidden=(8,)), 3, 2, 1, lambda obs: jnp.tanh(obs[:, :2]))
    state = fqe.init(jax.random.PRNGKey(0))
    assert fqe.estimate(state, jnp.zeros((4, 5, 3))).shape == (4, 5, 2)
    assert fqe.estimate(state, jnp.zeros((3,))).shape == (2,)


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="discount"):
        FQEConfig(discount=1.0)
    with pytest.raises(ValueError, match="target_update_period"):
        FQEConfig(target_update_period=0)
    with pytest.raises(ValueError, match="n_critics"):
        FQEConfig(n_critics=0)
    with pytest.raises(ValueError, match="n_costs"):
        make_fqe(FQEConfig(), 3, 2, -1, lambda obs: obs[:, :2])
    with pytest.raises(ValueError, match=r"policy: expected actions of shape \[B, 2\]"):
        make_fqe(FQEConfig(), 3, 2, 1, lambda obs: obs)
    weights = jnp.zeros((4, 2))  # a policy built for 4 features, given 3
    with pytest.raises(ValueError, match=r"policy: fails on observations of shape \[B, 3\]"):
        make_fqe(FQEConfig(), 3, 2, 1, lambda obs: obs @ weights)
