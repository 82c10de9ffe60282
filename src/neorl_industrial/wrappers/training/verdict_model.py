"""The ``model`` estimator of a verdict: the held-out starts, every candidate and the
operators' clone rolled out in the plant model's members, the cost readings with their
exact event bounds, and the pessimistic reading of the sums into estimates with
intervals."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from neorl_industrial.core.agents.cost import per_step_cost_threshold
from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.functional.transformations.model_evaluation import (
    ModelRolloutOptions,
    RolloutSums,
    make_policy_rollouts,
)
from neorl_industrial.wrappers.training.verdict_evidence import (
    _between,
    _interval,
    _rate_upper_bound,
    _spread,
    _widened,
    bootstrap_means,
    cost_events,
    evaluation_starts,
)
from neorl_industrial.wrappers.training.verdict_fqe import (
    VerdictCandidates,
    _behaviour_clone,
    _operators_policy,
    clone_residuals,
)
from neorl_industrial.wrappers.training.verdict_results import (
    EXACT_BOUND,
    Calibration,
    CostEstimate,
    EstimatorResult,
    VerdictSettings,
)


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
        step_rows: ``[starts, width]`` the held-out transition of each start's every
            step (its last one repeated past its length; ``width``: the horizon, or the
            test's for the training split's starts).
        given: ``[starts, width, frame_size]`` each start's logged next frames step by
            step, whose features the plant model marks ``given`` (exogenous) a rollout
            takes from the log; None when it marks none.
    """

    rows: np.ndarray
    episodes: np.ndarray
    lengths: np.ndarray
    horizon: int
    first: jax.Array
    rewards: np.ndarray
    logged_discounted: np.ndarray
    logged_costs: np.ndarray
    step_rows: np.ndarray
    given: np.ndarray | None = None


def _starts_of(
    heldout: Dataset,
    settings: VerdictSettings,
    given: Sequence[int] = (),
    width: int | None = None,
) -> _Starts:
    """The held-out starts (``given``: the plant model's given features, whose logged
    frames are kept when there are any; ``width``: steps of the per-step arrays, the
    horizon by default)."""
    rows, episodes = evaluation_starts(heldout, settings.max_starts)
    steps_to_end = np.asarray(jax.device_get(heldout.steps_to_end), np.int64)[rows]
    horizon = int(min(settings.horizon, steps_to_end.max()))
    lengths = np.minimum(steps_to_end, horizon)
    steps = np.arange(max(width or horizon, horizon))[None, :]
    step_rows = rows[:, None] + np.minimum(steps, np.maximum(lengths, 1)[:, None] - 1)
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
        step_rows=step_rows,
        given=_logged_frames(heldout, step_rows) if len(given) else None,
    )


def _logged_frames(heldout: Dataset, step_rows: np.ndarray) -> np.ndarray:
    """``[..., frame_size]`` the next observation's newest frame of each transition."""
    index = np.asarray(jax.device_get(heldout.observation_index), np.int64)
    frames = np.asarray(jax.device_get(heldout.observations), np.float32)
    return frames[index[step_rows] + 1]


class PlantRules(NamedTuple):
    """What the task sets for a verdict's candidates: the action scaler between the
    policies' [-1, 1] and plant units, the shield's constraints (plant units; None: no
    shield), the episode cost limit per channel (None or inf: not limited), the channels'
    names, and the steps of an episode the limits are for (None: the held-out episodes'
    mean length)."""

    scaler: Any = None
    constraints: Any = None
    cost_limits: Sequence[float] | None = None
    cost_names: Sequence[str] = ()
    episode_length: int | None = None


@dataclasses.dataclass(frozen=True)
class _Case:
    """What a verdict judges the candidates with: the held-out log and its starts, the
    plant model's members, the cost channels and their episode limits, the task's rules."""

    heldout: Dataset
    plant_model: Any
    params: Any
    starts: _Starts
    cost_names: list[str]
    limits: np.ndarray
    episode_length: int
    settings: VerdictSettings
    rules: PlantRules
    #: The training split's starts, candidates selected on them before the test (None:
    #: every candidate is tested).
    selection: _Starts | None = None
    selection_data: Dataset | None = None


