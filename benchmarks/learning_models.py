"""The learning study's model-based runs: a plant model fitted to each dataset of a task
(the project's ``PlantModel``, as ``neorl-industrial model fit`` fits it), and MOPO's
agents of every dataset and seed trained in one compiled program, each stepping its own
dataset's model (the model's elites are traced leaves of the agent's state)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks.harness import progress
from benchmarks.learning_programs import init_states, make_algorithm

__all__ = ["fit_models", "model_based_run", "model_summary"]


def fit_models(
    task: Any,
    model_updates: int,
    note: Callable[[str], None] = progress,
    hidden: Sequence[int] = (),
) -> tuple[list[Any], float]:
    """One plant model per dataset of ``task`` (a ``TaskData``), fitted on the dataset in
    the plant's units with the model's defaults but at most ``model_updates`` updates and,
    when ``hidden`` is given, those hidden layer widths.

    Returns:
        The models and the seconds their fits took.

    Raises:
        ValueError: when the models' layouts differ (their agents could not share one
            program).
    """
    from neorl_industrial.core.environments import make
    from neorl_industrial.core.models import DynamicsConfig
    from neorl_industrial.functional.transformations import action_scaler_for
    from neorl_industrial.wrappers.models import FitSettings, PlantModel

    env, _ = make(task.env_id)
    scaler = action_scaler_for(env)
    started = time.perf_counter()
    models = []
    for quality, dataset, card in zip(task.qualities, task.datasets, task.cards, strict=True):
        plant = (
            dataset if scaler is None else dataset.replace(actions=scaler.unscale(dataset.actions))
        )
        config = DynamicsConfig(hidden=tuple(hidden)) if hidden else None
        model = PlantModel(card.task(plant), config, definitions=card.definitions)
        note(f"plant model {task.env_id}-{quality}: at most {model_updates} updates")
        model.fit(plant, FitSettings(max_updates=model_updates), dataset_name=quality)
        models.append(model)
    layouts = {repr(model.dynamics.layout) for model in models}
    if len(layouts) > 1:
        raise ValueError(
            f"{task.env_id}: the datasets' plant models differ in layout (known and learned "
            "channels); their agents cannot train in one program"
        )
    return models, time.perf_counter() - started


def model_based_run(
    name: str,
    task: Any,
    hidden: Sequence[int],
    n_updates: int,
    n_seeds: int,
    scalings: Sequence[Any],
    models: Sequence[Any],
    overrides: Any = None,
) -> tuple[Any, Any]:
    """The algorithm ``name`` stepping ``models`` (one per dataset, the datasets' reward
    scalings applied to their rewards, shielded by the task's constraints) and its fresh
    states with leading axes ``[dataset, seed]``, each dataset's agents with its model."""
    import jax
    import jax.numpy as jnp

    from neorl_industrial.core.agents.mopo import ModelState
    from neorl_industrial.wrappers.training.model_based import model_handle

    handles = [
        model_handle(model, reward_scaling=scaling)
        for model, scaling in zip(models, scalings, strict=True)
    ]
    algorithm = make_algorithm(
        name, task.obs_size, task.action_size, hidden, n_updates, overrides, model=handles[0]
    )
    states = init_states(algorithm, task.normalizers, n_seeds)
    per_dataset = jax.tree.map(
        lambda *leaves: jnp.stack(leaves), *[ModelState.of(handle) for handle in handles]
    )
    n_datasets = len(handles)
    model = jax.tree.map(
        lambda leaf: jnp.broadcast_to(leaf[:, None], (n_datasets, n_seeds, *leaf.shape[1:])),
        per_dataset,
    )
    states = states.replace(agent=states.agent.replace(model=model))
    return algorithm, states


def model_summary(models: Sequence[Any]) -> list[dict[str, Any]]:
    """Per model its hidden widths, the fit's updates and, on its held-out episodes, the
    mean over features of the one-step error relative to each feature's spread and the
    90 % interval's coverage (the model card's fidelity table), for the record."""
    rows = []
    for model in models:
        one_step = [
            row for row in model.fidelity_rows if row["kind"] == "observation" and row["step"] == 1
        ]
        relative = [row["relative_rmse"] for row in one_step if row["relative_rmse"] is not None]
        coverage = [row["coverage"] for row in one_step if row["coverage"] is not None]
        rows.append(
            {
                "hidden": list(model.config.hidden),
                "updates": model.card["fit"]["updates"],
                "fit_s": model.card["fit"]["seconds"],
                "one_step_relative_rmse": float(np.mean(relative)) if relative else None,
                "one_step_coverage": float(np.mean(coverage)) if coverage else None,
            }
        )
    return rows
