"""Risk-averse offline agents on the stochastic tasks: implicit quantile critics whose CVaR
the actor maximizes (reward) or the Lagrangian holds under the limit (cost), against the
same agents with mean critics.

For each task of ``--tasks`` the data is the safety study's (``benchmarks.safety_study``:
episodes of the ``medium``, ``high`` and ``expert`` behaviour policies mixed, the IB's
stricter fatigue cost or a process task's own cost channels and limits). Every variant of
``--variants`` trains ``--seeds`` agents in one vmapped program (``train_offline``) with
its algorithm's reward scaling, then every policy runs ``--episodes`` whole episodes of
the JAX environment with its deterministic action and no shield (the policy's own tail,
not the shield's). Per policy: the mean episode return and its CVaR at 0.1 (the mean of
the worst tenth of episodes), normalized D4RL-style from the dataset card; the normalized
episode cost (mean cost / limit, the largest channel) and its CVaR at 0.1 (the costliest
tenth). The tables give the mean over seeds and a 95 % interval (Student's t); a pair
table sets each risk-averse variant beside its risk-neutral one (CODAC's and O-RAAC's
claim: a better tail for a little mean).

``--trip CHANNEL POINTS PROBABILITY`` adds CODAC's risky reward: every step with a cost on
``CHANNEL`` (a study channel, one per step in its region) trips the plant with
``PROBABILITY`` and loses ``POINTS`` normalized points of return (``POINTS / 100`` of the
span between the random and the expert episode return). The data's rewards are relabelled
with trips drawn once (``--data-seed``); an evaluated episode loses a trip's penalty for
each of its binomial draw of trips over its steps in the region (trips change the reward,
not the plant, so the draw per episode has the per-step trips' distribution). A return
tail appears that a policy can avoid by keeping out of the region, at a price in tracking.

Usage (from the repository root)::

    python -m benchmarks.risk_study                         # IB-v0, docs/risk.md
    python -m benchmarks.risk_study --tasks IB-v0 CSTR-v0 FourTank-v0
    python -m benchmarks.risk_study --tasks CSTR-stochastic-v0 --trip T_high 10 0.1
    python -m benchmarks.risk_study --quick --no-save       # a smoke run
    python -m benchmarks.risk_study --merge RESULT.json ...  # one page from runs per task
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import (
    DEFAULT_RESULTS_DIR,
    BenchmarkResult,
    mean_confidence_interval,
    progress,
    publish_study,
    require_positive,
    utc_timestamp,
)
from benchmarks.safety_study import (
    build_data,
    evaluate_policies,
    final_metrics,
    horizon_of,
    study_cost,
)

NAME = "risk_study"
#: Implicit quantile critics as the study trains them: the IQN paper's N = N' = 8
#: fractions per TD step (a quarter of the library's default 32, which makes the critic
#: update about 16 times the pairs) and K = 32 fixed fractions for the risk measure.
IQN = {"kind": "iqn", "n_quantiles": 8, "n_policy_quantiles": 32, "embedding_size": 64}
CVAR = {**IQN, "risk": "cvar", "cvar_level": 0.1}
#: name -> (registered algorithm, hyperparameters beyond the study's, label).
VARIANTS: dict[str, tuple[str, dict[str, Any], str]] = {
    "td3bc": ("td3bc", {}, "TD3+BC"),
    "td3bc_iqn": ("td3bc", {"critic": IQN}, "TD3+BC, IQN critics (mean)"),
    "td3bc_cvar": ("td3bc", {"critic": CVAR}, "TD3+BC, IQN, actor on CVaR 0.1"),
    "iql": ("iql", {}, "IQL"),
    "iql_cvar": ("iql", {"critic": CVAR}, "IQL, IQN, value on CVaR 0.1"),
    "cql": ("cql", {}, "CQL"),
    "codac_cvar": ("cql", {"critic": CVAR}, "CODAC (CQL + IQN), actor on CVaR 0.1"),
    "td3bc_lag": ("td3bc-lag", {}, "TD3BC-Lag"),
    "td3bc_lag_cvar": ("td3bc-lag", {"cost_critic": CVAR}, "TD3BC-Lag, cost CVaR 0.1"),
    "iql_lag": ("iql-lag", {}, "IQL-Lag"),
    "iql_lag_cvar": ("iql-lag", {"cost_critic": CVAR}, "IQL-Lag, cost CVaR 0.1"),
}
#: Each risk-averse variant beside its risk-neutral one, and what it should improve.
PAIRS: tuple[tuple[str, str, str], ...] = (
    ("td3bc", "td3bc_cvar", "return"),
    ("td3bc_iqn", "td3bc_cvar", "return"),
    ("iql", "iql_cvar", "return"),
    ("cql", "codac_cvar", "return"),
    ("td3bc_lag", "td3bc_lag_cvar", "cost"),
    ("iql_lag", "iql_lag_cvar", "cost"),
)
#: Joins a CVaR variant's name to another level than the study's: ``iql_cvar@0.25``.
AT = "@"


def variant(name: str) -> tuple[str, dict[str, Any], str]:
    """``(registered algorithm, hyperparameters, label)`` of a study variant: one of
    :data:`VARIANTS`, or ``NAME@LEVEL``, a CVaR variant with its CVaR at ``LEVEL`` instead
    of the study's 0.1 (a milder or harsher tail; CODAC's paper sweeps it).

    Raises:
        ValueError: naming an unknown variant, a level on a variant without a CVaR, or a
            level the critics refuse (not a number in (0, 1]).
    """
    from neorl_industrial.core.agents.distributional import CriticConfig

    base, at, level = name.partition(AT)
    if base not in VARIANTS:
        raise ValueError(f"unknown variant {base!r}; expected one of {', '.join(VARIANTS)}")
    algorithm, extra, label = VARIANTS[base]
    if not at:
        return algorithm, extra, label
    key = _cvar_critic(extra)
    if key is None:
        raise ValueError(f"{name}: {base} reads no CVaR, so it takes no level")
    try:
        cvar_level = float(level)
    except ValueError:
        raise ValueError(f"{name}: the CVaR level must be a number, got {level!r}") from None
    try:
        CriticConfig(**{**extra[key], "cvar_level": cvar_level})
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None
    study_level = f"CVaR {CVAR['cvar_level']:g}"
    return (
        algorithm,
        {**extra, key: {**extra[key], "cvar_level": cvar_level}},
        label.replace(study_level, f"CVaR {cvar_level:g}"),
    )


def variant_name(name: str) -> str:
    """``name`` as the study records it: a level written as ``%g``, none for the study's
    own (``iql_cvar@.10`` is ``iql_cvar``). Raises ``ValueError`` as :func:`variant`."""
    base, at, _ = name.partition(AT)
    level = _cvar_level(name)
    if not at:
        return name
    return base if level == CVAR["cvar_level"] else f"{base}{AT}{level:g}"


def variant_order(name: str) -> tuple[int, float]:
    """Sorts variants as :data:`VARIANTS` lists them, a CVaR variant's levels after it in
    increasing order (a table then reads from the harshest tail to the mildest)."""
    return list(VARIANTS).index(name.partition(AT)[0]), _cvar_level(name) or 0.0


def _cvar_critic(extra: dict[str, Any]) -> str | None:
    """The hyperparameter (``critic`` or ``cost_critic``) of a variant's CVaR critic."""
    return next(
        (k for k, v in extra.items() if isinstance(v, dict) and v.get("risk") == "cvar"), None
    )


