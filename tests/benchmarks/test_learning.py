"""Tests of the learning study's statistics, checks and page; the full (quick) study runs
under the ``slow`` marker."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import learning
from neorl_industrial.functional.state_management import Dataset


def test_confidence_interval_is_students_t_over_seeds():
    result = learning.mean_confidence_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert result["mean"] == pytest.approx(3.0)
    # t(0.975, 4) = 2.7764, sample std = sqrt(2.5)
    assert result["ci"] == pytest.approx(2.7764 * np.sqrt(2.5) / np.sqrt(5), rel=1e-4)
    assert learning.mean_confidence_interval([7.0])["ci"] is None


def test_rewards_are_standardized_and_statistics_returned():
    rng = np.random.default_rng(0)
    dataset = Dataset.from_trajectories(
        rng.normal(size=(2, 11, 4)).astype(np.float32),
        rng.uniform(-1, 1, (2, 10, 3)).astype(np.float32),
        (rng.normal(size=(2, 10)) * 50 - 300).astype(np.float32),
        np.zeros((2, 10, 2), np.float32),
        np.zeros((2, 10), bool),
    )
    scaled, stats = learning.standardize_rewards(dataset)
    assert stats["mean"] == pytest.approx(float(np.mean(np.asarray(dataset.rewards))), rel=1e-5)
    assert float(jnp.mean(scaled.rewards)) == pytest.approx(0.0, abs=1e-5)
    assert float(jnp.std(scaled.rewards)) == pytest.approx(1.0, rel=1e-4)
    np.testing.assert_array_equal(scaled.observations, dataset.observations)


def _results(scores: dict[str, tuple[float, float]], behaviour: float) -> dict:
    entry = {
        "behaviour_score": behaviour,
        "behaviour_return": -200.0,
        "random_return": -300.0,
        "expert_return": -100.0,
        "scores": {name: {"mean": m, "ci": c, "n": 5} for name, (m, c) in scores.items()},
        "returns": {},
    }
    return {"datasets": {"low": entry}, "timing": {n: {"train_s": 1.0} for n in scores}}


def test_checks_can_fail_and_pass():
    config = {"qualities": ["low"], "algorithms": ["bc", "td3bc", "iql"]}
    results = _results({"bc": (31.0, 2.0), "td3bc": (40.0, 3.0), "iql": (29.0, 4.0)}, 30.0)
    verdicts = learning.checks(config, results)
    assert verdicts["bc_low_close_to_behaviour"]["passed"] is True
    assert verdicts["td3bc_low_reaches_behaviour"]["passed"] is True
    assert verdicts["iql_low_reaches_behaviour"]["passed"] is False  # 29 < 30 whatever the CI
    far = learning.checks(config, _results({"bc": (5.0, 1.0)}, 30.0))
    assert far["bc_low_close_to_behaviour"]["passed"] is False


def test_markdown_page_has_one_row_per_dataset_and_the_verdicts():
    config = {
        "env_id": "IB-v0",
        "qualities": ["low"],
        "algorithms": ["bc", "td3bc"],
        "n_updates": 1000,
        "batch_size": 256,
        "n_seeds": 5,
        "n_episodes": 100,
        "horizon": 1000,
        "trajectories": 100,
        "device": "cpu",
    }
    results = _results({"bc": (31.0, 2.0), "td3bc": (40.0, 3.0)}, 30.0)
    results["checks"] = learning.checks(config, results)
    page = learning.markdown(config, results)
    assert "| IB-v0-low | 30.0 | 31.0 ± 2.0 | 40.0 ± 3.0 |" in page
    assert "TD3+BC reaches the behaviour score on low: met" in page


def test_bad_arguments_are_named():
    with pytest.raises(SystemExit):
        learning.parse_args(["--seeds", "0"])
    with pytest.raises(SystemExit):
        learning.parse_args(["--algorithms", "sac"])


@pytest.mark.slow
def test_quick_study_runs_end_to_end(tmp_path):
    doc = tmp_path / "learning.md"
    code = learning.main(
        [
            "--quick",
            "--algorithms",
            "bc",
            "td3bc",
            "--qualities",
            "low",
            "medium",
            "--doc",
            str(doc),
            "--results-dir",
            str(tmp_path),
            "-t",
            "test",
        ]
    )
    assert code == 0
    (saved,) = tmp_path.glob("learning-test-*.json")
    data = json.loads(saved.read_text())
    scores = data["results"]["tasks"]["IB-v0"]["datasets"]["low"]["per_seed_scores"]["td3bc"]
    assert len(scores) == 2 and all(np.isfinite(scores))
    assert "IB-v0-medium" in doc.read_text()


def _saved(
    tmp_path, name: str, algorithm: str, qualities: list[str], updates: int, trajectories=100
):
    from benchmarks.harness import BenchmarkResult

    config = {
        "env_id": "IB-v0",
        "qualities": qualities,
        "algorithms": [algorithm],
        "n_updates": updates,
        "chunk_updates": 100,
        "batch_size": 256,
        "n_seeds": 5,
        "n_episodes": 100,
        "horizon": 1000,
        "trajectories": trajectories,
        "device": "cpu",
    }
    results = _results({algorithm: (40.0, 2.0)}, 30.0)
    results["datasets"] = {q: results["datasets"]["low"] for q in qualities}
    for entry in results["datasets"].values():
        entry["per_seed_scores"] = {algorithm: [40.0] * 5}
    results["history"] = {algorithm: []}
    path = tmp_path / f"{name}.json"
    path.write_text(BenchmarkResult(name="learning", config=config, results=results).to_json())
    return path


def test_merge_joins_runs_of_different_algorithms_and_refuses_mismatches(tmp_path):
    first = _saved(tmp_path, "a", "td3bc", ["low", "medium", "high"], 10_000)
    second = _saved(tmp_path, "b", "cql", ["low", "medium"], 5_000)
    config, results = learning.merge([second, first])
    assert config["algorithms"] == ["td3bc", "cql"]
    assert config["n_updates"] == {"cql": 5_000, "td3bc": 10_000}
    task = results["tasks"]["IB-v0"]
    assert set(task["datasets"]["low"]["scores"]) == {"td3bc", "cql"}
    assert "cql" not in task["datasets"]["high"]["scores"]
    page = learning.markdown(config, results)
    assert "| IB-v0-high | 30.0 | 40.0 ± 2.0 | — |" in page
    other = _saved(tmp_path, "c", "iql", ["low"], 10_000, trajectories=10)
    with pytest.raises(ValueError, match="trajectories"):
        learning.merge([first, other])
    with pytest.raises(ValueError, match="two runs"):
        learning.merge([first, first])


def test_every_algorithm_has_a_label_and_a_factory():
    from benchmarks import learning

    assert set(learning.LABELS) == set(learning.ALGORITHMS)
    for name in learning.ALGORITHMS:
        algorithm = learning.make_algorithm(name, 4, 2, (8,), n_updates=100)
        assert callable(algorithm.update)


def test_a_suite_page_has_a_table_per_task_a_summary_and_neorl2_beside_ours():
    config = {
        "tasks": ["DMSD-v0", "FourTank-v0"],
        "qualities": ["low"],
        "algorithms": ["bc", "td3bc"],
        "n_updates": 1000,
        "batch_size": 256,
        "n_seeds": 5,
        "n_episodes": 10,
        "trajectories": 100,
        "device": "cpu",
    }
    dmsd = _results({"bc": (31.0, 2.0), "td3bc": (40.0, 3.0)}, 30.0)
    tank = _results({"bc": (20.0, 2.0), "td3bc": (31.0, 3.0)}, 30.0)
    # NeoRL-2's DMSD normalization: 100 (R - 30.60) / (849.51 - 30.60)
    dmsd["datasets"]["low"]["returns"]["td3bc"] = {"mean": 440.055, "ci": 9.0, "n": 5}
    results = {"tasks": {"DMSD-v0": dmsd, "FourTank-v0": tank}}
    for task in results["tasks"].values():
        task["checks"] = learning.checks(config, task)
    counts = learning.summary(config, results)
    # BC: 31 > 30 on DMSD only; TD3+BC beats both, significantly only on DMSD (40 - 3 > 30)
    assert counts["bc"] == {"beats": 1, "significantly": 0, "datasets": 2}
    assert counts["td3bc"] == {"beats": 2, "significantly": 1, "datasets": 2}
    page = learning.markdown(config, results)
    assert "| TD3+BC | 2 of 2 | 1 of 2 |" in page
    assert "## DMSD-v0" in page and "## FourTank-v0" in page
    assert "| FourTank-v0-low | 30.0 | 20.0 ± 2.0 | 31.0 ± 3.0 |" in page
    assert "| DMSD-v0 (published) | 56.64 | 65.09 | 70.24 | 60.01 |" in page
    assert "FourTank-v0 (published)" not in page
    # our returns on NeoRL-2's scale beside theirs: behaviour -200 -> -28.16, TD3+BC 50.00
    assert "| DMSD-v0-low (ours, rescored) | -28.16 | — | — | 50.00 |" in page
    assert "FourTank-v0-low (ours, rescored)" not in page
    with pytest.raises(ValueError, match="env_id: NeoRL-2 publishes no normalization"):
        learning.neorl2_normalization("FourTank-v0")


def test_merge_joins_tasks_and_refuses_an_algorithm_twice_on_one_task(tmp_path):
    from benchmarks.harness import BenchmarkResult

    def saved(name: str, tasks: list[str], algorithm: str) -> Path:
        config = {
            "tasks": tasks,
            "qualities": ["low"],
            "algorithms": [algorithm],
            "n_updates": 100,
            "chunk_updates": 100,
            "batch_size": 256,
            "n_seeds": 5,
            "n_episodes": 10,
            "trajectories": 100,
            "device": "cpu",
        }
        results = {"tasks": {}}
        for task in tasks:
            entry = _results({algorithm: (40.0, 2.0)}, 30.0)
            entry["history"] = {algorithm: []}
            results["tasks"][task] = entry
        path = tmp_path / f"{name}.json"
        path.write_text(BenchmarkResult(name="learning", config=config, results=results).to_json())
        return path

    first = saved("a", ["DMSD-v0"], "bc")
    second = saved("b", ["Pipeline-v0", "DMSD-v0"], "td3bc")
    config, results = learning.merge([first, second])
    assert config["tasks"] == ["DMSD-v0", "Pipeline-v0"]
    assert set(results["tasks"]["DMSD-v0"]["datasets"]["low"]["scores"]) == {"bc", "td3bc"}
    assert set(results["tasks"]["Pipeline-v0"]["datasets"]["low"]["scores"]) == {"td3bc"}
    assert results["summary"]["td3bc"]["datasets"] == 2
    with pytest.raises(ValueError, match="'td3bc' on DMSD-v0 appears in two runs"):
        learning.merge([second, saved("c", ["DMSD-v0"], "td3bc")])


def test_unknown_tasks_are_named():
    with pytest.raises(SystemExit):
        learning.parse_args(["--tasks", "Reactor-v9"])
