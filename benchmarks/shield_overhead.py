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

* **repair** - the shield alone on inputs that all need a repair (every proposal breaks
  a rule: the exact projection runs on every row), for the IB spec and the mixing tank's
  (``examples/mixing-tank/constraints.yaml``), at batch 1 and 1024, as the batch shield
  and as the row-wise shield under ``vmap`` (``-rowwise``: what an exported policy
  serves below 64 rows): the worst case of the served path.

Before and after a change, in the same run: with ``SHIELD_REFERENCE=<git revision>`` in
the environment, the shield module of that revision is loaded beside the current one
(``git show``) and timed interleaved with it in both sections (``reference_*`` entries and
``current / reference`` ratios).

The target (shield + policy <= 1.05 x policy alone at both batch sizes) is recorded in
``targets`` with its value; a miss is data, not an error.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import tempfile
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
MIXING_TANK_SPEC = Path(REPO_ROOT) / "examples" / "mixing-tank" / "constraints.yaml"
SHIELD_MODULE = "src/neorl_industrial/core/safety/shield.py"


def _reference_shield() -> tuple[Any, str] | None:
    """The ``shield`` function of the revision named by ``SHIELD_REFERENCE`` (None when
    unset), loaded from ``git show`` as a module of its own."""
    revision = os.environ.get("SHIELD_REFERENCE")
    if not revision:
        return None
    source = subprocess.run(
        ["git", "show", f"{revision}:{SHIELD_MODULE}"],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "shield_reference.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("shield_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.shield, revision


def _programs(batch_size: int, hidden: tuple[int, ...], reference: Any = None) -> dict[str, Any]:
    """The jitted programs (policy, policy + shield, and policy + the reference shield
    when given) and their inputs for one batch size."""
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

    def shielded_reference(policy, observations, prev_actions):
        proposed = algorithm.act(policy, observations)
        return reference(constraints, observations, proposed, prev_actions)

    observations = jnp.asarray(observations, jnp.float32)
    prev_actions = jnp.asarray(prev_actions, jnp.float32)
    plain_fn = jax.jit(plain)
    shielded_fn = jax.jit(shielded)
    _, report = jax.block_until_ready(shielded_fn(policy, observations, prev_actions))
    contenders = {
        "plain": lambda: jax.block_until_ready(plain_fn(policy, observations, prev_actions)),
        "shielded": lambda: jax.block_until_ready(shielded_fn(policy, observations, prev_actions)),
    }
    if reference is not None:
        reference_fn = jax.jit(shielded_reference)
        contenders["reference"] = lambda: jax.block_until_ready(
            reference_fn(policy, observations, prev_actions)
        )
    return {
        **contenders,
        "override_share": float(np.mean(np.asarray(report.overridden))),
        "constraints": list(constraints.names),
    }


def _repair_programs(batch_size: int, reference: Any = None) -> dict[str, Any]:
    """The shield alone (current, and the reference when given) on inputs whose every
    proposal breaks a rule, per spec: ``{spec name: {contender: call}}`` and the share
    of rows each contender projected (rather than sent the fallback)."""
    import jax
    import jax.numpy as jnp

    from neorl_industrial.core.safety import shield
    from neorl_industrial.wrappers.constraint_files import load_constraint_spec

    rng = np.random.default_rng(1)
    ib_names = ("setpoint", "velocity", "gain", "shift", "fatigue", "consumption")
    cases = {
        # IB: fatigue 55 (velocity may not decrease) and proposals outside [-1, 1].
        "ib": (
            load_constraint_spec(SPEC_PATH).compile(6, 3, ib_names, ("velocity", "gain", "shift")),
            np.tile([50.0, 50.0, 50.0, 50.0, 55.0, 100.0], (batch_size, 1)),
            rng.uniform(-0.6, 0.6, (batch_size, 3)),
            rng.uniform(-2.0, 2.0, (batch_size, 3)),
        ),
        # The mixing tank: the valve far above the pump, within the valve's rate limit.
        "mixing-tank": (
            load_constraint_spec(MIXING_TANK_SPEC).compile(
                3,
                2,
                ("level_m", "temperature_c", "inflow_m3h"),
                ("valve_pct", "pump_pct"),
                observation_bounds=([0.0, 0.0, 0.0], [3.2, 100.0, 80.0]),
            ),
            np.tile([2.163, 85.822, 70.904], (batch_size, 1)),
            np.column_stack(
                [rng.uniform(85.0, 100.0, batch_size), rng.uniform(10.0, 40.0, batch_size)]
            ),
            np.column_stack(
                [rng.uniform(80.0, 100.0, batch_size), rng.uniform(20.0, 45.0, batch_size)]
            ),
        ),
    }
    programs: dict[str, Any] = {}
    # Each spec twice: the batch shield, and the row-wise shield under vmap, which is the
    # form an exported policy serves below BRANCH_MIN_BATCH rows (a request of one row).
    forms = {
        f"{name}{suffix}": (case, rowwise)
        for name, case in cases.items()
        for suffix, rowwise in (("", False), ("-rowwise", True))
    }
    for name, ((constraints, obs, prev, proposed), rowwise) in forms.items():
        args = [jnp.asarray(a, jnp.float32) for a in (obs, proposed, prev)]
        functions = {"shielded": shield}
        if reference is not None:
            functions["reference"] = reference
        calls, projected = {}, {}
        for label, function in functions.items():
            fn = jax.jit(jax.vmap(function, in_axes=(None, 0, 0, 0)) if rowwise else function)
            _, report = jax.block_until_ready(fn(constraints, *args))
            projected[label] = float(np.mean(np.asarray(report.projected)))
            calls[label] = lambda fn=fn, constraints=constraints, args=args: jax.block_until_ready(
                fn(constraints, *args)
            )
        programs[name] = {"calls": calls, "projected_share": projected}
    return programs


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
    results: dict[str, Any] = {"batches": {}, "repair": {}}
    loaded = _reference_shield()
    reference = loaded[0] if loaded else None
    config["reference_revision"] = loaded[1] if loaded else None
    for batch_size in BATCH_SIZES:
        progress(f"batch {batch_size}: compiling")
        programs = _programs(batch_size, hidden, reference)
        # Fewer calls at the large batch: each takes milliseconds.
        batch_calls = calls if batch_size == 1 else max(calls // 8, 5)
        progress(f"batch {batch_size}: {repeats} rounds of {batch_calls} calls each")
        names = ["plain", "shielded"] + (["reference"] if reference is not None else [])
        times = _interleaved({name: programs[name] for name in names}, repeats, batch_calls)
        plain, shielded = np.median(times["plain"]), np.median(times["shielded"])
        entry = {
            "policy_us": float(plain * 1e6),
            "policy_shield_us": float(shielded * 1e6),
            "ratio": float(shielded / plain),
            "policy_us_rounds": [t * 1e6 for t in times["plain"]],
            "policy_shield_us_rounds": [t * 1e6 for t in times["shielded"]],
            "override_share": programs["override_share"],
        }
        if reference is not None:
            before = np.median(times["reference"])
            entry["reference_policy_shield_us"] = float(before * 1e6)
            entry["reference_ratio"] = float(before / plain)
            entry["current_over_reference"] = float(shielded / before)
            entry["reference_us_rounds"] = [t * 1e6 for t in times["reference"]]
        results["batches"][str(batch_size)] = entry
        results["constraints"] = programs["constraints"]
        progress(f"batch {batch_size}: repair cost")
        for spec_name, repair in _repair_programs(batch_size, reference).items():
            times = _interleaved(repair["calls"], repeats, batch_calls)
            timing = {
                f"{label}_us": float(np.median(rounds) * 1e6) for label, rounds in times.items()
            }
            if reference is not None:
                timing["current_over_reference"] = timing["shielded_us"] / timing["reference_us"]
            timing["projected_share"] = repair["projected_share"]
            results["repair"][f"{spec_name}@{batch_size}"] = timing
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
    repair = [
        [
            case,
            entry["shielded_us"],
            entry.get("reference_us"),
            entry.get("current_over_reference"),
            entry["projected_share"].get("shielded"),
            entry["projected_share"].get("reference"),
        ]
        for case, entry in results.get("repair", {}).items()
    ]
    before = [
        [
            int(batch),
            entry.get("reference_policy_shield_us"),
            entry["policy_shield_us"],
            entry.get("current_over_reference"),
        ]
        for batch, entry in results["batches"].items()
        if "reference_ratio" in entry
    ]
    extra = [
        Table(
            "Repair cost: the shield alone, every row repaired (median µs per call)",
            [
                "spec@batch",
                "current",
                "reference",
                "current / reference",
                "projected",
                "projected (reference)",
            ],
            repair,
        )
    ]
    if before:
        extra.append(
            Table(
                f"Policy + shield, before ({config.get('reference_revision')}) and after",
                ["batch", "before µs", "after µs", "after / before"],
                before,
            )
        )
    return [
        *extra,
        Table(
            "Shield overhead (median of interleaved rounds)",
            ["batch", "policy µs", "policy + shield µs", "ratio", "overridden share"],
            rows,
            caption=f"constraints: {', '.join(results['constraints'])}",
        ),
        Table("Targets", ["target", "value", "goal", "met"], targets),
    ]
