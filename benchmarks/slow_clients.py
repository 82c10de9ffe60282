"""Slow-client attacks on a running ``serve``: can attackers without a key starve it?

Each attack opens ``ATTACKERS`` (256: the default connection cap) connections without an
API key and keeps them busy for as long as the server lets it, reconnecting whenever the
server cuts one:

* ``slow_header``: a request line, then one byte of a header every ``BYTE_EVERY_S`` (5 s);
* ``slow_body``: complete headers announcing a 100 kB body, then one byte of it every 5 s.

Each attack runs against the default limits, then against a server whose connection cap
is the attackers' number (``*_at_cap``), where every fresh client must shed an attacker.

Beside the attackers, fresh clients (a new connection each, with a key) ask for an action
at a fixed rate and ``/readyz`` is polled. Reported per attack: the share of fresh
requests answered 200 (target >= 99 %), the ``/readyz`` polls not answered 200 (target
0), the 503s the clients saw and the 503s ``/metrics`` counted (every one counted), the
connections the server cut by reason, and the server's resident memory with and without
the attackers. A last phase measures what an open connection costs (the server's RSS with
``IDLE_CONNECTIONS`` connections held, cap raised past them), the measurement behind the
default cap.

    python -m benchmarks.run slow_clients            # 30 s per attack
    python -m benchmarks.run slow_clients --quick    # 12 s per attack
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    Table,
    evaluate_targets,
    free_port,
    interpreter_environment,
    progress,
    targets_table,
    wait_for_http,
)

NAME = "slow_clients"
DESCRIPTION = "serve under slow-header and slow-body attackers: fresh clients, probes, metrics"

ATTACKERS = 256
BYTE_EVERY_S = 5.0
FRESH_RATE = 20.0  # fresh requests per second, each on a new connection
READYZ_EVERY_S = 0.5
IDLE_CONNECTIONS = 1024
ATTACKS = ("slow_header", "slow_body")
#: Each attack against the default cap, then against a cap of ``ATTACKERS``.
PHASES = (*ATTACKS, *(f"{kind}_at_cap" for kind in ATTACKS))
KEY = secrets.token_urlsafe(32)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def _opening(kind: str) -> tuple[bytes, bytes]:
    """The bytes an attacker sends at once, and the byte it trickles after."""
    if kind == "slow_header":
        return b"POST /v1/act HTTP/1.1\r\nHost: x\r\nX-Slow: ", b"a"
    if kind == "slow_body":
        return (
            b"POST /v1/act HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n[",
            b" ",
        )
    raise ValueError(f"attack: expected one of {ATTACKS}, got {kind!r}")


async def attacker(port: int, kind: str, stop: asyncio.Event, stats: dict[str, int]) -> None:
    """One attacker: a connection held with a byte every ``BYTE_EVERY_S``; when the
    server cuts it, a new one."""
    opening, trickle = _opening(kind)
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            stats["connect_failed"] += 1
            await asyncio.sleep(0.5)
            continue
        stats["connections"] += 1
        try:
            writer.write(opening)
            while not stop.is_set():
                try:
                    data = await asyncio.wait_for(reader.read(4096), BYTE_EVERY_S)
                except TimeoutError:
                    writer.write(trickle)
                    continue
                if not data:
                    stats["cut"] += 1
                    break
        except OSError:
            stats["cut"] += 1
        finally:
            writer.close()


async def attackers(port: int, kind: str, count: int, stop: asyncio.Event) -> dict[str, int]:
    stats = {"connections": 0, "cut": 0, "connect_failed": 0}
    await asyncio.gather(*(attacker(port, kind, stop, stats) for _ in range(count)))
    return stats


async def fresh_clients(base: str, seconds: float, stats: dict[str, Any]) -> None:
    """Fresh requests at ``FRESH_RATE`` (a new connection each) and ``/readyz`` polls."""
    import httpx

    body = json.dumps({"observation": [50.0] * 6}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    limits = httpx.Limits(max_keepalive_connections=0)  # every request a fresh client

    async with httpx.AsyncClient(base_url=base, timeout=30.0, limits=limits) as client:

        async def act() -> None:
            started = time.perf_counter()
            try:
                response = await client.post("/v1/act", content=body, headers=headers)
                status = response.status_code
            except httpx.HTTPError as error:
                status = type(error).__name__
            stats["fresh"][str(status)] = stats["fresh"].get(str(status), 0) + 1
            stats["fresh_ms"].append(1e3 * (time.perf_counter() - started))

        async def readyz() -> None:
            try:
                status = (await client.get("/readyz")).status_code
            except httpx.HTTPError as error:
                status = type(error).__name__
            stats["readyz"][str(status)] = stats["readyz"].get(str(status), 0) + 1

        tasks = []
        start = time.perf_counter()
        for i in range(int(FRESH_RATE * seconds)):
            delay = start + i / FRESH_RATE - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(act()))
            if i % int(FRESH_RATE * READYZ_EVERY_S) == 0:
                tasks.append(asyncio.create_task(readyz()))
        await asyncio.gather(*tasks)


def scrape(base: str) -> dict[str, float]:
    """The server's cut and 503 counters from ``/metrics``."""
    import urllib.request

    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as response:
        text = response.read().decode()
    found: dict[str, float] = {}
    for name, label, value in re.findall(
        r'^neorl_(connections_cut|unavailable)_total\{reason="([^"]+)"\} (\S+)$', text, re.M
    ):
        found[f"{name}:{label}"] = float(value)
    found["requests_503"] = sum(
        float(v)
        for v in re.findall(r'^neorl_requests_total\{[^}]*status="503"\} (\S+)$', text, re.M)
    )
    return found


