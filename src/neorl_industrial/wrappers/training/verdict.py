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
  operators' estimate is raised by its own uncertainty (pessimism on the baseline).
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
``model``. Otherwise: keep the current operation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats

from neorl_industrial.core.agents.bc import BCConfig, make_bc
from neorl_industrial.core.agents.cost import per_step_cost_threshold
from neorl_industrial.core.agents.fqe import FQEConfig
from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.functional.transformations.model_evaluation import (
    RolloutSums,
    make_policy_rollouts,
)
from neorl_industrial.functional.transformations.offline import train_offline
from neorl_industrial.functional.transformations.ope import fitted_q_evaluation_values

__all__ = [
    "KEEP",
    "Calibration",
    "CostEstimate",
    "EstimatorResult",
    "Interval",
    "Verdict",
    "VerdictError",
    "VerdictSettings",
    "bootstrap_means",
    "episode_digests",
    "evaluation_starts",
    "merge_verdicts",
    "model_verdict",
    "verdict_metrics",
]

#: The answer when no candidate has the evidence.
KEEP = "keep the current operation"
#: A learned cost channel with too few events held out for the model to learn it: its
#: estimate adds the exact upper bound of the event rate the operators showed.
EXACT_BOUND = "exact bound"
#: How today's operation is estimated where the model is needed.
BASELINE_HOW = (
    "the operators' behaviour cloned (behaviour cloning on the held-out episodes, with "
    "their action noise) and run closed loop in the same model members from the same "
    "starts with the same model noise, the shield in the loop (model; its return raised by "
    "its own uncertainty: pessimism); FQE of the clone (fqe, and model+fqe's tail). The "
    "logged return from each start is data: the calibration check holds the model's "
    "estimate of the clone against it"
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
        calibration_tolerance: the calibration check passes when the interval of the
            model's error on today's operation (estimated minus logged, paired by start)
            holds 0 or lies within this share of the logged return's size (and, for a
            limited cost, of its limit).
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
    calibration_tolerance: float = 0.1

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
        if self.fqe and not self.fqe_seeds:
            raise VerdictError("fqe_seeds: expected at least one FQE seed")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {
            "fqe_seeds": list(self.fqe_seeds),
            "fqe_hidden": list(self.fqe_hidden),
        }


@dataclasses.dataclass(frozen=True)
class Interval:
    """An estimate and its interval (``level``, percentile bootstrap)."""

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
    accepts: ``verdict/recommend`` (1 or 0), ``verdict/recommended_candidate`` (its
    position, -1 for none) and per candidate ``i`` and estimator (``model``, ``fqe``,
    ``model_fqe``) the improvement over the logged operation and its bounds; the
    calibration check as ``verdict/calibration/{passed,estimated,logged,error_lower,
    error_upper}``."""
    names = [candidate["name"] for candidate in verdict["candidates"]]
    out = {
        "verdict/recommend": float(verdict["decision"] == "recommend"),
        "verdict/recommended_candidate": float(
            names.index(verdict["recommended"]) if verdict["recommended"] in names else -1
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
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


# ----- data -------------------------------------------------------------------------
def episode_digests(dataset: Dataset) -> list[str]:
    """A short digest (16 hex) of every episode's observations, actions and rewards:
    equal for the same episode however its log was cut or loaded."""
    digests = []
    for episode in dataset.to_episodes():
        digest = hashlib.sha256()
        for name in ("observations", "actions", "rewards"):
            array = np.ascontiguousarray(np.asarray(episode[name], np.float32))
            digest.update(f"{name}:{array.shape};".encode())
            digest.update(array.tobytes())
        digests.append(digest.hexdigest()[:16])
    return digests


def evaluation_starts(dataset: Dataset, max_starts: int) -> tuple[np.ndarray, np.ndarray]:
    """``(transitions, episodes)`` where rollouts start: every episode's first
    transition (evenly chosen when there are more than ``max_starts``), then, when there
    are fewer episodes than ``max_starts``, transitions evenly spread over the others
    (each followed for the rest of its episode)."""
    starts = np.asarray(jax.device_get(dataset.episode_starts), np.int64)
    episode_id = np.asarray(jax.device_get(dataset.episode_id), np.int64)
    if len(starts) >= max_starts:
        chosen = starts[np.linspace(0, len(starts) - 1, max_starts).round().astype(np.int64)]
    else:
        others = np.setdiff1d(np.arange(dataset.n_transitions), starts)
        extra = min(max_starts - len(starts), len(others))
        picked = others[np.linspace(0, len(others) - 1, extra).round().astype(np.int64)]
        chosen = np.concatenate([starts, picked if extra else others[:0]])
    chosen = np.unique(chosen)
    return chosen, episode_id[chosen]


def cost_events(dataset: Dataset) -> np.ndarray:
    """``[n_costs]`` steps whose cost lies above the channel's minimum in ``dataset``."""
    costs = np.asarray(jax.device_get(dataset.costs), np.float64).reshape(dataset.n_transitions, -1)
    if costs.size == 0:
        return np.zeros(costs.shape[1], np.int64)
    return (costs > costs.min(axis=0) + 1e-9).sum(axis=0)


