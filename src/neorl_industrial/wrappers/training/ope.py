"""Evaluation without a simulator: Fitted Q Evaluation of every run's policy on held-out
episodes, with the same interface as the simulator's :class:`~.evaluation.Evaluator`.

For each run's policy, FQE (``functional.transformations.fitted_q_evaluation``, one
critic head per signal, several FQE seeds in one vmapped program) learns the discounted
return and the discounted cost of every channel from the held-out episodes alone, and
reports them at the episodes' first observations. The numbers are **estimates**, marked
``estimate: "fqe"`` with a 95 % confidence interval over FQE seeds; what they can and
cannot tell is in ``docs/ope.md``.

What each number means:

* ``return``: estimated discounted return (γ of the FQE config) from an episode start,
  in the data's reward units; ``behaviour_return`` is the held-out episodes' own
  discounted return from their starts (what the logged operation achieved).
* ``cost_value``: estimated discounted cost per channel; ``normalized_cost`` divides it
  by the discounted value an episode cost limit allows (OSRL's per-step threshold,
  ``limit (1 - γ^T) / ((1 - γ) T)``), so ``<= 1`` reads "estimated within the limit"
  exactly as the simulator's ``normalized_cost`` does, and the safety-first selection
  (:func:`~.evaluation.selection_key`) applies unchanged.

The evaluated policy is the one that would run: its actions pass the shield in plant
units before FQE scores them. The previous action is not part of an observation, so rate
limits are left out of that shield (the server applies them with the real previous
action).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from neorl_industrial.core.agents.cost import per_step_cost_threshold
from neorl_industrial.core.agents.fqe import FQEConfig
from neorl_industrial.core.agents.types import Algorithm
from neorl_industrial.core.safety import shield
from neorl_industrial.functional.state_management import ActionScaler, Dataset
from neorl_industrial.functional.transformations.offline import Schedule
from neorl_industrial.functional.transformations.ope import (
    fitted_q_evaluation_values,
    start_estimates,
)
from neorl_industrial.wrappers.training.evaluation import mean_confidence_interval

__all__ = ["FittedFQE", "OffPolicyEvaluator", "discounted_start_returns"]


def discounted_start_returns(dataset: Dataset, discount: float) -> np.ndarray:
    """``[n_episodes]`` discounted return of every episode from its first step."""
    rewards = np.asarray(jax.device_get(dataset.rewards), np.float64)
    episode = np.asarray(jax.device_get(dataset.episode_id))
    starts = np.asarray(jax.device_get(dataset.episode_starts))
    position = np.arange(rewards.size) - starts[episode]
    weighted = rewards * discount ** position.astype(np.float64)
    return np.bincount(episode, weights=weighted, minlength=starts.size)


@dataclasses.dataclass(frozen=True)
class FittedFQE:
    """The FQEs of the policies an :class:`OffPolicyEvaluator` scored last.

    Attributes:
        policies: the policies' parameters (leading run axis), as scored.
        dataset: the episodes they were fitted on.
        values: their value function (``fitted_q_evaluation_values``' result).
        settings: ``(updates, seeds, hidden, discount, batch_size)`` they were fitted with.
    """

    policies: Any
    dataset: Dataset
    values: Any
    settings: tuple[int, tuple[int, ...], tuple[int, ...], float, int]

    def fits(
        self,
        policies: Any,
        dataset: Dataset,
        *,
        updates: int,
        seeds: Sequence[int],
        hidden: Sequence[int],
        discount: float,
        batch_size: int,
    ) -> bool:
        """Whether these are the FQEs of ``policies`` on ``dataset`` under these settings
        (the verdict then reuses them instead of fitting the same FQEs again)."""
        asked = (
            int(updates),
            tuple(int(s) for s in seeds),
            tuple(int(h) for h in hidden),
            float(discount),
            int(batch_size),
        )
        return asked == self.settings and _same_arrays(
            (self.policies, self.dataset), (policies, dataset)
        )


def _same_arrays(a: Any, b: Any) -> bool:
    """Equal trees of equal arrays (the same objects, or equal values)."""
    (left, left_tree), (right, right_tree) = jax.tree.flatten(a), jax.tree.flatten(b)
    if left_tree != right_tree:
        return False
    return all(
        x is y or np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(left, right, strict=True)
    )


@dataclasses.dataclass
class OffPolicyEvaluator:
    """Scores stacked policies (leading run axis) by FQE on held-out episodes.

    Attributes:
        algorithm: whose ``act`` the policies are, acting in the policy's [-1, 1].
        dataset: the held-out episodes, actions scaled to the policy's [-1, 1].
        scaler: plant units <-> [-1, 1] (None: the actions are in [-1, 1] already).
        constraints: the shield's compiled constraints (plant units); None: no shield.
        cost_limits: episode cost limit per cost channel (None: no cost metrics).
        cost_names: names of the cost channels.
        episode_length: steps per episode, for the per-step cost threshold.
        updates: FQE updates per FQE seed.
        seeds: FQE seeds (their spread gives the confidence interval).
        hidden: widths of FQE's critic.
        discount: γ of the estimates.
        batch_size: transitions per FQE update.

    After a call, ``fitted`` holds the FQEs of the policies it scored (:class:`FittedFQE`).
    """

    algorithm: Algorithm
    dataset: Dataset
    scaler: ActionScaler | None = None
    constraints: Any = None
    cost_limits: Sequence[float] | None = None
    cost_names: Sequence[str] = ()
    episode_length: int = 1000
    updates: int = 2000
    seeds: Sequence[int] = (0, 1, 2)
    hidden: tuple[int, ...] = (64, 64)
    discount: float = 0.99
    batch_size: int = 256

    def __post_init__(self) -> None:
        if self.dataset.discrete:
            raise ValueError("dataset: off-policy evaluation (FQE) needs continuous actions")
        if self.updates < 1:
            raise ValueError(
                f"updates: expected a positive number of FQE updates, got {self.updates}"
            )
        if len(self.seeds) < 2:
            raise ValueError("seeds: give at least two FQE seeds (their spread is the interval)")
        self.behaviour_return = float(discounted_start_returns(self.dataset, self.discount).mean())
        self.fitted: FittedFQE | None = None
        self.thresholds = None
        if self.cost_limits is not None:
            self.thresholds = np.asarray(
                [
                    per_step_cost_threshold(float(limit), self.discount, self.episode_length)
                    if np.isfinite(limit)
                    else np.inf
                    for limit in self.cost_limits
                ],
                np.float64,
            )

    def shield_rates(self, policies: Any) -> tuple[np.ndarray, np.ndarray]:
        """``([n_runs], [n_runs])``: the fraction of held-out observations at which the
        shield would override each run's policy, and would fall back."""
        if self.constraints is None:
            n_runs = int(jax.tree.leaves(policies)[0].shape[0])
            return np.zeros(n_runs), np.zeros(n_runs)
        act, scaler, constraints = self.algorithm.act, self.scaler, self.constraints
        observations = self.dataset.transition_observations()

        # The observations are an argument, not a closed-over constant that XLA would fold.
        def rates(policy_params: Any, observations: jax.Array) -> tuple[jax.Array, jax.Array]:
            actions = jax.vmap(lambda o: act(policy_params, o, None, deterministic=True))(
                observations
            )
            plant = actions if scaler is None else scaler.unscale(actions)
            unknown = jnp.full(plant.shape, jnp.nan, jnp.float32)
            _, report = shield(constraints, observations, plant, unknown)
            return jnp.mean(report.overridden), jnp.mean(report.fallback)

        overridden, fallback = jax.device_get(
            jax.jit(jax.vmap(rates, in_axes=(0, None)))(policies, observations)
        )
        return np.asarray(overridden, np.float64), np.asarray(fallback, np.float64)

    def actions(self, policy_params: Any, observations: jax.Array) -> jax.Array:
        """``[B, act]`` actions in [-1, 1] of one policy for ``observations [B, obs]``,
        shielded in plant units."""
        act, scaler, constraints = self.algorithm.act, self.scaler, self.constraints
        actions = jax.vmap(lambda o: act(policy_params, o, None, deterministic=True))(observations)
        if constraints is None:
            return actions
        plant = actions if scaler is None else scaler.unscale(actions)
        unknown = jnp.full(plant.shape, jnp.nan, jnp.float32)  # no previous action
        safe, _ = shield(constraints, observations, plant, unknown)
        return safe if scaler is None else scaler.scale(safe)

    def policy_function(self, policy_params: Any) -> Any:
        """``observations [B, obs] -> actions [B, act]`` of one policy (see
        :meth:`actions`)."""
        return lambda observations: self.actions(policy_params, observations)

    def __call__(self, policies: Any, updates: int) -> list[dict[str, Any]]:
        """Estimated metrics of every run's policy (a list, one dict per run): all runs'
        FQEs train in one program."""
        del updates  # FQE's keys depend only on its seeds
        config = FQEConfig(hidden=tuple(self.hidden), discount=self.discount)
        values = fitted_q_evaluation_values(
            self.dataset,
            self.actions,
            policies,
            schedule=Schedule(n_updates=self.updates, batch_size=self.batch_size),
            seeds=tuple(self.seeds),
            config=config,
        )
        n_runs = int(jax.tree.leaves(policies)[0].shape[0])
        returns, costs = start_estimates(values, self.dataset.initial_observations(), n_runs)
        self.fitted = FittedFQE(
            policies=policies,
            dataset=self.dataset,
            values=values,
            settings=(
                int(self.updates),
                tuple(int(s) for s in self.seeds),
                tuple(int(h) for h in self.hidden),
                float(self.discount),
                int(self.batch_size),
            ),
        )
        overridden, fallback = self.shield_rates(policies)
        rows = []
        for run in range(returns.shape[0]):
            row = self._metrics(returns[run], costs[run])
            row["override_rate"] = float(overridden[run])
            row["fallback_rate"] = float(fallback[run])
            rows.append(row)
        return rows

    def _metrics(self, returns_: np.ndarray, costs: np.ndarray) -> dict[str, Any]:
        """Metrics of one policy from its FQE seeds' ``returns [S]`` and ``costs [S, C]``."""
        returns = mean_confidence_interval(returns_.tolist())
        row: dict[str, Any] = {
            "estimate": "fqe",
            "return": returns["mean"],
            "return_ci": returns["ci"],
            "behaviour_return": self.behaviour_return,
            "heldout_episodes": self.dataset.n_episodes,
            "fqe_updates": self.updates,
            "fqe_seeds": len(self.seeds),
            "discount": self.discount,
        }
        n_costs = costs.shape[1]
        cost_mean = costs.mean(axis=0)
        names = list(self.cost_names) or [f"cost_{i}" for i in range(n_costs)]
        if n_costs:
            row["cost_value"] = {
                name: float(value) for name, value in zip(names, cost_mean, strict=True)
            }
            row["cost_value_ci"] = {
                name: mean_confidence_interval(costs[:, i].tolist())["ci"]
                for i, name in enumerate(names)
            }
        if self.thresholds is not None and n_costs:
            per_channel = np.asarray(cost_mean, np.float64) / self.thresholds
            row["normalized_cost"] = float(per_channel.max())
            row["normalized_cost_per_channel"] = {
                name: float(value) for name, value in zip(names, per_channel, strict=True)
            }
        else:
            row["normalized_cost"] = None
        return row
