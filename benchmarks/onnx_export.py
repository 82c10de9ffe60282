"""The ONNX export of a policy: parity with the JAX artifact on the shield's edge cases,
and latency on ONNX Runtime against the JAX artifact, side by side in one run.

What is measured:

* **the policy** - a TD3+BC actor with the default (256, 256) network on 180-value
  Industrial Benchmark observations (normalizer from the sample's statistics), behind the
  shield of ``configs/constraints/ib-example.yaml`` (action bounds, rate limits, a
  state-conditional limit, a linear constraint, a constant fallback), with the IB's
  physical bounds and the sample's range as data range; exported once with
  ``format="onnx"`` (so the JAX functions and ``policy.onnx`` come from one export).
* **parity** - 10,000 rows (2,000 with ``--quick``) of
  :func:`~neorl_industrial.wrappers.agents.onnx_export.edge_case_inputs` (nominal rows,
  previous actions at the bounds, unknown and extreme; state-limit thresholds, physical
  bounds and the data range one float either side; NaN, ±inf, extreme and subnormal
  readings): the JAX artifact's ``decide_rows`` against ONNX Runtime's graph. Reported:
  the largest action difference per class, statuses that differ, and rows with
  subnormal readings apart (XLA:CPU flushes subnormals to zero in some comparisons).
* **latency** - per call, at batch 1 (cycling through 256 different random rows, so the
  shield's repair runs as often as such inputs need it; then 256 rows the shield keeps as
  proposed, and 256 it repairs: a plant's steps are mostly of the first kind) and at
  batch 1024 (random rows): the raw functions (the JAX artifact's deserialized function,
  jitted, results copied to the host, against ``InferenceSession.run`` with one thread)
  and the whole ``decide_rows`` of ``PolicyArtifact`` against ``OnnxPolicyArtifact`` (the
  same host code around either). Calls alternate between the runtimes call by call;
  medians of the rounds are reported. The targets compare the raw functions.

Run with ``python -m benchmarks.onnx_export`` (or ``python -m benchmarks.run onnx_export``
once registered there).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import REPO_ROOT, Table, evaluate_targets, progress, targets_table

NAME = "onnx_export"
DESCRIPTION = "ONNX export: parity on the shield's edge cases and latency vs the JAX artifact"

SPEC_PATH = Path(REPO_ROOT) / "configs" / "constraints" / "ib-example.yaml"
PARITY_TARGET = 1e-5
#: The smallest rows of each edge class the parity rows hold.
SINGLE_ROWS = 256


def _export(directory: Path, hidden: tuple[int, ...]) -> dict[str, Any]:
    """Exports the benchmark's policy with its ONNX graph; its artifacts and inputs."""
    import jax

    from neorl_industrial.core.agents import TD3BCConfig, make_td3bc
    from neorl_industrial.core.environments import make
    from neorl_industrial.integration.deployment.onnx_policy import OnnxPolicyArtifact
    from neorl_industrial.wrappers.agents import PolicyArtifact, export_policy
    from neorl_industrial.wrappers.constraint_files import load_constraint_spec

    env, _ = make("IB-v0")
    spec = load_constraint_spec(SPEC_PATH)
    rng = np.random.default_rng(0)
    low, high = env.observation_low, np.minimum(env.observation_high, 400.0)
    sample = rng.uniform(low, high, size=(4096, low.size)).astype(np.float32)
    mean, std = sample.mean(0), sample.std(0) + 1.0
    algorithm = make_td3bc(
        TD3BCConfig.create(hidden=hidden, obs_mean=mean, obs_std=std),
        env.observation_size,
        env.action_size,
    )
    policy = algorithm.init(jax.random.PRNGKey(0)).policy
    started = time.perf_counter()
    path = export_policy(
        directory / "policy",
        act=algorithm.act,
        policy_params=policy,
        observation_size=env.observation_size,
        action_size=env.action_size,
        constraints_spec=spec,
        observation_names=env.observation_names,
        action_names=env.action_names,
        action_low=env.action_low,
        action_high=env.action_high,
        observation_bounds=(env.observation_low, env.observation_high),
        data_bounds=(sample.min(0), sample.max(0)),
        platforms=("cpu",),
        format="onnx",
    )
    export_s = time.perf_counter() - started
    started = time.perf_counter()
    onnx_artifact = OnnxPolicyArtifact.load(path)
    onnx_load_s = time.perf_counter() - started
    return {
        "path": path,
        "export_s": export_s,
        "onnx_load_s": onnx_load_s,
        "jax": PolicyArtifact.load(path),
        "onnx": onnx_artifact,
        "typical": (low, high),
        "prev": lambda rows: rng.uniform(-1, 1, (rows, env.action_size)).astype(np.float32),
        "observations": lambda rows: rng.uniform(low, high, (rows, low.size)).astype(np.float32),
    }


