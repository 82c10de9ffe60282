"""Environment throughput: environment steps per second, ours against the reference.

What is measured, all in one process on one machine (run it pinned to one core with
``taskset -c 0`` so that the reference and JAX get the same single CPU):

* **reference** - the reference Python Industrial Benchmark
  (``industrial_benchmark_python.IDS.IDS(70, stationary_p=True, inital_seed=0)``) stepped in a
  Python loop with uniform random actions in [-1, 1]^3. Its observation is the 6 values of
  the current frame, so the like-for-like JAX environment is ``IB-classic-v0``.
* **scan_single** - one ``IB-classic-v0`` environment under ``jax.lax.scan``
  (``scan_single``), the whole episode loop compiled into one call.
* **batched** - ``rollout`` of ``n_envs`` environments (``vmap`` over environments inside
  ``lax.scan`` over time) for ``IB-classic-v0`` and ``IB-v0`` (whose observation is the 180
  values of the 30 past frames, more work per step). Throughput is
  ``n_envs * n_steps / seconds``.
* **batched_reward_only** - the same rollout at ``n_envs = 1000`` returning only the total
  reward, for comparison. The jitted functions above return the final observation (batched)
  or final state (scan_single) as well as the total reward: with the total reward alone,
  JAX removes everything the reward does not depend on as dead code - for ``IB-v0`` the
  whole observation history, leaving the same program as ``IB-classic-v0`` - and the
  benchmark would time less work than a policy reading its observations needs, and less
  than the reference does (it builds its observation every step).
* **compile** - in fresh processes on all CPUs (a user's compile is not pinned), the cold
  compile of ``env.step_batch`` and of the batched rollout at ``n_envs = 1000`` (best of the
  repeats) and the same with JAX's persistent compilation cache warm; also, in this process
  and pinned, wall time of ``jax.jit(f).lower(key).compile()`` (trace, lower and compile)
  for the batched rollout at ``n_envs = 1000`` and for ``scan_single``, measured after the
  backend is initialised. The first rollout compiled in the process also pays one-time
  set-up costs, so ``IB-classic-v0``'s batched compile is measured first and a second,
  identical compile is reported as ``repeat`` for comparison.
* **gymnasium** - the ``gymnasium.make("neorl_industrial/IB-classic-v0")`` wrapper stepped
  in a Python loop (one jitted call and one device-to-host transfer per step), resetting
  on episode end; and the ``VectorEnv`` from ``gymnasium.make_vec`` with 1024 environments
  (throughput counts every environment's step).
* **state_bytes** - bytes of one environment's state (``tree_bytes`` of ``env.reset``).
* **process** - every registered process task with a reference simulator against it
  (:mod:`benchmarks.peers.process_pairs`): pc-gym 0.1.8's ``four_tank`` and ``cstr`` (its
  default CasADi/CVODES integrator, one ODE solve per Python call) and NeoRL-2's Pipeline
  and DMSD (its own classes, stepped directly). The reference runs in its own environment,
  built outside the checkout by ``python -m benchmarks.peers.reference_env`` (found through
  ``NEORL_REFERENCE_PYTHON``, that default place, or the checkout's ``.venv-reference``), as
  a child process that inherits this one's pinning. Before any timing the reference's own
  episode under random actions is replayed here and compared within the task's parity
  tolerance (Pipeline: every observation bit for bit); then the reference and the project
  (one environment under ``lax.scan``, and batched at 64 and 4096) alternate for
  ``rounds`` rounds, the order flipping every round, each timed in wall and CPU time; the
  ratios are per round, reported as min/median/max.

Every policy, ours and the reference's, draws its actions inside the timed loop (a
batched rollout draws the whole batch's uniform actions in one call a step,
``uniform_random_batch_policy``, as the reference's loop draws its one environment's).
Each time is the best of several repeats after an untimed warm-up call.

How to read the ratios: every ``ratio`` is ``steps_per_s / reference steps_per_s`` with both
numbers from the same run (same process, machine, pinning), so ratios from different
machines can be compared while absolute steps/s cannot. On a shared machine the process
rows' CPU-time ratios are the ones to read: wall time counts the other users' work too.
``ratio`` > 1 means faster than the reference. The ``targets`` entry records each goal
(batched best ratio >= 400 for ``IB-classic-v0``, single-environment scan ratio >= 10,
batched compile < 2 s for every environment id, the process tasks' ratios) with its
measured value and whether it was met; a miss is data, not an error.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks.harness import Table, format_number, progress, rate, ratio, time_best
from benchmarks.harness import evaluate_targets as harness_evaluate_targets
from benchmarks.peers import process_pairs

NAME = "env_throughput"
DESCRIPTION = "Environment steps/s: reference Python IB vs JAX scan, vmap batches, Gymnasium"

#: The like-for-like id for the reference (the 6-value observation of the current frame).
CLASSIC_ID = "IB-classic-v0"
#: The default id (180-value observation of the 30 past frames).
HISTORY_ID = "IB-v0"
#: Batch size at which compile time is reported.
COMPILE_N_ENVS = 1000
#: Number of environments of the Gymnasium ``VectorEnv``.
VECTOR_NUM_ENVS = 1024
#: Batch sizes of the process tasks timed against their references (one environment under
#: ``lax.scan`` besides).
PAIR_BATCH_SIZES = (64, 4096)

#: Goals recorded with each run: name -> (comparison, threshold, what is compared).
TARGETS: dict[str, tuple[str, float, str]] = {
    "batched_best_ratio": (">=", 400.0, f"best batched steps/s of {CLASSIC_ID} / reference"),
    "scan_single_ratio": (">=", 10.0, f"single-env lax.scan steps/s of {CLASSIC_ID} / reference"),
    "compile_s": (
        "<",
        2.0,
        f"cold compile of the batched rollout at n_envs={COMPILE_N_ENVS} in a fresh process "
        "on all CPUs, worst env id",
    ),
    "process_batched_min_ratio": (
        ">=",
        1000.0,
        "median over alternated rounds of CPU-time steps/s at 4096 environments / the "
        "reference's single env, worst process task with a reference",
    ),
    "four_tank_4096_ratio": (
        ">=",
        1000.0,
        "FourTank-v0 at 4096 environments / pc-gym (CPU time, median of alternated rounds)",
    ),
    "pipeline_4096_ratio": (
        ">=",
        1000.0,
        "Pipeline-v0 at 4096 environments / NeoRL-2 (CPU time, median of alternated rounds)",
    ),
    "pipeline_single_ratio": (
        ">=",
        20.0,
        "Pipeline-v0, one env under lax.scan / NeoRL-2 (CPU time, median of alternated rounds)",
    ),
    "step_batch_compile_s": (
        "<",
        2.0,
        f"cold compile of env.step_batch at n_envs={COMPILE_N_ENVS}, fresh process, worst env id",
    ),
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Sizes of one run."""

    quick: bool
    repeats: int
    reference_steps: int
    scan_steps: int
    batch_sizes: tuple[int, ...]
    env_ids: tuple[str, ...]
    process_ids: tuple[str, ...]
    gym_steps: int
    vector_steps: int
    rounds: int
    pair_batch_sizes: tuple[int, ...]

    def batched_steps(self, n_envs: int) -> int:
        """Steps per rollout call at ``n_envs``: about 0.3-1 s of work per call."""
        if self.quick:
            return max(20, min(500, 400_000 // n_envs))
        return max(50, min(2000, 4_000_000 // n_envs))


def settings(quick: bool) -> Settings:
    """The full run, or with ``quick`` a small one of a few tens of seconds."""
    if quick:
        return Settings(
            quick=True,
            repeats=3,
            reference_steps=500,
            scan_steps=10_000,
            batch_sizes=(1, 100, 1000),
            env_ids=(CLASSIC_ID, HISTORY_ID),
            process_ids=process_env_ids(),
            gym_steps=300,
            vector_steps=20,
            rounds=3,
            pair_batch_sizes=PAIR_BATCH_SIZES,
        )
    return Settings(
        quick=False,
        repeats=3,
        reference_steps=5000,
        scan_steps=100_000,
        batch_sizes=(1, 10, 100, 1000, 4096, 16384),
        env_ids=(CLASSIC_ID, HISTORY_ID),
        process_ids=process_env_ids(),
        gym_steps=3000,
        vector_steps=200,
        rounds=5,
        pair_batch_sizes=PAIR_BATCH_SIZES,
    )


# --------------------------------------------------------------------------- measurements


def measure_reference(n_steps: int, repeats: int) -> dict[str, Any]:
    """Steps/s of the reference Python Industrial Benchmark, or an ``error`` entry when the
    ``industrial-benchmark-python`` package is not installed."""
    import numpy as np

    if "float" not in np.__dict__:
        np.float = float  # the reference still uses the alias numpy removed
    try:
        from industrial_benchmark_python.IDS import IDS
    except ImportError as error:
        return {"error": f"reference not available: {error}", "steps_per_s": None}

    env = IDS(70, stationary_p=True, inital_seed=0)
    np.random.seed(0)

    def loop() -> None:
        for _ in range(n_steps):
            env.step(2 * np.random.rand(3) - 1)

    best, times = time_best(loop, repeats)
    return {
        "env": "IDS(70, stationary_p=True, inital_seed=0)",
        "n_steps": n_steps,
        "best_s": best,
        "all_s": times,
        "steps_per_s": rate(n_steps, best),
    }


def process_env_ids() -> tuple[str, ...]:
    """The registered process tasks (every task but the Industrial Benchmark's ids), in
    registration order."""
    from neorl_industrial.core.environments import IndustrialBenchmark, registered_envs

    return tuple(
        env_id
        for env_id, spec in registered_envs().items()
        if spec.factory is not IndustrialBenchmark
    )


def _batched_row(
    executable: Any, key: Any, repeats: int, n_envs: int, n_steps: int, reference_rate: Any
) -> dict[str, Any]:
    """One batch size of a batched rollout: the best of ``repeats`` timed calls."""
    import jax.numpy as jnp

    best, times, total = _time_compiled(executable, key, repeats)
    steps_per_s = rate(n_envs * n_steps, best)
    return {
        "n_envs": n_envs,
        "n_steps": n_steps,
        "best_s": best,
        "all_s": times,
        "steps_per_s": steps_per_s,
        "ratio": ratio(steps_per_s, reference_rate),
        "reward_per_step": float(jnp.mean(total[0])) / n_steps,
    }


def measure_process_tasks(cfg: Settings) -> dict[str, Any]:
    """Every process task with a reference against it, alternated in rounds
    (:mod:`benchmarks.peers.process_pairs`): the trajectory check first, then steps/s and
    ratios per round; tasks without a reference are listed as such."""
    worker, why = process_pairs.open_reference()
    tasks: dict[str, Any] = {}
    try:
        for env_id in cfg.process_ids:
            pair = process_pairs.PAIRS.get(env_id)
            if pair is None:
                tasks[env_id] = {"reference": None}
                continue
            if worker is None:
                tasks[env_id] = {"reference": pair.source, "error": why}
                continue
            progress(f"{env_id} against {pair.source}: check, then {cfg.rounds} rounds")
            tasks[env_id] = process_pairs.measure_pair(
                pair,
                worker,
                cfg.rounds,
                cfg.pair_batch_sizes,
                cfg.batched_steps,
                _scan_fn,
                _batched_fn,
                cfg.quick,
            )
    finally:
        if worker is not None:
            worker.close()
    return tasks


def _compile(fn: Callable[[Any], Any], key: Any) -> tuple[Any, float]:
    """``jax.jit(fn).lower(key).compile()`` and its wall time in seconds, with the
    environment's compiler options (``fn.compiler_options``) where it has them."""
    import jax

    start = time.perf_counter()
    options = getattr(fn, "compiler_options", None) or None
    compiled = jax.jit(fn, compiler_options=options).lower(key).compile()
    return compiled, time.perf_counter() - start


# A fresh interpreter that compiles one program and prints the seconds it took. It runs
# with every CPU of the machine (a user's compile is not pinned) and, with a cache
# directory, JAX's persistent compilation cache.
_COMPILE_CHILD = """
import os, sys, time
os.sched_setaffinity(0, range(os.cpu_count()))
import jax, jax.numpy as jnp
if sys.argv[3]:
    jax.config.update("jax_compilation_cache_dir", sys.argv[3])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
from neorl_industrial.core.environments import make, rollout, uniform_random_batch_policy
env, params = make(sys.argv[1])
n_envs = int(sys.argv[4])
key = jax.random.PRNGKey(0)
jax.block_until_ready(jax.jit(lambda x: x + 1)(jnp.zeros(())))
if sys.argv[2] == "step_batch":
    states, _ = env.reset_batch(key, n_envs, params)
    actions = jnp.zeros((n_envs, env.action_size))
    fn, args = (lambda k, s, a: env.step_batch(k, s, a, params)), (key, states, actions)
else:
    policy = uniform_random_batch_policy(env)
    def fn(k):
        result = rollout(k, env, params, policy, n_envs, 1000)
        return result.total_reward, result.final_observation
    args = (key,)
start = time.perf_counter()
jax.jit(fn, compiler_options=env.compiler_options or None).lower(*args).compile()
print(time.perf_counter() - start)
"""


def measure_compile_fresh(
    env_id: str, program: str, repeats: int, n_envs: int = COMPILE_N_ENVS
) -> dict[str, Any]:
    """Compile seconds of ``program`` ("step_batch" or "rollout") in fresh processes on all
    CPUs: cold (best of ``repeats`` processes, no cache) and with a warm persistent cache."""
    import os
    import tempfile

    def child(cache_dir: str) -> float:
        completed = subprocess.run(
            [sys.executable, "-c", _COMPILE_CHILD, env_id, program, cache_dir, str(n_envs)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
        )
        return float(completed.stdout.strip().splitlines()[-1])

    cold = [child("") for _ in range(repeats)]
    with tempfile.TemporaryDirectory() as cache_dir:
        child(cache_dir)  # fills the cache
        warm = [child(cache_dir) for _ in range(repeats)]
    return {
        "env_id": env_id,
        "program": program,
        "n_envs": n_envs,
        "cold_s": min(cold),
        "cold_all_s": cold,
        "warm_cache_s": min(warm),
        "warm_cache_all_s": warm,
    }


def _batched_fn(
    env_id: str, n_envs: int, n_steps: int, keep_observation: bool = True
) -> Callable[[Any], Any]:
    """The jitted work of one batched call: ``rollout`` returning the total reward and,
    with ``keep_observation``, the final observation; compiled with the environment's
    ``compiler_options`` (its ``compiler_options`` attribute).

    Returning only the total reward lets JAX delete every computation the reward does not
    depend on as dead code, among it the whole observation history of ``IB-v0`` (its
    program is then identical to ``IB-classic-v0``'s). The final observation depends on the
    observation of every step, so returning it keeps the work a policy that reads
    observations would need.
    """
    from neorl_industrial.core.environments import make, rollout, uniform_random_batch_policy

    env, params = make(env_id)
    policy = uniform_random_batch_policy(env)

    def fn(key: Any) -> Any:
        result = rollout(key, env, params, policy, n_envs, n_steps)
        if keep_observation:
            return result.total_reward, result.final_observation
        return (result.total_reward,)

    fn.compiler_options = env.compiler_options  # type: ignore[attr-defined]
    return fn


def _scan_fn(env_id: str, n_steps: int) -> Callable[[Any], Any]:
    """``scan_single`` returning ``(final_state, total_reward)``: the final state keeps the
    state's evolution (the observation history included) from being dead code."""
    from neorl_industrial.core.environments import make, scan_single, uniform_random_policy

    env, params = make(env_id)
    policy = uniform_random_policy(env)

    def fn(key: Any) -> Any:
        state, total = scan_single(key, env, params, policy, n_steps)
        return total, state

    fn.compiler_options = env.compiler_options  # type: ignore[attr-defined]
    return fn


def _time_compiled(compiled: Any, key: Any, repeats: int) -> tuple[float, list[float], Any]:
    import jax

    output: list[Any] = []

    def call() -> None:
        output[:] = [jax.block_until_ready(compiled(key))]

    best, times = time_best(call, repeats)
    return best, times, output[0]


def measure_gymnasium(env_id: str, n_steps: int, repeats: int) -> dict[str, Any]:
    """Steps/s of the single-environment Gymnasium wrapper in a Python loop."""
    import gymnasium

    import neorl_industrial.wrappers.environments  # noqa: F401  (registers the Gymnasium ids)

    env = gymnasium.make(f"neorl_industrial/{env_id}")
    env.reset(seed=0)
    episodes = [0]

    def loop() -> None:
        for _ in range(n_steps):
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
                episodes[0] += 1

    try:
        best, times = time_best(loop, repeats)
    finally:
        env.close()
    return {
        "env_id": env_id,
        "n_steps": n_steps,
        "best_s": best,
        "all_s": times,
        "steps_per_s": rate(n_steps, best),
        "resets": episodes[0],
    }


def measure_vector_env(env_id: str, num_envs: int, n_steps: int, repeats: int) -> dict[str, Any]:
    """Steps/s (all environments counted) of the Gymnasium ``VectorEnv`` in a Python loop."""
    import gymnasium

    import neorl_industrial.wrappers.environments  # noqa: F401  (registers the Gymnasium ids)

    env = gymnasium.make_vec(
        f"neorl_industrial/{env_id}", num_envs=num_envs, vectorization_mode="vector_entry_point"
    )
    env.reset(seed=0)

    def loop() -> None:
        for _ in range(n_steps):
            env.step(env.action_space.sample())

    try:
        best, times = time_best(loop, repeats)
    finally:
        env.close()
    return {
        "env_id": env_id,
        "num_envs": num_envs,
        "n_steps": n_steps,
        "best_s": best,
        "all_s": times,
        "steps_per_s": rate(num_envs * n_steps, best),
    }


def state_bytes(env_id: str) -> int:
    """Bytes of one environment's state after ``reset``."""
    import jax

    from neorl_industrial.core.environments import make
    from neorl_industrial.core.utils import tree_bytes

    env, params = make(env_id)
    state, _ = env.reset(jax.random.PRNGKey(0), params)
    return tree_bytes(state)


def evaluate_targets(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each goal in :data:`TARGETS` with its measured value and whether it was met (None
    when the value is missing)."""
    summary = results.get("summary", {})
    values = {
        "batched_best_ratio": summary.get("batched_best_ratio"),
        "scan_single_ratio": summary.get("scan_single_ratio"),
        "compile_s": summary.get("compile_s"),
        "step_batch_compile_s": summary.get("step_batch_compile_s"),
        "process_batched_min_ratio": summary.get("process_batched_min_ratio"),
        "four_tank_4096_ratio": _pair_ratio(summary, "FourTank-v0", "x4096"),
        "pipeline_4096_ratio": _pair_ratio(summary, "Pipeline-v0", "x4096"),
        "pipeline_single_ratio": _pair_ratio(summary, "Pipeline-v0", "single"),
    }
    return harness_evaluate_targets(values, TARGETS)


def _pair_ratio(summary: dict[str, Any], env_id: str, contender: str) -> float | None:
    """The median CPU-time ratio of ``contender`` in ``env_id``'s alternated rounds."""
    return summary.get("process_ratios", {}).get(env_id, {}).get(contender)


def _summarise(results: dict[str, Any]) -> dict[str, Any]:
    classic_rows = results.get("batched", {}).get(CLASSIC_ID, [])
    best_row = max(classic_rows, key=lambda row: row["steps_per_s"] or 0.0, default=None)
    fresh = results.get("compile", {}).get("fresh_process", {}).values()
    compile_times = [entry["cold_s"] for entry in fresh if entry["program"] == "rollout"]
    step_compile_times = [entry["cold_s"] for entry in fresh if entry["program"] == "step_batch"]
    scan = results.get("scan_single", {}).get(CLASSIC_ID, {})
    gymnasium, vector = results.get("gymnasium", {}), results.get("vector_env", {})
    # Per process task with a reference: the median CPU-time ratio of each contender.
    process_ratios = {
        env_id: {
            name: entry["ratio_cpu"]["median"]
            for name, entry in task.get("summary", {}).items()
            if name != "reference"
        }
        for env_id, task in results.get("process", {}).items()
        if task.get("reference")
    }
    largest = f"x{max(PAIR_BATCH_SIZES)}"
    batched = [ratios.get(largest) for ratios in process_ratios.values()]
    if not set(process_pairs.PAIRS) <= set(process_ratios):
        batched = []  # a run of some tasks (--tasks) measures no worst task
    return {
        "reference_steps_per_s": results.get("reference", {}).get("steps_per_s"),
        "scan_single_steps_per_s": scan.get("steps_per_s"),
        "scan_single_ratio": scan.get("ratio"),
        "batched_best_env_id": CLASSIC_ID,
        "batched_best_n_envs": best_row["n_envs"] if best_row else None,
        "batched_best_steps_per_s": best_row["steps_per_s"] if best_row else None,
        "batched_best_ratio": best_row["ratio"] if best_row else None,
        "compile_s": max(compile_times) if compile_times else None,
        "step_batch_compile_s": max(step_compile_times) if step_compile_times else None,
        "gymnasium_steps_per_s": gymnasium.get("steps_per_s"),
        "gymnasium_ratio": gymnasium.get("ratio"),
        "vector_env_steps_per_s": vector.get("steps_per_s"),
        "vector_env_ratio": vector.get("ratio"),
        "process_ratios": process_ratios,
        # None when a task with a reference was not measured: a target not measured
        "process_batched_min_ratio": (min(batched) if batched and None not in batched else None),
    }


# --------------------------------------------------------------------------- entry points


def run(quick: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """Runs the benchmark.

    Args:
        quick: a small version (a few tens of seconds) for smoke tests.

    Returns:
        ``(config, results)`` for a :class:`benchmarks.harness.BenchmarkResult`.
    """
    import jax
    import jax.numpy as jnp

    cfg = settings(quick)
    key = jax.random.PRNGKey(0)
    # Initialise the backend (and JAX's dispatch path) before any timed compile.
    jax.block_until_ready(jax.jit(lambda x: x + 1)(jnp.zeros(())))

    # Compile times first, in a fixed order, before any other rollout has been compiled.
    compiled: dict[tuple[str, int, int], Any] = {}
    compile_results: dict[str, Any] = {"batched": {}, "batched_repeat": {}, "scan_single": {}}
    compile_steps = cfg.batched_steps(COMPILE_N_ENVS)
    progress(f"compile times (rollout at n_envs={COMPILE_N_ENVS}, scan_single)")
    for env_id in cfg.env_ids:
        fn = _batched_fn(env_id, COMPILE_N_ENVS, compile_steps)
        executable, seconds = _compile(fn, key)
        compiled[(env_id, COMPILE_N_ENVS, compile_steps)] = executable
        compile_results["batched"][env_id] = {
            "n_envs": COMPILE_N_ENVS,
            "n_steps": compile_steps,
            "compile_s": seconds,
        }
    _, seconds = _compile(_batched_fn(CLASSIC_ID, COMPILE_N_ENVS, compile_steps), key)
    compile_results["batched_repeat"][CLASSIC_ID] = {
        "n_envs": COMPILE_N_ENVS,
        "n_steps": compile_steps,
        "compile_s": seconds,
    }
    scan_executable, seconds = _compile(_scan_fn(CLASSIC_ID, cfg.scan_steps), key)
    compile_results["scan_single"][CLASSIC_ID] = {"n_steps": cfg.scan_steps, "compile_s": seconds}

    progress("compile times in fresh processes on all CPUs (cold and with a warm cache)")
    compile_results["fresh_process"] = {
        f"{env_id} {program}": measure_compile_fresh(env_id, program, cfg.repeats)
        for env_id in cfg.env_ids
        for program in ("step_batch", "rollout")
    }

    progress(f"reference Python IB, {cfg.reference_steps} steps")
    reference = measure_reference(cfg.reference_steps, cfg.repeats)
    reference_rate = reference.get("steps_per_s")

    progress(f"{CLASSIC_ID} scan_single, {cfg.scan_steps} steps")
    best, times, total = _time_compiled(scan_executable, key, cfg.repeats)
    scan_rate = rate(cfg.scan_steps, best)
    scan_results = {
        CLASSIC_ID: {
            "n_steps": cfg.scan_steps,
            "best_s": best,
            "all_s": times,
            "steps_per_s": scan_rate,
            "ratio": ratio(scan_rate, reference_rate),
            "reward_per_step": float(total[0]) / cfg.scan_steps,
        }
    }

    batched: dict[str, list[dict[str, Any]]] = {}
    for env_id in cfg.env_ids:
        rows = []
        for n_envs in cfg.batch_sizes:
            n_steps = cfg.batched_steps(n_envs)
            progress(f"{env_id} rollout, n_envs={n_envs}, {n_steps} steps")
            executable = compiled.pop((env_id, n_envs, n_steps), None)
            compile_s = compile_results["batched"][env_id]["compile_s"]
            if executable is None:
                executable, compile_s = _compile(_batched_fn(env_id, n_envs, n_steps), key)
            rows.append(
                _batched_row(executable, key, cfg.repeats, n_envs, n_steps, reference_rate)
                | {"compile_s": compile_s}
            )
        batched[env_id] = rows

    # The same rollout returning only the total reward: how much work dead-code
    # elimination removes (see _batched_fn). Not used for any ratio or target.
    reward_only: dict[str, dict[str, Any]] = {}
    for env_id in cfg.env_ids:
        progress(f"{env_id} rollout, n_envs={COMPILE_N_ENVS}, total_reward only")
        executable, _ = _compile(
            _batched_fn(env_id, COMPILE_N_ENVS, compile_steps, keep_observation=False), key
        )
        best, times, _ = _time_compiled(executable, key, cfg.repeats)
        steps_per_s = rate(COMPILE_N_ENVS * compile_steps, best)
        reward_only[env_id] = {
            "n_envs": COMPILE_N_ENVS,
            "n_steps": compile_steps,
            "best_s": best,
            "all_s": times,
            "steps_per_s": steps_per_s,
            "ratio": ratio(steps_per_s, reference_rate),
        }

    progress(f"Gymnasium wrapper, {cfg.gym_steps} steps; VectorEnv x{VECTOR_NUM_ENVS}")
    gym = measure_gymnasium(CLASSIC_ID, cfg.gym_steps, cfg.repeats)
    gym["ratio"] = ratio(gym["steps_per_s"], reference_rate)
    vector = measure_vector_env(CLASSIC_ID, VECTOR_NUM_ENVS, cfg.vector_steps, cfg.repeats)
    vector["ratio"] = ratio(vector["steps_per_s"], reference_rate)

    results: dict[str, Any] = {
        "reference": reference,
        "scan_single": scan_results,
        "batched": batched,
        "batched_reward_only": reward_only,
        "compile": compile_results,
        "gymnasium": gym,
        "vector_env": vector,
        "state_bytes": {env_id: state_bytes(env_id) for env_id in (*cfg.env_ids, *cfg.process_ids)},
        "process": measure_process_tasks(cfg),
    }
    results["summary"] = _summarise(results)
    results["targets"] = evaluate_targets(results)

    config = {
        "quick": cfg.quick,
        "repeats": cfg.repeats,
        "warmup": 1,
        "timing": "best of repeats after one untimed warm-up call",
        "reference": {"n_steps": cfg.reference_steps},
        "scan_single": {
            "env_id": CLASSIC_ID,
            "n_steps": cfg.scan_steps,
            "outputs": "total_reward, final_state",
        },
        "batched": {
            "env_ids": list(cfg.env_ids),
            "batch_sizes": list(cfg.batch_sizes),
            "n_steps": {str(n): cfg.batched_steps(n) for n in cfg.batch_sizes},
            "outputs": "total_reward, final_observation",
        },
        "batched_reward_only": {
            "n_envs": COMPILE_N_ENVS,
            "n_steps": compile_steps,
            "outputs": "total_reward",
        },
        "compile": {
            "n_envs": COMPILE_N_ENVS,
            "n_steps": compile_steps,
            "order": [*cfg.env_ids, f"{CLASSIC_ID} (repeat)", f"{CLASSIC_ID} scan_single"],
        },
        "gymnasium": {"env_id": CLASSIC_ID, "n_steps": cfg.gym_steps},
        "process": _process_config(cfg),
        "vector_env": {
            "env_id": CLASSIC_ID,
            "num_envs": VECTOR_NUM_ENVS,
            "n_steps": cfg.vector_steps,
        },
        "targets": {name: {"comparison": c, "threshold": t} for name, (c, t, _) in TARGETS.items()},
    }
    return config, results


def _process_config(cfg: Settings) -> dict[str, Any]:
    return {
        "env_ids": list(cfg.process_ids),
        "references": {
            env_id: process_pairs.PAIRS[env_id].source
            for env_id in cfg.process_ids
            if env_id in process_pairs.PAIRS
        },
        "rounds": cfg.rounds,
        "batch_sizes": list(cfg.pair_batch_sizes),
        "timing": "the reference and the project alternated in every round (the order "
        "flips each round), one call each; wall and CPU time (the process's own)",
        "ratio": "project steps/s / reference single-env steps/s, per round",
        "check": "the reference's episode replayed here before any timing",
    }


def run_process(
    quick: bool = False, tasks: tuple[str, ...] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The process rows alone (:func:`measure_process_tasks`): the paired comparison with
    the references, without the Industrial Benchmark's sweep, compile and Gymnasium
    measurements (minutes instead of most of an hour on a loaded machine); ``tasks``
    limits them to those registered ids (all of them by default)."""
    import jax
    import jax.numpy as jnp

    cfg = settings(quick)
    if tasks is not None:
        unknown = sorted(set(tasks) - set(cfg.process_ids))
        if unknown or not tasks:
            raise ValueError(
                f"tasks: expected ids among {list(cfg.process_ids)}, got {list(tasks)}"
            )
        cfg = dataclasses.replace(cfg, process_ids=tuple(tasks))
    jax.block_until_ready(jax.jit(lambda x: x + 1)(jnp.zeros(())))
    results: dict[str, Any] = {"process": measure_process_tasks(cfg)}
    results["summary"] = _summarise(results)
    results["targets"] = evaluate_targets(results)
    config = {
        "quick": cfg.quick,
        "part": "process",
        "process": _process_config(cfg),
        "targets": {name: {"comparison": c, "threshold": t} for name, (c, t, _) in TARGETS.items()},
    }
    return config, results


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.env_throughput --process-only [--quick] [--tasks ID,...]
    [-t TAG] [-d TEXT]``: the process rows alone (``--tasks``: only those), saved as an
    ``env_throughput`` result (the whole benchmark: ``python -m benchmarks.run
    env_throughput``)."""
    import argparse

    from benchmarks.harness import (
        DEFAULT_RESULTS_DIR,
        BenchmarkResult,
        render_tables,
        system_info,
        utc_timestamp,
    )

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--process-only", action="store_true", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--tasks",
        default=None,
        help="comma-separated process task ids to run (default: every one with a reference)",
    )
    parser.add_argument("-t", "--tag", default="process")
    parser.add_argument("-d", "--description", default="")
    args = parser.parse_args(argv)
    timestamp, system = utc_timestamp(), system_info()
    start = time.perf_counter()
    tasks = None if args.tasks is None else tuple(t.strip() for t in args.tasks.split(",") if t)
    config, results = run_process(args.quick, tasks)
    results["wall_s"] = time.perf_counter() - start
    result = BenchmarkResult(
        name=NAME,
        description=args.description,
        tag=args.tag,
        timestamp=timestamp,
        system=system,
        config=config,
        results=results,
    )
    path = result.save(DEFAULT_RESULTS_DIR)
    render_tables(report(config, results))
    print(path)
    return 0


def report(config: dict[str, Any], results: dict[str, Any]) -> list[Table]:
    """Tables for the runner's printed summary."""
    reference = results.get("reference", {})
    overview = Table(
        "env_throughput: steps/s",
        ["measurement", "steps/s", "ratio"],
        [["reference Python IB (IDS)", reference.get("steps_per_s"), 1.0]],
        caption="ratio = steps/s / reference steps/s, both from this run",
    )
    for env_id, entry in results.get("scan_single", {}).items():
        overview.rows.append(
            [f"{env_id} single env, lax.scan", entry.get("steps_per_s"), entry.get("ratio")]
        )
    for name, label in (("gymnasium", "gymnasium.make wrapper"), ("vector_env", "VectorEnv")):
        entry = results.get(name, {})
        if "num_envs" in entry:
            label = f"{label} x{entry['num_envs']}"
        overview.rows.append(
            [
                f"{entry.get('env_id', CLASSIC_ID)} {label}",
                entry.get("steps_per_s"),
                entry.get("ratio"),
            ]
        )
    for env_id, entry in results.get("batched_reward_only", {}).items():
        overview.rows.append(
            [
                f"{env_id} rollout x{entry.get('n_envs')}, total_reward only (dead code removed)",
                entry.get("steps_per_s"),
                entry.get("ratio"),
            ]
        )
    if reference.get("error"):
        overview.caption = f"{overview.caption}; {reference['error']}"

    env_ids = list(results.get("batched", {}))
    scaling = Table(
        "batched rollout (vmap in lax.scan): steps/s and ratio to reference",
        ["n_envs", "n_steps"] + [f"{e} {c}" for e in env_ids for c in ("steps/s", "ratio")],
        [],
    )
    sizes: list[int] = sorted(
        {row["n_envs"] for rows in results.get("batched", {}).values() for row in rows}
    )
    for n_envs in sizes:
        cells: list[Any] = [n_envs, None]
        for env_id in env_ids:
            row = next((r for r in results["batched"][env_id] if r["n_envs"] == n_envs), {})
            cells[1] = cells[1] or row.get("n_steps")
            cells += [row.get("steps_per_s"), row.get("ratio")]
        scaling.rows.append(cells)

    compile_table = Table(
        "compile seconds (trace + lower + compile) and state size", ["measurement", "value"], []
    )
    compile_results = results.get("compile", {})
    for kind, label in (
        ("batched", "rollout"),
        ("batched_repeat", "rollout, second compile"),
        ("scan_single", "scan_single"),
    ):
        for env_id, entry in compile_results.get(kind, {}).items():
            where = f" n_envs={entry['n_envs']}" if "n_envs" in entry else ""
            compile_table.rows.append([f"{env_id} {label}{where}, s", entry.get("compile_s")])
    for name, entry in compile_results.get("fresh_process", {}).items():
        compile_table.rows.append([f"{name}, fresh process on all CPUs, cold, s", entry["cold_s"]])
        compile_table.rows.append(
            [f"{name}, fresh process, warm persistent cache, s", entry["warm_cache_s"]]
        )
    for env_id, size in results.get("state_bytes", {}).items():
        compile_table.rows.append([f"{env_id} state bytes per env", size])

    process = results.get("process", {})
    contenders = ["single", *(f"x{n}" for n in config.get("process", {}).get("batch_sizes", []))]
    process_table = Table(
        "process tasks against their references, alternated rounds: median [min, max] of "
        "CPU-time steps/s and of the ratio ours / reference single env",
        ["task", "reference", "check", "ref steps/s"]
        + [f"{name} {what}" for name in contenders for what in ("steps/s", "ratio")],
        [],
    )
    for env_id, task in process.items():
        summary = task.get("summary", {})
        check = task.get("check", {})
        cells: list[Any] = [
            env_id,
            task.get("reference") or "none",
            task.get("error") or ("passed" if check.get("passed") else "-"),
            _spread_text(summary.get("reference", {}).get("steps_per_s_cpu")),
        ]
        for name in contenders:
            entry = summary.get(name, {})
            cells += [
                _spread_text(entry.get("steps_per_s_cpu")),
                _spread_text(entry.get("ratio_cpu")),
            ]
        process_table.rows.append(cells)

    targets = Table("targets", ["target", "value", "threshold", "met"], [])
    for name, entry in results.get("targets", {}).items():
        targets.rows.append(
            [
                f"{name} ({entry.get('what', '')})",
                entry.get("value"),
                f"{entry.get('comparison', '')} {entry.get('threshold')}",
                entry.get("passed"),
            ]
        )
    return [overview, scaling, process_table, compile_table, targets]


def _spread_text(spread: dict[str, Any] | None) -> str | None:
    """``median [min, max]`` of a min/median/max entry, or None without it."""
    if not spread or spread.get("median") is None:
        return None
    return (
        f"{format_number(spread['median'])} "
        f"[{format_number(spread['min'])}, {format_number(spread['max'])}]"
    )


if __name__ == "__main__":
    sys.exit(main())
