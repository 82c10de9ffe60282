"""Overhead of the safety shield: policy inference with the shield against policy inference
alone, in one process, at batch 1 and batch 1024.

What is measured:

* **policy** - a TD3+BC actor with the default (256, 256) network on 180-value Industrial
  Benchmark observations (normalizer included), jitted: ``act(params, observations)``.
* **policy + shield** - the same actor followed by the shield over the example constraint
  spec (``configs/constraints/ib-example.yaml``: action bounds, a rate limit, a
  state-conditional limit, a linear constraint and a constant fallback), jitted as one
  program: ``shield(constraints, obs, act(params, obs), prev_action)`` on the whole
  batch (the report included in the outputs).
* Both programs are timed interleaved, call by call (``repeats`` rounds of ``calls``
  calls each), so a disturbance of the machine hits both alike; the ratio is that of the
  medians of the per-round times. Inputs are random observations in the plant's range and
  random previous actions, so a share of the proposed actions is overridden (reported).

The target (shield + policy <= 1.05 x policy alone at both batch sizes) is recorded in
``targets`` with its value; a miss is data, not an error.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import REPO_ROOT, Table, evaluate_targets, progress

NAME = "shield_overhead"
DESCRIPTION = "Policy inference with the safety shield vs without, batch 1 and 1024"

BATCH_SIZES = (1, 1024)
SPEC_PATH = Path(REPO_ROOT) / "configs" / "constraints" / "ib-example.yaml"
TARGET_RATIO = 1.05


def _programs(batch_size: int, hidden: tuple[int, ...]) -> dict[str, Any]:
    """The two jitted programs and their inputs for one batch size."""
    import jax
    import jax.numpy as jnp

    from neorl_industrial.core.agents import TD3BCConfig, make_td3bc
    from neorl_industrial.core.environments import make
    from neorl_industrial.core.safety import shield
    from neorl_industrial.wrappers.constraint_files import load_constraint_spec

    env, _ = make("IB-v0")
    spec = load_constraint_spec(SPEC_PATH)
    constraints = spec.compile(
        env.observation_size,
        env.action_size,
        observation_names=env.observation_names,
        action_names=env.action_names,
    )
    rng = np.random.default_rng(0)
    low, high = env.observation_low, env.observation_high
    observations = rng.uniform(low, np.minimum(high, 400.0), size=(batch_size, low.size))
    prev_actions = rng.uniform(-1.0, 1.0, size=(batch_size, env.action_size))
    mean, std = observations.mean(0), observations.std(0) + 1.0
    algorithm = make_td3bc(
        TD3BCConfig.create(hidden=hidden, obs_mean=mean, obs_std=std),
        env.observation_size,
        env.action_size,
    )
    policy = algorithm.init(jax.random.PRNGKey(0)).policy

    def plain(policy, observations, prev_actions):
        del prev_actions
        return algorithm.act(policy, observations)

    def shielded(policy, observations, prev_actions):
        proposed = algorithm.act(policy, observations)
        return shield(constraints, observations, proposed, prev_actions)

    observations = jnp.asarray(observations, jnp.float32)
    prev_actions = jnp.asarray(prev_actions, jnp.float32)
    plain_fn = jax.jit(plain)
    shielded_fn = jax.jit(shielded)
    _, report = jax.block_until_ready(shielded_fn(policy, observations, prev_actions))
    return {
        "plain": lambda: jax.block_until_ready(plain_fn(policy, observations, prev_actions)),
        "shielded": lambda: jax.block_until_ready(shielded_fn(policy, observations, prev_actions)),
        "override_share": float(np.mean(np.asarray(report.overridden))),
        "constraints": list(constraints.names),
    }


def _interleaved(fns: dict[str, Any], repeats: int, calls: int) -> dict[str, list[float]]:
    """Seconds per call of each function, per round; the functions alternate call by
    call inside a round."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():  # warm up
        for _ in range(max(calls // 10, 3)):
            fn()
    for _ in range(repeats):
        spent = dict.fromkeys(fns, 0.0)
        for _ in range(calls):
            for name, fn in fns.items():
                started = time.perf_counter()
                fn()
                spent[name] += time.perf_counter() - started
        for name in fns:
            times[name].append(spent[name] / calls)
    return times


def run(quick: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """Times both programs at every batch size."""
    hidden = (256, 256)
    repeats, calls = (5, 50) if quick else (21, 400)
    config = {
        "batch_sizes": list(BATCH_SIZES),
        "hidden": list(hidden),
        "observation_size": 180,
        "action_size": 3,
        "spec": str(SPEC_PATH.relative_to(REPO_ROOT)),
        "repeats": repeats,
        "calls_per_repeat": calls,
        "target_ratio": TARGET_RATIO,
    }
    results: dict[str, Any] = {"batches": {}}
    for batch_size in BATCH_SIZES:
        progress(f"batch {batch_size}: compiling")
        programs = _programs(batch_size, hidden)
        # Fewer calls at the large batch: each takes milliseconds.
        batch_calls = calls if batch_size == 1 else max(calls // 8, 5)
        progress(f"batch {batch_size}: {repeats} rounds of {batch_calls} calls each")
        times = _interleaved(
            {"plain": programs["plain"], "shielded": programs["shielded"]}, repeats, batch_calls
        )
        plain, shielded = np.median(times["plain"]), np.median(times["shielded"])
        results["batches"][str(batch_size)] = {
            "policy_us": float(plain * 1e6),
            "policy_shield_us": float(shielded * 1e6),
            "ratio": float(shielded / plain),
            "policy_us_rounds": [t * 1e6 for t in times["plain"]],
            "policy_shield_us_rounds": [t * 1e6 for t in times["shielded"]],
            "override_share": programs["override_share"],
        }
        results["constraints"] = programs["constraints"]
    results["targets"] = evaluate_targets(
        {f"ratio_batch_{b}": results["batches"][str(b)]["ratio"] for b in BATCH_SIZES},
        {
            f"ratio_batch_{b}": ("<=", TARGET_RATIO, f"shield + policy / policy at batch {b}")
            for b in BATCH_SIZES
        },
    )
    return config, results


def report(config: dict[str, Any], results: dict[str, Any]) -> list[Table]:
    """The printed summary."""
    rows = [
        [
            int(batch),
            entry["policy_us"],
            entry["policy_shield_us"],
            entry["ratio"],
            entry["override_share"],
        ]
        for batch, entry in results["batches"].items()
    ]
    targets = [
        [name, target["value"], f"{target['comparison']} {target['threshold']}", target["passed"]]
        for name, target in results["targets"].items()
    ]
    return [
        Table(
            "Shield overhead (median of interleaved rounds)",
            ["batch", "policy µs", "policy + shield µs", "ratio", "overridden share"],
            rows,
            caption=f"constraints: {', '.join(results['constraints'])}",
        ),
        Table("Targets", ["target", "value", "goal", "met"], targets),
    ]
