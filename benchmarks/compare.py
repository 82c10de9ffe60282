"""Reads saved benchmark results side by side.

Usage (from the repository root)::

    python -m benchmarks.compare                       # every run in benchmarks/results/
    python -m benchmarks.compare a.json b.json         # chosen files (or folders)
    python -m benchmarks.compare --name env_throughput --tag baseline
    python -m benchmarks.compare --batch-size 4096     # each run's numbers at one batch size
    python -m benchmarks.compare --scaling             # batch-size scaling table of each run

Every ratio is ``steps_per_s / reference steps_per_s`` with both numbers taken from the same
run (file), never across runs: absolute steps/s depend on the machine and its load, the
ratio much less. Missing entries (older files, partial runs, other benchmarks) print as
``-``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.env_throughput import CLASSIC_ID
from benchmarks.harness import (
    DEFAULT_RESULTS_DIR,
    BenchmarkResult,
    Table,
    format_number,
    ratio,
    render_tables,
)

# --------------------------------------------------------------------------- loading


def result_paths(sources: Iterable[str | Path] = ()) -> list[Path]:
    """JSON files named by ``sources`` (files, or folders whose ``*.json`` are taken);
    with no sources, every ``*.json`` in ``benchmarks/results/``."""
    sources = list(sources) or [DEFAULT_RESULTS_DIR]
    paths: list[Path] = []
    for source in map(Path, sources):
        paths.extend(sorted(source.glob("*.json")) if source.is_dir() else [source])
    return paths


def load_runs(paths: Iterable[str | Path], warn: Any = None) -> list[BenchmarkResult]:
    """Loads every readable result, sorted by timestamp; unreadable files are skipped with
    a warning on ``warn`` (standard error by default)."""
    stream = warn if warn is not None else sys.stderr
    runs = []
    for path in paths:
        try:
            runs.append(BenchmarkResult.load(path))
        except (OSError, ValueError, TypeError) as error:
            print(f"skipping {path}: {error}", file=stream)
    return sorted(runs, key=lambda run: str(run.timestamp))


def select_runs(
    runs: Iterable[BenchmarkResult], name: str | None = None, tag: str | None = None
) -> list[BenchmarkResult]:
    """Runs of benchmark ``name`` and with ``tag`` (None: any)."""
    return [
        run
        for run in runs
        if (name is None or run.name == name) and (tag is None or run.tag == tag)
    ]


# --------------------------------------------------------------------------- metrics


def get(mapping: Any, *keys: Any) -> Any:
    """``mapping[k1][k2]...``, or None where any level is missing or not a container."""
    value = mapping
    for key in keys:
        if isinstance(value, Mapping):
            value = value.get(key)
        elif isinstance(value, list) and isinstance(key, int) and -len(value) <= key < len(value):
            value = value[key]
        else:
            return None
    return value


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def reference_rate(run: BenchmarkResult) -> float | None:
    """The run's reference steps/s."""
    return _number(get(run.results, "reference", "steps_per_s"))


def run_ratio(run: BenchmarkResult, steps_per_s: Any) -> float | None:
    """``steps_per_s`` over the same run's reference steps/s."""
    return ratio(_number(steps_per_s), reference_rate(run))


def batched_rows(run: BenchmarkResult) -> dict[str, list[dict[str, Any]]]:
    """The run's batched rows by environment id (malformed entries dropped)."""
    batched = get(run.results, "batched")
    if not isinstance(batched, Mapping):
        return {}
    return {
        str(env_id): [
            row
            for row in rows
            if isinstance(row, Mapping)
            and isinstance(row.get("n_envs"), int)
            and not isinstance(row.get("n_envs"), bool)
        ]
        for env_id, rows in batched.items()
        if isinstance(rows, list)
    }


def _short_time(timestamp: Any) -> str:
    text = str(timestamp)
    return text.replace("T", " ").removesuffix("+00:00")