# ----- intervals --------------------------------------------------------------------
def bootstrap_means(values: np.ndarray, episodes: np.ndarray, draws: int, seed: int) -> np.ndarray:
    """``[..., draws]`` bootstrap means of ``values [..., A, N]`` over a resample of the
    ``A`` members (or seeds) and of the ``N`` starts by whole episode (``episodes [N]``:
    each start's episode; a resampled episode brings all its starts)."""
    rng = np.random.default_rng(seed)
    n_groups = values.shape[-2]
    labels, group_of_start = np.unique(episodes, return_inverse=True)
    member_weights = rng.multinomial(n_groups, np.full(n_groups, 1.0 / n_groups), draws)
    episode_counts = rng.multinomial(len(labels), np.full(len(labels), 1.0 / len(labels)), draws)
    start_weights = episode_counts[:, group_of_start].astype(np.float64)  # [draws, N]
    total = member_weights.sum(axis=1) * start_weights.sum(axis=1)
    sums = np.einsum("...an,ba,bn->...b", values, member_weights, start_weights)
    return sums / np.maximum(total, 1e-12)


def _interval(values: np.ndarray, boot: np.ndarray, level: float) -> Interval:
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(boot, [tail, 100.0 - tail])
    return Interval(float(np.mean(values)), float(low), float(high))


