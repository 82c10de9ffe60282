"""Safe offline RL on the task suite: Lagrangian agents against TD3+BC, with and without
the shield, on the Industrial Benchmark and the process tasks.

The study (DSRL conventions), for each task of ``--tasks``:

* **Data**: episodes of the ``medium``, ``high`` and ``expert`` behaviour policies, mixed.
  The cost on the Industrial Benchmark is a stricter fatigue limit than the environment's
  default: one per step whose next observed fatigue is above ``--fatigue-limit`` (30),
  relabelled from the observations with a constraint spec, with an episode cost limit
  ``--cost-limit`` (100); part of the behaviour data exceeds the limit, part stays within
  it. On the process tasks the cost is the task's own: every cost channel with its default
  episode limit (``env.default_cost_limits()``: tank overflow and empty levels, servo
  travel, pipeline flow off its target, reactor temperature).
* **Agents** (``--seeds`` each, all seeds in one vmapped program): TD3+BC (ignores cost),
  TD3BC-Lag and IQL-Lag (PID multiplier per cost channel), BC-Safe (behaviour cloning on
  the episodes within every limit), BC on everything for reference, and an ablation of
  TD3BC-Lag without its cost floor and with OSRL's PID gains. Actions in plant units are
  scaled to [-1, 1] by the actuator bounds for training; the policies act in plant units.
* **Evaluation**: whole episodes in the JAX environment, every policy once with the task's
  default hard constraints shielded (``env.default_constraints()``) and once with them
  only checked.
* **Metrics**: normalized return (D4RL-style from the dataset card), normalized cost
  (mean episode cost / cost limit, the largest over channels; <= 1 is safe), violation
  rate (episodes over a limit), shield override rate, and hard-constraint violations of
  the applied actions.

Usage::

    python -m benchmarks.safety_study                      # IB, docs/safety.md
    python -m benchmarks.safety_study --tasks IB-v0 FourTank-v0 DMSD-v0 Pipeline-v0
    python -m benchmarks.safety_study --updates 500 --seeds 2 --trajectories 4 --no-save
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import (
    DEFAULT_RESULTS_DIR,
    REPO_ROOT,
    progress,
    publish_study,
    require_positive,
    utc_timestamp,
)
from benchmarks.learning import (
    mean_confidence_interval,
    observation_normalizer,
    train_all,
)

NAME = "safety_study"
ALGORITHMS = ("td3bc", "td3bc_lag", "td3bc_lag_plain", "iql_lag", "bc_safe", "bc")
LABELS = {
    "td3bc": "TD3+BC",
    "td3bc_lag": "TD3BC-Lag",
    "td3bc_lag_plain": "TD3BC-Lag without cost floor, OSRL gains",
    "iql_lag": "IQL-Lag",
    "bc_safe": "BC-Safe",
    "bc": "BC (all data)",
}
#: The registered algorithm of each study agent (whose reward scaling it trains with).
REGISTRY_NAMES = {
    "td3bc": "td3bc",
    "td3bc_lag": "td3bc-lag",
    "td3bc_lag_plain": "td3bc-lag",
    "iql_lag": "iql-lag",
    "bc_safe": "bc",
    "bc": "bc",
}
LAGRANGIAN = ("td3bc_lag", "iql_lag")
QUALITIES = ("medium", "high", "expert")
IB_IDS = ("IB-v0", "IB-classic-v0", "IB-nonstationary-v0")


def make_agent(
    name: str,
    obs_size: int,
    action_size: int,
    hidden: Any,
    cost_limits: tuple[float, ...],
    episode_length: int,
) -> Any:
    """The study's agent ``name`` with CORL/OSRL defaults but the network widths, its
    multipliers (one per cost channel) aiming at ``cost_limits`` per episode."""
    from neorl_industrial.core.agents import (
        BCConfig,
        IQLLagConfig,
        PIDConfig,
        TD3BCConfig,
        TD3BCLagConfig,
        make_bc,
        make_iql_lag,
        make_td3bc,
        make_td3bc_lag,
    )

    hidden = tuple(hidden)
    safety = {"cost_limits": tuple(cost_limits), "episode_length": int(episode_length)}
    if name == "td3bc":
        return make_td3bc(TD3BCConfig(hidden=hidden), obs_size, action_size)
    if name == "td3bc_lag":
        return make_td3bc_lag(TD3BCLagConfig.create(hidden=hidden, **safety), obs_size, action_size)
    if name == "td3bc_lag_plain":
        # The ablation: no cost floor and OSRL's PID gains.
        pid = PIDConfig(kp=0.1, ki=0.003, kd=0.001)
        config = TD3BCLagConfig.create(hidden=hidden, cost_floor=0.0, pid=pid, **safety)
        return make_td3bc_lag(config, obs_size, action_size)
    if name == "iql_lag":
        return make_iql_lag(IQLLagConfig.create(hidden=hidden, **safety), obs_size, action_size)
    if name in ("bc", "bc_safe"):
        return make_bc(BCConfig(hidden=hidden), obs_size, action_size)
    raise ValueError(f"algorithm: unknown {name!r}; expected one of {ALGORITHMS}")


@dataclasses.dataclass(frozen=True)
class StudyCost:
    """What a task's study counts as cost.

    Attributes:
        channels: the cost channels, by name.
        limits: the episode cost limit of each channel.
        relabel: a constraint spec the data's costs are recomputed from (None: the data's
            own costs).
        description: one sentence for the page.
    """

    channels: tuple[str, ...]
    limits: tuple[float, ...]
    relabel: Any
    description: str


def study_cost(env_id: str, args: argparse.Namespace) -> StudyCost:
    """The IB's stricter fatigue limit, or a process task's own channels and limits.

    Raises:
        ValueError: when a task's cost channel has no default episode limit.
    """
    from neorl_industrial.core.environments import make
    from neorl_industrial.core.safety import ConstraintSpec

    if env_id in IB_IDS:
        spec = ConstraintSpec.from_dict(
            {
                "name": "ib-study-fatigue",
                "costs": [
                    {
                        "name": "fatigue",
                        "feature": "fatigue",
                        "above": args.fatigue_limit,
                        "cost_limit": args.cost_limit,
                    }
                ],
            }
        )
        return StudyCost(
            channels=("fatigue",),
            limits=(float(args.cost_limit),),
            relabel=spec,
            description=(
                f"1 per step whose fatigue is above {args.fatigue_limit:g} (stricter than "
                "the environment's default), relabelled from the observations; episode "
                f"cost limit {args.cost_limit:g}"
            ),
        )
    env, _ = make(env_id)
    limits = env.default_cost_limits()
    missing = [name for name in env.cost_names if name not in limits]
    if missing:
        raise ValueError(f"{env_id}: cost channels {missing} have no default episode cost limit")
    parts = sorted({f"{limits[name]:g}" for name in env.cost_names})
    return StudyCost(
        channels=tuple(env.cost_names),
        limits=tuple(float(limits[name]) for name in env.cost_names),
        relabel=None,
        description=(
            f"the task's own {len(env.cost_names)} cost channel(s) "
            f"({', '.join(env.cost_names)}), episode cost limit {' / '.join(parts)} each"
        ),
    )


def episodes_of(dataset: Any) -> list[dict[str, Any]]:
    """The dataset's episodes as per-episode arrays (to mix datasets)."""
    return dataset.to_episodes()


