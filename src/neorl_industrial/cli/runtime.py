"""Process-level JAX settings for the command line: the compilation cache and the
distributed runtime.

Libraries should not change global JAX configuration behind a caller's back, so nothing
here runs on import: the command line calls it (``cli.entry`` enables the cache, the
``train`` and ``sweep`` commands start the distributed runtime), as does the test suite's
setup. It holds the environment variables that name the cache directory and the
distributed runtime's coordinator; the pure layers (``core``, ``functional``) read none.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path

import jax

__all__ = [
    "CACHE_ENV",
    "COORDINATOR_ENV",
    "NUM_PROCESSES_ENV",
    "PROCESS_ID_ENV",
    "DistributedError",
    "default_cache_dir",
    "enable_compilation_cache",
    "initialize_distributed",
]

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


class DistributedError(ValueError):
    """A distributed run that cannot start: a missing or malformed variable, or a
    coordinator out of reach (named)."""


#: Environment variables of a distributed run (one process per host or device group).
COORDINATOR_ENV = "NEORL_INDUSTRIAL_COORDINATOR"
NUM_PROCESSES_ENV = "NEORL_INDUSTRIAL_NUM_PROCESSES"
PROCESS_ID_ENV = "NEORL_INDUSTRIAL_PROCESS_ID"


def initialize_distributed(
    environ: Mapping[str, str] | None = None, timeout_s: int = 120
) -> tuple[int, int]:
    """Starts JAX's distributed runtime from the environment: the coordinator's
    ``host:port`` (``NEORL_INDUSTRIAL_COORDINATOR``), the number of processes
    (``NEORL_INDUSTRIAL_NUM_PROCESSES``) and this process's id
    (``NEORL_INDUSTRIAL_PROCESS_ID``, else a Kubernetes Indexed Job's
    ``JOB_COMPLETION_INDEX``). On CPUs the collectives go through gloo. Returns
    ``(process id, process count)``.

    Raises:
        DistributedError: for a missing or malformed variable, or a coordinator not reached
            within ``timeout_s`` (naming the address).
    """
    environ = os.environ if environ is None else environ
    address = environ.get(COORDINATOR_ENV, "").strip()
    if not address or ":" not in address:
        raise DistributedError(
            f"{COORDINATOR_ENV}: expected the coordinator's host:port, got {address!r}"
        )
    try:
        count = int(environ.get(NUM_PROCESSES_ENV, ""))
        index = int(environ.get(PROCESS_ID_ENV, environ.get("JOB_COMPLETION_INDEX", "")))
    except ValueError:
        raise DistributedError(
            f"{NUM_PROCESSES_ENV} and {PROCESS_ID_ENV} (or JOB_COMPLETION_INDEX): expected integers"
        ) from None
    if count < 1 or not 0 <= index < count:
        raise DistributedError(f"process id {index} of {count} processes: expected 0 <= id < count")
    unreachable = DistributedError(
        f"process {index} of {count}: could not join the coordinator at {address} within "
        f"{timeout_s} s; is process 0 running and the port reachable?"
    )
    # The runtime aborts the whole process when the coordinator never answers, so the
    # other processes first wait for its port here, where a clear error can be raised.
    if index > 0 and not _reachable(address, timeout_s):
        raise unreachable
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(
            address, num_processes=count, process_id=index, initialization_timeout=timeout_s
        )
    except Exception as error:  # the runtime's own errors do not name the address
        raise unreachable from error
    return jax.process_index(), jax.process_count()


def _reachable(address: str, timeout_s: float) -> bool:
    """Whether a TCP connection to ``host:port`` opens within ``timeout_s`` (retried)."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                return True
        except (OSError, ValueError):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)