# ----- the verdict ------------------------------------------------------------------
def model_verdict(
    *,
    act: Callable[..., jax.Array],
    policy_params: Any,
    names: Sequence[str],
    heldout: Dataset,
    plant_model: Any,
    scaler: Any = None,
    constraints: Any = None,
    cost_limits: Sequence[float] | None = None,
    cost_names: Sequence[str] = (),
    episode_length: int | None = None,
    fqe_act: Callable[..., jax.Array] | None = None,
    settings: VerdictSettings | None = None,
    fqe_values: Callable[[Any], np.ndarray] | None = None,
) -> Verdict:
    """Estimates every candidate against the logged operation and decides.

    Args:
        act: ``act(policy_params, observation, key, deterministic=True)`` of one raw
            observation, actions in the policy's [-1, 1] (an ``Algorithm.act``).
        policy_params: the candidates' parameters stacked on a leading axis.
        names: one name per candidate.
        heldout: the held-out episodes (actions in the policy's [-1, 1]), never trained on.
        plant_model: a fitted ``PlantModel`` of the same task (its elites are the members).
        scaler, constraints: the task's action scaler and the shield's constraints.
        cost_limits: episode cost limit per channel (None or inf: not limited).
        cost_names: the channels' names.
        episode_length: steps of an episode the limits are for (default: the held-out
            episodes' mean length).
        fqe_act: ``fqe_act(params, observations [B, obs]) -> actions [B, act]`` shielded
            as :class:`~.ope.OffPolicyEvaluator` scores them (default: ``act`` batched).
        settings: see :class:`VerdictSettings`.
        fqe_values: the candidates' FQE value function already fitted on ``heldout``
            with ``fqe_act`` and the settings' FQE updates, seeds and widths (what
            :func:`~neorl_industrial.functional.transformations.ope.fitted_q_evaluation_values`
            returns, as an :class:`~.ope.OffPolicyEvaluator` keeps it): used instead of
            fitting the same FQEs again. The behaviour clone's FQE is always fitted.

    Raises:
        VerdictError: naming what is wrong: a plant model not fitted or of other shapes,
            names that do not match the candidates, no held-out episodes.
    """
    settings = settings or VerdictSettings()
    n_policies = int(jax.tree.leaves(policy_params)[0].shape[0])
    names = [str(name) for name in names]
    if len(names) != n_policies:
        raise VerdictError(f"names: {len(names)} names for {n_policies} candidates")
    if not getattr(plant_model, "fitted", False):
        raise VerdictError("plant_model: not fitted; fit one (neorl-industrial model fit)")
    dynamics = plant_model.dynamics
    layout = dynamics.layout
    if (layout.observation_size, layout.action_size, layout.n_costs) != (
        heldout.observation_size,
        heldout.action_size,
        heldout.n_costs,
    ):
        raise VerdictError(
            f"plant_model: predicts {layout.observation_size} observations, "
            f"{layout.action_size} actions and {layout.n_costs} cost channels; the held-out "
            f"data has {heldout.observation_size}, {heldout.action_size} and {heldout.n_costs}"
        )
    if heldout.n_transitions == 0:
        raise VerdictError("heldout: no held-out transitions to evaluate on")
    params = plant_model.params(settings.model_seed)
    n_costs = heldout.n_costs
    cost_names = list(cost_names) or [f"cost_{i}" for i in range(n_costs)]
    limits = np.full(n_costs, np.inf) if cost_limits is None else np.asarray(cost_limits, float)
    lengths_all = np.asarray(jax.device_get(heldout.episode_lengths), np.int64)
    episode_length = int(episode_length or max(1, round(float(lengths_all.mean()))))

    # Starts, their lengths and their logged returns.
    start_rows, start_episodes = evaluation_starts(heldout, settings.max_starts)
    steps_to_end = np.asarray(jax.device_get(heldout.steps_to_end), np.int64)[start_rows]
    horizon = int(min(settings.horizon, steps_to_end.max()))
    lengths = np.minimum(steps_to_end, horizon)
    first = heldout.observations_at(heldout.observation_index[jnp.asarray(start_rows)])
    rewards = np.asarray(jax.device_get(heldout.rewards), np.float64)
    logged_discounted = np.array(
        [
            np.sum(rewards[row : row + length] * settings.discount ** np.arange(length))
            for row, length in zip(start_rows, lengths, strict=True)
        ]
    )

    # One program over policies x members x starts; the operators cloned and run closed
    # loop in the same members from the same states with the same model noise.
    close = settings.close_after if settings.fqe else 0
    options = dict(
        horizon=horizon,
        discount=settings.discount,
        close_after=min(close, horizon) if close else 0,
        deterministic=settings.deterministic,
        disagreement_every=settings.disagreement_every if settings.penalty > 0 else 0,
        reward_cap=float(rewards.max()) if settings.penalty > 0 else None,
    )
    rollouts = jax.jit(
        make_policy_rollouts(dynamics, act, constraints=constraints, scaler=scaler, **options)
    )
    clone = _behaviour_clone(heldout, settings)
    operators = _operators_policy(clone, heldout, settings.operator_noise)
    baseline_rollouts = jax.jit(
        make_policy_rollouts(
            dynamics,
            operators.act,
            constraints=constraints,
            scaler=scaler,
            stochastic_policy=settings.operator_noise,
            **options,
        )
    )
    key = jax.random.PRNGKey(settings.seed)
    lengths_j = jnp.asarray(lengths, jnp.int32)
    candidates: RolloutSums = jax.device_get(rollouts(policy_params, params, first, lengths_j, key))
    baseline: RolloutSums = jax.device_get(
        baseline_rollouts(operators.params, params, first, lengths_j, key)
    )
    candidates = jax.tree.map(lambda x: np.asarray(x, np.float64), candidates)
    baseline = jax.tree.map(lambda x: np.asarray(x[0], np.float64), baseline)

    reward_spread = _spread(rewards)
    cost_matrix = np.asarray(jax.device_get(heldout.costs), np.float64).reshape(-1, n_costs)
    cost_spread = np.array([_spread(cost_matrix[:, i]) for i in range(n_costs)])
    logged_costs = (
        np.stack(
            [
                cost_matrix[row : row + length].sum(axis=0)
                for row, length in zip(start_rows, lengths, strict=True)
            ]
        )
        if n_costs
        else np.zeros((len(start_rows), 0))
    )
    events = cost_events(heldout)
    known = set(layout.known.cost_indices)
    per_step_limit = limits / episode_length  # spread evenly over an episode
    threshold = np.array(
        [
            per_step_cost_threshold(float(limit), settings.discount, episode_length)
            if np.isfinite(limit)
            else np.inf
            for limit in limits
        ]
    )
    penalty = settings.penalty
    cost_low = np.asarray(jax.device_get(params.cost_low), np.float64)
    cost_high = (
        np.full(n_costs, -np.inf)
        if params.cost_high is None
        else np.asarray(jax.device_get(params.cost_high), np.float64)
    )
    cost_high = np.where(np.isfinite(cost_high), cost_high, -np.inf)  # unknown: held-out data
    # The size of one event: the channel's range in the data, or 1 (a flag) when it
    # never left its lowest value.
    magnitude = np.maximum(
        np.maximum(cost_high, cost_matrix.max(axis=0, initial=-np.inf)) - cost_low, 0.0
    )
    magnitude = np.where(magnitude > 1e-9, magnitude, 1.0)
    event_rate = np.array(
        [
            _rate_upper_bound(int(events[c]), heldout.n_transitions, settings.level)
            for c in range(n_costs)
        ]
    )

    def evidence(channel: int, computed: bool) -> str:
        if computed and channel in known:
            return "computed"
        return "sufficient" if events[channel] >= settings.min_cost_events else EXACT_BOUND

    under_predicted: dict[str, float] = {}  # per limited channel, from the calibration

    def costs_of(values: np.ndarray, scale: np.ndarray, boot_seed: int, computed: bool):
        """``values [..., A, N, C]`` cost per start; ``scale [N, C]`` the limit's share.
        A learned channel with fewer than ``min_cost_events`` events held out (by the
        ``model``, ``computed``) adds the exact upper bound of its event rate (see
        :func:`_rate_upper_bound`): what the model cannot have learned from so few
        events is bounded by how rarely the operators tripped it."""
        entries = []
        for c in range(n_costs):
            raw = values[..., c]
            raw_boot = bootstrap_means(raw, start_episodes, settings.bootstrap, boot_seed)
            how = evidence(c, computed)
            value = within = bound = None
            if how == EXACT_BOUND and computed:
                bound = float(event_rate[c] * magnitude[c] * episode_length)
            if np.isfinite(limits[c]):
                normalized = raw / scale[:, c]
                boot = bootstrap_means(normalized, start_episodes, settings.bootstrap, boot_seed)
                value = _interval(normalized, boot, settings.level)
                if bound is not None:
                    value = dataclasses.replace(value, upper=value.upper + bound / limits[c])
                if computed:
                    # As much as the model under-predicted the operators' own cost.
                    allowance = under_predicted.get(cost_names[c], 0.0)
                    value = dataclasses.replace(value, upper=value.upper + allowance)
                within = bool(value.upper <= 1.0)
            entries.append(
                CostEstimate(
                    channel=cost_names[c],
                    value=value,
                    raw=_interval(raw, raw_boot, settings.level),
                    evidence=how,
                    events=int(events[c]),
                    within_limit=within,
                    event_bound=bound,
                )
            )
        return tuple(entries)

    scale = np.maximum(per_step_limit[None, :] * lengths[:, None], 1e-12)
    # Pessimism on every estimate that can be wrong: the candidates' returns are lowered
    # by their uncertainty, the operators' model estimate raised by its own.
    baseline_optimistic = (
        baseline.discounted_return + penalty * reward_spread * baseline.discounted_uncertainty
    )
    baseline_pessimistic = (
        baseline.discounted_return - penalty * reward_spread * baseline.discounted_uncertainty
    )
    calibration = _calibration(
        baseline=baseline,
        logged_discounted=logged_discounted,
        logged_costs=logged_costs,
        scale=scale,
        limits=limits,
        cost_names=cost_names,
        start_episodes=start_episodes,
        heldout=heldout,
        settings=settings,
    )
    under_predicted.update(
        {cost["channel"]: max(0.0, -cost["error"]["lower"]) for cost in calibration.costs}
    )

    def model_result(sums, boot_seed: int) -> EstimatorResult:
        pessimistic = sums.discounted_return - penalty * reward_spread * sums.discounted_uncertainty
        episode = sums.total_return - penalty * reward_spread * sums.total_uncertainty
        costs = sums.total_costs + penalty * cost_spread * sums.total_uncertainty[..., None]
        boot = bootstrap_means(pessimistic, start_episodes, settings.bootstrap, boot_seed)
        # The truth lies between the pessimistic reading (the candidate lowered, the
        # operators raised, by their uncertainty) and the optimistic one (the reverse);
        # the model's own estimate is the plain difference.
        optimistic = sums.discounted_return + penalty * reward_spread * sums.discounted_uncertainty
        allowance = calibration.allowance(sums.discounted_return, baseline.discounted_return)
        improvement = _widened(
            _between(
                sums.discounted_return - baseline.discounted_return,
                pessimistic - baseline_optimistic,
                optimistic - baseline_pessimistic,
                start_episodes,
                settings,
                boot_seed,
            ),
            allowance,
        )
        difference = sums.discounted_return - baseline.discounted_return  # [M, N]
        paired = _interval(
            difference,
            bootstrap_means(difference, start_episodes, settings.bootstrap, boot_seed),
            settings.level,
        )
        steps_total = np.maximum(sums.steps.sum(axis=(-2, -1)), 1.0)
        return EstimatorResult(
            estimator="model",
            discounted_return=_interval(pessimistic, boot, settings.level),
            episode_return=_interval(
                episode,
                bootstrap_means(episode, start_episodes, settings.bootstrap, boot_seed),
                settings.level,
            ),
            improvement=improvement,
            penalty=float(np.mean(sums.discounted_return - pessimistic)),
            costs=costs_of(costs, scale, boot_seed, computed=True),
            outside_data_share=float(np.mean(sums.outside_data_steps.sum((-2, -1)) / steps_total)),
            override_share=float(np.mean(sums.overridden_steps.sum((-2, -1)) / steps_total)),
            outside_physics_share=float(
                np.mean(sums.outside_physics_steps.sum((-2, -1)) / steps_total)
            ),
            paired=paired,
            allowance=float(allowance),
            member_spread=float(np.std(difference.mean(axis=-1))),
        )

    results: list[list[EstimatorResult]] = [[] for _ in range(n_policies)]
    for p in range(n_policies):
        own = jax.tree.map(lambda x, p=p: x[p], candidates)
        results[p].append(model_result(own, settings.seed + p))
    steps_total = max(float(baseline.steps.sum()), 1.0)
    baseline_boot = bootstrap_means(
        baseline_optimistic, start_episodes, settings.bootstrap, settings.seed
    )
    behaviour_results = [
        EstimatorResult(
            estimator="model",
            discounted_return=_interval(baseline_optimistic, baseline_boot, settings.level),
            episode_return=_interval(
                baseline.total_return,
                bootstrap_means(
                    baseline.total_return, start_episodes, settings.bootstrap, settings.seed
                ),
                settings.level,
            ),
            improvement=None,
            penalty=-float(np.mean(baseline_optimistic - baseline.discounted_return)),
            costs=costs_of(baseline.total_costs, scale, settings.seed, computed=True),
            outside_data_share=float(baseline.outside_data_steps.sum() / steps_total),
            override_share=float(baseline.overridden_steps.sum() / steps_total),
            outside_physics_share=float(baseline.outside_physics_steps.sum() / steps_total),
        )
    ]
    discounted_threshold = threshold
    closing_error: list[Interval] = []

    if settings.fqe:
        fqe_results, fqe_behaviour = _fqe_estimators(
            act=act,
            fqe_act=fqe_act,
            fqe_values=fqe_values,
            policy_params=policy_params,
            heldout=heldout,
            settings=settings,
            first=first,
            candidates=candidates,
            baseline=baseline,
            clone=clone,
            calibration=calibration,
            logged_discounted=logged_discounted,
            closing_error=closing_error,
            start_episodes=start_episodes,
            reward_spread=reward_spread,
            cost_spread=cost_spread,
            costs_of=lambda values, seed: costs_of(
                values,
                np.broadcast_to(discounted_threshold, (len(start_rows), n_costs)),
                seed,
                computed=False,
            ),
        )
        for p in range(n_policies):
            results[p].extend(fqe_results[p])
        behaviour_results.extend(fqe_behaviour)

    estimators = tuple(result.estimator for result in behaviour_results)
    deciding = tuple(name for name in DECIDING if name in estimators)
    if closing_error:
        # model+fqe decides only where it reproduces today's operation itself (its FQE
        # tail measures what the log cannot check otherwise); else it is shown.
        passed = _within(closing_error[0], calibration.tolerance)
        calibration = dataclasses.replace(
            calibration, closing_error=closing_error[0], closing_passed=passed
        )
        if not passed:
            deciding = tuple(name for name in deciding if name != "model+fqe")
    table = []
    for p, name in enumerate(names):
        reasons = []
        if calibration.status != "passed":
            reasons.append(f"calibration: {calibration.reason}")
        for result in results[p]:
            if result.estimator not in deciding:
                continue
            if result.improvement.lower <= 0.0:
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
                        f"{heldout.n_transitions} held-out steps)"
                        if cost.event_bound is not None
                        else ""
                    )
                    reasons.append(
                        f"{result.estimator}: cost {cost.channel!r} may exceed its limit (upper "
                        f"bound {cost.value.upper:.3g} of the limit{bound})"
                    )
        model = results[p][0]
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
        table.append(
            {
                "name": name,
                "qualifies": not reasons,
                "reasons": reasons,
                "warnings": warnings,
                "estimates": [dataclasses.asdict(r) for r in results[p]],
            }
        )
    decision, chosen, statement = _decide(table, deciding, settings.level, calibration)
    card = getattr(plant_model, "card", {}) or {}
    physics = card.get("physics") or {}
    return Verdict(
        decision=decision,
        recommended=chosen,
        statement=statement,
        candidates=tuple(table),
        behaviour={
            "how": BASELINE_HOW,
            "logged_discounted_return": float(np.mean(logged_discounted)),
            "estimates": [dataclasses.asdict(r) for r in behaviour_results],
        },
        evidence={
            "heldout_episodes": int(heldout.n_episodes),
            "heldout_transitions": int(heldout.n_transitions),
            "starts": len(start_rows),
            "start_episodes": len(np.unique(start_episodes)),
            "members": int(params.n_members),
            "horizon": horizon,
            "episode_length": episode_length,
            "cost_events": {cost_names[i]: int(events[i]) for i in range(n_costs)},
            "cost_limits": {
                cost_names[i]: (float(limits[i]) if np.isfinite(limits[i]) else None)
                for i in range(n_costs)
            },
            "plant_model": {
                "dataset": (card.get("dataset") or {}).get("name"),
                "fingerprint": (card.get("dataset") or {}).get("fingerprint"),
            },
            "physics": {
                "ranges": physics.get("features"),
                "note": physics.get("note"),
            },
        },
        estimators=estimators,
        deciding=deciding,
        settings=settings.to_dict(),
        calibration=calibration,
    )


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

    if calibration is not None and calibration.status != "passed":
        return KEEP, None, f"Keep the current operation: {calibration.reason}.{check}"
    qualified = [row for row in table if row["qualifies"]]
    if not qualified:
        return (
            KEEP,
            None,
            "Keep the current operation: no candidate is estimated better than today's "
            f"operation with {level:.0%} confidence and within the cost limits by every "
            f"deciding estimator ({', '.join(deciding)}).{check}",
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
        f"and the held-out episodes.{check}",
    )


