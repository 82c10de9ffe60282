"""Learning study: BC, TD3+BC, IQL and CQL on the generated datasets of one or more
tasks (the Industrial Benchmark, the process suite), several seeds at once, evaluated in
the JAX environment.

For each task (``--tasks``, default ``IB-v0``) and quality (``low``, ``medium``, ``high``
by default) a dataset of ``--trajectories`` whole episodes is generated from the shipped
behaviour policies (deterministic given ``--data-seed``). Every algorithm, with its CORL
defaults, trains ``--seeds`` independent agents on every dataset of a task in **one**
compiled program: seeds and datasets are two ``vmap`` axes over separate parameters (a
task's datasets have equal shapes). Each agent is then evaluated with its deterministic
action over ``--episodes`` full episodes of the environment (vmapped environments, all
agents at once).

Preprocessing, the same for every algorithm: observations are standardized with the
dataset's per-feature mean and spread (the normalizer travels with the policy), rewards
are standardized with the dataset's mean and spread (the tasks' episodes end by time
limit; only a diverging process terminates early, which the shift makes a loss of the
remaining standardized rewards; the scale keeps the critics' values near one), and
actions in plant units are scaled to [-1, 1] with the task's actuator bounds (the policy
scales back, so it is evaluated in plant units). Evaluation uses the environment's own
reward.

Scores are D4RL-style normalized returns from the dataset card,
``100 * (R - random) / (expert - random)``, per seed the mean over its episodes; the table
gives the mean over seeds and a 95 % confidence interval (Student's t over seeds). The
behaviour policy's score is the dataset's own mean return.

The page has one table per task and a suite summary: per algorithm, on how many of the
datasets its mean score beats the behaviour policy's. For tasks with published NeoRL-2
offline scores (Pipeline, DMSD) those are shown beside ours; their data and budgets are not
ours (one dataset per task, their own behaviour policy and normalization, 1 M updates).

Usage (from the repository root)::

    python -m benchmarks.learning                      # the study, writes docs/learning.md
    python -m benchmarks.learning --tasks CSTR-v0 FourTank-v0 Pipeline-v0 DMSD-v0
    python -m benchmarks.learning --quick --no-save    # a minute-long smoke run
    python -m benchmarks.learning --algorithms cql -t cql   # one algorithm per run ...
    python -m benchmarks.learning --merge benchmarks/results/learning-*.json  # ... merged

The run is saved like every benchmark (``benchmarks/results/learning-<tag>-<time>.json``)
and the markdown table is written to ``--doc``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import (
    DEFAULT_RESULTS_DIR,
    BenchmarkResult,
    progress,
    system_info,
    utc_timestamp,
)

NAME = "learning"
ALGORITHMS = ("bc", "td3bc", "iql", "cql", "cql_alpha", "cql_bc", "cql_d3rlpy")
LABELS = {
    "bc": "BC",
    "td3bc": "TD3+BC",
    "iql": "IQL",
    "cql": "CQL",
    "cql_alpha": "CQL-α",
    "cql_bc": "CQL (BC warm start)",
    "cql_d3rlpy": "CQL (d3rlpy defaults)",
}
QUALITIES = ("low", "medium", "high")
#: Algorithms expected to reach the behaviour policy's return on these qualities.
IMPROVERS = ("td3bc", "iql", "cql", "cql_alpha", "cql_bc", "cql_d3rlpy")
MUST_MATCH_BEHAVIOUR = ("low", "medium")


def make_algorithm(
    name: str,
    obs_size: int,
    action_size: int,
    hidden: Sequence[int] = (256, 256),
    n_updates: int = 100_000,
) -> Any:
    """Algorithm ``name`` with its defaults (but ``hidden`` layer widths) and no
    observation statistics (the normalizer is set per dataset in the state).

    ``cql_bc`` is CQL with CORL's behaviour-cloning warm start over the first tenth of
    ``n_updates`` (CORL: 100 k of 1 M)."""
    from neorl_industrial.core.agents import (
        BCConfig,
        CQLConfig,
        IQLConfig,
        TD3BCConfig,
        make_bc,
        make_cql,
        make_iql,
        make_td3bc,
    )

    factories = {
        "bc": (make_bc, BCConfig),
        "td3bc": (make_td3bc, TD3BCConfig),
        "iql": (make_iql, IQLConfig),
        "cql": (make_cql, CQLConfig),
        "cql_alpha": (make_cql, lambda **kw: CQLConfig(lagrange=True, **kw)),
        "cql_bc": (make_cql, lambda **kw: CQLConfig(bc_steps=n_updates // 10, **kw)),
        # d3rlpy 2.8's CQL defaults: actor and temperature lr 1e-4, penalty weight 5 tuned
        # by a Lagrange multiplier (lr 1e-4, from 1) towards a gap of 10.
        "cql_d3rlpy": (
            make_cql,
            lambda **kw: CQLConfig(
                actor_lr=1e-4,
                alpha_lr=1e-4,
                cql_alpha=5.0,
                lagrange=True,
                target_action_gap=10.0,
                alpha_prime_lr=1e-4,
                **kw,
            ),
        ),
    }
    if name not in factories:
        raise ValueError(f"algorithm: unknown {name!r}; expected one of {sorted(factories)}")
    factory, config = factories[name]
    return factory(config(hidden=tuple(hidden)), obs_size, action_size)


def standardize_rewards(dataset: Any) -> tuple[Any, dict[str, float]]:
    """The dataset with rewards ``(r - mean) / std`` and the statistics used."""
    import jax.numpy as jnp

    rewards = np.asarray(dataset.rewards, np.float64)
    mean, std = float(rewards.mean()), float(max(rewards.std(), 1e-6))
    scaled = ((rewards - mean) / std).astype(np.float32)
    return dataset.replace(rewards=jnp.asarray(scaled)), {"mean": mean, "std": std}


def observation_normalizer(dataset: Any) -> Any:
    """The dataset's per-feature observation normalizer."""
    from neorl_industrial.core.agents import ObservationNormalizer

    observations = np.asarray(dataset.observations, np.float64)
    return ObservationNormalizer.create(observations.mean(0), observations.std(0))


