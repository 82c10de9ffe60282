"""Local processes for the tests that need several: a free loopback port, and N processes
of JAX's distributed runtime on loopback (gloo on CPUs), each told its id."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

from tests.compile_flags import with_fast_compile

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_distributed(
    command: Sequence[str],
    count: int = 2,
    *,
    id_variable: str = "NEORL_INDUSTRIAL_PROCESS_ID",
    timeout: float = 600,
) -> list[tuple[str, str]]:
    """Runs ``command`` as ``count`` processes of one distributed job (coordinator on a
    free loopback port) from the repository root; asserts each exits 0 and returns their
    ``(stdout, stderr)`` in process order."""
    port = free_port()
    processes = []
    for index in range(count):
        environment = {
            **os.environ,
            "XLA_FLAGS": with_fast_compile(None),
            "JAX_PLATFORMS": "cpu",
            "NEORL_INDUSTRIAL_COORDINATOR": f"127.0.0.1:{port}",
            "NEORL_INDUSTRIAL_NUM_PROCESSES": str(count),
            id_variable: str(index),
        }
        processes.append(
            subprocess.Popen(
                list(command),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=environment,
                cwd=ROOT,
            )
        )
    outputs = [process.communicate(timeout=timeout) for process in processes]
    for process, (_out, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err[-2000:]
    return outputs
