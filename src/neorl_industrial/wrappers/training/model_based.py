"""Model-based agents (MOPO, MOPO-Lag) built with a fitted plant model.

The registry's factories of model-based algorithms take the model as ``model=``
(:class:`~neorl_industrial.core.agents.mopo.ModelHandle`); this module makes that handle
from a :class:`~neorl_industrial.wrappers.models.PlantModel` (its elites, the run's
reward scaling, the task's shield) after checking that model and data belong together,
and trains such an agent on a dataset (with or without a simulator).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from neorl_industrial.core.agents import ObservationNormalizer
from neorl_industrial.core.agents.mopo import ModelHandle
from neorl_industrial.core.agents.registry import (
    HyperparameterError,
    algorithm_entry,
    validate_hyperparameters,
)
from neorl_industrial.core.agents.types import Algorithm
from neorl_industrial.core.safety.contract import SafetyContract
from neorl_industrial.functional.state_management import Dataset, RewardScaling
from neorl_industrial.functional.transformations.offline import Schedule, train_offline

__all__ = ["build_model_based", "model_handle", "train_model_based"]


def model_handle(
    plant_model: Any,
    *,
    seed: int = 0,
    reward_scaling: RewardScaling | None = None,
    shielded: bool = True,
    constraints: Any = None,
) -> ModelHandle:
    """The handle a model-based algorithm steps: ``plant_model``'s elites of fit seed
    ``seed``, the run's reward scaling (None: rewards as logged) and the shield's
    constraints (``constraints`` compiled, else the task's own when ``shielded``).

    Raises:
        ValueError: for a model that is not fitted.
    """
    if not plant_model.fitted:
        raise ValueError("plant_model: not fitted; fit it (or load a saved one) first")
    if constraints is None and shielded:
        constraints = plant_model.task.compile_constraints()
    return ModelHandle(
        dynamics=plant_model.dynamics,
        params=plant_model.params(seed),
        reward_shift=0.0 if reward_scaling is None else float(reward_scaling.shift),
        reward_scale=1.0 if reward_scaling is None else float(reward_scaling.scale),
        constraints=constraints,
    )


def build_model_based(
    name: str,
    obs_size: int,
    action_size: int,
    hyperparameters: Mapping[str, Any] | None,
    model: ModelHandle,
    contract: SafetyContract | None = None,
) -> tuple[Algorithm, Any]:
    """``(algorithm, config)`` of the registered model-based algorithm ``name`` stepping
    ``model`` (as ``build_algorithm``, with the model handed in; a cost-aware one's limits
    are ``contract``'s when it is given).

    Raises:
        HyperparameterError: for an algorithm that is not model-based, or hyperparameters
            that do not fit.
    """
    entry = algorithm_entry(name)
    if not entry.model_based:
        raise HyperparameterError(
            f"algorithm: {entry.name!r} is not model-based; build it with build_algorithm"
        )
    config = validate_hyperparameters(name, hyperparameters, contract)
    return entry.factory(config, obs_size, action_size, model=model), config


def train_model_based(
    name: str,
    dataset: Dataset,
    plant_model: Any,
    *,
    hyperparameters: Mapping[str, Any] | None = None,
    seeds: Sequence[int] = (0,),
    schedule: Schedule | None = None,
    model_seed: int = 0,
    shielded: bool = True,
) -> tuple[Algorithm, Any, Any, list[dict[str, Any]]]:
    """Trains the model-based algorithm ``name`` on ``dataset`` (actions in plant units,
    as the plant model was fitted on) with ``plant_model``, every seed at once.

    The dataset's actions are scaled to [-1, 1] by the model's task's action scaler;
    rewards are scaled as the registry says for
    the algorithm, for the real batches and the model's rewards alike; observations are
    normalized with the dataset's statistics.

    ``schedule``: the updates per seed, per compiled chunk, and the batch size (None:
    10,000 updates in chunks of 1,000, batches of 256).

    Returns:
        ``(algorithm, config, state with a leading seed axis, history per chunk)``.

    Raises:
        PlantModelError: when the model was fitted on other data or another task.
    """
    plant_model.check_dataset(dataset)
    entry = algorithm_entry(name)
    scaling = RewardScaling.fit(dataset, entry.reward_scaling)
    training = scaling.apply(dataset)
    if plant_model.scaler is not None:
        training = training.replace(actions=plant_model.scaler.scale(training.actions))
    normalizer = ObservationNormalizer.create(*dataset.observation_moments())
    values = {
        **dict(hyperparameters or {}),
        "obs_mean": np.asarray(normalizer.mean, np.float32).tolist(),
        "obs_std": np.asarray(normalizer.std, np.float32).tolist(),
    }
    handle = model_handle(plant_model, seed=model_seed, reward_scaling=scaling, shielded=shielded)
    algorithm, config = build_model_based(
        name, dataset.observation_size, dataset.action_size, values, handle
    )
    state, history = train_offline(
        algorithm,
        training,
        schedule or Schedule(n_updates=10_000),
        seeds=list(seeds),
    )
    return algorithm, config, state, history
