"""The environment registry builds what it registers and leaves it as built."""

from __future__ import annotations

import pytest

from neorl_industrial.core.environments import make, registered_envs, registered_id
from neorl_industrial.core.environments.industrial_benchmark import IndustrialBenchmark


def test_make_builds_the_registered_configuration_without_renaming_it():
    env, params = make("IB-classic-v0", setpoint=30.0)
    built = IndustrialBenchmark(observation="classic")
    assert env == built and hash(env) == hash(built)
    # nothing set on the instance after it was built: its name is its class's
    assert "name" not in vars(env) and env.name == IndustrialBenchmark.name
    assert float(params.setpoint) == 30.0


def _defaults() -> dict:
    return {
        env_id: (dict(spec.static_defaults), dict(spec.param_defaults))
        for env_id, spec in registered_envs().items()
    }


def test_make_leaves_the_registry_as_it_was():
    before = _defaults()
    for env_id in before:
        make(env_id)
    make("IB-v0", observation="classic", setpoint=40.0)
    assert _defaults() == before


def test_an_environment_tells_its_registered_id_back():
    for env_id in registered_envs():
        assert registered_id(make(env_id)[0]) == env_id
    # a configuration no id names: the class's name
    unnamed = IndustrialBenchmark(observation="classic", action_type="discrete")
    assert registered_id(unnamed) == IndustrialBenchmark.name


def test_an_unknown_id_is_named():
    with pytest.raises(ValueError, match="'IB-v9'"):
        make("IB-v9")
