"""Serving a policy: our FastAPI server against ``mlflow models serve`` and against the
framework's ceiling, same policy, same machine, same load generator, in one run.

What is measured:

* A small TD3BC-Lag policy is trained on a generated IB dataset, exported and registered
  in a fresh MLflow store (``ib-policy``); ``mlflow models serve -m
  models:/ib-policy@champion --env-manager local`` and ``neorl-industrial serve --model
  models:/ib-policy@champion`` serve it on loopback. Both answer with the shielded action.
* The load generator is ``wrk`` (C, one thread; Debian's package), each request one
  180-value observation: our ``POST /v1/act`` with an API key, MLflow's ``POST
  /invocations`` with the same observation as a one-row ``dataframe_split``. Requests per
  second and p50/p99 latency at 1 and 16 connections, servers measured alternately and
  ``rounds`` times; the medians are reported with their ratios.
* The ceiling: a bare FastAPI app (:mod:`benchmarks.serving_ceiling`) that parses the same
  body through a pydantic model and answers a constant, on uvicorn's default HTTP parser
  (``bare``: httptools when installed, the parser ours runs on under its slow-client
  guard) and on h11 (``bare_h11``); measured in the same rounds. Ours as a share of each,
  by requests per second and by each server's CPU time per request (``/proc/<pid>/stat``;
  steadier than the rates on a shared machine). Ours twice: as ``serve`` starts by default
  (``ours``, the targets') and pinned to one CPU with ``--cpu`` (``ours_cpu``,
  ``pinned_ceiling_share...``).
* Soak: our server at a fixed rate for ``soak_seconds`` (a paced asyncio client):
  errors, and resident memory (``/proc/<pid>/status`` VmRSS) after warm-up against the end.
* Hot reload under load: ``wrk`` at 16 connections while the admin endpoint swaps the
  policy ``reloads`` times: non-2xx responses and socket errors.
* schemathesis against our OpenAPI schema (``/openapi.json``): server errors (5xx).
* Before and after a change: with ``SERVING_REFERENCE=<git revision>`` in the environment,
  that revision's ``src/`` (``git archive``) trains, exports and serves the same way in a
  scratch store of its own, and its server joins the alternating rounds (``reference``):
  ours as a share of it by requests per second and by CPU time per request, and what
  each server's shield did with the measured request (the same body).

Targets: throughput at 16 connections >= 30x MLflow's, and >= 95 % of the reference
revision's when one is given, p99 at 16 connections <= 10 % of
MLflow's, throughput >= 80 % of the bare app's at 16 connections and >= 70 % at 1, zero
soak errors with RSS growth < 10 %, zero failed requests during reloads, zero schemathesis
server errors.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    REPO_ROOT,
    Table,
    evaluate_targets,
    free_port,
    interpreter_environment,
    progress,
    targets_table,
    wait_for_http,
)

NAME = "serving"
DESCRIPTION = "Our policy server vs mlflow models serve: req/s, p50/p99, soak, reload, fuzz"

# Fresh strong keys per run: the server refuses short, placeholder or low-entropy ones.
KEY = secrets.token_urlsafe(32)
ADMIN = secrets.token_urlsafe(32)


#: the paced client's connections and in-flight requests
PACED_IN_FLIGHT = 32


def _train(workdir: Path, store: str, updates: int, env: dict[str, str] | None = None) -> None:
    command = [
        sys.executable, "-m", "neorl_industrial.cli", "run",
        "--set", f"training.updates={updates}", "--set", "training.chunk=250",
        "--set", "evaluation.every=0", "--set", "checkpoints.every=0",
        "--set", "data.trajectories=5", "--set", f"tracking.uri={store}",
        "--set", "name=served",
    ]  # fmt: skip
    subprocess.run(command, check=True, cwd=workdir, capture_output=True, env=env)


def _reference_source(revision: str, scratch: Path) -> Path:
    """``src/`` of ``revision`` unpacked under ``scratch`` (``git archive``)."""
    archive = subprocess.run(
        ["git", "archive", revision, "src"], cwd=REPO_ROOT, check=True, capture_output=True
    ).stdout
    target = scratch / "reference"
    target.mkdir()
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target / "src"


def _shield_said(url: str, body: str, headers: dict[str, str]) -> dict[str, Any]:
    """What a server's shield did with ``body``: the response's report flags."""
    request = urllib.request.Request(url, body.encode(), headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        report = json.loads(response.read())["report"]
    return {key: report.get(key) for key in ("overridden", "projected", "fallback", "infeasible")}


def _lua(path: Path, body: str, headers: dict[str, str]) -> Path:
    lines = ['wrk.method = "POST"']
    lines += [f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items()]
    lines.append(f"wrk.body = [==[{body}]==]")
    path.write_text("\n".join(lines) + "\n")
    return path


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _milliseconds(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    if not match:
        raise ValueError(f"wrk latency {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _wrk(url: str, script: Path, connections: int, seconds: float) -> dict[str, float]:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), url],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result = {
        "requests_per_s": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        # The latency distribution's own lines: a thread statistic's "+/- Stdev" column
        # can end in "50%" too.
        "p50_ms": _milliseconds(re.search(r"^\s+50%\s+(\S+)\s*$", out, re.M).group(1)),
        "p99_ms": _milliseconds(re.search(r"^\s+99%\s+(\S+)\s*$", out, re.M).group(1)),
        "requests": int(re.search(r"(\d+) requests in", out).group(1)),
    }
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    result["failed"] = (int(non_2xx.group(1)) if non_2xx else 0) + (
        sum(int(x) for x in errors.groups()) if errors else 0
    )
    return result


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def _paced(url: str, body: bytes, headers: dict[str, str], rate: float, seconds: float):
    """Requests at a fixed rate (open loop); returns (sent, errors, latencies_ms).

    At most ``PACED_IN_FLIGHT`` requests are in flight (the client's connection pool; a
    longer queue costs httpcore quadratic time and the client, not the server, becomes
    what is measured). A latency counts from the request's scheduled time, so waiting for
    a free connection is part of it (no coordinated omission).
    """
    import httpx

    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=PACED_IN_FLIGHT)
    in_flight = asyncio.Semaphore(PACED_IN_FLIGHT)
    async with httpx.AsyncClient(timeout=10.0, limits=limits) as client:

        async def one(scheduled: float) -> None:
            nonlocal errors
            async with in_flight:
                try:
                    response = await client.post(url, content=body, headers=headers)
                    if response.status_code != 200:
                        errors += 1
                except httpx.HTTPError:
                    errors += 1
            latencies.append(1e3 * (time.perf_counter() - scheduled))

        tasks = []
        start = time.perf_counter()
        total = int(rate * seconds)
        for i in range(total):
            scheduled = start + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(scheduled)))
        await asyncio.gather(*tasks)
    return total, errors, latencies


def run(quick: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    if shutil.which("wrk") is None:
        raise RuntimeError("wrk not found: install Debian's package (apt-get install wrk)")
    config = {
        "updates": 500 if quick else 2000,
        "seconds": 3 if quick else 10,
        "rounds": 1 if quick else 3,
        "connections": [1, 16],
        "soak_seconds": 10 if quick else 60,
        "soak_rate": 200,
        "reloads": 3,
        "schemathesis_examples": 20 if quick else 100,
        "load_generator": "wrk -t1 (one thread), keep-alive connections",
    }
    scratch = Path(tempfile.mkdtemp(prefix="neorl-serving-"))
    store = f"sqlite:///{scratch}/mlflow.db"
    env = interpreter_environment(MLFLOW_TRACKING_URI=store)
    progress("training and registering the policy")
    _train(scratch, store, config["updates"])
    model = "models:/ib-policy@champion"

    from neorl_industrial.integration.mlflow.registry import resolve_policy_dir
    from neorl_industrial.wrappers.agents.artifact import PolicyArtifact

    policy_dir = resolve_policy_dir(model, store)
    artifact = PolicyArtifact.load(policy_dir)
    observation = [50.0] * len(artifact.observation_names)
    ours_body = json.dumps({"observation": observation})
    mlflow_body = json.dumps(
        {"dataframe_split": {"columns": list(artifact.observation_names), "data": [observation]}}
    )
    (scratch / "keys.yaml").write_text(f"act: [{KEY}]\nadmin: [{ADMIN}]\n")
    ports = {"ours": free_port(), "mlflow": free_port(), "bare": free_port(),
             "bare_h11": free_port(), "ours_cpu": free_port()}  # fmt: skip
    # ``ours_cpu``: the same server pinned to one CPU (``serve --cpu``), the last one this
    # process may use.
    pinned_cpu = max(os.sched_getaffinity(0))
    config["ours_cpu"] = pinned_cpu
    ceiling = [sys.executable, "-m", "benchmarks.serving_ceiling", "--port"]
    servers = {
        "ours": subprocess.Popen(
            [sys.executable, "-m", "neorl_industrial.cli", "serve", "--model", model,
             "--port", str(ports["ours"]), "--api-keys-file", str(scratch / "keys.yaml"),
             "--log-level", "warning"],
            env=env, cwd=scratch, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ),
        "ours_cpu": subprocess.Popen(
            [sys.executable, "-m", "neorl_industrial.cli", "serve", "--model", model,
             "--port", str(ports["ours_cpu"]), "--api-keys-file", str(scratch / "keys.yaml"),
             "--log-level", "warning", "--cpu", str(pinned_cpu)],
            env=env, cwd=scratch, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ),
        "mlflow": subprocess.Popen(
            [sys.executable, "-m", "mlflow", "models", "serve", "-m", model, "--env-manager",
             "local", "-h", "127.0.0.1", "-p", str(ports["mlflow"])],
            env=env, cwd=scratch, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ),
        "bare": subprocess.Popen(
            [*ceiling, str(ports["bare"])], env=env, cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ),
        "bare_h11": subprocess.Popen(
            [*ceiling, str(ports["bare_h11"]), "--http", "h11"], env=env, cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ),
    }  # fmt: skip
    urls = {
        "ours": f"http://127.0.0.1:{ports['ours']}/v1/act",
        "ours_cpu": f"http://127.0.0.1:{ports['ours_cpu']}/v1/act",
        "mlflow": f"http://127.0.0.1:{ports['mlflow']}/invocations",
        "bare": f"http://127.0.0.1:{ports['bare']}/v1/act",
        "bare_h11": f"http://127.0.0.1:{ports['bare_h11']}/v1/act",
    }
    scripts = {
        "ours": _lua(scratch / "ours.lua", ours_body, {
            "Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}),
        "mlflow": _lua(scratch / "mlflow.lua", mlflow_body, {"Content-Type": "application/json"}),
    }  # fmt: skip
    # The same request, key and all.
    scripts["bare"] = scripts["bare_h11"] = scripts["ours_cpu"] = scripts["ours"]
    reference = os.environ.get("SERVING_REFERENCE")
    if reference:
        progress(f"training, registering and serving with {reference}")
        config["reference"] = reference
        workdir = scratch / "reference-run"
        workdir.mkdir()
        reference_store = f"sqlite:///{workdir}/mlflow.db"
        reference_env = interpreter_environment(
            MLFLOW_TRACKING_URI=reference_store,
            PYTHONPATH=str(_reference_source(reference, scratch)),
        )
        _train(workdir, reference_store, config["updates"], reference_env)
        ports["reference"] = free_port()
        servers["reference"] = subprocess.Popen(
            [sys.executable, "-m", "neorl_industrial.cli", "serve", "--model", model,
             "--port", str(ports["reference"]), "--api-keys-file", str(scratch / "keys.yaml"),
             "--log-level", "warning"],
            env=reference_env, cwd=workdir, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        urls["reference"] = f"http://127.0.0.1:{ports['reference']}/v1/act"
        scripts["reference"] = scripts["ours"]
    order = (
        "mlflow", "bare", "ours", *(("reference",) if reference else ()), "ours_cpu", "bare_h11"
    )  # fmt: skip
    results: dict[str, Any] = {}
    try:
        wait_for_http(f"http://127.0.0.1:{ports['ours']}/readyz", servers["ours"], 600)
        wait_for_http(f"http://127.0.0.1:{ports['ours_cpu']}/readyz", servers["ours_cpu"], 600)
        if reference:
            url = f"http://127.0.0.1:{ports['reference']}/readyz"
            wait_for_http(url, servers["reference"], 600)
            headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
            results["shield_said"] = {
                name: _shield_said(urls[name], ours_body, headers) for name in ("ours", "reference")
            }
        wait_for_http(f"http://127.0.0.1:{ports['mlflow']}/ping", servers["mlflow"], 600)
        for name in ("bare", "bare_h11"):
            wait_for_http(f"http://127.0.0.1:{ports[name]}/docs", servers[name], 60)
        for name in urls:  # warm every server (first requests compile / load lazily)
            _wrk(urls[name], scripts[name], 1, 2)
        runs: dict[str, dict[int, list[dict[str, float]]]] = {
            name: {c: [] for c in config["connections"]} for name in urls
        }
        for round_ in range(config["rounds"]):
            for connections in config["connections"]:
                for name in order:
                    progress(f"round {round_ + 1}: {name}, {connections} connection(s)")
                    pid = servers[name].pid
                    cpu = _cpu_seconds(pid)
                    sample = _wrk(urls[name], scripts[name], connections, config["seconds"])
                    # The server's own CPU time per answered request: on a shared machine
                    # the rates swing with the neighbours' load, the CPU per request less.
                    sample["cpu_us_per_request"] = (
                        1e6 * (_cpu_seconds(pid) - cpu) / max(sample["requests"], 1)
                    )
                    runs[name][connections].append(sample)
        table: dict[str, Any] = {}
        for name, by_connections in runs.items():
            for connections, samples in by_connections.items():
                table[f"{name}_c{connections}"] = {
                    key: statistics.median(sample[key] for sample in samples)
                    for key in ("requests_per_s", "p50_ms", "p99_ms", "cpu_us_per_request")
                } | {"failed": sum(sample["failed"] for sample in samples), "runs": samples}
        results["load"] = table
        for c in config["connections"]:
            ours, theirs = table[f"ours_c{c}"], table[f"mlflow_c{c}"]
            results[f"throughput_ratio_c{c}"] = ours["requests_per_s"] / theirs["requests_per_s"]
            results[f"p99_share_c{c}"] = ours["p99_ms"] / theirs["p99_ms"]
            for server, bare in itertools.product(("ours", "ours_cpu"), ("bare", "bare_h11")):
                # Each round's ratio (its runs were seconds apart), then their median: on a
                # shared machine the absolute rates drift between rounds, the ratio less.
                # ``ours_cpu``'s as ``pinned_ceiling_share...``.
                prefix = "" if server == "ours" else "pinned_"
                pairs = zip(runs[server][c], runs[bare][c], strict=True)
                shares = [o["requests_per_s"] / b["requests_per_s"] for o, b in pairs]
                results[f"{prefix}ceiling_share_c{c}" + bare[4:]] = statistics.median(shares)
                results[f"{prefix}ceiling_shares_c{c}" + bare[4:]] = shares
                # The same share by CPU time per request (the bare app's over ours).
                pairs = zip(runs[server][c], runs[bare][c], strict=True)
                cpu = [b["cpu_us_per_request"] / o["cpu_us_per_request"] for o, b in pairs]
                results[f"{prefix}ceiling_cpu_share_c{c}" + bare[4:]] = statistics.median(cpu)
        if reference:
            for c in config["connections"]:
                pairs = list(zip(runs["ours"][c], runs["reference"][c], strict=True))
                results[f"reference_share_c{c}"] = statistics.median(
                    o["requests_per_s"] / r["requests_per_s"] for o, r in pairs
                )
                results[f"reference_shares_c{c}"] = [
                    o["requests_per_s"] / r["requests_per_s"] for o, r in pairs
                ]
                results[f"reference_cpu_share_c{c}"] = statistics.median(
                    r["cpu_us_per_request"] / o["cpu_us_per_request"] for o, r in pairs
                )
        for name in ("mlflow", "bare", "bare_h11", "ours_cpu",
                     *(("reference",) if reference else ())):  # fmt: skip
            servers[name].terminate()

        # Soak at a fixed rate: errors and memory.
        progress(f"soak: {config['soak_rate']} req/s for {config['soak_seconds']} s")
        pid = servers["ours"].pid
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
        asyncio.run(_paced(urls["ours"], ours_body.encode(), headers, config["soak_rate"], 3))
        rss_start = _rss_kib(pid)
        sent, errors, latencies = asyncio.run(
            _paced(
                urls["ours"], ours_body.encode(), headers, config["soak_rate"],
                config["soak_seconds"],
            )
        )  # fmt: skip
        rss_end = _rss_kib(pid)
        latencies.sort()
        results["soak"] = {
            "requests": sent,
            "errors": errors,
            "rss_start_mib": rss_start / 1024,
            "rss_end_mib": rss_end / 1024,
            "rss_growth": rss_end / rss_start - 1,
            "p50_ms": latencies[len(latencies) // 2],
            "p99_ms": latencies[int(0.99 * (len(latencies) - 1))],
        }

        # Reloads under load.
        progress(f"{config['reloads']} reloads under load")
        load = subprocess.Popen(
            ["wrk", "-t1", "-c16", f"-d{4 * config['reloads'] + 2}s", "-s",
             str(scripts["ours"]), urls["ours"]],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        reload_seconds = []
        admin = {"Content-Type": "application/json", "Authorization": f"Bearer {ADMIN}"}
        for _ in range(config["reloads"]):
            time.sleep(1.0)
            request = urllib.request.Request(
                f"http://127.0.0.1:{ports['ours']}/v1/admin/reload",
                json.dumps({"model": str(policy_dir)}).encode(),
                admin,
            )
            with urllib.request.urlopen(request, timeout=120) as response:
                reload_seconds.append(json.loads(response.read())["seconds"])
        out, _ = load.communicate(timeout=120)
        non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
        socket_errors = re.search(r"Socket errors: .*", out)
        total = int(re.search(r"(\d+) requests in", out).group(1))
        results["reload"] = {
            "reloads": config["reloads"],
            "requests": total,
            "failed": int(non_2xx.group(1)) if non_2xx else 0,
            "socket_errors": socket_errors.group(0) if socket_errors else None,
            "reload_seconds": reload_seconds,
        }

        # schemathesis against our own OpenAPI schema.
        results["schemathesis"] = _schemathesis(
            f"http://127.0.0.1:{ports['ours']}", config["schemathesis_examples"], env
        )
    finally:
        for server in servers.values():
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
    soak, reload = results["soak"], results["reload"]
    fuzz = results["schemathesis"]
    results["targets"] = evaluate_targets(
        {
            "throughput_ratio_c16": results["throughput_ratio_c16"],
            "p99_share_c16": results["p99_share_c16"],
            "ceiling_share_c16": results["ceiling_share_c16"],
            "ceiling_share_c1": results["ceiling_share_c1"],
            "soak_errors": soak["errors"],
            "soak_rss_growth": soak["rss_growth"],
            "reload_failed": reload["failed"] + (1 if reload["socket_errors"] else 0),
            "schemathesis_server_errors": fuzz.get("server_errors"),
            **({"reference_share_c16": results["reference_share_c16"]} if reference else {}),
        },
        {
            "reference_share_c16": (
                ">=",
                0.95,
                f"req/s at 16 connections vs the server of {reference}",
            ),
            "throughput_ratio_c16": (">=", 30.0, "req/s at 16 connections vs mlflow models serve"),
            "p99_share_c16": ("<=", 0.10, "p99 at 16 connections as a share of mlflow's"),
            "ceiling_share_c16": (">=", 0.80, "req/s at 16 connections vs the bare FastAPI app"),
            "ceiling_share_c1": (">=", 0.70, "req/s at 1 connection vs the bare FastAPI app"),
            "soak_errors": ("<=", 0, "errors in the fixed-rate soak"),
            "soak_rss_growth": ("<", 0.10, "resident memory growth over the soak"),
            "reload_failed": ("<=", 0, "failed requests while reloading under load"),
            "schemathesis_server_errors": ("<=", 0, "5xx found by schemathesis"),
        },
    )
    return config, results


def _schemathesis(base: str, examples: int, env: dict[str, str]) -> dict[str, Any]:
    binary = shutil.which("schemathesis", path=env["PATH"])
    if binary is None:
        return {"skipped": "schemathesis is not installed (pip install schemathesis)"}
    command = [
        binary, "run", f"{base}/openapi.json", "--checks", "not_a_server_error",
        "--max-examples", str(examples), "-H", f"Authorization: Bearer {ADMIN}",
        "--exclude-path", "/v1/admin/reload",
    ]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    text = out.stdout + out.stderr
    failures = re.findall(r"Server error", text)
    summary = [line for line in text.splitlines() if re.search(r"passed|failed|error", line)]
    return {
        "exit_code": out.returncode,
        "server_errors": len(failures) if out.returncode else 0,
        "summary": summary[-5:],
    }


def report(config: dict[str, Any], results: dict[str, Any]) -> list[Table]:
    load = results["load"]
    rows = []
    for c in config["connections"]:
        ours, theirs = load[f"ours_c{c}"], load[f"mlflow_c{c}"]
        rows.append(
            [c, theirs["requests_per_s"], ours["requests_per_s"],
             results[f"throughput_ratio_c{c}"], theirs["p50_ms"], ours["p50_ms"],
             theirs["p99_ms"], ours["p99_ms"], results[f"p99_share_c{c}"]]
        )  # fmt: skip
    ceiling = []
    for (server, prefix), c in itertools.product(
        (("ours", ""), ("ours_cpu", "pinned_")), config["connections"]
    ):
        ours = load.get(f"{server}_c{c}")
        if ours is None:  # a result from before the pinned server was measured
            continue
        bare, bare_h11 = load[f"bare_c{c}"], load[f"bare_h11_c{c}"]
        label = "ours" if server == "ours" else f"ours --cpu {config.get('ours_cpu')}"
        ceiling.append(
            [label, c, ours["requests_per_s"], bare["requests_per_s"],
             results[f"{prefix}ceiling_share_c{c}"], bare_h11["requests_per_s"],
             results[f"{prefix}ceiling_share_c{c}_h11"], ours["p50_ms"], bare["p50_ms"],
             ours["cpu_us_per_request"], bare["cpu_us_per_request"],
             results[f"{prefix}ceiling_cpu_share_c{c}"]]
        )  # fmt: skip
    soak, reload, fuzz = results["soak"], results["reload"], results["schemathesis"]
    targets = results["targets"]
    before = []
    if config.get("reference"):
        for c in config["connections"]:
            ours, theirs = load[f"ours_c{c}"], load[f"reference_c{c}"]
            before.append(
                [c, theirs["requests_per_s"], ours["requests_per_s"],
                 results[f"reference_share_c{c}"], theirs["cpu_us_per_request"],
                 ours["cpu_us_per_request"], results[f"reference_cpu_share_c{c}"]]
            )  # fmt: skip
    tables = []
    if before:
        tables.append(
            Table(
                f"Ours against the server of {config['reference']} (same command, same "
                f"request; shield: {json.dumps(results['shield_said'])})",
                [
                    "connections",
                    "reference req/s",
                    "ours req/s",
                    "share",
                    "reference CPU us/req",
                    "ours CPU us/req",
                    "share by CPU",
                ],
                before,
            )
        )
    return [
        *tables,
        Table(
            "Ours against the framework's ceiling (a bare FastAPI app parsing the same body; "
            "share: median of the rounds' ratios)",
            [
                "server",
                "connections",
                "ours req/s",
                "bare req/s",
                "share",
                "bare h11 req/s",
                "share (h11)",
                "ours p50 ms",
                "bare p50 ms",
                "ours CPU us/req",
                "bare CPU us/req",
                "share by CPU",
            ],
            ceiling,
        ),
        Table(
            "Serving the same shielded policy (medians of alternating wrk runs)",
            [
                "connections",
                "mlflow req/s",
                "ours req/s",
                "ratio",
                "mlflow p50 ms",
                "ours p50 ms",
                "mlflow p99 ms",
                "ours p99 ms",
                "p99 share",
            ],
            rows,
        ),
        Table(
            "Soak, reload, fuzz",
            ["check", "result"],
            [
                [
                    "soak",
                    f"{soak['requests']} requests, {soak['errors']} errors, RSS "
                    f"{soak['rss_start_mib']:.0f} -> {soak['rss_end_mib']:.0f} MiB "
                    f"({100 * soak['rss_growth']:+.1f} %), p99 {soak['p99_ms']:.1f} ms",
                ],
                [
                    "reload",
                    f"{reload['reloads']} reloads during {reload['requests']} requests: "
                    f"{reload['failed']} failed; {reload['socket_errors'] or 'no socket errors'}",
                ],
                ["schemathesis", json.dumps(fuzz)[:200]],
            ],
        ),
        targets_table(targets),
    ]
