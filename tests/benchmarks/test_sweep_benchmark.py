"""The sweep benchmark's pieces: the timing of a sweep in one program and its report
(the benchmark itself runs with ``python -m benchmarks.run sweep``)."""

from __future__ import annotations

from benchmarks import sweep
from benchmarks.agent_speed import build_dataset


def test_a_sweep_is_timed_after_its_compilation():
    timing = sweep.sweep_timing(2, build_dataset(2, episode_length=50), 10, 1)
    assert timing["chunk_s"] > 0.0 and timing["compile_s"] >= 0.0


def test_the_report_has_a_row_per_sweep_and_per_device_count():
    results = {
        "sweeps": [
            {
                "runs": runs,
                "chunk_s": 0.1 * runs,
                "compile_s": 5.0,
                "runs_updates_per_s": 1000.0,
                "updates_per_s_per_run": 1000.0 / runs,
                "vs_ours_sequential": 1.0,
                "vs_d3rlpy_sequential": None,
            }
            for runs in (1, 4)
        ],
        "scaling": [
            {"devices": 1, "chunk_s": 1.0, "speedup": 1.0, "efficiency": 1.0},
            {"devices": 2, "chunk_s": 0.6, "speedup": 1.67, "efficiency": 0.83},
        ],
    }
    tables = sweep.report({"hidden": [64, 64], "chunk_updates": 10}, results)
    assert [len(table.rows) for table in tables] == [2, 2, 0]
    assert tables[0].rows[1][0] == 4 and tables[1].rows[1][3] == 0.83
