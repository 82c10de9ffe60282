"""The verdict before a policy touches the plant: is a candidate better than today's
operation, and within the cost limits? Estimators side by side, each with an interval,
and a decision that says "keep the current operation" unless the evidence is there.

``model_verdict(...)`` takes stacked candidate policies, the held-out episodes and a
fitted :class:`~neorl_industrial.wrappers.models.PlantModel`, and returns one
:class:`Verdict` (``to_dict()`` is its JSON form, the same in the report, MLflow and the
command line).

What is compared with what: the logged return from each held-out start is data. Where
the model is needed for a paired comparison, today's operation is the operators'
behaviour cloned (with their action noise) and run closed loop in the same model members
from the same starts with the same model noise, never their feedback actions replayed
open loop. Before any recommendation the model must reproduce the operators' logged
returns (and limited costs) on the held-out episodes: the calibration check
(:class:`Calibration`), whose error also widens every improvement interval.

Estimators (every number an **estimate**, named by its estimator):

* ``model``: every candidate rolled out in every elite member of the plant model from the
  held-out starting states, the shield in the loop
  (:mod:`~neorl_industrial.functional.transformations.model_evaluation`), one compiled
  program over policies × members × starts; the operators' clone the same way.
  Pessimistic: every step's reward is lowered, and every cost raised, by ``penalty`` ×
  the signal's per-step spread in the data × the step's uncertainty (the members'
  disagreement in units of each feature's spread, how far observation or action lie
  outside the data's range, and how far a prediction left its physical range before it
  was clipped onto it); no step's reward counts above the data's highest. The
  operators' estimate is held against their logged returns (the calibration check), and
  the error measured there widens every interval: the baseline's pessimism is measured.
* ``fqe``: Fitted Q Evaluation of every candidate on the held-out episodes, at the same
  starts; today's operation by FQE of the clone. Shown, not decisive.
* ``model+fqe``: the pessimistic model rollouts of the first ``close_after`` steps,
  closed by FQE's value of the state reached (``Σ_{t<k} γ^t r̃_t + γ^k Q(s_k, π(s_k))``);
  the clone the same way. Decides only where it reproduces the logged returns itself.

Intervals are percentile bootstraps of the mean over starts (resampled by whole
episode) and members (or FQE seeds), paired with the clone on the same episodes and
members, then widened by the model's error on the operators.

Cost evidence: a channel computed from the predicted observations needs no events; a
learned channel with fewer than ``min_cost_events`` held-out events adds the exact
(Clopper-Pearson) upper bound of its event rate to its upper bound.

The decision: a candidate is recommended only if the calibration check passed, by every
deciding estimator the lower bound of its improvement over today's operation is above
zero, and by ``model`` the upper bound of every limited cost channel is within its
limit; among those, the one with the highest lower bound of its improvement by
``model``. Otherwise: keep the current operation. Given the episodes the candidates were
trained on (``selection``), one candidate is selected on them before the test, by the
test's predicted result, and only it can be recommended
(:mod:`~neorl_industrial.wrappers.training.verdict_selection`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.wrappers.training.verdict_evidence import (
    _calibration,
    _within,
    bootstrap_means,
    episode_digests,
    evaluation_starts,
)
from neorl_industrial.wrappers.training.verdict_fqe import (
    VerdictCandidates,
    _fqe_estimators,
    _Head,
)
from neorl_industrial.wrappers.training.verdict_model import (
    PlantRules,
    _Case,
    _cost_reader,
    _CostReader,
    _ModelReading,
    _rollouts,
    _Starts,
    _starts_of,
)
from neorl_industrial.wrappers.training.verdict_results import (
    BASELINE_HOW,
    COST_DECIDING,
    DECIDING,
    FQE_BATCH_SIZE,
    KEEP,
    Calibration,
    CostEstimate,
    EstimatorResult,
    Interval,
    Verdict,
    VerdictError,
    VerdictSettings,
    verdict_metrics,
)
from neorl_industrial.wrappers.training.verdict_selection import (
    INFLATION,
    SelectionSplit,
    apply_selection,
    predictions,
)

__all__ = [
    "FQE_BATCH_SIZE",
    "KEEP",
    "Calibration",
    "CostEstimate",
    "EstimatorResult",
    "Interval",
    "PlantRules",
    "Verdict",
    "VerdictCandidates",
    "VerdictError",
    "VerdictSettings",
    "bootstrap_means",
    "episode_digests",
    "evaluation_starts",
    "merge_verdicts",
    "model_verdict",
    "verdict_metrics",
]


# ----- the verdict ------------------------------------------------------------------
def model_verdict(
    candidates: VerdictCandidates,
    heldout: Dataset,
    plant_model: Any,
    rules: PlantRules | None = None,
    settings: VerdictSettings | None = None,
    selection: Dataset | None = None,
) -> Verdict:
    """Estimates every candidate against the logged operation and decides.

    Args:
        candidates: the candidates, their names and (optionally) their FQE
            (:class:`VerdictCandidates`).
        heldout: the held-out episodes (actions in the policy's [-1, 1]), never trained on.
        plant_model: a fitted ``PlantModel`` of the same task (its elites are the members).
        rules: the task's action scaler, the shield's constraints, the cost channels and
            their episode limits (:class:`PlantRules`; None: no shield, no limits).
        settings: see :class:`VerdictSettings`.
        selection: the episodes the candidates were trained on (the training split,
            same layout as ``heldout``): one candidate is selected on them before the
            test and only it can be recommended
            (:mod:`~neorl_industrial.wrappers.training.verdict_selection`); None: every
            candidate is tested on the held-out episodes.

    Raises:
        VerdictError: naming what is wrong: a plant model not fitted or of other shapes,
            names that do not match the candidates, no held-out episodes.
    """
    settings = settings or VerdictSettings()
    rules = rules or PlantRules()
    n_policies = int(jax.tree.leaves(candidates.policy_params)[0].shape[0])
    names = [str(name) for name in candidates.names]
    _check_inputs(names, n_policies, plant_model, heldout)
    if selection is not None:
        _check_inputs(names, n_policies, plant_model, selection, "selection")
    n_costs = heldout.n_costs
    lengths = np.asarray(jax.device_get(heldout.episode_lengths), np.int64)
    limits = rules.cost_limits
    given = plant_model.dynamics.layout.given
    starts = _starts_of(heldout, settings, given)
    case = _Case(
        heldout=heldout,
        plant_model=plant_model,
        params=plant_model.params(settings.model_seed),
        starts=starts,
        cost_names=list(rules.cost_names) or [f"cost_{i}" for i in range(n_costs)],
        limits=np.full(n_costs, np.inf) if limits is None else np.asarray(limits, float),
        episode_length=int(rules.episode_length or max(1, round(float(lengths.mean())))),
        settings=settings,
        rules=rules,
        selection=None
        if selection is None
        else _selection_starts(selection, starts, settings, given),
        selection_data=selection,
    )
    return _verdict_of(case, names, _estimate(case, candidates))


def _selection_starts(
    selection: Dataset, test: _Starts, settings: VerdictSettings, given: Sequence[int]
) -> _Starts:
    """The training split's starts: half as many as the test's (the selection reads
    them in the same program call, so they cost half a test more), over at most the
    test's horizon (their per-step arrays as wide as the test's)."""
    return _starts_of(
        selection,
        dataclasses.replace(
            settings, max_starts=max(1, -(-len(test.rows) // 2)), horizon=test.horizon
        ),
        given,
        width=test.horizon,
    )


class _Estimates(NamedTuple):
    """Every estimator's result per candidate and for today's operation, the calibration
    check, ``model+fqe``'s own error on today's operation, and the cost reader."""

    candidates: list[list[EstimatorResult]]
    behaviour: list[EstimatorResult]
    calibration: Calibration
    closing_error: list[Interval]
    costs: _CostReader
    #: Per candidate, its test predicted on the training split (None without one).
    predicted: list[dict[str, Any]] | None = None


def _estimate(case: _Case, policies: VerdictCandidates) -> _Estimates:
    """Every candidate and today's operation estimated by every estimator."""
    settings, starts, heldout = case.settings, case.starts, case.heldout
    # One program over policies x members x starts; the operators cloned and run closed
    # loop in the same members from the same states with the same model noise.
    candidates, baseline, clone, selected = _rollouts(case, policies)
    # The limit's share over each start's steps (spread evenly over an episode).
    limits = case.limits
    scale = np.maximum((limits / case.episode_length)[None, :] * starts.lengths[:, None], 1e-12)
    calibration = _calibration(
        baseline=baseline,
        starts=starts,
        scale=scale,
        limits=limits,
        cost_names=case.cost_names,
        heldout=heldout,
        settings=settings,
    )
    costs = _cost_reader(case, calibration)
    reading = _ModelReading.of(heldout, baseline, starts, costs, scale, calibration, settings)
    n_policies = candidates.discounted_return.shape[0]
    results = [
        [reading.candidate(jax.tree.map(lambda x, p=p: x[p], candidates), settings.seed + p)]
        for p in range(n_policies)
    ]
    predicted = None
    if selected is not None and case.selection is not None:
        predicted = _predicted(case, case.selection, selected)
    estimates = _Estimates(results, [reading.operators()], calibration, [], costs, predicted)
    if settings.fqe:
        fqe = _fqe_estimators(
            policies,
            heldout,
            settings,
            starts,
            (candidates, baseline, clone),
            calibration,
            _Head(reading.reward_spread, reading.cost_spread, settings.penalty),
            lambda values, seed: costs(
                values, costs.discounted_scale(len(starts.rows)), seed, computed=False
            ),
        )
        for p in range(n_policies):
            results[p].extend(fqe.candidates[p])
        estimates.behaviour.extend(fqe.behaviour)
        estimates.closing_error.append(fqe.closing_error)
    return estimates


