"""Dataset generation: transitions per second of ``generate_trajectories`` on ``IB-v0``.

What is measured, all in one process (the README advises running pinned to one core with
``taskset -c 0``; the numbers are for whatever CPU affinity the process has, recorded in
``config.cpu_affinity`` and in ``system``):

* **policies** - behaviour policies as NeoRL generates data with: a tanh-Gaussian actor
  (``TanhGaussianActor``, a Flax MLP) with random weights, acting through
  ``behaviour_policy`` (its mean action, or with probability 0.2 an action sampled from
  it, chosen independently at every step), with hidden layers (64, 64) (the size used for
  behaviour policies) and (256, 256) for reference; and the uniform random policy (the
  environment's own cost, for context).
* **three ways** - for ``n_trajectories`` in 100, 500 and 1000 trajectories of 1000 steps:
  ``jax`` is the jitted ``generate_trajectories`` call alone (``block_until_ready``);
  ``with_transfer`` adds ``jax.device_get`` of the trajectories to numpy; ``end_to_end``
  also builds the dataset with ``Dataset.from_trajectories`` (the device arrays ready).
  Each rate is ``n_trajectories * n_steps / seconds`` of the whole chain so far.
* **components** - at the largest size, where the (64, 64) policy's time goes: the
  environment alone stepping ``rollout`` without recording anything
  (``env_rollout_no_record``), the behaviour policy alone on a fixed batch of
  observations (``behaviour_policy_only``), its mean action alone (``mean_action_only``,
  with the MLP's multiply-adds per second), and the batch-major layout that
  ``generate_trajectories`` applies to the recorded observations (``layout_only``:
  concatenate the final observation and swap the time and batch axes).

Each time is the best of several repeats; the jitted call is compiled first
(``compile_s``: trace, lower and compile) and warmed up once. The ``targets`` entry
records the goal (>= 1 M transitions/s, the (64, 64) policy's JAX part, best size) with
its value and whether it was met; the end-to-end rate is reported beside it. A miss is
data, not an error.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.harness import Table, evaluate_targets, progress, rate, time_best

NAME = "data_generation"
DESCRIPTION = (
    "Transitions/s of generate_trajectories on IB-v0 with MLP behaviour policies: "
    "JAX part, + device-to-host, + Dataset.from_trajectories"
)

ENV_ID = "IB-v0"
SAMPLE_PROBABILITY = 0.2
#: Behaviour policies: name -> hidden widths of the actor's MLP (None: uniform random).
POLICIES: dict[str, tuple[int, ...] | None] = {
    "mlp_64x64": (64, 64),
    "mlp_256x256": (256, 256),
    "random_uniform": None,
}
#: The policy the target is judged on.
TARGET_POLICY = "mlp_64x64"

#: Goals recorded with each run: name -> (comparison, threshold, what is compared).
TARGETS: dict[str, tuple[str, float, str]] = {
    "jax_transitions_per_s": (
        ">=",
        1_000_000.0,
        f"transitions/s of the jitted generate_trajectories ({TARGET_POLICY} behaviour "
        "policy, best n_trajectories), writing into a reused donated buffer as the "
        "dataset factory does",
    ),
}

STAGES = ("jax", "jax_reused_buffer", "with_transfer", "end_to_end")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Sizes of one run."""

    quick: bool
    repeats: int
    sizes: tuple[int, ...]
    n_steps: int


def settings(quick: bool) -> Settings:
    """The full run, or with ``quick`` a small one."""
    if quick:
        return Settings(quick=True, repeats=2, sizes=(20, 100), n_steps=200)
    return Settings(quick=False, repeats=3, sizes=(100, 500, 1000), n_steps=1000)


