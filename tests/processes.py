"""Local processes for the tests that need several: a free loopback port, N processes of
JAX's distributed runtime on loopback (gloo on CPUs), each told its id, and a fresh
interpreter that compiles as a user's programs do."""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.compile_flags import shipped_environment, with_fast_compile

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


def run_on_host_devices(
    arguments: Sequence[str], devices: int, *, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Runs ``python ARGUMENTS`` from the repository root with ``devices`` forced host
    devices; asserts it exits 0 and returns it (stdout and stderr as text)."""
    flags = with_fast_compile(f"--xla_force_host_platform_device_count={devices}")
    environment = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, *arguments],
        capture_output=True,
        text=True,
        env=environment,
        cwd=ROOT,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done


def last_json(done: subprocess.CompletedProcess[str]) -> dict:
    """The JSON object a process printed on its last line."""
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_shipped(source: str, *, timeout: float = 600) -> Any:
    """Runs ``source`` in a fresh interpreter (from the repository root) whose programs
    compile as a user's do, not with the suite's fast-compile flags, and returns what it
    assigns to ``result`` (pickled back)."""
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "result.pickle"
        script = (
            f"{source}\nimport pickle\n"
            f"with open({str(out)!r}, 'wb') as handle:\n    pickle.dump(result, handle)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            env=shipped_environment(),
            cwd=ROOT,
            timeout=timeout,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        return pickle.loads(out.read_bytes())
