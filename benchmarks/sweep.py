"""Sweep benchmark: a grid of TD3+BC runs trained as one program against the same runs
trained one after the other, ours and d3rlpy's, and the runs laid over 1, 2 and 4 devices.

* **one program** - ``train_sweep`` of R runs (R configurations of ``alpha``, one seed
  each; (64, 64) networks, batch 256, the IB-shaped synthetic data of ``agent_speed``) for
  R in 1, 4, 16, 64: the best steady chunk's seconds give runs x updates per second and
  updates per second per run; the first chunk's extra time is the compilation.
* **ours, one after the other** - the same runs trained sequentially cost R times one
  run's chunk (every run has the same shapes, so one compilation serves them all).
* **d3rlpy, one after the other** - d3rlpy 2.8's TD3+BC at the same sizes, updates per
  second in its Python loop (``agent_speed.measure_d3rlpy``), times R runs. Skipped (and
  said so) where d3rlpy is not installed: run in the peer environment
  (``make peer-env``; ``.venv-d3rlpy/bin/python -m benchmarks.run sweep``).
* **data-parallel** - one run over the same meshes (``train_data_parallel``, one shard
  of episodes per device): seconds per chunk, efficiency, and the dataset's bytes per
  device, which is what data parallelism divides.
* **device scaling** - R = 16 runs over a mesh of 1, 2 and 4 forced host devices
  (``--xla_force_host_platform_device_count``, a child process each): seconds per chunk
  and the parallel efficiency ``t1 / (n tn)``. On a 2-core CPU the forced devices share
  the two cores, which bounds the scaling; on an accelerator host the same code spreads
  the runs over real devices.

Target: a 16-run sweep finishes at least 10x faster than 16 sequential d3rlpy runs of the
same size and budget.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from typing import Any

import numpy as np

from benchmarks.agent_speed import (
    BATCH_SIZE,
    build_dataset,
    d3rlpy_dataset,
    matmul_peak,
    measure_d3rlpy,
    update_flops,
)
from benchmarks.harness import Table, evaluate_targets, progress, ratio

DESCRIPTION = "TD3+BC sweeps as one program vs sequential runs (ours, d3rlpy); device scaling"
HIDDEN = (64, 64)
TARGETS = {
    "sweep16_vs_d3rlpy_sequential": (
        ">=",
        10.0,
        "a 16-run TD3+BC sweep at (64, 64) vs 16 sequential d3rlpy runs",
    )
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Sizes of one run of the benchmark.

    Attributes:
        quick: the small version.
        runs: the sweep sizes measured.
        n_episodes: episodes (of 1000 steps) of the synthetic data.
        chunk_updates: updates per timed chunk.
        repeats: timed chunks after the first (the best is kept).
        d3rlpy_updates: updates of the timed d3rlpy loop.
        devices: forced host device counts of the scaling measurement.
        scaling_runs: runs of the scaling measurement.
    """

    quick: bool
    runs: tuple[int, ...]
    n_episodes: int
    chunk_updates: int
    repeats: int
    d3rlpy_updates: int
    devices: tuple[int, ...]
    scaling_runs: int


def settings(quick: bool) -> Settings:
    if quick:
        return Settings(True, (1, 4), 4, 20, 1, 4, (1, 2), 4)
    return Settings(False, (1, 4, 16, 64), 100, 500, 2, 300, (1, 2, 4), 16)


def sweep_timing(
    n_runs: int, dataset: Any, chunk_updates: int, repeats: int, mesh: Any = None
) -> dict[str, float]:
    """Seconds of ``n_runs`` TD3+BC runs' chunk in one program: the best steady chunk
    and the compilation (the first chunk's extra time)."""
    from neorl_industrial.functional.transformations.offline import Schedule
    from neorl_industrial.functional.transformations.sweep import plan_sweep, train_sweep

    plan = plan_sweep(
        "td3bc",
        {"alpha": [float(a) for a in np.linspace(1.0, 5.0, n_runs)]},
        seeds=(0,),
        obs_size=int(dataset.observation_size),
        action_size=int(dataset.action_size),
        hyperparameters={"hidden": list(HIDDEN)},
    )
    result = train_sweep(
        plan,
        dataset,
        schedule=Schedule(
            n_updates=chunk_updates * (repeats + 1),
            chunk_updates=chunk_updates,
            batch_size=BATCH_SIZE,
        ),
        mesh=mesh,
    )
    seconds = [entry["seconds"] for entry in result.history]
    steady = min(seconds[1:])
    return {"chunk_s": steady, "compile_s": max(seconds[0] - steady, 0.0)}


