"""Algorithms by name, with validated hyperparameters."""

from __future__ import annotations

import dataclasses

import jax
import pytest

from neorl_industrial.core.agents.registry import (
    ALGORITHMS,
    HyperparameterError,
    algorithm_entry,
    build_algorithm,
    validate_hyperparameters,
)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_builds_with_its_defaults(name):
    entry = ALGORITHMS[name]
    algorithm, config = build_algorithm(name, 6, 27 if entry.discrete else 3, {"hidden": [8]})
    assert config == dataclasses.replace(entry.config_type(), hidden=(8,))
    state = algorithm.init(jax.random.PRNGKey(0))
    assert state.policy is not None


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_policy_acts_and_a_stochastic_action_without_a_key_is_named(name):
    entry = ALGORITHMS[name]
    n_actions = 27 if entry.discrete else 3
    algorithm, _ = build_algorithm(name, 6, n_actions, {"hidden": [8]})
    policy = algorithm.init(jax.random.PRNGKey(0)).policy
    observations = jax.numpy.ones((5, 6))
    greedy = algorithm.act(policy, observations, deterministic=True)
    drawn = algorithm.act(policy, observations, jax.random.PRNGKey(1), deterministic=False)
    for action in (greedy, drawn):
        if entry.discrete:
            assert action.shape == (5,) and bool(((action >= 0) & (action < n_actions)).all())
        else:
            assert action.shape == (5, 3) and bool((abs(action) <= 1.0).all())
    try:
        keyless = algorithm.act(policy, observations, deterministic=False)
    except ValueError as error:  # a policy that samples needs the key
        assert "key: a stochastic action needs a PRNG key" in str(error)
    else:  # a deterministic policy (BC, TD3+BC) acts the same either way
        assert bool((keyless == greedy).all()) and bool((drawn == greedy).all())


def test_names_are_forgiving_about_spelling_but_not_about_typos():
    assert algorithm_entry("TD3+BC").name == "td3bc"
    assert algorithm_entry("td3bc_lag").name == "td3bc-lag"
    with pytest.raises(HyperparameterError, match=r"unknown 'td3-bc'.*did you mean 'td3bc'"):
        algorithm_entry("td3-bc")


def test_hyperparameter_errors_name_the_field():
    with pytest.raises(HyperparameterError, match=r"hyperparameters\.hiden.*did you mean 'hidden'"):
        validate_hyperparameters("td3bc", {"hiden": [64]})
    with pytest.raises(HyperparameterError, match=r"hyperparameters\.actor_lr"):
        validate_hyperparameters("td3bc", {"actor_lr": "fast"})
    with pytest.raises(HyperparameterError, match=r"hyperparameters\.pid\.kq"):
        validate_hyperparameters("td3bc-lag", {"pid": {"kq": 1.0}})


def test_nested_settings_merge_over_the_algorithm_defaults():
    config = validate_hyperparameters("td3bc-lag", {"pid": {"kp": 0.5}, "hidden": [32, 32]})
    assert config.pid.kp == 0.5
    assert config.pid.ki == ALGORITHMS["td3bc-lag"].config_type().pid.ki == 0.01
    assert config.hidden == (32, 32)


def test_a_cost_aware_config_takes_its_limits_from_the_safety_contract_alone():
    from neorl_industrial.core.environments import Task
    from neorl_industrial.core.safety import resolve_safety

    contract = resolve_safety(Task.from_env("IB-v0"), cost_limits=[7.0, 9.0])
    _, config = build_algorithm("td3bc-lag", 3, 2, {"hidden": [8]}, contract=contract)
    assert config.cost_limits == (7.0, 9.0)
    # An algorithm without cost limits ignores the contract.
    assert not hasattr(validate_hyperparameters("td3bc", None, contract), "cost_limits")
    with pytest.raises(HyperparameterError, match=r"cost_limits: the run's safety contract"):
        validate_hyperparameters("bc-safe", {"cost_limits": [1.0, 1.0]}, contract)
