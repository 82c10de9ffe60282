"""Off-policy evaluation study: Fitted Q Evaluation against the simulator on the
Industrial Benchmark.

A plant without a simulator can judge a candidate policy only from its logs. This study
measures how well FQE (``functional.transformations.ope.fitted_q_evaluation``) does that
where the truth is known: one dataset mixes ``--trajectories`` whole episodes of each of
the shipped behaviour policies (``low``, ``medium``, ``high``, ``expert``; 80 % mean
action, 20 % sampled), and a set of deterministic policies is evaluated twice:

* **truth**: the discounted return and discounted cost of every cost channel in the JAX
  environment, ``--episodes`` episodes from the environment's reset distribution, over the
  dataset's episode length, discount ``γ`` applied;
* **FQE**: the same quantities estimated from the dataset alone at its episodes' first
  observations, ``--seeds`` FQE runs per policy trained in one vmapped program.

The evaluated policies are the behaviour policies' mean actions, a blend of the low and
expert actions, the medium policy with its steps halved, and holding every setting
(action 0), so that returns and costs spread. Reported: Spearman's rank correlation of
estimated and true values, the mean absolute relative error of the returns (and the
error relative to the spread of the true returns), regret@1 (how much worse the policy FQE
ranks first is than the best), and for costs the mean absolute error, the error relative to
the discounted cost threshold that the environment's episode cost limit implies, and how
often FQE puts a policy on the right side of that threshold.

Usage (from the repository root)::

    python -m benchmarks.ope                  # the study, writes docs/ope.md
    python -m benchmarks.ope --quick --no-save  # a smoke run of a few minutes
    python -m benchmarks.ope --page-from benchmarks/results/ope-<tag>-<time>.json

The run is saved like every benchmark (``benchmarks/results/ope-<tag>-<time>.json``) and
the page is written to ``--doc``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import (
    DEFAULT_RESULTS_DIR,
    BenchmarkResult,
    Table,
    evaluate_targets,
    progress,
    publish_study,
    require_positive,
    utc_timestamp,
)
from neorl_industrial.functional.transformations.evaluation import discounted_values

NAME = "ope"
DESCRIPTION = "FQE estimates of return and cost against the simulator's (IB-v0, 7 policies)"
QUALITIES = ("low", "medium", "high", "expert")
#: name -> what the evaluated policy does.
POLICIES = {
    "low": "low behaviour policy, mean action",
    "medium": "medium behaviour policy, mean action",
    "high": "high behaviour policy, mean action",
    "expert": "expert behaviour policy, mean action",
    "blend": "mean of the low and expert actions",
    "medium-half": "medium's action halved",
    "hold": "action 0: hold every setting",
}
#: Action distance below which a policy counts as acting like a behaviour policy.
NEAR = 0.1
#: Goals of the study: (comparison, threshold, what).
TARGETS = {
    "return_spearman": (">=", 0.8, "rank correlation of estimated and true returns"),
    "return_mare": ("<=", 0.05, "mean absolute relative error of the returns"),
    "cost_agreement": (
        ">=",
        0.8,
        "policies put on the right side of the cost threshold (all channels)",
    ),
}


def concatenate(datasets: Sequence[Any]) -> Any:
    """One dataset holding every episode of ``datasets``, in order."""
    import jax

    from neorl_industrial.functional.state_management import Dataset

    parts = [jax.device_get(dataset) for dataset in datasets]
    fields = ("observations", "actions", "rewards", "costs", "terminals", "timeouts")
    arrays = {field: np.concatenate([getattr(part, field) for part in parts]) for field in fields}
    lengths = np.concatenate([part.episode_lengths for part in parts])
    return Dataset.from_arrays(**arrays, episode_lengths=lengths)


def make_policies(env_id: str) -> dict[str, Callable[[Any], Any]]:
    """The evaluated policies by name (see :data:`POLICIES`): deterministic functions of a
    batch of raw observations."""
    import jax.numpy as jnp

    from neorl_industrial.core.agents import make_sac
    from neorl_industrial.core.environments import make
    from neorl_industrial.integration.datasets import BehaviourPolicies

    env, _ = make(env_id)
    behaviour = BehaviourPolicies.load(env_id)
    sac = make_sac(behaviour.sac_config, env.observation_size, env.action_size)

    def mean_action(quality: str) -> Callable[[Any], Any]:
        params = behaviour.policies[quality]
        return lambda observations: sac.act(params, observations, deterministic=True)

    low, medium, expert = mean_action("low"), mean_action("medium"), mean_action("expert")
    policies = {quality: mean_action(quality) for quality in QUALITIES}
    policies["blend"] = lambda observations: 0.5 * (low(observations) + expert(observations))
    policies["medium-half"] = lambda observations: 0.5 * medium(observations)
    policies["hold"] = lambda observations: jnp.zeros(
        (observations.shape[0], env.action_size), observations.dtype
    )
    return policies


def action_distance(
    policy: Callable[[Any], Any], references: Sequence[Callable[[Any], Any]], observations: Any
) -> float:
    """Mean over ``observations`` of the distance from ``policy``'s action to the nearest
    of the ``references``' actions: 0 for a policy that acts like one of them, large for
    one whose actions the data hardly holds."""
    import jax
    import jax.numpy as jnp

    def distance(observations: Any) -> Any:
        actions = policy(observations)
        nearest = jnp.stack([reference(observations) for reference in references])
        return jnp.linalg.norm(actions[None] - nearest, axis=-1).min(axis=0).mean()

    return float(jax.jit(distance)(observations))


def _spearman(estimated: Sequence[float], true: Sequence[float]) -> float | None:
    from scipy import stats

    if np.ptp(np.asarray(true)) == 0 or np.ptp(np.asarray(estimated)) == 0:
        return None  # a constant has no ranking
    return float(stats.spearmanr(estimated, true).statistic)


def summarize(
    true_returns: Sequence[float],
    estimated_returns: Sequence[float],
    true_costs: Any,
    estimated_costs: Any,
    cost_names: Sequence[str],
    cost_thresholds: Sequence[float],
) -> dict[str, Any]:
    """Agreement of estimated and true values over the evaluated policies.

    Args:
        true_returns, estimated_returns: ``[n_policies]``.
        true_costs, estimated_costs: ``[n_policies, n_costs]``.
        cost_names: one name per cost channel.
        cost_thresholds: per channel, the discounted cost above which a policy counts as
            unsafe.
    """
    true_returns = np.asarray(true_returns, np.float64)
    estimated_returns = np.asarray(estimated_returns, np.float64)
    true_costs = np.asarray(true_costs, np.float64).reshape(len(true_returns), -1)
    estimated_costs = np.asarray(estimated_costs, np.float64).reshape(true_costs.shape)
    relative = np.abs(estimated_returns - true_returns) / np.abs(true_returns)
    spread = float(np.ptp(true_returns))
    best = int(np.argmax(true_returns))
    chosen = int(np.argmax(estimated_returns))
    summary: dict[str, Any] = {
        "return": {
            "spearman": _spearman(estimated_returns, true_returns),
            "mare": float(relative.mean()),
            "max_relative_error": float(relative.max()),
            "mae": float(np.abs(estimated_returns - true_returns).mean()),
            "mae_over_spread": (
                float(np.abs(estimated_returns - true_returns).mean() / spread) if spread else None
            ),
            "regret_at_1": float(true_returns[best] - true_returns[chosen]),
            "regret_at_1_over_spread": (
                float((true_returns[best] - true_returns[chosen]) / spread) if spread else None
            ),
        },
        "costs": {},
    }
    thresholds = np.asarray(cost_thresholds, np.float64).reshape(-1)
    agree = (estimated_costs > thresholds) == (true_costs > thresholds)
    for index, name in enumerate(cost_names):
        errors = np.abs(estimated_costs[:, index] - true_costs[:, index])
        summary["costs"][name] = {
            "spearman": _spearman(estimated_costs[:, index], true_costs[:, index]),
            "mae": float(errors.mean()),
            "max_error": float(errors.max()),
            "threshold": float(thresholds[index]),
            "mae_over_threshold": float(errors.mean() / thresholds[index]),
            "agreement": float(agree[:, index].mean()),
        }
    summary["cost_agreement"] = float(np.all(agree, axis=1).mean())
    return summary


def run_study(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """Generates the dataset, computes every policy's true values and FQE's estimates."""
    import jax

    from neorl_industrial.core.agents import per_step_cost_threshold
    from neorl_industrial.core.agents.fqe import FQEConfig
    from neorl_industrial.core.environments import make
    from neorl_industrial.functional.transformations.offline import Schedule
    from neorl_industrial.functional.transformations.ope import fitted_q_evaluation
    from neorl_industrial.integration.datasets import generate_dataset

    env, env_params = make(args.env)
    horizon = int(env_params.horizon)
    parts = []
    for index, quality in enumerate(QUALITIES):
        progress(f"dataset {args.env}-{quality}: {args.trajectories} trajectories")
        dataset, _ = generate_dataset(
            args.env, quality, args.trajectories, seed=args.data_seed + index
        )
        parts.append(dataset)
    dataset = concatenate(parts)
    rewards = np.asarray(dataset.rewards, np.float64)
    costs = np.asarray(dataset.costs, np.float64)
    config = FQEConfig(hidden=tuple(args.hidden), learning_rate=args.learning_rate)
    discount = config.discount
    cost_names = list(env.cost_names)
    # The episode cost limits of the environment's constraints, as discounted thresholds.
    episode_limits = env.default_constraints().cost_limits
    thresholds = [
        per_step_cost_threshold(episode_limits[name], discount, horizon) for name in cost_names
    ]

    policies = make_policies(args.env)
    behaviour = [policies[quality] for quality in QUALITIES]
    # every 10th logged observation is plenty for a mean distance
    logged_observations = dataset.transition_observations()[::10]
    results: dict[str, Any] = {
        "dataset": {
            "n_transitions": dataset.n_transitions,
            "n_episodes": dataset.n_episodes,
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()),
            "cost_mean": dict(zip(cost_names, costs.mean(axis=0).tolist(), strict=True)),
        },
        "policies": {},
    }
    for index, (name, policy) in enumerate(policies.items()):
        progress(f"{name}: true values over {args.episodes} episodes")
        started = time.perf_counter()
        returns, episode_costs = jax.jit(
            lambda key, policy=policy: discounted_values(
                key, env, env_params, policy, args.episodes, horizon, discount
            )
        )(jax.random.PRNGKey(1000 + index))
        returns = np.asarray(returns, np.float64)
        episode_costs = np.asarray(episode_costs, np.float64)
        truth_s = time.perf_counter() - started
        progress(f"{name}: FQE, {args.seeds} seeds x {args.updates} updates")
        started = time.perf_counter()
        estimate = fitted_q_evaluation(
            dataset,
            policy,
            schedule=Schedule(
                n_updates=args.updates,
                chunk_updates=min(args.chunk, args.updates),
                batch_size=args.batch_size,
            ),
            seeds=tuple(range(args.seeds)),
            config=config,
        )
        fqe_s = time.perf_counter() - started
        sqrt_n = np.sqrt(len(returns))
        results["policies"][name] = {
            "description": POLICIES[name],
            "true_return": float(returns.mean()),
            "true_return_se": float(returns.std(ddof=1) / sqrt_n) if len(returns) > 1 else None,
            "true_costs": episode_costs.mean(axis=0).tolist(),
            "true_costs_se": (episode_costs.std(axis=0, ddof=1) / sqrt_n).tolist()
            if len(returns) > 1
            else None,
            "fqe_return": estimate.return_mean,
            "fqe_returns": estimate.returns.tolist(),
            "fqe_costs": estimate.cost_mean.tolist(),
            "fqe_costs_per_seed": estimate.costs.tolist(),
            "final_loss": np.asarray(estimate.history[-1]["metrics"]["loss"]).tolist(),
            "action_distance": action_distance(policy, behaviour, logged_observations),
            "truth_s": truth_s,
            "fqe_s": fqe_s,
        }
        entry = results["policies"][name]
        progress(
            f"{name}: return true {entry['true_return']:.0f}, FQE {entry['fqe_return']:.0f}; "
            f"costs true {np.round(entry['true_costs'], 2).tolist()}, "
            f"FQE {np.round(entry['fqe_costs'], 2).tolist()} ({fqe_s:.0f} s)"
        )
    entries = list(results["policies"].values())
    results["summary"] = summarize(
        [e["true_return"] for e in entries],
        [e["fqe_return"] for e in entries],
        [e["true_costs"] for e in entries],
        [e["fqe_costs"] for e in entries],
        cost_names,
        thresholds,
    )
    summary = results["summary"]
    summary["return"]["error_distance_spearman"] = _spearman(
        [abs(e["fqe_return"] - e["true_return"]) for e in entries],
        [e["action_distance"] for e in entries],
    )
    results["checks"] = evaluate_targets(
        {
            "return_spearman": summary["return"]["spearman"],
            "return_mare": summary["return"]["mare"],
            "cost_agreement": summary["cost_agreement"],
        },
        TARGETS,
    )
    study_config = {
        "env_id": args.env,
        "qualities": list(QUALITIES),
        "trajectories_per_quality": args.trajectories,
        "data_seed": args.data_seed,
        "policies": POLICIES,
        "cost_names": cost_names,
        "episode_cost_limits": [episode_limits[name] for name in cost_names],
        "discount": discount,
        "horizon": horizon,
        "n_true_episodes": args.episodes,
        "n_seeds": args.seeds,
        "n_updates": args.updates,
        "chunk_updates": min(args.chunk, args.updates),
        "batch_size": args.batch_size,
        "hidden": list(args.hidden),
        "learning_rate": config.learning_rate,
        "target_update_period": config.target_update_period,
        "n_critics": config.n_critics,
        "max_grad_norm": config.max_grad_norm,
        "device": str(jax.devices()[0].device_kind),
        "jax_backend": jax.default_backend(),
    }
    return study_config, results


def _number(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def markdown(config: dict[str, Any], results: dict[str, Any]) -> str:
    """The study as a markdown page."""
    summary = results["summary"]
    names = config["cost_names"]
    data = results["dataset"]
    lines = [
        "# Off-policy evaluation: FQE against the simulator",
        "",
        "Generated by `python -m benchmarks.ope` "
        f"({config['n_updates']:,} FQE updates of batch {config['batch_size']}, networks "
        f"{tuple(config['hidden'])}, {config['n_seeds']} FQE seeds per policy trained in one "
        f"vmapped program; device: {config['device']}). Do not edit by hand; rerun the "
        "script.",
        "",
        f"Data: {config['trajectories_per_quality']} episodes of {config['horizon']} steps from "
        f"each behaviour policy of `{config['env_id']}` ({', '.join(config['qualities'])}; "
        f"data seed {config['data_seed']}), {data['n_transitions']:,} transitions. "
        f"Truth: {config['n_true_episodes']} episodes of each policy in the JAX environment "
        "from its reset distribution. Every value is discounted with "
        f"γ = {config['discount']} over the {config['horizon']}-step episode; FQE estimates "
        "it at the dataset's first observations.",
        "",
        "| policy | what it does | distance | true return | FQE return | error | "
        + " | ".join(f"true {name} | FQE {name}" for name in names)
        + " |",
        "|---|---|---|---|---|---|" + "---|---|" * len(names),
    ]
    for name, entry in results["policies"].items():
        error = (entry["fqe_return"] - entry["true_return"]) / abs(entry["true_return"])
        se = entry.get("true_return_se")
        row = [
            name,
            entry["description"],
            f"{entry['action_distance']:.2f}",
            f"{entry['true_return']:.0f}" + ("" if se is None else f" ± {se:.0f}"),
            f"{entry['fqe_return']:.0f}",
            f"{100 * error:+.1f} %",
        ]
        for index in range(len(names)):
            row += [f"{entry['true_costs'][index]:.2f}", f"{entry['fqe_costs'][index]:.2f}"]
        lines.append("| " + " | ".join(row) + " |")
    ret = summary["return"]
    lines += [
        "",
        "*Distance*: the mean distance from the policy's action to the nearest behaviour "
        "policy's mean action at the logged observations (0: it acts like one of them; "
        "actions lie in [-1, 1]^3). ± is the standard error of the true mean over "
        "episodes; FQE's value is the mean over its seeds (per seed in the result file).",
        "",
        "Return:",
        "",
        f"- Spearman rank correlation: {_number(ret['spearman'])}",
        f"- mean absolute relative error: {100 * ret['mare']:.1f} % "
        f"(largest {100 * ret['max_relative_error']:.1f} %)",
        f"- mean absolute error: {ret['mae']:.0f}, "
        f"{_number(None if ret['mae_over_spread'] is None else 100 * ret['mae_over_spread'], 1)}"
        " % of the spread of the true returns",
        f"- regret@1: {ret['regret_at_1']:.0f} "
        "(true return of the best policy minus that of the policy FQE ranks first)",
        "- rank correlation of the absolute error with the distance from the data's "
        f"behaviour: {_number(ret.get('error_distance_spearman'))}",
        *_support_lines(results["policies"]),
        "",
        "The Industrial Benchmark is partially observable (its observation, the last 30 "
        "frames, does not hold the whole plant state), so a Q-function of observations can "
        "only approximate the policy's value, and how well depends on where the policy "
        "takes the plant.",
        "",
        "Costs (threshold: the discounted cost that the channel's episode cost limit implies, "
        "the limit spread evenly over the episode):",
        "",
        "| channel | episode limit | threshold | Spearman | mean abs. error | largest error "
        "| error / threshold | right side of the threshold |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for limit, (name, entry) in zip(
        config["episode_cost_limits"], summary["costs"].items(), strict=True
    ):
        lines.append(
            f"| {name} | {limit:.0f} | {entry['threshold']:.2f} | "
            f"{_number(entry['spearman'])} | {entry['mae']:.2f} | "
            f"{entry['max_error']:.2f} | {100 * entry['mae_over_threshold']:.0f} % | "
            f"{100 * entry['agreement']:.0f} % |"
        )
    lines += [
        "",
        "A Spearman correlation is left out (—) where the true or estimated values do not vary.",
        "",
        "Goals:",
        "",
    ]
    for check in results["checks"].values():
        verdict = {True: "met", False: "**not met**", None: "not measured"}[check["passed"]]
        value = "—" if check["value"] is None else f"{check['value']:.3f}"
        lines.append(
            f"- {check['what']} {check['comparison']} {check['threshold']}: {verdict} ({value})"
        )
    timing = results["policies"].values()
    lines += [
        "",
        f"FQE time per policy: {np.mean([e['fqe_s'] for e in timing]):.0f} s on average "
        "(compilation included); FQE's settings: Adam at "
        f"{config['learning_rate']:g}, a hard target copy every "
        f"{config['target_update_period']} updates, {config['n_critics']} critic, gradient "
        f"norm clipped at {config['max_grad_norm']:g}; rewards shifted by their mean and "
        "every signal scaled to a per-step spread of sqrt(1 - γ) for training (undone in "
        "the estimates).",
        "",
        "Rerun (from the repository root): `python -m benchmarks.ope` "
        f"(`--trajectories {config['trajectories_per_quality']} --seeds {config['n_seeds']} "
        f"--updates {config['n_updates']} --episodes {config['n_true_episodes']}` are the "
        "settings above); `--quick --no-save` for a smoke run.",
        "",
        *VERDICT_SECTION,
    ]
    return "\n".join(lines)


#: The page's closing section: where these estimates go (written by hand, kept on rerun).
VERDICT_SECTION = [
    "## From estimates to a verdict",
    "",
    "FQE's estimates are one of three estimators of the verdict that decides whether a policy",
    "is better than the logged operation and within its cost limits: a pessimistic plant-model",
    "rollout of every candidate (the shield in the loop, the operators' logged actions replayed",
    "in the same model members), FQE (shown, not deciding), and model rollouts closed by FQE's",
    'value; each with a bootstrap interval, "insufficient evidence" for a cost with too few',
    'events held out, and "keep the current operation" unless every deciding estimator\'s lower',
    "bound of the improvement is above zero. `evaluate --ope DATASET --plant-model MODEL`,",
    "`train`/`sweep --plant-model MODEL`, `Agent.evaluate_offline(..., plant_model=...)`:",
    "[verdict.md](verdict.md). `evaluate --ope` leaves out, loudly, the episodes the agent was",
    "trained on.",
    "",
]


def _support_lines(policies: dict[str, Any]) -> list[str]:
    """The mean relative return error of the policies that act like a behaviour policy
    (distance below :data:`NEAR`) and of the others."""
    lines = []
    for label, inside in (("act like a behaviour policy", True), ("act otherwise", False)):
        errors = [
            abs(e["fqe_return"] - e["true_return"]) / abs(e["true_return"])
            for e in policies.values()
            if (e["action_distance"] < NEAR) == inside
        ]
        if errors:
            lines.append(
                f"- mean absolute relative error of the {len(errors)} policies that {label} "
                f"(distance {'<' if inside else '>='} {NEAR}): {100 * np.mean(errors):.1f} %"
            )
    return lines


def report(config: dict[str, Any], results: dict[str, Any]) -> list[Table]:
    """The per-policy table and the summary, for ``python -m benchmarks.run``."""
    names = config["cost_names"]
    rows = []
    for name, entry in results["policies"].items():
        row = [name, entry["true_return"], entry["fqe_return"]]
        for index in range(len(names)):
            row += [entry["true_costs"][index], entry["fqe_costs"][index]]
        rows.append(row)
    columns = ["policy", "true return", "FQE return"]
    for name in names:
        columns += [f"true {name}", f"FQE {name}"]
    ret = results["summary"]["return"]
    caption = (
        f"return: Spearman {_number(ret['spearman'])}, MARE {100 * ret['mare']:.1f} %, "
        f"regret@1 {ret['regret_at_1']:.0f}; costs on the right side of the threshold: "
        f"{100 * results['summary']['cost_agreement']:.0f} %"
    )
    return [Table("FQE against the simulator", columns, rows, caption)]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.ope", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--env", default="IB-v0", help="environment id (default IB-v0)")
    parser.add_argument(
        "--trajectories", type=int, default=25, help="episodes per behaviour quality"
    )
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=2, help="FQE runs per policy (default 2)")
    parser.add_argument("--updates", type=int, default=40_000, help="FQE updates per run")
    parser.add_argument("--chunk", type=int, default=5_000, help="updates per compiled call")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    parser.add_argument(
        "--episodes", type=int, default=100, help="simulator episodes per policy for the truth"
    )
    parser.add_argument("--doc", default="docs/ope.md", help="markdown page to write")
    parser.add_argument("--results-dir", default=str(DEFAULT_RESULTS_DIR))
    parser.add_argument("-d", "--description", default="FQE against the simulator on IB")
    parser.add_argument("-t", "--tag", default="untagged")
    parser.add_argument("--no-save", action="store_true", help="write neither JSON nor page")
    parser.add_argument(
        "--page-from",
        metavar="RESULT",
        help="write the page from a saved result instead of running the study",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 4 trajectories, 1 seed, 1000 updates, 8 episodes",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.trajectories, args.seeds, args.updates, args.chunk, args.episodes = 4, 1, 1000, 500, 8
    if min(args.hidden) < 1:
        parser.error("--hidden: expected positive layer widths")
    require_positive(
        parser, args, ("trajectories", "seeds", "updates", "chunk", "batch_size", "episodes")
    )
    return args


def run(quick: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """The study with its default settings, for ``python -m benchmarks.run ope``."""
    return run_study(parse_args(["--quick"] if quick else []))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.page_from:
        saved = BenchmarkResult.load(args.page_from)
        if saved.name != NAME:
            raise SystemExit(f"--page-from: {args.page_from} is not an {NAME} result")
        page = markdown(saved.config, saved.results)
        print(page)
        Path(args.doc).write_text(page, encoding="utf-8")
        print(f"Wrote {args.doc}", file=sys.stderr)
        return 0
    started = utc_timestamp()
    config, results = run_study(args)
    page = markdown(config, results)
    publish_study(NAME, args, started, config, results, page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
