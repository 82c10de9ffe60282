"""Periodic evaluation of every run of a training in the simulator, and the safety-aware
criterion that picks the best policy.

One compiled program evaluates all seeds' policies over all episodes at once (``vmap``
over policies, environments side by side within each), with the shield in the loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from scipy import stats as scipy_stats

from neorl_industrial.core.agents.types import Algorithm
from neorl_industrial.core.environments.base import Environment
from neorl_industrial.functional.transformations.evaluation import (
    discounted_values,
    evaluate,
    per_policy_metrics,
)

__all__ = [
    "Evaluator",
    "mean_confidence_interval",
    "ope_beside_simulator",
    "selection_key",
    "summarize_runs",
]


def selection_key(metrics: dict[str, Any]) -> tuple[float, float]:
    """Orders evaluations, larger is better: every policy whose mean episode cost keeps
    every limit (``normalized_cost <= 1``) ranks above every policy that does not; among
    the first by return, among the others by lower cost."""
    cost = metrics.get("normalized_cost")
    if cost is None or not np.isfinite(cost):
        return (0.0, float(metrics["return"]))
    if cost <= 1.0:
        return (1.0, float(metrics["return"]))
    return (0.0, -float(cost))


def mean_confidence_interval(values: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """Mean with the half-width of a Student-t confidence interval over runs (None for
    fewer than two)."""
    data = np.asarray(values, np.float64)
    mean = float(data.mean())
    if data.size < 2:
        return {"mean": mean, "ci": None, "n": int(data.size)}
    half = scipy_stats.t.ppf(0.5 + level / 2, data.size - 1) * data.std(ddof=1)
    return {"mean": mean, "ci": float(half / np.sqrt(data.size)), "n": int(data.size)}


def summarize_runs(per_run: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean and 95 % confidence interval over runs of every numeric metric."""
    keys = [
        key
        for key, value in per_run[0].items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    ]
    return {key: mean_confidence_interval([run[key] for run in per_run]) for key in keys}


@dataclasses.dataclass
class Evaluator:
    """Evaluates stacked policies (leading run axis) in ``env``.

    Attributes:
        algorithm: whose ``act`` the policies are (deterministic actions).
        env, env_params: the simulator.
        episodes: episodes per policy, run side by side.
        horizon: steps per episode.
        constraints: compiled hard constraints; with ``shield`` every action passes the
            shield, otherwise they are only checked. None: no constraints.
        cost_limits: episode cost limit per cost channel of the environment.
        cost_names: names of the cost channels.
        references: ``(random_return, expert_return)`` for normalized returns, or None.
        seed: base of the evaluation keys; the key of an evaluation depends only on this
            and the updates done, so a resumed run evaluates exactly as an uninterrupted one.
    """

    algorithm: Algorithm
    env: Environment
    env_params: Any
    episodes: int
    horizon: int
    constraints: Any = None
    shield: bool = True
    cost_limits: Sequence[float] | None = None
    cost_names: Sequence[str] | None = None
    references: tuple[float, float] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        algorithm, env, params = self.algorithm, self.env, self.env_params
        episodes, horizon = self.episodes, self.horizon
        constraints, shield_actions = self.constraints, self.shield

        def policy(policy_params: Any, observation: jax.Array, key: jax.Array) -> jax.Array:
            return algorithm.act(policy_params, observation, key, deterministic=True)

        def one(policy_params: Any, key: jax.Array) -> Any:
            return evaluate(
                key,
                env,
                params,
                policy,
                episodes,
                horizon=horizon,
                policy_params=policy_params,
                constraints=constraints,
                shield_actions=shield_actions,
            )

        self._run = jax.jit(jax.vmap(one))
        if self.cost_limits is not None and len(self.cost_limits) != env.n_costs:
            raise ValueError(
                f"cost_limits: expected one limit per cost channel of {type(env).__name__} "
                f"({env.n_costs}: {', '.join(env.cost_names)}), got {len(self.cost_limits)}"
            )

    def __call__(self, policies: Any, updates: int) -> list[dict[str, Any]]:
        """Metrics of every run's policy (a list, one dict per run)."""
        n_runs = int(jax.tree.leaves(policies)[0].shape[0])
        key = jax.random.fold_in(jax.random.PRNGKey(self.seed), updates)
        episode_stats = jax.device_get(self._run(policies, jax.random.split(key, n_runs)))
        limits = (
            list(self.cost_limits)
            if self.cost_limits is not None
            else [float("inf")] * self.env.n_costs
        )
        kwargs: dict[str, Any] = {
            "cost_names": list(self.cost_names or self.env.cost_names),
        }
        if self.references is not None:
            kwargs["random_return"], kwargs["expert_return"] = self.references
        rows = per_policy_metrics(episode_stats, limits, **kwargs)
        for row in rows:
            if self.cost_limits is None:
                row["normalized_cost"] = row["normalized_cost_cvar"] = None
                row.pop("normalized_cost_per_channel", None)
        return rows


def ope_beside_simulator(
    ope_evaluator: Any,
    policies: Any,
    simulator: tuple[Any, Any],
    scaler: Any,
    episodes: int,
    seed: int,
) -> list[dict[str, Any]]:
    """FQE's estimates of every run's policy (``policies``, stacked) next to the
    simulator's discounted return and costs of the same (shielded) policy from the reset
    distribution: how far the off-policy estimates are from the truth. ``scaler`` maps
    the policy's [-1, 1] to plant units (None: the identity)."""
    rows = ope_evaluator(policies, 0)
    env, params = simulator
    horizon = int(params.horizon)
    for run, row in enumerate(rows):
        policy_params = jax.tree.map(lambda leaf, run=run: leaf[run], policies)
        act = ope_evaluator.policy_function(policy_params)

        def policy(observations: jax.Array, act: Any = act) -> jax.Array:
            actions = act(observations)
            return actions if scaler is None else scaler.unscale(actions)

        returns, costs = jax.jit(
            lambda key, policy=policy: discounted_values(
                key, env, params, policy, episodes, horizon, ope_evaluator.discount
            )
        )(jax.random.PRNGKey(seed))
        simulated = float(np.mean(np.asarray(returns)))
        row["simulated_return"] = simulated
        row["relative_error"] = (row["return"] - simulated) / max(abs(simulated), 1e-9)
        row["simulated_cost_value"] = dict(
            zip(env.cost_names, np.asarray(costs).mean(0).tolist(), strict=True)
        )
    return rows