def final_metrics(history: Sequence[dict[str, Any]], prefix: str) -> dict[str, list] | None:
    """The last chunk's metrics whose names start with ``prefix`` (e.g. ``multiplier_``),
    each as a list over seeds; ``None`` when the algorithm has none."""
    last = history[-1]["metrics"]
    names = sorted(key for key in last if key.startswith(prefix))
    return {key: np.asarray(last[key]).reshape(-1).tolist() for key in names} or None


def build_data(
    env_id: str, cost: StudyCost, args: argparse.Namespace
) -> tuple[Any, Any, dict[str, Any]]:
    """The mixed dataset (actions in [-1, 1], costs of ``cost``), a dataset card (for
    score references) and facts."""
    from neorl_industrial.core.environments import make
    from neorl_industrial.functional.state_management import (
        Dataset,
        episodes_within_limits,
        relabel_costs,
    )
    from neorl_industrial.functional.transformations import action_scaler_for
    from neorl_industrial.integration.datasets import generate_dataset

    env, _ = make(env_id)
    scaler = action_scaler_for(env)
    constraints = None if cost.relabel is None else env.compile_constraints(cost.relabel)
    episodes, sources, card = [], [], None
    for quality in QUALITIES:
        progress(f"dataset {env_id}-{quality}: {args.trajectories} trajectories")
        dataset, card = generate_dataset(env_id, quality, args.trajectories, seed=args.data_seed)
        if constraints is not None:
            dataset = relabel_costs(dataset, constraints)
        if scaler is not None:
            dataset = dataset.replace(actions=scaler.scale(dataset.actions))
        part = episodes_of(dataset)
        episodes += part
        sources += [quality] * len(part)
    mixed = Dataset.from_episodes(episodes, name=f"{env_id}-safety-mix")
    episode_costs = np.asarray(mixed.episode_costs())
    normalized = (episode_costs / np.asarray(cost.limits)).max(axis=1)
    within = episodes_within_limits(mixed, list(cost.limits))
    labels = np.asarray(sources)
    facts = {
        "episodes": int(mixed.n_episodes),
        "transitions": int(mixed.n_transitions),
        "within_limit": int(within.sum()),
        "per_quality": {
            quality: {
                "normalized_cost_mean": float(normalized[labels == quality].mean()),
                "within_limit": int(within[labels == quality].sum()),
                "episodes": int((labels == quality).sum()),
            }
            for quality in QUALITIES
        },
        "random_return": float(card.random_return),
        "expert_return": float(card.expert_return),
    }
    return mixed, card, facts


