"""Stacked observations stored once: bytes per transition, bytes on disk and sampling speed
of the same data held as frames and as whole observations.

* **data** - ``n_episodes`` episodes of ``episode_length`` steps in IB-v0's layout: each
  observation is the last 30 frames of 6 values, newest first (random frames: sampling
  speed does not depend on the values), 3 actions, 2 costs. The episodes time out.
* **whole** - :meth:`Dataset.from_arrays` with ``frame_stack=1``: ``N + E`` rows of 180
  values, how every dataset was stored before frames.
* **frames** - the same arrays through :meth:`Dataset.from_arrays` with the stacking found
  in the data (``frame_stack=None``): ``N + 30 E`` rows of 6 values; the time to find and
  convert the frames is reported as ``build_s``.
* **sampling** - uniform one-step batches of 256 (and n-step, ``n = 5``) drawn inside one
  jitted ``lax.scan`` and consumed whole, as ``data_sampling``'s fused samplers: the frames
  layout pays a gather of 30 rows per observation instead of one row of 180.
* **disk** - bytes of the native directory (``save_native``) of each.

Target: observations as frames take at least 25x less memory than whole ones; sampling
stays within 2x of the whole layout's speed. The whole dataset shrinks less: actions,
rewards, costs, flags and the precomputed sampling indices (38 bytes per transition in
memory, 26 on disk) are not stacked.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.data_sampling import BATCH_SIZE, GAMMA, N_STEP, measure_fused
from benchmarks.harness import Table, evaluate_targets, progress, ratio

DESCRIPTION = "IB-v0-shaped stacked observations as frames vs whole: memory, disk, sampling"
FRAME, STACK = 6, 30
TARGETS = {
    "observations_whole_over_frames": (">=", 25.0, "observation bytes, whole / frames"),
    "uniform_frames_vs_whole": (">=", 0.5, "uniform batches/s, frames / whole"),
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Sizes of one run."""

    quick: bool
    n_episodes: int
    episode_length: int
    batches: int
    repeats: int


def settings(quick: bool) -> Settings:
    if quick:
        return Settings(True, 10, 200, 50, 2)
    return Settings(False, 1000, 1000, 2000, 5)


