"""The shared parts the agents' updates are built from."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.agents import mopo, mopo_rollouts
from neorl_industrial.core.agents.cost import check_safe_batch, with_channel_metrics
from neorl_industrial.core.agents.types import Batch


def _batch(n_costs: int) -> Batch:
    return Batch(
        observations=jnp.zeros((4, 3)),
        actions=jnp.zeros((4, 2)),
        rewards=jnp.zeros((4,)),
        costs=jnp.zeros((4, n_costs)),
        next_observations=jnp.zeros((4, 3)),
        terminals=jnp.zeros((4,), bool),
        discounts=jnp.ones((4,)),
    )


def test_channel_metrics_come_per_channel_after_the_others():
    metrics = with_channel_metrics(
        {"loss": jnp.ones(())}, jnp.array([0.5, 2.0]), jnp.array([3.0, 4.0])
    )
    assert list(metrics) == ["loss", "multiplier_0", "cost_value_0", "multiplier_1", "cost_value_1"]
    np.testing.assert_allclose([metrics["multiplier_1"], metrics["cost_value_0"]], [2.0, 3.0])


def test_a_safe_batch_needs_a_cost_column_per_channel():
    check_safe_batch(_batch(2), 2)
    with pytest.raises(AssertionError):
        check_safe_batch(_batch(1), 2)


def test_mopo_still_exports_the_model_side():
    for name in mopo_rollouts.__all__:
        assert getattr(mopo, name) is getattr(mopo_rollouts, name)
