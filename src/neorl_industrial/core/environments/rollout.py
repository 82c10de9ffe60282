"""Batched rollouts: ``vmap`` over environments, ``lax.scan`` over time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from neorl_industrial.core.environments.base import Environment
from neorl_industrial.core.utils import random as fast_random

#: ``policy(policy_params, observation, key) -> action`` for one environment.
Policy = Callable[[Any, jax.Array, jax.Array], jax.Array]


@struct.dataclass
class Transitions:
    """Per-step data of a rollout, time-major: ``[n_steps, n_envs, ...]``."""

    observation: jax.Array
    action: jax.Array
    reward: jax.Array
    cost: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    next_observation: jax.Array  # the true next observation (the final one on a reset)


@struct.dataclass
class RolloutResult:
    """Summary of a rollout, per environment."""

    final_state: Any
    final_observation: jax.Array
    total_reward: jax.Array  # [n_envs] over all steps
    total_cost: jax.Array  # [n_envs, n_costs] over all steps
    episodes: jax.Array  # [n_envs] completed episodes
    episode_return_sum: jax.Array  # [n_envs] sum of returns of completed episodes
    episode_cost_sum: jax.Array  # [n_envs, n_costs] sum of costs of completed episodes
    invalid_actions: jax.Array  # [n_envs] steps whose action was replaced
    transitions: Transitions | None = None

    def mean_episode_return(self) -> jax.Array:
        """Mean return over all completed episodes of all environments."""
        return self.episode_return_sum.sum() / jnp.maximum(self.episodes.sum(), 1)

    def mean_episode_cost(self) -> jax.Array:
        """Mean episode cost per cost channel over all completed episodes."""
        return self.episode_cost_sum.sum(0) / jnp.maximum(self.episodes.sum(), 1)


def rollout(
    key: jax.Array,
    env: Environment,
    params: Any,
    policy: Policy,
    n_envs: int,
    n_steps: int,
    *,
    policy_params: Any = None,
    record: bool = False,
) -> RolloutResult:
    """Runs ``n_envs`` environments for ``n_steps`` steps each under ``policy``.

    Pure and jit-compatible (``env``, ``policy``, ``n_envs``, ``n_steps`` and ``record``
    are static). Environments auto-reset at the end of an episode; the reset is computed
    only on steps where some environment finishes.

    Args:
        key: PRNG key for resets, environment noise and the policy.
        env: the environment.
        params: environment parameters shared by all copies.
        policy: pure function ``(policy_params, observation, key) -> action`` for one
            environment; it is vmapped over environments.
        n_envs: number of environments stepped together.
        n_steps: number of steps.
        policy_params: passed to ``policy`` unchanged.
        record: also return the per-step :class:`Transitions` (memory grows with
            ``n_steps * n_envs * observation_size``).

    Returns:
        A :class:`RolloutResult` with per-environment totals and, with ``record``,
        the transitions.
    """
    reset_key, loop_key = jax.random.split(key)
    states, timestep = env.reset_batch(reset_key, n_envs, params)
    batched_policy = jax.vmap(policy, in_axes=(None, 0, 0))
    zeros = jnp.zeros((n_envs,), jnp.float32)
    zero_costs = jnp.zeros((n_envs, env.n_costs), jnp.float32)

    def one_step(carry, step_key):
        (states, observation, totals) = carry
        policy_key, env_key = jax.random.split(step_key)
        actions = batched_policy(policy_params, observation, jax.random.split(policy_key, n_envs))
        states, ts = env.step_batch(env_key, states, actions, params)
        done = ts.done
        reward_total, cost_total, episode_reward, episode_cost, episodes, ret_sum, cost_sum, bad = (
            totals
        )
        episode_reward = episode_reward + ts.reward
        episode_cost = episode_cost + ts.cost
        totals = (
            reward_total + ts.reward,
            cost_total + ts.cost,
            jnp.where(done, 0.0, episode_reward),
            jnp.where(done[:, None], 0.0, episode_cost),
            episodes + done,
            ret_sum + jnp.where(done, episode_reward, 0.0),
            cost_sum + jnp.where(done[:, None], episode_cost, 0.0),
            bad + ts.info.action_invalid,
        )
        out = None
        if record:
            out = Transitions(
                observation=observation,
                action=actions,
                reward=ts.reward,
                cost=ts.cost,
                terminated=ts.terminated,
                truncated=ts.truncated,
                next_observation=ts.info.final_observation,
            )
        return (states, ts.observation, totals), out

    counts = jnp.zeros((n_envs,), jnp.int32)
    totals = (zeros, zero_costs, zeros, zero_costs, counts, zeros, zero_costs, counts)
    (states, observation, totals), transitions = jax.lax.scan(
        one_step, (states, timestep.observation, totals), jax.random.split(loop_key, n_steps)
    )
    reward_total, cost_total, _, _, episodes, ret_sum, cost_sum, bad = totals
    return RolloutResult(
        final_state=states,
        final_observation=observation,
        total_reward=reward_total,
        total_cost=cost_total,
        episodes=episodes,
        episode_return_sum=ret_sum,
        episode_cost_sum=cost_sum,
        invalid_actions=bad,
        transitions=transitions,
    )


def scan_single(
    key: jax.Array,
    env: Environment,
    params: Any,
    policy: Policy,
    n_steps: int,
    *,
    policy_params: Any = None,
) -> tuple[Any, jax.Array]:
    """Runs one environment (no batch axis) for ``n_steps``; returns the final state and
    the total reward. The single-environment counterpart of :func:`rollout`."""
    reset_key, policy_key, env_key = jax.random.split(key, 3)
    state, timestep = env.reset(reset_key, params)
    # All randomness is drawn ahead in two vectorized calls; the loop is deterministic.
    samples = env.presample(env_key, n_steps)
    policy_keys = jax.random.split(policy_key, n_steps)

    def one_step(carry, inputs):
        state, observation, total = carry
        sample, step_policy_key = inputs
        action = policy(policy_params, observation, step_policy_key)
        state, ts = env.step_presampled(sample, state, action, params)
        return (state, ts.observation, total + ts.reward), None

    (state, _, total), _ = jax.lax.scan(
        one_step,
        (state, timestep.observation, jnp.zeros((), jnp.float32)),
        (samples, policy_keys),
    )
    return state, total


def uniform_random_policy(env: Environment) -> Policy:
    """A policy drawing uniform actions in the environment's action space."""
    if env.discrete:
        n = env.num_actions

        def discrete_policy(_params, _observation, key):
            return jax.random.randint(key, (), 0, n)

        return discrete_policy
    low = jnp.asarray(env.action_low)
    span = jnp.asarray(env.action_high) - low

    def continuous_policy(_params, _observation, key):
        return low + span * fast_random.uniform(key, low.shape)

    return continuous_policy


def constant_policy(action: Any) -> Policy:
    """A policy that always returns ``action``."""
    action = jnp.asarray(action)

    def policy(_params, _observation, _key):
        return action

    return policy
