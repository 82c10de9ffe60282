"""The learning study's page and plots: the checks against the behaviour policy, the
suite summary, one section of tables per task (with NeoRL-2's published scores where it
has them), wall time, and the learning curves' plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import mean_confidence_interval
from benchmarks.learning_common import ALGORITHMS, LABELS, PER_ALGORITHM

#: Algorithms expected to reach the behaviour policy's return on these qualities.
IMPROVERS = ("td3bc", "iql", "cql", "cql_alpha", "cql_bc", "cql_d3rlpy")
MUST_MATCH_BEHAVIOUR = ("low", "medium")

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
        "curves": results.get("curves", {}),
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


def task_markdown(
    env_id: str, config: dict[str, Any], task: dict[str, Any], images: str | None = None
) -> list[str]:
    """One task's tables: normalized scores (with the learning curves' plots under
    ``images``, a path relative to the page, when given), returns, reward scaling, checks,
    NeoRL-2's published scores and wall time."""
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
    plotted = curve_datasets(config, task)
    if images and plotted:
        every = config.get("eval_every")
        lines += [
            "",
            "Learning curves: normalized score against updates, mean over seeds with its 95 % "
            "interval; dashed, the behaviour policy. "
            + (
                f"A point every {every:,} updates over {config.get('curve_episodes')} "
                "episodes per seed; "
                if every
                else ""
            )
            + f"the last point is the final evaluation ({config['n_episodes']} episodes).",
            "",
        ]
        for quality in plotted:  # a paragraph each: one plot under the other
            lines += [f"![{env_id}-{quality}]({images}/{env_id}-{quality}.png)", ""]
        lines.pop()
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
    scaled = [
        n
        for n in config["algorithms"]
        if any(n in e.get("reward_scaling", {}) for e in (task["datasets"][q] for q in qualities))
    ]
    if scaled:
        lines += [
            "",
            "Reward scaling for training, `r -> (r + shift) * scale`, fitted on each dataset:",
            "",
            "| dataset | " + " | ".join(LABELS[n] for n in scaled) + " |",
            "|---|" + "---|" * len(scaled),
        ]
        for quality in qualities:
            scalings = task["datasets"][quality].get("reward_scaling", {})
            cells = [_scaling_cell(scalings.get(n)) for n in scaled]
            lines.append(f"| {env_id}-{quality} | " + " | ".join(cells) + " |")
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
            "Wall time per algorithm, training + evaluation (all datasets and seeds in one "
            "program, summed over resumed sessions): "
            + ", ".join(
                f"{LABELS[name]} {duration(timing[name]['train_s'])} + "
                f"{duration(timing[name].get('eval_s', 0.0))}"
                + (
                    f" on {timing[name].get('device', 'unknown')}"
                    if isinstance(config.get("device"), dict)
                    else ""
                )
                for name in config["algorithms"]
                if name in timing
            )
            + ".",
        ]
    return [*lines, ""]


def _scaling_cell(scaling: dict[str, Any] | None) -> str:
    if scaling is None:
        return "—"
    shift = f", shift {scaling['shift']:.4g}" if scaling["shift"] else ""
    return f"{scaling['kind']} (scale {scaling['scale']:.3g}{shift})"


def duration(seconds: float) -> str:
    """``42 s``, ``17 min``, ``5 h 03 min``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def wall_time(results: dict[str, Any], device: str | None = None) -> dict[str, float]:
    """Seconds of training and of evaluation over every task and algorithm (summed over
    resumed sessions), and their total; with ``device``, of the algorithms run there."""
    timings = [
        t
        for task in results["tasks"].values()
        for t in task.get("timing", {}).values()
        if device is None or t.get("device") == device
    ]
    train = float(sum(t.get("train_s", 0.0) for t in timings))
    evaluation = float(sum(t.get("eval_s", 0.0) for t in timings))
    return {"train_s": train, "eval_s": evaluation, "total_s": train + evaluation}


def _wall_time_text(config: dict[str, Any], results: dict[str, Any]) -> str:
    """The study's wall time; per device when its algorithms ran on several."""

    def text(spent: dict[str, float]) -> str:
        return (
            f"{duration(spent['total_s'])} (training {duration(spent['train_s'])}, "
            f"evaluation {duration(spent['eval_s'])})"
        )

    devices = config.get("device")
    if not isinstance(devices, dict):
        return f"{text(wall_time(results))}; every task and algorithm"
    parts = []
    for device in dict.fromkeys(devices.values()):
        names = ", ".join(LABELS[n] for n, d in devices.items() if d == device)
        parts.append(f"{names} on {device}: {text(wall_time(results, device))}")
    return "; ".join(parts)


def _device_text(config: dict[str, Any]) -> str:
    devices = config.get("device", "unknown")
    if not isinstance(devices, dict):
        return f"Device: {devices}."
    return (
        "Devices: "
        + "; ".join(
            ", ".join(LABELS[n] for n, d in devices.items() if d == device) + f" on {device}"
            for device in dict.fromkeys(devices.values())
        )
        + "."
    )


