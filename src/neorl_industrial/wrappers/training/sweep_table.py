"""A sweep's table: every configuration's runs, summary and standing, and the choice.

``Agent.sweep`` trains and evaluates; :func:`sweep_table` ranks what it measured, safety
first on each configuration's mean over seeds (:func:`selection_key`), says why the chosen
one won and, when a simulator judges a choice made off policy, how good that choice was.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from neorl_industrial.wrappers.training.evaluation import selection_key, summarize_runs

__all__ = [
    "candidate_id",
    "configuration_name",
    "offline_choice_quality",
    "parse_candidate",
    "sweep_markdown",
    "sweep_table",
    "with_values",
]


def sweep_table(
    points: Sequence[Mapping[str, Any]],
    metrics: Sequence[dict[str, Any]],
    seeds: Sequence[int],
    *,
    truth: Sequence[dict[str, Any]] | None = None,
    verdict: dict[str, Any] | None = None,
    programs: int = 1,
    estimate: str = "simulator",
    failed: Mapping[int, str] | None = None,
) -> dict[str, Any]:
    """The table of a sweep of the grid ``points`` (dotted hyperparameter: value), whose
    runs' evaluations ``metrics`` are in the grid's order, ``len(seeds)`` per point:
    ``{"verdict", "hindsight", "fields", "seeds", "programs", "estimate",
    "configurations": [{"values", "runs", "summary", "within_limits"}], "selected",
    "reason"}``. ``truth``: the simulator's evaluations of the same runs when ``metrics``
    are off-policy estimates (then ``hindsight`` says how good the choice was).
    ``failed``: ``{run: why}`` (runs in the same order) of the runs whose policy cannot
    act: left out of their configuration's summary (``failed_runs``); a configuration
    all of whose runs failed ranks last and is never chosen.

    Raises:
        ValueError: when ``metrics`` are not one per point and seed, or every run failed.
    """
    failed = dict(failed or {})
    if failed and len(failed) == len(metrics):
        raise ValueError("failed: every run failed; no configuration can be chosen")
    n_seeds = len(seeds)
    if not points or len(metrics) != len(points) * n_seeds:
        raise ValueError(
            f"metrics: expected {len(points)} configurations x {n_seeds} seeds, got {len(metrics)}"
        )
    rows = [
        _configuration(point, metrics[index * n_seeds : (index + 1) * n_seeds], seeds,
                       {run - index * n_seeds: why for run, why in failed.items()})
        for index, point in enumerate(points)
    ]  # fmt: skip
    configurations = [row for row, _ in rows]
    keys = [key for _, key in rows]
    chosen = max(range(len(configurations)), key=lambda i: keys[i])
    reason = _choice_reason(configurations, keys, chosen)
    hindsight = None
    if truth is not None:
        hindsight = offline_choice_quality(configurations, truth, n_seeds, chosen)
    return {
        "verdict": verdict,
        "hindsight": hindsight,
        "fields": list(points[0]),
        "seeds": list(seeds),
        "programs": programs,
        "estimate": estimate,
        "configurations": configurations,
        "selected": chosen,
        "reason": reason,
    }


def _configuration(
    point: Mapping[str, Any],
    own: Sequence[dict[str, Any]],
    seeds: Sequence[int],
    failed: Mapping[int, str],
) -> tuple[dict[str, Any], tuple[float, float]]:
    """One configuration's row (its runs ``own``, one per seed; ``failed``: ``{seed's
    position: why}``, positions outside the seeds ignored) and its selection key."""
    broken = {seeds[n]: failed[n] for n in range(len(seeds)) if n in failed}
    able = [run for seed, run in zip(seeds, own, strict=True) if seed not in broken]
    summary = summarize_runs(able or list(own))
    mean_metrics = {
        key: value["mean"]
        for key, value in summary.items()
        if isinstance(value, dict) and "mean" in value
    }
    # Below every configuration that has a policy that can act.
    key = selection_key(mean_metrics) if able else (-1.0, 0.0)
    row = {
        "values": dict(point),
        "runs": [{"seed": seed, **run} for seed, run in zip(seeds, own, strict=True)],
        "summary": summary,
        "within_limits": key[0] == 1.0,
        "failed_runs": {str(seed): why for seed, why in broken.items()},
    }
    return row, key


def _choice_reason(
    configurations: Sequence[dict[str, Any]], keys: Sequence[tuple[float, float]], chosen: int
) -> str:
    """Why configuration ``chosen`` won, and whether the data can tell it from the next
    best of the same standing."""
    best = configurations[chosen]
    reason = (
        "the best mean return among the configurations within the cost limits"
        if best["within_limits"]
        else "no configuration kept the cost limits on average: the lowest mean cost"
    )
    if all(c["summary"].get("normalized_cost") is None for c in configurations):
        reason = "the best mean return (no cost limits)"
    rivals = [
        i for i in range(len(configurations)) if i != chosen and keys[i][0] == keys[chosen][0]
    ]
    by_return = keys[chosen][0] == 1.0 or "normalized_cost" not in best["summary"]
    if rivals and by_return:
        runner = max(rivals, key=lambda i: keys[i])
        ours, theirs = best["summary"]["return"], configurations[runner]["summary"]["return"]
        if ours["mean"] - (ours["ci"] or 0.0) <= theirs["mean"] + (theirs["ci"] or 0.0):
            reason += (
                f"; configuration {runner} is within the 95 % intervals, so the data "
                "cannot tell them apart (more seeds or held-out episodes can)"
            )
    return reason


def configuration_name(index: int, seed: int) -> str:
    """A sweep's run as the verdict names it."""
    return f"configuration {index} (seed {seed})"


