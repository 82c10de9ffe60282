"""Candidate selection on the training episodes, before the test: the Seldonian way.

A verdict that tests many candidates on the same held-out episodes and recommends the
one that passes best has tested them all: with fifty candidates, one whose 95 % interval
happens to lie above zero is likely even when none is better. So, when the verdict is
given the episodes the candidates were trained on (the training split), it first
**selects one candidate on them alone** by its *predicted* result in the test, and the
held-out test (the calibration check, the improvement's lower bound, the cost limits)
is made for that one: it is the only one that can be recommended. The other candidates'
held-out estimates are still shown; each says it was not selected.

The prediction (Thomas et al., Science 2019, candidate selection) reads every candidate
the way the test will, on the training split's starts: its pessimistic ``model`` return
(lowered by its uncertainty, steps far outside the data valued at the split's lowest
reward), bootstrapped over whole episodes and members, and its limited costs raised the
same way. The interval's half-width is scaled to the test's size
(``sqrt(training episodes / held-out episodes)``) and doubled (the plant model was
fitted on these episodes and flatters them). The selected candidate is, among those
predicted to keep every cost limit and to stay within the data (at most
``max_far_share`` of their weight far outside it), the one with the highest predicted
lower bound of its return; when none is predicted to keep them, the highest predicted
lower bound. The operators' return is the same for every candidate from the same
starts, so the ranking needs no estimate of it, and nothing of the held-out episodes
enters the choice.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np

from neorl_industrial.functional.transformations.model_evaluation import RolloutSums
from neorl_industrial.wrappers.training.verdict_evidence import _spread, bootstrap_means
from neorl_industrial.wrappers.training.verdict_model import (
    far_share,
    raised_costs,
    shifted_return,
)
from neorl_industrial.wrappers.training.verdict_results import VerdictSettings

#: How much wider than the training split's own interval (scaled to the test's size)
#: the predicted one is: the plant model was fitted on the training episodes.
INFLATION = 2.0
#: The prefix of the reason a candidate that was not selected carries.
NOT_SELECTED = "selection:"


@dataclasses.dataclass(frozen=True)
class SelectionSplit:
    """The training split's starts the candidates are predicted from.

    Attributes:
        episodes: each start's episode (the bootstrap resamples whole episodes).
        rewards: every training step's reward.
        costs: ``[transitions, C]`` every training step's costs.
        lengths: steps predicted from each start.
        n_episodes: training episodes the starts come from.
    """

    episodes: np.ndarray
    rewards: np.ndarray
    costs: np.ndarray
    lengths: np.ndarray
    n_episodes: int


def predictions(
    sums: RolloutSums,
    split: SelectionSplit,
    test_episodes: int,
    limits: np.ndarray,
    episode_length: int,
    settings: VerdictSettings,
) -> list[dict[str, Any]]:
    """Per candidate (``sums`` with leading axes ``[P, M, N]``, float64, from the
    training split's starts): ``{predicted_lower, value, within_limits,
    far_outside_share}``, the test predicted (module docstring), read the way the
    ``model`` estimator reads the test's rollouts."""
    tail = (1.0 - settings.level) / 2.0 * 100.0
    widen = INFLATION * math.sqrt(split.n_episodes / max(test_episodes, 1))
    reward_spread, reward_low = _spread(split.rewards), float(np.min(split.rewards))
    cost_spread = np.array([_spread(split.costs[:, c]) for c in range(split.costs.shape[1])])
    limited = np.isfinite(limits)
    scale = np.maximum(
        (np.where(limited, limits, 1.0) / episode_length)[None, :] * split.lengths[:, None],
        1e-12,
    )
    rows = []
    for p in range(sums.discounted_return.shape[0]):
        own = jax.tree.map(lambda x, p=p: x[p], sums)
        pessimistic = shifted_return(own, -1.0, settings.penalty, reward_spread, reward_low)
        seed = settings.seed + p
        draws = bootstrap_means(pessimistic, split.episodes, settings.bootstrap, seed)
        value = float(np.mean(pessimistic))
        lower = float(np.percentile(draws, tail))
        within = True
        if limited.any():
            raised = raised_costs(own, settings.penalty, cost_spread)
            shares = raised[..., limited] / scale[:, limited]  # [M, N, limited]
            cost_draws = bootstrap_means(
                np.moveaxis(shares, -1, 0), split.episodes, settings.bootstrap, seed
            )
            means = shares.mean(axis=(0, 1))
            uppers = np.percentile(cost_draws, 100.0 - tail, axis=-1)
            within = bool(np.all(means + widen * (uppers - means) <= 1.0))
        rows.append(
            {
                "predicted_lower": value - widen * (value - lower),
                "value": value,
                "within_limits": within,
                "far_outside_share": far_share(own, settings.discount),
            }
        )
    return rows


def apply_selection(table: list[dict[str, Any]], settings: dict[str, Any]) -> str | None:
    """Selects, among the rows of ``table`` that carry a ``selection`` prediction, the
    candidate the test is made for, marks every row (``selection.selected``) and gives
    every other row the reason it cannot be recommended; returns the selected name
    (None when no row carries a prediction: nothing changes). Reasons a previous
    selection gave are replaced, so merged tables select again."""
    rows = [row for row in table if row.get("selection")]
    if not rows:
        return None
    max_far = float(settings.get("max_far_share", 0.25))

    def key(row: dict[str, Any]) -> tuple[bool, float]:
        prediction = row["selection"]
        feasible = bool(prediction["within_limits"]) and (
            float(prediction["far_outside_share"]) <= max_far
        )
        lower = float(prediction["predicted_lower"])
        return feasible, lower if math.isfinite(lower) else -math.inf

    chosen = max(rows, key=key)
    bound = chosen["selection"]["predicted_lower"]
    for row in table:
        reasons = [r for r in row["reasons"] if not r.startswith(NOT_SELECTED)]
        selected = row is chosen
        if row.get("selection"):
            row["selection"] = {**row["selection"], "selected": selected}
        if not selected:
            reasons.append(
                f"{NOT_SELECTED} not the candidate selected on the training episodes "
                f"({chosen['name']}, predicted lower bound of its return {bound:.4g}); "
                "only the selected candidate is tested"
            )
        row["reasons"] = reasons
        row["qualifies"] = not reasons
    return str(chosen["name"])
