"""The heater plant logs the verdict's tests judge candidates on: a log and its schema
imported as a user would, a small plant model fitted on it, and the linear valve
controllers the candidates are."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

from neorl_industrial.core.models import DynamicsConfig
from neorl_industrial.functional.state_management import ActionScaler
from neorl_industrial.integration.datasets import load_any, load_plant_log
from neorl_industrial.wrappers.models import FitSettings, PlantModel
from neorl_industrial.wrappers.models.history_check import compare_histories


def act(params, observation, key=None, deterministic=True):
    """``valve = 50 + gain (350 - T) + bias``, in the policy's [-1, 1]."""
    del key, deterministic
    valve = 50.0 + params["gain"] * (350.0 - observation[0]) + params["bias"]
    return jnp.clip(valve / 50.0 - 1.0, -1.0, 1.0)[None]


def write_csv(path: Path, seconds: Any, columns: dict[str, Any]) -> None:
    """A plant log at ``path``: a ``time`` column ``seconds`` after 2024-03-01 00:00 and
    ``columns`` by name."""
    time = pa.array(np.datetime64("2024-03-01T00:00:00", "s") + np.asarray(seconds))
    pcsv.write_csv(pa.table({"time": time, **columns}), path)


#: The tests' plant model: small, fitted briefly.
CONFIG = DynamicsConfig(hidden=(32, 32), n_members=3, n_elites=3)
FIT = FitSettings(max_updates=1000, chunk_updates=500, batch_size=64, horizon=10, windows=16)


def _plant(task: Any, dataset: Any, model: PlantModel) -> dict[str, Any]:
    """The fitted plant's parts the tests use: the task's action scaler and the held-out
    episodes with their actions in [-1, 1]."""
    scaler = ActionScaler.create(task.action_low, task.action_high, task.action_names)
    heldout = dataset.select_episodes(np.asarray(model.card["dataset"]["holdout_episodes"]))
    heldout = heldout.replace(actions=scaler.scale(heldout.actions))
    return {"task": task, "dataset": dataset, "model": model, "scaler": scaler, "heldout": heldout}


def fitted_plant(root: Path, schema: str, write_log: Callable[[Path], Any]) -> dict[str, Any]:
    """The log ``write_log`` writes and ``schema`` imported from ``root``, a plant model
    of 3 members fitted on it with a held-out quarter, the task's action scaler, and the
    held-out episodes with their actions in [-1, 1]."""
    write_log(root / "log.csv")
    (root / "schema.yaml").write_text(textwrap.dedent(schema))
    dataset, card = load_any(root / "log.csv", schema=root / "schema.yaml")
    task = card.task(dataset)
    model = PlantModel(task, CONFIG, definitions=card.definitions)
    model.fit(dataset, FIT, dataset_name=card.name)
    return _plant(task, dataset, model)


def fitted_histories(
    root: Path, schema: str, write_log: Callable[[Path], Any], histories: tuple[int, ...]
) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """The log imported with each of ``histories`` and compared by the product's history
    check (``compare_histories``, the models as :func:`fitted_plant` fits them): the
    check's report and, per history, the plant as :func:`fitted_plant` gives it."""
    write_log(root / "log.csv")
    (root / "schema.yaml").write_text(textwrap.dedent(schema))
    loaded: dict[int, tuple[Any, Any]] = {}

    def load(history: int) -> tuple[Any, Any, dict[str, str], str | None]:
        dataset, card = load_plant_log(root / "log.csv", root / "schema.yaml", history=history)
        loaded[history] = dataset, card.task(dataset)
        return dataset, loaded[history][1], card.definitions, card.reward_row

    report = compare_histories(load, histories, FIT, CONFIG, keep_models=True)
    models = report.pop("models")
    plants = {h: _plant(loaded[h][1], loaded[h][0], models[h]) for h in histories}
    return report, plants
