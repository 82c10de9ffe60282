"""A plant model's files: the card (``model.json``), the parameters (``params.msgpack``)
and the plot (``trajectories.png``), written atomically and read back with every part
checked; and the card's record of the physical ranges a prediction is held to."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from neorl_industrial.core.environments import Task
from neorl_industrial.core.models import (
    Dynamics,
    DynamicsConfig,
    DynamicsLayout,
    DynamicsParams,
    KnownSignals,
    make_dynamics,
)
from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.wrappers.hostio import (
    read_saved_json,
    read_saved_tree,
    to_json_data,
    write_directory_atomic,
)

FORMAT = "neorl-industrial-plant-model/1"
CARD = "model.json"
PARAMS = "params.msgpack"
PLOT = "trajectories.png"


class PlantModelError(ValueError):
    """A plant model that cannot be fitted, loaded or used as asked: names what and why."""


def save_model(
    model: Any, path: str | Path, *, overwrite: bool = False, plots: bool = True
) -> Path:
    """:meth:`PlantModel.save <.plant_model.PlantModel.save>` of ``model``."""
    model._require_fitted("save")
    card = json.dumps(to_json_data(model.card), indent=2, allow_nan=False)
    files = {
        CARD: card.encode(),
        PARAMS: serialization.to_bytes(jax.device_get(model._params)),
    }
    if plots and model._open_loop is not None:
        files[PLOT] = model.trajectory_plot()
    return write_directory_atomic(
        path,
        files,
        marker=CARD,
        what="a saved plant model",
        overwrite=overwrite,
        refused=PlantModelError,
    )


def load_model(
    cls: Any,
    path: str | Path,
    *,
    dataset: Dataset | None = None,
    task: Task | None = None,
    dataset_name: str = "dataset",
) -> Any:
    """:meth:`PlantModel.load <.plant_model.PlantModel.load>` for the class ``cls``."""
    path = Path(path)
    card_path = path / CARD
    card = read_saved_json(
        path, CARD, what="a saved plant model", expected_format=FORMAT, refused=PlantModelError
    )
    try:
        saved_task = Task.from_dict(card["task"], f"{card_path}: task")
        config = DynamicsConfig.create(**card["config"])
        saved = card["layout"]
        layout = DynamicsLayout(
            observation_size=int(saved["observation_size"]),
            frame_size=int(saved["frame_size"]),
            action_size=int(saved["action_size"]),
            n_costs=int(saved["n_costs"]),
            known=KnownSignals.from_dict(saved["known"]),
            terminals=bool(saved["terminals"]),
            given=tuple(int(i) for i in saved.get("given", ())),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise PlantModelError(f"{card_path}: malformed ({error})") from None
    model = cls(
        saved_task,
        config,
        definitions=card.get("definitions") or {},
        reward_row=card.get("reward_row"),
    )
    model.dynamics = make_dynamics(config, layout)
    model.card = card
    template = _template(model.dynamics, len(card["settings"]["seeds"]), config.n_elites)

    def restore(data: bytes) -> Any:
        state = serialization.msgpack_restore(data)
        # Models saved before the physical bounds were kept: the card's bounds.
        for name, value in _saved_bounds(card, layout).items():
            state.setdefault(name, value)
        return serialization.from_state_dict(template, state)

    params = read_saved_tree(path / PARAMS, restore, PlantModelError)
    model._params = jax.tree.map(jnp.asarray, params)
    if dataset is not None:
        model.check_same_data(dataset, name=dataset_name, task=task)
    elif task is not None:
        model.check_task(task, name=dataset_name)
    return model


def physical_ranges(task: Task, stats: DynamicsParams) -> dict[str, Any]:
    """The card's ``physics``: per predicted feature the range a prediction is held to
    and where it comes from (``schema``, or ``data`` where the schema gives no finite
    bound: the data's range is used), and the learned signals' ranges from the data."""
    frame_low = np.asarray(jax.device_get(stats.frame_low), np.float64)
    frame_high = np.asarray(jax.device_get(stats.frame_high), np.float64)
    features = {}
    for i, low in enumerate(frame_low):
        schema = (task.observation_low[i], task.observation_high[i])
        sources = ["schema" if np.isfinite(bound) else "data" for bound in schema]
        features[task.observation_names[i]] = {
            "low": float(low),
            "high": float(frame_high[i]),
            "source": sources[0] if sources[0] == sources[1] else "/".join(sources),
        }
    from_data = [name for name, entry in features.items() if "data" in entry["source"]]
    return {
        "features": features,
        "from_data": from_data,
        "note": (
            f"no physical range in the schema for {', '.join(from_data)}: the data's range is used"
            if from_data
            else None
        ),
        "reward": [float(stats.reward_low), float(stats.reward_high)],
        "cost_high": [float(x) for x in np.asarray(jax.device_get(stats.cost_high))],
    }


def _saved_bounds(card: dict[str, Any], layout: DynamicsLayout) -> dict[str, np.ndarray]:
    """The bounds of a model saved before they were part of its parameters: the frame's
    from the card's ``physics`` or, without it, the data's range; learned signals
    unbounded."""
    frame = layout.frame_size
    features = list((card.get("physics") or {}).get("features", {}).values())
    if len(features) == frame:
        low = np.asarray([f["low"] for f in features], np.float32)
        high = np.asarray([f["high"] for f in features], np.float32)
    else:
        low = np.full(frame, -np.inf, np.float32)
        high = np.full(frame, np.inf, np.float32)
    return {
        "frame_low": low,
        "frame_high": high,
        "cost_high": np.full(layout.n_costs, np.inf, np.float32),
        "reward_low": np.asarray(-np.inf, np.float32),
        "reward_high": np.asarray(np.inf, np.float32),
    }


def _template(dynamics: Dynamics, n_seeds: int, n_elites: int) -> DynamicsParams:
    layout = dynamics.layout
    keys = jax.random.split(jax.random.PRNGKey(0), n_seeds * n_elites).reshape(
        n_seeds, n_elites, -1
    )
    networks = jax.eval_shape(jax.vmap(jax.vmap(dynamics.init)), keys)
    networks = jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), networks)
    obs, target, act = layout.observation_size, layout.target_size, layout.action_size
    zeros = np.zeros
    return DynamicsParams(
        networks=networks,
        obs_mean=zeros(obs, np.float32),
        obs_std=zeros(obs, np.float32),
        target_mean=zeros(target, np.float32),
        target_std=zeros(target, np.float32),
        target_fixed=zeros(target, bool),
        cost_low=zeros(layout.n_costs, np.float32),
        obs_low=zeros(obs, np.float32),
        obs_high=zeros(obs, np.float32),
        policy_action_low=zeros(act, np.float32),
        policy_action_high=zeros(act, np.float32),
        action_low=zeros(act, np.float32),
        action_high=zeros(act, np.float32),
        frame_low=zeros(layout.frame_size, np.float32),
        frame_high=zeros(layout.frame_size, np.float32),
        cost_high=zeros(layout.n_costs, np.float32),
        reward_low=zeros((), np.float32),
        reward_high=zeros((), np.float32),
    )
