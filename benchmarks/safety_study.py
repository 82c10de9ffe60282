"""Safe offline RL on the Industrial Benchmark: Lagrangian agents against TD3+BC, with and
without the shield.

The study (DSRL conventions):

* **Data**: IB-v0 episodes of the ``medium``, ``high`` and ``expert`` behaviour policies,
  mixed. The cost is a stricter fatigue limit than the environment's default: one per
  step whose next observed fatigue is above ``--fatigue-limit`` (30), relabelled from the
  observations with a constraint spec, with an episode cost limit ``--cost-limit`` (100).
  Part of the behaviour data exceeds the limit, part stays within it.
* **Agents** (``--seeds`` each, all seeds in one vmapped program): TD3+BC (ignores cost),
  TD3BC-Lag and IQL-Lag (PID multiplier on the cost critic), BC-Safe (behaviour cloning
  on the episodes within the limit), BC on everything for reference, and an ablation of
  TD3BC-Lag without its cost floor and with OSRL's PID gains.
* **Evaluation**: whole episodes in the JAX environment whose cost channel uses the same
  fatigue limit, every policy once with the IB's default hard constraints shielded
  (``env.default_constraints()``) and once with them only checked.
* **Metrics**: normalized return (D4RL-style from the dataset card), normalized cost
  (mean episode cost / cost limit; <= 1 is safe), violation rate (episodes over the
  limit), shield override rate, and hard-constraint violations of the applied actions.

Usage::

    python -m benchmarks.safety_study                      # the study, docs/safety.md
    python -m benchmarks.safety_study --updates 500 --seeds 2 --trajectories 4 --no-save
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import (
    DEFAULT_RESULTS_DIR,
    REPO_ROOT,
    BenchmarkResult,
    progress,
    system_info,
    utc_timestamp,
)
from benchmarks.learning import (
    mean_confidence_interval,
    observation_normalizer,
    standardize_rewards,
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
LAGRANGIAN = ("td3bc_lag", "iql_lag")
QUALITIES = ("medium", "high", "expert")


def make_agent(name: str, obs_size: int, action_size: int, args: argparse.Namespace) -> Any:
    """The study's agent ``name`` with CORL/OSRL defaults but the network widths."""
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

    hidden = tuple(args.hidden)
    safety = {"cost_limits": (args.cost_limit,), "episode_length": args.horizon}
    if name == "td3bc":
        return make_td3bc(TD3BCConfig(hidden=hidden), obs_size, action_size)
    if name == "td3bc_lag":
        return make_td3bc_lag(TD3BCLagConfig(hidden=hidden, **safety), obs_size, action_size)
    if name == "td3bc_lag_plain":
        # The ablation: no cost floor and OSRL's PID gains.
        pid = PIDConfig(kp=0.1, ki=0.003, kd=0.001)
        config = TD3BCLagConfig(hidden=hidden, cost_floor=0.0, pid=pid, **safety)
        return make_td3bc_lag(config, obs_size, action_size)
    if name == "iql_lag":
        return make_iql_lag(IQLLagConfig(hidden=hidden, **safety), obs_size, action_size)
    if name in ("bc", "bc_safe"):
        return make_bc(BCConfig(hidden=hidden), obs_size, action_size)
    raise ValueError(f"algorithm: unknown {name!r}; expected one of {ALGORITHMS}")


def episodes_of(dataset: Any) -> list[dict[str, Any]]:
    """The dataset's episodes as per-episode arrays (to mix datasets)."""
    import jax

    host = jax.device_get(dataset)
    episodes = []
    for start, length in zip(host.episode_starts, host.episode_lengths, strict=True):
        start, length = int(start), int(length)
        first = int(host.observation_index[start])
        episodes.append(
            {
                "observations": host.observations[first : first + length + 1],
                "actions": host.actions[start : start + length],
                "rewards": host.rewards[start : start + length],
                "costs": host.costs[start : start + length],
                "terminated": bool(host.terminals[start + length - 1]),
            }
        )
    return episodes