def evaluate_policies(
    env_id: str,
    cost: StudyCost,
    algorithm: Any,
    policies: Any,
    args: argparse.Namespace,
    shield_actions: bool,
    adjust: Callable[[Any], Any] | None = None,
) -> list[dict[str, Any]]:
    """DSRL metrics of every seed's policy (leading axis of ``policies``); ``adjust`` maps
    the episode statistics (costs on the study's channels) before the metrics."""
    import jax

    from neorl_industrial.core.environments import make
    from neorl_industrial.functional.state_management import with_action_scaling
    from neorl_industrial.functional.transformations import action_scaler_for
    from neorl_industrial.functional.transformations.evaluation import (
        evaluate,
        per_policy_metrics,
    )

    env, params = make(env_id)
    if env_id in IB_IDS:
        params = params.replace(fatigue_limit=np.float32(args.fatigue_limit))
    horizon = horizon_of(env_id, args)
    constraints = env.compile_constraints()
    acting = with_action_scaling(algorithm, action_scaler_for(env))

    def policy(policy_params: Any, observation: Any, key: Any) -> Any:
        return acting.act(policy_params, observation, key, deterministic=True)

    def one(policy_params: Any, key: Any) -> Any:
        return evaluate(
            key,
            env,
            params,
            policy,
            args.episodes,
            horizon=horizon,
            policy_params=policy_params,
            constraints=constraints,
            shield_actions=shield_actions,
        )

    n = jax.tree.leaves(policies)[0].shape[0]
    keys = jax.random.split(jax.random.PRNGKey(11), n)
    stats = jax.device_get(jax.jit(jax.vmap(one))(policies, keys))
    # The study's channels only (on the IB: fatigue; the consumption channel is ignored).
    indices = [list(env.cost_names).index(name) for name in cost.channels]
    stats = stats.replace(costs=np.asarray(stats.costs)[..., indices])
    if adjust is not None:
        stats = adjust(stats)
    return per_policy_metrics(stats, list(cost.limits), cost_names=list(cost.channels))


def horizon_of(env_id: str, args: argparse.Namespace) -> int:
    """``--horizon`` on the IB; a process task's own episode length."""
    from neorl_industrial.core.environments import make

    if env_id in IB_IDS:
        return int(args.horizon)
    _, params = make(env_id)
    return int(params.horizon)


def summarize(rows: list[dict[str, Any]], random_return: float, expert_return: float) -> dict:
    returns = [
        100.0 * (r["return"] - random_return) / (expert_return - random_return) for r in rows
    ]
    return {
        "normalized_return": mean_confidence_interval(returns),
        "normalized_cost": mean_confidence_interval([r["normalized_cost"] for r in rows]),
        "violation_rate": mean_confidence_interval([r["violation_rate"] for r in rows]),
        "override_rate": mean_confidence_interval([r["override_rate"] for r in rows]),
        "hard_violation_steps": int(sum(r["hard_violation_steps"] for r in rows)),
        "proposed_violations": int(sum(r["proposed_violations"] for r in rows)),
        "per_seed": rows,
    }


