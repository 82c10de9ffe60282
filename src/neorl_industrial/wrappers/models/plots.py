"""PNG plots of a plant model's fidelity (matplotlib, no display): the model's open-loop
predictions of held-out windows beside the logged trajectories, in the plant's units."""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np

from neorl_industrial.functional.transformations.dynamics_fidelity import OpenLoop

__all__ = ["trajectory_plot"]

#: Panels drawn at most (features first, then reward and costs).
MAX_PANELS = 9


def trajectory_plot(
    run: OpenLoop,
    feature_names: Sequence[str],
    feature_units: Sequence[str | None],
    signal_names: Sequence[str],
    *,
    windows: int = 2,
    level: float = 0.9,
    title: str = "",
) -> bytes:
    """A PNG: per feature (and reward and cost channel), ``windows`` held-out windows as
    logged (black) and as the model predicts them open loop from their first observation
    under the logged actions (the ensemble's mean, and its ``level`` interval shaded)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib import pyplot as plt

    panels: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]] = []
    for i, name in enumerate(feature_names):
        unit = feature_units[i] if i < len(feature_units) else None
        label = f"{name} [{unit}]" if unit else str(name)
        panels.append((label, run.truth[..., i], run.point[..., i], run.particles[..., i]))
    for i, name in enumerate(signal_names):
        panels.append(
            (
                str(name),
                run.signal_truth[..., i],
                run.signal_point[..., i],
                run.signal_particles[..., i],
            )
        )
    panels = panels[:MAX_PANELS]
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.6 * columns, 3.2 * rows), squeeze=False)
    flat = list(axes.ravel())
    for axis in flat[len(panels) :]:
        axis.set_visible(False)
    # Windows that run the whole horizon inside their episode, evenly spread (any if none).
    whole = np.flatnonzero(run.valid[:, -1])
    candidates = whole if len(whole) else np.arange(len(run.starts))
    chosen = candidates[np.unique(np.linspace(0, len(candidates) - 1, windows).round().astype(int))]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    low_q, high_q = (1.0 - level) / 2.0, (1.0 + level) / 2.0
    for axis, (label, truth, point, particles) in zip(flat, panels, strict=False):
        for n, window in enumerate(chosen):
            length = int(run.valid[window].sum())
            steps = np.arange(1, length + 1)
            colour = colours[n % len(colours)]
            axis.fill_between(
                steps,
                np.quantile(particles[window, :, :length], low_q, axis=0),
                np.quantile(particles[window, :, :length], high_q, axis=0),
                color=colour,
                alpha=0.2,
                lw=0,
            )
            axis.plot(
                steps, point[window, :length], color=colour, lw=1.4, label=f"model, window {n}"
            )
            axis.plot(steps, truth[window, :length], color="black", lw=1, ls="--", label="logged")
        axis.set_title(label, fontsize=9)
        axis.set_xlabel("steps ahead")
        axis.grid(alpha=0.3)
    flat[0].legend(fontsize=7)
    if title:
        figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    return buffer.getvalue()
