"""The held-out log as evidence for a verdict: the starts and their episodes, bootstrap
intervals over whole episodes, the exact bound of a rare event's rate, and the calibration
check of the plant model against the operators' own logged returns and costs."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import scipy.stats

from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.functional.transformations.model_evaluation import (
    RolloutSums,
)
from neorl_industrial.wrappers.training.verdict_results import (
    Calibration,
    Interval,
    VerdictSettings,
)


# ----- starts and intervals ------------------------------------------------------------
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
    starts: Any,
    scale: np.ndarray,
    limits: np.ndarray,
    cost_names: Sequence[str],
    heldout: Dataset,
    settings: VerdictSettings,
) -> Calibration:
    """The operators' clone in the model (``baseline``, ``[M, N]``) against their logged
    returns and costs from the same ``starts`` (the verdict's: ``logged_discounted``,
    ``logged_costs``, ``episodes``; see :class:`Calibration`)."""
    logged_discounted = starts.logged_discounted

    def interval(values: np.ndarray) -> Interval:
        draws = bootstrap_means(values, starts.episodes, settings.bootstrap, settings.seed)
        return _interval(values, draws, settings.level)

    error = interval(baseline.discounted_return - logged_discounted[None])
    size = float(np.mean(np.abs(logged_discounted)))
    common = dict(
        estimated=interval(baseline.discounted_return),
        logged=interval(np.asarray(logged_discounted, np.float64)[None]),
        error=error,
        tolerance=settings.calibration_tolerance * size,
        model_error=Calibration.error_size(error),
        size=size,
        costs=tuple(
            _cost_calibration(baseline, starts, scale, limits, cost_names, interval, settings)
        ),
        episodes=len(np.unique(starts.episodes)),
        transitions=int(heldout.n_transitions),
        min_episodes=settings.min_episodes,
    )
    status, reason = _calibration_status(common, settings)
    return Calibration(status=status, reason=reason, **common)


def _cost_calibration(
    baseline: RolloutSums,
    starts: Any,
    scale: np.ndarray,
    limits: np.ndarray,
    cost_names: Sequence[str],
    interval: Callable[[np.ndarray], Interval],
    settings: VerdictSettings,
) -> list[dict[str, Any]]:
    """Per limited cost channel: the clone's cost in the model against the logged one, in
    limits. A model that over-predicts a cost is conservative; one that under-predicts it
    would let a candidate through that breaks the limit (``passed`` is False below
    the settings' ``calibration_tolerance``, in limits)."""
    logged_costs, tolerance = starts.logged_costs, settings.calibration_tolerance
    costs = []
    for c in range(logged_costs.shape[1]):
        if not np.isfinite(limits[c]):
            continue
        model = baseline.total_costs[..., c] / scale[:, c]
        data = logged_costs[:, c] / scale[:, c]
        gap = interval(model - data[None])
        costs.append(
            {
                "channel": cost_names[c],
                "estimated": float(np.mean(model)),
                "logged": float(np.mean(data)),
                "error": dataclasses.asdict(gap),
                "passed": bool(gap.upper >= -tolerance),
            }
        )
    return costs


def _calibration_status(
    common: dict[str, Any], settings: VerdictSettings
) -> tuple[str, str | None]:
    """``(status, reason)`` of a calibration check: too small, failed or passed (no
    reason)."""
    episodes, transitions = common["episodes"], common["transitions"]
    if episodes < settings.min_episodes:
        return "too small", (
            f"the held-out part is too small for the calibration check: "
            f"{transitions} transitions in {episodes} episode(s), at least "
            f"{settings.min_episodes} episodes needed (hold out more episodes, or log more)"
        )
    costs = common["costs"]
    if not _within(common["error"], common["tolerance"]):
        what = f"estimated {common['estimated'].value:.4g}, logged {common['logged'].value:.4g}"
    elif any(not c["passed"] for c in costs):
        what = "; ".join(
            f"{c['channel']} estimated {c['estimated']:.3g}, logged {c['logged']:.3g} of its limit"
            for c in costs
            if not c["passed"]
        )
    else:
        return "passed", None
    return "failed", f"the plant model does not reproduce today's operation ({what})"


def _spread(values: np.ndarray) -> float:
    spread = float(np.std(values)) if np.size(values) else 0.0
    return spread if spread > 1e-9 else 0.0