def scaling_child(n_runs: int, n_episodes: int, chunk_updates: int, repeats: int) -> dict:
    """Runs in a child process with forced host devices: the sweep over all of them."""
    import jax

    from neorl_industrial.functional.transformations.sweep import runs_mesh

    dataset = build_dataset(n_episodes)
    timing = sweep_timing(n_runs, dataset, chunk_updates, repeats, mesh=runs_mesh())
    return {"devices": len(jax.devices()), **timing}


def data_parallel_child(n_episodes: int, chunk_updates: int, repeats: int) -> dict:
    """Runs in a child process with forced host devices: one TD3+BC run data-parallel over
    all of them (one shard per device)."""
    import jax

    from benchmarks.agent_speed import make_algorithm
    from neorl_industrial.functional.transformations.data_parallel import (
        data_mesh,
        split_dataset,
        train_data_parallel,
    )
    from neorl_industrial.functional.transformations.offline import Schedule

    dataset = build_dataset(n_episodes)
    mesh = data_mesh()
    data = split_dataset(dataset, mesh=mesh)
    _, history = train_data_parallel(
        make_algorithm("td3bc", HIDDEN),
        data,
        mesh=mesh,
        schedule=Schedule(
            n_updates=chunk_updates * (repeats + 1),
            chunk_updates=chunk_updates,
            batch_size=BATCH_SIZE,
        ),
    )
    per_device = sum(
        leaf.addressable_shards[0].data.nbytes for leaf in jax.tree.leaves(data.shards)
    )
    return {
        "devices": len(jax.devices()),
        "chunk_s": min(entry["seconds"] for entry in history[1:]),
        "dataset_bytes": dataset.nbytes(),
        "dataset_bytes_per_device": int(per_device),
    }