async def _attack(port: int, kind: str, seconds: float, pid: int) -> dict[str, Any]:
    base = f"http://127.0.0.1:{port}"
    stop = asyncio.Event()
    before = scrape(base)
    rss_before = _rss_kib(pid)
    held = asyncio.create_task(attackers(port, kind, ATTACKERS, stop))
    await asyncio.sleep(2.0)  # the attackers hold their connections first
    rss_attacked = _rss_kib(pid)
    stats: dict[str, Any] = {"fresh": {}, "readyz": {}, "fresh_ms": []}
    await fresh_clients(base, seconds, stats)
    stop.set()
    attack = await held
    after = scrape(base)
    counted = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
    fresh = stats["fresh"]
    total = sum(fresh.values())
    latencies = sorted(stats["fresh_ms"])
    return {
        "fresh_requests": total,
        "fresh_status": fresh,
        "fresh_ok_share": fresh.get("200", 0) / total if total else None,
        "fresh_p50_ms": latencies[len(latencies) // 2],
        "fresh_p99_ms": latencies[int(0.99 * (len(latencies) - 1))],
        "readyz_status": stats["readyz"],
        "readyz_failed": sum(n for status, n in stats["readyz"].items() if status != "200"),
        "fresh_503": fresh.get("503", 0),
        "counted_503": counted.get("requests_503", 0.0),
        "counted": counted,
        "attackers": attack,
        "rss_before_mib": rss_before / 1024,
        "rss_attacked_mib": rss_attacked / 1024,
    }


async def _idle_cost(port: int, pid: int, count: int) -> dict[str, Any]:
    """Resident memory per open connection (slow-header ones, each with a few bytes)."""
    rss_before = _rss_kib(pid)
    writers = []
    for _ in range(count):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        writers.append(writer)
    await asyncio.sleep(2.0)
    rss_held = _rss_kib(pid)
    for writer in writers:
        writer.close()
    return {
        "connections": count,
        "rss_before_mib": rss_before / 1024,
        "rss_held_mib": rss_held / 1024,
        "kib_per_connection": (rss_held - rss_before) / count,
    }


def _serve(model: Path, port: int, scratch: Path, **settings: str) -> subprocess.Popen:
    env = interpreter_environment(
        NEORL_SERVE_API_KEYS=json.dumps({"act": [KEY]}),
        NEORL_SERVE_ALLOW_UNSIGNED="true",  # the benchmark's own unsigned policy
        **{f"NEORL_SERVE_{name.upper()}": value for name, value in settings.items()},
    )
    return subprocess.Popen(
        [sys.executable, "-m", "neorl_industrial.cli", "serve", "--model", str(model),
         "--port", str(port), "--log-level", "warning"],
        env=env, cwd=scratch, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def run(quick: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    from benchmarks.soak import _policies

    seconds = 12.0 if quick else 30.0
    config = {
        "attackers": ATTACKERS,
        "byte_every_s": BYTE_EVERY_S,
        "fresh_rate_per_s": FRESH_RATE,
        "seconds_per_attack": seconds,
        "readyz_every_s": READYZ_EVERY_S,
        "server": "neorl-industrial serve, default limits (header and body timeouts 10 s, "
        "body_min_rate 1024 B/s, max_connections 1024), API key required; then the same "
        f"with max_connections {ATTACKERS} (the *_at_cap phases)",
        "idle_connections": IDLE_CONNECTIONS,
    }
    scratch = Path(tempfile.mkdtemp(prefix="neorl-slow-clients-"))
    model = _policies(scratch)["a"]
    results: dict[str, Any] = {}
    port = free_port()
    server = _serve(model, port, scratch)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/readyz", server)
        for kind in ATTACKS:
            progress(f"{kind}: {ATTACKERS} attackers for {seconds:.0f} s beside fresh clients")
            results[kind] = asyncio.run(_attack(port, kind, seconds, server.pid))
    finally:
        server.terminate()
        server.wait(30)
    # The same attacks with the cap at the attackers' number: every fresh client has to
    # make room by shedding one of them.
    port = free_port()
    server = _serve(model, port, scratch, max_connections=str(ATTACKERS))
    try:
        wait_for_http(f"http://127.0.0.1:{port}/readyz", server)
        for kind in ATTACKS:
            progress(f"{kind} at the cap ({ATTACKERS} connections)")
            results[f"{kind}_at_cap"] = asyncio.run(_attack(port, kind, seconds, server.pid))
    finally:
        server.terminate()
        server.wait(30)
    progress(f"cost of {IDLE_CONNECTIONS} open connections")
    port = free_port()
    server = _serve(model, port, scratch, max_connections=str(2 * IDLE_CONNECTIONS))
    try:
        wait_for_http(f"http://127.0.0.1:{port}/readyz", server)
        results["idle_cost"] = asyncio.run(_idle_cost(port, server.pid, IDLE_CONNECTIONS))
    finally:
        server.terminate()
        server.wait(30)
    values: dict[str, float | None] = {}
    targets: dict[str, tuple[str, float, str]] = {}
    for kind in PHASES:
        attack = results[kind]
        values[f"{kind}_fresh_ok_share"] = attack["fresh_ok_share"]
        values[f"{kind}_readyz_failed"] = attack["readyz_failed"]
        values[f"{kind}_503_not_counted"] = max(0.0, attack["fresh_503"] - attack["counted_503"])
        targets[f"{kind}_fresh_ok_share"] = (">=", 0.99, f"fresh requests answered 200 ({kind})")
        targets[f"{kind}_readyz_failed"] = ("<=", 0, f"/readyz polls not answered 200 ({kind})")
        targets[f"{kind}_503_not_counted"] = ("<=", 0, f"503s missing from /metrics ({kind})")
    results["targets"] = evaluate_targets(values, targets)
    return config, results


def report(config: dict[str, Any], results: dict[str, Any]) -> list[Table]:
    rows = []
    for kind in PHASES:
        a = results[kind]
        rows.append(
            [kind, a["fresh_requests"], f"{100 * a['fresh_ok_share']:.1f} %",
             json.dumps(a["fresh_status"]), a["fresh_p99_ms"], json.dumps(a["readyz_status"]),
             f"{a['fresh_503']} / {a['counted_503']:.0f}",
             json.dumps({k: v for k, v in a["counted"].items() if v}),
             f"{a['rss_before_mib']:.0f} -> {a['rss_attacked_mib']:.0f}"]
        )  # fmt: skip
    idle = results["idle_cost"]
    targets = results["targets"]
    return [
        Table(
            f"{config['attackers']} attackers without a key beside fresh clients",
            [
                "attack",
                "fresh requests",
                "answered 200",
                "statuses",
                "p99 ms",
                "/readyz",
                "503 seen / counted",
                "counted in /metrics",
                "RSS MiB",
            ],
            rows,
        ),
        Table(
            "What an open connection costs",
            ["connections", "RSS before MiB", "RSS held MiB", "KiB per connection"],
            [
                [
                    idle["connections"],
                    idle["rss_before_mib"],
                    idle["rss_held_mib"],
                    idle["kib_per_connection"],
                ]
            ],
        ),
        targets_table(targets),
    ]