def _predicted(case: _Case, chosen: _Starts, sums: Any) -> list[dict[str, Any]]:
    """Every candidate's test predicted from the training split's starts."""
    data = case.selection_data
    n_costs = data.n_costs
    return predictions(
        sums,
        SelectionSplit(
            episodes=chosen.episodes,
            rewards=chosen.rewards,
            costs=np.asarray(jax.device_get(data.costs), np.float64).reshape(-1, n_costs),
            lengths=chosen.lengths,
            n_episodes=len(np.unique(chosen.episodes)),
        ),
        len(np.unique(case.starts.episodes)),
        case.limits,
        case.episode_length,
        case.settings,
    )


def _verdict_of(case: _Case, names: list[str], estimates: _Estimates) -> Verdict:
    """The decision over the candidates' estimates, with its evidence."""
    settings, starts = case.settings, case.starts
    estimators = tuple(result.estimator for result in estimates.behaviour)
    deciding, calibration = _deciding(estimators, estimates.closing_error, estimates.calibration)
    table = [
        _candidate_row(
            name,
            estimates.candidates[p],
            deciding,
            calibration,
            settings,
            case.heldout.n_transitions,
        )
        for p, name in enumerate(names)
    ]
    selection = None
    if estimates.predicted is not None and case.selection is not None:
        for row, predicted in zip(table, estimates.predicted, strict=True):
            row["selection"] = predicted
        selection = {
            "by": "model",
            "chosen": apply_selection(table, settings.to_dict()),
            "episodes": len(np.unique(case.selection.episodes)),
            "starts": len(case.selection.rows),
            "test_episodes": len(np.unique(starts.episodes)),
            "inflation": INFLATION,
        }
    decision, chosen, statement = _decide(table, deciding, settings.level, calibration)
    return Verdict(
        decision=decision,
        recommended=chosen,
        statement=statement,
        candidates=tuple(table),
        behaviour={
            "how": BASELINE_HOW,
            "logged_discounted_return": float(np.mean(starts.logged_discounted)),
            "estimates": [dataclasses.asdict(r) for r in estimates.behaviour],
        },
        evidence=_evidence_of(
            case.heldout,
            starts,
            case.params,
            case.episode_length,
            estimates.costs,
            getattr(case.plant_model, "card", {}),
        )
        | {"selection": selection},
        estimators=estimators,
        deciding=deciding,
        settings=settings.to_dict(),
        calibration=calibration,
    )


