"""Cost relabelling and the episodes within cost limits."""

from __future__ import annotations

import numpy as np
import pytest

from neorl_industrial.core.safety import ConstraintSpec
from neorl_industrial.functional.state_management import (
    Dataset,
    episodes_within_limits,
    relabel_costs,
    select_safe_episodes,
)

OBS = ("temperature", "pressure")


def _dataset():
    # Two episodes of three steps; temperature climbs in the second.
    episodes = [
        {
            "observations": np.asarray([[10, 1], [11, 1], [12, 1], [13, 1]], np.float32),
            "actions": np.zeros((3, 1), np.float32),
            "rewards": np.ones(3, np.float32),
            "costs": np.zeros((3, 1), np.float32),
        },
        {
            "observations": np.asarray([[50, 1], [70, 1], [90, 1], [95, 1]], np.float32),
            "actions": np.zeros((3, 1), np.float32),
            "rewards": np.ones(3, np.float32),
            "costs": np.zeros((3, 1), np.float32),
        },
    ]
    return Dataset.from_episodes(episodes)


def test_costs_are_recomputed_from_the_next_observation():
    spec = ConstraintSpec.from_dict(
        {
            "costs": [
                {"name": "hot", "feature": "temperature", "above": 80, "cost_limit": 1},
                {"name": "low-pressure", "feature": "pressure", "below": 0.5, "cost_limit": 1},
            ]
        }
    )
    relabelled = relabel_costs(_dataset(), spec.compile(2, 1, OBS, ("valve",)))
    costs = np.asarray(relabelled.costs)
    # Next temperatures: 11, 12, 13 | 70, 90, 95 -> hot on the last two steps.
    np.testing.assert_array_equal(costs[:, 0], [0, 0, 0, 0, 1, 1])
    np.testing.assert_array_equal(costs[:, 1], np.zeros(6))
    np.testing.assert_array_equal(np.asarray(relabelled.episode_costs())[:, 0], [0, 2])
    assert episodes_within_limits(relabelled, [1, 1]).tolist() == [True, False]
    safe = select_safe_episodes(relabelled, [1, 1])
    assert safe.n_episodes == 1 and float(np.asarray(safe.observations)[0, 0]) == 10.0
    with pytest.raises(ValueError, match="declare at least one cost"):
        relabel_costs(_dataset(), ConstraintSpec().compile(2, 1))
