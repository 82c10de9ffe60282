"""Implicit quantile critics and risk measures: the loss, the fractions, the reductions,
learning a known distribution, every critic-based agent with quantile critics, and a
risk-averse actor that gives up a little mean for a much better tail."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from neorl_industrial.core.agents.distributional import (
    CriticConfig,
    make_critics,
    pessimistic,
    quantile_huber_loss,
    risk_fractions,
)
from neorl_industrial.core.agents.registry import HyperparameterError, build_algorithm
from neorl_industrial.core.agents.types import Batch

IQN = {"kind": "iqn", "n_quantiles": 8, "n_policy_quantiles": 8, "embedding_size": 16}


def test_quantile_huber_loss_is_minimized_at_the_quantile():
    targets = jnp.arange(100.0)
    grid = jnp.linspace(0.0, 99.0, 397)
    losses_at = jax.jit(
        jax.vmap(
            lambda q, f: quantile_huber_loss(q[None], f[None], targets, kappa=1e-3),
            in_axes=(0, None),
        )
    )
    for fraction in (0.1, 0.5, 0.9):
        best = float(grid[jnp.argmin(losses_at(grid, jnp.float32(fraction)))])
        assert abs(best - np.quantile(np.arange(100.0), fraction)) < 1.5
    # By hand: one quantile 0 at fraction 0.25 against targets -2 and 0.5 (kappa 1):
    # errors -2 (Huber 1.5, weight 0.75) and 0.5 (Huber 0.125, weight 0.25).
    value = quantile_huber_loss(jnp.array([0.0]), jnp.array([0.25]), jnp.array([-2.0, 0.5]))
    np.testing.assert_allclose(value, (0.75 * 1.5 + 0.25 * 0.125) / 2, rtol=1e-6)
    jitted = jax.jit(quantile_huber_loss)(
        jnp.array([0.0]), jnp.array([0.25]), jnp.array([-2.0, 0.5])
    )
    np.testing.assert_allclose(jitted, value, rtol=1e-6)
    with pytest.raises(AssertionError):
        quantile_huber_loss(jnp.zeros(2), jnp.zeros(3), jnp.zeros(4))


def test_risk_fractions():
    neutral = risk_fractions(CriticConfig(kind="iqn", n_policy_quantiles=4))
    np.testing.assert_allclose(neutral, [0.125, 0.375, 0.625, 0.875])
    cvar = CriticConfig(kind="iqn", risk="cvar", cvar_level=0.2, n_policy_quantiles=4)
    np.testing.assert_allclose(risk_fractions(cvar), 0.2 * neutral, rtol=1e-6)
    upper = risk_fractions(cvar, upper=True)
    assert upper.min() >= 0.8 and upper.max() <= 1.0
    wang = risk_fractions(CriticConfig(kind="iqn", risk="wang", wang_eta=-0.75))
    assert np.all(np.diff(wang) > 0) and np.all(wang < risk_fractions(CriticConfig(kind="iqn")))
    wang_upper = risk_fractions(CriticConfig(kind="iqn", risk="wang"), upper=True)
    np.testing.assert_allclose(wang_upper, 1.0 - wang[::-1], atol=1e-6)  # mirrored


def test_pessimistic_keeps_the_member_with_the_lower_mean_whole():
    distribution = jnp.array([[[0.0, 10.0]], [[4.0, 5.0]]])  # members' means 5 and 4.5
    np.testing.assert_allclose(pessimistic(distribution), [[4.0, 5.0]])
    np.testing.assert_allclose(pessimistic(distribution, highest=True), [[0.0, 10.0]])


def test_critic_config_is_checked_by_name():
    with pytest.raises(ValueError, match=r"critic\.risk 'cvar' reads the return distribution"):
        CriticConfig(risk="cvar")
    with pytest.raises(ValueError, match="cvar_level"):
        CriticConfig(kind="iqn", risk="cvar", cvar_level=0.0)
    with pytest.raises(HyperparameterError, match=r"critic\.kind"):
        build_algorithm("td3bc", 3, 1, {"critic": {"kind": "quantile"}})
    with pytest.raises(HyperparameterError, match=r"critic\.risk 'cvar'"):
        build_algorithm("td3bc", 3, 1, {"critic": {"risk": "cvar"}})


def test_quantile_ensemble_shapes_and_broadcasting():
    critics = make_critics(CriticConfig(**IQN), (8,), 2)
    params = jax.eval_shape(lambda key: critics.init(key, 3, 2), jax.random.PRNGKey(0))
    observations = jax.ShapeDtypeStruct((5, 3), jnp.float32)
    actions = jax.ShapeDtypeStruct((4, 5, 2), jnp.float32)  # 4 actions per observation

    def shape(function, *args):
        return jax.eval_shape(function, params, *args).shape

    shared = jax.ShapeDtypeStruct((6,), jnp.float32)
    per_transition = jax.ShapeDtypeStruct((5, 6), jnp.float32)
    assert shape(critics.network.apply, observations, actions, shared) == (2, 4, 5, 6)
    assert shape(critics.network.apply, observations, actions, per_transition) == (2, 4, 5, 6)
    one_action = jax.ShapeDtypeStruct((5, 2), jnp.float32)
    assert shape(lambda p, o, a: critics.values(p, o, a, members=1), observations, one_action) == (
        1,
        5,
    )
    key = jax.random.key(2)
    samples = jax.eval_shape(critics.target_distribution, params, observations, one_action, key)
    assert samples.shape == (2, 5, 8)


@pytest.mark.slow
def test_a_quantile_critic_learns_a_known_distribution():
    """Rewards 0 (80 %) or 10 (20 %) with no bootstrap: the mean is 2, the lower CVaR at
    0.1 is 0 and the upper CVaR at 0.2 is 10."""
    config = CriticConfig(
        kind="iqn", n_quantiles=16, n_policy_quantiles=32, embedding_size=16, risk="cvar"
    )
    critics = make_critics(config, (16,), 1)
    params = critics.init(jax.random.PRNGKey(0), 2, 1)
    optimizer = optax.adam(3e-3)

    def step(carry, key):
        params, opt_state = carry
        draw_key, loss_key = jax.random.split(key)
        rewards = 10.0 * (jax.random.uniform(draw_key, (128,)) < 0.2)
        observations, actions = jnp.ones((128, 2)), jnp.zeros((128, 1))

        def loss(p):
            return critics.td_loss(p, observations, actions, rewards, loss_key)[0]

        grads = jax.grad(loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state)
        return (optax.apply_updates(params, updates), opt_state), None

    (params, _), _ = jax.lax.scan(
        step, (params, optimizer.init(params)), jax.random.split(jax.random.PRNGKey(1), 1500)
    )
    observation, action = jnp.ones((1, 2)), jnp.zeros((1, 1))
    mean = float(critics.values(params, observation, action)[0, 0])
    lower = float(critics.risk_values(params, observation, action)[0, 0])
    upper_config = config.__class__(**{**config.__dict__, "cvar_level": 0.2})
    upper = float(
        make_critics(upper_config, (16,), 1).risk_values(params, observation, action, upper=True)[
            0, 0
        ]
    )
    assert abs(mean - 2.0) < 0.5
    assert abs(lower) < 0.5
    assert abs(upper - 10.0) < 1.0


def _batch(n: int = 32, obs: int = 3, act: int = 2, n_costs: int = 2) -> Batch:
    rng = np.random.default_rng(0)
    return Batch(
        observations=jnp.asarray(rng.normal(size=(n, obs)), jnp.float32),
        actions=jnp.asarray(rng.uniform(-1, 1, (n, act)), jnp.float32),
        rewards=jnp.asarray(rng.normal(size=n), jnp.float32),
        costs=jnp.asarray(rng.uniform(0, 1, (n, n_costs)), jnp.float32),
        next_observations=jnp.asarray(rng.normal(size=(n, obs)), jnp.float32),
        terminals=jnp.zeros(n, bool),
        discounts=jnp.full(n, 0.99, jnp.float32),
    )


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        # The safe variants build on TD3+BC's and IQL's blocks: quantile reward critics
        # and quantile cost critics in one program each.
        (
            "td3bc-lag",
            {
                "cost_limits": [5.0, 5.0],
                "critic": {**IQN, "risk": "cvar"},
                "cost_critic": {**IQN, "risk": "cvar"},
            },
        ),
        (
            "iql-lag",
            {
                "cost_limits": [5.0, 5.0],
                "critic": {**IQN, "risk": "wang"},
                "cost_critic": {**IQN, "risk": "cvar"},
            },
        ),
        ("cql", {"critic": {**IQN, "risk": "cvar"}, "n_actions": 2}),
        pytest.param("td3bc", {"critic": IQN}, marks=pytest.mark.slow),
        pytest.param("iql", {"critic": IQN}, marks=pytest.mark.slow),
    ],
)
def test_agents_update_with_quantile_critics(name, extra):
    """One jitted program per agent (eager execution of a whole update costs minutes
    here; the new loss is checked with and without jit below): finite metrics, the same
    result for the same key, another for another key (the fractions are drawn)."""
    algorithm, _ = build_algorithm(name, 3, 2, {"hidden": [8], **extra})
    state = algorithm.init(jax.random.PRNGKey(0))
    update = jax.jit(algorithm.update)
    batch = _batch()
    first, metrics = update(state, batch, jax.random.PRNGKey(3))
    again, _ = update(state, batch, jax.random.PRNGKey(3))
    other, _ = update(state, batch, jax.random.PRNGKey(4))
    for metric, value in metrics.items():
        assert np.isfinite(value), metric
    leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(first)]
    for a, b in zip(leaves, jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(
        not np.array_equal(a, b) for a, b in zip(leaves, jax.tree.leaves(other), strict=True)
    )


def test_the_cost_floor_is_for_mean_cost_critics_only():
    """TD3BC-Lag's floor holds the expected cost at the policy's actions no lower than at
    the data's; unset it is on for mean cost critics and off for quantile ones, where it
    diverges, and an explicit one on quantile critics is refused."""
    from neorl_industrial.core.agents import cost_critics
    from neorl_industrial.core.agents.td3bc_lag import TD3BCLagConfig

    quantile = CriticConfig(**IQN, risk="cvar", cvar_level=0.1)
    assert TD3BCLagConfig(cost_limits=(1.0,)).floor == 1.0
    assert TD3BCLagConfig(cost_limits=(1.0,), cost_critic=quantile).floor == 0.0
    assert TD3BCLagConfig(cost_limits=(1.0,), cost_floor=0.5).floor == 0.5
    with pytest.raises(ValueError, match=r"cost_floor: 1\.0 with quantile cost critics"):
        TD3BCLagConfig(cost_limits=(1.0,), cost_critic=quantile, cost_floor=1.0)

    costs = cost_critics.make_cost_critics((8,), 1, 1e-3)
    state = cost_critics.init_cost_critics(costs, jax.random.PRNGKey(0), 3, 2)
    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    observations = jax.random.normal(keys[0], (16, 3))
    data_actions = jax.random.uniform(keys[1], (16, 2), minval=-1, maxval=1)
    policy_actions = jax.random.uniform(keys[2], (16, 2), minval=-1, maxval=1)
    targets = jnp.ones((1, 16))

    def loss(floor):
        _, value, _ = cost_critics.critic_step(
            costs, state, observations, data_actions, targets, floor, policy_actions
        )
        return float(value)

    at_data = costs.q_values(state.critic, observations, data_actions)
    at_policy = costs.q_values(state.critic, observations, policy_actions)
    shortfall = float(jnp.mean(jnp.sum(jax.nn.relu(at_data - at_policy), axis=(0, 1))))
    assert shortfall > 0
    np.testing.assert_allclose(loss(1.0) - loss(0.0), shortfall, rtol=1e-4)


@pytest.mark.slow
def test_quantile_td_loss_is_the_same_with_and_without_jit():
    critics = make_critics(CriticConfig(**IQN), (8,), 4)
    params = critics.init(jax.random.PRNGKey(0), 3, 2)
    batch = _batch()
    targets = jnp.stack([batch.rewards[:, None] + jnp.arange(3.0)] * 2)  # [2 groups, B, 3]

    def loss(params, key):
        return critics.td_loss(params, batch.observations, batch.actions, targets, key, groups=2)

    key = jax.random.PRNGKey(1)
    eager_loss, eager_values = loss(params, key)
    jitted_loss, jitted_values = jax.jit(loss)(params, key)
    np.testing.assert_allclose(eager_loss, jitted_loss, rtol=1e-5)
    np.testing.assert_allclose(eager_values, jitted_values, rtol=1e-5, atol=1e-6)
    assert eager_values.shape == (4, 32)


def _risky_bandit(n: int, key: jax.Array) -> Batch:
    """One state, one action in [-1, 1], no bootstrap. Positive actions pay 2 (90 %) or
    -10 (10 %): mean 0.8, worst tenth -10. Negative actions pay 0.5 for sure."""
    action_key, draw_key = jax.random.split(key)
    actions = jax.random.uniform(action_key, (n, 1), minval=-1.0, maxval=1.0)
    bad = jax.random.uniform(draw_key, (n,)) < 0.1
    rewards = jnp.where(actions[:, 0] > 0, jnp.where(bad, -10.0, 2.0), 0.5)
    return Batch(
        observations=jnp.ones((n, 1)),
        actions=actions,
        rewards=rewards,
        costs=jnp.zeros((n, 1)),
        next_observations=jnp.ones((n, 1)),
        terminals=jnp.ones(n, bool),
        discounts=jnp.zeros(n),
    )


@pytest.mark.slow
def test_cvar_actor_prefers_the_safe_tail_the_neutral_actor_the_mean():
    """O-RAAC's qualitative result on a bandit: the risk-neutral TD3+BC picks the action
    with the higher mean, the CVaR(0.1) one the action whose worst tenth is better."""
    chosen = {}
    for risk in ("neutral", "cvar"):
        critic = {"kind": "iqn", "n_quantiles": 16, "n_policy_quantiles": 16, "risk": risk}
        algorithm, _ = build_algorithm(
            "td3bc", 1, 1, {"hidden": [32, 32], "alpha": 10.0, "critic": critic}
        )

        def step(state, key, algorithm=algorithm):
            data_key, update_key = jax.random.split(key)
            return algorithm.update(state, _risky_bandit(128, data_key), update_key)[0], None

        state, _ = jax.lax.scan(
            step,
            algorithm.init(jax.random.PRNGKey(0)),
            jax.random.split(jax.random.PRNGKey(1), 3000),
        )
        chosen[risk] = float(algorithm.act(state.policy, jnp.ones((1,)))[0])
    assert chosen["neutral"] > 0.1, chosen
    assert chosen["cvar"] < -0.1, chosen