def _calibration_of(data: dict[str, Any]) -> Calibration:
    """A :class:`Calibration` from its ``to_dict`` form."""
    intervals = {k: Interval(**data[k]) for k in ("estimated", "logged", "error")}
    if data.get("closing_error"):
        intervals["closing_error"] = Interval(**data["closing_error"])
    return Calibration(**(data | intervals | {"costs": tuple(data["costs"])}))


def _rate_upper_bound(events: int, steps: int, level: float) -> float:
    """The exact (Clopper-Pearson) upper bound of a per-step event rate from ``events``
    in ``steps`` at the upper end of a two-sided ``level`` interval: ``3.7 / steps`` for
    none at 95 %. 1 without steps."""
    if steps <= 0 or events >= steps:
        return 1.0
    return float(scipy.stats.beta.ppf(1.0 - (1.0 - level) / 2.0, events + 1, steps - events))


def _within(gap: Interval, allowed: float) -> bool:
    """An error interval that holds 0 or lies within ``±allowed``."""
    return gap.lower <= 0.0 <= gap.upper or (gap.lower >= -allowed and gap.upper <= allowed)


def _between(
    plain: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    start_episodes: np.ndarray,
    settings: VerdictSettings,
    seed: int,
) -> Interval:
    """An improvement's interval: ``plain``'s mean, from the lower bound of the
    pessimistic reading ``low`` to the upper bound of the optimistic one ``high`` (each a
    bootstrap over episodes and members, the same draws)."""
    draws = bootstrap_means(np.stack([low, high]), start_episodes, settings.bootstrap, seed)
    lower = _interval(low, draws[0], settings.level).lower
    upper = _interval(high, draws[1], settings.level).upper
    return Interval(float(np.mean(plain)), lower, upper)