def mean_confidence_interval(values: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """Mean of ``values`` with the half-width of a Student-t confidence interval."""
    from scipy import stats

    data = np.asarray(values, np.float64)
    mean = float(data.mean())
    if data.size < 2:
        return {"mean": mean, "ci": None, "n": int(data.size)}
    half = stats.t.ppf(0.5 + level / 2, data.size - 1) * data.std(ddof=1) / np.sqrt(data.size)
    return {"mean": mean, "ci": float(half), "n": int(data.size)}


def train_all(
    algorithm: Any,
    datasets: Any,
    normalizers: Any,
    n_seeds: int,
    n_updates: int,
    chunk_updates: int,
    batch_size: int,
) -> tuple[Any, list[dict[str, Any]]]:
    """Trains ``n_seeds`` agents on each of the stacked ``datasets`` in one program.

    Returns the final states (leading axes ``[dataset, seed]``) and, per chunk, the
    updates done, seconds and mean metrics.
    """
    import jax
    import jax.numpy as jnp

    from neorl_industrial.functional.transformations.offline import (
        init_seeds,
        make_seeded_chunk,
    )

    n_datasets = int(normalizers.mean.shape[0])
    seeded = make_seeded_chunk(algorithm, batch_size, chunk_updates)
    chunk = jax.jit(jax.vmap(seeded, in_axes=(0, 0, 0)), donate_argnums=0)

    def init_for(normalizer: Any) -> Any:
        states = init_seeds(algorithm, jnp.arange(n_seeds))
        repeated = jax.tree.map(
            lambda leaf: jnp.broadcast_to(leaf, (n_seeds, *leaf.shape)), normalizer
        )
        return states.replace(policy=states.policy.replace(normalizer=repeated))

    states = jax.tree.map(jnp.copy, jax.vmap(init_for)(normalizers))
    keys = jax.random.split(jax.random.PRNGKey(1), n_datasets * n_seeds).reshape(
        n_datasets, n_seeds, -1
    )
    history = []
    done = 0
    while done < n_updates:
        split = jax.vmap(jax.vmap(jax.random.split))(keys)
        keys, chunk_keys = split[:, :, 0], split[:, :, 1]
        started = time.perf_counter()
        states, metrics = chunk(states, datasets, chunk_keys)
        metrics = jax.device_get(metrics)
        seconds = time.perf_counter() - started
        done += chunk_updates
        history.append(
            {
                "updates": done,
                "seconds": seconds,
                "metrics": {name: np.asarray(value).tolist() for name, value in metrics.items()},
            }
        )
        progress(f"  {done:>7} updates, {seconds:.1f} s for the chunk")
    return states, history


def evaluate_all(
    algorithm: Any, env: Any, env_params: Any, policies: Any, n_episodes: int, seed: int
) -> np.ndarray:
    """Mean episode return of every policy (leading axes ``[dataset, seed]``) over
    ``n_episodes`` whole episodes, its deterministic action, all policies at once."""
    import jax

    from neorl_industrial.core.environments import rollout

    horizon = int(env_params.horizon)

    def policy(policy_params: Any, observation: Any, key: Any) -> Any:
        return algorithm.act(policy_params, observation, key, deterministic=True)

    def one(policy_params: Any, key: Any) -> Any:
        result = rollout(
            key, env, env_params, policy, n_episodes, horizon, policy_params=policy_params
        )
        return result.episode_return_sum / result.episodes  # [n_episodes]

    leading = jax.tree.leaves(policies)[0].shape[:2]
    keys = jax.random.split(jax.random.PRNGKey(seed), leading[0] * leading[1]).reshape(*leading, -1)
    returns = jax.jit(jax.vmap(jax.vmap(one)))(policies, keys)
    return np.asarray(jax.device_get(returns))


#: NeoRL-2's published offline results (Gao et al., 2025, "NeoRL-2: Near Real-World
#: Benchmarks for Offline Reinforcement Learning with Extended Realistic Scenarios",
#: Table 3): normalized scores on the one dataset of each task; "data" is the dataset's own.
NEORL2_PUBLISHED: dict[str, dict[str, float]] = {
    "Pipeline-v0": {"data": 69.25, "bc": 68.61, "cql": 81.08, "td3bc": 81.95},
    "DMSD-v0": {"data": 56.64, "bc": 65.09, "cql": 70.24, "td3bc": 60.01},
}


def neorl2_normalization(env_id: str) -> Any:
    """NeoRL-2's normalized score of an episode return for a task it published."""
    if env_id == "Pipeline-v0":
        from neorl_industrial.core.environments.pipeline import normalized_score
    elif env_id == "DMSD-v0":
        from neorl_industrial.core.environments.dmsd import normalized_score
    else:
        raise ValueError(f"env_id: NeoRL-2 publishes no normalization for {env_id!r}")
    return normalized_score


def _cell(summary: dict[str, Any] | None) -> str:
    if summary is None:
        return "—"
    if summary.get("ci") is None:
        return f"{summary['mean']:.1f}"
    return f"{summary['mean']:.1f} ± {summary['ci']:.1f}"


def as_suite(config: dict[str, Any], results: dict[str, Any]) -> tuple[dict, dict]:
    """A study in the suite's layout (``results["tasks"][env_id]``); a saved run of one
    task in the earlier layout (``config["env_id"]``, ``results["datasets"]``) is
    converted."""
    if "tasks" in results:
        return config, results
    env_id = config["env_id"]
    task = {
        "datasets": results["datasets"],
        "timing": results.get("timing", {}),
        "history": results.get("history", {}),
        "checks": results.get("checks", {}),
        "horizon": config.get("horizon"),
    }
    suite_config = {k: v for k, v in config.items() if k not in ("env_id", "horizon")}
    suite_config["tasks"] = [env_id]
    return suite_config, {"tasks": {env_id: task}}


def _updates_text(config: dict[str, Any], task: dict[str, Any]) -> str:
    counts = {
        name: task["timing"][name].get("n_updates", config.get("n_updates"))
        for name in config["algorithms"]
        if name in task.get("timing", {})
    }
    if isinstance(config.get("n_updates"), dict):
        counts = {name: config["n_updates"].get(name, n) for name, n in counts.items()}
    if len(set(counts.values())) == 1:
        return f"{next(iter(counts.values())):,} updates"
    return "updates " + ", ".join(f"{LABELS[n]} {u:,}" for n, u in counts.items())


def summary(config: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
    """Per algorithm, over every task and dataset it ran on: on how many its mean score
    beats the behaviour policy's, and on how many the lower end of the 95 % interval does."""
    out: dict[str, Any] = {}
    for name in config["algorithms"]:
        beats = significantly = total = 0
        for task in results["tasks"].values():
            for entry in task["datasets"].values():
                score = entry["scores"].get(name)
                if score is None:
                    continue
                total += 1
                beats += score["mean"] > entry["behaviour_score"]
                significantly += score["mean"] - (score["ci"] or 0.0) > entry["behaviour_score"]
        out[name] = {"beats": beats, "significantly": significantly, "datasets": total}
    return out


def task_markdown(env_id: str, config: dict[str, Any], task: dict[str, Any]) -> list[str]:
    """One task's tables: normalized scores, returns, checks, NeoRL-2's published scores."""
    labels = [LABELS[name] for name in config["algorithms"]]
    qualities = [q for q in config["qualities"] if q in task["datasets"]]
    horizon = task.get("horizon")
    lines = [
        f"## {env_id}",
        "",
        f"{_updates_text(config, task)}; datasets of {config['trajectories']} trajectories"
        + (f" of {horizon} steps" if horizon else "")
        + ".",
        "",
        "| dataset | behaviour | " + " | ".join(labels) + " |",
        "|---|---|" + "---|" * len(labels),
    ]
    for quality in qualities:
        entry = task["datasets"][quality]
        row = [f"{env_id}-{quality}", f"{entry['behaviour_score']:.1f}"]
        row += [_cell(entry["scores"].get(name)) for name in config["algorithms"]]
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "Mean episode returns (environment reward per episode):",
        "",
        "| dataset | random | expert | behaviour | " + " | ".join(labels) + " |",
        "|---|---|---|---|" + "---|" * len(labels),
    ]
    for quality in qualities:
        entry = task["datasets"][quality]
        row = [
            f"{env_id}-{quality}",
            f"{entry['random_return']:.4g}",
            f"{entry['expert_return']:.4g}",
            f"{entry['behaviour_return']:.4g}",
        ]
        row += [_cell(entry["returns"].get(name)) for name in config["algorithms"]]
        lines.append("| " + " | ".join(row) + " |")
    published = NEORL2_PUBLISHED.get(env_id)
    if published:
        names = [name for name in ("bc", "cql", "td3bc") if name in published]
        lines += [
            "",
            "NeoRL-2's published normalized scores on its own dataset of this task, for "
            "comparison only: their data (one dataset from their behaviour policy), "
            "normalization (their random and expert returns) and budgets are not ours, "
            "so the numbers are not on the same scale as the table above.",
            "",
            "| NeoRL-2 | data | " + " | ".join(LABELS[n] for n in names) + " |",
            "|---|---|" + "---|" * len(names),
            f"| {env_id} (published) | {published['data']:.2f} | "
            + " | ".join(f"{published[n]:.2f}" for n in names)
            + " |",
        ]
        rescore = neorl2_normalization(env_id)
        for quality in qualities:
            entry = task["datasets"][quality]
            cells = [
                "—"
                if entry["returns"].get(n) is None
                else f"{rescore(entry['returns'][n]['mean']):.2f}"
                for n in names
            ]
            behaviour = rescore(entry["behaviour_return"])
            lines.append(
                f"| {env_id}-{quality} (ours, rescored) | {behaviour:.2f} | "
                + " | ".join(cells)
                + " |"
            )
        lines += [
            "",
            "*Rescored*: our mean episode returns put on NeoRL-2's scale with its own "
            "normalization (its random and expert returns for this task), so the rows compare "
            "returns in the same environment; the datasets, behaviour policies and budgets "
            "still differ.",
        ]
    task_checks = task.get("checks", {})
    if task_checks:
        lines += ["", "Checks (mean score over seeds against the behaviour score):", ""]
        for check in task_checks.values():
            verdict = "met" if check["passed"] else "**not met**"
            lines.append(f"- {check['what']}: {verdict} ({check['detail']})")
    timing = task.get("timing", {})
    if timing:
        lines += [
            "",
            "Training time per algorithm (all datasets and seeds in one program): "
            + ", ".join(
                f"{LABELS[name]} {timing[name]['train_s']:.0f} s"
                for name in config["algorithms"]
                if name in timing
            )
            + ".",
        ]
    return [*lines, ""]


def markdown(config: dict[str, Any], results: dict[str, Any]) -> str:
    """The study as a markdown page: a suite summary, then one section per task."""
    config, results = as_suite(config, results)
    tasks = list(results["tasks"])
    lines = [
        "# Learning study: offline agents on the task suite",
        "",
        "Generated by `python -m benchmarks.learning` "
        f"(batch {config['batch_size']}, networks {tuple(config.get('hidden', (256, 256)))}, "
        f"{config['n_seeds']} seeds per dataset trained in one vmapped program, "
        f"{config['n_episodes']} evaluation episodes per seed; tasks: "
        + ", ".join(f"`{t}`" for t in tasks)
        + "). Do not edit by hand; rerun the script.",
        "",
        "Normalized scores, D4RL-style from the dataset card: "
        "`100 * (R - random) / (expert - random)`; mean over seeds ± the half-width of a "
        "95 % confidence interval (Student's t over seeds). *Behaviour* is the dataset's "
        "own mean return.",
        "",
    ]
    if len(tasks) > 1 or config.get("summary_always"):
        counts = summary(config, results)
        lines += [
            "## Suite summary",
            "",
            "On how many datasets each algorithm's mean score beats the behaviour policy's "
            "(and on how many the lower end of its 95 % interval does):",
            "",
            "| algorithm | beats the behaviour policy | of which significantly |",
            "|---|---|---|",
        ]
        for name, count in counts.items():
            lines.append(
                f"| {LABELS[name]} | {count['beats']} of {count['datasets']} | "
                f"{count['significantly']} of {count['datasets']} |"
            )
        lines.append("")
    for env_id in tasks:
        lines += task_markdown(env_id, config, results["tasks"][env_id])
    lines += [
        f"Device: {config.get('device', 'unknown')}. Preprocessing (every algorithm): "
        "observations standardized with the dataset's per-feature statistics (the "
        "normalizer is part of the policy); rewards standardized with the dataset's mean "
        "and spread for training only; actions in plant units scaled to [-1, 1] by the "
        "actuator bounds (the policy scales back). Hyperparameters are the algorithms' "
        "defaults (CORL's) except the network widths given above.",
        "",
    ]
    return "\n".join(lines)


def checks(config: dict[str, Any], results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """One task's expectations, each with the numbers behind its verdict.

    * TD3+BC, IQL and CQL reach the behaviour policy on ``low`` and ``medium``: the mean
      score over seeds is at least the behaviour score (the interval is reported beside
      it, not used to widen the check).
    * BC is close to the behaviour policy: within 10 points of its score.
    """
    out: dict[str, dict[str, Any]] = {}
    for quality in config["qualities"]:
        entry = results["datasets"].get(quality)
        if entry is None:
            continue
        behaviour = entry["behaviour_score"]
        for name in config["algorithms"]:
            score = entry["scores"].get(name)
            if score is None:
                continue
            half = score["ci"] or 0.0
            if name in IMPROVERS and quality in MUST_MATCH_BEHAVIOUR:
                out[f"{name}_{quality}_reaches_behaviour"] = {
                    "what": f"{LABELS[name]} reaches the behaviour score on {quality}",
                    "passed": bool(score["mean"] >= behaviour),
                    "detail": f"{score['mean']:.1f} ± {half:.1f} vs {behaviour:.1f}",
                }
            if name == "bc":
                out[f"bc_{quality}_close_to_behaviour"] = {
                    "what": f"BC within 10 points of the behaviour score on {quality}",
                    "passed": bool(abs(score["mean"] - behaviour) <= 10.0),
                    "detail": f"{score['mean']:.1f} ± {half:.1f} vs {behaviour:.1f}",
                }
    return out


def study_task(env_id: str, args: argparse.Namespace) -> dict[str, Any]:
    """Generates one task's datasets, trains and evaluates every algorithm on them."""
    import jax
    import jax.numpy as jnp

    from neorl_industrial.core.environments import make
    from neorl_industrial.functional.state_management import with_action_scaling
    from neorl_industrial.functional.transformations import action_scaler_for
    from neorl_industrial.integration.datasets import generate_dataset

    env, env_params = make(env_id)
    scaler = action_scaler_for(env)
    datasets, cards, reward_stats = [], [], []
    for quality in args.qualities:
        progress(f"dataset {env_id}-{quality}: {args.trajectories} trajectories")
        dataset, card = generate_dataset(env_id, quality, args.trajectories, seed=args.data_seed)
        if scaler is not None:
            dataset = dataset.replace(actions=scaler.scale(dataset.actions))
        scaled, stats = standardize_rewards(dataset)
        datasets.append(scaled)
        cards.append(card)
        reward_stats.append(stats)
    normalizers = jax.tree.map(
        lambda *leaves: jnp.stack(leaves), *[observation_normalizer(d) for d in datasets]
    )
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *datasets)
    obs_size, action_size = datasets[0].observation_size, datasets[0].action_size

    task: dict[str, Any] = {
        "datasets": {},
        "timing": {},
        "history": {},
        "horizon": int(env_params.horizon),
        "action_scaling": scaler is not None,
    }
    for quality, card, stats in zip(args.qualities, cards, reward_stats, strict=True):
        behaviour_return = float(card.behaviour_policy.mean_return)
        task["datasets"][quality] = {
            "behaviour_return": behaviour_return,
            "behaviour_score": float(card.normalized_score(behaviour_return)),
            "random_return": float(card.random_return),
            "expert_return": float(card.expert_return),
            "reward_mean": stats["mean"],
            "reward_std": stats["std"],
            "scores": {},
            "returns": {},
            "per_seed_scores": {},
        }
    for name in args.algorithms:
        progress(f"{env_id} {LABELS[name]}: {len(args.qualities)} datasets x {args.seeds} seeds")
        algorithm = make_algorithm(name, obs_size, action_size, args.hidden, args.updates)
        started = time.perf_counter()
        states, history = train_all(
            algorithm,
            stacked,
            normalizers,
            args.seeds,
            args.updates,
            min(args.chunk, args.updates),
            args.batch_size,
        )
        train_s = time.perf_counter() - started
        progress(f"{env_id} {LABELS[name]}: evaluating {args.episodes} episodes per agent")
        started = time.perf_counter()
        acting = with_action_scaling(algorithm, scaler)
        returns = evaluate_all(acting, env, env_params, states.policy, args.episodes, 7)
        eval_s = time.perf_counter() - started
        task["timing"][name] = {"train_s": train_s, "eval_s": eval_s, "n_updates": args.updates}
        task["history"][name] = history
        for index, (quality, card) in enumerate(zip(args.qualities, cards, strict=True)):
            per_seed_returns = returns[index].mean(axis=-1)
            per_seed_scores = card.normalized_score(per_seed_returns)
            entry = task["datasets"][quality]
            entry["scores"][name] = mean_confidence_interval(per_seed_scores)
            entry["returns"][name] = mean_confidence_interval(per_seed_returns)
            entry["per_seed_scores"][name] = np.asarray(per_seed_scores).tolist()
            progress(
                f"  {quality}: score {entry['scores'][name]['mean']:.1f} "
                f"(behaviour {entry['behaviour_score']:.1f})"
            )
    return task


def run_study(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every task of ``args.tasks``: datasets, training and evaluation."""
    import jax

    config = {
        "tasks": list(args.tasks),
        "qualities": list(args.qualities),
        "algorithms": list(args.algorithms),
        "trajectories": args.trajectories,
        "data_seed": args.data_seed,
        "n_seeds": args.seeds,
        "n_updates": args.updates,
        "chunk_updates": min(args.chunk, args.updates),
        "batch_size": args.batch_size,
        "hidden": list(args.hidden),
        "n_episodes": args.episodes,
        "device": str(jax.devices()[0].device_kind),
        "jax_backend": jax.default_backend(),
    }
    results: dict[str, Any] = {"tasks": {}}
    for env_id in args.tasks:
        task = study_task(env_id, args)
        task["checks"] = checks(config, task)
        results["tasks"][env_id] = task
    results["summary"] = summary(config, results)
    return config, results


#: Settings that may differ between the runs of one merged study.
PER_RUN = ("algorithms", "qualities", "n_updates", "chunk_updates", "tasks")


def merge(paths: Sequence[str | Path]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One study from several saved runs of the same settings with different algorithms
    or tasks (e.g. one run per algorithm, each within a time limit).

    Raises:
        ValueError: when the runs' settings (other than algorithms, tasks, qualities and
            updates) differ, or two runs hold the same algorithm on the same task.
    """
    if not paths:
        raise ValueError("merge: expected at least one result file")
    runs = []
    for path in paths:
        run = BenchmarkResult.load(path)
        if run.name != NAME:
            raise ValueError(f"{path}: not a learning study (benchmark {run.name!r})")
        runs.append(as_suite(run.config, run.results))
    base = dict(runs[0][0])
    algorithms: list[str] = []
    tasks: list[str] = []
    results: dict[str, Any] = {"tasks": {}}
    for path, (run_config, run_results) in zip(paths, runs, strict=True):
        differing = sorted(
            key
            for key in set(base) | set(run_config)
            if key not in PER_RUN and base.get(key) != run_config.get(key)
        )
        if differing:
            raise ValueError(f"{path}: settings differ from {paths[0]}: {', '.join(differing)}")
        for env_id, task in run_results["tasks"].items():
            if env_id not in tasks:
                tasks.append(env_id)
            merged = results["tasks"].setdefault(
                env_id,
                {"datasets": {}, "timing": {}, "history": {}, "horizon": task.get("horizon")},
            )
            for name in run_config["algorithms"]:
                if name in merged["timing"]:
                    raise ValueError(f"{path}: algorithm {name!r} on {env_id} appears in two runs")
                if name not in algorithms:
                    algorithms.append(name)
                merged["timing"][name] = {
                    "n_updates": run_config["n_updates"],
                    **task["timing"][name],
                }
                merged["history"][name] = task["history"][name]
            for quality, entry in task["datasets"].items():
                target = merged["datasets"].setdefault(
                    quality, {**entry, "scores": {}, "returns": {}, "per_seed_scores": {}}
                )
                for field in ("scores", "returns", "per_seed_scores"):
                    target[field].update(entry.get(field, {}))
    updates: dict[str, int] = {}
    for task in results["tasks"].values():
        for name, timing in task["timing"].items():
            updates.setdefault(name, timing["n_updates"])
    config = {**base}
    config["algorithms"] = [name for name in ALGORITHMS if name in algorithms]
    config["tasks"] = tasks
    config["qualities"] = [
        q for q in QUALITIES if any(q in t["datasets"] for t in results["tasks"].values())
    ]
    config["n_updates"] = (
        updates if len(set(updates.values())) > 1 else next(iter(updates.values()))
    )
    config.pop("chunk_updates", None)
    config["merged_from"] = [Path(path).name for path in paths]
    for task in results["tasks"].values():
        task["checks"] = checks(config, task)
    results["summary"] = summary(config, results)
    return config, results


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.learning", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--tasks", nargs="+", default=["IB-v0"], help="environment ids (default IB-v0)"
    )
    parser.add_argument("--qualities", nargs="+", default=list(QUALITIES), choices=QUALITIES)
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    parser.add_argument("--trajectories", type=int, default=100, help="episodes per dataset")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=5, help="agents per dataset (default 5)")
    parser.add_argument("--updates", type=int, default=100_000, help="updates per agent")
    parser.add_argument("--chunk", type=int, default=5_000, help="updates per compiled call")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument(
        "--hidden", type=int, nargs="+", default=[256, 256], help="hidden layer widths"
    )
    parser.add_argument("--episodes", type=int, default=100, help="evaluation episodes per agent")
    parser.add_argument("--doc", default="docs/learning.md", help="markdown page to write")
    parser.add_argument("--results-dir", default=str(DEFAULT_RESULTS_DIR))
    parser.add_argument("-d", "--description", default="Learning study on the task suite")
    parser.add_argument("-t", "--tag", default="untagged")
    parser.add_argument("--no-save", action="store_true", help="write neither JSON nor page")
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="RESULT",
        help="write the page (and a combined result) from saved runs instead of running",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 10 trajectories, 2 seeds, 200 updates, 4 episodes",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.trajectories, args.seeds, args.updates, args.chunk, args.episodes = 10, 2, 200, 100, 4
    if min(args.hidden) < 1:
        parser.error("--hidden: expected positive layer widths")
    for name in ("trajectories", "seeds", "updates", "chunk", "batch_size", "episodes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected a positive integer")
    if not args.merge:
        from neorl_industrial.core.environments import registered_envs

        unknown = [t for t in args.tasks if t not in registered_envs()]
        if unknown:
            parser.error(
                f"--tasks: unknown environment {unknown[0]!r}; "
                f"registered: {sorted(registered_envs())}"
            )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = utc_timestamp()
    config, results = merge(args.merge) if args.merge else run_study(args)
    page = markdown(config, results)
    print(page)
    if not args.no_save:
        result = BenchmarkResult(
            name=NAME,
            description=args.description,
            tag=args.tag,
            timestamp=started,
            system=system_info(),
            config=config,
            results=results,
        )
        path = result.save(args.results_dir)
        Path(args.doc).write_text(page, encoding="utf-8")
        print(f"Wrote {path} and {args.doc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