def cpu_affinity() -> list[int] | None:
    """The logical CPUs this process may run on, or None where the OS cannot say."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


# --------------------------------------------------------------------------- policies


def mlp_multiply_adds(observation_size: int, hidden: Sequence[int], action_size: int) -> int:
    """Multiply-adds of one forward pass of the actor (torso, mean and log-std heads)."""
    widths = [observation_size, *hidden]
    torso = sum(a * b for a, b in itertools.pairwise(widths))
    return torso + 2 * widths[-1] * action_size


def make_policy(env: Any, hidden: tuple[int, ...] | None, seed: int = 0) -> tuple[Any, Any]:
    """``(policy, policy_params)``: the tanh-Gaussian MLP behaviour policy with random
    weights, or the uniform random policy when ``hidden`` is None."""
    import jax
    import jax.numpy as jnp

    from neorl_industrial.core.agents.networks import TanhGaussianActor
    from neorl_industrial.core.environments import uniform_random_policy
    from neorl_industrial.functional.transformations.generation import behaviour_policy

    if hidden is None:
        return uniform_random_policy(env), None
    actor = TanhGaussianActor(action_size=env.action_size, hidden=hidden)
    params = actor.init(jax.random.PRNGKey(seed), jnp.zeros((env.observation_size,)))
    policy = behaviour_policy(
        lambda p, observation: actor.mean_action(p, observation),
        lambda p, observation, key: actor.sample(p, observation, key)[0],
        SAMPLE_PROBABILITY,
    )
    return policy, params


# --------------------------------------------------------------------------- measurements


def _compile(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """``jax.jit(fn).lower(*args).compile()`` and its wall time in seconds."""
    import jax

    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - start


def _stage(count: int, best: float, times: list[float]) -> dict[str, Any]:
    return {"best_s": best, "all_s": times, "transitions_per_s": rate(count, best)}


def measure_generation(
    env: Any,
    env_params: Any,
    policy: Any,
    policy_params: Any,
    n_trajectories: int,
    n_steps: int,
    repeats: int,
) -> dict[str, Any]:
    """Transitions/s of one size in the three ways (see the module docstring)."""
    import jax

    from neorl_industrial.functional.state_management import Dataset
    from neorl_industrial.functional.transformations.generation import generate_trajectories

    def generate(key: Any, policy_params: Any) -> Any:
        return generate_trajectories(
            key, env, env_params, policy, n_trajectories, n_steps, policy_params=policy_params
        )

    key = jax.random.PRNGKey(1)
    compiled, compile_s = _compile(generate, key, policy_params)
    count = n_trajectories * n_steps
    last: dict[str, Any] = {}

    def jax_part() -> Any:
        return jax.block_until_ready(compiled(key, policy_params))

    def with_transfer() -> Any:
        return jax.device_get(jax_part())

    def end_to_end() -> Any:
        host = with_transfer()
        dataset = Dataset.from_trajectories(
            host.observations, host.actions, host.rewards, host.costs, host.terminated
        )
        last["dataset"] = jax.block_until_ready(dataset)
        return last["dataset"]

    # The factory's path: the previous call's observation buffer is donated and written
    # again, so the largest output is neither allocated nor page-faulted per call.
    def generate_into(key: Any, policy_params: Any, buffer: Any) -> Any:
        return generate_trajectories(
            key,
            env,
            env_params,
            policy,
            n_trajectories,
            n_steps,
            policy_params=policy_params,
            observation_buffer=buffer,
        )

    reusing = jax.jit(generate_into, donate_argnums=2)
    buffers = [compiled(key, policy_params).observations]

    def jax_reused_buffer() -> Any:
        out = jax.block_until_ready(reusing(key, policy_params, buffers.pop()))
        buffers.append(out.observations)
        return out

    entry: dict[str, Any] = {
        "n_trajectories": n_trajectories,
        "n_steps": n_steps,
        "transitions": count,
        "compile_s": compile_s,
    }
    # The compiled call is warm after the first timing; later stages start straight away.
    for name, fn, warmup in (
        ("jax", jax_part, 1),
        ("jax_reused_buffer", jax_reused_buffer, 1),
        ("with_transfer", with_transfer, 0),
        ("end_to_end", end_to_end, 0),
    ):
        best, times = time_best(fn, repeats, warmup=warmup)
        entry[name] = _stage(count, best, times)
    dataset = last.pop("dataset")
    entry["dataset_transitions"] = dataset.n_transitions
    entry["reward_per_step"] = float(dataset.rewards.mean())
    entry["dataset_nbytes"] = dataset.nbytes()
    return entry


def measure_components(
    env: Any,
    env_params: Any,
    hidden: tuple[int, ...],
    n_envs: int,
    n_steps: int,
    repeats: int,
) -> dict[str, Any]:
    """Where the time of one generation goes (see the module docstring)."""
    import jax
    import jax.numpy as jnp

    from neorl_industrial.core.agents.networks import TanhGaussianActor
    from neorl_industrial.core.environments import rollout, uniform_random_policy

    policy, policy_params = make_policy(env, hidden)
    actor = TanhGaussianActor(action_size=env.action_size, hidden=hidden)
    random_policy = uniform_random_policy(env)
    key = jax.random.PRNGKey(5)
    observations = jax.random.normal(key, (n_envs, env.observation_size))
    count = n_envs * n_steps

    def env_rollout_no_record(key: Any) -> Any:
        # The final observation keeps the observation history from being dead code.
        result = rollout(key, env, env_params, random_policy, n_envs, n_steps)
        return result.total_reward, result.final_observation

    def behaviour_policy_only(key: Any, params: Any) -> Any:
        batched = jax.vmap(policy, in_axes=(None, 0, 0))

        def step(carry: Any, step_key: Any) -> tuple[Any, None]:
            actions = batched(params, observations + carry, jax.random.split(step_key, n_envs))
            return carry + jnp.sum(actions) * 1e-9, None

        return jax.lax.scan(step, jnp.zeros(()), jax.random.split(key, n_steps))[0]

    def mean_action_only(key: Any, params: Any) -> Any:
        def step(carry: Any, _: Any) -> tuple[Any, None]:
            actions = actor.mean_action(params, observations + carry)
            return carry + jnp.sum(actions) * 1e-9, None

        return jax.lax.scan(step, jnp.zeros(()), None, length=n_steps)[0]

    def layout_only(recorded: Any) -> Any:
        stacked = jnp.concatenate([recorded, recorded[-1:]], axis=0)
        return jnp.swapaxes(stacked, 0, 1)

    recorded = jax.random.normal(key, (n_steps, n_envs, env.observation_size))
    components: dict[str, Any] = {}
    for name, fn, args in (
        ("env_rollout_no_record", env_rollout_no_record, (key,)),
        ("behaviour_policy_only", behaviour_policy_only, (key, policy_params)),
        ("mean_action_only", mean_action_only, (key, policy_params)),
        ("layout_only", layout_only, (recorded,)),
    ):
        progress(f"component {name}, n_envs={n_envs}, {n_steps} steps")
        compiled, compile_s = _compile(fn, *args)
        best, times = time_best(
            lambda compiled=compiled, args=args: jax.block_until_ready(compiled(*args)), repeats
        )
        components[name] = {"compile_s": compile_s, **_stage(count, best, times)}
    del recorded
    macs = mlp_multiply_adds(env.observation_size, hidden, env.action_size)
    mean_rate = components["mean_action_only"]["transitions_per_s"]
    components["mean_action_only"]["multiply_adds_per_action"] = macs
    components["mean_action_only"]["gflop_per_s"] = (
        None if mean_rate is None else 2.0 * macs * mean_rate / 1e9
    )
    env_rate = components["env_rollout_no_record"]["transitions_per_s"]
    policy_rate = components["behaviour_policy_only"]["transitions_per_s"]
    components["env_plus_policy_bound"] = {
        "transitions_per_s": (
            None if not env_rate or not policy_rate else 1.0 / (1.0 / env_rate + 1.0 / policy_rate)
        ),
        "how": "1 / (1 / env_rollout_no_record + 1 / behaviour_policy_only): both parts "
        "run one after the other on one core, before anything is recorded",
    }
    return {"hidden": list(hidden), "n_envs": n_envs, "n_steps": n_steps, **components}


def summarise(generation: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Best rate per policy and stage, with the size it was reached at."""
    summary: dict[str, Any] = {}
    for name, rows in generation.items():
        entry: dict[str, Any] = {}
        for stage in STAGES:
            best = max(
                (row for row in rows if row.get(stage, {}).get("transitions_per_s")),
                key=lambda row, stage=stage: row[stage]["transitions_per_s"],
                default=None,
            )
            entry[f"{stage}_transitions_per_s"] = best[stage]["transitions_per_s"] if best else None
            entry[f"{stage}_n_trajectories"] = best["n_trajectories"] if best else None
        summary[name] = entry
    return summary


