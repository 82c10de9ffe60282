"""Process-level JAX settings for the command line and long-running services.

Libraries should not change global JAX configuration behind a caller's back, so nothing
here runs on import; entry points (the CLI, the benchmarks, the server) call it.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

CACHE_ENV = "NEORL_INDUSTRIAL_JAX_CACHE"


def default_cache_dir() -> Path:
    """``$NEORL_INDUSTRIAL_JAX_CACHE``, else ``$XDG_CACHE_HOME/neorl_industrial/jax``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "neorl_industrial" / "jax"


def enable_compilation_cache(
    directory: str | os.PathLike | None = None, *, min_compile_seconds: float = 0.5
) -> Path:
    """Keeps compiled XLA programs on disk so later processes skip recompiling them.

    A rollout or training chunk compiled once on a machine then loads in a fraction of a
    second. Call it before the process compiles anything: JAX opens its cache once.

    Args:
        directory: the cache (default :func:`default_cache_dir`).
        min_compile_seconds: programs that compile faster are not stored (0: every
            program, however small).

    Returns:
        The cache directory.
    """
    path = Path(directory) if directory is not None else default_cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_seconds)
    if min_compile_seconds <= 0:
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path
