"""The verdict study on a tiny run: every estimator ranked against the simulator's truth,
the verdict's recommendation checked against the behaviour's true return, the page
written from the result, and bad options refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import verdict_study

TINY = [
    "--datasets",
    "CSTR-v0:medium",
    "--algorithms",
    "bc",
    "td3bc",
    "--trajectories",
    "10",
    "--seeds",
    "2",
    "--updates",
    "30",
    "--chunk",
    "30",
    "--hidden",
    "8",
    "--model-updates",
    "40",
    "--model-hidden",
    "8",
    "--fidelity-episodes",
    "2",
    "--horizon",
    "10",
    "--starts",
    "4",
    "--fqe-updates",
    "20",
    "--bootstrap",
    "50",
    "--episodes",
    "2",
    "--no-save",
]


@pytest.fixture(scope="module")
def study():
    return verdict_study.run_study(verdict_study.parse_args(TINY))


def test_every_candidate_is_estimated_and_held_against_the_truth(study):
    config, results = study
    (row,) = results["datasets"]
    # BC and three TD3+BC alphas, two seeds each.
    assert len(row["candidates"]) == 8 and config["seeds"] == 2
    assert {c["configuration"] for c in row["candidates"]} == {
        "BC",
        "TD3+BC a=1",
        "TD3+BC a=2.5",
        "TD3+BC a=10",
    }
    truth = np.asarray([c["true_return"] for c in row["candidates"]])
    for name in verdict_study.ESTIMATORS:
        ranking = row["ranking"][name]
        estimates = [c["estimates"][name]["value"] for c in row["candidates"]]
        assert ranking["chosen"] == int(np.argmax(estimates))
        assert ranking["regret"] == pytest.approx(truth.max() - truth[ranking["chosen"]])
        assert 0.0 <= ranking["regret_share"] <= 1.0
        assert ranking["rank_correlation"] is None or -1 <= ranking["rank_correlation"] <= 1
    outcome = row["verdict"]
    if outcome["decision"] == "recommend":
        chosen = next(c for c in row["candidates"] if c["name"] == outcome["recommended"])
        assert outcome["worse_than_behaviour"] == (
            chosen["true_return"] < row["behaviour"]["true_return"]
        )
    else:
        assert outcome["recommended"] is None and not outcome["bad"]
    fidelity = row["fidelity"]["simulator"]
    assert 0.0 <= fidelity["outside_data_share"] <= 1.0 and fidelity["steps"]


def test_the_summary_and_page_report_the_targets(study):
    config, results = study
    total = results["summary"]
    assert set(total["estimators"]) == set(verdict_study.ESTIMATORS)
    text = verdict_study.page(config, results)
    assert "| model |" in text and "CSTR-v0:medium" in text and "Model fidelity" in text


def test_the_summary_counts_a_recommendation_worse_than_the_operators():
    def row(correlation, regret, bad):
        ranking = {"regret_share": regret, "rank_correlation": correlation}
        return {
            "ranking": {"model": ranking},
            "verdict": {"decision": "recommend", "bad": bad},
            "candidates": [{"true_return": 1.0}, {"true_return": 3.0}],
        }

    total = verdict_study.summary([row(0.9, 0.0, False), row(0.5, 0.3, True)])
    model = total["estimators"]["model"]
    assert model["mean_regret"] == pytest.approx(0.15) and model["worst_regret"] == 0.3
    assert model["mean_correlation"] == pytest.approx(0.7)
    assert model["targets_met"] == {
        "mean_regret": False,
        "worst_regret": False,
        "mean_correlation": True,
    }
    assert total["bad_recommendations"] == 1 and not total["bad_target_met"]
    assert total["random_regret"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--datasets", "CSTR-v0"], "--datasets: 'CSTR-v0' is not ENV:QUALITY"),
        (["--algorithms", "sac"], "--algorithms: unknown"),
        (["--seeds", "0"], "--seeds: expected a positive integer"),
    ],
)
def test_bad_options_are_refused_by_name(argv, message, capsys):
    with pytest.raises(SystemExit):
        verdict_study.parse_args(argv)
    assert message in capsys.readouterr().err
