"""Candidate selection before the test, on numbers whose answer is known: the predicted
lower bound is the training split's, widened to the test's size and doubled; a candidate
predicted over a cost limit or far outside the data is selected only when none is
predicted to keep them; the others cannot be recommended."""

from __future__ import annotations

import numpy as np
import pytest

from neorl_industrial.functional.transformations.model_evaluation import RolloutSums
from neorl_industrial.wrappers.training.verdict import VerdictSettings
from neorl_industrial.wrappers.training.verdict_selection import (
    NOT_SELECTED,
    SelectionSplit,
    apply_selection,
    predictions,
)

P, M, N = 3, 2, 8


def sums(returns, costs, far_weight=None):
    """Rollout sums ``[P, M, N]`` with the given discounted returns and per-start total
    costs (one channel), no uncertainty, every start 10 steps long."""
    returns = np.broadcast_to(np.asarray(returns, float), (P, M, N)).copy()
    zeros = np.zeros((P, M, N))
    costs = np.broadcast_to(np.asarray(costs, float), (P, M, N))[..., None].copy()
    far = zeros if far_weight is None else np.broadcast_to(far_weight, (P, M, N)).copy()
    return RolloutSums(
        discounted_return=returns,
        total_return=returns,
        discounted_costs=costs,
        total_costs=costs,
        discounted_uncertainty=zeros,
        total_uncertainty=zeros,
        steps=np.full((P, M, N), 10.0),
        outside_data_steps=zeros,
        overridden_steps=zeros,
        outside_physics_steps=zeros,
        far_weight=far,
        far_return=far * -1.0,
        head_return=zeros,
        head_costs=zeros[..., None],
        head_uncertainty=zeros,
        closing_observation=zeros[..., None],
        closing_weight=zeros,
    )


def split(n_episodes=4):
    return SelectionSplit(
        episodes=np.repeat(np.arange(n_episodes), N // n_episodes),
        rewards=np.linspace(-2.0, 0.0, 40),
        costs=np.zeros((40, 1)),
        lengths=np.full(N, 10),
        n_episodes=n_episodes,
    )


SETTINGS = VerdictSettings(bootstrap=400, penalty=0.0)


def test_the_predicted_bound_is_the_training_splits_widened_to_the_tests_size():
    rng = np.random.default_rng(0)
    returns = -10.0 + rng.normal(0, 1.0, (P, M, N))
    rows = predictions(sums(returns, 0.0), split(), 4, np.array([np.inf]), 10, SETTINGS)
    fewer = predictions(sums(returns, 0.0), split(), 1, np.array([np.inf]), 10, SETTINGS)
    for p, (row, small) in enumerate(zip(rows, fewer, strict=True)):
        assert row["value"] == pytest.approx(returns[p].mean())
        assert row["within_limits"] and row["far_outside_share"] == 0.0
        # Same training split: the half-width below the value scales with
        # 2 sqrt(training episodes / test episodes): 2 for 4/4, 4 for 4/1.
        assert row["value"] - small["predicted_lower"] == pytest.approx(
            2.0 * (row["value"] - row["predicted_lower"])
        )
        assert row["predicted_lower"] < row["value"]


def test_a_candidate_predicted_over_its_limit_is_not_selected_and_only_one_can_qualify():
    # "c" has the best return but breaks the cost limit on the training split; "b" is
    # next and keeps it; "a" is worst.
    returns = np.array([-12.0, -10.0, -8.0])[:, None, None]
    costs = np.array([1.0, 2.0, 30.0])[:, None, None]  # per start of 10 steps
    rows = predictions(sums(returns, costs), split(), 4, np.array([10.0]), 10, SETTINGS)
    assert [row["within_limits"] for row in rows] == [True, True, False]
    table = [
        {"name": name, "qualifies": True, "reasons": [], "selection": row}
        for name, row in zip("abc", rows, strict=True)
    ]
    assert apply_selection(table, SETTINGS.to_dict()) == "b"
    assert [row["qualifies"] for row in table] == [False, True, False]
    assert [row["selection"]["selected"] for row in table] == [False, True, False]
    assert table[0]["reasons"][0].startswith(NOT_SELECTED)
    # Selecting again (a merged verdict) replaces the reason, does not stack it.
    assert apply_selection(table, SETTINGS.to_dict()) == "b"
    assert len(table[0]["reasons"]) == 1
    # None predicted within the limits: the highest predicted bound is tested anyway.
    for row in table:
        row["selection"] = row["selection"] | {"within_limits": False}
    assert apply_selection(table, SETTINGS.to_dict()) == "c"


def test_a_candidate_far_outside_the_data_is_not_selected():
    returns = np.array([-12.0, -10.0, -8.0])[:, None, None]
    far = np.array([0.0, 0.0, 5.0])[:, None, None]  # "c": half its weight far outside
    rows = predictions(sums(returns, 0.0, far), split(), 4, np.array([np.inf]), 10, SETTINGS)
    assert rows[2]["far_outside_share"] > SETTINGS.max_far_share
    table = [
        {"name": name, "qualifies": True, "reasons": [], "selection": row}
        for name, row in zip("abc", rows, strict=True)
    ]
    assert apply_selection(table, SETTINGS.to_dict()) == "b"
    # Without any prediction (no training split given) nothing changes.
    plain = [{"name": "a", "qualifies": True, "reasons": [], "selection": None}]
    assert apply_selection(plain, SETTINGS.to_dict()) is None and plain[0]["qualifies"]
