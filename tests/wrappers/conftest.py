"""Small Industrial Benchmark-shaped data for the stateful layer's tests."""

from __future__ import annotations

import numpy as np
import pytest

from neorl_industrial.functional.state_management import Dataset


def ib_shaped_dataset(episodes: int = 4, steps: int = 50, seed: int = 0) -> Dataset:
    """Random data with IB-v0's spaces (180 observation features, 3 actions, 2 costs)."""
    rng = np.random.default_rng(seed)
    n = episodes * steps
    actions = rng.uniform(-1, 1, (n, 3)).astype(np.float32)
    return Dataset.from_arrays(
        observations=rng.normal(50, 20, (n + episodes, 180)).astype(np.float32),
        actions=actions,
        rewards=(-200 - 30 * actions[:, 0] ** 2).astype(np.float32),
        costs=(rng.uniform(0, 1, (n, 2)) < 0.2).astype(np.float32),
        terminals=np.zeros(n, bool),
        timeouts=np.tile(np.arange(steps) == steps - 1, episodes),
        episode_lengths=np.full(episodes, steps),
    )


@pytest.fixture(scope="session")
def ib_data() -> Dataset:
    return ib_shaped_dataset()
