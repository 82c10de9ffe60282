"""Tests of the benchmark harness, runner and compare tool.

Fast: the real benchmark is not run; the runner is exercised end to end with a small fake
benchmark, and the compare tool with synthetic result files.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import compare, env_throughput, harness
from benchmarks import run as runner

SYSTEM_KEYS = {
    "platform",
    "python_version",
    "cpu_model",
    "cpu_count_logical",
    "cpu_affinity",
    "memory_total_bytes",
    "jax_version",
    "jaxlib_version",
    "jax_devices",
    "jax_default_backend",
    "numpy_version",
    "package_version",
    "git_commit",
}


# --------------------------------------------------------------------------- system_info


def test_system_info_describes_this_machine() -> None:
    import jax

    import neorl_industrial

    info = harness.system_info()
    assert set(info) >= SYSTEM_KEYS
    assert info["python_version"] == platform.python_version()
    assert info["cpu_count_logical"] == os.cpu_count()
    assert info["jax_version"] == jax.__version__
    assert info["numpy_version"] == np.__version__
    assert info["package_version"] == neorl_industrial.__version__
    assert info["jax_default_backend"] == jax.default_backend()
    assert info["jax_devices"] and all(isinstance(d, str) for d in info["jax_devices"])
    assert info["memory_total_bytes"] is None or info["memory_total_bytes"] > 0
    if hasattr(os, "sched_getaffinity"):
        assert info["cpu_affinity"] == sorted(os.sched_getaffinity(0))
    if info["git_commit"] is not None:
        assert re.fullmatch(r"[0-9a-f]{40}", info["git_commit"])
    json.dumps(info, allow_nan=False)  # storable as is


def test_system_info_tolerates_missing_git(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_git(*args: Any, **kwargs: Any) -> Any:
        raise FileNotFoundError("git")

    monkeypatch.setattr(harness.subprocess, "run", no_git)
    harness.code_state.cache_clear()
    try:
        info = harness.system_info()
        assert info["git_commit"] is None
        assert info["git_dirty"] is None
    finally:
        harness.code_state.cache_clear()


def test_the_commit_recorded_is_the_one_the_process_started_with(monkeypatch):
    started_with = harness.code_state()
    monkeypatch.setattr(harness, "_git", lambda *args: "f" * 40)  # a commit made since
    assert (harness.system_info()["git_commit"], harness.system_info()["git_dirty"]) == (
        started_with
    )


def test_git_failure_exit_status_gives_none(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(*args: Any, **kwargs: Any) -> Any:
        raise subprocess.CalledProcessError(128, args[0])

    monkeypatch.setattr(harness.subprocess, "run", failing)
    assert harness._git("rev-parse", "HEAD") is None


def test_affinity_note_tells_pinned_from_unpinned() -> None:
    assert "Pinned to CPU 3" in harness.affinity_note({"cpu_affinity": [3], "cpu_count_logical": 8})
    unpinned = harness.affinity_note({"cpu_affinity": [0, 1], "cpu_count_logical": 2})
    assert "Not pinned" in unpinned and "taskset -c 0" in unpinned


# --------------------------------------------------------------------------- timing


def test_time_best_returns_the_smallest_of_the_timed_calls() -> None:
    # Each call of fn advances the fake clock by the next duration; 100.0 is the warm-up.
    durations = iter([100.0, 5.0, 2.0, 3.0])
    now = [0.0]
    calls = []

    def fn() -> None:
        calls.append(1)
        now[0] += next(durations)

    best, times = harness.time_best(fn, repeats=3, warmup=1, clock=lambda: now[0])
    assert len(calls) == 4
    assert times == [5.0, 2.0, 3.0]
    assert best == 2.0


@pytest.mark.parametrize(("repeats", "warmup"), [(0, 1), (1, -1)])
def test_time_best_rejects_bad_counts(repeats: int, warmup: int) -> None:
    with pytest.raises(ValueError):
        harness.time_best(lambda: None, repeats=repeats, warmup=warmup)


def test_rate_and_ratio_handle_missing_values() -> None:
    assert harness.rate(1000, 0.5) == 2000.0
    assert harness.rate(1000, 0.0) is None
    assert harness.ratio(300.0, 100.0) == 3.0
    assert harness.ratio(None, 100.0) is None
    assert harness.ratio(300.0, 0.0) is None


def test_format_number() -> None:
    assert harness.format_number(2_850_833.3) == "2.85M"
    assert harness.format_number(222_029.2) == "222k"
    assert harness.format_number(14_428.8) == "14,429"
    assert harness.format_number(15.3879) == "15.4"
    assert harness.format_number(None) == "-"
    assert harness.format_number(True) == "yes"
    assert harness.format_number(1000) == "1000"


# --------------------------------------------------------------------------- results


def _result(**overrides: Any) -> harness.BenchmarkResult:
    fields: dict[str, Any] = {
        "name": "env_throughput",
        "description": "a test run",
        "tag": "unit test/1",
        "timestamp": "2025-01-31T12:34:56+00:00",
        "system": {"cpu_affinity": [0]},
        "config": {"sizes": (1, 10), "quick": True},
        "results": {
            "rate": np.float32(1.5),
            "array": np.arange(3),
            "missing": float("nan"),
            "path": Path("a") / "b",
        },
    }
    fields.update(overrides)
    return harness.BenchmarkResult(**fields)


def test_result_round_trips_through_save_and_load(tmp_path: Path) -> None:
    result = _result()
    path = result.save(tmp_path)
    assert path.parent == tmp_path
    assert path.name == "env_throughput-unit_test_1-20250131T123456Z.json"
    assert sorted(os.listdir(tmp_path)) == [path.name]  # no temporary file left behind

    loaded = harness.BenchmarkResult.load(path)
    assert loaded.to_dict() == result.to_dict()
    assert loaded.results == {"rate": 1.5, "array": [0, 1, 2], "missing": None, "path": "a/b"}
    assert loaded.config["sizes"] == [1, 10]
    assert loaded.timestamp == "2025-01-31T12:34:56+00:00"
    assert json.loads(path.read_text())["schema_version"] == harness.SCHEMA_VERSION


def test_save_never_overwrites(tmp_path: Path) -> None:
    first = _result(description="first").save(tmp_path)
    second = _result(description="second").save(tmp_path)
    assert first != second
    assert second.name == "env_throughput-unit_test_1-20250131T123456Z-2.json"
    assert harness.BenchmarkResult.load(first).description == "first"
    assert harness.BenchmarkResult.load(second).description == "second"


def test_unserialisable_result_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        _result(results={"bad": object()}).save(tmp_path)
    assert os.listdir(tmp_path) == []


def test_failed_move_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    moves = []

    def failing_replace(source: str, target: str) -> None:
        moves.append((source, target))
        assert Path(source).read_text().startswith("{")  # complete document in the temp file
        raise OSError("disk full")

    monkeypatch.setattr(harness.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        _result().save(tmp_path)
    assert len(moves) == 1
    assert Path(moves[0][0]).parent == tmp_path  # temp file in the same directory
    assert os.listdir(tmp_path) == []


def test_a_study_saves_its_result_then_its_page_and_keeps_the_old_page_on_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = tmp_path / "page.md"
    args = types.SimpleNamespace(
        description="a study", tag="t1", results_dir=tmp_path / "results", doc=doc
    )
    path = harness.save_study("study", args, "2026-01-02T03:04:05Z", {"n": 1}, {"x": 2}, "# Page\n")
    saved = harness.BenchmarkResult.load(path)
    assert (saved.name, saved.tag, saved.description) == ("study", "t1", "a study")
    assert saved.config == {"n": 1} and saved.results == {"x": 2} and saved.system
    assert doc.read_text() == "# Page\n"

    def failing_replace(source: str, target: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(harness.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        harness.write_atomically(doc, "# Half")
    assert doc.read_text() == "# Page\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.md", "results"]


def test_publish_prints_the_page_and_saves_unless_told_not_to(tmp_path: Path, capsys) -> None:
    doc = tmp_path / "page.md"
    args = types.SimpleNamespace(
        description="a study", tag="t1", results_dir=tmp_path / "results", doc=doc, no_save=True
    )
    assert harness.publish_study("study", args, "2026-01-02T03:04:05Z", {}, {}, "# P\n") is None
    assert capsys.readouterr().out == "# P\n\n" and not doc.exists()
    assert not (tmp_path / "results").exists()
    args.no_save = False
    path = harness.publish_study("study", args, "2026-01-02T03:04:05Z", {"n": 1}, {}, "# P\n")
    assert harness.BenchmarkResult.load(path).config == {"n": 1}
    assert doc.read_text() == "# P\n"
    assert f"Wrote {path} and {doc}" in capsys.readouterr().err


def test_load_rejects_other_json(tmp_path: Path) -> None:
    path = tmp_path / "other.json"
    path.write_text("[1, 2, 3]")
    with pytest.raises(ValueError):
        harness.BenchmarkResult.load(path)


def test_default_timestamp_is_utc_iso8601() -> None:
    result = harness.BenchmarkResult(name="x")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", result.timestamp)
    assert re.fullmatch(r"x-untagged-\d{8}T\d{6}Z\.json", result.filename())


# --------------------------------------------------------------------------- compare


def _write_synthetic_runs(directory: Path) -> tuple[Path, Path]:
    """Run A: reference 1000 steps/s. Run B (later): reference 2000 steps/s."""
    run_a = harness.BenchmarkResult(
        name="env_throughput",
        description="baseline",
        tag="a",
        timestamp="2025-01-01T00:00:00+00:00",
        results={
            "reference": {"steps_per_s": 1000.0},
            "scan_single": {"IB-classic-v0": {"steps_per_s": 15_000.0}},
            "batched": {
                "IB-classic-v0": [
                    {"n_envs": 1, "n_steps": 2000, "steps_per_s": 2000.0},
                    {"n_envs": 100, "n_steps": 2000, "steps_per_s": 50_000.0},
                    {"n_envs": 1000, "n_steps": 2000, "steps_per_s": 400_000.0},
                ],
                "IB-v0": [{"n_envs": 1000, "n_steps": 2000, "steps_per_s": 300_000.0}],
            },
            "compile": {
                "batched": {"IB-classic-v0": {"compile_s": 1.5}, "IB-v0": {"compile_s": 2.5}}
            },
            "gymnasium": {"steps_per_s": 500.0},
        },
    )
    run_b = harness.BenchmarkResult(
        name="env_throughput",
        description="faster machine",
        tag="b",
        timestamp="2025-02-01T00:00:00+00:00",
        results={
            "reference": {"steps_per_s": 2000.0},
            "batched": {
                "IB-classic-v0": [
                    {"n_envs": 1, "n_steps": 2000, "steps_per_s": 3000.0},
                    # a stale stored ratio must not be used: ratios are recomputed in-run
                    {"n_envs": 1000, "n_steps": 2000, "steps_per_s": 1_000_000.0, "ratio": 7.0},
                ]
            },
        },
    )
    return run_a.save(directory), run_b.save(directory)


@pytest.fixture
def runs(tmp_path: Path) -> list[harness.BenchmarkResult]:
    path_a, path_b = _write_synthetic_runs(tmp_path)
    loaded = compare.load_runs(compare.result_paths([path_b, path_a]))
    assert [run.tag for run in loaded] == ["a", "b"]  # sorted by timestamp
    return loaded


def test_overview_rows_compute_ratios_within_each_run(runs: list[harness.BenchmarkResult]) -> None:
    row_a, row_b = compare.overview_rows(runs)
    assert row_a["tag"] == "a" and row_a["description"] == "baseline"
    assert row_a["timestamp"] == "2025-01-01 00:00:00"
    assert row_a["batched_best_steps_per_s"] == 400_000.0
    assert row_a["batched_best_n_envs"] == 1000
    assert row_a["batched_best_env_id"] == "IB-classic-v0"
    assert row_a["batched_best_ratio"] == pytest.approx(400.0)
    assert row_a["scan_single_ratio"] == pytest.approx(15.0)
    assert row_a["compile_s"] == 2.5  # worst environment id
    assert row_a["gymnasium_ratio"] == pytest.approx(0.5)
    assert row_a["vector_env_ratio"] is None

    assert row_b["batched_best_steps_per_s"] == 1_000_000.0
    assert row_b["batched_best_ratio"] == pytest.approx(500.0)  # 1e6 / 2000, not / 1000
    assert row_b["scan_single_ratio"] is None
    assert row_b["compile_s"] is None


def test_batch_size_rows(runs: list[harness.BenchmarkResult]) -> None:
    rows = compare.batch_size_rows(runs, 1000)
    assert [(r["tag"], r["env_id"]) for r in rows] == [
        ("a", "IB-classic-v0"),
        ("a", "IB-v0"),
        ("b", "IB-classic-v0"),
    ]
    assert [r["ratio"] for r in rows] == pytest.approx([400.0, 300.0, 500.0])
    assert [r["reference_steps_per_s"] for r in rows] == [1000.0, 1000.0, 2000.0]

    rows = compare.batch_size_rows(runs, 100)
    assert len(rows) == 2
    assert rows[0]["env_id"] == "IB-classic-v0" and rows[0]["ratio"] == pytest.approx(50.0)
    assert rows[1]["tag"] == "b" and rows[1]["env_id"] is None and rows[1]["ratio"] is None


def test_scaling_rows(runs: list[harness.BenchmarkResult]) -> None:
    rows_a = compare.scaling_rows(runs[0])
    assert [row["n_envs"] for row in rows_a] == [1, 100, 1000]
    assert [row["IB-classic-v0 ratio"] for row in rows_a] == pytest.approx([2.0, 50.0, 400.0])
    assert [row["IB-v0 ratio"] for row in rows_a] == [None, None, pytest.approx(300.0)]
    assert rows_a[2]["IB-v0 steps/s"] == 300_000.0

    rows_b = compare.scaling_rows(runs[1])
    assert [row["n_envs"] for row in rows_b] == [1, 1000]
    assert [row["IB-classic-v0 ratio"] for row in rows_b] == pytest.approx([1.5, 500.0])

    tables = compare.scaling_tables(runs)
    assert len(tables) == 2
    assert tables[0].columns[0] == "n_envs"
    assert tables[1].rows[1][2] == pytest.approx(500.0)


def test_missing_keys_give_empty_cells(tmp_path: Path) -> None:
    empty = harness.BenchmarkResult(name="other", timestamp="2025-03-01T00:00:00+00:00")
    odd = harness.BenchmarkResult(
        name="env_throughput",
        timestamp="2025-03-02T00:00:00+00:00",
        results={"reference": "n/a", "batched": {"IB-v0": [{"n_envs": "many"}, 3]}},
    )
    runs = [empty, odd]
    rows = compare.overview_rows(runs)
    assert rows[0]["reference_steps_per_s"] is None
    assert rows[1]["batched_best_steps_per_s"] is None
    assert compare.scaling_tables(runs) == []
    assert [row["ratio"] for row in compare.batch_size_rows(runs, 10)] == [None, None]


def test_compare_cli(
    tmp_path: Path, runs: list[harness.BenchmarkResult], capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "broken.json").write_text("{not json")
    assert compare.main([str(tmp_path), "--scaling"]) == 0
    captured = capsys.readouterr()
    assert "skipping" in captured.err and "broken.json" in captured.err
    assert "400" in captured.out and "500" in captured.out

    assert compare.main([str(tmp_path), "--batch-size", "100", "--tag", "a"]) == 0
    output = capsys.readouterr().out
    assert "50" in output and "faster machine" not in output

    assert compare.main([str(tmp_path), "--name", "env_throughput"]) == 0
    output = capsys.readouterr().out
    assert "baseline" in output and "faster machine" in output

    assert compare.main([str(tmp_path), "--tag", "nonexistent"]) == 1


# --------------------------------------------------------------------------- runner


def _fake_benchmark() -> types.ModuleType:
    module = types.ModuleType("fake_benchmark")
    module.DESCRIPTION = "a fake benchmark for tests"  # type: ignore[attr-defined]

    def run(quick: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
        size = 3 if quick else 30
        return {"size": size}, {"total": float(sum(range(size))), "nested": {"count": size}}

    module.run = run  # type: ignore[attr-defined]
    return module


def test_runner_end_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(runner.BENCHMARKS, "fake", _fake_benchmark())
    argv = ["fake", "--quick", "-d", "smoke test", "-t", "unit", "--output-dir", str(tmp_path)]
    assert runner.main(argv) == 0

    files = os.listdir(tmp_path)
    assert len(files) == 1 and re.fullmatch(r"fake-unit-\d{8}T\d{6}Z\.json", files[0])
    result = harness.BenchmarkResult.load(tmp_path / files[0])
    assert result.name == "fake" and result.tag == "unit" and result.description == "smoke test"
    assert result.config == {"quick": True, "size": 3}
    assert result.results["total"] == 3.0
    assert result.results["nested"] == {"count": 3}
    assert result.results["wall_s"] >= 0
    assert set(result.system) >= SYSTEM_KEYS

    output = capsys.readouterr().out
    assert f"Wrote {tmp_path / files[0]}" in output
    assert "nested.count" in output
    assert "CPU" in output  # the pinning note


def test_runner_list_and_unknown_names(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(runner.BENCHMARKS, "fake", _fake_benchmark())
    assert runner.main(["--list"]) == 0
    output = capsys.readouterr().out
    assert "fake" in output and "a fake benchmark for tests" in output
    assert "env_throughput" in output

    with pytest.raises(SystemExit) as exit_info:
        runner.main(["no_such_benchmark"])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit):
        runner.main([])


# --------------------------------------------------------------------------- env_throughput


def test_env_throughput_settings() -> None:
    full = env_throughput.settings(quick=False)
    assert full.batch_sizes == (1, 10, 100, 1000, 4096, 16384)
    assert [full.batched_steps(n) for n in (1, 1000, 16384)] == [2000, 2000, 244]
    quick = env_throughput.settings(quick=True)
    assert quick.batch_sizes == (1, 100, 1000)
    assert all(quick.batched_steps(n) * n <= 500_000 for n in quick.batch_sizes)
    assert set(full.env_ids) == {"IB-classic-v0", "IB-v0"}


@pytest.mark.parametrize(
    ("batched", "scan", "compile_s", "expected"),
    [
        (400.0, 10.0, 1.99, (True, True, True)),
        (399.9, 9.99, 2.0, (False, False, False)),
        (None, 12.0, None, (None, True, None)),
    ],
)
def test_env_throughput_targets(
    batched: float | None, scan: float | None, compile_s: float | None, expected: tuple
) -> None:
    summary = {
        "batched_best_ratio": batched,
        "scan_single_ratio": scan,
        "compile_s": compile_s,
    }
    targets = env_throughput.evaluate_targets({"summary": summary})
    passed = tuple(
        targets[name]["passed"] for name in ("batched_best_ratio", "scan_single_ratio", "compile_s")
    )
    assert passed == expected
    assert targets["batched_best_ratio"]["threshold"] == 400.0


def test_env_throughput_report_reads_synthetic_results(tmp_path: Path) -> None:
    (path_a, _) = _write_synthetic_runs(tmp_path)
    results = harness.BenchmarkResult.load(path_a).results
    tables = env_throughput.report({}, results)
    scaling = next(table for table in tables if table.columns[0] == "n_envs")
    assert [row[0] for row in scaling.rows] == [1, 100, 1000]
    assert scaling.rows[2][2] == 400_000.0  # IB-classic-v0 steps/s at n_envs=1000


def test_env_throughput_functions_keep_the_observation_work() -> None:
    import jax

    key = jax.random.PRNGKey(0)
    total, observation = jax.eval_shape(env_throughput._batched_fn("IB-v0", 2, 3), key)
    assert total.shape == (2,)
    assert observation.shape == (2, 180)
    # The observation history is part of the timed program, so IB-v0's differs from classic's.
    programs = [
        jax.jit(env_throughput._batched_fn(env_id, 2, 3)).lower(key).as_text()
        for env_id in ("IB-classic-v0", "IB-v0")
    ]
    assert programs[0] != programs[1]
    total, state = jax.eval_shape(env_throughput._scan_fn("IB-v0", 3), key)
    assert total.shape == ()
    assert state.history.shape == (30, 6)


def test_the_recorded_command_names_no_path_of_this_machine() -> None:
    from benchmarks.harness import REPO_ROOT, portable_argv

    inside = str(REPO_ROOT / "benchmarks" / "results")
    argv = ["--doc", "/somewhere/else/page.md", f"--results-dir={inside}", "-t", "tag", "3"]
    assert portable_argv(argv) == [
        "--doc",
        "page.md",
        "--results-dir=benchmarks/results",
        "-t",
        "tag",
        "3",
    ]
