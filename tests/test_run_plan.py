"""A run configuration resolved once: environment overrides reach data generation, a
dataset generated with other parameters is refused by name, and a plant dataset needs no
simulator."""

from __future__ import annotations

import pytest

from neorl_industrial.integration.datasets import generate_dataset, save_native
from neorl_industrial.pipeline import plan_run as resolve_run
from neorl_industrial.wrappers.agents.agent import Agent, AgentError
from neorl_industrial.wrappers.training import RunConfig
from neorl_industrial.wrappers.training.config import ConfigError


def config(**sections) -> RunConfig:
    values = {"data": {"quality": "random", "trajectories": 2}, "tracking": {"enabled": False}}
    for name, section in sections.items():
        values[name] = {**values.get(name, {}), **section}
    return RunConfig.from_dict(values)


@pytest.fixture(scope="module")
def default_setpoint_data(tmp_path_factory):
    dataset, card = generate_dataset("IB-classic-v0", "random", 2)
    path = tmp_path_factory.mktemp("data") / "ib"
    save_native(dataset, path, card)
    return path


def test_environment_overrides_reach_data_generation_and_the_card():
    plan = resolve_run(config(env={"id": "IB-classic-v0", "params": {"setpoint": 30.0}}))
    assert plan.card.env_params["setpoint"] == 30.0
    assert plan.task.env_params == {"setpoint": 30.0}
    _, params = plan.task.make_simulator()
    assert float(params.setpoint) == 30.0
    # Reference returns were measured at the defaults: a card of other parameters has none.
    assert plan.card.random_return is None


def test_a_dataset_of_another_setpoint_is_refused_by_name(default_setpoint_data):
    asked = config(
        env={"id": "IB-classic-v0", "params": {"setpoint": 30.0}},
        data={"path": str(default_setpoint_data)},
    )
    with pytest.raises(AgentError, match=r"env.params.setpoint: the run asks for 30.0.*with 70.0"):
        resolve_run(asked)
    intended = asked.with_overrides(["data.allow_mismatch=true"])
    assert resolve_run(intended).task.env_params["setpoint"] == 30.0


def test_a_dataset_of_another_environment_is_refused_by_name(default_setpoint_data):
    other = config(env={"id": "IB-v0"}, data={"path": str(default_setpoint_data)})
    with pytest.raises(AgentError, match=r"env.id: the run names 'IB-v0'.*'IB-classic-v0'"):
        resolve_run(other)


def test_without_env_id_the_dataset_card_is_the_task(default_setpoint_data):
    plan = resolve_run(config(data={"path": str(default_setpoint_data)}))
    assert plan.task.env_id == "IB-classic-v0" and plan.task.observation_size == 6
    assert Agent.from_plan(plan).task == plan.task


def test_a_constraint_spec_naming_a_missing_feature_is_refused(tmp_path, default_setpoint_data):
    spec = tmp_path / "spec.yaml"
    spec.write_text("rate_limits: {valve_pct: 5}\n")
    asked = config(data={"path": str(default_setpoint_data)}, safety={"constraints": str(spec)})
    with pytest.raises(AgentError, match=r"rate_limits.valve_pct.*velocity"):
        resolve_run(asked)


def test_the_held_out_split_of_the_config_reaches_the_evaluation_settings():
    """The split a plant model must share (``model fit --holdout --split-seed``) is set once,
    in the config's ``evaluation.ope``, and the run's settings carry it."""
    plan = resolve_run(config(evaluation={"ope": {"holdout": 0.25, "split_seed": 7}}))
    assert (plan.ope.holdout, plan.ope.split_seed) == (0.25, 7)
    with pytest.raises(ConfigError, match="split_seed"):
        config(evaluation={"ope": {"split_seed": -1}})
