"""One evaluation for every library: the project's JAX environment stepped from the host.

A policy is a host callable ``observations [n, obs] -> actions [n, act]`` (or ``[n]``
action indices for a discrete environment), so a PyTorch policy and a jitted JAX policy
are called the same way. ``n`` environments run at once; their resets and every step's
noise come from keys derived from one evaluation seed, never from the policy, so two
policies evaluated with the same seed start from the same states and meet the same noise
(paired episodes), and one policy evaluated twice gets the same returns.

Both libraries' processes run this module with the same JAX version; the digest of the
initial observations lets the caller check that they did see the same episodes.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

#: ``policy(observations [n, obs]) -> actions [n, act]`` (``[n]`` indices when discrete).
HostPolicy = Callable[[np.ndarray], Any]


@dataclasses.dataclass(frozen=True)
class Episodes:
    """What one policy earned over the evaluation episodes.

    Attributes:
        returns: ``[n_episodes]`` undiscounted return of every episode.
        digest: sha256 of the episodes' initial observations (the same for every policy
            evaluated with the same environment, count and seed).
        steps: steps taken until every episode had ended.
    """

    returns: np.ndarray
    digest: str
    steps: int


@functools.lru_cache(maxsize=8)
def _simulator(env_id: str, n_episodes: int, horizon: int | None) -> tuple[Any, ...]:
    """The environment and its compiled batched reset and step (compiled once per
    process and shape)."""
    import jax

    from neorl_industrial.core.environments import make

    env, params = make(env_id) if horizon is None else make(env_id, horizon=horizon)

    @jax.jit
    def reset(key: jax.Array) -> tuple[Any, jax.Array]:
        states, timestep = env.reset_batch(key, n_episodes, params)
        return states, timestep.observation

    @jax.jit
    def step(key: jax.Array, states: Any, actions: jax.Array) -> tuple[Any, ...]:
        # Without auto-reset: an episode that ended keeps stepping, its rewards masked.
        states, timestep = env.step_env_batch(key, states, actions, params)
        return states, timestep.observation, timestep.reward, timestep.done

    return env, int(params.horizon), reset, step


def _env_actions(actions: Any, env: Any, n_episodes: int) -> np.ndarray:
    """The policy's output as the environment's action batch, or a ValueError naming the
    shape that does not fit."""
    array = np.asarray(actions)
    if env.discrete:
        if array.size != n_episodes:
            raise ValueError(
                f"policy: expected {n_episodes} action indices for {env.name}, got an array "
                f"of shape {array.shape}"
            )
        return array.reshape(n_episodes).astype(np.int32)
    if array.size != n_episodes * env.action_size:
        raise ValueError(
            f"policy: expected actions of shape ({n_episodes}, {env.action_size}) for "
            f"{env.name}, got {array.shape}"
        )
    return array.reshape(n_episodes, env.action_size).astype(np.float32)


def evaluate_policy(
    policy: HostPolicy,
    env_id: str,
    n_episodes: int,
    seed: int,
    *,
    horizon: int | None = None,
    action_bounds: tuple[Any, Any] | None = None,
) -> Episodes:
    """Runs ``n_episodes`` whole episodes of ``env_id`` at once under ``policy``.

    Args:
        policy: host callable from observations ``[n_episodes, obs]`` (float32) to the
            environment's actions, in its units (IB: [-1, 1]; IB-discrete: indices).
        env_id: a registered environment.
        n_episodes: episodes, run side by side.
        seed: the evaluation seed: resets and noise of every step derive from it alone.
        horizon: episode length (default: the environment's own).
        action_bounds: ``(low, high)`` in the plant's units when ``policy`` acts in
            [-1, 1] (a task whose actions were scaled for training): its actions are mapped
            to the bounds as ``ActionScaler.unscale`` does, ``low + (a + 1) (high - low) / 2``.

    Returns:
        The returns of the episodes and the digest of their initial observations.

    Raises:
        ValueError: for a non-positive ``n_episodes``, or actions of the wrong shape.
    """
    if isinstance(n_episodes, bool) or not isinstance(n_episodes, int) or n_episodes < 1:
        raise ValueError(f"n_episodes: expected a positive integer, got {n_episodes!r}")
    import jax

    env, steps, reset, step = _simulator(env_id, n_episodes, horizon)
    reset_key, loop_key = jax.random.split(jax.random.PRNGKey(seed))
    step_keys = jax.random.split(loop_key, steps)
    states, observations = reset(reset_key)
    observations = np.asarray(observations)
    digest = hashlib.sha256(np.ascontiguousarray(observations, np.float32).tobytes()).hexdigest()
    returns = np.zeros(n_episodes, np.float64)
    done = np.zeros(n_episodes, bool)
    taken = 0
    for key in step_keys:
        actions = _env_actions(policy(observations), env, n_episodes)
        if action_bounds is not None:
            low = np.asarray(action_bounds[0], np.float32)
            high = np.asarray(action_bounds[1], np.float32)
            actions = low + (actions + np.float32(1.0)) * (np.float32(0.5) * (high - low))
        states, observations, rewards, finished = step(key, states, actions)
        returns += np.where(done, 0.0, np.asarray(rewards, np.float64))
        done |= np.asarray(finished)
        taken += 1
        if done.all():
            break
        observations = np.asarray(observations)
    return Episodes(returns=returns, digest=digest, steps=taken)