def _cvar_level(name: str) -> float | None:
    """The CVaR level variant ``name`` trains with; ``None`` for one without a CVaR.
    Raises ``ValueError`` as :func:`variant`."""
    _, extra, _ = variant(name)
    key = _cvar_critic(extra)
    return None if key is None else extra[key]["cvar_level"]


DEFAULT_VARIANTS = (
    "td3bc",
    "td3bc_iqn",
    "td3bc_cvar",
    "iql",
    "iql_cvar",
    "td3bc_lag",
    "td3bc_lag_cvar",
)
METRICS = ("normalized_return", "normalized_return_cvar", "normalized_cost", "normalized_cost_cvar")


@dataclasses.dataclass(frozen=True)
class Trip:
    """CODAC's risky reward on a cost channel: each step with a cost on ``channel`` loses
    ``penalty`` of reward with ``probability``.

    Attributes:
        channel: index of the channel among the study's cost channels.
        penalty: reward lost per trip, in the reward's units.
        probability: a step in the region trips with this probability.
    """

    channel: int
    penalty: float
    probability: float

    def relabel(self, rewards: np.ndarray, costs: np.ndarray, seed: int) -> np.ndarray:
        """Per-step ``rewards`` (``[T]``) less the penalty of a trip drawn (with ``seed``)
        at every step whose cost (``[T, channels]``) on the channel is positive."""
        inside = np.asarray(costs)[:, self.channel] > 0
        trips = inside & (np.random.default_rng(seed).random(inside.shape) < self.probability)
        return np.asarray(rewards) - self.penalty * trips

    def episode_penalties(self, steps_inside: np.ndarray, seed: int) -> np.ndarray:
        """The reward each episode loses to trips: a binomial draw (with ``seed``) of trips
        over its ``steps_inside`` the region, times the penalty."""
        counts = np.rint(np.asarray(steps_inside)).astype(np.int64)
        return self.penalty * np.random.default_rng(seed).binomial(counts, self.probability)


