"""The process tasks against their reference simulators, alternated in one run.

For each task with a reference (pc-gym's ``four_tank`` and ``cstr``, NeoRL-2's ``Pipeline``
and ``DMSD``), :func:`measure_pair`:

1. **checks trajectories first**: the reference's episode under seeded uniform random
   actions, replayed here (the same actions; for NeoRL-2, its drawn targets and initial
   state injected), compared within the task's parity tolerance. A task whose check fails
   is not timed.
2. **alternates the contenders** for ``rounds`` rounds: the reference (a child process in
   its own environment, :mod:`benchmarks.peers.process_reference`, inheriting this
   process's CPU pinning) times its steps in a Python loop, then the project times one
   environment under ``lax.scan`` and the batched rollouts (the order flips every round,
   so a drift in the machine's load falls on both). Each timing records wall and CPU time
   (the process's own: the fair measure on a shared machine).
3. reports steps/s per round and min/median/max over rounds, and per round the ratio of
   the project's to the reference's steps/s (CPU time and wall), one environment against
   one and batched against one.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.peers.reference_env import reference_python

WORKER = Path(__file__).resolve().parent / "process_reference.py"


@dataclass(frozen=True)
class Pair:
    """A task and its reference: the reference's name, its steps per timed call, ours."""

    env_id: str
    reference: str  # the reference simulator's name in process_reference.py
    source: str  # who publishes the reference
    reference_steps: int  # steps of the reference per round (quick run: a quarter)
    single_steps: int  # steps of one environment under lax.scan per round
    check_steps: int  # steps of the trajectory check


PAIRS: dict[str, Pair] = {
    pair.env_id: pair
    for pair in (
        Pair("FourTank-v0", "four_tank", "pc-gym 0.1.8 (CasADi/CVODES)", 1200, 60_000, 59),
        Pair("CSTR-v0", "cstr", "pc-gym 0.1.8 (CasADi/CVODES)", 1200, 60_000, 59),
        Pair("Pipeline-v0", "Pipeline", "NeoRL-2 0.0.1", 40_000, 1_000_000, 1000),
        Pair("DMSD-v0", "DMSD", "NeoRL-2 0.0.1", 12_000, 300_000, 100),
    )
}


