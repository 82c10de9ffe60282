"""A plant model's fidelity: open loop on logged episodes (by default the held-out ones),
and, where the task has a simulator, against it on episodes of uniformly random actions."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from neorl_industrial.core.environments import TaskError
from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.functional.transformations.dynamics_fidelity import (
    fidelity_table,
    open_loop,
    open_loop_windows,
)
from neorl_industrial.functional.transformations.dynamics_memory import (
    memory_table,
    one_step_errors,
)
from neorl_industrial.wrappers.models.model_files import PlantModelError
from neorl_industrial.wrappers.models.model_programs import predict_program
from neorl_industrial.wrappers.models.outside_data import OutsideDataWarning

#: The level of the fidelity intervals (the share of logged values inside).
LEVEL = 0.9


def open_loop_fidelity(
    model: Any,
    dataset: Dataset,
    *,
    episodes: Sequence[int] | None = None,
    seed: int = 0,
    horizon: int | None = None,
    checked: bool = False,
) -> dict[str, Any]:
    """Open-loop fidelity of ``model`` (``PlantModel.fidelity``) on ``episodes`` of
    ``dataset`` (plant units; by default the held-out episodes of the data the model was
    fitted on, which ``dataset`` must then be): errors at 1, 10 and ``horizon`` steps per
    feature, and the share of logged values inside the ensemble's 90 % interval (the
    features the model takes from the log, its exogenous ones, marked ``given``); and
    ``memory``: the share of each feature's one-step error the earlier steps explain
    (:func:`~neorl_industrial.functional.transformations.dynamics_memory.memory_table`).

    Raises:
        PlantModelError: when no episode is long enough for one window, or (default
            episodes) ``dataset`` is not the fitted one.
    """
    model._require_fitted("fidelity")
    settings = model.card["settings"]
    if episodes is None:
        if not checked:
            model.check_same_data(dataset)
        episodes = model.card["dataset"]["holdout_episodes"]
    else:
        model.check_dataset(dataset)
    held = model._unit_actions(dataset).select_episodes(np.asarray(episodes, np.int64))
    longest = int(np.asarray(jax.device_get(held.episode_lengths)).max())
    horizon = min(int(horizon or settings["horizon"]), longest)
    starts = open_loop_windows(held, horizon, settings["windows"])
    run = open_loop(
        model.dynamics,
        model.params(seed),
        held,
        starts,
        horizon,
        jax.random.PRNGKey(seed),
        n_samples=settings["samples"],
    )
    model._open_loop = run
    steps = sorted({step for step in (1, 10, horizon) if step <= horizon})
    frame = model.dynamics.layout.frame_size
    names = list(model.task.observation_names[:frame])
    spread = dataset.observation_moments()[1][:frame]  # 0 for a constant feature
    signal_names = ["reward", *model.task.cost_names]
    flat_signals = np.concatenate(
        [
            np.asarray(jax.device_get(dataset.rewards))[:, None],
            np.asarray(jax.device_get(dataset.costs)),
        ],
        axis=1,
    )
    rows = fidelity_table(
        run,
        names,
        spread,
        signal_names,
        flat_signals.std(axis=0),
        steps,
        LEVEL,
        given=model.dynamics.layout.given_mask(),
    )
    units = dict(zip(model.task.observation_names, model.task.observation_units, strict=True))
    for row in rows:
        row["unit"] = units.get(row["name"]) if row["kind"] == "observation" else None
    # The one-step point prediction the model's ``predict`` compiles (shared with it).
    program = model._program(("predict",), lambda: predict_program(model.dynamics))
    params = model.params(seed)
    errors = one_step_errors(
        lambda observations, actions: program(params, observations, actions)["next_observation"],
        held,
    )
    return {
        "episodes": [int(e) for e in episodes],
        "windows": len(starts),
        "horizon": horizon,
        "steps": steps,
        "level": LEVEL,
        "rows": rows,
        "memory": memory_table(errors, held, names, model.dynamics.layout.given_mask()),
    }


def simulator_fidelity(
    model: Any, *, episodes: int = 16, seed: int = 0, horizon: int | None = None
) -> dict[str, Any]:
    """Where the task has a simulator (``PlantModel.simulator_fidelity``): the open-loop
    fidelity of ``model`` against it, on episodes of uniformly random actions (states the
    behaviour data rarely or never visited), with the share of their observations outside
    the data's range.

    Raises:
        PlantModelError: when the task has no simulator.
    """
    from neorl_industrial.core.environments.rollout import rollout, uniform_random_policy

    model._require_fitted("simulator_fidelity")
    try:
        env, params = model.task.make_simulator()
    except TaskError as error:
        raise PlantModelError(str(error)) from None
    steps = int(horizon or model.card["settings"]["horizon"])
    result = jax.jit(
        lambda key: rollout(
            key, env, params, uniform_random_policy(env), episodes, steps, record=True
        )
    )(jax.random.PRNGKey(seed))
    data = Dataset.from_rollout(result.transitions, name=f"{model.task.name} simulator")
    held_out_run = model._open_loop  # the plot stays that of the held-out episodes
    fidelity = model.fidelity(data, episodes=np.arange(data.n_episodes), seed=0)
    model._open_loop = held_out_run
    observations = np.asarray(jax.device_get(data.transition_observations()))
    actions = np.asarray(jax.device_get(data.actions)).reshape(data.n_transitions, -1)
    with warnings.catch_warnings():  # random actions leave the data by design
        warnings.simplefilter("ignore", OutsideDataWarning)
        outside = model.predict(observations, actions)["outside_data"]
    measured = fidelity | {
        "source": f"simulator {model.task.env_id}, uniformly random actions",
        "outside_data_share": float(np.mean(outside)),
    }
    model.card["simulator_fidelity"] = measured
    return measured