def _widened(interval: Interval, by: float) -> Interval:
    return Interval(interval.value, interval.lower - by, interval.upper + by)


def _calibration(
    *,
    baseline: RolloutSums,
    logged_discounted: np.ndarray,
    logged_costs: np.ndarray,
    scale: np.ndarray,
    limits: np.ndarray,
    cost_names: Sequence[str],
    start_episodes: np.ndarray,
    heldout: Dataset,
    settings: VerdictSettings,
) -> Calibration:
    """The operators' clone in the model (``baseline``, ``[M, N]``) against their logged
    returns and costs from the same starts (see :class:`Calibration`)."""
    level, draws, seed = settings.level, settings.bootstrap, settings.seed
    within = _within

    def interval(values: np.ndarray) -> Interval:
        return _interval(values, bootstrap_means(values, start_episodes, draws, seed), level)

    estimated = interval(baseline.discounted_return)
    logged = interval(np.asarray(logged_discounted, np.float64)[None])
    error = interval(baseline.discounted_return - logged_discounted[None])
    size = float(np.mean(np.abs(logged_discounted)))
    tolerance = settings.calibration_tolerance * size

    costs = []
    for c in range(logged_costs.shape[1]):
        if not np.isfinite(limits[c]):
            continue
        model = baseline.total_costs[..., c] / scale[:, c]
        data = logged_costs[:, c] / scale[:, c]
        gap = interval(model - data[None])
        # A model that over-predicts a cost is conservative; one that under-predicts it
        # would let a candidate through that breaks the limit.
        costs.append(
            {
                "channel": cost_names[c],
                "estimated": float(np.mean(model)),
                "logged": float(np.mean(data)),
                "error": dataclasses.asdict(gap),
                "passed": bool(gap.upper >= -settings.calibration_tolerance),
            }
        )
    episodes = len(np.unique(start_episodes))
    common = dict(
        estimated=estimated,
        logged=logged,
        error=error,
        tolerance=tolerance,
        model_error=Calibration.error_size(error),
        size=size,
        costs=tuple(costs),
        episodes=episodes,
        transitions=int(heldout.n_transitions),
        min_episodes=settings.min_episodes,
    )
    if episodes < settings.min_episodes:
        return Calibration(
            status="too small",
            reason=(
                f"the held-out part is too small for the calibration check: "
                f"{heldout.n_transitions} transitions in {episodes} episode(s), at least "
                f"{settings.min_episodes} episodes needed (hold out more episodes, or log more)"
            ),
            **common,
        )
    failed = [c["channel"] for c in costs if not c["passed"]]
    if not within(error, tolerance) or failed:
        what = (
            f"estimated {estimated.value:.4g}, logged {logged.value:.4g}"
            if not within(error, tolerance)
            else "; ".join(
                f"{c['channel']} estimated {c['estimated']:.3g}, logged {c['logged']:.3g} "
                "of its limit"
                for c in costs
                if not c["passed"]
            )
        )
        return Calibration(
            status="failed",
            reason=f"the plant model does not reproduce today's operation ({what})",
            **common,
        )
    return Calibration(status="passed", **common)


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
    table = [row for verdict in verdicts for row in verdict.candidates]
    decision, chosen, statement = _decide(
        table, first.deciding, first.settings["level"], first.calibration
    )
    return dataclasses.replace(
        first, candidates=tuple(table), decision=decision, recommended=chosen, statement=statement
    )