def _check_inputs(
    names: list[str], n_policies: int, plant_model: Any, heldout: Dataset, what: str = "heldout"
) -> None:
    """Refuses, naming what is wrong, candidates and a plant model the verdict cannot
    judge with these held-out episodes (``what``: the data's name in the message)."""
    if len(names) != n_policies:
        raise VerdictError(f"names: {len(names)} names for {n_policies} candidates")
    if not getattr(plant_model, "fitted", False):
        raise VerdictError("plant_model: not fitted; fit one (neorl-industrial model fit)")
    layout = plant_model.dynamics.layout
    if (layout.observation_size, layout.action_size, layout.n_costs) != (
        heldout.observation_size,
        heldout.action_size,
        heldout.n_costs,
    ):
        raise VerdictError(
            f"plant_model: predicts {layout.observation_size} observations, "
            f"{layout.action_size} actions and {layout.n_costs} cost channels; the {what} "
            f"data has {heldout.observation_size}, {heldout.action_size} and {heldout.n_costs}"
        )
    if heldout.n_transitions == 0:
        raise VerdictError(f"{what}: no transitions to evaluate on")


def _deciding(
    estimators: tuple[str, ...], closing_error: list[Interval], calibration: Calibration
) -> tuple[tuple[str, ...], Calibration]:
    """The estimators that decide, and the calibration with ``model+fqe``'s own check.

    ``model+fqe`` decides only where it reproduces today's operation itself (its FQE tail
    measures what the log cannot check otherwise); else it is shown."""
    deciding = tuple(name for name in DECIDING if name in estimators)
    if closing_error:
        passed = _within(closing_error[0], calibration.tolerance)
        calibration = dataclasses.replace(
            calibration, closing_error=closing_error[0], closing_passed=passed
        )
        if not passed:
            deciding = tuple(name for name in deciding if name != "model+fqe")
    return deciding, calibration


