"""Which trained policies a run may keep, and which of them it keeps.

Two facts decide, in this order:

1. **A policy that cannot act is not a policy.** After training, every run's policy is
   asked for its actions on logged observations (the held-out episodes' when the run
   holds some out, else its training log's): a run whose parameters are not finite,
   whose policy proposes a non-finite action for any of them, or whose proposals the
   shield replaces by its fallback for more than :data:`MAX_FALLBACK_SHARE` of those where
   it keeps the operators' own action *fails*, by name, and is never selected, exported or
   registered (:func:`policy_health`). A run in which every policy fails raises.
2. **The verdict ranks, when there is one.** With a plant model, the policy a run keeps
   (and exports) is the candidate the verdict ranks first (:func:`verdict_ranking`): the
   recommended one, else the qualifying one, else the one whose costs are estimated within
   their limits, each time by the highest lower bound of its improvement over the logged
   operation. Without a verdict, the evaluation's safety-first criterion
   (:func:`~.evaluation.selection_key`) picks.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from neorl_industrial.core.safety import shield

__all__ = [
    "MAX_FALLBACK_SHARE",
    "MAX_HEALTH_OBSERVATIONS",
    "PolicyHealth",
    "best_evaluated_run",
    "health_observations",
    "policy_health",
    "verdict_ranking",
]

#: A policy the shield replaces by its fallback on more than this share of observations
#: does not control the plant: the fallback does.
MAX_FALLBACK_SHARE = 0.5
#: Observations the check asks every policy about at most (evenly spread over the log).
MAX_HEALTH_OBSERVATIONS = 2048


@dataclasses.dataclass(frozen=True)
class PolicyHealth:
    """What one trained policy does on logged observations.

    Attributes:
        observations: how many it was asked about, and ``source`` which ones.
        finite_parameters: every parameter is a finite number.
        non_finite_share: share of observations whose proposed action holds a NaN or an
            infinity.
        fallback_share: share of observations whose proposal the shield replaced by its
            fallback (the previous action unknown, as at an episode's start), among those
            where it kept the logged action from its fallback.
    """

    observations: int
    source: str
    finite_parameters: bool
    non_finite_share: float
    fallback_share: float

    @property
    def failure(self) -> str | None:
        """Why the policy cannot act, in one phrase, or None when it can."""
        hint = "; a learning rate or another hyperparameter too large makes this"
        if not self.finite_parameters:
            return f"its parameters hold NaN or infinity{hint}"
        if self.non_finite_share > 0:
            return (
                f"its policy proposes non-finite actions (NaN or infinity) for "
                f"{self.non_finite_share:.1%} of {self.observations} {self.source}{hint}"
            )
        if self.fallback_share > MAX_FALLBACK_SHARE:
            return (
                f"the shield replaces its actions by the fallback for "
                f"{self.fallback_share:.1%} of {self.observations} {self.source} where the "
                f"logged action passes (more than {MAX_FALLBACK_SHARE:.0%}): the fallback, "
                "not the policy, would act"
            )
        return None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"failure": self.failure}


def health_observations(observations: jax.Array, limit: int = MAX_HEALTH_OBSERVATIONS) -> jax.Array:
    """At most ``limit`` rows of ``observations [N, obs]``, evenly spread."""
    n = int(observations.shape[0])
    if n <= limit:
        return observations
    rows = np.linspace(0, n - 1, limit).round().astype(np.int64)
    return observations[jnp.asarray(rows)]


def policy_health(
    act: Callable[..., jax.Array],
    policies: Any,
    observations: jax.Array,
    *,
    logged_actions: jax.Array | None = None,
    source: str = "logged observations",
    scaler: Any = None,
    constraints: Any = None,
) -> list[PolicyHealth]:
    """The health of every policy of ``policies`` (leading run axis) on ``observations
    [N, obs]`` (raw, as logged): one compiled program over runs and observations.

    The fallback share counts only the observations where the shield keeps the logged
    action (``logged_actions [N, act]``, plant units) from the fallback: where no action
    can keep the rules, the fallback is the plant's state, not the policy's doing.

    Args:
        act: ``act(params, observation, key, deterministic=True)`` in the policy's
            [-1, 1] (an ``Algorithm.act``).
        policies: the runs' policy parameters, stacked.
        observations: where the policies are asked to act.
        logged_actions: what the operators did there (None: every observation counts).
        source: what ``observations`` are, for the failure's wording.
        scaler: the task's action scaler (the shield acts in plant units).
        constraints: the shield's compiled constraints (None: no shield, no fallback).
    """
    observations = jnp.asarray(observations, jnp.float32)
    counted = jnp.ones(observations.shape[0], bool)
    if constraints is not None and logged_actions is not None:
        logged = jnp.asarray(logged_actions, jnp.float32)
        unknown = jnp.full(logged.shape, jnp.nan, jnp.float32)
        _, report = jax.jit(shield)(constraints, observations, logged, unknown)
        counted = ~report.fallback

    def one(params: Any, observations: jax.Array, counted: jax.Array) -> tuple[jax.Array, ...]:
        finite = jnp.all(
            jnp.asarray([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(params)])
        )
        actions = jax.vmap(lambda o: act(params, o, None, deterministic=True))(observations)
        bad = ~jnp.all(jnp.isfinite(actions), axis=-1)
        if constraints is None:
            fallback = jnp.zeros(())
        else:
            plant = actions if scaler is None else scaler.unscale(actions)
            unknown = jnp.full(plant.shape, jnp.nan, jnp.float32)
            _, report = shield(constraints, observations, plant, unknown)
            fell = jnp.sum(report.fallback & counted)
            fallback = fell / jnp.maximum(jnp.sum(counted), 1)
        return finite, jnp.mean(bad.astype(jnp.float32)), fallback

    # The observations are arguments, not closed-over constants XLA would fold.
    finite, non_finite, fallback = jax.device_get(
        jax.jit(jax.vmap(one, in_axes=(0, None, None)))(policies, observations, counted)
    )
    return [
        PolicyHealth(
            observations=int(observations.shape[0]),
            source=source,
            finite_parameters=bool(finite[run]),
            non_finite_share=float(non_finite[run]),
            fallback_share=float(fallback[run]),
        )
        for run in range(len(np.atleast_1d(finite)))
    ]


def best_evaluated_run(best: Sequence[Mapping[str, Any] | None], runs: Sequence[int]) -> int:
    """Of ``runs``, the one whose best evaluation (``best[run]["metrics"]``) ranks first by
    :func:`~.evaluation.selection_key` (the first of ``runs`` when none was evaluated)."""
    from neorl_industrial.wrappers.training.evaluation import selection_key

    scored = [(selection_key(best[run]["metrics"]), run) for run in runs if best[run]]
    return max(scored)[1] if scored else runs[0]


def verdict_ranking(verdict: Mapping[str, Any]) -> list[str]:
    """The verdict's candidates (``Verdict.to_dict()``), best first: the recommended
    one, then the one selected on the training episodes (when the verdict had them),
    then those that qualify, then those whose every limited cost is estimated
    within its limit, each group by the lower bound of its improvement over the logged
    operation by the first deciding estimator (NaN or missing: last)."""
    deciding = next(iter(verdict.get("deciding") or ["model"]))

    def lower(row: Mapping[str, Any], estimator: str) -> float:
        for estimate in row["estimates"]:
            if estimate["estimator"] == estimator and estimate.get("improvement"):
                value = estimate["improvement"]["lower"]  # None: no data bounds it
                return float(value) if value is not None and math.isfinite(value) else -math.inf
        return -math.inf

    def within(row: Mapping[str, Any]) -> bool:
        estimates = {e["estimator"]: e for e in row["estimates"]}
        chosen = estimates.get("model") or estimates.get(deciding)
        if chosen is None:
            return False
        return all(cost.get("within_limit") is not False for cost in chosen.get("costs", ()))

    def key(row: Mapping[str, Any]) -> tuple[bool, bool, bool, bool, float]:
        return (
            row["name"] == verdict.get("recommended"),
            bool((row.get("selection") or {}).get("selected")),
            bool(row.get("qualifies")),
            within(row),
            lower(row, deciding),
        )

    return [row["name"] for row in sorted(verdict["candidates"], key=key, reverse=True)]
