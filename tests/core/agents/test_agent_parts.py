"""The shared parts the agents' updates are built from."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.agents import CQLConfig, SACConfig, TD3BCConfig, mopo, mopo_rollouts
from neorl_industrial.core.agents.cost import check_safe_batch, with_channel_metrics
from neorl_industrial.core.agents.networks import MLP, PolicyParams
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


def test_a_fresh_policy_carries_the_configs_normalizer_and_normalizes_a_batch():
    config = TD3BCConfig.create(hidden=[4], obs_mean=[1.0, 2.0, 3.0], obs_std=[2.0, 2.0, 0.0])
    network = MLP((4,), output_size=2)
    policy = PolicyParams.create(network, jax.random.PRNGKey(0), config, 3)
    expected = network.init(jax.random.PRNGKey(0), jnp.zeros((3,), jnp.float32))
    assert jax.tree.all(jax.tree.map(jnp.array_equal, policy.actor, expected))
    batch = _batch(1).replace(next_observations=jnp.full((4, 3), 5.0))
    observations, next_observations = policy.normalize_batch(batch)
    np.testing.assert_allclose(observations[0], [-0.5, -1.0, -3.0])
    np.testing.assert_allclose(next_observations[0], [2.0, 1.5, 2.0])


@pytest.mark.parametrize(
    ("config_type", "values", "message"),
    [
        (SACConfig, {"n_critics": 0}, "n_critics: expected a positive integer, got 0"),
        (TD3BCConfig, {"policy_freq": 0}, "policy_freq: expected a positive integer, got 0"),
        (CQLConfig, {"n_actions": 0}, "n_actions: expected a positive integer, got 0"),
        (CQLConfig, {"cql_alpha": -1.0}, "cql_alpha: must not be negative, got -1.0"),
        (CQLConfig, {"bc_steps": -1}, "bc_steps: must not be negative, got -1"),
    ],
)
def test_a_count_or_a_weight_out_of_range_is_refused_by_name(config_type, values, message):
    with pytest.raises(ValueError, match=message):
        config_type(**values)