def cost_spec(args: argparse.Namespace) -> Any:
    from neorl_industrial.core.safety import ConstraintSpec

    return ConstraintSpec.from_dict(
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


def build_data(args: argparse.Namespace) -> tuple[Any, Any, dict[str, Any]]:
    """The mixed, relabelled dataset, a dataset card (for score references) and facts."""
    from neorl_industrial.core.environments import make
    from neorl_industrial.functional.state_management import (
        Dataset,
        episodes_within_limits,
        relabel_costs,
    )
    from neorl_industrial.integration.datasets import generate_dataset

    env, _ = make(args.env)
    constraints = env.compile_constraints(cost_spec(args))
    episodes, sources, card = [], [], None
    for quality in QUALITIES:
        progress(f"dataset {args.env}-{quality}: {args.trajectories} trajectories")
        dataset, card = generate_dataset(args.env, quality, args.trajectories, seed=args.data_seed)
        part = episodes_of(relabel_costs(dataset, constraints))
        episodes += part
        sources += [quality] * len(part)
    mixed = Dataset.from_episodes(episodes, name="ib-safety-mix")
    episode_costs = np.asarray(mixed.episode_costs())[:, 0]
    within = episodes_within_limits(mixed, [args.cost_limit])
    facts = {
        "episodes": int(mixed.n_episodes),
        "transitions": int(mixed.n_transitions),
        "within_limit": int(within.sum()),
        "per_quality": {
            quality: {
                "episode_cost_mean": float(episode_costs[np.asarray(sources) == quality].mean()),
                "within_limit": int(within[np.asarray(sources) == quality].sum()),
                "episodes": int((np.asarray(sources) == quality).sum()),
            }
            for quality in QUALITIES
        },
        "random_return": float(card.random_return),
        "expert_return": float(card.expert_return),
    }
    return mixed, card, facts


def evaluate_policies(
    algorithm: Any, policies: Any, args: argparse.Namespace, shield_actions: bool
) -> list[dict[str, Any]]:
    """DSRL metrics of every seed's policy (leading axis of ``policies``)."""
    import jax

    from neorl_industrial.core.environments import make
    from neorl_industrial.functional.transformations.evaluation import (
        evaluate,
        per_policy_metrics,
    )

    env, params = make(args.env)
    params = params.replace(fatigue_limit=np.float32(args.fatigue_limit))
    constraints = env.compile_constraints()

    def policy(policy_params: Any, observation: Any, key: Any) -> Any:
        return algorithm.act(policy_params, observation, key, deterministic=True)

    def one(policy_params: Any, key: Any) -> Any:
        return evaluate(
            key,
            env,
            params,
            policy,
            args.episodes,
            horizon=args.horizon,
            policy_params=policy_params,
            constraints=constraints,
            shield_actions=shield_actions,
        )

    n = jax.tree.leaves(policies)[0].shape[0]
    keys = jax.random.split(jax.random.PRNGKey(11), n)
    stats = jax.device_get(jax.jit(jax.vmap(one))(policies, keys))
    # Only the fatigue channel is the study's cost (the consumption channel is ignored).
    stats = stats.replace(costs=np.asarray(stats.costs)[..., :1])
    return per_policy_metrics(stats, [args.cost_limit], cost_names=["fatigue"])


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


def run_study(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    import jax
    import jax.numpy as jnp

    from neorl_industrial.functional.state_management import select_safe_episodes

    mixed, _card, facts = build_data(args)
    results: dict[str, Any] = {"data": facts, "algorithms": {}, "timing": {}}
    for name in args.algorithms:
        data = select_safe_episodes(mixed, [args.cost_limit]) if name == "bc_safe" else mixed
        scaled, _ = standardize_rewards(data)
        normalizer = jax.tree.map(lambda leaf: leaf[None], observation_normalizer(scaled))
        stacked = jax.tree.map(lambda leaf: jnp.asarray(leaf)[None], scaled)
        algorithm = make_agent(name, scaled.observation_size, scaled.action_size, args)
        progress(f"{LABELS[name]}: {args.seeds} seeds on {data.n_episodes} episodes")
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
        entry = {}
        for shielded in (True, False):
            rows = evaluate_policies(algorithm, policies, args, shielded)
            entry["shield_on" if shielded else "shield_off"] = summarize(
                rows, facts["random_return"], facts["expert_return"]
            )
        last = history[-1]["metrics"]
        entry["final_multiplier"] = (
            np.asarray(last["multiplier_0"]).reshape(-1).tolist()
            if "multiplier_0" in last
            else None
        )
        results["algorithms"][name] = entry
        results["timing"][name] = {"train_s": train_s}
        off = entry["shield_off"]
        progress(
            f"  {LABELS[name]}: normalized cost {off['normalized_cost']['mean']:.2f}, "
            f"return {off['normalized_return']['mean']:.1f}; with the shield "
            f"{entry['shield_on']['hard_violation_steps']} hard violations"
        )
    results["checks"] = checks(results)
    config = {
        "env_id": args.env,
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
        "horizon": args.horizon,
        "hard_constraints": "IndustrialBenchmark.default_constraints()",
    }
    return config, results


def checks(results: dict[str, Any]) -> dict[str, Any]:
    """The issue's result to show, each a check that can fail."""
    algorithms = results["algorithms"]
    out: dict[str, Any] = {}
    if "td3bc" in algorithms:
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


def markdown(config: dict[str, Any], results: dict[str, Any]) -> str:
    def cell(summary: dict[str, Any], scale: float = 1.0, digits: int = 2) -> str:
        mean = summary["mean"] * scale
        if summary.get("ci") is None:
            return f"{mean:.{digits}f}"
        return f"{mean:.{digits}f} ± {summary['ci'] * scale:.{digits}f}"

    data = results["data"]
    lines = [
        "# Safety study: safe offline agents and the shield on the Industrial Benchmark",
        "",
        "Generated by `python -m benchmarks.safety_study` "
        f"({config['n_updates']:,} updates of batch {config['batch_size']}, networks "
        f"{tuple(config['hidden'])}, {config['n_seeds']} seeds per agent in one vmapped "
        f"program, {config['n_episodes']} evaluation episodes of {config['horizon']} steps "
        "per seed). Do not edit by hand; rerun the script.",
        "",
        f"**Data**: {data['episodes']} episodes ({data['transitions']:,} transitions) of "
        f"`{config['env_id']}`, {config['trajectories_per_quality']} per behaviour policy "
        f"({', '.join(config['qualities'])}). **Cost**: 1 per step whose fatigue is above "
        f"{config['fatigue_limit']:g} (stricter than the environment's default), relabelled "
        f"from the observations; **episode cost limit** {config['cost_limit']:g}. "
        f"{data['within_limit']} of {data['episodes']} behaviour episodes are within it:",
        "",
        "| behaviour | episodes | mean episode cost | within the limit |",
        "|---|---|---|---|",
    ]
    for quality, facts in data["per_quality"].items():
        lines.append(
            f"| {quality} | {facts['episodes']} | {facts['episode_cost_mean']:.1f} | "
            f"{facts['within_limit']} |"
        )
    lines += [
        "",
        "DSRL metrics, mean over seeds ± the half-width of a 95 % confidence interval: "
        "normalized return `100 (R - random) / (expert - random)`, normalized cost "
        "`episode cost / cost limit` (**≤ 1 is safe**), violation rate (episodes over the "
        "limit). *Shield off*: the policy's own actions, the IB's default hard constraints "
        "only checked; *shield on*: every action through the shield.",
        "",
        "| agent | return (off) | cost (off) | violation rate (off) | hard violations (off) "
        "| return (on) | cost (on) | override rate (on) | hard violations (on) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in config["algorithms"]:
        entry = results["algorithms"][name]
        off, on = entry["shield_off"], entry["shield_on"]
        lines.append(
            f"| {LABELS[name]} | {cell(off['normalized_return'], digits=1)} | "
            f"{cell(off['normalized_cost'])} | {cell(off['violation_rate'])} | "
            f"{off['hard_violation_steps']} | {cell(on['normalized_return'], digits=1)} | "
            f"{cell(on['normalized_cost'])} | {cell(on['override_rate'])} | "
            f"{on['hard_violation_steps']} |"
        )
    lines += ["", "Checks:", ""]
    for check in results["checks"].values():
        status = "met" if check["passed"] else "**not met**"
        lines.append(f"- {check['what']}: {status} ({check['detail']})")
    lines += [
        "",
        "Training time: "
        + ", ".join(
            f"{LABELS[name]} {results['timing'][name]['train_s']:.0f} s"
            for name in config["algorithms"]
        )
        + ".",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="IB-v0")
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    parser.add_argument("--trajectories", type=int, default=20, help="episodes per quality")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--fatigue-limit", type=float, default=30.0)
    parser.add_argument("--cost-limit", type=float, default=100.0)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--updates", type=int, default=10_000)
    parser.add_argument("--chunk", type=int, default=2_500)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--episodes", type=int, default=20, help="evaluation episodes per seed")
    parser.add_argument("--horizon", type=int, default=1000)
    parser.add_argument("--doc", default="docs/safety.md")
    parser.add_argument("--results-dir", default=str(DEFAULT_RESULTS_DIR))
    parser.add_argument("-d", "--description", default="Safety study on IB (DSRL metrics)")
    parser.add_argument("-t", "--tag", default="untagged")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    started = utc_timestamp()
    config, results = run_study(args)
    page = markdown(config, results)
    print(page)
    if not args.no_save:
        path = BenchmarkResult(
            name=NAME,
            description=args.description,
            tag=args.tag,
            timestamp=started,
            system=system_info(),
            config=config,
            results=results,
        ).save(args.results_dir)
        doc = Path(args.doc)
        doc = doc if doc.is_absolute() else Path(REPO_ROOT) / doc
        doc.write_text(page)
        progress(f"Wrote {path} and {doc}")
    return 0 if all(check["passed"] for check in results["checks"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
