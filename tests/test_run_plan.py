"""A run configuration resolved once: environment overrides reach data generation, a
dataset generated with other parameters is refused by name, a plant dataset needs no
simulator; the plan holds the contract, the split and the sections themselves, and the
Agent trains it."""

from __future__ import annotations

import dataclasses

import pytest

from neorl_industrial.cli.run_glue import plan_run as resolve_run
from neorl_industrial.integration.datasets import generate_dataset, save_native
from neorl_industrial.wrappers.agents import OPESettings
from neorl_industrial.wrappers.agents.agent import Agent, AgentError
from neorl_industrial.wrappers.training import RunConfig
from neorl_industrial.wrappers.training.config import ConfigError, OPESection
from neorl_industrial.wrappers.training.plan import PlanError, RunPlan
from neorl_industrial.wrappers.training.plan import resolve_run as resolve_with_data


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


@pytest.fixture(scope="module")
def small_data():
    return generate_dataset("IB-v0", "random", 5)


def test_the_plan_holds_the_contract_the_split_and_the_sections_themselves(small_data):
    dataset, card = small_data
    run = config(
        safety={"cost_limits": [5.0, 7.0]},
        evaluation={"ope": {"always": True, "holdout": 0.4, "split_seed": 3}},
    )
    plan = resolve_with_data(run, dataset, card)
    assert plan.safety.limits() == [5.0, 7.0] and not hasattr(plan, "cost_limits")
    assert plan.safety.limit_sources == ("run", "run")
    # The configuration's sections themselves, not copies.
    assert plan.training is run.training and plan.evaluation is run.evaluation
    assert plan.ope is run.evaluation.ope and OPESettings is OPESection
    assert (plan.split.train.n_episodes, plan.split.heldout.n_episodes) == (3, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.training = run.training
    # The agent of the plan takes the contract as resolved: the same object.
    agent = Agent.from_plan(plan)
    assert agent.safety is plan.safety and agent.cost_limits == [5.0, 7.0]
    assert "cost_limits" not in agent.hyperparameters and agent.config.cost_limits == (5.0, 7.0)


def test_agent_from_config_reads_a_file_a_mapping_or_a_config(tmp_path, small_data):
    path = tmp_path / "run.yaml"
    path.write_text("algorithm: {name: iql-lag}\nsafety: {cost_limits: [3.0, 4.0]}\n")
    agent = Agent.from_config(path)
    assert (agent.name, agent.cost_limits, agent.task.env_id) == ("iql-lag", [3.0, 4.0], "IB-v0")
    assert agent.plan is None and agent.run_config.safety.cost_limits == [3.0, 4.0]
    # Its settings are the configuration's: a keyword would be a second source.
    dataset, card = small_data
    with pytest.raises(AgentError, match=r"updates: this agent's settings come from"):
        agent.fit(dataset, card=card, updates=10)
    with pytest.raises(AgentError, match=r"data.path: the task of .* comes from its card"):
        Agent.from_config({"data": {"path": str(tmp_path / "log")}})
    with pytest.raises(ConfigError, match="algorithm"):
        Agent.from_config({"algorithm": {"nam": "bc"}})
    made = Agent.from_config(config(), dataset=dataset, card=card)
    assert made.plan.dataset is dataset and made.plan.card is card


def test_a_plan_trains_and_refuses_a_second_source_of_settings(small_data):
    dataset, card = small_data
    run = config(
        algorithm={"name": "bc", "hyperparameters": {"hidden": [8]}},
        training={"updates": 10, "chunk": 10, "batch_size": 8},
        evaluation={"episodes": 1, "horizon": 10},
    )
    agent = Agent.from_config(run, dataset=dataset, card=card)
    result = agent.fit()
    assert int(result.state.updates[0]) == 10 and agent.result.batch_size == 8
    assert agent.result.dataset["name"] == card.name
    with pytest.raises(AgentError, match=r"updates: a plan carries its settings"):
        agent.fit(agent.plan, updates=20)
    other = RunPlan.create(dataset, algorithm="td3bc-lag", card=card)
    with pytest.raises(AgentError, match=r"plan: made for td3bc-lag.*Agent.from_plan"):
        agent.fit(other)


def test_keyword_settings_are_checked_as_the_configuration_fields(small_data):
    dataset, _ = small_data
    agent = Agent("bc", hidden=(8,))
    with pytest.raises(AgentError, match=r"seeds: expected distinct seeds"):
        agent.fit(dataset, seeds=[1, 1])
    with pytest.raises(AgentError, match=r"batch_size: Input should be greater than or equal"):
        agent.fit(dataset, batch_size=0)
    with pytest.raises(AgentError, match=r"eval_every: unknown setting; known: batch_size"):
        agent.sweep(dataset, {"lr": [1e-3]}, eval_every=10)
    with pytest.raises(AgentError, match=r"ope: expected OPESettings"):
        agent.fit(dataset, ope={"updates": 5})
    always = config(evaluation={"ope": {"always": True}}).evaluation
    with pytest.raises(PlanError, match=r"needs at least two"):
        RunPlan.create(dataset.select_episodes([0]), algorithm="bc", evaluation=always)
