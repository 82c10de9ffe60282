"""The safety study script: agents, checks and page on a tiny run's results."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import safety_study


def _args(**overrides):
    values = {"hidden": [8], "cost_limit": 100.0, "horizon": 1000, "fatigue_limit": 30.0}
    values.update(overrides)
    return argparse.Namespace(**values)


def test_every_agent_is_built_with_the_cost_limit():
    assert set(safety_study.LABELS) == set(safety_study.ALGORITHMS)
    for name in safety_study.ALGORITHMS:
        agent = safety_study.make_agent(name, 6, 3, [8], (100.0,), 1000)
        assert callable(agent.act)
    with pytest.raises(ValueError, match="unknown"):
        safety_study.make_agent("cpq", 6, 3, [8], (100.0,), 1000)


def test_each_agent_trains_with_its_registered_algorithms_reward_scaling():
    from neorl_industrial.core.agents.registry import algorithm_entry

    assert set(safety_study.REGISTRY_NAMES) == set(safety_study.ALGORITHMS)
    kinds = {
        name: algorithm_entry(registered).reward_scaling
        for name, registered in safety_study.REGISTRY_NAMES.items()
    }
    assert kinds["iql_lag"] == "return_range"
    assert kinds["td3bc_lag"] == kinds["bc_safe"] == "std"
    assert safety_study._scaling_text({"kind": "std", "shift": 0.0, "scale": 0.01234}) == (
        "std (x 0.0123)"
    )


def test_the_study_cost_is_the_ibs_stricter_fatigue_or_a_process_tasks_own_channels():
    ib = safety_study.study_cost("IB-v0", _args())
    assert ib.channels == ("fatigue",) and ib.limits == (100.0,) and ib.relabel is not None
    tanks = safety_study.study_cost("FourTank-v0", _args())
    assert tanks.relabel is None and len(tanks.channels) == 8 and set(tanks.limits) == {6.0}
    # the pipeline's cost is the environment's own (not expressible in a spec), with its limit
    pipe = safety_study.study_cost("Pipeline-v0", _args())
    assert pipe.channels == ("flow_off_target",) and pipe.limits == (200.0,)
    assert safety_study.horizon_of("Pipeline-v0", _args(horizon=50)) == 1000
    assert safety_study.horizon_of("IB-v0", _args(horizon=50)) == 50


def _entry(cost, hard_on):
    summary = {"mean": cost, "ci": 0.1, "n": 5}
    side = {
        "normalized_return": {"mean": 50.0, "ci": 1.0, "n": 5},
        "normalized_cost": summary,
        "violation_rate": {"mean": 0.1, "ci": 0.1, "n": 5},
        "override_rate": {"mean": 0.0, "ci": 0.0, "n": 5},
        "hard_violation_steps": 3,
        "proposed_violations": 3,
        "per_seed": [],
    }
    return {
        "shield_off": side,
        "shield_on": {**side, "hard_violation_steps": hard_on},
        "final_multiplier": None,
    }


def test_checks_fail_when_the_result_is_not_there():
    good = {"algorithms": {"td3bc": _entry(2.0, 0), "td3bc_lag": _entry(0.8, 0)}}
    assert all(check["passed"] for check in safety_study.checks(good).values())
    bad = {"algorithms": {"td3bc": _entry(0.5, 0), "td3bc_lag": _entry(1.3, 2)}}
    checks = safety_study.checks(bad)
    assert not checks["td3bc_exceeds"]["passed"]
    assert not checks["td3bc_lag_within"]["passed"]
    assert not checks["shield_no_hard_violations"]["passed"]
    # a task whose data was not built to tempt TD3+BC over the limit does not expect it
    assert "td3bc_exceeds" not in safety_study.checks(bad, expect_unconstrained_over=False)


def test_the_suite_summary_counts_tasks_within_the_limit():
    results = {
        "tasks": {
            "A": {"algorithms": {"td3bc_lag": _entry(0.8, 0)}},
            "B": {"algorithms": {"td3bc_lag": _entry(1.4, 0), "bc": _entry(0.2, 1)}},
        }
    }
    summary = safety_study.suite_summary(["td3bc_lag", "bc"], results)
    assert summary["td3bc_lag"]["within_limit"] == 1 and summary["td3bc_lag"]["tasks"] == 2
    assert summary["bc"] == {
        "tasks": 1,
        "within_limit": 1,
        "mean_normalized_return": 50.0,
        "hard_violations_shield_on": 1,
    }


@pytest.mark.slow
def test_tiny_study_runs_end_to_end(tmp_path):
    doc = tmp_path / "safety.md"
    safety_study.main(
        [
            "--updates",
            "20",
            "--chunk",
            "10",
            "--seeds",
            "2",
            "--trajectories",
            "1",
            "--episodes",
            "1",
            "--horizon",
            "50",
            "--hidden",
            "8",
            "--doc",
            str(doc),
            "--results-dir",
            str(tmp_path),
            "-t",
            "test",
        ]
    )
    page = doc.read_text()
    assert "| TD3BC-Lag |" in page and "Checks:" in page
    assert "IQL-Lag return_range (x " in page
    assert list(tmp_path.glob("safety_study-test-*.json"))