def _parity(setup: dict[str, Any], rows: int) -> dict[str, Any]:
    from neorl_industrial.wrappers.agents.onnx_export import (
        ONNX_FILE,
        compare_decisions,
        edge_case_inputs,
        runtime_session,
    )

    jax_artifact = setup["jax"]
    probes = edge_case_inputs(
        jax_artifact.compiled_constraints, rows, typical=setup["typical"], seed=7
    )
    decision = jax_artifact.decide_rows(probes.observations, probes.prev_actions)
    session = runtime_session((setup["path"] / ONNX_FILE).read_bytes())
    feeds = {"observations": probes.observations, "prev_actions": probes.prev_actions}
    outputs = session.run(["action", "proposed", "status", "margins"], feeds)
    parity = compare_decisions(
        (decision.action, decision.proposed, decision.status),
        outputs,
        probes.classes,
        probes.observations,
    )
    differing = decision.status != outputs[2]
    return {
        **parity.to_json(),
        "status_bits_differing": sorted(
            int(bit) for bit in np.unique(decision.status[differing] ^ outputs[2][differing])
        ),
        "overridden_share": float(np.mean(decision.overridden)),
    }


def _functions(setup: dict[str, Any], batch: int) -> dict[str, Any]:
    """The raw functions of either runtime for ``batch`` rows, on host arrays."""
    import jax

    from neorl_industrial.core.safety.shield import BRANCH_MIN_BATCH
    from neorl_industrial.wrappers.agents.onnx_export import ONNX_FILE, runtime_session

    path = setup["path"]
    name = "serve_large.jaxexport" if batch >= BRANCH_MIN_BATCH else "serve.jaxexport"
    exported = jax.export.deserialize(bytearray((path / name).read_bytes()))
    jax_call = jax.jit(exported.call)
    session = runtime_session((path / ONNX_FILE).read_bytes())
    outputs = ["action", "proposed", "status", "margins"]
    return {
        "jax": lambda obs, prev: jax.device_get(jax_call(obs, prev)),
        "onnx": lambda obs, prev: session.run(outputs, {"observations": obs, "prev_actions": prev}),
    }


def _interleaved(
    fns: dict[str, Any], inputs: list[tuple[np.ndarray, np.ndarray]], repeats: int, calls: int
) -> dict[str, float]:
    """Median over rounds of the microseconds per call (and the fastest round's, as
    ``<name>_best``); the runtimes alternate call by call and go through the same inputs."""
    for fn in fns.values():  # warm up (compilation, caches)
        for obs, prev in inputs[:8]:
            fn(obs, prev)
    rounds: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        spent = dict.fromkeys(fns, 0.0)
        for call in range(calls):
            obs, prev = inputs[call % len(inputs)]
            for name, fn in fns.items():
                started = time.perf_counter()
                fn(obs, prev)
                spent[name] += time.perf_counter() - started
        for name in fns:
            rounds[name].append(spent[name] / calls * 1e6)
    medians = {name: float(np.median(values)) for name, values in rounds.items()}
    # The fastest round: the least disturbed by other work on the machine.
    return {**medians, **{f"{name}_best": float(min(values)) for name, values in rounds.items()}}


def _latency_inputs(setup: dict[str, Any]) -> list[tuple[str, int, list]]:
    """The timed inputs: single random rows, single rows the shield keeps as proposed,
    single rows it repairs, and batches of 1024 random rows."""
    candidates = setup["observations"](4096), setup["prev"](4096)
    kept = setup["jax"].decide_rows(*candidates).status == 0
    single = [(obs[None], prev[None]) for obs, prev in zip(*candidates, strict=True)]
    return [
        ("batch_1", 1, single[:SINGLE_ROWS]),
        ("batch_1_kept", 1, [row for row, k in zip(single, kept, strict=True) if k][:SINGLE_ROWS]),
        (
            "batch_1_repaired",
            1,
            [row for row, k in zip(single, kept, strict=True) if not k][:SINGLE_ROWS],
        ),
        (
            "batch_1024",
            1024,
            [(setup["observations"](1024), setup["prev"](1024)) for _ in range(4)],
        ),
    ]