def _in_child(code: str, devices: int) -> dict[str, Any]:
    """The JSON a child process with ``devices`` forced host devices prints last."""
    environment = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_PLATFORMS": "cpu",
        "NEORL_INDUSTRIAL_JAX_CACHE": "0",
    }
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environment, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _with_speedup(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    base = rows[0]["chunk_s"]
    for row in rows:
        row["speedup"] = base / row["chunk_s"]
        row["efficiency"] = base / (row["devices"] * row["chunk_s"])
    return rows


def over_devices(cfg: Settings, what: str, call: str) -> list[dict[str, Any]]:
    """``call`` (a child function of this module with its arguments) in a child process per
    forced device count, with speedup and efficiency against the first count."""
    rows = []
    for count in cfg.devices:
        progress(f"{what} over {count} forced device(s)")
        code = f"import json; from benchmarks import sweep; print(json.dumps(sweep.{call}))"
        rows.append(_in_child(code, count))
    return _with_speedup(rows)


def measure_data_parallel(cfg: Settings) -> list[dict[str, Any]]:
    return over_devices(
        cfg,
        "data-parallel: one run",
        f"data_parallel_child({cfg.n_episodes}, {cfg.chunk_updates}, {cfg.repeats})",
    )


def measure_scaling(cfg: Settings) -> list[dict[str, Any]]:
    return over_devices(
        cfg,
        f"scaling: {cfg.scaling_runs} runs",
        f"scaling_child({cfg.scaling_runs}, {cfg.n_episodes}, {cfg.chunk_updates}, {cfg.repeats})",
    )


def run(quick: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """Runs the benchmark; ``(config, results)`` for a :class:`BenchmarkResult`."""
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
    cfg = settings(quick)
    progress(f"data: {cfg.n_episodes} episodes x 1000 steps")
    dataset = build_dataset(cfg.n_episodes)
    try:
        theirs_data = d3rlpy_dataset(cfg.n_episodes)
    except ImportError:
        theirs_data = None
        progress("d3rlpy is not installed here: its rows are skipped (make peer-env)")
    d3rlpy_rate = None
    if theirs_data is not None:
        progress("d3rlpy: TD3+BC updates per second")
        measured = measure_d3rlpy("td3bc", HIDDEN, theirs_data, cfg.d3rlpy_updates, 2)
        d3rlpy_rate = measured["steps_per_s"]
    one = None
    rows = []
    for n_runs in cfg.runs:
        progress(f"ours: {n_runs} run(s) in one program")
        timing = sweep_timing(n_runs, dataset, cfg.chunk_updates, cfg.repeats)
        if n_runs == 1:
            one = timing
        chunk = cfg.chunk_updates
        sequential_s = n_runs * one["chunk_s"]
        d3rlpy_s = None if d3rlpy_rate is None else n_runs * chunk / d3rlpy_rate
        rows.append(
            {
                "runs": n_runs,
                "chunk_s": timing["chunk_s"],
                "compile_s": timing["compile_s"],
                "runs_updates_per_s": n_runs * chunk / timing["chunk_s"],
                "updates_per_s_per_run": chunk / timing["chunk_s"],
                "ours_sequential_s": sequential_s,
                "vs_ours_sequential": ratio(sequential_s, timing["chunk_s"]),
                "d3rlpy_sequential_s": d3rlpy_s,
                "vs_d3rlpy_sequential": ratio(d3rlpy_s, timing["chunk_s"]),
            }
        )
    # The bound: at the measured matrix-product peak, no program does more runs x updates
    # per second than peak / FLOP per update.
    flops = update_flops("td3bc", HIDDEN, dataset)
    peaks = [matmul_peak(size) for size in (64, 256, 1024)]
    peak = max(entry["flop_per_s"] for entry in peaks)
    for row in rows:
        row["fraction_of_peak"] = (
            None if flops is None else ratio(row["runs_updates_per_s"] * flops, peak)
        )
    results: dict[str, Any] = {
        "sweeps": rows,
        "d3rlpy_updates_per_s": d3rlpy_rate,
        "flop_per_update": flops,
        "matmul_peak": peaks,
        # The most any sweep could gain over sequential d3rlpy runs on this machine.
        "bound_vs_d3rlpy_sequential": None
        if flops is None or d3rlpy_rate is None
        else ratio(peak / flops, d3rlpy_rate),
    }
    results["scaling"] = measure_scaling(cfg)
    results["data_parallel"] = measure_data_parallel(cfg)
    sixteen = next((row for row in rows if row["runs"] == 16), None)
    results["targets"] = evaluate_targets(
        {
            "sweep16_vs_d3rlpy_sequential": None
            if sixteen is None
            else sixteen["vs_d3rlpy_sequential"]
        },
        TARGETS,
    )
    config = {
        **dataclasses.asdict(cfg),
        "algorithm": "td3bc",
        "hidden": list(HIDDEN),
        "batch_size": BATCH_SIZE,
        "jax_backend": jax.default_backend(),
    }
    return config, results


def report(config: dict[str, Any], results: dict[str, Any]) -> list[Table]:
    sweeps = Table(
        title=f"sweep: TD3+BC {tuple(config.get('hidden', HIDDEN))}, {config.get('chunk_updates')} "
        "updates per run per chunk",
        columns=[
            "runs",
            "one program s",
            "runs x updates/s",
            "updates/s per run",
            "vs ours sequential",
            "vs d3rlpy sequential",
            "of peak",
            "compile s",
        ],
        rows=[],
        caption=f"{(results.get('flop_per_update') or 0) / 1e6:.1f} MFLOP per update; "
        f"at the matmul peak a sweep could reach "
        f"{results.get('bound_vs_d3rlpy_sequential') or float('nan'):.1f}x sequential d3rlpy",
    )
    for row in results["sweeps"]:
        sweeps.rows.append(
            [
                row["runs"],
                row["chunk_s"],
                row["runs_updates_per_s"],
                row["updates_per_s_per_run"],
                row["vs_ours_sequential"],
                row["vs_d3rlpy_sequential"],
                row.get("fraction_of_peak"),
                row["compile_s"],
            ]
        )
    scaling = Table(
        title="sweep: runs over forced host devices (sharing this machine's cores)",
        columns=["devices", "chunk s", "speedup", "efficiency"],
        rows=[],
    )
    for row in results["scaling"]:
        scaling.rows.append([row["devices"], row["chunk_s"], row["speedup"], row["efficiency"]])
    parallel = Table(
        title="data-parallel: one run over forced host devices (one shard each)",
        columns=["devices", "chunk s", "speedup", "efficiency", "dataset MB per device"],
        rows=[
            [
                row["devices"],
                row["chunk_s"],
                row["speedup"],
                row["efficiency"],
                row["dataset_bytes_per_device"] / 1e6,
            ]
            for row in results.get("data_parallel", [])
        ],
    )
    return [sweeps, scaling, parallel]
