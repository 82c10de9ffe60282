"""The pieces the safe agents are composed of: cost limits as traced leaves, the dual
ascent of the multipliers, the cost critics, and the batch type they share."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.agents import (
    Batch,
    IQLLagConfig,
    PIDConfig,
    TD3BCLagConfig,
    check_cost_limits,
    make_iql_lag,
    make_td3bc_lag,
    with_cost_limits,
)
from neorl_industrial.core.agents import cost_critics as cc
from neorl_industrial.core.agents.registry import HyperparameterError, validate_hyperparameters
from neorl_industrial.core.optimizers import (
    LogMultiplierState,
    PIDState,
    ascend,
    gradient_ascent,
    pid_ascent,
)
from neorl_industrial.functional.state_management import Dataset, sample
from neorl_industrial.functional.transformations.offline import init_seeds, make_seeded_chunk

OBS = 2
PID = PIDConfig(kp=1.0, ki=0.05, kd=0.0)


def _constrained_bandit(n=1000, seed=0):
    """One-step episodes, behaviour uniform in [-1, 1]: reward ``a``, cost ``max(0, a)``."""
    rng = np.random.default_rng(seed)
    observations = rng.normal(size=(n, 2, OBS)).astype(np.float32)
    actions = rng.uniform(-1, 1, size=(n, 1, 1)).astype(np.float32)
    return Dataset.from_trajectories(
        observations, actions, actions[:, :, 0], np.maximum(actions, 0.0), np.ones((n, 1), bool)
    )


SAFE_AGENTS = {
    "td3bc-lag": lambda **kw: make_td3bc_lag(TD3BCLagConfig(hidden=(16,), **kw), OBS, 1),
    # Faster critics, so that the cost estimate settles within the test's 200 updates.
    "iql-lag": lambda **kw: make_iql_lag(
        IQLLagConfig(hidden=(16,), critic_lr=1e-3, value_lr=1e-3, **kw), OBS, 1
    ),
}


@pytest.mark.parametrize("name", sorted(SAFE_AGENTS))
def test_two_cost_limits_train_in_one_vmapped_program_without_recompiling(name):
    algorithm = SAFE_AGENTS[name](cost_limits=(1.0,), episode_length=1, pid=PID)
    dataset = _constrained_bandit()
    seeded = make_seeded_chunk(algorithm, 64, 100)
    traces = []

    def counted(states, data, keys):
        traces.append(None)  # runs once per trace, not per call
        return seeded(states, data, keys)

    chunk = jax.jit(counted)
    # Two agents from one seed that differ only in their cost limit: the data's cost
    # value (about 0.25) is over the tight limit and well under the loose one.
    tight, loose = 0.05, 2.0
    states = with_cost_limits(init_seeds(algorithm, [0, 0]), jnp.asarray([[tight], [loose]]))
    for key in (1, 2):
        states, metrics = chunk(states, dataset, jnp.stack([jax.random.PRNGKey(key)] * 2))
    multipliers = np.asarray(states.lagrangian.multiplier[:, 0])
    assert multipliers[0] > 0.1 and multipliers[1] == 0.0, multipliers
    np.testing.assert_allclose(metrics["multiplier_0"][1], 0.0)
    np.testing.assert_allclose(states.lagrangian.cost_limits[:, 0], [tight, loose])

    # Other limits are other leaf values: the same compiled program.
    swapped = with_cost_limits(states, jnp.asarray([[loose], [tight]]))
    swapped, _ = chunk(swapped, dataset, jnp.stack([jax.random.PRNGKey(3)] * 2))
    assert len(traces) == 1 and chunk._cache_size() == 1
    np.testing.assert_allclose(swapped.lagrangian.cost_limits[:, 0], [loose, tight])


@pytest.mark.parametrize("name", sorted(SAFE_AGENTS))
def test_cost_limits_are_state_leaves_initialized_from_the_config(name):
    default = SAFE_AGENTS[name](cost_limits=(3.0, 4.0))
    configured = SAFE_AGENTS[name](cost_limits=(0.5, 7.0))
    key = jax.random.PRNGKey(0)
    state = default.init(key)
    np.testing.assert_array_equal(state.lagrangian.cost_limits, [3.0, 4.0])
    # Setting the limits gives exactly the state that a config with them starts from.
    replaced = with_cost_limits(state, [0.5, 7.0])
    for a, b in zip(jax.tree.leaves(replaced), jax.tree.leaves(configured.init(key)), strict=True):
        np.testing.assert_array_equal(a, b)
    # Pure and traceable: traced limits go in as they are.
    traced = jax.jit(with_cost_limits)(state, jnp.asarray([1.5, 2.5]))
    np.testing.assert_array_equal(traced.lagrangian.cost_limits, [1.5, 2.5])
    with pytest.raises(ValueError, match=r"cost_limits: expected one .* \(2\), got 3"):
        with_cost_limits(state, [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"cost_limits\[1\]"):
        with_cost_limits(state, [1.0, -2.0])
    with pytest.raises(ValueError, match="cost_limits: expected shape"):
        with_cost_limits(state, jnp.ones((3, 2)))


def test_one_validation_of_cost_limits_serves_both_configs():
    check_cost_limits([0.0, 5.0], n_costs=2)
    for config_type in (TD3BCLagConfig, IQLLagConfig):
        with pytest.raises(ValueError, match=r"cost_limits\[1\]: must be a finite number >= 0"):
            config_type(cost_limits=(1.0, float("nan")))
        with pytest.raises(ValueError, match="cost_limits: give one episode cost limit"):
            config_type(cost_limits=())
        with pytest.raises(ValueError, match="cost_limits: expected numbers"):
            config_type(cost_limits=("high",))
        with pytest.raises(ValueError, match="multiplier: expected one of"):
            config_type(multiplier="newton")
    with pytest.raises(ValueError, match=r"cost_limits: expected one .* \(3\)"):
        check_cost_limits([1.0], n_costs=3)


@pytest.mark.parametrize(
    ("dual_ascent", "initial"),
    [(pid_ascent(PIDConfig(kp=1.0, ki=0.5, kd=0.0)), 0.0), (gradient_ascent(0.1), 1.0)],
    ids=["pid", "gradient"],
)
def test_both_dual_ascents_are_optax_transformations(dual_ascent, initial):
    multiplier = jnp.full((2,), initial, jnp.float32)
    state = dual_ascent.init(multiplier)
    step = jax.jit(lambda m, s: ascend(dual_ascent, m, s, jnp.asarray([1.0, -1.0])))
    for _ in range(10):
        multiplier, state = step(multiplier, state)
    over, under = np.asarray(multiplier)
    assert over > initial and under <= initial
    assert under >= 0.0


def test_the_config_chooses_the_multiplier():
    pid_state = make_td3bc_lag(TD3BCLagConfig(hidden=(8,)), OBS, 1).init(jax.random.PRNGKey(0))
    assert isinstance(pid_state.lagrangian.opt_state, PIDState)
    config = validate_hyperparameters(
        "iql-lag",
        {"hidden": [8], "multiplier": "gradient", "gradient": {"lr": 0.1, "initial": 2.0}},
    )
    algorithm = make_iql_lag(config, OBS, 1)
    state = algorithm.init(jax.random.PRNGKey(0))
    assert isinstance(state.lagrangian.opt_state, LogMultiplierState)
    np.testing.assert_allclose(state.lagrangian.multiplier, [2.0])
    batch = sample(_constrained_bandit(n=64), jax.random.PRNGKey(1), 32)
    _, metrics = jax.jit(algorithm.update)(state, batch, jax.random.PRNGKey(2))
    assert np.isfinite(metrics["multiplier_0"]) and metrics["multiplier_0"] > 0.0
    with pytest.raises(HyperparameterError, match=r"hyperparameters\.multiplier"):
        validate_hyperparameters("td3bc-lag", {"multiplier": "newton"})
    with pytest.raises(HyperparameterError, match=r"gradient\.lr"):
        validate_hyperparameters("td3bc-lag", {"gradient": {"lr": -1.0}})


def test_cost_critics_learn_each_channel_by_td_and_in_sample():
    n, n_costs = 64, 2
    rng = np.random.default_rng(0)
    observations = jnp.asarray(rng.normal(size=(n, OBS)), jnp.float32)
    actions = jnp.asarray(rng.uniform(-1, 1, size=(n, 1)), jnp.float32)
    costs = jnp.tile(jnp.asarray([[0.5, 2.0]]), (n, 1))
    terminal = jnp.zeros((n,))  # the target is the step's cost
    td = cc.make_cost_critics((16,), n_costs, 1e-2)
    in_sample = cc.make_in_sample_cost_critics((16,), n_costs, 1e-2, 1e-2, 0.5)
    td_state = cc.init_cost_critics(td, jax.random.PRNGKey(0), OBS, 1)
    in_state = cc.init_in_sample(in_sample, jax.random.PRNGKey(1), jax.random.PRNGKey(2), OBS, 1)
    assert td.q_values(td_state.critic, observations, actions).shape == (n_costs, 2, n)

    @jax.jit
    def steps(td_state, in_state):
        def body(carry, _):
            td_state, in_state = carry
            targets = cc.td_targets(td, td_state, costs, terminal, observations, actions)
            td_state, _, _ = cc.critic_step(td, td_state, observations, actions, targets)
            in_state, _ = cc.in_sample_step(
                in_sample, in_state, observations, actions, costs, terminal, observations
            )
            return (cc.soft_update(td_state, 0.1), cc.soft_update(in_state, 0.1)), None

        return jax.lax.scan(body, (td_state, in_state), None, length=300)[0]

    td_state, in_state = steps(td_state, in_state)
    for critics, params in ((td, td_state.critic), (in_sample.critics, in_state.critic)):
        per_channel = np.asarray(critics.q_values(params, observations, actions)).mean(axis=(1, 2))
        np.testing.assert_allclose(per_channel, [0.5, 2.0], atol=0.05)
    np.testing.assert_allclose(
        np.asarray(in_sample.cost_values(in_state.value, observations)).mean(axis=1),
        [0.5, 2.0],
        atol=0.1,
    )


def test_the_batch_type_lives_in_the_core_and_is_re_exported():
    from neorl_industrial.functional.state_management import Batch as SampledBatch
    from neorl_industrial.functional.state_management.sampling import Batch as ModuleBatch

    assert SampledBatch is Batch and ModuleBatch is Batch
    batch = sample(_constrained_bandit(n=16), jax.random.PRNGKey(0), 8)
    assert isinstance(batch, Batch)
