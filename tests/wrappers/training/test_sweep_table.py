"""A sweep's table: ranking safety first, the reason, and the hindsight of an off-policy choice."""

from __future__ import annotations

import pytest

from neorl_industrial.wrappers.training.sweep_table import sweep_table, with_values


def _runs(*pairs):
    return [{"return": r, "normalized_cost": c} for r, c in pairs]


def test_a_configuration_within_the_limits_wins_over_a_better_return_that_breaks_them():
    points = [{"alpha": 1.0}, {"alpha": 2.0}, {"alpha": 3.0}]
    metrics = _runs((10.0, 0.5), (11.0, 0.6), (50.0, 2.0), (52.0, 3.0), (-5.0, 0.1), (-4.0, 0.2))
    table = sweep_table(points, metrics, [0, 1], estimate="fqe")
    assert table["selected"] == 0 and table["fields"] == ["alpha"]
    assert [c["within_limits"] for c in table["configurations"]] == [True, False, True]
    assert table["configurations"][0]["runs"][1] == {
        "seed": 1,
        "return": 11.0,
        "normalized_cost": 0.6,
    }
    assert table["reason"].startswith("the best mean return among the configurations within")
    assert table["hindsight"] is None
    # Judged by the simulator, the third configuration was the better choice.
    truth = _runs((1.0, 0.5), (1.0, 0.5), (0.0, 2.0), (0.0, 2.0), (3.0, 0.1), (3.0, 0.1))
    hindsight = sweep_table(points, metrics, [0, 1], truth=truth)["hindsight"]
    assert hindsight["best_in_hindsight"] == 2 and hindsight["regret"] == pytest.approx(2.0)


def test_bad_input_and_dotted_values():
    with pytest.raises(ValueError, match=r"metrics: expected 2 configurations x 2 seeds, got 3"):
        sweep_table([{"a": 1}, {"a": 2}], _runs((1, 0), (1, 0), (1, 0)), [0, 1])
    assert with_values({"critic": {"cvar_level": 0.5, "n": 2}}, {"critic.cvar_level": 0.1}) == {
        "critic": {"cvar_level": 0.1, "n": 2}
    }
