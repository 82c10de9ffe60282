"""Conservative Q-Learning."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.agents.cql import CQLConfig, cql_gap, make_cql
from neorl_industrial.functional.state_management import sample
from neorl_industrial.functional.transformations.offline import Schedule, train_offline
from tests.core.agents.test_iql import ACT, OBS, _biased_bandit, _regret


def test_gap_is_a_soft_maximum_minus_the_data_value():
    q_data = jnp.array([1.0, 2.0])
    q_sampled = jnp.array([[0.0, 0.0], [3.0, 3.0]])
    np.testing.assert_allclose(cql_gap(q_data, q_sampled, 1.0), [np.log(2) - 1, 3 + np.log(2) - 2])
    with pytest.raises(AssertionError):
        cql_gap(jnp.zeros((2, 2)), q_sampled, 1.0)


@pytest.mark.parametrize("lagrange", [False, True])
def test_update_is_the_same_with_and_without_jit(lagrange):
    dataset, _ = _biased_bandit(n=64)
    cql = make_cql(CQLConfig(hidden=(16,), n_actions=3, lagrange=lagrange), OBS, ACT)
    state = cql.init(jax.random.PRNGKey(0))
    batch = sample(dataset, jax.random.PRNGKey(1), 32)
    eager, eager_metrics = cql.update(state, batch, jax.random.PRNGKey(2))
    jitted, jitted_metrics = jax.jit(cql.update)(state, batch, jax.random.PRNGKey(2))
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    for name in eager_metrics:
        np.testing.assert_allclose(eager_metrics[name], jitted_metrics[name], rtol=1e-4, atol=1e-6)
    moved = float(jitted.log_alpha_prime) != 0.0
    assert moved is lagrange


@pytest.mark.slow
def test_cql_is_conservative_and_improves_on_the_data():
    dataset, weights = _biased_bandit()
    cql = make_cql(
        CQLConfig(hidden=(64, 64), actor_lr=1e-3, alpha_lr=1e-3, n_actions=4, cql_alpha=1.0),
        OBS,
        ACT,
    )
    states, history = train_offline(
        cql,
        dataset,
        seeds=(0,),
        schedule=Schedule(n_updates=3000, chunk_updates=1000, batch_size=256),
    )
    # The penalty keeps values of sampled actions below those of the data's actions.
    assert history[-1]["metrics"]["cql_gap"][0] < history[0]["metrics"]["cql_gap"][0]
    data_regret = -float(dataset.rewards.mean())
    regret = _regret(cql, states, weights)
    assert regret < 0.75 * data_regret, (regret, data_regret)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="n_actions"):
        CQLConfig(n_actions=0)
    with pytest.raises(ValueError, match="cql_alpha"):
        CQLConfig(cql_alpha=-1.0)


def layers_of(params) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every ``(kernel, bias)`` pair of a parameter tree (``.../kernel`` with ``.../bias``,
    or ``<name>_kernel`` with ``<name>_bias``)."""
    leaves = {
        jax.tree_util.keystr(path): np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_leaves_with_path(params)
    }
    return [
        (leaf, leaves[path.replace("kernel", "bias")])
        for path, leaf in leaves.items()
        if "kernel" in path
    ]


def test_cql_starts_from_pytorch_s_default_layers_and_refuses_an_unknown_one():
    """CQL's networks start as CORL's and d3rlpy's (weights and biases uniform in
    ±1/sqrt(fan_in)); IQL with weight_init='lecun' starts from flax's LeCun normal and
    zero biases."""
    from neorl_industrial.core.agents import IQLConfig, make_iql

    cql = make_cql(CQLConfig(hidden=(64, 64)), 12, 2).init(jax.random.PRNGKey(0))
    every = layers_of((cql.policy.actor, cql.critic))
    assert len(every) == 4 + 3  # the actor's torso and heads, the critics' layers
    for kernel, bias in every:  # a critic ensemble's kernels are [members, fan_in, width]
        bound = 1.0 / np.sqrt(kernel.shape[-2]) + 1e-6
        assert np.max(np.abs(kernel)) <= bound and np.max(np.abs(bias)) <= bound
        assert np.std(bias) > bound / 4  # uniform: spread over the bound, not zero
    iql = make_iql(IQLConfig(hidden=(64, 64), weight_init="lecun"), 12, 2).init(
        jax.random.PRNGKey(0)
    )
    first, _ = layers_of(iql.policy.actor)[0]
    assert first.shape == (12, 64)
    assert np.max(np.abs(first)) > 1.0 / np.sqrt(12)  # LeCun normal's tails
    assert all(not bias.any() for _, bias in layers_of((iql.policy.actor, iql.critic)))
    with pytest.raises(ValueError, match="weight_init: expected one of"):
        CQLConfig(weight_init="xavier")