def _best_batched(run: BenchmarkResult) -> tuple[str | None, Mapping[str, Any] | None]:
    rows_by_env = batched_rows(run)
    env_ids = [CLASSIC_ID] if CLASSIC_ID in rows_by_env else list(rows_by_env)
    candidates = [
        (env_id, row)
        for env_id in env_ids
        for row in rows_by_env[env_id]
        if _number(row.get("steps_per_s")) is not None
    ]
    if not candidates:
        return None, None
    return max(candidates, key=lambda item: item[1]["steps_per_s"])


def overview_rows(runs: Iterable[BenchmarkResult]) -> list[dict[str, Any]]:
    """One row per run: when, which, and the headline numbers with their ratios.

    The best batched number is over ``IB-classic-v0`` (the reference's like-for-like
    environment) when the run has it, else over every environment id.
    """
    rows = []
    for run in runs:
        env_id, best = _best_batched(run)
        scan = get(run.results, "scan_single", CLASSIC_ID) or {}
        compile_times = [
            _number(get(entry, "compile_s"))
            for entry in (get(run.results, "compile", "batched") or {}).values()
        ]
        compile_times = [value for value in compile_times if value is not None]
        best_rate = _number(get(best, "steps_per_s"))
        rows.append(
            {
                "timestamp": _short_time(run.timestamp),
                "name": run.name,
                "tag": run.tag,
                "description": run.description,
                "reference_steps_per_s": reference_rate(run),
                "scan_single_steps_per_s": _number(get(scan, "steps_per_s")),
                "scan_single_ratio": run_ratio(run, get(scan, "steps_per_s")),
                "batched_best_env_id": env_id,
                "batched_best_n_envs": get(best, "n_envs"),
                "batched_best_steps_per_s": best_rate,
                "batched_best_ratio": run_ratio(run, best_rate),
                "compile_s": max(compile_times) if compile_times else None,
                "gymnasium_ratio": run_ratio(run, get(run.results, "gymnasium", "steps_per_s")),
                "vector_env_ratio": run_ratio(run, get(run.results, "vector_env", "steps_per_s")),
            }
        )
    return rows


def batch_size_rows(runs: Iterable[BenchmarkResult], n_envs: int) -> list[dict[str, Any]]:
    """For each run and environment id, the batched numbers at ``n_envs`` environments.

    A run that did not measure ``n_envs`` (or has no batched results) gives one row with
    ``env_id`` None and no numbers, so that it still shows up.
    """
    rows = []
    for run in runs:
        found = False
        for env_id, env_rows in batched_rows(run).items():
            row = next((r for r in env_rows if r.get("n_envs") == n_envs), None)
            if row is None:
                continue
            found = True
            rows.append(
                {
                    "timestamp": _short_time(run.timestamp),
                    "tag": run.tag,
                    "description": run.description,
                    "env_id": env_id,
                    "n_envs": n_envs,
                    "n_steps": row.get("n_steps"),
                    "steps_per_s": _number(row.get("steps_per_s")),
                    "reference_steps_per_s": reference_rate(run),
                    "ratio": run_ratio(run, row.get("steps_per_s")),
                }
            )
        if not found:
            rows.append(
                {
                    "timestamp": _short_time(run.timestamp),
                    "tag": run.tag,
                    "description": run.description,
                    "env_id": None,
                    "n_envs": n_envs,
                    "n_steps": None,
                    "steps_per_s": None,
                    "reference_steps_per_s": reference_rate(run),
                    "ratio": None,
                }
            )
    return rows


def scaling_rows(run: BenchmarkResult) -> list[dict[str, Any]]:
    """One run's batch scaling: per batch size, steps/s and ratio of each environment id.

    Keys: ``n_envs`` and, per environment id, ``<env_id> steps/s`` and ``<env_id> ratio``.
    """
    rows_by_env = batched_rows(run)
    sizes = sorted({row["n_envs"] for rows in rows_by_env.values() for row in rows})
    table = []
    for n_envs in sizes:
        entry: dict[str, Any] = {"n_envs": n_envs}
        for env_id, rows in rows_by_env.items():
            row = next((r for r in rows if r.get("n_envs") == n_envs), {})
            entry[f"{env_id} steps/s"] = _number(row.get("steps_per_s"))
            entry[f"{env_id} ratio"] = run_ratio(run, row.get("steps_per_s"))
        table.append(entry)
    return table