class ReferenceWorker:
    """The reference simulators' child process (one JSON request and answer per line)."""

    def __init__(self, python: Path):
        self.process = subprocess.Popen(
            [str(python), "-W", "ignore", str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def ask(self, **request: Any) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            return {"error": "the reference process ended"}
        return json.loads(line)

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


def open_reference() -> tuple[ReferenceWorker | None, str | None]:
    """The reference worker, or None and why (no reference environment)."""
    python = reference_python()
    if python is None or not python.exists():
        return None, (
            "no reference environment: run `python -m benchmarks.peers.reference_env` "
            "(or set NEORL_REFERENCE_PYTHON)"
        )
    return ReferenceWorker(python), None


# --------------------------------------------------------------------------- trajectory checks


def _uniform_actions(env: Any, n_steps: int, seed: int, low=None, high=None) -> np.ndarray:
    low = env.action_low if low is None else low
    high = env.action_high if high is None else high
    return np.random.default_rng(seed).uniform(low, high, (n_steps, len(low)))


def _run_ours(env: Any, params: Any, actions: np.ndarray, inject: Callable | None = None):
    """Our episode under ``actions`` from ``reset_env``: observations (the reset's first),
    rewards and the plant states; ``inject(state, step)`` edits a state before each step."""
    import jax
    import jax.numpy as jnp

    key = jax.random.key(0)

    @jax.jit
    def episode(actions):
        state, first = env.reset_env(key, params)

        def one(carry, inputs):
            state, index = carry
            action = inputs
            if inject is not None:
                state = inject(state, index)
            state, step = env.step_env(key, state, action, params)
            return (state, index + 1), (step.observation, step.reward)

        _, (observations, rewards) = jax.lax.scan(one, (state, 0), actions)
        return jnp.concatenate([first.observation[None], observations]), rewards

    observations, rewards = episode(jnp.asarray(actions, jnp.float32))
    return np.asarray(observations, np.float64), np.asarray(rewards, np.float64)


def check_pair(pair: Pair, worker: ReferenceWorker, seed: int = 0) -> dict[str, Any]:
    """Replays the reference's episode here; ``passed`` says whether it is within the
    task's parity tolerance (the tests' own, ``tests/core/environments/``)."""
    import jax.numpy as jnp

    from neorl_industrial.core.environments import make

    env, params = make(pair.env_id)
    if pair.env_id in ("FourTank-v0", "CSTR-v0"):
        actions = _uniform_actions(env, pair.check_steps, seed)
        reference = worker.ask(op="episode", task=pair.reference, actions=actions.tolist())
        if "error" in reference:
            return {"passed": False, "error": reference["error"]}
        expected = np.asarray(reference["observations"])
        ours, _ = _run_ours(env, params, actions)
        if pair.env_id == "FourTank-v0":
            # Levels within 5e-6 m plus 1e-5 of the level (test_four_tank's bound tolerance).
            difference = np.abs(ours[:, :4] - expected[:, :4])
            tolerance = 5e-6 + 1e-5 * np.abs(expected[:, :4])
            what = "levels h1..h4 [m]"
        else:
            # Ca within 3e-5 mol/L and T within 3e-3 K (test_cstr's tolerances).
            difference = np.abs(ours[:, :2] - expected[:, :2])
            tolerance = np.broadcast_to([3e-5, 3e-3], difference.shape)
            what = "Ca [mol/L], T [K]"
        return {
            "compared": what,
            "steps": int(pair.check_steps),
            "max_abs_difference": difference.max(0).tolist(),
            "max_over_tolerance": float((difference / tolerance).max()),
            "passed": bool(np.all(difference <= tolerance)),
        }
    if pair.env_id == "Pipeline-v0":
        actions = _uniform_actions(env, pair.check_steps, seed, [-1.0], [1.0]).astype(np.float32)
        reference = worker.ask(
            op="episode", task=pair.reference, actions=actions.tolist(), seed=seed
        )
        if "error" in reference:
            return {"passed": False, "error": reference["error"]}
        expected = np.asarray(reference["observations"], np.float32)
        held = params.replace(
            initial_flow_range=jnp.asarray([expected[0, 0]] * 2, jnp.float32),
            initial_target=jnp.asarray(expected[0, 1], jnp.float32),
            switch_probability=jnp.zeros((), jnp.float32),
        )
        targets = jnp.asarray(expected[1:, 1])
        ours, rewards = _run_ours(
            env, held, actions, lambda state, index: state.replace(target=targets[index])
        )
        difference = np.abs(ours - expected)
        reward_difference = np.abs(rewards - np.asarray(reference["rewards"]))
        return {
            "compared": "every observation (52 values), bit for bit; rewards to 1e-5",
            "steps": int(pair.check_steps),
            "max_abs_difference": float(difference.max()),
            "max_reward_difference": float(reward_difference.max()),
            "passed": bool(difference.max() == 0.0 and reward_difference.max() <= 1e-5),
        }
    if pair.env_id == "DMSD-v0":
        import jax

        actions = _uniform_actions(env, pair.check_steps, seed, [-1.0, -1.0], [1.0, 1.0])
        reference = worker.ask(
            op="episode", task=pair.reference, actions=actions.tolist(), seed=seed
        )
        if "error" in reference:
            return {"passed": False, "error": reference["error"]}
        expected = np.asarray(reference["observations"], np.float32)
        key = jax.random.key(0)
        start, _ = env.reset_env(key, params)

        def transition(observation, force):
            state = start.replace(plant=observation[:4], episode=jnp.tile(observation[4:6], 2))
            after, _ = env.step_env(key, state, force, params)
            return after.plant

        # Every transition from the reference's own state: the force is 30 times its action.
        plants = jax.jit(jax.vmap(transition))(
            jnp.asarray(expected[:-1]), jnp.asarray(actions * 30.0, jnp.float32)
        )
        difference = np.abs(np.asarray(plants) - expected[1:, :4])
        return {
            "compared": "positions and velocities after every reference transition, to 1e-5",
            "steps": int(pair.check_steps),
            "max_abs_difference": float(difference.max()),
            "passed": bool(difference.max() <= 1e-5),
        }
    raise ValueError(
        f"env_id: no reference pair for {pair.env_id!r}; expected one of {list(PAIRS)}"
    )


# --------------------------------------------------------------------------- alternated timing


def timed(call: Callable[[], Any]) -> dict[str, float]:
    """Wall and CPU seconds of one blocking call."""
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}


def spread(values: list[float | None]) -> dict[str, float | None]:
    """min, median and max of the measured values (None when any is missing)."""
    if not values or any(value is None for value in values):
        return {"min": None, "median": None, "max": None}
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
    }


