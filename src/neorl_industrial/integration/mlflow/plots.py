"""PNG plots of a training run (matplotlib, no display): learning curves and safety.

Both take the Trainer's history (one entry per chunk: ``updates`` and the mean metrics
per run) and evaluations (``updates`` and one metrics dict per run); a line per seed,
the mean over seeds in black.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["learning_curves", "safety_plot"]


def _figure(n_panels: int) -> tuple[Any, list[Any]]:
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
    for i, seed in enumerate(seeds):
        axis.plot(steps, values[:, i], lw=1, alpha=0.6, label=f"seed {seed}")
    if values.shape[1] > 1:
        axis.plot(steps, np.nanmean(values, axis=1), color="black", lw=1.8, label="mean")
    axis.grid(alpha=0.3)
    axis.set_xlabel("updates")


def _save(figure: Any, path: str | Path) -> Path:
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
    figure, axes = _figure(max(panels, 1))
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
    if evaluations:
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
    return _save(figure, path)


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
    panels = len(channels) + 2
    figure, axes = _figure(panels)
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
    return _save(figure, path)