def study_task(env_id: str, args: argparse.Namespace) -> dict[str, Any]:
    """One task: data, every agent trained and evaluated with the shield on and off."""
    import jax
    import jax.numpy as jnp

    from neorl_industrial.core.agents.registry import algorithm_entry
    from neorl_industrial.functional.state_management import (
        RewardScaling,
        select_safe_episodes,
    )

    cost = study_cost(env_id, args)
    horizon = horizon_of(env_id, args)
    mixed, _card, facts = build_data(env_id, cost, args)
    task: dict[str, Any] = {
        "data": facts,
        "cost": {
            "channels": list(cost.channels),
            "limits": list(cost.limits),
            "description": cost.description,
        },
        "horizon": horizon,
        "algorithms": {},
        "timing": {},
    }
    for name in args.algorithms:
        if name == "bc_safe" and facts["within_limit"] == 0:
            progress(f"{env_id} {LABELS[name]}: no episode within the limits, skipped")
            continue
        data = select_safe_episodes(mixed, list(cost.limits)) if name == "bc_safe" else mixed
        scaling = RewardScaling.fit(data, algorithm_entry(REGISTRY_NAMES[name]).reward_scaling)
        scaled = scaling.apply(data)
        normalizer = jax.tree.map(lambda leaf: leaf[None], observation_normalizer(scaled))
        stacked = jax.tree.map(lambda leaf: jnp.asarray(leaf)[None], scaled)
        algorithm = make_agent(
            name, scaled.observation_size, scaled.action_size, args.hidden, cost.limits, horizon
        )
        progress(f"{env_id} {LABELS[name]}: {args.seeds} seeds on {data.n_episodes} episodes")
        started = time.perf_counter()
        states, history = train_all(
            algorithm,
            stacked,
            normalizer,
            args.seeds,
            args.updates,
            min(args.chunk, args.updates),
            args.batch_size,
        )
        train_s = time.perf_counter() - started
        policies = jax.tree.map(lambda leaf: leaf[0], states.policy)
        entry: dict[str, Any] = {"reward_scaling": scaling.to_dict()}
        for shielded in (True, False):
            rows = evaluate_policies(env_id, cost, algorithm, policies, args, shielded)
            entry["shield_on" if shielded else "shield_off"] = summarize(
                rows, facts["random_return"], facts["expert_return"]
            )
        entry["final_multiplier"] = final_metrics(history, "multiplier_")
        task["algorithms"][name] = entry
        task["timing"][name] = {"train_s": train_s}
        off = entry["shield_off"]
        progress(
            f"  {LABELS[name]}: normalized cost {off['normalized_cost']['mean']:.2f}, "
            f"return {off['normalized_return']['mean']:.1f}; with the shield "
            f"{entry['shield_on']['hard_violation_steps']} hard violations"
        )
    task["checks"] = checks(task, expect_unconstrained_over=env_id in IB_IDS)
    return task


def _scaling_text(scaling: dict[str, Any]) -> str:
    """``std (x 0.0123)``: a fitted reward scaling's kind and factor."""
    return f"{scaling['kind']} (x {scaling['scale']:.3g})"


