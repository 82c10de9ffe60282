"""``bench``: a benchmark of the source tree's ``benchmarks/``, in its own process.

The benchmarks are not part of the installed package; the command runs
``python -m benchmarks.run NAME ...`` from the current directory, which must hold them.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path


def command_bench(args: argparse.Namespace) -> int:
    root = Path.cwd()
    if not (root / "benchmarks" / "run.py").is_file():
        raise ValueError(
            f"bench: there is no benchmarks/run.py under {root}; the benchmarks live in the "
            "source tree's benchmarks/ folder: run this command from the repository root"
        )
    command = [sys.executable, "-m", "benchmarks.run", args.name, *args.args]
    status = subprocess.run(command, cwd=root, check=False).returncode
    # A benchmark killed by a signal exits as a shell reports it: 128 + the signal.
    return status if status >= 0 else 128 - status


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """Adds ``bench`` to the command line."""
    bench = commands.add_parser(
        "bench", help="run a benchmark of benchmarks/ (from the repository root)"
    )
    bench.add_argument("name", help="the benchmark, e.g. env_throughput or shield_overhead")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="its own options")
    bench.set_defaults(handler=command_bench)
