"""Runs one benchmark and saves its result.

Usage (from the repository root)::

    python -m benchmarks.run --list
    python -m benchmarks.run env_throughput -d "what changed" -t baseline
    python -m benchmarks.run env_throughput --quick
    taskset -c 0 python -m benchmarks.run env_throughput   # pinned to one core

A benchmark is a module registered in :data:`BENCHMARKS` that exposes
``run(quick: bool) -> tuple[dict, dict]`` returning ``(config, results)``, and optionally
``DESCRIPTION`` (one line for ``--list``) and ``report(config, results) -> list[Table]``
(the printed summary; without it the scalar results are listed).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks.harness import (
    DEFAULT_RESULTS_DIR,
    BenchmarkResult,
    Table,
    affinity_note,
    render_tables,
    system_info,
    utc_timestamp,
)

#: Registered benchmarks: name -> module path (imported only when the benchmark runs).
BENCHMARKS: dict[str, str] = {
    "env_throughput": "benchmarks.env_throughput",
    "data_sampling": "benchmarks.data_sampling",
    "data_generation": "benchmarks.data_generation",
    "frames": "benchmarks.frames",
    "agent_speed": "benchmarks.agent_speed",
    "sweep": "benchmarks.sweep",
    "shield_overhead": "benchmarks.shield_overhead",
    "ope": "benchmarks.ope",
    "model_ope": "benchmarks.model_ope",
    "verdict_study": "benchmarks.verdict_study",
    "serving": "benchmarks.serving",
    "soak": "benchmarks.soak",
    "slow_clients": "benchmarks.slow_clients",
    "onnx_export": "benchmarks.onnx_export",
}


def load_benchmark(name: str) -> ModuleType | Any:
    """The module (or object) implementing benchmark ``name``.

    Raises:
        KeyError: for a name that is not registered.
    """
    target = BENCHMARKS[name]
    return importlib.import_module(target) if isinstance(target, str) else target


def describe(name: str) -> str:
    """The benchmark's one-line ``DESCRIPTION`` (its module is imported, not run)."""
    try:
        return str(getattr(load_benchmark(name), "DESCRIPTION", ""))
    except Exception as error:  # a broken benchmark must not break --list
        return f"(cannot import: {error})"


def _flatten(prefix: str, value: Any, rows: list[list[Any]]) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), item, rows)
    elif value is None or isinstance(value, bool | int | float | str):
        rows.append([prefix, value])


def default_report(name: str, results: Mapping[str, Any]) -> list[Table]:
    """The scalar entries of ``results`` as one two-column table."""
    rows: list[list[Any]] = []
    _flatten("", results, rows)
    return [Table(f"{name} results", ["metric", "value"], rows)]


def run_benchmark(
    name: str,
    *,
    quick: bool = False,
    description: str = "",
    tag: str = "untagged",
    output_dir: str | Path = DEFAULT_RESULTS_DIR,
) -> tuple[BenchmarkResult, Path]:
    """Runs benchmark ``name``, saves the result and returns it with the file's path.

    Raises:
        KeyError: for a name that is not registered.
    """
    module = load_benchmark(name)
    timestamp = utc_timestamp()
    system = system_info()
    start = time.perf_counter()
    config, results = module.run(quick=quick)
    config = {"quick": quick, **dict(config)}
    results = dict(results)
    results.setdefault("wall_s", time.perf_counter() - start)
    result = BenchmarkResult(
        name=name,
        description=description,
        tag=tag,
        timestamp=timestamp,
        system=system,
        config=config,
        results=results,
    )
    return result, result.save(output_dir)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description="Run a benchmark and save its result as JSON.",
        epilog="Pin to one core for comparable numbers: taskset -c 0 python -m benchmarks.run ...",
    )
    parser.add_argument("benchmark", nargs="?", help="registered benchmark name (see --list)")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("-d", "--description", default="", help="free text stored with the result")
    parser.add_argument(
        "-t", "--tag", default="untagged", help="short label, part of the file name"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a small, fast version (smoke tests, CI)"
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=DEFAULT_RESULTS_DIR,
        help="where to write the JSON (default: benchmarks/results)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list:
        width = max((len(name) for name in BENCHMARKS), default=0)
        for name in sorted(BENCHMARKS):
            print(f"{name.ljust(width)}  {describe(name)}")
        return 0
    if args.benchmark is None:
        parser.error("name a benchmark to run, or use --list")
    if args.benchmark not in BENCHMARKS:
        parser.error(
            f"unknown benchmark {args.benchmark!r}; registered: {', '.join(sorted(BENCHMARKS))}"
        )

    mode = "quick" if args.quick else "full"
    print(f"Running {args.benchmark} ({mode}) ...", flush=True)
    result, path = run_benchmark(
        args.benchmark,
        quick=args.quick,
        description=args.description,
        tag=args.tag,
        output_dir=args.output_dir,
    )
    module = load_benchmark(args.benchmark)
    report = getattr(module, "report", None)
    tables = (
        report(result.config, result.results)
        if callable(report)
        else default_report(result.name, result.results)
    )
    render_tables(tables)
    system = result.system
    print(
        f"{system.get('cpu_model')} | JAX {system.get('jax_version')} "
        f"({system.get('jax_default_backend')}) | commit {str(system.get('git_commit'))[:12]}"
        f"{' (dirty)' if system.get('git_dirty') else ''}"
    )
    print(affinity_note(system))
    print(f"Wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
