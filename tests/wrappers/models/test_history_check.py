"""The history check's choice: the shortest history whose long-horizon error is within
the margin of the lowest; and what it refuses, by name, before fitting anything."""

from __future__ import annotations

import math

import pytest

from neorl_industrial.wrappers.models import PlantModelError
from neorl_industrial.wrappers.models.history_check import (
    HISTORY_MARGIN,
    choose_history,
    compare_histories,
    fidelity_errors,
)


@pytest.mark.parametrize(
    ("errors", "choice"),
    [
        ({1: 0.18, 3: 0.10, 10: 0.15}, 3),  # a delay: three rows hold it
        ({1: 0.29, 3: 0.29, 10: 0.32}, 1),  # nothing earlier matters: the fewest rows
        ({1: 0.91, 3: 1.46, 10: 0.36}, 10),  # a slow drift only ten rows hold
        ({1: 0.105, 3: 0.100}, 1),  # within the margin of the lowest: not worth its rows
        ({1: 0.111, 3: 0.100}, 3),  # beyond it
        ({3: 0.5, 1: 0.5}, 1),  # the order given does not matter
    ],
)
def test_the_shortest_history_within_the_margin_of_the_lowest_error(errors, choice):
    assert HISTORY_MARGIN == 0.10
    assert choose_history(errors) == choice


@pytest.mark.parametrize("bad", [math.nan, math.inf, -0.1])
def test_a_history_without_a_finite_error_is_named(bad):
    with pytest.raises(PlantModelError, match="history 3 has no finite long-horizon error"):
        choose_history({1: 0.2, 3: bad})
    with pytest.raises(PlantModelError, match="no history has a long-horizon error"):
        choose_history({})


@pytest.mark.parametrize(
    ("histories", "message"),
    [
        ((3,), r"at least two histories to compare, got \[3\]"),
        ((1, 0), "whole numbers >= 1, got 0"),
        ((1, 2.5), "whole numbers >= 1, got 2.5"),
        ((1, 3, 3), r"a history is given twice in \[1, 3, 3\]"),
    ],
)
def test_bad_histories_are_refused_before_anything_is_fitted(histories, message):
    def load(history):
        raise AssertionError("nothing is loaded for a bad list")

    with pytest.raises(PlantModelError, match=message):
        compare_histories(load, histories)


def test_the_errors_leave_out_what_the_model_takes_from_the_log_and_constant_features():
    rows = [
        {"kind": "observation", "step": 10, "relative_rmse": 0.2, "coverage": 0.9},
        {"kind": "observation", "step": 10, "relative_rmse": 0.4, "coverage": 0.7},
        {
            "kind": "observation",
            "step": 10,
            "given": True,
            "relative_rmse": None,
            "coverage": None,
        },
        {"kind": "observation", "step": 10, "relative_rmse": None, "coverage": 1.0},
        {"kind": "signal", "step": 10, "relative_rmse": 9.0, "coverage": 0.0},
        {"kind": "observation", "step": 1, "relative_rmse": 0.1, "coverage": 0.8},
    ]
    errors = fidelity_errors({"steps": [1, 10], "rows": rows})
    assert errors[10]["relative_rmse"] == pytest.approx(0.3)
    assert errors[10]["coverage"] == pytest.approx((0.9 + 0.7 + 1.0) / 3)
    assert errors[1] == {"relative_rmse": 0.1, "coverage": 0.8}
