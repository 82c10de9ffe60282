"""Tests of the dataset formats, and the small datasets they share."""

from __future__ import annotations

import jax
import numpy as np

from neorl_industrial.functional.state_management import Dataset


def make_dataset(
    lengths: tuple[int, ...] = (5, 3, 7),
    *,
    obs_size: int = 4,
    action_size: int = 2,
    n_costs: int = 2,
    discrete: bool = False,
    seed: int = 0,
) -> Dataset:
    """Episodes of the given lengths with random values; the second one terminates."""
    rng = np.random.default_rng(seed)
    episodes = []
    for number, length in enumerate(lengths):
        actions = (
            rng.integers(0, 5, length).astype(np.int32)
            if discrete
            else rng.normal(size=(length, action_size))
        )
        episodes.append(
            {
                "observations": rng.normal(size=(length + 1, obs_size)),
                "actions": actions,
                "rewards": rng.normal(size=length),
                "costs": rng.random((length, n_costs)) if n_costs else None,
                "terminated": number == 1,
            }
        )
    return Dataset.from_episodes(episodes, name="test")


def assert_same_dataset(actual: Dataset, expected: Dataset) -> None:
    """Every leaf equal, indices included (exact: formats must not change values)."""
    actual_leaves = jax.tree_util.tree_leaves_with_path(actual)
    expected_leaves = jax.tree.leaves(expected)
    assert len(actual_leaves) == len(expected_leaves)
    for (path, left), right in zip(actual_leaves, expected_leaves, strict=True):
        left, right = np.asarray(left), np.asarray(right)
        assert left.dtype == right.dtype, (jax.tree_util.keystr(path), left.dtype, right.dtype)
        np.testing.assert_array_equal(left, right, err_msg=jax.tree_util.keystr(path))