def run(quick: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """Exports the policy, checks parity and times both runtimes."""
    hidden = (256, 256)
    parity_rows = 2_000 if quick else 10_000
    repeats, calls = (3, 100) if quick else (11, 400)
    config = {
        "hidden": list(hidden),
        "observation_size": 180,
        "action_size": 3,
        "spec": str(SPEC_PATH.relative_to(REPO_ROOT)),
        "parity_rows": parity_rows,
        "latency_inputs": ["batch_1", "batch_1_kept", "batch_1_repaired", "batch_1024"],
        "repeats": repeats,
        "calls_per_repeat": calls,
        "onnx_threads": 1,
    }
    with tempfile.TemporaryDirectory() as directory:
        progress("exporting the policy with its ONNX graph")
        setup = _export(Path(directory), hidden)
        manifest = setup["jax"].manifest
        results: dict[str, Any] = {
            "export_s": setup["export_s"],
            "onnx_load_s": setup["onnx_load_s"],
            "onnx": {k: manifest["onnx"][k] for k in ("opset", "ir_version", "nodes")},
            "onnx_bytes": (setup["path"] / manifest["onnx"]["file"]).stat().st_size,
        }
        progress(f"parity on {parity_rows} edge-case rows")
        results["parity"] = _parity(setup, parity_rows)
        results["latency_us"] = {}
        for label, batch, inputs in _latency_inputs(setup):
            progress(f"{label}: {repeats} rounds of {calls} calls")
            batch_calls = calls if batch == 1 else max(calls // 8, 5)
            raw = _interleaved(_functions(setup, batch), inputs, repeats, batch_calls)
            served = _interleaved(
                {"jax": setup["jax"].decide_rows, "onnx": setup["onnx"].decide_rows},
                inputs,
                repeats,
                batch_calls,
            )
            overridden = np.mean(
                [setup["jax"].decide_rows(obs, prev).overridden.mean() for obs, prev in inputs]
            )
            results["latency_us"][label] = {
                "batch": batch,
                "function_jax": raw["jax"],
                "function_onnx": raw["onnx"],
                "function_onnx_over_jax": raw["onnx"] / raw["jax"],
                "function_jax_best": raw["jax_best"],
                "function_onnx_best": raw["onnx_best"],
                "decide_rows_jax": served["jax"],
                "decide_rows_onnx": served["onnx"],
                "decide_rows_onnx_over_jax": served["onnx"] / served["jax"],
                "overridden_share": float(overridden),
            }
    parity = results["parity"]
    results["targets"] = evaluate_targets(
        {
            "max_action_difference": parity["max_action_difference"],
            **{
                f"onnx_over_jax_{label}": entry["function_onnx_over_jax"]
                for label, entry in results["latency_us"].items()
            },
        },
        {
            "max_action_difference": (
                "<=",
                PARITY_TARGET,
                "largest |action difference| of ONNX Runtime vs the JAX artifact",
            ),
            **{
                f"onnx_over_jax_{label}": (
                    "<",
                    1.0,
                    f"ONNX Runtime's function time over the JAX artifact's ({label})",
                )
                for label in results["latency_us"]
            },
        },
    )
    return config, results


def report(config: dict[str, Any], results: dict[str, Any]) -> list[Table]:
    """The printed summary."""
    parity = results["parity"]
    classes = [
        [
            name,
            entry["rows"],
            entry["max_action_difference"],
            entry["status_mismatches"],
            entry["subnormal_rows"],
            entry["subnormal_action_mismatches"],
        ]
        for name, entry in parity["by_class"].items()
    ]
    latency = [
        [
            label,
            entry["function_jax"],
            entry["function_onnx"],
            entry["decide_rows_jax"],
            entry["decide_rows_onnx"],
            entry["function_onnx_over_jax"],
            f"{entry['function_jax_best']:,.0f} / {entry['function_onnx_best']:,.0f}",
            entry["overridden_share"],
        ]
        for label, entry in results["latency_us"].items()
    ]
    return [
        Table(
            f"Parity on {parity['rows']} rows (ONNX Runtime vs the JAX artifact)",
            [
                "edge class",
                "rows",
                "max |Δ action|",
                "status differs",
                "subnormal rows",
                "of those, action differs",
            ],
            classes,
            caption=(
                f"worst class {parity['worst_class']}; status bits differing "
                f"{parity['status_bits_differing']}; opset {results['onnx']['opset']}, "
                f"{results['onnx']['nodes']} nodes, {results['onnx_bytes']} bytes"
            ),
        ),
        Table(
            "Latency per call, µs (median of interleaved rounds)",
            [
                "inputs",
                "JAX function",
                "ONNX function",
                "JAX decide_rows",
                "ONNX decide_rows",
                "ONNX / JAX (function)",
                "fastest round JAX / ONNX",
                "overridden share",
            ],
            latency,
        ),
        targets_table(results["targets"]),
    ]


if __name__ == "__main__":
    import sys

    from benchmarks import run as runner

    runner.BENCHMARKS.setdefault(NAME, "benchmarks.onnx_export")
    sys.exit(runner.main([NAME, *sys.argv[1:]]))
