"""The XLA flags and the compilation cache the suite compiles with (set in conftest.py),
and the environment without those flags, for the few checks whose result depends on the
code the compiler generates."""

from __future__ import annotations

import os
from pathlib import Path

from neorl_industrial.cli.runtime import default_cache_dir

#: XLA:CPU's lowest backend optimization and its older fusion code generator: the suite's
#: small programs compile faster. Compiling is about two thirds of the suite's time; the
#: older emitters compile a training chunk in 0.4 of the time (TD3+BC on IB-v0: 2.6 -> 1.0
#: CPU s) and run it 1.45x slower, a quarter less CPU over a test file (IQL's: 39 -> 30 s).
#: They also treat subnormal floats as zero and fuse differently, so the checks of exact
#: agreement with another runtime or another program run in :func:`run_shipped`.
#: And each program's machine code generated as one LLVM module, not split into parts for
#: a thread pool: three workers already fill the two cores, and the agents' test files
#: (TD3+BC, IQL, BC, FQE, no compilation cache) took 33.1 s instead of 37.3 s, the mean of
#: three runs each, 10 % less CPU.
FAST_COMPILE = (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
    "--xla_cpu_use_fusion_emitters=false",
    "--xla_cpu_parallel_codegen_split_count=1",
)


def with_fast_compile(flags: str | None) -> str:
    """``flags`` with the fast-compile flags added, unless they set a level already."""
    if flags and "xla_backend_optimization_level" in flags:
        return flags
    return " ".join(filter(None, (flags, *FAST_COMPILE)))


def suite_cache_dir() -> Path | None:
    """The suite's own compilation cache: ``$NEORL_INDUSTRIAL_TEST_JAX_CACHE``, else
    ``jax-tests`` beside the command line's cache; None when that variable is "off"."""
    chosen = os.environ.get("NEORL_INDUSTRIAL_TEST_JAX_CACHE", "")
    if chosen.lower() == "off":
        return None
    return Path(chosen) if chosen else default_cache_dir().parent / "jax-tests"


def shipped_environment() -> dict[str, str]:
    """This process's environment without the suite's compile flags: programs compile as
    a user's do (the default backend optimization and fusion emitters)."""
    environment = dict(os.environ)
    flags = [f for f in environment.get("XLA_FLAGS", "").split() if f not in FAST_COMPILE]
    if flags:
        environment["XLA_FLAGS"] = " ".join(flags)
    else:
        environment.pop("XLA_FLAGS", None)
    return environment