def _compiled(fn: Callable[[Any], Any], key: Any) -> Callable[[], Any]:
    import jax

    options = getattr(fn, "compiler_options", None) or None  # the environment's
    executable = jax.jit(fn, compiler_options=options).lower(key).compile()
    jax.block_until_ready(executable(key))  # warm-up
    return lambda: jax.block_until_ready(executable(key))


def measure_pair(
    pair: Pair,
    worker: ReferenceWorker,
    rounds: int,
    batch_sizes: tuple[int, ...],
    batched_steps: Callable[[int], int],
    scan_fn: Callable[[str, int], Callable],
    batched_fn: Callable[[str, int, int], Callable],
    quick: bool,
) -> dict[str, Any]:
    """The check, then ``rounds`` alternated rounds of the reference and the project."""
    import jax

    check = check_pair(pair, worker)
    entry: dict[str, Any] = {"reference": pair.source, "check": check}
    if not check.get("passed"):
        entry["error"] = "trajectory check failed: not timed"
        return entry
    scale = 4 if quick else 1
    reference_steps = pair.reference_steps // scale
    single_steps = pair.single_steps // scale
    key = jax.random.PRNGKey(0)
    ours: dict[str, tuple[int, Callable[[], Any]]] = {
        "single": (single_steps, _compiled(scan_fn(pair.env_id, single_steps), key))
    }
    for n_envs in batch_sizes:
        n_steps = batched_steps(n_envs)
        ours[f"x{n_envs}"] = (
            n_envs * n_steps,
            _compiled(batched_fn(pair.env_id, n_envs, n_steps), key),
        )
    worker.ask(op="time", task=pair.reference, n_steps=min(reference_steps, 200))  # warm-up

    def reference_round(row: dict[str, Any]) -> None:
        answer = worker.ask(op="time", task=pair.reference, n_steps=reference_steps)
        row["reference"] = answer | {"steps": reference_steps}

    def our_round(row: dict[str, Any]) -> None:
        for name, (steps, call) in ours.items():
            row[name] = timed(call) | {"steps": steps}

    rows = []
    for index in range(rounds):
        row: dict[str, Any] = {}
        order = (reference_round, our_round) if index % 2 == 0 else (our_round, reference_round)
        for part in order:
            part(row)
        if "error" in row["reference"]:
            entry["error"] = f"reference failed: {row['reference']['error']}"
            return entry
        for timing in row.values():
            for clock in ("wall", "cpu"):
                timing[f"steps_per_s_{clock}"] = timing["steps"] / timing[f"{clock}_s"]
        for name in ours:
            for clock in ("wall", "cpu"):
                row[name][f"ratio_{clock}"] = (
                    row[name][f"steps_per_s_{clock}"] / row["reference"][f"steps_per_s_{clock}"]
                )
        rows.append(row)
    entry["rounds"] = rows
    entry["summary"] = {
        name: {
            f"{quantity}_{clock}": spread([row[name].get(f"{quantity}_{clock}") for row in rows])
            for quantity in ("steps_per_s", "ratio")
            for clock in ("cpu", "wall")
            if not (name == "reference" and quantity == "ratio")
        }
        for name in ("reference", *ours)
    }
    return entry
