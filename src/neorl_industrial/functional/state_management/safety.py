"""Datasets under constraints: relabelled costs and the episodes within cost limits.

``relabel_costs`` recomputes every transition's cost from its next observation with a
compiled constraint spec (e.g. a stricter limit than the one the data was logged with);
``select_safe_episodes`` keeps the episodes whose cost stays within every limit, the data
of the BC-Safe baseline.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from neorl_industrial.core.safety import CompiledConstraints, costs
from neorl_industrial.functional.state_management.dataset import Dataset

__all__ = ["episodes_within_limits", "relabel_costs", "select_safe_episodes"]


def relabel_costs(dataset: Dataset, constraints: CompiledConstraints) -> Dataset:
    """The dataset with ``costs`` recomputed from each transition's next observation:
    one column per cost of ``constraints``.

    Raises:
        ValueError: when the constraints declare no costs.
    """
    if constraints.n_costs == 0:
        raise ValueError("constraints: declare at least one cost to relabel the dataset with")
    relabelled = jax.jit(costs)(constraints, dataset.next_observations())
    return dataset.replace(costs=relabelled)


def episodes_within_limits(dataset: Dataset, cost_limits: Sequence[float]) -> np.ndarray:
    """``[n_episodes]`` bool: the episode's summed cost is within every limit.

    Raises:
        ValueError: when the number of limits is not the number of cost channels.
    """
    limits = np.asarray(cost_limits, np.float64).reshape(-1)
    if limits.shape != (dataset.n_costs,):
        raise ValueError(
            f"cost_limits: expected one limit per cost channel ({dataset.n_costs}), "
            f"got {limits.size}"
        )
    episode_costs = np.asarray(dataset.episode_costs(), np.float64)
    return np.all(episode_costs <= limits, axis=1)


def select_safe_episodes(dataset: Dataset, cost_limits: Sequence[float]) -> Dataset:
    """The episodes whose summed cost is within every limit (BC-Safe's data).

    Raises:
        ValueError: when no episode is within the limits (naming how close the best came).
    """
    keep = episodes_within_limits(dataset, cost_limits)
    if not keep.any():
        lowest = np.asarray(dataset.episode_costs()).min(axis=0)
        raise ValueError(
            f"cost_limits: no episode of {dataset.n_episodes} is within {list(cost_limits)}; "
            f"the lowest episode costs per channel are {lowest.tolist()}"
        )
    return dataset.select_episodes(np.flatnonzero(keep))