def make_trip(args: argparse.Namespace, channels: Sequence[str], facts: dict[str, Any]) -> Trip:
    """The trip of ``--trip`` on a task with the study's cost ``channels``, its penalty in
    the reward's units from the data facts' random and expert returns.

    Raises:
        ValueError: naming the channel when it is not one of ``channels``.
    """
    name, points, probability = args.trip
    if name not in channels:
        raise ValueError(
            f"--trip: channel {name!r} is not a cost channel of the study {list(channels)}"
        )
    span = facts["expert_return"] - facts["random_return"]
    return Trip(channels.index(name), float(points) / 100.0 * span, float(probability))


def build_variant(
    name: str,
    dataset: Any,
    hidden: Sequence[int],
    cost_limits: Sequence[float],
    episode_length: int,
) -> tuple[Any, Any]:
    """``(algorithm, entry)`` of variant ``name`` for ``dataset``: its registered algorithm
    with the variant's critics, ``hidden`` layers, the data's observation statistics and,
    for a safe algorithm, the study's limits."""

    from neorl_industrial.core.agents.registry import algorithm_entry, build_algorithm

    base, extra, _ = variant(name)
    entry = algorithm_entry(base)
    obs_mean, obs_std = dataset.observation_moments()
    hyperparameters: dict[str, Any] = {
        "hidden": list(hidden),
        "obs_mean": obs_mean.tolist(),
        "obs_std": obs_std.tolist(),
        **extra,
    }
    if entry.safe:
        hyperparameters["cost_limits"] = list(cost_limits)
        hyperparameters["episode_length"] = int(episode_length)
    algorithm, _ = build_algorithm(
        base, dataset.observation_size, dataset.action_size, hyperparameters
    )
    return algorithm, entry


def study_task(env_id: str, args: argparse.Namespace) -> dict[str, Any]:
    """One task: the data (with ``--trip``, its rewards relabelled), every variant trained
    and evaluated without the shield."""
    import jax.numpy as jnp

    from neorl_industrial.functional.state_management import RewardScaling
    from neorl_industrial.functional.transformations.offline import Schedule, train_offline

    cost = study_cost(env_id, args)
    horizon = horizon_of(env_id, args)
    mixed, _card, facts = build_data(env_id, cost, args)
    trip = None
    if args.trip is not None:
        trip = make_trip(args, list(cost.channels), facts)
        costs = np.asarray(mixed.costs)[:, trip.channel]
        if not np.all((costs == 0) | (costs == 1)):
            raise ValueError(
                f"--trip: channel {args.trip[0]!r} is not one cost per step in its region "
                "(its costs are not all 0 or 1)"
            )
        rewards = trip.relabel(np.asarray(mixed.rewards), np.asarray(mixed.costs), args.data_seed)
        facts["trip"] = {
            **trip_settings(args),
            "penalty": trip.penalty,
            "steps_inside": int(costs.sum()),
            "trips": int(np.sum(rewards != np.asarray(mixed.rewards))),
        }
        mixed = mixed.replace(rewards=jnp.asarray(rewards, jnp.float32))
    task: dict[str, Any] = {
        "data": facts,
        "cost": {"channels": list(cost.channels), "limits": list(cost.limits)},
        "horizon": horizon,
        "variants": {},
        "timing": {},
    }
    for name in args.variants:
        algorithm, entry = build_variant(name, mixed, args.hidden, cost.limits, horizon)
        scaling = RewardScaling.fit(mixed, entry.reward_scaling)
        progress(f"{env_id} {variant(name)[2]}: {args.seeds} seeds, {args.updates} updates")
        started = time.perf_counter()
        state, history = train_offline(
            algorithm,
            scaling.apply(mixed),
            seeds=list(range(args.seeds)),
            schedule=Schedule(
                n_updates=args.updates,
                chunk_updates=min(args.chunk, args.updates),
                batch_size=args.batch_size,
            ),
        )
        train_s = time.perf_counter() - started
        started = time.perf_counter()
        rows = evaluate_policies(
            env_id,
            cost,
            algorithm,
            state.agent.policy,
            args,
            shield_actions=False,
            adjust=None if trip is None else trip_adjustment(trip, args.data_seed + 1),
        )
        eval_s = time.perf_counter() - started
        per_seed = [score(row, facts) for row in rows]
        task["variants"][name] = {
            "reward_scaling": scaling.to_dict(),
            "per_seed": per_seed,
            # A safe agent's multipliers and estimated cost values at the end of training.
            "final_multiplier": final_metrics(history, "multiplier_"),
            "final_cost_value": final_metrics(history, "cost_value_"),
            **{
                metric: mean_confidence_interval([seed[metric] for seed in per_seed])
                for metric in METRICS
            },
        }
        task["timing"][name] = {"train_s": train_s, "eval_s": eval_s}
        summary = task["variants"][name]
        progress(
            f"  return {summary['normalized_return']['mean']:.1f} "
            f"(CVaR {summary['normalized_return_cvar']['mean']:.1f}), cost "
            f"{summary['normalized_cost']['mean']:.2f} "
            f"(CVaR {summary['normalized_cost_cvar']['mean']:.2f})"
        )
    task["pairs"] = pairs(task["variants"])
    return task