def _spread(values: np.ndarray) -> float:
    spread = float(np.std(values)) if np.size(values) else 0.0
    return spread if spread > 1e-9 else 0.0


def _fqe_estimators(
    *,
    act,
    fqe_act,
    fqe_values,
    policy_params,
    heldout: Dataset,
    settings: VerdictSettings,
    first: jax.Array,
    candidates: RolloutSums,
    baseline: RolloutSums,
    clone: _Clone,
    calibration: Calibration,
    logged_discounted: np.ndarray,
    closing_error: list[Interval],
    start_episodes: np.ndarray,
    reward_spread: float,
    cost_spread: np.ndarray,
    costs_of: Callable[[np.ndarray, int], tuple[CostEstimate, ...]],
) -> tuple[list[list[EstimatorResult]], list[EstimatorResult]]:
    """``fqe`` and ``model+fqe`` of every candidate, and of today's operation (the
    operators' clone: its FQE, and its model rollouts closed by it)."""
    if fqe_act is None:

        def fqe_act(params: Any, observations: jax.Array) -> jax.Array:
            return jax.vmap(lambda o: act(params, o, None, deterministic=True))(observations)

    config = FQEConfig(hidden=settings.fqe_hidden, discount=settings.discount)
    common = dict(
        n_updates=settings.fqe_updates,
        seeds=settings.fqe_seeds,
        config=config,
        batch_size=FQE_BATCH_SIZE,
    )
    values = fqe_values or fitted_q_evaluation_values(heldout, fqe_act, policy_params, **common)
    clone_params = jax.tree.map(lambda leaf: leaf[None], clone.params)

    def clone_act(params: Any, observations: jax.Array) -> jax.Array:
        return jax.vmap(lambda o: clone.act(params, o, None, deterministic=True))(observations)

    clone_values = fitted_q_evaluation_values(heldout, clone_act, clone_params, **common)
    n_policies = candidates.discounted_return.shape[0]
    starts = jnp.broadcast_to(first, (n_policies, *first.shape))
    # At the starts, and closing at the states the model reached after k steps.
    at_starts, closing = _values_at(  # [P, S, N, 1 + C], [P, S, M, N, 1 + C]
        values, starts, jnp.asarray(candidates.closing_observation, jnp.float32)
    )
    clone_at_starts, clone_closing = _values_at(
        clone_values, first[None], jnp.asarray(baseline.closing_observation, jnp.float32)[None]
    )
    clone_at_starts, clone_closing = clone_at_starts[0], clone_closing[0]
    penalty = settings.penalty

    def head(
        sums: RolloutSums, tail: np.ndarray, penalty: float = settings.penalty
    ) -> tuple[np.ndarray, np.ndarray]:
        """``model+fqe`` return ``[..., M, N]`` and discounted costs ``[..., M, N, C]``."""
        tail = tail.mean(axis=-4)  # over FQE seeds
        weight = sums.closing_weight
        value = sums.head_return - penalty * reward_spread * sums.head_uncertainty
        value = value + weight * tail[..., 0]
        costs = sums.head_costs + penalty * cost_spread * sums.head_uncertainty[..., None]
        costs = costs + weight[..., None] * tail[..., 1:]
        return value, costs

    # The operators' estimate is raised by its uncertainty (pessimism on the baseline).
    logged_combined, logged_combined_costs = head(
        jax.tree.map(lambda x: x[None], baseline), clone_closing[None], penalty=-penalty
    )
    logged_combined, logged_combined_costs = logged_combined[0], logged_combined_costs[0]
    logged_plain = head(jax.tree.map(lambda x: x[None], baseline), clone_closing[None], 0.0)[0][0]
    logged_low = head(
        jax.tree.map(lambda x: x[None], baseline), clone_closing[None], penalty=penalty
    )[0][0]
    results: list[list[EstimatorResult]] = []
    seed = settings.seed

    def interval(values: np.ndarray, draw_seed: int) -> Interval:
        draws = bootstrap_means(values, start_episodes, settings.bootstrap, draw_seed)
        return _interval(values, draws, settings.level)

    # model+fqe's own error on today's operation (its unpenalised estimate of the clone
    # against the logged returns), as the model's calibration: its improvement interval
    # is widened by the larger of the two.
    unpenalised, _ = head(jax.tree.map(lambda x: x[None], baseline), clone_closing[None], 0.0)
    error = interval(unpenalised[0] - logged_discounted[None], seed)
    own_error = Calibration.error_size(error)
    share = max(calibration.model_error_share, own_error / calibration.size)
    closing_error.append(error)

    for p in range(n_policies):
        fqe_returns = at_starts[p, ..., 0]  # [S, N]
        difference = fqe_returns - clone_at_starts[..., 0]
        fqe = EstimatorResult(
            estimator="fqe",
            discounted_return=interval(fqe_returns, seed + p),
            episode_return=None,
            improvement=interval(difference, seed + p),
            penalty=0.0,
            costs=costs_of(at_starts[p, ..., 1:], seed + p),
        )
        own = jax.tree.map(lambda x, p=p: x[p], candidates)
        combined, combined_costs = head(own, closing[p])
        plain, _ = head(own, closing[p], 0.0)
        optimistic, _ = head(own, closing[p], -penalty)
        between = _between(
            plain - logged_plain,
            combined - logged_combined,
            optimistic - logged_low,
            start_episodes,
            settings,
            seed + p,
        )
        mixed = EstimatorResult(
            estimator="model+fqe",
            discounted_return=interval(combined, seed + p),
            episode_return=None,
            improvement=_widened(
                between,
                max(
                    calibration.model_error,
                    own_error,
                    share * (float(np.mean(np.abs(plain))) + float(np.mean(np.abs(logged_plain)))),
                ),
            ),
            penalty=float(np.mean(penalty * reward_spread * own.head_uncertainty)),
            costs=costs_of(combined_costs, seed + p),
        )
        results.append([fqe, mixed])
    behaviour = [
        EstimatorResult(
            estimator="fqe",
            discounted_return=interval(clone_at_starts[..., 0], seed),
            episode_return=None,
            improvement=None,
            penalty=0.0,
            costs=costs_of(clone_at_starts[..., 1:], seed),
        ),
        EstimatorResult(
            estimator="model+fqe",
            discounted_return=interval(logged_combined, seed),
            episode_return=None,
            improvement=None,
            penalty=0.0,
            costs=costs_of(logged_combined_costs, seed),
        ),
    ]
    return results, behaviour