def _rollouts(
    case: _Case, candidates: VerdictCandidates
) -> tuple[RolloutSums, RolloutSums, Any, RolloutSums | None]:
    """Every candidate, and the operators' clone, rolled out in every member from every
    start (float64 sums; the clone's without the policy axis), the clone, and the
    candidates from the training split's starts (the same program; None without)."""
    settings, starts, heldout = case.settings, case.starts, case.heldout
    dynamics, constraints, scaler = (
        case.plant_model.dynamics,
        case.rules.constraints,
        case.rules.scaler,
    )
    close = settings.close_after if settings.fqe else 0
    pessimism = settings.penalty > 0
    options = ModelRolloutOptions(
        horizon=starts.horizon,
        discount=settings.discount,
        close_after=min(close, starts.horizon) if close else 0,
        deterministic=settings.deterministic,
        disagreement_every=settings.disagreement_every if pessimism else 0,
        reward_cap=float(starts.rewards.max()) if pessimism else None,
        far_outside=settings.far_outside if pessimism else None,
    )
    rollouts = jax.jit(
        make_policy_rollouts(
            dynamics, candidates.act, options, constraints=constraints, scaler=scaler
        )
    )
    clone = _behaviour_clone(heldout, settings)
    replay = settings.replay_residuals
    noise = settings.operator_noise and not replay
    # The operators' deviations from the clone: their noise's spread, or replayed.
    residuals = clone_residuals(clone, heldout) if noise or replay else None
    operators = _operators_policy(clone, heldout.action_size, residuals if noise else None)
    baseline_rollouts = jax.jit(
        make_policy_rollouts(
            dynamics,
            operators.act,
            options,
            constraints=constraints,
            scaler=scaler,
            stochastic_policy=noise,
        )
    )
    key = jax.random.PRNGKey(settings.seed)
    # The training split's starts ride along in the same calls (one program each), so
    # the model noise of every start stays common to the candidates and the clone.
    first, lengths, given = starts.first, starts.lengths, starts.given
    # The operators' own deviations from the clone along each start's logged steps, or
    # None (their noise drawn, or none).
    offsets = residuals[starts.step_rows] if replay else None
    if case.selection is not None:
        first = jnp.concatenate([first, case.selection.first])
        lengths = np.concatenate([lengths, case.selection.lengths])
        if given is not None:  # the same width (the selection's is the test's)
            given = np.concatenate([given, case.selection.given])
        if replay:
            own = clone_residuals(clone, case.selection_data)[case.selection.step_rows]
            offsets = np.concatenate([offsets, own])
    lengths = jnp.asarray(lengths, jnp.int32)
    given = None if given is None else jnp.asarray(given)
    offsets = None if offsets is None else jnp.asarray(offsets, jnp.float32)
    params = case.params
    rolled = jax.device_get(rollouts(candidates.policy_params, params, first, lengths, key, given))
    baseline = jax.device_get(
        baseline_rollouts(operators.params, params, first, lengths, key, given, offsets)
    )
    n = len(starts.rows)

    def part(sums: Any, rows: slice) -> RolloutSums:  # [..., M, N, ...] -> float64 rows
        return jax.tree.map(lambda x: np.asarray(x[:, :, rows], np.float64), sums)

    return (
        part(rolled, slice(0, n)),
        jax.tree.map(lambda x: x[0], part(baseline, slice(0, n))),
        clone,
        None if case.selection is None else part(rolled, slice(n, None)),
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

    def discounted_scale(self, starts: int) -> np.ndarray:
        """``[starts, C]``: what each limit allows of a discounted cost from a start
        (OSRL's per-step threshold over the episode; inf where not limited)."""
        discount = self.settings.discount
        threshold = np.array(
            [
                per_step_cost_threshold(float(limit), discount, self.episode_length)
                if np.isfinite(limit)
                else np.inf
                for limit in self.limits
            ]
        )
        return np.broadcast_to(threshold, (starts, len(self.names)))

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


def _cost_reader(case: _Case, calibration: Calibration) -> _CostReader:
    heldout, params, starts, settings = case.heldout, case.params, case.starts, case.settings
    cost_names, limits, episode_length = case.cost_names, case.limits, case.episode_length
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
        known=frozenset(case.plant_model.dynamics.layout.known.cost_indices),
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


def shifted_return(
    sums: RolloutSums, sign: float, penalty: float, reward_spread: float, reward_low: float
) -> np.ndarray:
    """The discounted return moved by its uncertainty (``penalty`` x the rewards' spread
    x the rollout's discounted uncertainty; ``sign`` -1: pessimistic); the pessimistic
    reading values the steps the model cannot vouch for (far outside its data) at the
    data's lowest reward ``reward_low``."""
    uncertainty = penalty * reward_spread * sums.discounted_uncertainty
    if sign > 0:
        return sums.discounted_return + uncertainty
    unvouched = np.maximum(sums.far_return - reward_low * sums.far_weight, 0.0)
    return sums.discounted_return - uncertainty - unvouched


def raised_costs(sums: RolloutSums, penalty: float, cost_spread: np.ndarray) -> np.ndarray:
    """``[..., C]`` each rollout's total costs raised by its uncertainty (``penalty`` x
    each channel's spread x the rollout's total uncertainty)."""
    return sums.total_costs + penalty * cost_spread * sums.total_uncertainty[..., None]


def far_share(sums: RolloutSums, discount: float) -> float:
    """The share of the rollouts' discounted weight on steps far outside the data."""
    steps = np.asarray(sums.steps, np.float64)
    weight = steps if discount == 1.0 else (1.0 - discount**steps) / (1.0 - discount)
    return float(np.sum(sums.far_weight) / max(float(np.sum(weight)), 1e-12))


@dataclasses.dataclass(frozen=True)
class _ModelReading:
    """The ``model`` estimator's results from the rollouts' sums.

    Pessimism on every estimate that can be wrong: the candidates' returns are lowered by
    ``penalty`` x the rewards' spread x their uncertainty; the operators' model estimate
    is held against their logged returns instead (the calibration), and the error measured
    there widens every improvement (the allowance): the baseline's pessimism is measured,
    not a proxy of the members' disagreement counted on top of it. The truth lies between
    the pessimistic reading (the candidate lowered) and the optimistic one (raised), each
    less the operators' plain estimate; the model's own estimate is the plain
    difference. A candidate the data cannot answer for (more than ``max_far_share`` of
    its discounted weight far outside the data) has no lower bound (``-inf``)."""

    baseline: RolloutSums
    starts: _Starts
    costs: _CostReader
    scale: np.ndarray
    calibration: Calibration
    settings: VerdictSettings
    #: The per-step spread of the held-out rewards and of each cost channel.
    reward_spread: float
    cost_spread: np.ndarray
    #: The lowest reward of a held-out step: what a step the model cannot vouch for is
    #: worth to the pessimistic reading.
    reward_low: float

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
            reward_low=float(np.min(starts.rewards)),
            cost_spread=np.array([_spread(cost_matrix[:, i]) for i in range(n_costs)]),
        )

    def _bootstrap(self, values: np.ndarray, seed: int) -> np.ndarray:
        settings = self.settings
        return bootstrap_means(values, self.starts.episodes, settings.bootstrap, seed)

    def _shifted(self, sums: RolloutSums, sign: float) -> np.ndarray:
        penalty = self.settings.penalty
        return shifted_return(sums, sign, penalty, self.reward_spread, self.reward_low)

    def _far_share(self, sums: RolloutSums) -> float:
        return far_share(sums, self.settings.discount)

    def candidate(self, sums: RolloutSums, boot_seed: int) -> EstimatorResult:
        settings, baseline, level = self.settings, self.baseline, self.settings.level
        penalty = settings.penalty
        pessimistic = self._shifted(sums, -1.0)
        episode = sums.total_return - penalty * self.reward_spread * sums.total_uncertainty
        costs = raised_costs(sums, penalty, self.cost_spread)
        allowance = self.calibration.allowance(sums.discounted_return, baseline.discounted_return)
        improvement = _widened(
            _between(
                sums.discounted_return - baseline.discounted_return,
                pessimistic - baseline.discounted_return,
                self._shifted(sums, 1.0) - baseline.discounted_return,
                self.starts.episodes,
                settings,
                boot_seed,
            ),
            allowance,
        )
        difference = sums.discounted_return - baseline.discounted_return  # [M, N]
        steps_total = np.maximum(sums.steps.sum(axis=(-2, -1)), 1.0)
        discounted = _interval(pessimistic, self._bootstrap(pessimistic, boot_seed), level)
        far = self._far_share(sums)
        if far > settings.max_far_share:
            # The data cannot answer for it: nothing logged bounds how bad its steps far
            # outside the data are (the lowest logged reward is no floor there).
            improvement = dataclasses.replace(improvement, lower=-np.inf)
            discounted = dataclasses.replace(discounted, lower=-np.inf)
        return EstimatorResult(
            estimator="model",
            discounted_return=discounted,
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
            far_outside_share=far,
        )

    def operators(self) -> EstimatorResult:
        """Today's operation by the model: the clone's plain return, the estimate the
        calibration holds against the logged returns (its error is the allowance)."""
        baseline, seed, level = self.baseline, self.settings.seed, self.settings.level
        plain = baseline.discounted_return
        steps_total = max(float(baseline.steps.sum()), 1.0)
        return EstimatorResult(
            estimator="model",
            discounted_return=_interval(plain, self._bootstrap(plain, seed), level),
            episode_return=_interval(
                baseline.total_return, self._bootstrap(baseline.total_return, seed), level
            ),
            improvement=None,
            penalty=0.0,
            costs=self.costs(baseline.total_costs, self.scale, seed, computed=True),
            outside_data_share=float(baseline.outside_data_steps.sum() / steps_total),
            override_share=float(baseline.overridden_steps.sum() / steps_total),
            outside_physics_share=float(baseline.outside_physics_steps.sum() / steps_total),
        )
