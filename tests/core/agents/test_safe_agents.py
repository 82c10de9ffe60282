"""Safe agents: the PID multiplier, TD3BC-Lag, IQL-Lag and BC-Safe on a constrained bandit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.agents import (
    BCConfig,
    IQLConfig,
    IQLLagConfig,
    PIDConfig,
    TD3BCConfig,
    TD3BCLagConfig,
    make_bc,
    make_iql,
    make_iql_lag,
    make_td3bc,
    make_td3bc_lag,
    per_step_cost_threshold,
)
from neorl_industrial.core.optimizers import (
    GradientAscentConfig,
    ascend,
    gradient_ascent,
    pid_ascent,
)
from neorl_industrial.functional.state_management import (
    Dataset,
    sample,
    select_safe_episodes,
)
from neorl_industrial.functional.transformations.offline import Schedule, train_offline

OBS = 2
COST_LIMIT = 0.2


def _constrained_bandit(n=4000, seed=0):
    """One-step episodes, behaviour uniform in [-1, 1]: reward ``a``, cost ``max(0, a)``.
    Unconstrained, the best action is +1 (cost 1); within a cost limit of 0.2 it is 0.2."""
    rng = np.random.default_rng(seed)
    observations = rng.normal(size=(n, 2, OBS)).astype(np.float32)
    actions = rng.uniform(-1, 1, size=(n, 1, 1)).astype(np.float32)
    rewards = actions[:, :, 0]
    costs = np.maximum(actions, 0.0)
    dataset = Dataset.from_trajectories(
        observations, actions, rewards, costs, np.ones((n, 1), bool)
    )
    return dataset


def _policy_cost(algorithm, state):
    policy = jax.tree.map(lambda leaf: leaf[0], state.agent.policy)
    test_obs = np.random.default_rng(3).normal(size=(500, OBS)).astype(np.float32)
    actions = np.asarray(algorithm.act(policy, test_obs))
    return float(np.mean(np.maximum(actions, 0.0))), float(np.mean(actions))


def test_per_step_threshold_and_pid_controller():
    # OSRL: limit * (1 - γ^T) / (1 - γ) / T.
    assert per_step_cost_threshold(100.0, 0.99, 1000) == pytest.approx(
        100 * (1 - 0.99**1000) / 0.01 / 1000
    )
    assert per_step_cost_threshold(5.0, 1.0, 10) == 5.0
    with pytest.raises(ValueError, match="discount"):
        per_step_cost_threshold(1.0, 0.0, 10)
    pid = pid_ascent(PIDConfig(kp=1.0, ki=0.5, kd=0.0))
    multiplier = jnp.zeros(2)
    state = pid.init(multiplier)
    threshold = jnp.asarray([1.0, 1.0])
    for _ in range(3):
        multiplier, state = ascend(pid, multiplier, state, jnp.asarray([2.0, 0.0]) - threshold)
    # Over the limit: P = 1, I = 3 (integral of +1 three times) * 0.5.
    np.testing.assert_allclose(multiplier, [1.0 + 1.5, 0.0])
    # Under the limit the integral winds down, never below zero.
    for _ in range(5):
        multiplier, state = ascend(pid, multiplier, state, jnp.asarray([0.0, 0.0]) - threshold)
    np.testing.assert_allclose(state.integral, [0.0, 0.0])
    np.testing.assert_allclose(multiplier, [0.0, 0.0])
    with pytest.raises(ValueError, match=r"pid\.ki"):
        PIDConfig(ki=-1.0)


def test_gradient_ascent_multiplier_rises_over_the_limit_and_falls_under():
    dual_ascent = gradient_ascent(0.1)
    multiplier = jnp.ones(2)
    state = dual_ascent.init(multiplier)
    for _ in range(20):
        violation = jnp.asarray([2.0, 0.0]) - jnp.asarray([1.0, 1.0])
        multiplier, state = ascend(dual_ascent, multiplier, state, violation)
    assert float(multiplier[0]) > 2.0 and float(multiplier[1]) < 0.5
    with pytest.raises(ValueError, match="initial"):
        GradientAscentConfig(initial=0.0)


@pytest.mark.parametrize(
    ("name", "plain", "safe"),
    [
        (
            "td3bc",
            lambda: make_td3bc(TD3BCConfig(hidden=(32, 32)), OBS, 1),
            lambda pid: make_td3bc_lag(
                TD3BCLagConfig(
                    hidden=(32, 32),
                    cost_limits=(COST_LIMIT,),
                    discount=0.99,
                    episode_length=1,
                    pid=pid,
                ),
                OBS,
                1,
            ),
        ),
        (
            "iql",
            lambda: make_iql(IQLConfig(hidden=(32, 32)), OBS, 1),
            lambda pid: make_iql_lag(
                IQLLagConfig(
                    hidden=(32, 32),
                    cost_limits=(COST_LIMIT,),
                    discount=0.99,
                    episode_length=1,
                    pid=pid,
                ),
                OBS,
                1,
            ),
        ),
    ],
)
def test_the_lagrangian_agent_keeps_the_limit_the_plain_one_breaks(name, plain, safe):
    dataset = _constrained_bandit()
    pid = PIDConfig(kp=1.0, ki=0.05, kd=0.0)
    settings = {"schedule": Schedule(n_updates=1500, chunk_updates=1500, batch_size=128)}
    plain_algorithm, safe_algorithm = plain(), safe(pid)
    plain_state, _ = train_offline(plain_algorithm, dataset, **settings)
    safe_state, history = train_offline(safe_algorithm, dataset, **settings)
    plain_cost, _ = _policy_cost(plain_algorithm, plain_state)
    safe_cost, safe_mean = _policy_cost(safe_algorithm, safe_state)
    assert plain_cost > 2 * COST_LIMIT, (name, plain_cost)
    assert safe_cost <= COST_LIMIT + 0.1, (name, safe_cost)
    # It does not buy safety by doing nothing useful: it still leans to the rewarded side.
    assert safe_mean > -0.5, (name, safe_mean)
    assert history[-1]["metrics"]["multiplier_0"][0] > 0.0


def test_bc_safe_learns_from_the_episodes_within_the_limit():
    dataset = _constrained_bandit()
    safe_data = select_safe_episodes(dataset, [COST_LIMIT])
    kept = np.asarray(safe_data.episode_costs())
    assert kept.max() <= COST_LIMIT and 0 < safe_data.n_episodes < dataset.n_episodes
    bc = make_bc(BCConfig(hidden=(32, 32)), OBS, 1)
    state, _ = train_offline(
        bc,
        safe_data,
        schedule=Schedule(n_updates=1000, chunk_updates=500, batch_size=256),
    )
    cost, _ = _policy_cost(bc, state)
    assert cost <= COST_LIMIT
    with pytest.raises(ValueError, match="no episode of"):
        select_safe_episodes(dataset, [-1.0])
    with pytest.raises(ValueError, match="one limit per cost channel"):
        select_safe_episodes(dataset, [1.0, 1.0])


def test_safe_updates_agree_with_and_without_jit_and_check_cost_shapes():
    dataset = _constrained_bandit(n=64)
    batch = sample(dataset, jax.random.PRNGKey(1), 32)
    for algorithm in (
        make_td3bc_lag(TD3BCLagConfig(hidden=(16,), cost_limits=(1.0,)), OBS, 1),
        make_iql_lag(IQLLagConfig(hidden=(16,), cost_limits=(1.0,)), OBS, 1),
    ):
        state = algorithm.init(jax.random.PRNGKey(0))
        eager, _ = algorithm.update(state, batch, jax.random.PRNGKey(2))
        jitted, metrics = jax.jit(algorithm.update)(state, batch, jax.random.PRNGKey(2))
        for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
        assert "multiplier_0" in metrics
        two_costs = batch.replace(costs=jnp.zeros((32, 2)))
        with pytest.raises(AssertionError):
            algorithm.update(state, two_costs, jax.random.PRNGKey(2))


def test_safe_config_errors_name_the_field():
    with pytest.raises(ValueError, match=r"cost_limits\[1\]"):
        TD3BCLagConfig(cost_limits=(1.0, -2.0))
    with pytest.raises(ValueError, match="cost_limits"):
        IQLLagConfig(cost_limits=())
    with pytest.raises(ValueError, match="cost_expectile"):
        IQLLagConfig(cost_expectile=1.0)
    with pytest.raises(ValueError, match="episode_length"):
        TD3BCLagConfig(episode_length=0)
