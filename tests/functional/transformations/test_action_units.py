"""The low-level route warns when plant-unit actions meet a [-1, 1] policy."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from neorl_industrial.core.agents import BCConfig, make_bc
from neorl_industrial.functional.state_management import ActionScaler, Dataset
from neorl_industrial.functional.transformations import train_offline
from neorl_industrial.functional.transformations.offline import Schedule


def _plant_data(scale: float) -> Dataset:
    rng = np.random.default_rng(0)
    episodes = [
        {
            "observations": rng.normal(size=(9, 3)),
            "actions": scale * rng.random((8, 2)),
            "rewards": rng.normal(size=8),
            "costs": np.zeros((8, 1)),
            "terminated": False,
        }
        for _ in range(2)
    ]
    return Dataset.from_episodes(episodes)


def test_actions_in_plant_units_get_a_warning_naming_the_range_and_the_fix():
    algorithm = make_bc(BCConfig(hidden=(8,)), 3, 2)
    with pytest.warns(UserWarning, match=r"actions range over \[.*\].*ActionScaler"):
        train_offline(
            algorithm,
            _plant_data(100.0),
            schedule=Schedule(n_updates=10, chunk_updates=10, batch_size=8),
        )
    scaler = ActionScaler.create([0.0, 0.0], [100.0, 100.0])
    plant = _plant_data(100.0)
    scaled = plant.replace(actions=scaler.scale(plant.actions))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train_offline(
            algorithm,
            scaled,
            schedule=Schedule(n_updates=10, chunk_updates=10, batch_size=8),
        )