def _preprocessing(config: dict[str, Any]) -> str:
    scaling = config.get("reward_scaling")
    if scaling is None:  # runs from before the per-algorithm scaling
        return "rewards standardized with the dataset's mean and spread for training only"
    if scaling == PER_ALGORITHM:
        return (
            "rewards scaled for training only, per algorithm as the algorithm registry "
            "says (IQL: `return_range`, times 1000 / (max - min episode return), the IQL "
            "paper's; the others: `std`, divided by the rewards' spread; the CQL variants "
            "as CQL), fitted on each dataset (the tables give kind and scale)"
        )
    return f"rewards scaled for training only with `{scaling}` for every algorithm"


def markdown(config: dict[str, Any], results: dict[str, Any], images: str | None = None) -> str:
    """The study as a markdown page: a suite summary, then one section per task (with the
    plots under ``images``, a path relative to the page, when given)."""
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
        f"Wall time of the study: {_wall_time_text(config, results)}; summed over "
        "resumed sessions.",
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
        lines += task_markdown(env_id, config, results["tasks"][env_id], images)
    lines += [
        f"{_device_text(config)} Preprocessing: "
        "observations standardized with the dataset's per-feature statistics (the "
        f"normalizer is part of the policy); {_preprocessing(config)}; "
        "actions in plant units scaled to [-1, 1] by the "
        "actuator bounds (the policy scales back). Hyperparameters are the algorithms' "
        "defaults (CORL's) except the network widths given above.",
        "",
    ]
    if config.get("sources"):
        lines += ["Merged from these runs (`benchmarks/results/`):", ""]
        lines += [
            f"- `{source['file']}`: {source['description']} "
            f"(commit {source['commit'] or 'unknown'}, {source['timestamp'][:10]})"
            for source in config["sources"]
        ]
        lines.append("")
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


# ----- learning curves ----------------------------------------------------------------------
def curve_datasets(config: dict[str, Any], task: dict[str, Any]) -> list[str]:
    """The qualities of ``task`` with a learning curve of some algorithm (one plot each)."""
    curves = task.get("curves") or {}
    return [
        quality
        for quality in config["qualities"]
        if quality in task["datasets"]
        and any(quality in curve["scores"] for curve in curves.values())
    ]


#: The lowest normalized score a learning-curve plot shows; means below it are marked.
SCORE_FLOOR = -100.0


def plot_curves(
    config: dict[str, Any], results: dict[str, Any], directory: str | Path
) -> list[Path]:
    """``<directory>/<task>-<quality>.png`` per dataset with curves: normalized score
    against updates per algorithm, mean over seeds with its 95 % interval as a band, and
    the behaviour policy's score dashed. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib import pyplot as plt

    from neorl_industrial.wrappers.hostio import atomic_file

    config, results = as_suite(config, results)
    written = []
    for env_id, task in results["tasks"].items():
        curves = task.get("curves") or {}
        for quality in curve_datasets(config, task):
            entry = task["datasets"][quality]
            figure, axis = plt.subplots(figsize=(7.0, 4.4))
            off_scale, highest = False, 100.0
            for name in config["algorithms"]:
                curve = curves.get(name)
                if curve is None or quality not in curve["scores"]:
                    continue
                updates = np.asarray(curve["updates"])
                stats = [mean_confidence_interval(s) for s in curve["scores"][quality]]
                mean = np.asarray([s["mean"] for s in stats])
                half = np.asarray([s["ci"] or 0.0 for s in stats])
                # One colour per algorithm on every plot of the page.
                color = f"C{ALGORITHMS.index(name) % 10}"
                axis.plot(updates, mean, color=color, marker="o", ms=3, label=LABELS[name])
                axis.fill_between(updates, mean - half, mean + half, color=color, alpha=0.18)
                highest = max(highest, float(np.max(mean)))
                below = mean < SCORE_FLOOR
                if below.any():
                    # A diverged seed would squash every other curve: its mean is drawn
                    # as a triangle on the floor, labelled with its value.
                    off_scale = True
                    axis.scatter(
                        updates[below],
                        np.full(below.sum(), SCORE_FLOOR),
                        marker="v",
                        s=40,
                        color=color,
                        zorder=3,
                    )
                    for x, value in zip(updates[below], mean[below], strict=True):
                        axis.annotate(
                            f"{value:.0f}",
                            (x, SCORE_FLOOR),
                            textcoords="offset points",
                            xytext=(0, 6),
                            ha="center",
                            fontsize=7,
                            color=color,
                        )
            axis.axhline(
                entry["behaviour_score"], color="black", ls="--", lw=1.2, label="behaviour policy"
            )
            if off_scale:  # the bands of the diverged runs' means leave the plot too
                axis.set_ylim(SCORE_FLOOR - 15.0, highest + 15.0)
            axis.set_xlabel("updates")
            axis.set_ylabel(
                "normalized score"
                + (f" (means below {SCORE_FLOOR:.0f}: ▼ with the value)" if off_scale else "")
            )
            axis.set_title(f"{env_id}-{quality}: mean over seeds, 95 % interval")
            axis.grid(alpha=0.3)
            axis.legend(fontsize=8, loc="best")
            figure.tight_layout()
            target = Path(directory) / f"{env_id}-{quality}.png"
            with atomic_file(target) as staging:
                figure.savefig(staging, dpi=110, format="png")
            plt.close(figure)
            written.append(target)
    return written
