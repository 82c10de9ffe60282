"""Which history a plant log needs: the same log imported with a few ``history`` settings,
a plant model fitted on each, and each judged by its open-loop error over the long horizon
on the held-out episodes.

    report = compare_histories(load, (1, 3, 10), FitSettings())
    report["choice"]            # the history to set in the schema
    report["rows"]              # per history: the errors at 1, 10 and the horizon

``load(history)`` gives ``(dataset, task, definitions, reward_row)`` of the log imported
with that history (``load_plant_log(..., history=H)``). Every model is fitted with the same
settings on the same training episodes and scored on the same held-out ones.

Why the long horizon: a slow hidden drift (an unmeasured feed composition) explains little
of a one-step error, so neither the one-step error nor the memory check sees it, but a
model that cannot tell it drifts away from the log over many steps, and so do the rollouts
a verdict judges candidates on. A transport delay shows at both.

The choice is the shortest history whose long-horizon error is within
:data:`HISTORY_MARGIN` of the lowest: a longer one must earn its rows (each row more gives
the policies more inputs and the model more to fit from the same episodes).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from neorl_industrial.core.environments import Task
from neorl_industrial.core.models import DynamicsConfig
from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.wrappers.models.model_data import FitSettings
from neorl_industrial.wrappers.models.model_files import PlantModelError
from neorl_industrial.wrappers.models.plant_model import PlantModel

__all__ = ["HISTORY_MARGIN", "choose_history", "compare_histories", "fidelity_errors"]

#: A longer history is chosen only when its long-horizon error is lower than every shorter
#: one's by more than this share of the lowest error.
HISTORY_MARGIN = 0.10

#: ``load(history) -> (dataset, task, definitions, reward_row)``.
Loader = Callable[[int], tuple[Dataset, Task, Mapping[str, str] | None, str | None]]


def fidelity_errors(fidelity: Mapping[str, Any]) -> dict[int, dict[str, float | None]]:
    """Per step of a fidelity report (``PlantModel.fidelity``): the mean over the features
    the model predicts (not those taken from the log) of the error relative to each
    feature's spread, and of the interval's coverage. A feature with no spread (constant
    in the data) has no relative error and is left out."""
    out: dict[int, dict[str, float | None]] = {}
    for step in fidelity["steps"]:
        rows = [
            row
            for row in fidelity["rows"]
            if row["kind"] == "observation" and row["step"] == step and not row.get("given")
        ]
        relative = [row["relative_rmse"] for row in rows if row["relative_rmse"] is not None]
        coverage = [row["coverage"] for row in rows if row["coverage"] is not None]
        out[int(step)] = {
            "relative_rmse": float(np.mean(relative)) if relative else None,
            "coverage": float(np.mean(coverage)) if coverage else None,
        }
    return out


def choose_history(errors: Mapping[int, float], margin: float = HISTORY_MARGIN) -> int:
    """The shortest history whose error is at most ``(1 + margin)`` times the lowest.

    Raises:
        PlantModelError: without an error to compare, or for an error that is not a
            finite number >= 0 (named by its history).
    """
    if not errors:
        raise PlantModelError("history check: no history has a long-horizon error to compare")
    for history, error in errors.items():
        if not (np.isfinite(error) and error >= 0):
            raise PlantModelError(
                f"history check: history {history} has no finite long-horizon error ({error})"
            )
    lowest = min(errors.values())
    return min(history for history, error in errors.items() if error <= (1 + margin) * lowest)


def _histories(histories: Sequence[int]) -> tuple[int, ...]:
    chosen = tuple(histories)
    if len(chosen) < 2:
        raise PlantModelError(
            f"history check: expected at least two histories to compare, got {list(chosen)}"
        )
    for history in chosen:
        if type(history) is not int or history < 1:
            raise PlantModelError(
                f"history check: histories must be whole numbers >= 1, got {history!r}"
            )
    if len(set(chosen)) != len(chosen):
        raise PlantModelError(f"history check: a history is given twice in {list(chosen)}")
    return tuple(sorted(chosen))


def compare_histories(
    load: Loader,
    histories: Sequence[int],
    settings: FitSettings | None = None,
    config: DynamicsConfig | None = None,
    *,
    dataset_name: str = "dataset",
    progress: Callable[[str], None] | None = None,
    keep_models: bool = False,
) -> dict[str, Any]:
    """Fits one plant model per history and chooses the history (see the module).

    Returns:
        ``{"histories", "horizon", "heldout_episodes", "rows", "choice", "rule",
        "margin"}``; each row: ``history``, ``errors`` (per step: relative error and
        coverage), ``long_horizon_error``, ``updates``, ``seconds``. With
        ``keep_models``, ``"models"`` maps each history to its fitted ``PlantModel``
        (not part of the report's JSON).

    Raises:
        PlantModelError: for fewer than two histories or a bad one, too few episodes for
            the held-out split, held-out episodes too short for the horizon's windows, or
            no predicted feature to compare (named).
    """
    settings = settings or FitSettings()
    chosen = _histories(histories)
    rows: list[dict[str, Any]] = []
    models: dict[int, PlantModel] = {}
    held_out: list[int] | None = None
    horizon: int | None = None
    for history in chosen:
        if progress is not None:
            progress(f"history {history}: fitting the plant model")
        started = time.perf_counter()
        dataset, task, definitions, reward_row = load(history)
        model = PlantModel(task, config, definitions=definitions, reward_row=reward_row)
        card = model.fit(dataset, settings, dataset_name=f"{dataset_name} (history {history})")
        episodes = [int(e) for e in card["dataset"]["holdout_episodes"]]
        if held_out is not None and episodes != held_out:  # the loader changed the episodes
            raise PlantModelError(
                f"history check: history {history} holds out episodes {episodes}, the others "
                f"{held_out}: the log must give the same episodes whatever the history"
            )
        held_out = episodes
        fidelity = card["fidelity"]
        horizon = int(fidelity["horizon"])
        errors = fidelity_errors(fidelity)
        rows.append(
            {
                "history": history,
                "errors": {str(step): value for step, value in errors.items()},
                "long_horizon_error": errors[horizon]["relative_rmse"],
                "updates": int(card["fit"]["updates"]),
                "seconds": time.perf_counter() - started,
            }
        )
        if keep_models:
            models[history] = model
    missing = [row["history"] for row in rows if row["long_horizon_error"] is None]
    if missing:
        raise PlantModelError(
            f"history check: no predicted feature varies in the data (histories {missing}); "
            "nothing to compare"
        )
    choice = choose_history({row["history"]: row["long_horizon_error"] for row in rows})
    report: dict[str, Any] = {
        "histories": list(chosen),
        "horizon": horizon,
        "heldout_episodes": held_out,
        "rows": rows,
        "choice": choice,
        "margin": HISTORY_MARGIN,
        "rule": (
            f"the shortest history whose open-loop error at {horizon} steps on the held-out "
            f"episodes is within {HISTORY_MARGIN * 100:.0f} % of the lowest"
        ),
    }
    if keep_models:
        report["models"] = models
    return report
