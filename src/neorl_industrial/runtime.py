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


def enable_compilation_cache(directory: str | os.PathLike | None = None) -> Path:
    """Keeps compiled XLA programs on disk so later processes skip recompiling them.

    A rollout or training chunk compiled once on a machine then loads in a fraction of a
    second. Programs that compile in under half a second are not stored.

    Returns:
        The cache directory.
    """
    path = Path(directory) if directory is not None else default_cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    return path