def candidate_id(seed: int, configuration: int | None = None) -> str:
    """A saved candidate's name for ``export --candidate`` and the joint verdict:
    ``seed1`` (a training run's seed), ``config3-seed0`` (a sweep's configuration and
    seed)."""
    return f"seed{seed}" if configuration is None else f"config{configuration}-seed{seed}"


_CANDIDATE = re.compile(
    r"^(?:config(?P<config>\d+)-seed(?P<seed>-?\d+)|seed\s*(?P<plain>-?\d+)"
    r"|run \d+ \(seed (?P<run>-?\d+)\)"
    r"|configuration (?P<index>\d+) \(seed (?P<indexed>-?\d+)\))$"
)


def parse_candidate(name: str) -> tuple[int | None, int] | None:
    """``(configuration or None, seed)`` of a candidate's name: its id (``seed1``,
    ``config3-seed0``) or the name a run's own verdict gives it (``run 1 (seed 1)``,
    ``configuration 3 (seed 0)``); None for anything else."""
    match = _CANDIDATE.match(name.strip())
    if match is None:
        return None
    groups = match.groupdict()
    if groups["config"] is not None:
        return int(groups["config"]), int(groups["seed"])
    if groups["index"] is not None:
        return int(groups["index"]), int(groups["indexed"])
    return None, int(groups["plain"] if groups["plain"] is not None else groups["run"])


def with_values(hyperparameters: Mapping[str, Any], point: Mapping[str, Any]) -> dict[str, Any]:
    """``hyperparameters`` with a sweep configuration's dotted ``point`` set in them."""
    result = dict(hyperparameters)
    for path, value in point.items():
        *parents, leaf = path.split(".")
        target = result
        for parent in parents:
            nested = target.get(parent)
            nested = dict(nested) if isinstance(nested, Mapping) else {}
            target[parent] = nested
            target = nested
        target[leaf] = value
    return result


def offline_choice_quality(
    configurations: list[dict[str, Any]], truth: list[dict[str, Any]], n_seeds: int, chosen: int
) -> dict[str, Any]:
    """How good a choice made on off-policy estimates was, by the simulator's numbers of
    the same policies: each configuration's true mean return (and cost) is added to it,
    and the regret (the best true mean return minus the chosen one's) and the Spearman
    rank correlation of estimated and true mean returns are returned."""
    from scipy.stats import spearmanr

    true_returns = []
    for index, configuration in enumerate(configurations):
        own = truth[index * n_seeds : (index + 1) * n_seeds]
        summary = summarize_runs(own)
        configuration["simulated"] = summary
        true_returns.append(summary["return"]["mean"])
    estimated = [c["summary"]["return"]["mean"] for c in configurations]
    best = int(np.argmax(true_returns))
    correlation = None
    if len(configurations) > 1 and np.ptp(estimated) > 0 and np.ptp(true_returns) > 0:
        correlation = float(spearmanr(estimated, true_returns).statistic)
    return {
        "best_in_hindsight": best,
        "regret": float(true_returns[best] - true_returns[chosen]),
        "rank_correlation": correlation,
    }


def sweep_markdown(table: dict[str, Any], title: str) -> str:
    """The sweep's table as a markdown page (an MLflow artifact and ``sweep.md``)."""
    fields, chosen = table["fields"], table["selected"]
    has_cost = any("normalized_cost" in c["summary"] for c in table["configurations"])
    head = [*fields, "return (mean ± 95 %)"] + (["normalized cost", "within limits"] * has_cost)
    lines = [
        f"# {title}",
        "",
        f"{len(table['configurations'])} configurations × seeds {table['seeds']}, trained as "
        + (
            "one program"
            if table.get("programs", 1) == 1
            else f"{table['programs']} programs (one per value of the fields no program traces)"
        )
        + f"; each run evaluated by {table['estimate']}. Chosen: configuration "
        f"{chosen} ({table['reason']}).",
        "",
        "| # | " + " | ".join(head) + " |",
        "|" + "---|" * (len(head) + 1),
    ]
    for index, configuration in enumerate(table["configurations"]):
        summary = configuration["summary"]
        ret = summary["return"]
        cells = [str(configuration["values"][field]) for field in fields]
        cells.append(f"{ret['mean']:.4g} ± {ret['ci'] or 0.0:.3g}")
        if has_cost:
            cost = summary.get("normalized_cost")
            cells.append("—" if cost is None else f"{cost['mean']:.3g}")
            cells.append("yes" if configuration["within_limits"] else "no")
        mark = f"**{index}**" if index == chosen else str(index)
        lines.append(f"| {mark} | " + " | ".join(cells) + " |")
    hindsight = table.get("hindsight")
    if hindsight:
        correlation = hindsight["rank_correlation"]
        lines += [
            "",
            "In hindsight (the simulator's returns of the same policies): the best "
            f"configuration is {hindsight['best_in_hindsight']}, the offline choice's regret "
            f"{hindsight['regret']:.4g}, the rank correlation of estimated and true returns "
            + ("undefined (a constant side)" if correlation is None else f"{correlation:.2f}")
            + ".",
        ]
    return "\n".join(lines) + "\n"