def _candidate_row(
    name: str,
    results: list[EstimatorResult],
    deciding: tuple[str, ...],
    calibration: Calibration,
    settings: VerdictSettings,
    heldout_steps: int,
) -> dict[str, Any]:
    """One candidate's row of the verdict: whether it qualifies, why not, and warnings."""
    reasons = []
    if calibration.status != "passed":
        reasons.append(f"calibration: {calibration.reason}")
    far = results[0].far_outside_share
    if far is not None and far > settings.max_far_share:
        reasons.append(
            f"model: {far:.0%} of this candidate's discounted steps lie more than "
            f"{settings.far_outside:g} spreads outside the data the plant model was fitted "
            f"on (at most {settings.max_far_share:.0%}): the data cannot answer for it"
        )
    for result in results:
        if result.estimator not in deciding:
            continue
        # -inf: the data cannot answer for it, said above.
        if -np.inf < result.improvement.lower <= 0.0:
            reasons.append(
                f"{result.estimator}: the lower {settings.level:.0%} bound of the "
                f"improvement over today's operation is {result.improvement.lower:.4g}, "
                "not above 0"
            )
        if result.estimator != COST_DECIDING:
            continue
        for cost in result.costs:
            if cost.within_limit is False:
                bound = (
                    f", with the exact bound of its event rate ({cost.events} events in "
                    f"{heldout_steps} held-out steps)"
                    if cost.event_bound is not None
                    else ""
                )
                reasons.append(
                    f"{result.estimator}: cost {cost.channel!r} may exceed its limit (upper "
                    f"bound {cost.value.upper:.3g} of the limit{bound})"
                )
    model = results[0]
    warnings = []
    if model.outside_data_share:
        warnings.append(
            f"the plant model was asked to predict outside the range of its data on "
            f"{model.outside_data_share:.1%} of this candidate's steps: those steps are "
            "penalised (pessimism), not trusted"
        )
    if model.outside_physics_share:
        warnings.append(
            f"the plant model predicted values outside the physical ranges on "
            f"{model.outside_physics_share:.1%} of this candidate's steps: they were "
            "clipped onto the ranges and charged (pessimism)"
        )
    return {
        "name": name,
        "qualifies": not reasons,
        "reasons": reasons,
        "warnings": warnings,
        "selection": None,
        "estimates": [dataclasses.asdict(r) for r in results],
    }


def _evidence_of(
    heldout: Dataset,
    starts: _Starts,
    params: Any,
    episode_length: int,
    costs: _CostReader,
    card: dict[str, Any] | None,
) -> dict[str, Any]:
    """What the verdict stood on: the held-out data, its starts and events, the limits,
    the plant model's data and physical ranges."""
    card = card or {}
    physics = card.get("physics") or {}
    names, limits = costs.names, costs.limits
    return {
        "heldout_episodes": int(heldout.n_episodes),
        "heldout_transitions": int(heldout.n_transitions),
        "starts": len(starts.rows),
        "start_episodes": len(np.unique(starts.episodes)),
        "members": int(params.n_members),
        "horizon": starts.horizon,
        "episode_length": episode_length,
        "cost_events": {name: int(costs.events[i]) for i, name in enumerate(names)},
        "cost_limits": {
            name: (float(limits[i]) if np.isfinite(limits[i]) else None)
            for i, name in enumerate(names)
        },
        "plant_model": {
            "dataset": (card.get("dataset") or {}).get("name"),
            "fingerprint": (card.get("dataset") or {}).get("fingerprint"),
        },
        "physics": {"ranges": physics.get("features"), "note": physics.get("note")},
    }


