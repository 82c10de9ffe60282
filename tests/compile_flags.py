"""The XLA flags and the compilation cache the suite compiles with (set in conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path

from neorl_industrial.runtime import default_cache_dir

#: XLA:CPU's lowest backend optimization: the suite's small programs compile faster.
FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true")


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