# --------------------------------------------------------------------------- entry points


def run(quick: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """Runs the benchmark.

    Args:
        quick: a small version (short trajectories, small batches) for smoke tests.

    Returns:
        ``(config, results)`` for a :class:`benchmarks.harness.BenchmarkResult`.
    """
    import jax
    import jax.numpy as jnp

    from neorl_industrial.core.environments import make

    cfg = settings(quick)
    env, env_params = make(ENV_ID)
    jax.block_until_ready(jax.jit(lambda x: x + 1)(jnp.zeros(())))

    generation: dict[str, list[dict[str, Any]]] = {}
    for name, hidden in POLICIES.items():
        policy, policy_params = make_policy(env, hidden)
        rows = []
        for n_trajectories in cfg.sizes:
            progress(f"{name}: {n_trajectories} trajectories x {cfg.n_steps} steps")
            rows.append(
                measure_generation(
                    env,
                    env_params,
                    policy,
                    policy_params,
                    n_trajectories,
                    cfg.n_steps,
                    cfg.repeats,
                )
            )
        generation[name] = rows

    target_hidden = POLICIES[TARGET_POLICY]
    assert target_hidden is not None
    components = measure_components(
        env, env_params, target_hidden, max(cfg.sizes), cfg.n_steps, cfg.repeats
    )

    summary = summarise(generation)
    target_entry = summary[TARGET_POLICY]
    results: dict[str, Any] = {
        "generation": generation,
        "components": components,
        "summary": summary,
        "targets": evaluate_targets(
            {"jax_transitions_per_s": target_entry["jax_reused_buffer_transitions_per_s"]},
            TARGETS,
        ),
    }
    results["targets"]["jax_transitions_per_s"]["fresh_buffer_transitions_per_s"] = target_entry[
        "jax_transitions_per_s"
    ]
    results["targets"]["jax_transitions_per_s"]["end_to_end_transitions_per_s"] = target_entry[
        "end_to_end_transitions_per_s"
    ]

    affinity = cpu_affinity()
    config = {
        "quick": cfg.quick,
        "repeats": cfg.repeats,
        "timing": "best of repeats; the jax stage after one untimed warm-up call",
        "env_id": ENV_ID,
        "sizes": list(cfg.sizes),
        "n_steps": cfg.n_steps,
        "policies": {
            name: (
                "uniform random actions"
                if hidden is None
                else {
                    "actor": "TanhGaussianActor (random weights)",
                    "hidden": list(hidden),
                    "behaviour": f"mean action, or a sampled one with p={SAMPLE_PROBABILITY}",
                    "multiply_adds_per_action": mlp_multiply_adds(
                        env.observation_size, hidden, env.action_size
                    ),
                }
            )
            for name, hidden in POLICIES.items()
        },
        "stages": {
            "jax": "jitted generate_trajectories, block_until_ready",
            "jax_reused_buffer": "the same, writing into the previous call's donated "
            "observation buffer (the dataset factory's path)",
            "with_transfer": "+ jax.device_get to numpy",
            "end_to_end": "+ Dataset.from_trajectories, block_until_ready",
        },
        "cpu_affinity": affinity,
        "cpu_affinity_note": "the README advises taskset -c 0 (one core, as the Makefile "
        "runs it); these numbers are for the affinity recorded here",
        "targets": {name: {"comparison": c, "threshold": t} for name, (c, t, _) in TARGETS.items()},
    }
    return config, results


def report(config: dict[str, Any], results: dict[str, Any]) -> list[Table]:
    """Tables for the runner's printed summary."""
    affinity = config.get("cpu_affinity")
    rates = Table(
        f"data_generation: transitions/s on {config.get('env_id', ENV_ID)}, "
        f"{config.get('n_steps')} steps per trajectory",
        [
            "policy",
            "n_trajectories",
            "jax",
            "jax, reused buffer",
            "+ transfer",
            "end to end",
            "compile s",
        ],
        [],
        caption=f"cumulative stages; CPU affinity {affinity}",
    )
    for name, rows in results.get("generation", {}).items():
        for row in rows:
            rates.rows.append(
                [
                    name,
                    row.get("n_trajectories"),
                    *(row.get(stage, {}).get("transitions_per_s") for stage in STAGES),
                    row.get("compile_s"),
                ]
            )

    components = results.get("components", {})
    parts = Table(
        f"where the time goes: hidden {components.get('hidden')}, n_envs "
        f"{components.get('n_envs')}",
        ["part", "transitions/s"],
        [],
    )
    for name in (
        "env_rollout_no_record",
        "behaviour_policy_only",
        "mean_action_only",
        "layout_only",
        "env_plus_policy_bound",
    ):
        parts.rows.append([name, components.get(name, {}).get("transitions_per_s")])
    flops = components.get("mean_action_only", {}).get("gflop_per_s")
    if flops is not None:
        parts.caption = f"mean action MLP at {flops:.1f} GFLOP/s"

    targets = Table("targets", ["target", "value", "threshold", "met", "end to end"], [])
    for name, entry in results.get("targets", {}).items():
        targets.rows.append(
            [
                name,
                entry.get("value"),
                f"{entry.get('comparison', '')} {entry.get('threshold')}",
                entry.get("passed"),
                entry.get("end_to_end_transitions_per_s"),
            ]
        )
    targets.caption = "; ".join(
        f"{name}: {entry.get('what', '')}" for name, entry in results.get("targets", {}).items()
    )
    return [rates, parts, targets]