def trip_adjustment(trip: Trip, seed: int) -> Any:
    """What ``evaluate_policies`` does to its episode statistics under ``trip``: every
    episode's return less its trips' penalty (the same draws for every variant's seed
    ``i``, from ``seed``)."""

    def adjust(stats: Any) -> Any:
        steps_inside = np.asarray(stats.costs)[..., trip.channel]  # [policies, episodes]
        penalties = np.stack(
            [trip.episode_penalties(row, seed + i) for i, row in enumerate(steps_inside)]
        )
        return stats.replace(returns=np.asarray(stats.returns) - penalties)

    return adjust


def score(row: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    """One policy's normalized return and its CVaR (x 100, D4RL-style), its normalized
    cost and cost CVaR, and its mean episode cost per channel (with trips: the steps per
    episode in the region where trips happen)."""
    span = facts["expert_return"] - facts["random_return"]
    return {
        "normalized_return": 100.0 * (row["return"] - facts["random_return"]) / span,
        "normalized_return_cvar": 100.0 * (row["return_cvar"] - facts["random_return"]) / span,
        "normalized_cost": float(row["normalized_cost"]),
        "normalized_cost_cvar": float(row["normalized_cost_cvar"]),
        "episode_cost": {name: float(value) for name, value in row["episode_cost"].items()},
    }


def region_line(task: dict[str, Any]) -> list[str]:
    """With trips, a paragraph with each variant's steps per episode in the trips' region
    (mean over seeds), where its seeds recorded them; none otherwise."""
    trip = task.get("data", {}).get("trip")
    if not trip:
        return []
    cells = [
        f"{variant(name)[2]} "
        f"{np.mean([seed['episode_cost'][trip['channel']] for seed in entry['per_seed']]):.1f}"
        for name, entry in task["variants"].items()
        if entry.get("per_seed") and all("episode_cost" in seed for seed in entry["per_seed"])
    ]
    if not cells:
        return []
    return [
        "",
        f"Steps per episode with a `{trip['channel']}` cost (where trips happen), mean over "
        "seeds: " + "; ".join(cells) + ".",
    ]


def pairs(variants: dict[str, Any]) -> list[dict[str, Any]]:
    """Each risk-averse variant against its risk-neutral one, where both ran: the change
    of each metric (risk-averse minus neutral) and whether the tail it targets improved
    beyond the two intervals' overlap."""
    out = []
    present = [
        (neutral, averse, target)
        for neutral, averse_base, target in PAIRS
        for averse in variants
        if averse.partition(AT)[0] == averse_base and neutral in variants
    ]
    for neutral, averse, target in present:
        a, b = variants[neutral], variants[averse]
        change = {metric: b[metric]["mean"] - a[metric]["mean"] for metric in METRICS}
        if target == "return":
            metric = "normalized_return_cvar"
            better = b[metric]["mean"] - (b[metric]["ci"] or 0) > a[metric]["mean"] + (
                a[metric]["ci"] or 0
            )
        else:
            metric = "normalized_cost_cvar"
            better = b[metric]["mean"] + (b[metric]["ci"] or 0) < a[metric]["mean"] - (
                a[metric]["ci"] or 0
            )
        out.append(
            {
                "neutral": neutral,
                "averse": averse,
                "target": metric,
                "change": change,
                "tail_better": bool(
                    change[metric] > 0 if target == "return" else change[metric] < 0
                ),
                "tail_better_significantly": bool(better),
            }
        )
    return out


def _cell(summary: dict[str, Any], digits: int) -> str:
    if summary.get("ci") is None:
        return f"{summary['mean']:.{digits}f}"
    return f"{summary['mean']:.{digits}f} ± {summary['ci']:.{digits}f}"


def episodes_identical(task: dict[str, Any]) -> bool:
    """Whether every variant's tail equals its mean, return and cost alike: the episodes
    of each policy were the same episode."""
    for entry in task["variants"].values():
        if not entry.get("per_seed"):
            return False
        for seed in entry["per_seed"]:
            for mean, tail in (
                ("normalized_return", "normalized_return_cvar"),
                ("normalized_cost", "normalized_cost_cvar"),
            ):
                if not np.isclose(seed[mean], seed[tail], rtol=1e-9, atol=1e-9):
                    return False
    return True


def kept_by(saved: BenchmarkResult, path: Path) -> dict[str, Any] | None:
    """What a run made with ``--keep`` carried over, for a result saved before its tasks
    recorded it: the source file, and its device when the file lies beside ``path`` (the
    variants are not known)."""
    source = saved.config.get("kept_from")
    if not source:
        return None
    beside = path.parent / source
    device = BenchmarkResult.load(beside).config.get("device") if beside.is_file() else None
    return {"from": source, "device": device, "variants": None}


def merge(paths: Sequence[str | Path]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One study from saved runs of it on different tasks (the first run's settings head
    the page; each task names the device and file it came from).

    Raises:
        ValueError: for no files, a result of another benchmark, a task in two files, or
            runs whose settings other than the tasks differ.
    """
    if not paths:
        raise ValueError("merge: expected at least one result file")
    config: dict[str, Any] | None = None
    results: dict[str, Any] = {"tasks": {}}
    for path in paths:
        saved = BenchmarkResult.load(path)
        if saved.name != NAME:
            raise ValueError(f"{path}: a {saved.name!r} result, not a {NAME} one")
        if config is None:
            config = {
                **saved.config,
                "tasks": [],
                "merged_from": [],
                "variants": [],
                "variant_settings": {},
            }
        else:
            differing = [
                key
                for key in SHARED_SETTINGS
                # Each task's section states its trips (tasks with trips are named apart).
                if key not in ("tasks", "trip") and saved.config.get(key) != config.get(key)
            ]
            if differing:
                raise ValueError(
                    f"{path}: run with other settings than {paths[0]} ({', '.join(differing)})"
                )
        for name in saved.config.get("variants", []):
            if name not in config["variants"]:
                config["variants"].append(name)
                if name in saved.config.get("variant_settings", {}):
                    config["variant_settings"][name] = saved.config["variant_settings"][name]
        for env_id, task in tasks_by_key(saved).items():
            # A task of an earlier merge keeps the device and file it came from.
            task = {
                **task,
                "device": task.get("device", saved.config.get("device")),
                "result": task.get("result", Path(path).name),
                "kept": task.get("kept") or kept_by(saved, Path(path)),
            }
            if env_id in results["tasks"]:
                join_task(results["tasks"][env_id], task, env_id, path)
                continue
            results["tasks"][env_id] = task
            config["tasks"].append(env_id)
        config["merged_from"].append(Path(path).name)
    assert config is not None
    return config, results


#: What two runs of one task must share for their variants to join on one table.
TASK_FACTS = ("data", "cost", "horizon")


def join_task(into: dict[str, Any], task: dict[str, Any], env_id: str, path: Any) -> None:
    """Adds to ``into`` (a merged task) the variants of ``task``, the same task from the
    file ``path``, with the pairs recomputed, and records where they were trained.

    Raises:
        ValueError: naming the variants both runs trained, or the data fact that differs
            (they must be one dataset, cost and horizon to share a table).
    """
    both = [name for name in task["variants"] if name in into["variants"]]
    if both:
        raise ValueError(
            f"{path}: task {env_id} already has {', '.join(both)} from an earlier file"
        )
    differing = [key for key in TASK_FACTS if task.get(key) != into.get(key)]
    if differing:
        raise ValueError(
            f"{path}: task {env_id} is in an earlier file with other {', '.join(differing)}"
            " (variants join only on the same data)"
        )
    variants = {**into["variants"], **task["variants"]}
    into["variants"] = {name: variants[name] for name in sorted(variants, key=variant_order)}
    into["timing"] = {**into["timing"], **task["timing"]}
    into["pairs"] = pairs(into["variants"])
    # Where the incoming variants were trained: runs it joined, a run it kept from, itself.
    sources = list(task.get("joined", []))
    kept = task.get("kept") or {}
    if kept.get("variants"):
        sources.append(
            {"from": kept["from"], "device": kept["device"], "variants": kept["variants"]}
        )
    placed = {name for entry in sources for name in entry["variants"]}
    own = [name for name in task["variants"] if name not in placed]
    if own:
        sources.append({"from": task["result"], "device": task["device"], "variants": own})
    into["joined"] = [*into.get("joined", []), *sources]


def joined_lines(joined: Sequence[dict[str, Any]]) -> list[str]:
    """A paragraph naming the variants a merged task took from other runs of it."""
    return [
        line
        for entry in joined
        for line in (
            f"Joined from `{entry['from']}` (the same settings and data; trained on "
            f"{entry['device']}, whose training seconds these are): "
            + "; ".join(variant(name)[2] for name in entry["variants"])
            + ".",
            "",
        )
    ]


def multiplier_lines(task: dict[str, Any]) -> list[str]:
    """A paragraph with each safe variant's multipliers and estimated cost values (what
    they step on) at the end of training, mean over seeds per channel; none without."""
    parts = []
    for name, entry in task["variants"].items():
        multipliers, values = entry.get("final_multiplier"), entry.get("final_cost_value")
        if not multipliers or not values:
            continue
        channels = task["cost"]["channels"]
        cells = [
            f"{channel} λ {np.mean(multipliers[f'multiplier_{i}']):.3g}, "
            f"estimate {np.mean(values[f'cost_value_{i}']):.3g}"
            for i, channel in enumerate(channels)
        ]
        parts.append(f"{variant(name)[2]}: {'; '.join(cells)}")
    if not parts:
        return []
    return [
        "",
        "Multipliers and the estimated discounted cost they step on (the cost critics' mean, "
        "or their CVaR for a cost-CVaR variant), at the end of training, mean over seeds: "
        + ". ".join(parts)
        + ".",
    ]


def trip_lines(trip: dict[str, Any] | None) -> list[str]:
    """A paragraph on the task's trips (``--trip``); none without."""
    if not trip:
        return []
    return [
        f"Risky reward (`--trip`): each step with a `{trip['channel']}` cost trips with "
        f"probability {trip['probability']:g} and loses {trip['penalty_points']:g} normalized "
        f"points ({trip['penalty']:.3g} of reward). The data's {trip['steps_inside']:,} steps "
        f"in the region drew {trip['trips']:,} trips; the returns and return CVaRs below "
        "include the evaluated episodes' trips.",
        "",
    ]


def kept_lines(kept: dict[str, Any] | None) -> list[str]:
    """A paragraph naming the variants a task carried over from an earlier run."""
    if not kept or kept.get("variants") == []:
        return []
    where = f"trained on {kept['device']}" if kept.get("device") else "trained there"
    what = (
        ": " + "; ".join(variant(name)[2] for name in kept["variants"])
        if kept.get("variants")
        else " for the variants not trained again in this run"
    )
    return [
        f"Carried over from `{kept['from']}` (the same settings and data; {where}, whose "
        f"training seconds these are){what}.",
        "",
    ]


def markdown(config: dict[str, Any], results: dict[str, Any]) -> str:
    """The study as a markdown page."""
    lines = [
        "# Risk study: distributional critics and CVaR",
        "",
        "Generated by `python -m benchmarks.risk_study` "
        f"({config['n_seeds']} seeds per variant in one vmapped program, "
        f"{config['n_updates']:,} updates, batch {config['batch_size']}, networks "
        f"{tuple(config['hidden'])}, {config['n_episodes']} evaluation episodes per seed, "
        "no shield). Do not edit by hand; rerun the script.",
        "",
        "Data: the safety study's mixture of medium, high and expert episodes with its cost "
        "(docs/safety.md). *Return* is the normalized episode return "
        "(`100 (R - random) / (expert - random)`), *return CVaR* the same of the mean of the "
        "worst tenth of episodes; *cost* is the mean episode cost over the limit (the "
        "largest channel; <= 1 is within it), *cost CVaR* the same of the costliest tenth. "
        "Mean over seeds ± the half-width of a 95 % interval. Quantile critics: "
        f"{IQN['n_quantiles']} fractions drawn per TD step for the online and the target "
        f"quantiles, {IQN['n_policy_quantiles']} fixed fractions for the risk measure, "
        f"{IQN['embedding_size']} cosines.",
        "",
    ]
    for env_id, task in results["tasks"].items():
        lines += [f"## {env_id}", ""]
        if task.get("device"):
            lines += [f"Trained and evaluated on {task['device']} ({task['result']}).", ""]
        lines += kept_lines(task.get("kept"))
        lines += joined_lines(task.get("joined", []))
        lines += trip_lines(task.get("data", {}).get("trip"))
        if episodes_identical(task):
            lines += [
                "Every policy's episodes here are identical (the task's reset and its "
                "setpoint and disturbance schedules are deterministic), so the CVaR over "
                "episodes equals the mean: the tables compare policies across seeds, not "
                "tails within a policy.",
                "",
            ]
        lines += [
            "| variant | return | return CVaR 0.1 | cost | cost CVaR 0.1 | train s |",
            "|---|---|---|---|---|---|",
        ]
        for name, entry in task["variants"].items():
            lines.append(
                f"| {variant(name)[2]} | {_cell(entry['normalized_return'], 1)} | "
                f"{_cell(entry['normalized_return_cvar'], 1)} | "
                f"{_cell(entry['normalized_cost'], 2)} | "
                f"{_cell(entry['normalized_cost_cvar'], 2)} | "
                f"{task['timing'][name]['train_s']:.0f} |"
            )
        lines += region_line(task)
        lines += multiplier_lines(task)
        if task["pairs"]:
            lines += [
                "",
                "Risk-averse against risk-neutral (change = averse − neutral):",
                "",
                "| pair | Δ return | Δ return CVaR | Δ cost | Δ cost CVaR | tail better |",
                "|---|---|---|---|---|---|",
            ]
            for pair in task["pairs"]:
                change = pair["change"]
                verdict = (
                    "yes, beyond the intervals"
                    if pair["tail_better_significantly"]
                    else ("yes" if pair["tail_better"] else "**no**")
                )
                lines.append(
                    f"| {variant(pair['averse'])[2]} vs {variant(pair['neutral'])[2]} | "
                    f"{change['normalized_return']:+.1f} | "
                    f"{change['normalized_return_cvar']:+.1f} | "
                    f"{change['normalized_cost']:+.2f} | "
                    f"{change['normalized_cost_cvar']:+.2f} | {verdict} |"
                )
        lines.append("")
    return "\n".join(lines)


#: Settings a kept result must share with this run (names of the result's config).
SHARED_SETTINGS = (
    "tasks",
    "trajectories_per_quality",
    "fatigue_limit",
    "cost_limit",
    "n_seeds",
    "n_updates",
    "batch_size",
    "hidden",
    "n_episodes",
    "ib_horizon",
    "trip",
)


def check_keepable(saved: BenchmarkResult, config: dict[str, Any]) -> None:
    """Raises ``ValueError`` naming each setting in which ``saved`` differs from
    ``config`` (a run's own settings), or when it is not a risk-study result."""
    if saved.name != NAME:
        raise ValueError(f"a {saved.name!r} result, not a {NAME} one")
    differing = [
        f"{key} {config.get(key)} here, {saved.config.get(key)} there"
        for key in SHARED_SETTINGS
        if saved.config.get(key) != config.get(key)
    ]
    if differing:
        raise ValueError(
            "--keep: the result was run with other settings (" + "; ".join(differing) + ")"
        )


def keep_variants(
    results: dict[str, Any],
    saved: BenchmarkResult,
    rerun: Sequence[str],
    source: str = "an earlier run",
) -> list[str]:
    """Adds to ``results`` the variants of ``saved`` (the file ``source``) that this run did
    not train again (in the saved order, then the new ones) with the pairs recomputed, and
    records per task which were carried from where; returns every variant."""
    order = [name for name in saved.config["variants"] if name not in rerun] + list(rerun)
    saved_tasks = tasks_by_key(saved)
    for env_id, task in results["tasks"].items():
        old = saved_tasks[env_id]
        task["kept"] = {
            "from": source,
            "device": old.get("device", saved.config.get("device")),
            "variants": [name for name in old["variants"] if name not in task["variants"]],
        }
        variants = {**old["variants"], **task["variants"]}
        timing = {**old["timing"], **task["timing"]}
        task["variants"] = {name: variants[name] for name in order if name in variants}
        task["timing"] = {name: timing[name] for name in order if name in timing}
        task["pairs"] = pairs(task["variants"])
    return order


#: How a task with trips is named apart from the task without.
TRIPS_ON = ", trips on "


def task_key(name: str, trip: dict[str, Any] | None) -> str:
    """A task's name in the results and its heading: the environment id, with the trip's
    channel, penalty and probability when there is one (so a merge holds a task with and
    without trips, and with other trips); a name that says its trips is named again from
    them (runs from before the penalty was in the name)."""
    if trip is None:
        return name
    return (
        f"{name.split(TRIPS_ON)[0]}{TRIPS_ON}{trip['channel']} ({trip['penalty_points']:g} points, "
        f"p {trip['probability']:g})"
    )


def tasks_by_key(saved: BenchmarkResult) -> dict[str, Any]:
    """The tasks of a saved run under their names (:func:`task_key`; runs from before
    tasks with trips were named apart give the bare environment id)."""
    return {
        task_key(key, task.get("data", {}).get("trip")): task
        for key, task in saved.results["tasks"].items()
    }


def run_study(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    import jax

    results: dict[str, Any] = {"tasks": {}}
    for env_id in args.tasks:
        task = study_task(env_id, args)
        results["tasks"][task_key(env_id, task["data"].get("trip"))] = task
    variants = list(args.variants)
    if args.keep is not None:
        variants = keep_variants(results, args.keep_result, args.variants, args.keep.name)
    config = {
        "variants": variants,
        "kept_from": None if args.keep is None else args.keep.name,
        "variant_settings": {
            name: {"algorithm": algorithm, **extra}
            for name in variants
            for algorithm, extra, _ in [variant(name)]
        },
        **settings_of(args),
        "tail": 0.1,
        "device": str(jax.devices()[0].device_kind),
    }
    return config, results


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.risk_study", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--tasks", nargs="+", default=["IB-v0"])
    parser.add_argument(
        "--variants",
        nargs="+",
        default=list(DEFAULT_VARIANTS),
        metavar="VARIANT",
        help=f"of {', '.join(VARIANTS)}; a CVaR variant at another level than "
        f"{CVAR['cvar_level']:g} as NAME{AT}LEVEL (iql_cvar{AT}0.25)",
    )
    parser.add_argument("--trajectories", type=int, default=30, help="episodes per quality")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--fatigue-limit", type=float, default=30.0)
    parser.add_argument("--cost-limit", type=float, default=100.0)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--updates", type=int, default=10_000)
    parser.add_argument("--chunk", type=int, default=2_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--horizon", type=int, default=1000, help="IB episode length")
    parser.add_argument(
        "--trip",
        nargs=3,
        metavar=("CHANNEL", "POINTS", "PROBABILITY"),
        help="CODAC's risky reward: each step with a cost on CHANNEL trips with "
        "PROBABILITY and loses POINTS normalized points of return",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        help="an earlier result of this study with the same settings: its variants not "
        "given in --variants are carried over (those given are trained again)",
    )
    parser.add_argument("--doc", default="docs/risk.md")
    parser.add_argument("--results-dir", default=str(DEFAULT_RESULTS_DIR))
    parser.add_argument("-d", "--description", default="Risk study: IQN critics and CVaR")
    parser.add_argument("-t", "--tag", default="untagged")
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 2 trajectories, 2 seeds, 100 updates"
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar="RESULT",
        help="write the page (and a combined result) from saved runs on different tasks "
        "instead of running",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.trajectories, args.seeds, args.updates, args.chunk = 2, 2, 100, 50
        args.episodes, args.horizon = 10, 100
    require_positive(
        parser, args, ("trajectories", "seeds", "updates", "chunk", "batch_size", "episodes")
    )
    if args.seeds < 2:
        parser.error("--seeds: at least 2, for an interval over seeds")
    try:
        args.variants = [variant_name(name) for name in args.variants]
    except ValueError as error:
        parser.error(f"--variants: {error}")
    twice = sorted({name for name in args.variants if args.variants.count(name) > 1})
    if twice:
        parser.error(f"--variants: given twice: {', '.join(twice)}")
    if args.trip is not None:
        try:
            points, probability = float(args.trip[1]), float(args.trip[2])
        except ValueError:
            parser.error(f"--trip: POINTS and PROBABILITY must be numbers, got {args.trip[1:]}")
        if not (np.isfinite(points) and points > 0):
            parser.error(f"--trip: POINTS must be positive, got {args.trip[1]}")
        if not 0.0 < probability <= 1.0:
            parser.error(f"--trip: PROBABILITY must lie in (0, 1], got {args.trip[2]}")
        args.trip = [args.trip[0], points, probability]
    from neorl_industrial.core.environments import registered_envs

    unknown = [task for task in args.tasks if task not in registered_envs()]
    if unknown:
        parser.error(f"--tasks: unknown environment {unknown[0]!r}")
    if args.trip is not None:
        for env_id in args.tasks:
            channels = study_cost(env_id, args).channels
            if args.trip[0] not in channels:
                parser.error(
                    f"--trip: channel {args.trip[0]!r} is not a cost channel of the study on "
                    f"{env_id} {list(channels)}"
                )
    if args.keep is not None:
        try:
            saved = BenchmarkResult.load(args.keep)
            check_keepable(saved, settings_of(args))
        except (OSError, ValueError, KeyError) as error:
            parser.error(f"--keep {args.keep}: {error}")
        args.keep_result = saved
    return args


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """The run's settings under the names of its result's config."""
    return {
        "tasks": list(args.tasks),
        "trajectories_per_quality": args.trajectories,
        "fatigue_limit": args.fatigue_limit,
        "cost_limit": args.cost_limit,
        "n_seeds": args.seeds,
        "n_updates": args.updates,
        "batch_size": args.batch_size,
        "hidden": list(args.hidden),
        "n_episodes": args.episodes,
        "ib_horizon": args.horizon,
        "trip": trip_settings(args),
    }


def trip_settings(args: argparse.Namespace) -> dict[str, Any] | None:
    """``--trip`` as the result records it (None without trips)."""
    if args.trip is None:
        return None
    channel, points, probability = args.trip
    return {"channel": channel, "penalty_points": points, "probability": probability}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = utc_timestamp()
    if args.merge:
        try:
            config, results = merge(args.merge)
        except (OSError, ValueError, KeyError) as error:
            print(f"--merge: {error}", file=sys.stderr)
            return 2
    else:
        config, results = run_study(args)
    page = markdown(config, results)
    publish_study(NAME, args, started, config, results, page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
