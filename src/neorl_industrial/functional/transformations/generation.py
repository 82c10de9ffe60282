"""Dataset generation: behaviour policies rolled out in the environment, fused in JAX."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from neorl_industrial.core.environments import Environment
from neorl_industrial.core.environments.rollout import Policy


@struct.dataclass
class Trajectories:
    """Equal-length trajectories, batch-major: ``[n, T, ...]``."""

    observations: jax.Array  # [n, T + 1, obs_size]: the final observation last
    actions: jax.Array  # [n, T, action_size] or [n, T]
    rewards: jax.Array  # [n, T]
    costs: jax.Array  # [n, T, n_costs]
    terminated: jax.Array  # [n, T]


def behaviour_policy(
    mean_action: Callable[[Any, jax.Array], jax.Array],
    sampled_action: Callable[[Any, jax.Array, jax.Array], jax.Array],
    sample_probability: float = 0.2,
) -> Policy:
    """The NeoRL behaviour convention: the mean action, or a sampled one with
    ``sample_probability`` (20 % by default), chosen independently at every step."""

    def policy(params: Any, observation: jax.Array, key: jax.Array) -> jax.Array:
        choice_key, sample_key = jax.random.split(key)
        use_sample = jax.random.uniform(choice_key) < sample_probability
        return jnp.where(
            use_sample,
            sampled_action(params, observation, sample_key),
            mean_action(params, observation),
        )

    return policy


def generate_trajectories(
    key: jax.Array,
    env: Environment,
    params: Any,
    policy: Policy,
    n_trajectories: int,
    n_steps: int,
    *,
    policy_params: Any = None,
    observation_buffer: jax.Array | None = None,
) -> Trajectories:
    """Rolls out ``n_trajectories`` fresh episodes of ``n_steps`` steps.

    ``observation_buffer`` (``[n_trajectories, n_steps + 1, obs_size]``, contents ignored)
    is written into instead of a new array; a caller generating many chunks donates the
    previous chunk's observations here, which saves allocating (and page-faulting) the
    largest output every time.

    Pure and jit-compatible (``env``, ``policy``, ``n_trajectories`` and ``n_steps`` are
    static). Every step's observation is recorded once; the next observation is the
    following row, and the last row is the observation after the final step. Episodes
    are not reset: a trajectory that terminates early is cut there when the dataset is
    built (:meth:`Dataset.from_trajectories`).
    """
    reset_key, loop_key = jax.random.split(key)
    states, timestep = env.reset_batch(reset_key, n_trajectories, params)
    batched_policy = jax.vmap(policy, in_axes=(None, 0, 0))
    # Observations dominate the output (hundreds of values per step for IB-v0). They are
    # written straight into a batch-major buffer carried through the loop, so they are
    # written once and need no transpose afterwards; the small per-step outputs are
    # stacked time-major by the scan and transposed.
    shape = (n_trajectories, n_steps + 1, env.observation_size)
    if observation_buffer is None:
        observations = jnp.zeros(shape, timestep.observation.dtype)
    elif observation_buffer.shape != shape:
        raise ValueError(
            f"observation_buffer: expected shape {shape}, got {observation_buffer.shape}"
        )
    else:
        observations = observation_buffer

    def one_step(carry, inputs):
        states, observation, observations = carry
        step, step_key = inputs
        policy_key, env_key = jax.random.split(step_key)
        actions = batched_policy(
            policy_params, observation, jax.random.split(policy_key, n_trajectories)
        )
        observations = jax.lax.dynamic_update_slice_in_dim(
            observations, observation[:, None], step, axis=1
        )
        states, ts = env.step_env_batch(env_key, states, actions, params)
        return (states, ts.observation, observations), (actions, ts.reward, ts.cost, ts.terminated)

    (_, last_observation, observations), (actions, rewards, costs, terminated) = jax.lax.scan(
        one_step,
        (states, timestep.observation, observations),
        (jnp.arange(n_steps), jax.random.split(loop_key, n_steps)),
    )
    observations = jax.lax.dynamic_update_slice_in_dim(
        observations, last_observation[:, None], n_steps, axis=1
    )
    return Trajectories(
        observations=observations,
        actions=jnp.swapaxes(actions, 0, 1),
        rewards=rewards.T,
        costs=jnp.swapaxes(costs, 0, 1),
        terminated=terminated.T,
    )