def run_study(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    results: dict[str, Any] = {"tasks": {}}
    for env_id in args.tasks:
        results["tasks"][env_id] = study_task(env_id, args)
    results["summary"] = suite_summary(list(args.algorithms), results)
    config = {
        "tasks": list(args.tasks),
        "qualities": list(QUALITIES),
        "trajectories_per_quality": args.trajectories,
        "fatigue_limit": args.fatigue_limit,
        "cost_limit": args.cost_limit,
        "algorithms": list(args.algorithms),
        "n_seeds": args.seeds,
        "n_updates": args.updates,
        "batch_size": args.batch_size,
        "hidden": list(args.hidden),
        "n_episodes": args.episodes,
        "ib_horizon": args.horizon,
        "hard_constraints": "env.default_constraints()",
    }
    return config, results


def checks(task: dict[str, Any], expect_unconstrained_over: bool = True) -> dict[str, Any]:
    """A task's results to show, each a check that can fail: the Lagrangian agents within
    the limit, no hard violation with the shield on and (where the study is built so, on
    the IB) unconstrained TD3+BC over the limit."""
    algorithms = task["algorithms"]
    out: dict[str, Any] = {}
    if expect_unconstrained_over and "td3bc" in algorithms:
        cost = algorithms["td3bc"]["shield_off"]["normalized_cost"]["mean"]
        out["td3bc_exceeds"] = {
            "what": "unconstrained TD3+BC's normalized cost exceeds 1",
            "passed": bool(cost > 1.0),
            "detail": f"{cost:.2f}",
        }
    for name in LAGRANGIAN:
        if name in algorithms:
            cost = algorithms[name]["shield_off"]["normalized_cost"]["mean"]
            out[f"{name}_within"] = {
                "what": f"{LABELS[name]}'s normalized cost is at most 1",
                "passed": bool(cost <= 1.0),
                "detail": f"{cost:.2f}",
            }
    hard = sum(entry["shield_on"]["hard_violation_steps"] for entry in algorithms.values())
    out["shield_no_hard_violations"] = {
        "what": "with the shield on, no applied action breaks a hard constraint",
        "passed": hard == 0,
        "detail": f"{hard} violating steps over every agent and episode",
    }
    return out


def suite_summary(algorithms: list[str], results: dict[str, Any]) -> dict[str, Any]:
    """Per agent over the tasks: on how many its mean normalized cost (shield off) is
    within the limit, its mean normalized return, and hard violations with the shield."""
    out: dict[str, Any] = {}
    for name in algorithms:
        entries = [
            t["algorithms"][name] for t in results["tasks"].values() if name in t["algorithms"]
        ]
        out[name] = {
            "tasks": len(entries),
            "within_limit": sum(e["shield_off"]["normalized_cost"]["mean"] <= 1.0 for e in entries),
            "mean_normalized_return": float(
                np.mean([e["shield_off"]["normalized_return"]["mean"] for e in entries])
            )
            if entries
            else None,
            "hard_violations_shield_on": int(
                sum(e["shield_on"]["hard_violation_steps"] for e in entries)
            ),
        }
    return out


def _cell(summary: dict[str, Any], digits: int = 2) -> str:
    if summary.get("ci") is None:
        return f"{summary['mean']:.{digits}f}"
    return f"{summary['mean']:.{digits}f} ± {summary['ci']:.{digits}f}"


def task_markdown(
    env_id: str, config: dict[str, Any], task: dict[str, Any], heading: str = "##"
) -> list[str]:
    data = task["data"]
    lines = [
        f"{heading} {env_id}",
        "",
        f"**Data**: {data['episodes']} episodes ({data['transitions']:,} transitions, "
        f"{task['horizon']} steps each), {config['trajectories_per_quality']} per behaviour "
        f"policy ({', '.join(config['qualities'])}). **Cost**: {task['cost']['description']}. "
        f"{data['within_limit']} of {data['episodes']} behaviour episodes are within the "
        "limits:",
        "",
        "| behaviour | episodes | mean normalized episode cost | within the limits |",
        "|---|---|---|---|",
    ]
    for quality, facts in data["per_quality"].items():
        lines.append(
            f"| {quality} | {facts['episodes']} | {facts['normalized_cost_mean']:.2f} | "
            f"{facts['within_limit']} |"
        )
    lines += [
        "",
        "| agent | return (off) | cost (off) | violation rate (off) | hard violations (off) "
        "| return (on) | cost (on) | override rate (on) | hard violations (on) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in config["algorithms"]:
        entry = task["algorithms"].get(name)
        if entry is None:
            lines.append(f"| {LABELS[name]} | not trained (no episode within the limits) |")
            continue
        off, on = entry["shield_off"], entry["shield_on"]
        lines.append(
            f"| {LABELS[name]} | {_cell(off['normalized_return'], 1)} | "
            f"{_cell(off['normalized_cost'])} | {_cell(off['violation_rate'])} | "
            f"{off['hard_violation_steps']} | {_cell(on['normalized_return'], 1)} | "
            f"{_cell(on['normalized_cost'])} | {_cell(on['override_rate'])} | "
            f"{on['hard_violation_steps']} |"
        )
    lines += ["", "Checks:", ""]
    for check in task["checks"].values():
        status = "met" if check["passed"] else "**not met**"
        lines.append(f"- {check['what']}: {status} ({check['detail']})")
    lines += [
        "",
        "Training time: "
        + ", ".join(
            f"{LABELS[name]} {task['timing'][name]['train_s']:.0f} s"
            for name in config["algorithms"]
            if name in task["timing"]
        )
        + ".",
        "",
    ]
    scalings = [
        f"{LABELS[name]} {_scaling_text(entry['reward_scaling'])}"
        for name, entry in task["algorithms"].items()
        if "reward_scaling" in entry
    ]
    if scalings:
        lines += ["Rewards scaled for training (each algorithm's own): " + ", ".join(scalings)]
        lines += [""]
    return lines


def markdown(config: dict[str, Any], results: dict[str, Any]) -> str:
    tasks = list(results["tasks"])
    lines = [
        "# Safety study: safe offline agents and the shield on the task suite",
        "",
        "Generated by `python -m benchmarks.safety_study` "
        f"({config['n_updates']:,} updates of batch {config['batch_size']}, networks "
        f"{tuple(config['hidden'])}, {config['n_seeds']} seeds per agent in one vmapped "
        f"program, {config['n_episodes']} evaluation episodes per seed; tasks: "
        + ", ".join(f"`{t}`" for t in tasks)
        + "). Do not edit by hand; rerun the script.",
        "",
        "DSRL metrics, mean over seeds ± the half-width of a 95 % confidence interval: "
        "normalized return `100 (R - random) / (expert - random)`, normalized cost "
        "`episode cost / cost limit`, the largest over the cost channels (**≤ 1 is safe**), "
        "violation rate (episodes over a limit). *Shield off*: the policy's own actions, "
        "the task's default hard constraints only checked; *shield on*: every action "
        "through the shield.",
        "",
    ]
    if len(tasks) > 1:
        lines += [
            "## Suite summary",
            "",
            "| agent | within the cost limit (shield off) | mean normalized return (shield "
            "off) | hard violations (shield on) |",
            "|---|---|---|---|",
        ]
        for name, row in results["summary"].items():
            mean = row["mean_normalized_return"]
            lines.append(
                f"| {LABELS[name]} | {row['within_limit']} of {row['tasks']} tasks | "
                f"{'—' if mean is None else f'{mean:.1f}'} | "
                f"{row['hard_violations_shield_on']} |"
            )
        lines.append("")
    for env_id in tasks:
        lines += task_markdown(env_id, config, results["tasks"][env_id])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["IB-v0"], help="environment ids")
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    parser.add_argument("--trajectories", type=int, default=20, help="episodes per quality")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--fatigue-limit", type=float, default=30.0, help="IB only")
    parser.add_argument("--cost-limit", type=float, default=100.0, help="IB only")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--updates", type=int, default=10_000)
    parser.add_argument("--chunk", type=int, default=2_500)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--episodes", type=int, default=20, help="evaluation episodes per seed")
    parser.add_argument("--horizon", type=int, default=1000, help="IB episode length")
    parser.add_argument("--doc", default="docs/safety.md")
    parser.add_argument("--results-dir", default=str(DEFAULT_RESULTS_DIR))
    parser.add_argument("-d", "--description", default="Safety study on the task suite (DSRL)")
    parser.add_argument("-t", "--tag", default="untagged")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    from neorl_industrial.core.environments import registered_envs

    unknown = [t for t in args.tasks if t not in registered_envs()]
    if unknown:
        parser.error(
            f"--tasks: unknown environment {unknown[0]!r}; registered: {sorted(registered_envs())}"
        )
    require_positive(
        parser,
        args,
        ("trajectories", "seeds", "updates", "chunk", "batch_size", "episodes", "horizon"),
    )
    started = utc_timestamp()
    config, results = run_study(args)
    page = markdown(config, results)
    doc = Path(args.doc)
    args.doc = doc if doc.is_absolute() else Path(REPO_ROOT) / doc
    publish_study(NAME, args, started, config, results, page)
    passed = all(
        check["passed"] for task in results["tasks"].values() for check in task["checks"].values()
    )
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
