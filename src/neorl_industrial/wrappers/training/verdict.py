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
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from neorl_industrial.core.agents.cost import per_step_cost_threshold
from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.functional.transformations.model_evaluation import (
    RolloutSums,
    make_policy_rollouts,
)
from neorl_industrial.wrappers.training.verdict_evidence import (
    _between,
    _calibration,
    _interval,
    _rate_upper_bound,
    _spread,
    _widened,
    _within,
    bootstrap_means,
    cost_events,
    episode_digests,
    evaluation_starts,
)
from neorl_industrial.wrappers.training.verdict_fqe import (
    _behaviour_clone,
    _fqe_estimators,
    _operators_policy,
)
from neorl_industrial.wrappers.training.verdict_results import (
    BASELINE_HOW,
    COST_DECIDING,
    DECIDING,
    EXACT_BOUND,
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

__all__ = [
    "FQE_BATCH_SIZE",
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
    _check_inputs(names, n_policies, plant_model, heldout)
    params = plant_model.params(settings.model_seed)
    n_costs = heldout.n_costs
    cost_names = list(cost_names) or [f"cost_{i}" for i in range(n_costs)]
    limits = np.full(n_costs, np.inf) if cost_limits is None else np.asarray(cost_limits, float)
    lengths_all = np.asarray(jax.device_get(heldout.episode_lengths), np.int64)
    episode_length = int(episode_length or max(1, round(float(lengths_all.mean()))))
    starts = _starts_of(heldout, settings)

    # One program over policies x members x starts; the operators cloned and run closed
    # loop in the same members from the same states with the same model noise.
    candidates, baseline, clone = _rollouts(
        plant_model.dynamics, act, policy_params, params, starts, heldout, constraints, scaler,
        settings,
    )  # fmt: skip
    # The limit's share over each start's steps (spread evenly over an episode).
    scale = np.maximum((limits / episode_length)[None, :] * starts.lengths[:, None], 1e-12)
    calibration = _calibration(
        baseline=baseline,
        logged_discounted=starts.logged_discounted,
        logged_costs=starts.logged_costs,
        scale=scale,
        limits=limits,
        cost_names=cost_names,
        start_episodes=starts.episodes,
        heldout=heldout,
        settings=settings,
    )
    costs = _cost_reader(
        heldout, params, plant_model.dynamics.layout, cost_names, limits, episode_length,
        starts, calibration, settings,
    )  # fmt: skip
    reading = _ModelReading.of(heldout, baseline, starts, costs, scale, calibration, settings)
    results = [
        [reading.candidate(jax.tree.map(lambda x, p=p: x[p], candidates), settings.seed + p)]
        for p in range(n_policies)
    ]
    behaviour_results = [reading.operators()]
    closing_error: list[Interval] = []

    if settings.fqe:
        threshold = np.array(
            [
                per_step_cost_threshold(float(limit), settings.discount, episode_length)
                if np.isfinite(limit)
                else np.inf
                for limit in limits
            ]
        )
        fqe_results, fqe_behaviour = _fqe_estimators(
            act=act,
            fqe_act=fqe_act,
            fqe_values=fqe_values,
            policy_params=policy_params,
            heldout=heldout,
            settings=settings,
            first=starts.first,
            candidates=candidates,
            baseline=baseline,
            clone=clone,
            calibration=calibration,
            logged_discounted=starts.logged_discounted,
            closing_error=closing_error,
            start_episodes=starts.episodes,
            reward_spread=reading.reward_spread,
            cost_spread=reading.cost_spread,
            costs_of=lambda values, seed: costs(
                values,
                np.broadcast_to(threshold, (len(starts.rows), n_costs)),
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
    table = [
        _candidate_row(name, results[p], deciding, calibration, settings, heldout.n_transitions)
        for p, name in enumerate(names)
    ]
    decision, chosen, statement = _decide(table, deciding, settings.level, calibration)
    return Verdict(
        decision=decision,
        recommended=chosen,
        statement=statement,
        candidates=tuple(table),
        behaviour={
            "how": BASELINE_HOW,
            "logged_discounted_return": float(np.mean(starts.logged_discounted)),
            "estimates": [dataclasses.asdict(r) for r in behaviour_results],
        },
        evidence=_evidence_of(
            heldout, starts, params, episode_length, costs, getattr(plant_model, "card", {})
        ),
        estimators=estimators,
        deciding=deciding,
        settings=settings.to_dict(),
        calibration=calibration,
    )


def _check_inputs(names: list[str], n_policies: int, plant_model: Any, heldout: Dataset) -> None:
    """Refuses, naming what is wrong, candidates and a plant model the verdict cannot
    judge with these held-out episodes."""
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
            f"{layout.action_size} actions and {layout.n_costs} cost channels; the held-out "
            f"data has {heldout.observation_size}, {heldout.action_size} and {heldout.n_costs}"
        )
    if heldout.n_transitions == 0:
        raise VerdictError("heldout: no held-out transitions to evaluate on")


@dataclasses.dataclass(frozen=True)
class _Starts:
    """The held-out starts a verdict is estimated from, and what the log says of them.

    Attributes:
        rows: each start's row in the held-out data.
        episodes: each start's episode (the bootstrap resamples whole episodes).
        lengths: steps estimated from each start (to its episode's end, at most the
            horizon).
        horizon: the longest of them.
        first: the starts' observations.
        rewards: every held-out step's reward.
        logged_discounted: each start's logged discounted return over its length.
        logged_costs: ``[starts, channels]`` each start's logged cost over its length.
    """

    rows: np.ndarray
    episodes: np.ndarray
    lengths: np.ndarray
    horizon: int
    first: jax.Array
    rewards: np.ndarray
    logged_discounted: np.ndarray
    logged_costs: np.ndarray


def _starts_of(heldout: Dataset, settings: VerdictSettings) -> _Starts:
    rows, episodes = evaluation_starts(heldout, settings.max_starts)
    steps_to_end = np.asarray(jax.device_get(heldout.steps_to_end), np.int64)[rows]
    horizon = int(min(settings.horizon, steps_to_end.max()))
    lengths = np.minimum(steps_to_end, horizon)
    rewards = np.asarray(jax.device_get(heldout.rewards), np.float64)
    n_costs = heldout.n_costs
    cost_matrix = np.asarray(jax.device_get(heldout.costs), np.float64).reshape(-1, n_costs)
    spans = list(zip(rows, lengths, strict=True))
    return _Starts(
        rows=rows,
        episodes=episodes,
        lengths=lengths,
        horizon=horizon,
        first=heldout.observations_at(heldout.observation_index[jnp.asarray(rows)]),
        rewards=rewards,
        logged_discounted=np.array(
            [
                np.sum(rewards[row : row + length] * settings.discount ** np.arange(length))
                for row, length in spans
            ]
        ),
        logged_costs=(
            np.stack([cost_matrix[row : row + length].sum(axis=0) for row, length in spans])
            if n_costs
            else np.zeros((len(rows), 0))
        ),
    )


def _rollouts(
    dynamics: Any,
    act: Callable[..., jax.Array],
    policy_params: Any,
    params: Any,
    starts: _Starts,
    heldout: Dataset,
    constraints: Any,
    scaler: Any,
    settings: VerdictSettings,
) -> tuple[RolloutSums, RolloutSums, Any]:
    """Every candidate, and the operators' clone, rolled out in every member from every
    start (float64 sums; the clone's without the policy axis), and the clone."""
    close = settings.close_after if settings.fqe else 0
    options = dict(
        horizon=starts.horizon,
        discount=settings.discount,
        close_after=min(close, starts.horizon) if close else 0,
        deterministic=settings.deterministic,
        disagreement_every=settings.disagreement_every if settings.penalty > 0 else 0,
        reward_cap=float(starts.rewards.max()) if settings.penalty > 0 else None,
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
    lengths = jnp.asarray(starts.lengths, jnp.int32)
    candidates = jax.device_get(rollouts(policy_params, params, starts.first, lengths, key))
    baseline = jax.device_get(
        baseline_rollouts(operators.params, params, starts.first, lengths, key)
    )
    return (
        jax.tree.map(lambda x: np.asarray(x, np.float64), candidates),
        jax.tree.map(lambda x: np.asarray(x[0], np.float64), baseline),
        clone,
    )


@dataclasses.dataclass(frozen=True)
class _CostReader:
    """Reads estimated costs per start into one :class:`CostEstimate` per channel.

    A learned channel with fewer than ``min_cost_events`` events held out (by the
    ``model``, ``computed``) adds the exact upper bound of its event rate (see
    :func:`_rate_upper_bound`): what the model cannot have learned from so few events is
    bounded by how rarely the operators tripped it. A computed estimate also adds as much
    as the model under-predicted the operators' own cost (the calibration)."""

    names: tuple[str, ...]
    limits: np.ndarray
    events: np.ndarray
    known: frozenset[int]
    #: The size of one event: the channel's range in the data, or 1 (a flag) when it
    #: never left its lowest value.
    magnitude: np.ndarray
    event_rate: np.ndarray
    episode_length: int
    under_predicted: dict[str, float]
    start_episodes: np.ndarray
    settings: VerdictSettings

    def evidence(self, channel: int, computed: bool) -> str:
        if computed and channel in self.known:
            return "computed"
        enough = self.events[channel] >= self.settings.min_cost_events
        return "sufficient" if enough else EXACT_BOUND

    def __call__(
        self, values: np.ndarray, scale: np.ndarray, boot_seed: int, computed: bool
    ) -> tuple[CostEstimate, ...]:
        """``values [..., A, N, C]`` cost per start; ``scale [N, C]`` the limit's share."""
        settings = self.settings
        entries = []
        for c, channel in enumerate(self.names):
            raw = values[..., c]
            raw_boot = bootstrap_means(raw, self.start_episodes, settings.bootstrap, boot_seed)
            how = self.evidence(c, computed)
            value = within = bound = None
            if how == EXACT_BOUND and computed:
                bound = float(self.event_rate[c] * self.magnitude[c] * self.episode_length)
            if np.isfinite(self.limits[c]):
                normalized = raw / scale[:, c]
                boot = bootstrap_means(
                    normalized, self.start_episodes, settings.bootstrap, boot_seed
                )
                value = _interval(normalized, boot, settings.level)
                if bound is not None:
                    value = dataclasses.replace(value, upper=value.upper + bound / self.limits[c])
                if computed:
                    allowance = self.under_predicted.get(channel, 0.0)
                    value = dataclasses.replace(value, upper=value.upper + allowance)
                within = bool(value.upper <= 1.0)
            entries.append(
                CostEstimate(
                    channel=channel,
                    value=value,
                    raw=_interval(raw, raw_boot, settings.level),
                    evidence=how,
                    events=int(self.events[c]),
                    within_limit=within,
                    event_bound=bound,
                )
            )
        return tuple(entries)


def _cost_reader(
    heldout: Dataset,
    params: Any,
    layout: Any,
    cost_names: list[str],
    limits: np.ndarray,
    episode_length: int,
    starts: _Starts,
    calibration: Calibration,
    settings: VerdictSettings,
) -> _CostReader:
    n_costs = len(cost_names)
    events = cost_events(heldout)
    cost_matrix = np.asarray(jax.device_get(heldout.costs), np.float64).reshape(-1, n_costs)
    cost_low = np.asarray(jax.device_get(params.cost_low), np.float64)
    cost_high = (
        np.full(n_costs, -np.inf)
        if params.cost_high is None
        else np.asarray(jax.device_get(params.cost_high), np.float64)
    )
    cost_high = np.where(np.isfinite(cost_high), cost_high, -np.inf)  # unknown: held-out data
    magnitude = np.maximum(
        np.maximum(cost_high, cost_matrix.max(axis=0, initial=-np.inf)) - cost_low, 0.0
    )
    return _CostReader(
        names=tuple(cost_names),
        limits=limits,
        events=events,
        known=frozenset(layout.known.cost_indices),
        magnitude=np.where(magnitude > 1e-9, magnitude, 1.0),
        event_rate=np.array(
            [
                _rate_upper_bound(int(events[c]), heldout.n_transitions, settings.level)
                for c in range(n_costs)
            ]
        ),
        episode_length=episode_length,
        # Per limited channel, from the calibration.
        under_predicted={
            cost["channel"]: max(0.0, -cost["error"]["lower"]) for cost in calibration.costs
        },
        start_episodes=starts.episodes,
        settings=settings,
    )


@dataclasses.dataclass(frozen=True)
class _ModelReading:
    """The ``model`` estimator's results from the rollouts' sums.

    Pessimism on every estimate that can be wrong: the candidates' returns are lowered by
    ``penalty`` x the rewards' spread x their uncertainty, the operators' model estimate
    raised by its own. The truth lies between the pessimistic reading (the candidate
    lowered, the operators raised) and the optimistic one (the reverse); the model's own
    estimate is the plain difference."""

    baseline: RolloutSums
    starts: _Starts
    costs: _CostReader
    scale: np.ndarray
    calibration: Calibration
    settings: VerdictSettings
    #: The per-step spread of the held-out rewards and of each cost channel.
    reward_spread: float
    cost_spread: np.ndarray

    @classmethod
    def of(
        cls,
        heldout: Dataset,
        baseline: RolloutSums,
        starts: _Starts,
        costs: _CostReader,
        scale: np.ndarray,
        calibration: Calibration,
        settings: VerdictSettings,
    ) -> _ModelReading:
        n_costs = heldout.n_costs
        cost_matrix = np.asarray(jax.device_get(heldout.costs), np.float64).reshape(-1, n_costs)
        return cls(
            baseline=baseline,
            starts=starts,
            costs=costs,
            scale=scale,
            calibration=calibration,
            settings=settings,
            reward_spread=_spread(starts.rewards),
            cost_spread=np.array([_spread(cost_matrix[:, i]) for i in range(n_costs)]),
        )

    def _bootstrap(self, values: np.ndarray, seed: int) -> np.ndarray:
        settings = self.settings
        return bootstrap_means(values, self.starts.episodes, settings.bootstrap, seed)

    def _shifted(self, sums: RolloutSums, sign: float) -> np.ndarray:
        """The discounted return moved by its uncertainty (``sign`` -1: pessimistic)."""
        uncertainty = self.settings.penalty * self.reward_spread * sums.discounted_uncertainty
        return sums.discounted_return + sign * uncertainty

    def candidate(self, sums: RolloutSums, boot_seed: int) -> EstimatorResult:
        settings, baseline, level = self.settings, self.baseline, self.settings.level
        penalty = settings.penalty
        pessimistic = self._shifted(sums, -1.0)
        episode = sums.total_return - penalty * self.reward_spread * sums.total_uncertainty
        costs = sums.total_costs + penalty * self.cost_spread * sums.total_uncertainty[..., None]
        allowance = self.calibration.allowance(sums.discounted_return, baseline.discounted_return)
        improvement = _widened(
            _between(
                sums.discounted_return - baseline.discounted_return,
                pessimistic - self._shifted(baseline, 1.0),
                self._shifted(sums, 1.0) - self._shifted(baseline, -1.0),
                self.starts.episodes,
                settings,
                boot_seed,
            ),
            allowance,
        )
        difference = sums.discounted_return - baseline.discounted_return  # [M, N]
        steps_total = np.maximum(sums.steps.sum(axis=(-2, -1)), 1.0)
        return EstimatorResult(
            estimator="model",
            discounted_return=_interval(
                pessimistic, self._bootstrap(pessimistic, boot_seed), level
            ),
            episode_return=_interval(episode, self._bootstrap(episode, boot_seed), level),
            improvement=improvement,
            penalty=float(np.mean(sums.discounted_return - pessimistic)),
            costs=self.costs(costs, self.scale, boot_seed, computed=True),
            outside_data_share=float(np.mean(sums.outside_data_steps.sum((-2, -1)) / steps_total)),
            override_share=float(np.mean(sums.overridden_steps.sum((-2, -1)) / steps_total)),
            outside_physics_share=float(
                np.mean(sums.outside_physics_steps.sum((-2, -1)) / steps_total)
            ),
            paired=_interval(difference, self._bootstrap(difference, boot_seed), level),
            allowance=float(allowance),
            member_spread=float(np.std(difference.mean(axis=-1))),
        )

    def operators(self) -> EstimatorResult:
        """Today's operation by the model: the clone's return raised by its uncertainty."""
        baseline, seed, level = self.baseline, self.settings.seed, self.settings.level
        optimistic = self._shifted(baseline, 1.0)
        steps_total = max(float(baseline.steps.sum()), 1.0)
        return EstimatorResult(
            estimator="model",
            discounted_return=_interval(optimistic, self._bootstrap(optimistic, seed), level),
            episode_return=_interval(
                baseline.total_return, self._bootstrap(baseline.total_return, seed), level
            ),
            improvement=None,
            penalty=-float(np.mean(optimistic - baseline.discounted_return)),
            costs=self.costs(baseline.total_costs, self.scale, seed, computed=True),
            outside_data_share=float(baseline.outside_data_steps.sum() / steps_total),
            override_share=float(baseline.overridden_steps.sum() / steps_total),
            outside_physics_share=float(baseline.outside_physics_steps.sum() / steps_total),
        )


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
    for result in results:
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