def synthesize(n_episodes: int, episode_length: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Arrays in :meth:`Dataset.from_arrays`' layout with whole stacked observations."""
    rng = np.random.default_rng(seed)
    frames = rng.standard_normal((n_episodes, episode_length + STACK, FRAME), dtype=np.float32)
    windows = np.lib.stride_tricks.sliding_window_view(frames, STACK, axis=1)
    # windows[e, t] is frames t .. t + STACK - 1 as [FRAME, STACK]: newest first, flattened.
    observations = windows[:, : episode_length + 1, :, ::-1].transpose(0, 1, 3, 2)
    n = n_episodes * episode_length
    timeouts = np.zeros((n_episodes, episode_length), bool)
    timeouts[:, -1] = True
    return {
        "observations": observations.reshape(-1, STACK * FRAME),
        "actions": rng.uniform(-1.0, 1.0, (n, 3)).astype(np.float32),
        "rewards": rng.standard_normal(n, dtype=np.float32),
        "costs": rng.random((n, 2), dtype=np.float32),
        "terminals": np.zeros(n, bool),
        "timeouts": timeouts.reshape(-1),
        "episode_lengths": np.full(n_episodes, episode_length, np.int32),
    }


def _directory_bytes(path: Path) -> int:
    return sum(file.stat().st_size for file in path.iterdir())


def measure(layout: str, arrays: dict[str, np.ndarray], cfg: Settings) -> dict[str, Any]:
    import jax

    from neorl_industrial.functional.state_management import Dataset, sample, sample_nstep
    from neorl_industrial.integration.datasets import save_native

    start = time.perf_counter()
    dataset = jax.block_until_ready(
        Dataset.from_arrays(**arrays, frame_stack=1 if layout == "whole" else None)
    )
    build_s = time.perf_counter() - start
    samplers = {
        "uniform": lambda data, starts, key: sample(data, key, BATCH_SIZE, GAMMA),
        "nstep": lambda data, starts, key: sample_nstep(data, key, BATCH_SIZE, N_STEP, GAMMA),
    }
    timing = {}
    for name, sampler in samplers.items():
        progress(f"{layout}: {name} sampling")
        timing[name] = measure_fused(sampler, dataset, None, cfg.batches, cfg.repeats)
    with tempfile.TemporaryDirectory() as directory:
        save_native(dataset, Path(directory) / "d")
        disk = _directory_bytes(Path(directory) / "d")
    return {
        "frame_stack": dataset.frame_stack,
        "build_s": build_s,
        "nbytes": dataset.nbytes(),
        "observation_nbytes": int(dataset.observations.nbytes),
        "bytes_per_transition": dataset.nbytes() / dataset.n_transitions,
        "disk_bytes": disk,
        "disk_bytes_per_transition": disk / dataset.n_transitions,
        "batches_per_s": {name: entry["batches_per_s"] for name, entry in timing.items()},
        "sampling": timing,
    }


def run(quick: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """Runs the benchmark; ``(config, results)`` for a :class:`BenchmarkResult`."""
    cfg = settings(quick)
    progress(f"data: {cfg.n_episodes} episodes x {cfg.episode_length} steps, {STACK} x {FRAME}")
    arrays = synthesize(cfg.n_episodes, cfg.episode_length)
    layouts = {layout: measure(layout, arrays, cfg) for layout in ("whole", "frames")}
    whole, frames = layouts["whole"], layouts["frames"]
    comparison = {
        "observations_whole_over_frames": ratio(
            whole["observation_nbytes"], frames["observation_nbytes"]
        ),
        "memory_whole_over_frames": ratio(
            whole["bytes_per_transition"], frames["bytes_per_transition"]
        ),
        "disk_whole_over_frames": ratio(whole["disk_bytes"], frames["disk_bytes"]),
        "uniform_frames_vs_whole": ratio(
            frames["batches_per_s"]["uniform"], whole["batches_per_s"]["uniform"]
        ),
        "nstep_frames_vs_whole": ratio(
            frames["batches_per_s"]["nstep"], whole["batches_per_s"]["nstep"]
        ),
    }
    results = {
        "layouts": layouts,
        "comparison": comparison,
        "targets": evaluate_targets(comparison, TARGETS),
    }
    config = {
        **dataclasses.asdict(cfg),
        "frame": FRAME,
        "stack": STACK,
        "batch_size": BATCH_SIZE,
        "n_step": N_STEP,
    }
    return config, results


def report(config: dict[str, Any], results: dict[str, Any]) -> list[Table]:
    table = Table(
        title=f"frames: {config.get('n_episodes')} episodes x {config.get('episode_length')} "
        f"steps of {STACK} x {FRAME} stacked observations",
        columns=[
            "layout",
            "bytes/transition",
            "disk bytes/transition",
            "uniform batches/s",
            "n-step batches/s",
            "build s",
        ],
        rows=[],
        caption="whole / frames: observations {:.1f}x, memory {:.1f}x, disk {:.1f}x; "
        "frames / whole sampling: uniform {:.2f}, n-step {:.2f}".format(
            *(
                results["comparison"].get(key) or float("nan")
                for key in (
                    "observations_whole_over_frames",
                    "memory_whole_over_frames",
                    "disk_whole_over_frames",
                    "uniform_frames_vs_whole",
                    "nstep_frames_vs_whole",
                )
            )
        ),
    )
    for name, layout in results["layouts"].items():
        table.rows.append(
            [
                name,
                layout["bytes_per_transition"],
                layout["disk_bytes_per_transition"],
                layout["batches_per_s"]["uniform"],
                layout["batches_per_s"]["nstep"],
                layout["build_s"],
            ]
        )
    return [table]
