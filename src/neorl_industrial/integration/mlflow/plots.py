"""PNG plots of a training run (matplotlib, no display): learning curves and safety.

Both take the Trainer's history (one entry per chunk: ``updates`` and the mean metrics
per run) and evaluations (``updates`` and one metrics dict per run); a line per seed,
the mean over seeds in black. Off-policy estimates (a task without a simulator) are drawn
as estimates: points with their 95 % interval, titled as FQE estimates, beside the logged
operation's own return.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["figure_panels", "learning_curves", "safety_plot", "save_figure", "sweep_plot"]


def figure_panels(n_panels: int) -> tuple[Any, list[Any]]:
    """A figure of ``n_panels`` panels (up to three a row) in the project's plot style,
    drawn off-screen; returns it and its panels' axes."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib import pyplot as plt

    columns = min(3, n_panels)
    rows = -(-n_panels // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.6 * columns, 3.2 * rows), squeeze=False)
    flat = list(axes.ravel())
    for axis in flat[n_panels:]:
        axis.set_visible(False)
    return figure, flat[:n_panels]


def _runs_lines(axis: Any, steps: np.ndarray, values: np.ndarray, seeds: Sequence[int]) -> None:
    """values: [steps, runs]."""
    marker = "o" if len(steps) < 3 else None  # a lone evaluation is a point, not a line
    for i, seed in enumerate(seeds):
        axis.plot(steps, values[:, i], lw=1, alpha=0.6, marker=marker, label=f"seed {seed}")
    if values.shape[1] > 1:
        axis.plot(steps, np.nanmean(values, axis=1), color="black", lw=1.8, label="mean")
    axis.grid(alpha=0.3)
    axis.set_xlabel("updates")


def save_figure(figure: Any, path: str | Path) -> Path:
    """Writes ``figure`` to ``path`` (folders made), closes it and returns the path."""
    from matplotlib import pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def learning_curves(
    history: Sequence[dict[str, Any]],
    evaluations: Sequence[dict[str, Any]],
    seeds: Sequence[int],
    path: str | Path,
    *,
    title: str = "",
) -> Path:
    """Every training metric per chunk, and the evaluation return, per seed."""
    names = sorted(history[0]["metrics"]) if history else []
    panels = len(names) + (1 if evaluations else 0)
    figure, axes = figure_panels(max(panels, 1))
    steps = np.asarray([entry["updates"] for entry in history])
    for axis, name in zip(axes, names, strict=False):
        values = np.asarray(
            [
                np.asarray(entry["metrics"][name], np.float64).reshape(len(seeds), -1).mean(1)
                for entry in history
            ]
        )
        _runs_lines(axis, steps, values, seeds)
        axis.set_title(name)
    if evaluations and _estimates(evaluations):
        _estimate_panel(axes[len(names)], evaluations, seeds, "return", "return_ci")
        behaviour = evaluations[-1]["runs"][0].get("behaviour_return")
        if behaviour is not None:
            axes[len(names)].axhline(
                behaviour, color="gray", ls=":", lw=1.2, label="logged operation"
            )
        axes[len(names)].set_title("off-policy estimate (FQE): discounted return")
        axes[len(names)].legend(fontsize=7)
    elif evaluations:
        axis = axes[len(names)]
        steps_e = np.asarray([e["updates"] for e in evaluations])
        key = "normalized_return" if "normalized_return" in evaluations[0]["runs"][0] else "return"
        scale = 100.0 if key == "normalized_return" else 1.0
        values = np.asarray([[scale * run[key] for run in e["runs"]] for e in evaluations])
        _runs_lines(axis, steps_e, values, seeds)
        axis.set_title("evaluation: normalized score" if scale != 1.0 else "evaluation: return")
        axis.legend(fontsize=7)
    if title:
        figure.suptitle(title)
    return save_figure(figure, path)


def safety_plot(
    evaluations: Sequence[dict[str, Any]],
    seeds: Sequence[int],
    path: str | Path,
    *,
    title: str = "",
) -> Path | None:
    """Per cost channel the evaluated episode cost over its limit (1 is the limit), the
    shield's override rate and the episodes over a limit. None without evaluations."""
    if not evaluations:
        return None
    first = evaluations[0]["runs"][0]
    channels = sorted(first.get("normalized_cost_per_channel") or {})
    if _estimates(evaluations):
        return _estimated_safety_plot(evaluations, seeds, channels, path, title)
    panels = len(channels) + 2
    figure, axes = figure_panels(panels)
    steps = np.asarray([e["updates"] for e in evaluations])
    for axis, channel in zip(axes, channels, strict=False):
        values = np.asarray(
            [
                [run["normalized_cost_per_channel"][channel] for run in e["runs"]]
                for e in evaluations
            ]
        )
        _runs_lines(axis, steps, values, seeds)
        axis.axhline(1.0, color="red", ls="--", lw=1.2, label="limit")
        axis.set_title(f"{channel}: episode cost / limit")
    for axis, key, label in (
        (axes[len(channels)], "override_rate", "shield overrides (fraction of steps)"),
        (axes[len(channels) + 1], "violation_rate", "episodes over a cost limit (fraction)"),
    ):
        values = np.asarray([[run.get(key, np.nan) for run in e["runs"]] for e in evaluations])
        _runs_lines(axis, steps, values, seeds)
        axis.set_title(label)
        axis.set_ylim(bottom=0)
    axes[0].legend(fontsize=7)
    if title:
        figure.suptitle(title)
    return save_figure(figure, path)


def _estimates(evaluations: Sequence[dict[str, Any]]) -> bool:
    return evaluations[0]["runs"][0].get("estimate") is not None


def _estimate_panel(
    axis: Any, evaluations: Sequence[dict[str, Any]], seeds: Sequence[int], key: str, ci: str
) -> None:
    """The final estimate of each seed's policy with its 95 % interval (estimates are
    made once, at the end of training)."""
    runs = evaluations[-1]["runs"]
    positions = np.arange(len(seeds))
    values = [run.get(key) for run in runs]
    errors = [run.get(ci) or 0.0 for run in runs]
    axis.errorbar(positions, values, yerr=errors, fmt="o", capsize=4, label="estimate ± 95 %")
    axis.set_xticks(positions, [f"seed {seed}" for seed in seeds])
    axis.set_xlim(-0.5, len(seeds) - 0.5)
    axis.grid(alpha=0.3)
    axis.set_xlabel(f"policy after {evaluations[-1]['updates']:,} updates")


def _estimated_safety_plot(
    evaluations: Sequence[dict[str, Any]],
    seeds: Sequence[int],
    channels: list[str],
    path: str | Path,
    title: str,
) -> Path:
    figure, axes = figure_panels(len(channels) + 1)
    runs = evaluations[-1]["runs"]
    positions = np.arange(len(seeds))
    labels = [f"seed {seed}" for seed in seeds]
    for axis, channel in zip(axes, channels, strict=False):
        values = [run["normalized_cost_per_channel"][channel] for run in runs]
        axis.plot(positions, values, "o", label="estimate")
        axis.axhline(1.0, color="red", ls="--", lw=1.2, label="limit")
        axis.set_title(f"{channel}: estimated cost / limit (FQE)")
        axis.set_ylim(bottom=0, top=max(1.2, 1.1 * max(values)))
    overrides = [run.get("override_rate", np.nan) for run in runs]
    axes[len(channels)].bar(positions, overrides, color="tab:orange", alpha=0.8)
    axes[len(channels)].set_title("shield overrides (fraction of held-out states)")
    for axis in axes:
        axis.set_xticks(positions, labels)
        axis.set_xlim(-0.5, len(seeds) - 0.5)
        axis.grid(alpha=0.3)
        axis.set_xlabel(f"policy after {evaluations[-1]['updates']:,} updates")
    axes[0].legend(fontsize=7)
    if title:
        figure.suptitle(title)
    return save_figure(figure, path)


def sweep_plot(table: dict[str, Any], path: str | Path, *, title: str = "") -> Path:
    """A sweep's configurations side by side: the return's mean over seeds with its 95 %
    interval and each seed's value, and (with cost limits) the normalized cost with the
    limit at 1; the chosen configuration is marked, those over the limits are hollow."""
    configurations = table["configurations"]
    has_cost = any("normalized_cost" in c["summary"] for c in configurations)
    figure, axes = figure_panels(2 if has_cost else 1)
    labels = [
        "\n".join(
            f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in c["values"].items()
        )
        for c in configurations
    ]
    x = np.arange(len(configurations))
    estimate = "FQE estimate" if table.get("estimate") == "fqe" else "simulator"
    panels = [("return", f"return ({estimate})")]
    if has_cost:
        panels.append(("normalized_cost", "episode cost / limit"))
    for axis, (key, name) in zip(axes, panels, strict=True):
        for index, configuration in enumerate(configurations):
            stats = configuration["summary"].get(key)
            if stats is None:
                continue
            chosen = index == table["selected"]
            color = "C3" if chosen else "C0"
            face = color if configuration["within_limits"] or not has_cost else "white"
            axis.errorbar(
                index,
                stats["mean"],
                yerr=stats.get("ci") or 0.0,
                fmt="o",
                ms=8,
                color=color,
                mfc=face,
                capsize=4,
                zorder=3,
            )
            seeds = [run.get(key) for run in configuration["runs"]]
            axis.scatter(np.full(len(seeds), index) + 0.12, seeds, s=10, color="gray", zorder=2)
        if key == "normalized_cost":
            axis.axhline(1.0, color="red", ls="--", lw=1.2, label="limit")
            axis.legend(fontsize=7)
        axis.set_xticks(x, labels, fontsize=7)
        axis.set_title(name)
        axis.grid(alpha=0.3)
    axes[0].set_xlabel(f"configuration (red: chosen; grey: seeds {table.get('seeds')})")
    if title:
        figure.suptitle(title)
    return save_figure(figure, path)
