"""Soak: the policy server left running at a fixed request rate, reloaded every 30 s and
sent a poisoned request (a number outside float32) every second; optionally with
slow-client attackers (:mod:`benchmarks.slow_clients`) holding connections throughout.

Reports the failed good requests (target 0), the poisoned requests not refused with a
4xx (target 0), RSS growth from the first reload to the end (target <= 2 %), and the p99
latency under reloads next to the undisturbed p99 measured first.

    python -m benchmarks.soak --minutes 2      # short; the default 10 is for a quiet machine
    python -m benchmarks.run soak --quick       # 1 minute
    # 100 reloads after the first, 2 s apart, beside 128 slow-header and 128 slow-body
    # attackers (the run lasts until the last reload):
    python -m benchmarks.soak --reloads 101 --reload-every 2 --attack
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import (
    evaluate_targets,
    free_port,
    interpreter_environment,
    progress,
    wait_for_http,
)
from benchmarks.serving import _rss_kib

DESCRIPTION = "policy server soak: fixed rate, reload every 30 s, poisoned request every 1 s"
MINUTES = 10.0
RATE = 50.0
RELOAD_EVERY_S = 30.0
BASELINE_S = 30.0
RSS_SAMPLE_S = 5.0
ATTACKERS = 256  # with --attack: half slow-header, half slow-body
IN_FLIGHT = 64  # the good client's connections and requests in flight
# A reload loads, verifies and compiles the new version while the old one serves: seconds
# on a quiet machine, minutes on a saturated one (where a 30 s client timeout cut the
# first reload of a soak whose server went on to finish it).
RELOAD_TIMEOUT_S = 600.0
# Fresh strong keys per run (a server without keys refuses reloads; the attackers have none).
ACT_KEY = secrets.token_urlsafe(32)
ADMIN_KEY = secrets.token_urlsafe(32)


def _policies(scratch: Path) -> dict[str, Path]:
    """Two versions of a small TD3+BC policy on the IB's six-value frame, shielded by the
    example constraint spec (the soak measures the server, not the policy)."""
    import jax

    from neorl_industrial.core.agents.td3bc import TD3BCConfig, make_td3bc
    from neorl_industrial.core.environments import make
    from neorl_industrial.wrappers.agents import export_policy
    from neorl_industrial.wrappers.constraint_files import load_constraint_spec

    env, _ = make("IB-v0", observation="classic")
    spec = load_constraint_spec(Path(__file__).parents[1] / "configs/constraints/ib-example.yaml")
    algorithm = make_td3bc(TD3BCConfig(hidden=(32, 32)), env.observation_size, env.action_size)
    paths = {}
    for version, seed in (("a", 0), ("b", 7)):
        paths[version] = export_policy(
            scratch / version,
            act=algorithm.act,
            policy_params=algorithm.init(jax.random.key(seed)).policy,
            observation_size=env.observation_size,
            action_size=env.action_size,
            constraints_spec=spec,
            observation_names=env.observation_names,
            action_names=env.action_names,
            action_low=env.action_low,
            action_high=env.action_high,
            metadata={"algorithm": "td3bc", "version": version},
        )
    return paths


async def _soak(
    base: str,
    pid: int,
    models: list[str],
    seconds: float,
    disturb: bool,
    reload_every: float = RELOAD_EVERY_S,
    reloads_wanted: int | None = None,
    attack: bool = False,
) -> dict:
    """Good requests at ``RATE`` for ``seconds`` (or until ``reloads_wanted`` reloads)."""
    import httpx

    from benchmarks.slow_clients import attackers

    good_ms: list[float] = []
    stats = {"good": 0, "good_failed": 0, "poisoned": 0, "poisoned_not_4xx": 0, "reloads": 0}
    rss: list[int] = []
    failures: list[str] = []
    failed_by: dict[str, int] = {}  # status or error of the failed good requests
    body = json.dumps({"observation": [50.0] * 6}).encode()
    poison = json.dumps({"observation": [50.0, 50.0, 1e39, 50.0, 50.0, 50.0]}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {ACT_KEY}"}
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    # At most IN_FLIGHT requests at once (the pool's connections): past its connections,
    # httpcore's queue costs quadratic time, and a client that once falls behind (a slow
    # start on a busy machine) spends all its CPU there and never catches up.
    limits = httpx.Limits(max_connections=IN_FLIGHT)
    in_flight = asyncio.Semaphore(IN_FLIGHT)
    async with httpx.AsyncClient(base_url=base, timeout=30.0, limits=limits) as client:

        async def good() -> None:
            started = time.perf_counter()
            stats["good"] += 1
            try:
                async with in_flight:
                    response = await client.post("/v1/act", content=body, headers=headers)
                outcome = str(response.status_code)
            except httpx.HTTPError as error:
                outcome = type(error).__name__
            if outcome != "200":
                stats["good_failed"] += 1
                failed_by[outcome] = failed_by.get(outcome, 0) + 1
            good_ms.append(1e3 * (time.perf_counter() - started))

        async def poisoned() -> None:
            stats["poisoned"] += 1
            try:
                response = await client.post("/v1/act", content=poison, headers=headers)
                named = "observation" in response.text
                refused = 400 <= response.status_code < 500 and named
            except httpx.HTTPError:
                refused = False
            stats["poisoned_not_4xx"] += not refused

        async def reloads() -> None:
            try:
                while reloads_wanted is None or stats["reloads"] < reloads_wanted:
                    await asyncio.sleep(reload_every)
                    model = models[stats["reloads"] % 2]
                    response = await client.post(
                        "/v1/admin/reload",
                        json={"model": model},
                        headers=admin,
                        timeout=RELOAD_TIMEOUT_S,
                    )
                    response.raise_for_status()
                    stats["reloads"] += 1
                    rss.append(_rss_kib(pid))
                    # A long soak on a busy machine: where it is, and the memory so far.
                    progress(
                        f"reload {stats['reloads']}: RSS {rss[-1] / 1024:.0f} MiB "
                        f"({100.0 * (rss[-1] - rss[0]) / rss[0]:+.1f} % since the first), "
                        f"{stats['good_failed']} of {stats['good']} good requests failed"
                    )
            except (httpx.HTTPError, OSError) as error:
                failures.append(repr(error))  # reported, and the soak ends here
            finally:
                done.set()

        async def sample_rss() -> None:
            while True:
                timeline.append((round(time.perf_counter() - start, 1), _rss_kib(pid)))
                await asyncio.sleep(RSS_SAMPLE_S)

        async def poisons() -> None:
            while True:
                await asyncio.sleep(1.0)
                tasks.append(asyncio.create_task(poisoned()))

        tasks: list[asyncio.Task] = []
        timeline: list[tuple[float, int]] = []
        done = asyncio.Event()
        stop_attack = asyncio.Event()
        held = []
        if disturb and attack:
            port = int(base.rsplit(":", 1)[1])
            held = [
                asyncio.create_task(attackers(port, kind, ATTACKERS // 2, stop_attack))
                for kind in ("slow_header", "slow_body")
            ]
        start = time.perf_counter()
        background = [asyncio.create_task(reloads()), asyncio.create_task(poisons())]
        if not disturb:
            for task in background:
                task.cancel()
        background.append(asyncio.create_task(sample_rss()))
        until_reloads = disturb and reloads_wanted is not None
        i = 0
        while not done.is_set() if until_reloads else i < int(RATE * seconds):
            delay = start + i / RATE - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(good()))
            i += 1
        for task in background:
            task.cancel()
        await asyncio.gather(*tasks)
        stop_attack.set()
        attack_stats = [await task for task in held]
    return {
        **stats,
        "attackers": attack_stats,
        "reload_failures": failures,
        "good_failed_by": failed_by,
        "seconds": time.perf_counter() - start,
        "p99_ms": float(np.percentile(good_ms, 99)),
        "rss_kib": rss,
        "rss_timeline": timeline,
    }


def run(quick: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    minutes = 1.0 if quick else float(os.environ.get("NEORL_SOAK_MINUTES", MINUTES))
    reload_every = float(os.environ.get("NEORL_SOAK_RELOAD_EVERY_S", RELOAD_EVERY_S))
    reloads = os.environ.get("NEORL_SOAK_RELOADS")
    reloads_wanted = int(reloads) if reloads else None
    attack = os.environ.get("NEORL_SOAK_ATTACK", "") == "1"
    config = {
        "minutes": minutes if reloads_wanted is None else None,
        "reloads": reloads_wanted,
        "rate_per_s": RATE,
        "reload_every_s": reload_every,
        "poisoned_every_s": 1.0,
        "baseline_s": BASELINE_S,
        "poison": "observation[2] = 1e39 (outside float32)",
        "attackers": (
            f"{ATTACKERS // 2} slow-header and {ATTACKERS // 2} slow-body, without a key"
            if attack
            else None
        ),
    }
    scratch = Path(tempfile.mkdtemp(prefix="neorl-soak-"))
    paths = _policies(scratch)
    keys = scratch / "keys.yaml"
    keys.write_text(f"act: [{ACT_KEY}]\nadmin: [{ADMIN_KEY}]\n")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "neorl_industrial.cli", "serve", "--model", str(paths["a"]),
         "--port", str(port), "--api-keys-file", str(keys), "--log-level", "warning"],
        env=interpreter_environment(NEORL_SERVE_ALLOW_UNSIGNED="true"), cwd=scratch,
        stdout=subprocess.DEVNULL, stderr=(scratch / "server.log").open("w"),
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        # A busy machine compiles slowly.
        wait_for_http(f"{base}/readyz", server, timeout=600, log=scratch / "server.log")
        progress(f"undisturbed baseline: {BASELINE_S:.0f} s at {RATE:.0f} req/s")
        baseline = asyncio.run(_soak(base, server.pid, [], BASELINE_S, disturb=False))
        length = f"{reloads_wanted} reloads" if reloads_wanted else f"{minutes:g} min"
        progress(
            f"soak: {length}, reload every {reload_every:g} s, poison every 1 s"
            + (f", {ATTACKERS} slow attackers" if attack else "")
        )
        models = [str(paths["b"]), str(paths["a"])]
        soak = asyncio.run(
            _soak(
                base, server.pid, models, 60.0 * minutes, disturb=True,
                reload_every=reload_every, reloads_wanted=reloads_wanted, attack=attack,
            )
        )  # fmt: skip
        rss_end = _rss_kib(server.pid)
    finally:
        server.terminate()
        server.wait(30)
    rss = soak.pop("rss_kib")
    first = rss[0] if rss else None
    results: dict[str, Any] = {
        **{key: value for key, value in soak.items() if key != "p99_ms"},
        "p99_ms": soak["p99_ms"],
        "p99_undisturbed_ms": baseline["p99_ms"],
        "undisturbed_failed": baseline["good_failed"],
        "rss_after_first_reload_kib": first,
        "rss_end_kib": rss_end,
        "rss_after_each_reload_kib": rss,
        "rss_growth_pct": None if first is None else 100.0 * (rss_end - first) / first,
        "reload_failed": len(soak["reload_failures"]),
    }
    results["targets"] = evaluate_targets(
        results,
        {
            "good_failed": ("<=", 0, "failed good requests"),
            "reload_failed": ("<=", 0, "reloads that failed"),
            "poisoned_not_4xx": ("<=", 0, "poisoned requests not refused with a named 4xx"),
            "rss_growth_pct": ("<=", 2.0, "RSS growth from the first reload to the end, %"),
        },
    )
    return config, results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=DESCRIPTION)
    parser.add_argument("--minutes", type=float, default=MINUTES)
    parser.add_argument(
        "--reloads", type=int, help="run until this many reloads instead of --minutes"
    )
    parser.add_argument("--reload-every", type=float, default=RELOAD_EVERY_S, help="seconds")
    parser.add_argument(
        "--attack", action="store_true", help="slow-header and slow-body attackers throughout"
    )
    parser.add_argument("-d", "--description", default="")
    parser.add_argument("-t", "--tag", default="untagged")
    args = parser.parse_args(argv)
    # read by run() in benchmarks.soak
    os.environ["NEORL_SOAK_MINUTES"] = str(args.minutes)
    os.environ["NEORL_SOAK_RELOAD_EVERY_S"] = str(args.reload_every)
    os.environ["NEORL_SOAK_RELOADS"] = str(args.reloads or "")
    os.environ["NEORL_SOAK_ATTACK"] = "1" if args.attack else ""
    from benchmarks.run import run_benchmark

    result, path = run_benchmark("soak", description=args.description, tag=args.tag)
    print(json.dumps(result.results, indent=2, default=str))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
