"""The ``model`` cost bound's allowance for the model's error on the operators' own cost:
the logged-to-estimated ratio from the calibration (its interval from the same bootstrap
draws), and a candidate's upper bound raised by the absolute under-prediction or scaled
by the ratio, whichever is more."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from neorl_industrial.wrappers.training.verdict_evidence import _cost_ratio
from neorl_industrial.wrappers.training.verdict_model import _CostReader
from neorl_industrial.wrappers.training.verdict_results import Interval, VerdictSettings

SETTINGS = VerdictSettings(bootstrap=400, seed=3)


def test_the_ratio_is_the_logged_cost_over_the_models_with_an_interval():
    rng = np.random.default_rng(0)
    episodes = np.repeat(np.arange(6), 5)  # 30 starts in 6 episodes
    logged = rng.uniform(0.2, 0.6, size=30)
    model = np.stack([0.25 * logged + rng.normal(0, 0.01, 30) for _ in range(4)])  # [M, N]
    ratio = _cost_ratio(model, logged, episodes, SETTINGS)
    assert ratio.value == pytest.approx(logged.mean() / model.mean())
    assert 3.5 < ratio.lower <= ratio.value <= ratio.upper < 4.5


def test_the_ratio_says_when_nothing_was_logged_and_when_the_model_predicts_none():
    episodes = np.repeat(np.arange(4), 3)
    nothing = _cost_ratio(np.full((3, 12), 0.2), np.zeros(12), episodes, SETTINGS)
    assert (nothing.value, nothing.lower, nothing.upper) == (0.0, 0.0, 0.0)
    blind = _cost_ratio(np.zeros((3, 12)), np.full(12, 0.3), episodes, SETTINGS)
    assert blind.value == np.inf and blind.upper == np.inf


def reader(under: float, ratio: float) -> _CostReader:
    return _CostReader(
        names=("overheating",),
        limits=np.array([60.0]),
        events=np.array([40]),
        known=frozenset({0}),
        magnitude=np.array([1.0]),
        event_rate=np.array([0.01]),
        episode_length=100,
        under_predicted={"overheating": under},
        under_ratio={"overheating": ratio},
        start_episodes=np.arange(4),
        settings=SETTINGS,
    )


def test_the_upper_bound_takes_the_larger_of_the_shift_and_the_scaling():
    value = Interval(0.17, 0.05, 0.49)
    # A model four times short on the operators' cost: the candidate's bound x 4.
    assert reader(0.1, 4.0).allowed_upper("overheating", value) == pytest.approx(1.96)
    # A small bound is raised by the absolute under-prediction instead.
    assert reader(0.3, 1.2).allowed_upper("overheating", value) == pytest.approx(0.79)
    # No estimated cost: the scaling adds nothing, the shift still does (even for an
    # unbounded ratio: a model that predicts none of the operators' cost).
    zero = dataclasses.replace(value, value=0.0, lower=0.0, upper=0.0)
    assert reader(0.2, np.inf).allowed_upper("overheating", zero) == pytest.approx(0.2)
    assert reader(0.2, np.inf).allowed_upper("overheating", value) == np.inf
    # A channel the calibration does not hold (no limit): unchanged.
    assert reader(0.0, 1.0).allowed_upper("other", value) == pytest.approx(0.49)


def test_a_candidates_bound_allows_for_the_ratio():
    values = np.full((3, 4, 1), 6.0)  # [M, N, C]: 6 per start, a quarter of the scale
    scale = np.full((4, 1), 24.0)
    (estimate,) = reader(0.0, 5.0)(values, scale, boot_seed=0, computed=True)
    assert estimate.value.value == pytest.approx(0.25)
    assert estimate.value.upper == pytest.approx(1.25) and estimate.within_limit is False
    (plain,) = reader(0.0, 1.0)(values, scale, boot_seed=0, computed=True)
    assert plain.value.upper == pytest.approx(0.25) and plain.within_limit is True
