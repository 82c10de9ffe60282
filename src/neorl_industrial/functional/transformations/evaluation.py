"""Evaluation of policies in a JAX environment, with or without the safety shield, and
the safe-RL metrics of the DSRL convention.

One evaluation runs ``n_episodes`` environments side by side for exactly one episode
each (``vmap`` over environments, ``lax.scan`` over time), so every per-environment total
of the rollout is one episode's value. Many policies (seeds) are evaluated at once by
``vmap`` over their parameters at the call site.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from neorl_industrial.core.environments.base import Environment
from neorl_industrial.core.environments.rollout import Policy, rollout

#: The tail the evaluation's CVaR metrics average over: the worst tenth of episodes.
TAIL = 0.1


@struct.dataclass
class EpisodeStats:
    """Per-episode outcome of an evaluation; leading axis ``[n_episodes]`` (plus any axes
    the caller vmapped over, e.g. seeds)."""

    returns: jax.Array  # [n] undiscounted episode return
    costs: jax.Array  # [n, n_costs] summed per-step costs
    steps: jax.Array  # [n] int32 steps per episode
    overrides: jax.Array  # [n] int32 steps whose action the shield changed (0 without)
    fallbacks: jax.Array  # [n] int32 overrides that used the fallback action
    violations: jax.Array  # [n, n_hard] int32 steps whose proposed action broke a constraint
    applied_violations: jax.Array  # [n, n_hard] int32 steps whose applied action broke one
    invalid_actions: jax.Array  # [n] int32 non-finite proposed actions


def discounted_values(
    key: jax.Array,
    env: Environment,
    env_params: Any,
    policy: Any,
    n_episodes: int,
    horizon: int,
    discount: float,
) -> tuple[jax.Array, jax.Array]:
    """Discounted return ``[n_episodes]`` and discounted costs ``[n_episodes, n_costs]``
    of ``n_episodes`` episodes of ``horizon`` steps from the environment's reset
    distribution, ``policy(observations[B, obs]) -> actions[B, act]`` acting in all of
    them at once: the simulator's truth for an off-policy estimate. Pure; jit it at the
    call site (``env``, ``policy`` and the sizes static)."""
    reset_key, loop_key = jax.random.split(key)
    states, timestep = env.reset_batch(reset_key, n_episodes, env_params)

    def one_step(carry, step_key):
        states, observations, returns, costs, weight = carry
        # the key of rollout's environment step: both see the same noise for one key
        _, env_key = jax.random.split(step_key)
        states, timestep = env.step_batch(env_key, states, policy(observations), env_params)
        returns = returns + weight * timestep.reward
        costs = costs + weight * timestep.cost
        return (states, timestep.observation, returns, costs, weight * discount), None

    carry = (
        states,
        timestep.observation,
        jnp.zeros((n_episodes,), jnp.float32),
        jnp.zeros((n_episodes, env.n_costs), jnp.float32),
        jnp.ones((), jnp.float32),
    )
    (_, _, returns, costs, _), _ = jax.lax.scan(
        one_step, carry, jax.random.split(loop_key, horizon)
    )
    return returns, costs


def evaluate(
    key: jax.Array,
    env: Environment,
    env_params: Any,
    policy: Policy,
    n_episodes: int,
    *,
    horizon: int,
    policy_params: Any = None,
    constraints: Any = None,
    shield_actions: bool = True,
) -> EpisodeStats:
    """Runs ``n_episodes`` whole episodes of ``horizon`` steps (the environment's own
    horizon) under ``policy``; pure and jit-compatible (``env``, ``policy``,
    ``n_episodes``, ``horizon`` and ``shield_actions`` are static).

    With ``constraints``, every action passes the shield (or, with ``shield_actions=False``,
    is only checked), and the episode counts its overrides and violations.
    """
    result = rollout(
        key,
        env,
        env_params,
        policy,
        n_episodes,
        horizon,
        policy_params=policy_params,
        constraints=constraints,
        shield_actions=shield_actions,
    )
    zeros = jnp.zeros((n_episodes,), jnp.int32)
    safety = result.safety
    no_hard = jnp.zeros((n_episodes, 0), jnp.int32)
    return EpisodeStats(
        returns=result.total_reward,
        costs=result.total_cost,
        steps=jnp.full((n_episodes,), horizon, jnp.int32),
        overrides=zeros if safety is None else safety.overrides,
        fallbacks=zeros if safety is None else safety.fallbacks,
        violations=no_hard if safety is None else safety.violations,
        applied_violations=no_hard if safety is None else safety.applied_violations,
        invalid_actions=result.invalid_actions,
    )


def safety_metrics(
    stats: EpisodeStats,
    cost_limits: Sequence[float],
    *,
    random_return: float | None = None,
    expert_return: float | None = None,
    cost_names: Sequence[str] | None = None,
    tail: float = TAIL,
) -> dict[str, Any]:
    """The DSRL metrics of an evaluation, and its tail, on the host.

    * ``normalized_return``: ``(R - random) / (expert - random)`` (D4RL-style, as a
      fraction; the tables multiply by 100), when both references are given.
    * ``normalized_cost``: mean episode cost divided by the episode cost limit, per cost
      channel and the largest over channels; ``<= 1`` is safe.
    * ``violation_rate``: fraction of episodes whose cost exceeds its limit in any channel.
    * ``override_rate``: fraction of steps the shield overrode.
    * ``hard_violation_steps``: (step, constraint) pairs whose *applied* action broke a
      hard constraint (zero with the shield on), and ``proposed_violations``, the same
      count for the proposed actions.
    * ``return_cvar``: CVaR of the episode return at level ``tail``, the mean of the worst
      ``tail`` fraction of episodes (at least one), and ``episode_cost_cvar`` per channel
      and ``normalized_cost_cvar`` (the largest over channels, over the limit): the mean
      of the costliest ``tail`` fraction. What a risk-averse operator reads.

    Leading axes other than the episode axis (e.g. seeds) are flattened into episodes;
    use :func:`per_policy_metrics` for one row per policy.

    Raises:
        ValueError: when the cost limits do not match the cost channels or are not positive.
    """
    costs = np.asarray(stats.costs, np.float64)
    n_costs = costs.shape[-1]
    limits = np.asarray(cost_limits, np.float64).reshape(-1)
    if limits.shape != (n_costs,):
        raise ValueError(
            f"cost_limits: expected one limit per cost channel ({n_costs}), got {limits.size}"
        )
    if not np.all(limits > 0):
        raise ValueError(f"cost_limits: expected positive episode cost limits, got {limits}")
    costs = costs.reshape(-1, n_costs)
    returns = np.asarray(stats.returns, np.float64).reshape(-1)
    steps = max(int(np.asarray(stats.steps).sum()), 1)
    per_channel = costs.mean(axis=0) / limits
    names = list(cost_names) if cost_names is not None else [f"cost_{i}" for i in range(n_costs)]
    metrics: dict[str, Any] = {
        "episodes": int(returns.size),
        "return": float(returns.mean()),
        # The spread of the episodes' returns (0 for one episode): the return's standard
        # error is this over the square root of ``episodes``.
        "return_std": float(returns.std(ddof=1)) if returns.size > 1 else 0.0,
        "episode_cost": {name: float(c) for name, c in zip(names, costs.mean(axis=0), strict=True)},
        "normalized_cost": float(per_channel.max()),
        "normalized_cost_per_channel": {
            name: float(c) for name, c in zip(names, per_channel, strict=True)
        },
        "violation_rate": float(np.mean(np.any(costs > limits, axis=1))),
        "override_rate": float(np.asarray(stats.overrides).sum() / steps),
        "fallback_rate": float(np.asarray(stats.fallbacks).sum() / steps),
        "hard_violation_steps": int(np.asarray(stats.applied_violations).sum()),
        "proposed_violations": int(np.asarray(stats.violations).sum()),
        "tail": float(tail),
        "return_cvar": lower_tail_mean(returns, tail),
        "episode_cost_cvar": {
            name: -lower_tail_mean(-costs[:, i], tail) for i, name in enumerate(names)
        },
        "normalized_cost_cvar": float(
            max(-lower_tail_mean(-costs[:, i], tail) / limits[i] for i in range(n_costs))
        )
        if n_costs
        else 0.0,
    }
    if random_return is not None and expert_return is not None:
        span = float(expert_return) - float(random_return)
        if span == 0.0:
            raise ValueError("expert_return and random_return: must differ")
        metrics["normalized_return"] = float((returns.mean() - random_return) / span)
        metrics["normalized_return_cvar"] = float((metrics["return_cvar"] - random_return) / span)
    return metrics


def lower_tail_mean(values: Any, level: float) -> float:
    """CVaR of ``values`` at ``level``: the mean of the lowest ``ceil(level * n)`` of them
    (at least one).

    Raises:
        ValueError: for a level outside (0, 1] or no values.
    """
    if not 0.0 < level <= 1.0:
        raise ValueError(f"tail: must lie in (0, 1], got {level}")
    ordered = np.sort(np.asarray(values, np.float64).reshape(-1))
    if ordered.size == 0:
        raise ValueError("tail: no episodes to take a tail of")
    count = max(1, int(np.ceil(level * ordered.size - 1e-9)))
    return float(ordered[:count].mean())


def per_policy_metrics(stats: EpisodeStats, cost_limits: Sequence[float], **kwargs: Any) -> list:
    """:func:`safety_metrics` of each policy of stats with a leading policy axis
    ``[n_policies, n_episodes, ...]``."""
    n = int(np.asarray(stats.returns).shape[0])
    return [
        safety_metrics(
            jax.tree.map(lambda leaf, i=i: np.asarray(leaf)[i], stats), cost_limits, **kwargs
        )
        for i in range(n)
    ]