def _decide(
    table: Sequence[dict[str, Any]],
    deciding: Sequence[str],
    level: float,
    calibration: Calibration | dict[str, Any] | None = None,
) -> tuple[str, str | None, str]:
    """``(decision, recommended, statement)`` from the candidates' table: the qualifying
    candidate with the highest lower bound of its improvement by ``model``, or
    :data:`KEEP`; the statement ends with the calibration check's sentence."""
    if isinstance(calibration, dict):
        calibration = _calibration_of(calibration)
    check = "" if calibration is None else " " + calibration.sentence()

    def model_gain(row: dict[str, Any]) -> dict[str, float]:
        return next(e for e in row["estimates"] if e["estimator"] == "model")["improvement"]

    selected = next((row for row in table if (row.get("selection") or {}).get("selected")), None)
    chosen = (
        ""
        if selected is None
        else f" {selected['name']} was selected on the training episodes before the test "
        f"(predicted lower bound of its return {selected['selection']['predicted_lower']:.4g}); "
        "only it was tested."
    )
    if calibration is not None and calibration.status != "passed":
        return KEEP, None, f"Keep the current operation: {calibration.reason}.{chosen}{check}"
    qualified = [row for row in table if row["qualifies"]]
    if not qualified:
        return (
            KEEP,
            None,
            (
                "Keep the current operation: no candidate is estimated better than today's "
                if selected is None
                else f"Keep the current operation: {selected['name']}, the candidate selected "
                "on the training episodes, is not estimated better than today's "
            )
            + f"operation with {level:.0%} confidence and within the cost limits by every "
            f"deciding estimator ({', '.join(deciding)}).{chosen}{check}",
        )
    best = max(qualified, key=lambda row: model_gain(row)["lower"])
    gain = model_gain(best)
    return (
        "recommend",
        best["name"],
        f"Recommend {best['name']}: estimated better than today's operation by "
        f"{gain['value']:.4g} (discounted return, {level:.0%} interval {gain['lower']:.4g} "
        f"to {gain['upper']:.4g}) by every deciding estimator ({', '.join(deciding)}), with "
        "every limited cost within its limit. These are estimates from a model of the plant "
        f"and the held-out episodes.{chosen}{check}",
    )


def _calibration_of(data: dict[str, Any]) -> Calibration:
    """A :class:`Calibration` from its ``to_dict`` form."""
    intervals = {k: Interval(**data[k]) for k in ("estimated", "logged", "error")}
    if data.get("closing_error"):
        intervals["closing_error"] = Interval(**data["closing_error"])
    return Calibration(**(data | intervals | {"costs": tuple(data["costs"])}))


def merge_verdicts(verdicts: Sequence[Verdict]) -> Verdict:
    """One verdict over the candidates of several (the programs of a sweep, judged on the
    same held-out episodes with the same settings): their candidates together, decided
    again under the first's calibration check (the same starts, settings and seed give
    the same operators' clone).

    Raises:
        VerdictError: for none, or verdicts of different evidence or settings.
    """
    if not verdicts:
        raise VerdictError("merge_verdicts: no verdict to merge")
    first = verdicts[0]
    for other in verdicts[1:]:
        if other.settings != first.settings or other.estimators != first.estimators:
            raise VerdictError("merge_verdicts: verdicts of different settings or estimators")
        if other.evidence["starts"] != first.evidence["starts"]:
            raise VerdictError("merge_verdicts: verdicts on different held-out starts")
    table = [dict(row) for verdict in verdicts for row in verdict.candidates]
    evidence = first.evidence
    selected = apply_selection(table, first.settings)
    if selected is not None:
        evidence = evidence | {"selection": {**evidence["selection"], "chosen": selected}}
    decision, chosen, statement = _decide(
        table, first.deciding, first.settings["level"], first.calibration
    )
    return dataclasses.replace(
        first,
        candidates=tuple(table),
        decision=decision,
        recommended=chosen,
        statement=statement,
        evidence=evidence,
    )