# --------------------------------------------------------------------------- tables

_OVERVIEW_COLUMNS = (
    ("timestamp", "timestamp (UTC)"),
    ("name", "benchmark"),
    ("tag", "tag"),
    ("description", "description"),
    ("reference_steps_per_s", "ref steps/s"),
    ("scan_single_ratio", "scan ratio"),
    ("batched_best_steps_per_s", "best steps/s"),
    ("batched_best_n_envs", "n_envs"),
    ("batched_best_ratio", "best ratio"),
    ("compile_s", "compile s"),
    ("gymnasium_ratio", "gym ratio"),
    ("vector_env_ratio", "vec ratio"),
)

_BATCH_COLUMNS = (
    ("timestamp", "timestamp (UTC)"),
    ("tag", "tag"),
    ("description", "description"),
    ("env_id", "env"),
    ("n_steps", "n_steps"),
    ("steps_per_s", "steps/s"),
    ("reference_steps_per_s", "ref steps/s"),
    ("ratio", "ratio"),
)

_RATIO_NOTE = "ratio = steps/s / reference steps/s of the same run"


def _table(title: str, columns: Sequence[tuple[str, str]], rows: list[dict[str, Any]]) -> Table:
    return Table(
        title,
        [heading for _, heading in columns],
        [[row.get(key) for key, _ in columns] for row in rows],
        caption=_RATIO_NOTE,
    )


def overview_table(runs: Sequence[BenchmarkResult]) -> Table:
    """Every run as one row (the benchmark column only when the runs differ in it)."""
    names = sorted({run.name for run in runs})
    columns = _OVERVIEW_COLUMNS
    if len(names) == 1:
        columns = tuple(column for column in columns if column[0] != "name")
    title = f"{len(runs)} run(s) of {', '.join(names)}; best = best batched {CLASSIC_ID}"
    return _table(title, columns, overview_rows(runs))


def batch_size_table(runs: Sequence[BenchmarkResult], n_envs: int) -> Table:
    """Every run's numbers at one batch size."""
    return _table(
        f"batched rollout at n_envs={n_envs}", _BATCH_COLUMNS, batch_size_rows(runs, n_envs)
    )


def scaling_tables(runs: Sequence[BenchmarkResult]) -> list[Table]:
    """One batch-scaling table per run that has batched results."""
    tables = []
    for run in runs:
        rows = scaling_rows(run)
        if not rows:
            continue
        columns = list(rows[0])
        title = f"{_short_time(run.timestamp)}  {run.tag}"
        if run.description:
            title += f"  {run.description}"
        tables.append(
            Table(
                title,
                columns,
                [[row.get(column) for column in columns] for row in rows],
                caption=f"reference: {format_number(reference_rate(run))} steps/s; {_RATIO_NOTE}",
            )
        )
    return tables


# --------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.compare",
        description="Compare saved benchmark results (ratios are always within one run).",
    )
    parser.add_argument(
        "files", nargs="*", type=Path, help="result files or folders (default: benchmarks/results)"
    )
    parser.add_argument("--name", help="only runs of this benchmark, e.g. env_throughput")
    parser.add_argument("--tag", help="only runs with this tag")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--batch-size", type=int, metavar="N", help="each run's numbers at n_envs=N")
    mode.add_argument("--scaling", action="store_true", help="batch-size scaling table of each run")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (1 when no run matches)."""
    args = build_parser().parse_args(argv)
    runs = select_runs(load_runs(result_paths(args.files)), args.name, args.tag)
    if not runs:
        print("no benchmark results found", file=sys.stderr)
        return 1
    if args.scaling:
        tables = scaling_tables(runs)
        if not tables:
            print("no run has batched results", file=sys.stderr)
            return 1
    elif args.batch_size is not None:
        tables = [batch_size_table(runs, args.batch_size)]
    else:
        tables = [overview_table(runs)]
    render_tables(tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
