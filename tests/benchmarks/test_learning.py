"""Tests of the learning study's statistics, checks, page, reward scaling, learning
curves, checkpoints and resume, plots and merge; the full (quick) study runs under the
``slow`` marker. Training runs are tiny: FourTank (60-step episodes), 3 trajectories,
hidden (8,), tens of updates, 2 episodes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import (
    harness,
    learning,
    learning_common,
    learning_page,
    learning_programs,
    learning_progress,
    learning_runs,
)


def test_confidence_interval_is_students_t_over_seeds():
    result = harness.mean_confidence_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert result["mean"] == pytest.approx(3.0)
    # t(0.975, 4) = 2.7764, sample std = sqrt(2.5)
    assert result["ci"] == pytest.approx(2.7764 * np.sqrt(2.5) / np.sqrt(5), rel=1e-4)
    assert harness.mean_confidence_interval([7.0])["ci"] is None


def test_reward_scaling_is_the_registrys_per_algorithm_unless_overridden():
    assert learning_programs.reward_scaling_kind("iql") == "return_range"
    assert learning_programs.reward_scaling_kind("bc") == "std"
    assert learning_programs.reward_scaling_kind("td3bc") == "std"
    for variant in ("cql", "cql_alpha", "cql_bc", "cql_d3rlpy"):
        assert learning_programs.reward_scaling_kind(variant) == "std"
    assert learning_programs.reward_scaling_kind("iql", "std") == "std"
    assert learning_programs.reward_scaling_kind("bc", "none") == "none"


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
    verdicts = learning_page.checks(config, results)
    assert verdicts["bc_low_close_to_behaviour"]["passed"] is True
    assert verdicts["td3bc_low_reaches_behaviour"]["passed"] is True
    assert verdicts["iql_low_reaches_behaviour"]["passed"] is False  # 29 < 30 whatever the CI
    far = learning_page.checks(config, _results({"bc": (5.0, 1.0)}, 30.0))
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
    results["checks"] = learning_page.checks(config, results)
    page = learning_page.markdown(config, results)
    assert "| IB-v0-low | 30.0 | 31.0 ± 2.0 | 40.0 ± 3.0 |" in page
    assert "TD3+BC reaches the behaviour score on low: met" in page


def test_bad_arguments_are_named(capsys):
    with pytest.raises(SystemExit):
        learning.parse_args(["--seeds", "0"])
    with pytest.raises(SystemExit):
        learning.parse_args(["--algorithms", "sac"])
    with pytest.raises(SystemExit):
        learning.parse_args(["--reward-scaling", "minmax"])
    with pytest.raises(SystemExit):
        learning.parse_args(["--updates", "1000", "--chunk", "300"])
    assert "--updates 1000: expected a multiple of --chunk (300)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        learning.parse_args(["--updates", "1000", "--chunk", "100", "--eval-every", "150"])
    assert "--eval-every 150" in capsys.readouterr().err
    quick = learning.parse_args(["--quick"])
    assert (quick.updates, quick.chunk, quick.eval_every) == (200, 100, 100)
    assert learning.checkpoint_tag(quick) == "quick-untagged"


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
            "--images",
            str(tmp_path / "images"),
            "--checkpoint-dir",
            str(tmp_path / "checkpoints"),
            "--results-dir",
            str(tmp_path),
            "-t",
            "test",
        ]
    )
    assert code == 0
    (saved,) = tmp_path.glob("learning-test-*.json")
    data = json.loads(saved.read_text())
    task = data["results"]["tasks"]["IB-v0"]
    scores = task["datasets"]["low"]["per_seed_scores"]["td3bc"]
    assert len(scores) == 2 and all(np.isfinite(scores))
    assert task["curves"]["td3bc"]["updates"] == [100, 200]
    assert "IB-v0-medium" in doc.read_text()
    assert (tmp_path / "images" / "IB-v0-medium.png").is_file()


# ----- training runs: tiny FourTank datasets -----------------------------------------------
TINY = {
    "trajectories": 3,
    "seeds": 2,
    "updates": 30,
    "chunk": 10,
    "eval_every": 20,
    "hidden": (8,),
    "batch_size": 16,
    "episodes": 2,
    "curve_episodes": 2,
}
TINY_FLAGS = [
    "--tasks",
    "FourTank-v0",
    "--qualities",
    "low",
    "medium",
    *[
        item
        for key, value in TINY.items()
        for item in (f"--{key.replace('_', '-')}", *map(str, np.atleast_1d(value)))
    ],
]


@pytest.fixture(scope="module")
def tiny_task():
    """FourTank's datasets (its evaluation compiles fastest of the tasks): 3 episodes of
    60 steps per quality, generated as the study does, shared with the study test (the
    compiled programs are reused)."""
    return learning_runs.prepare_task("FourTank-v0", ["low", "medium"], TINY["trajectories"], 0)


def test_each_dataset_gets_its_own_reward_scaling(tiny_task):
    scaled, scalings = learning_runs.scaled_datasets(tiny_task, "return_range")
    assert scaled.rewards.shape[0] == 2  # stacked: one per dataset
    for index, (dataset, scaling) in enumerate(zip(tiny_task.datasets, scalings, strict=True)):
        returns = np.asarray(dataset.episode_returns())
        assert scaling.kind == "return_range"
        assert scaling.scale == pytest.approx(1000.0 / (returns.max() - returns.min()))
        np.testing.assert_allclose(
            scaled.rewards[index], np.asarray(dataset.rewards) * scaling.scale, rtol=1e-6
        )
    args = learning.parse_args(["--tasks", "FourTank-v0"])
    assert learning_runs.RunSettings.of(args, "FourTank-v0", "iql").reward_scaling == "return_range"
    assert learning_runs.RunSettings.of(args, "FourTank-v0", "cql_bc").reward_scaling == "std"
    args = learning.parse_args(["--tasks", "FourTank-v0", "--reward-scaling", "none"])
    assert learning_runs.RunSettings.of(args, "FourTank-v0", "iql").reward_scaling == "none"


def _settings(algorithm: str, **changes) -> learning_runs.RunSettings:
    fields = {**TINY, "task": "FourTank-v0", "algorithm": algorithm, "data_seed": 0}
    fields.update(qualities=("low", "medium"), **changes)
    fields.setdefault("reward_scaling", learning_programs.reward_scaling_kind(algorithm))
    return learning_runs.RunSettings(**fields)


class _StopAfterFirstChunk(learning_progress.StudyProgress):
    """Kills the run right after its first chunk (and that chunk's checkpoint)."""

    def chunk_done(self, done: int, seconds: float) -> None:
        raise KeyboardInterrupt


def test_a_run_resumed_after_one_chunk_ends_exactly_as_an_uninterrupted_one(tiny_task, tmp_path):
    import jax

    from neorl_industrial.wrappers.training.trainer import CheckpointMismatchError

    settings = _settings("bc")
    straight = learning_runs.run_algorithm(tiny_task, settings, tmp_path / "straight")
    record = straight.record
    # A point every 20 updates; the last one is the final evaluation at 30.
    assert [p["updates"] for p in record["curve"]] == [20, 30]
    assert [p["episodes"] for p in record["curve"]] == [2, 2]
    assert [s["kind"] for s in record["reward_scaling"]] == ["std", "std"]
    assert record["sessions"] == 1 and record["train_s"] > 0 and record["eval_s"] > 0

    with pytest.raises(KeyboardInterrupt):
        learning_runs.run_algorithm(
            tiny_task, settings, tmp_path / "cut", reporter=_StopAfterFirstChunk(rich=False)
        )
    assert learning_runs.RunCheckpoints(tmp_path / "cut").latest() == 10
    with pytest.raises(FileExistsError, match="--resume"):
        learning_runs.run_algorithm(tiny_task, settings, tmp_path / "cut")
    with pytest.raises(CheckpointMismatchError, match="--updates 40 here, 30 in the checkpoint"):
        learning_runs.run_algorithm(
            tiny_task, _settings("bc", updates=40), tmp_path / "cut", resume=True
        )
    with pytest.raises(CheckpointMismatchError, match=r"--hidden \[16\] here, \[8\] in"):
        learning_runs.run_algorithm(
            tiny_task, _settings("bc", hidden=(16,)), tmp_path / "cut", resume=True
        )
    resumed = learning_runs.run_algorithm(tiny_task, settings, tmp_path / "cut", resume=True)

    for a, b in zip(jax.tree.leaves(straight.states), jax.tree.leaves(resumed.states), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert resumed.record["final_returns"] == record["final_returns"]
    assert resumed.record["curve"] == record["curve"]
    assert resumed.record["sessions"] == 2
    assert [h["updates"] for h in resumed.record["history"]] == [10, 20, 30]

    # A finished run is read back, not trained again.
    again = learning_runs.run_algorithm(tiny_task, settings, tmp_path / "straight", resume=True)
    assert again.states is None
    assert again.record["final_returns"] == record["final_returns"]


def test_the_study_records_scaling_curves_and_wall_time_and_plots_them(tmp_path):
    doc = tmp_path / "docs" / "learning.md"
    images = tmp_path / "docs" / "images" / "learning"
    argv = [
        *TINY_FLAGS,
        "--algorithms",
        "bc",
        "--reward-scaling",
        "return_range",
        "--doc",
        str(doc),
        "--images",
        str(images),
        "--checkpoint-dir",
        str(tmp_path / "checkpoints"),
        "--results-dir",
        str(tmp_path),
        "-t",
        "tiny",
    ]
    assert learning.main(argv) == 0
    (saved,) = tmp_path.glob("learning-tiny-*.json")
    data = json.loads(saved.read_text())
    assert data["config"]["reward_scaling"] == "return_range"
    task = data["results"]["tasks"]["FourTank-v0"]
    low = task["datasets"]["low"]
    assert low["reward_scaling"]["bc"]["kind"] == "return_range"
    assert low["reward_scaling"]["bc"]["scale"] > 0
    assert task["curves"]["bc"]["updates"] == [20, 30]
    assert len(task["curves"]["bc"]["scores"]["medium"]) == 2  # points
    assert len(task["curves"]["bc"]["scores"]["medium"][0]) == TINY["seeds"]
    # the final curve point is the final evaluation behind the table
    assert task["curves"]["bc"]["scores"]["low"][-1] == low["per_seed_scores"]["bc"]
    spent = data["results"]["wall_time"]
    assert spent["total_s"] == pytest.approx(spent["train_s"] + spent["eval_s"])
    assert {"train_s", "eval_s", "sessions"} <= set(task["timing"]["bc"])
    for quality in ("low", "medium"):
        assert (images / f"FourTank-v0-{quality}.png").stat().st_size > 1000
    page = doc.read_text()
    assert "![FourTank-v0-low](images/learning/FourTank-v0-low.png)" in page
    assert "| FourTank-v0-low | return_range (scale " in page
    assert "with `return_range` for every algorithm" in page
    assert "Wall time of the study:" in page

    # Finished runs are read back on --resume; without it the checkpoints are refused.
    assert learning.main([*argv, "--no-save"]) == 2
    assert learning.main([*argv, "--no-save", "--resume"]) == 0


def _saved(
    tmp_path,
    name: str,
    algorithm: str,
    qualities: list[str],
    updates: int,
    trajectories=100,
    device="cpu",
    score=40.0,
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
        "device": device,
    }
    results = _results({algorithm: (score, 2.0)}, 30.0)
    results["datasets"] = {q: dict(results["datasets"]["low"]) for q in qualities}
    for entry in results["datasets"].values():
        entry["per_seed_scores"] = {algorithm: [score] * 5}
        entry["reward_scaling"] = {algorithm: {"kind": "std", "shift": 0.0, "scale": 0.5}}
    results["history"] = {algorithm: [{"updates": updates, "seconds": 1.0}]}
    results["curves"] = {
        algorithm: {
            "updates": [updates // 2, updates],
            "episodes": [10, 100],
            "scores": {q: [[20.0, 25.0, 30.0], [38.0, 40.0, 42.0]] for q in qualities},
        }
    }
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
    page = learning_page.markdown(config, results)
    assert "| IB-v0-high | 30.0 | 40.0 ± 2.0 | — |" in page
    other = _saved(tmp_path, "c", "iql", ["low"], 10_000, trajectories=10)
    with pytest.raises(ValueError, match="trajectories"):
        learning.merge([first, other])
    with pytest.raises(ValueError, match="two runs"):
        learning.merge([first, first])


def test_merge_of_runs_on_two_devices_says_which_ran_where(tmp_path):
    first = _saved(tmp_path, "a", "td3bc", ["low"], 10_000)
    second = _saved(tmp_path, "b", "cql", ["low"], 10_000, device="NVIDIA H100")
    config, results = learning.merge([first, second])
    assert config["device"] == {"td3bc": "cpu", "cql": "NVIDIA H100"}
    page = learning_page.markdown(config, results)
    assert "TD3+BC on cpu: 1 s (training 1 s, evaluation 0 s)" in page
    assert "CQL on NVIDIA H100: 1 s" in page
    assert "Devices: TD3+BC on cpu; CQL on NVIDIA H100." in page
    assert "TD3+BC 1 s + 0 s on cpu" in page
    # one device: one wall time, no per-algorithm devices
    config, results = learning.merge([first, _saved(tmp_path, "c", "cql", ["low"], 10_000)])
    assert config["device"] == "cpu"
    page = learning_page.markdown(config, results)
    assert "Device: cpu." in page and " on cpu" not in page


def test_a_row_joins_runs_on_disjoint_datasets_when_the_qualities_are_selected(tmp_path, capsys):
    # CQL on all three datasets on an accelerator, then low re-run on its own on the CPU
    old = _saved(tmp_path, "old", "cql", ["low", "medium", "high"], 10_000, device="H100")
    new = _saved(tmp_path, "new", "cql", ["low"], 10_000, score=55.0)
    bc = _saved(tmp_path, "bc", "bc", ["low", "medium", "high"], 10_000)
    config, results = learning.merge([bc, f"{old}:medium,high", new])
    task = results["tasks"]["IB-v0"]
    assert task["datasets"]["low"]["scores"]["cql"]["mean"] == 55.0
    assert task["datasets"]["low"]["per_seed_scores"]["cql"] == [55.0] * 5
    assert task["datasets"]["medium"]["scores"]["cql"]["mean"] == 40.0
    assert set(task["curves"]["cql"]["scores"]) == {"medium", "high", "low"}
    timing = task["timing"]["cql"]
    assert timing["device"] == "H100 (medium, high); cpu (low)"
    assert [part["qualities"] for part in timing["parts"]] == [["medium", "high"], ["low"]]
    assert timing["train_s"] == pytest.approx(2.0)
    assert [entry["qualities"] for entry in task["history"]["cql"]] == [["medium", "high"], ["low"]]
    assert config["merged_from"] == ["bc.json", "old.json:medium,high", "new.json"]
    page = learning_page.markdown(config, results)
    assert "CQL on H100 (medium, high); cpu (low)" in page
    assert "| IB-v0-low | 30.0 | 40.0 ± 2.0 | 55.0 ± 2.0 |" in page
    assert [source["file"] for source in config["sources"]] == config["merged_from"]
    assert "- `old.json:medium,high`: " in page and "(commit unknown, " in page
    # the merged study merges again, with another run, and keeps the original runs
    again = tmp_path / "again.json"
    again.write_text(
        harness.BenchmarkResult(name="learning", config=config, results=results).to_json()
    )
    td3bc = _saved(tmp_path, "td3bc", "td3bc", ["low"], 10_000)
    config, results = learning.merge([again, td3bc])
    assert results["tasks"]["IB-v0"]["timing"]["cql"]["parts"]
    assert [source["file"] for source in config["sources"]] == [
        "bc.json",
        "old.json:medium,high",
        "new.json",
        "td3bc.json",
    ]
    # each dataset from one run, one budget per row, and selections that name what is there
    with pytest.raises(ValueError, match=r"'cql' on IB-v0 appears in two runs \(on low\)"):
        learning.merge([old, new])
    other_budget = _saved(tmp_path, "b5k", "cql", ["low"], 5_000)
    with pytest.raises(ValueError, match="5,000 updates, where its other datasets had 10,000"):
        learning.merge([f"{old}:medium,high", other_budget])
    with pytest.raises(ValueError, match="unknown quality 'lo'"):
        learning.merge([f"{old}:lo"])
    with pytest.raises(ValueError, match="the run holds no high dataset"):
        learning.merge([f"{new}:high"])
    assert learning.main(["--merge", str(old), str(new), "--no-save"]) == 2
    assert "appears in two runs (on low)" in capsys.readouterr().err


def test_a_diverged_curve_is_drawn_on_the_floor_not_stretching_the_axis(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    config, results = learning.merge([_saved(tmp_path, "a", "cql", ["low"], 10_000)])
    curve = results["tasks"]["IB-v0"]["curves"]["cql"]
    curve["scores"]["low"][0] = [-1800.0, 40.0, 42.0]  # one seed far below
    limits = []
    original = Axes.set_ylim
    monkeypatch.setattr(
        Axes, "set_ylim", lambda self, *a, **k: limits.append(a) or original(self, *a, **k)
    )
    (written,) = learning_page.plot_curves(config, results, tmp_path / "images")
    assert written.stat().st_size > 0
    assert limits[-1] == (learning_page.SCORE_FLOOR - 15.0, 100.0 + 15.0)


def test_merge_keeps_curves_and_reward_scaling_and_plots_them(tmp_path):
    first = _saved(tmp_path, "a", "td3bc", ["low", "medium"], 10_000)
    second = _saved(tmp_path, "b", "cql", ["low"], 5_000)
    config, results = learning.merge([first, second])
    task = results["tasks"]["IB-v0"]
    assert task["curves"]["td3bc"]["updates"] == [5_000, 10_000]
    assert task["curves"]["cql"]["updates"] == [2_500, 5_000]
    assert set(task["datasets"]["low"]["reward_scaling"]) == {"td3bc", "cql"}
    assert "cql" not in task["datasets"]["medium"]["reward_scaling"]
    assert results["wall_time"]["train_s"] == pytest.approx(2.0)
    written = learning_page.plot_curves(config, results, tmp_path / "images")
    assert sorted(path.name for path in written) == ["IB-v0-low.png", "IB-v0-medium.png"]
    page = learning_page.markdown(config, results, "images")
    assert "![IB-v0-medium](images/IB-v0-medium.png)" in page
    assert "| IB-v0-low | std (scale 0.5) | std (scale 0.5) |" in page
    # without curves (runs saved before them): no plots and no images on the page
    for task in results["tasks"].values():
        task.pop("curves")
    assert learning_page.plot_curves(config, results, tmp_path / "none") == []
    assert "![" not in learning_page.markdown(config, results, "images")


def test_the_progress_bar_names_the_run_and_its_last_score():
    import io

    from rich.console import Console

    stream = io.StringIO()
    console = Console(file=stream, force_terminal=True, width=160)
    with learning_progress.StudyProgress(300, 100, rich=True, console=console) as bars:
        bars.run_skipped("IB-v0 BC", 100)
        bars.run_begin("IB-v0 TD3+BC", 0, 200)
        bars.chunk_done(100, 1.0)
        bars.evaluated(100, {"low": 31.25, "medium": 47.5}, final=False)
        bars.run_end()
    text = stream.getvalue()
    assert "IB-v0 TD3+BC" in text and "low 31.2, medium 47.5" in text
    assert "200/300" in text  # the study: 100 read back + 100 trained


def test_every_algorithm_has_a_label_and_a_factory():
    assert set(learning_common.LABELS) == set(learning_common.ALGORITHMS)
    for name in learning_common.ALGORITHMS:
        algorithm = learning_programs.make_algorithm(name, 4, 2, (8,), n_updates=100)
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
        task["checks"] = learning_page.checks(config, task)
    counts = learning_page.summary(config, results)
    # BC: 31 > 30 on DMSD only; TD3+BC beats both, significantly only on DMSD (40 - 3 > 30)
    assert counts["bc"] == {"beats": 1, "significantly": 0, "datasets": 2}
    assert counts["td3bc"] == {"beats": 2, "significantly": 1, "datasets": 2}
    page = learning_page.markdown(config, results)
    assert "| TD3+BC | 2 of 2 | 1 of 2 |" in page
    assert "## DMSD-v0" in page and "## FourTank-v0" in page
    assert "| FourTank-v0-low | 30.0 | 20.0 ± 2.0 | 31.0 ± 3.0 |" in page
    assert "| DMSD-v0 (published) | 56.64 | 65.09 | 70.24 | 60.01 |" in page
    assert "FourTank-v0 (published)" not in page
    # our returns on NeoRL-2's scale beside theirs: behaviour -200 -> -28.16, TD3+BC 50.00
    assert "| DMSD-v0-low (ours, rescored) | -28.16 | — | — | 50.00 |" in page
    assert "FourTank-v0-low (ours, rescored)" not in page
    with pytest.raises(ValueError, match="env_id: NeoRL-2 publishes no normalization"):
        learning_page.neorl2_normalization("FourTank-v0")


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


def test_mopo_runs_on_every_dataset_each_with_its_own_plant_model(tiny_task):
    settings = _settings("mopo", batch_size=64, model_updates=100, model_hidden=(16,))
    outcome = learning_runs.run_algorithm(tiny_task, settings)
    record = outcome.record
    assert np.all(np.isfinite(np.asarray(record["final_returns"])))
    assert len(record["models"]) == 2 and record["model_fit_s"] > 0.0
    assert record["settings"]["model_updates"] == 100
    assert record["settings"]["model_hidden"] == [16]
    assert [model["hidden"] for model in record["models"]] == [[16], [16]]
    # model-free runs as before; the model's default widths are not written either
    assert not {"model_updates", "model_hidden"} & set(_settings("td3bc").to_dict())
    assert "model_hidden" not in _settings("mopo", model_updates=100).to_dict()
    models = outcome.states.agent.model.params.obs_mean  # [dataset, seed, obs]
    np.testing.assert_array_equal(models[0, 0], models[0, 1])  # one model per dataset ...
    assert not np.allclose(models[0, 0], models[1, 0])  # ... each its own
    penalties = [entry["metrics"]["model_penalty"] for entry in record["history"]]
    assert np.all(np.asarray(penalties) > 0.0)