def _values_at(values: Callable[[Any], np.ndarray], *observations: jax.Array) -> list[np.ndarray]:
    """``values`` (of ``fitted_q_evaluation_values``) at several sets of observations
    ``[P, ..., obs]`` in one call: one compiled program (the policy and its shield inside
    traced once) instead of one per shape. Each result is ``[P, n_seeds, ..., 1 + C]``."""
    flat = [jnp.reshape(o, (o.shape[0], -1, o.shape[-1])) for o in observations]
    joined = values(jnp.concatenate(flat, axis=1))  # [P, n_seeds, K, 1 + C]
    bounds = np.cumsum([f.shape[1] for f in flat])[:-1]
    return [
        part.reshape(*part.shape[:2], *o.shape[1:-1], part.shape[-1])
        for part, o in zip(np.split(joined, bounds, axis=2), observations, strict=True)
    ]


@dataclasses.dataclass(frozen=True)
class _Clone:
    act: Callable[..., jax.Array]
    params: Any


def _operators_policy(clone: _Clone, heldout: Dataset, noise: bool) -> _Clone:
    """Today's operation as a policy for the model: the clone's action plus, with
    ``noise``, Gaussian noise of the spread of the logged actions around it (per action,
    in [-1, 1]; operators do not repeat the same move from the same state), clipped to
    [-1, 1]. Its parameters carry a leading policy axis of 1."""
    observations = heldout.transition_observations()
    mean = jax.vmap(lambda o: clone.act(clone.params, o, None, deterministic=True))(observations)
    residual = np.asarray(jax.device_get(heldout.actions - mean), np.float64)
    spread = residual.reshape(heldout.n_transitions, -1).std(axis=0) if noise else 0.0
    params = {
        "clone": clone.params,
        "noise": jnp.asarray(np.broadcast_to(spread, (heldout.action_size,)), jnp.float32),
    }

    def act(params: Any, observation: jax.Array, key: Any = None, deterministic: bool = True):
        action = clone.act(params["clone"], observation, None, deterministic=True)
        if deterministic or key is None:
            return action
        drawn = params["noise"] * jax.random.normal(key, action.shape, action.dtype)
        return jnp.clip(action + drawn, -1.0, 1.0)

    return _Clone(act=act, params=jax.tree.map(lambda leaf: leaf[None], params))


def _behaviour_clone(heldout: Dataset, settings: VerdictSettings) -> _Clone:
    """A behaviour-cloned policy of the held-out episodes (actions in [-1, 1])."""
    obs_mean, obs_std = heldout.observation_moments()
    config = BCConfig(
        hidden=settings.fqe_hidden,
        obs_mean=tuple(float(x) for x in obs_mean),
        obs_std=tuple(float(x) for x in obs_std),
    )
    bc = make_bc(config, heldout.observation_size, heldout.action_size)
    state, _ = train_offline(
        bc,
        heldout,
        seeds=(settings.seed,),
        n_updates=settings.bc_updates,
        chunk_updates=min(1000, settings.bc_updates),
        batch_size=256,
    )
    return _Clone(act=bc.act, params=jax.tree.map(lambda leaf: leaf[0], state.agent.policy))
