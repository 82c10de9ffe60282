"""What a verdict says: its settings, the intervals and estimates it is made of, the
calibration check, and the verdict itself with its JSON form and MLflow metrics
(:mod:`~neorl_industrial.wrappers.training.verdict` decides; this module holds its
vocabulary)."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

#: The answer when no candidate has the evidence.
KEEP = "keep the current operation"
#: A learned cost channel with too few events held out for the model to learn it: its
#: estimate adds the exact upper bound of the event rate the operators showed.
EXACT_BOUND = "exact bound"
#: How today's operation is estimated where the model is needed.
BASELINE_HOW = (
    "the operators' behaviour cloned (behaviour cloning on the held-out episodes, with "
    "their action noise) and run closed loop in the same model members from the same "
    "starts with the same model noise, the shield in the loop (model); FQE of the clone "
    "(fqe, and model+fqe's tail). The logged return from each start is data: the "
    "calibration check holds the model's estimate of the clone against it, and the error "
    "it allows widens every improvement interval (the baseline's pessimism, measured)"
)
#: The estimators whose agreement a recommendation needs.
DECIDING = ("model", "model+fqe")
#: Transitions per FQE update (the off-policy evaluator's default too).
FQE_BATCH_SIZE = 256
#: The estimator whose cost estimates a recommendation needs within the limits: the whole
#: rollout in the model (a channel computed from the predicted observations needs no cost
#: events in the data; FQE's tail of ``model+fqe`` learns every channel from them).
COST_DECIDING = "model"


class VerdictError(ValueError):
    """Evaluation that cannot be done as asked: names what and why."""


@dataclasses.dataclass(frozen=True)
class VerdictSettings:
    """How candidates are estimated and decided on.

    Attributes:
        horizon: model steps per rollout at most (each start's episode length caps it).
        max_starts: starting states at most (every held-out episode's first state first).
        close_after: ``k`` model steps before ``model+fqe`` closes with FQE's value.
        penalty: ``λ`` of the pessimism (0: none; see the module docstring).
        disagreement_every: model steps between measurements of the members'
            disagreement (each makes every member predict; 1: every step).
        discount: γ of the discounted estimates.
        level: of the intervals (the decision uses its lower and upper bounds).
        bootstrap: resamples of the intervals.
        min_cost_events: held-out steps with a cost above the channel's minimum below
            which a learned channel's estimate is "insufficient evidence".
        min_episodes: held-out episodes the starts come from below which no interval
            (a resample of whole episodes) can carry a recommendation.
        deterministic: follow each member's mean instead of sampling its noise.
        seed: the model noise's and the bootstrap's seed.
        model_seed: which of the plant model's ensembles (its fit's seeds) is used.
        fqe: run the FQE estimators (FQE and the behaviour clone train; slower).
        fqe_updates, fqe_seeds, fqe_hidden: FQE's updates per seed, seeds and widths.
        bc_updates: updates of the behaviour clone (the operators' policy in the model).
        operator_noise: the clone acts with the operators' action noise (the spread of
            their logged actions around the clone's) instead of its mean action.
        replay_residuals: instead of that noise, the operators' own deviations from the
            clone are replayed step by step along each start's logged steps (what the
            operators did that the clone of the state does not: the memory of their
            controller, their own setpoint changes), on top of the clone's feedback and
            before the shield. Off by default: it narrows the intervals of return more
            than the cost bounds can yet follow (docs/verdict.md).
        calibration_tolerance: the calibration check passes when the interval of the
            model's error on today's operation (estimated minus logged, paired by start)
            holds 0 or lies within this share of the logged return's size (and, for a
            limited cost, of its limit).
        far_outside: a model step whose observation or action lies more than this many
            spreads outside the range of the data the model was fitted on is one the model
            cannot vouch for: the pessimistic reading values it at the lowest reward of
            the held-out data (with ``penalty`` > 0).
        max_far_share: a candidate whose rollouts put more than this share of their
            discounted weight on such steps does not qualify: the data cannot answer for
            it, however its estimate reads, and its ``model`` return and improvement
            have no lower bound (``-inf``; ``null`` in a report).
    """

    horizon: int = 1000
    max_starts: int = 100
    close_after: int = 20
    penalty: float = 1.0
    disagreement_every: int = 10
    discount: float = 0.99
    level: float = 0.95
    bootstrap: int = 2000
    min_cost_events: int = 10
    min_episodes: int = 3
    deterministic: bool = False
    seed: int = 0
    model_seed: int = 0
    fqe: bool = True
    fqe_updates: int = 2000
    fqe_seeds: tuple[int, ...] = (0, 1)
    fqe_hidden: tuple[int, ...] = (64, 64)
    bc_updates: int = 2000
    operator_noise: bool = True
    replay_residuals: bool = False
    calibration_tolerance: float = 0.1
    far_outside: float = 0.5
    max_far_share: float = 0.25

    def __post_init__(self) -> None:
        object.__setattr__(self, "fqe_seeds", tuple(int(s) for s in self.fqe_seeds))
        object.__setattr__(self, "fqe_hidden", tuple(int(s) for s in self.fqe_hidden))
        for name in (
            "horizon",
            "max_starts",
            "close_after",
            "disagreement_every",
            "bootstrap",
            "fqe_updates",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise VerdictError(f"{name}: expected a positive integer, got {value!r}")
        if not self.penalty >= 0:
            raise VerdictError(f"penalty: expected a number >= 0, got {self.penalty}")
        if not 0.0 < self.discount <= 1.0:
            raise VerdictError(f"discount: expected a number in (0, 1], got {self.discount}")
        if not 0.5 < self.level < 1.0:
            raise VerdictError(f"level: expected a share in (0.5, 1), got {self.level}")
        if not self.calibration_tolerance >= 0:
            raise VerdictError(
                f"calibration_tolerance: expected a share >= 0, got {self.calibration_tolerance}"
            )
        if not self.far_outside >= 0:
            raise VerdictError(f"far_outside: expected spreads >= 0, got {self.far_outside}")
        if not 0.0 <= self.max_far_share <= 1.0:
            raise VerdictError(
                f"max_far_share: expected a share in [0, 1], got {self.max_far_share}"
            )
        if self.fqe and not self.fqe_seeds:
            raise VerdictError("fqe_seeds: expected at least one FQE seed")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {
            "fqe_seeds": list(self.fqe_seeds),
            "fqe_hidden": list(self.fqe_hidden),
        }


@dataclasses.dataclass(frozen=True)
class Interval:
    """An estimate and its interval (``level``, percentile bootstrap).

    A side the data cannot bound is infinite (``lower`` ``-inf``: a candidate the data
    cannot answer for); :meth:`Verdict.to_dict` writes it as ``null``."""

    value: float
    lower: float
    upper: float


@dataclasses.dataclass(frozen=True)
class CostEstimate:
    """One cost channel of one candidate by one estimator.

    Attributes:
        channel: the cost channel's name.
        value: the estimate over an episode in units of its limit (``<= 1``: within);
            None when the channel has no finite limit (then ``raw`` alone).
        raw: the estimated discounted (``fqe``, ``model+fqe``) or per-episode (``model``)
            cost in the channel's units.
        evidence: ``"sufficient"``, ``"computed"`` (a known expression of the predicted
            observations) or ``"exact bound"`` (a learned channel with fewer than
            ``min_cost_events`` events held out: the upper bound adds ``event_bound``).
        events: held-out steps with a cost above the channel's minimum.
        within_limit: the upper bound within the limit (None: no finite limit).
        event_bound: per episode, the exact (Clopper-Pearson) upper bound of the
            channel's event rate in the held-out steps times an event's size and the
            episode length, added to the upper bound (``model`` only; None otherwise).
    """

    channel: str
    value: Interval | None
    raw: Interval
    evidence: str
    events: int
    within_limit: bool | None
    event_bound: float | None = None


@dataclasses.dataclass(frozen=True)
class EstimatorResult:
    """One candidate (or the logged operation) by one estimator.

    Attributes:
        estimator: ``model``, ``fqe`` or ``model+fqe``.
        discounted_return: estimated discounted return from a start (γ of the settings).
        episode_return: the undiscounted return over the rollout (``model`` only).
        improvement: paired difference from the logged operation's discounted return by
            the same estimator (None for the logged operation itself).
        penalty: mean discounted return the pessimism subtracted (0 for ``fqe``).
        costs: one entry per cost channel.
        outside_data_share: share of model steps outside the data's range.
        far_outside_share: ``model`` only: the share of the discounted return's weight on
            steps further outside the data's range than the settings' ``far_outside``
            (steps the model cannot vouch for).
        override_share: share of model steps whose action the shield changed.
        outside_physics_share: share of model steps whose prediction left the physical
            ranges (clipped onto them and charged).
        paired: ``model`` only: the plain paired difference from the operators' clone
            (same members, starts and noise), bootstrapped, before the pessimism and the
            calibration allowance widen it into :attr:`improvement`; with
            :attr:`penalty` (the candidate's pessimism), the operators' (their
            ``penalty``) and :attr:`allowance` it says what took the interval's lower
            bound where it is.
        allowance: ``model`` only: how far the calibration's error widened the
            improvement interval on each side (:meth:`Calibration.allowance`).
        member_spread: ``model`` only: the spread (standard deviation) over the members
            of the mean paired difference: how far the members disagree on the
            improvement itself.
    """

    estimator: str
    discounted_return: Interval
    episode_return: Interval | None
    improvement: Interval | None
    penalty: float
    costs: tuple[CostEstimate, ...]
    outside_data_share: float | None = None
    override_share: float | None = None
    outside_physics_share: float | None = None
    paired: Interval | None = None
    allowance: float | None = None
    member_spread: float | None = None
    far_outside_share: float | None = None


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Does the plant model reproduce today's operation? The operators' clone run closed
    loop in the model against the logged returns (and costs) from the same starts of the
    held-out episodes; no recommendation unless it passes.

    Attributes:
        status: ``"passed"``, ``"failed"`` or ``"too small"`` (too few held-out
            episodes for the check).
        estimated: the model's (unpenalised) estimate of today's discounted return.
        logged: the logged discounted return from the same starts (data).
        error: the model's error, estimated minus logged, paired by start (interval).
        tolerance: the size within which an error passes (a share of the logged return's
            size, in its units).
        model_error: the largest error the interval allows (``max(|lower|, |upper|)``);
            every improvement interval is widened on both sides by the same share of the
            candidate's and the operators' estimated returns (:meth:`allowance`).
        costs: per limited channel: ``{channel, estimated, logged, error, passed}`` per
            episode in units of its limit; the largest under-prediction the error's
            interval allows (``-lower``) is added to every ``model`` upper bound of the
            channel.
        episodes, transitions: the held-out part the check rests on.
        min_episodes: episodes the check needs.
        reason: why it did not pass, in one sentence (None when it passed).
        closing_error: ``model+fqe``'s own error on today's operation (its estimate of
            the clone minus the logged return; None without FQE); ``closing_passed``:
            within the tolerance, else ``model+fqe`` is shown and does not decide.
        size: the logged discounted return's mean size over the starts (``mean |G|``).
    """

    status: str
    estimated: Interval
    logged: Interval
    error: Interval
    tolerance: float
    model_error: float
    costs: tuple[dict[str, Any], ...]
    episodes: int
    transitions: int
    min_episodes: int
    reason: str | None = None
    closing_error: Interval | None = None
    closing_passed: bool | None = None
    size: float = 1.0

    @staticmethod
    def error_size(error: Interval) -> float:
        """The largest error an interval allows: ``max(|lower|, |upper|)``."""
        return max(abs(error.lower), abs(error.upper))

    @property
    def model_error_share(self) -> float:
        """:attr:`model_error` as a share of the logged return's size."""
        return self.model_error / max(self.size, 1e-12)

    def allowance(self, candidate: np.ndarray, operators: np.ndarray) -> float:
        """How far an improvement interval is widened on each side: a model that misses
        the operators by a share ``δ`` of their return may miss the candidate's estimate
        and the operators' by ``δ`` of each, in opposite directions: ``δ (|candidate| +
        |operators|)`` (mean sizes of the model's estimates), at least :attr:`model_error`."""
        size = float(np.mean(np.abs(candidate))) + float(np.mean(np.abs(operators)))
        return max(self.model_error, self.model_error_share * size)

    def sentence(self) -> str:
        """The check in one sentence, with its numbers."""
        verdicts = {"passed": "passed", "failed": "failed", "too small": "not possible"}
        return (
            f"Calibration {verdicts[self.status]}: the plant model estimates today's "
            f"operation at {self.estimated.value:.4g} [{self.estimated.lower:.4g}, "
            f"{self.estimated.upper:.4g}] against a logged {self.logged.value:.4g} "
            f"(discounted return, {self.episodes} held-out episodes; error "
            f"{self.error.value:+.3g} [{self.error.lower:+.3g}, {self.error.upper:+.3g}], "
            f"tolerance {self.tolerance:.3g})."
            + (
                f" model+fqe does not reproduce it (error {self.closing_error.value:+.3g} "
                f"[{self.closing_error.lower:+.3g}, {self.closing_error.upper:+.3g}]): shown, "
                "not deciding."
                if self.closing_passed is False
                else ""
            )
        )


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The answer, with its evidence (labelled as estimates, estimators named).

    Attributes:
        decision: ``"recommend"`` or :data:`KEEP`.
        recommended: the recommended candidate's name, or None.
        statement: the answer in one plain sentence.
        candidates: per candidate: its name, whether it qualifies, why not, warnings
            (the model asked to predict outside its data's range), and its estimates by
            every estimator.
        behaviour: the logged operation's estimates by every estimator and its logged
            discounted return from the same starts.
        evidence: what the estimates rest on (held-out episodes, starts, members,
            horizon, cost events per channel, the plant model's dataset).
        estimators: the estimators reported; ``deciding``: those a recommendation needs.
        settings: :class:`VerdictSettings` as a dict.
        calibration: the model against today's logged operation (:class:`Calibration`).
    """

    decision: str
    recommended: str | None
    statement: str
    candidates: tuple[dict[str, Any], ...]
    behaviour: dict[str, Any]
    evidence: dict[str, Any]
    estimators: tuple[str, ...]
    deciding: tuple[str, ...]
    settings: dict[str, Any]
    calibration: Calibration | None = None
    kind: str = "estimate"

    def to_dict(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))

    def metrics(self) -> dict[str, float]:
        """Flat numeric metrics for tracking (see :func:`verdict_metrics`)."""
        return verdict_metrics(self.to_dict())


def verdict_metrics(verdict: dict[str, Any]) -> dict[str, float]:
    """A verdict's (``Verdict.to_dict()``) numbers as flat metrics with names MLflow
    accepts: ``verdict/recommend`` (1 or 0), ``verdict/recommended_candidate`` and
    ``verdict/selected_candidate`` (the one selected on the training episodes; their
    positions, -1 for none) and per candidate ``i`` and estimator (``model``, ``fqe``,
    ``model_fqe``) the improvement over the logged operation and its bounds (and, for
    ``model``, the share of its weight far outside the data; no ``_lower`` where the data
    cannot bound it); the calibration check as
    ``verdict/calibration/{passed,estimated,logged,error_lower,error_upper}``."""
    names = [candidate["name"] for candidate in verdict["candidates"]]
    selection = (verdict.get("evidence") or {}).get("selection") or {}
    out = {
        "verdict/recommend": float(verdict["decision"] == "recommend"),
        "verdict/recommended_candidate": float(
            names.index(verdict["recommended"]) if verdict["recommended"] in names else -1
        ),
        "verdict/selected_candidate": float(
            names.index(selection["chosen"]) if selection.get("chosen") in names else -1
        ),
    }
    calibration = verdict.get("calibration")
    if calibration:
        out["verdict/calibration/passed"] = float(calibration["status"] == "passed")
        out["verdict/calibration/estimated"] = calibration["estimated"]["value"]
        out["verdict/calibration/logged"] = calibration["logged"]["value"]
        out["verdict/calibration/error_lower"] = calibration["error"]["lower"]
        out["verdict/calibration/error_upper"] = calibration["error"]["upper"]
    for index, candidate in enumerate(verdict["candidates"]):
        for result in candidate["estimates"]:
            improvement = result["improvement"]
            if improvement is None:
                continue
            estimator = re.sub(r"[^A-Za-z0-9_]", "_", result["estimator"])
            base = f"verdict/candidate_{index}/{estimator}/improvement"
            out[base] = improvement["value"]
            out[f"{base}_lower"] = improvement["lower"]
            out[f"{base}_upper"] = improvement["upper"]
            out[f"verdict/candidate_{index}/{estimator}/far_outside_share"] = result.get(
                "far_outside_share"
            )
    # A side no data bounds (None) or a missing share is no metric.
    return {name: value for name, value in out.items() if value is not None}


def interval_text(interval: Mapping[str, Any], spec: str = "+,.3g") -> str:
    """``value [lower, upper]`` of an interval in a report (``Interval`` as a dict); a
    side no data bounds (None or infinite) reads "no bound"."""

    def side(bound: Any) -> str:
        return "no bound" if bound is None or not math.isfinite(bound) else f"{bound:{spec}}"

    return f"{interval['value']:{spec}} [{side(interval['lower'])}, {side(interval['upper'])}]"


def _plain(value: Any) -> Any:
    """JSON data: an infinite or NaN number (a side no data bounds) as None."""
    if isinstance(value, float | np.floating) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
