"""An agent trained on a plant log with no simulator, judged with a plant model of the
same log: the verdict in its training summary, training episodes recognised when it is
evaluated again, and a plant model of another log, another task or too little data
refused with names and numbers."""

from __future__ import annotations

import numpy as np
import pytest

from neorl_industrial.integration.datasets import load_any
from neorl_industrial.wrappers.agents import Agent, AgentError, OPESettings
from neorl_industrial.wrappers.models import PlantModel
from neorl_industrial.wrappers.training.verdict import KEEP, VerdictSettings
from tests.cli.test_verdict_cli import HEATER_HIDDEN, HEATER_OPE, HEATER_TRAINING, heater_plant
from tests.wrappers.training.test_verdict import (
    OPERATOR_NOISE,
    SCHEMA,
    linear,
    true_discounted_return,
    write_log,
)

VERDICT = VerdictSettings(horizon=30, bootstrap=200, fqe=False)  # as test_candidates'


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = heater_plant(tmp_path_factory.mktemp("heater-agent"))
    dataset, card = load_any(root / "log.csv", schema=root / "schema.yaml")
    task = card.task(dataset)
    model = PlantModel.load(root / "model", dataset=dataset, task=task, dataset_name=card.name)
    agent = Agent("bc", task=task, hidden=HEATER_HIDDEN)
    ope = OPESettings(**HEATER_OPE)
    agent.fit(
        dataset,
        **HEATER_TRAINING,
        ope=ope,
        card=card,
        plant_model=model,
        verdict=VERDICT,
    )
    return {
        "root": root,
        "dataset": dataset,
        "card": card,
        "task": task,
        "model": model,
        "agent": agent,
        "ope": ope,
    }


def test_a_fit_with_a_plant_model_carries_the_verdict(trained):
    agent = trained["agent"]
    verdict = agent.result.verdict
    assert verdict["kind"] == "estimate" and verdict["estimators"] == ["model"]
    assert [c["name"] for c in verdict["candidates"]] == ["run 0 (seed 0)", "run 1 (seed 1)"]
    assert verdict["evidence"]["heldout_episodes"] == 4  # 20 % of 20 episodes
    # A clone of these operators is their controller without their noise: the truth says
    # it is better, and a recommendation must be of a run the truth says is better.
    heldout = trained["dataset"].select_episodes(_heldout(trained))
    starts = np.asarray(heldout.initial_observations())[:, 0]
    operators = true_discounted_return(linear(0.8, 0.0), starts, 30, OPERATOR_NOISE)
    truth = [
        true_discounted_return(
            lambda t, run=run: float(agent.predict(np.asarray([t]), run=run)[0]), starts, 30, 0.0
        )
        - operators
        for run in range(2)
    ]
    if verdict["decision"] == KEEP:
        assert verdict["recommended"] is None
    else:
        assert truth[int(verdict["recommended"].split()[1])] > 0
    model = [c["estimates"][0]["improvement"] for c in verdict["candidates"]]
    for run in range(2):  # the model's improvement has the truth's sign
        assert np.sign(model[run]["value"]) == np.sign(truth[run])
    assert len(agent.result.dataset["trained_episodes"]) == 16
    # One run selected on the 16 training episodes before the test, and exported.
    selection = verdict["evidence"]["selection"]
    assert selection["episodes"] == 16 and selection["test_episodes"] == 4
    chosen = [c["name"] for c in verdict["candidates"] if c["selection"]["selected"]]
    assert chosen == [selection["chosen"]]
    assert verdict["recommended"] in (None, selection["chosen"])
    assert agent.result.selection == {"by": "verdict", "candidate": selection["chosen"]}


def test_evaluating_on_the_training_log_leaves_its_training_episodes_out(trained):
    agent, dataset = trained["agent"], trained["dataset"]
    result = agent.evaluate_offline(
        dataset, trained["ope"], plant_model=trained["model"], verdict=VERDICT
    )
    assert result["left_out_training_episodes"] == 16 and result["evaluated_episodes"] == 4
    assert not result["on_training_episodes"]
    assert result["verdict"]["evidence"]["heldout_episodes"] == 4
    # Selected on the episodes the agent trained on, the same choice as its fit's.
    assert result["verdict"]["evidence"]["selection"]["episodes"] == 16
    assert (
        result["verdict"]["evidence"]["selection"]["chosen"]
        == agent.result.verdict["evidence"]["selection"]["chosen"]
    )
    # Only training episodes: estimated, flagged, and refused for a verdict.
    trained_only = dataset.select_episodes(
        np.arange(20)[~np.isin(np.arange(20), _heldout(trained))]
    )
    flagged = agent.evaluate_offline(trained_only, trained["ope"])
    assert flagged["on_training_episodes"] and flagged["evaluated_episodes"] == 16
    with pytest.raises(AgentError, match="all 16 of its episodes trained this agent"):
        agent.evaluate_offline(trained_only, trained["ope"], plant_model=trained["model"])


def _heldout(trained):
    return np.asarray(trained["model"].card["dataset"]["holdout_episodes"])


def test_a_plant_model_of_another_log_or_task_is_refused_by_name(trained, tmp_path):
    write_log(tmp_path / "other.csv", episodes=20, steps=30, seed=5)
    other, _ = load_any(tmp_path / "other.csv", schema=trained["root"] / "schema.yaml")
    agent = trained["agent"]
    with pytest.raises(
        AgentError, match=r"plant_model: .*fingerprint .* is not that of 'heater-verdict'"
    ):
        agent.evaluate_offline(other, trained["ope"], plant_model=trained["model"])
    renamed = SCHEMA.replace("name: heater-verdict", "name: boiler-7")
    (tmp_path / "schema.yaml").write_text(renamed)
    dataset, card = load_any(trained["root"] / "log.csv", schema=tmp_path / "schema.yaml")
    boiler = Agent("bc", task=card.task(dataset), hidden=(8,))
    with pytest.raises(
        AgentError, match=r"task 'boiler-7' .* not the model's task 'heater-verdict'"
    ):
        boiler.fit(dataset, updates=10, chunk=10, card=card, plant_model=trained["model"])


def test_a_plant_model_fitted_on_the_held_out_episodes_is_refused(trained):
    dataset, card = trained["dataset"], trained["card"]
    agent = Agent("bc", task=trained["task"], hidden=(8,))
    ope = OPESettings(updates=10, seeds=(0, 1), split_seed=3)  # another split than the model's
    with pytest.raises(
        AgentError, match=r"plant_model: fitted on .* episodes the evaluation holds out"
    ):
        agent.fit(dataset, updates=10, chunk=10, card=card, ope=ope, plant_model=trained["model"])


def test_a_log_too_small_for_a_held_out_split_is_refused_with_its_numbers(trained, tmp_path):
    write_log(tmp_path / "small.csv", episodes=2, steps=10)
    small, card = load_any(tmp_path / "small.csv", schema=trained["root"] / "schema.yaml")
    agent = Agent("bc", task=card.task(small), hidden=(8,))
    with pytest.raises(AgentError, match=r"20 transitions in 2 episodes are too few"):
        agent.fit(small, updates=10, chunk=10, card=card, ope=OPESettings(holdout=0.1))


def test_a_sweep_judges_every_configuration_with_the_plant_model(trained):
    agent = Agent("bc", task=trained["task"], hidden=(16,))
    table = agent.sweep(
        trained["dataset"],
        {"learning_rate": [1e-3, 3e-4]},
        updates=100,
        chunk=100,
        seeds=(0,),
        ope=trained["ope"],
        card=trained["card"],
        plant_model=trained["model"],
        verdict=VERDICT,
    )
    verdict = table["verdict"]
    assert [c["name"] for c in verdict["candidates"]] == [
        "configuration 0 (seed 0)",
        "configuration 1 (seed 0)",
    ]
    assert verdict["kind"] == "estimate" and verdict["deciding"] == ["model"]
    qualified = [c["name"] for c in verdict["candidates"] if c["qualifies"]]
    assert (verdict["recommended"] in qualified) == (verdict["decision"] == "recommend")
    # The configurations' programs judged apart, then selected again together: one.
    selected = [c["name"] for c in verdict["candidates"] if c["selection"]["selected"]]
    assert selected == [verdict["evidence"]["selection"]["chosen"]]
    assert len(qualified) <= 1


def test_the_verdict_reuses_the_fqes_the_evaluation_just_fitted(trained, monkeypatch):
    """Evaluated off policy with a plant model, the verdict takes the candidates' FQEs the
    evaluation fitted (same episodes, policies and settings) and fits only the logged
    operation's: the same verdict as fitting them again, one FQE fit fewer."""
    from neorl_industrial.wrappers.training import ope as ope_module
    from neorl_industrial.wrappers.training import verdict_fqe as verdict_module

    agent, ope = trained["agent"], trained["ope"]
    settings = VerdictSettings(
        horizon=30,
        bootstrap=300,
        fqe_updates=ope.updates,
        fqe_seeds=tuple(ope.seeds),
        fqe_hidden=tuple(ope.hidden),
        discount=ope.discount,
        bc_updates=100,
    )
    fits: list[str] = []
    for module in (ope_module, verdict_module):
        original = module.fitted_q_evaluation_values

        def counted(*args, _original=original, _name=module.__name__, **kwargs):
            fits.append(_name.rsplit(".", 1)[-1])
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, "fitted_q_evaluation_values", counted)
    result = agent.evaluate_offline(
        trained["dataset"], ope, plant_model=trained["model"], verdict=settings
    )
    assert fits == ["ope", "verdict_fqe"]  # the candidates' FQEs once, the clone's once
    fits.clear()
    heldout = trained["dataset"].select_episodes(_heldout(trained))
    training = agent.result.seen_episodes(trained["dataset"])  # selected on the same
    again = agent.judge(
        heldout, trained["model"], ope=ope, settings=settings, selection=training
    ).to_dict()
    assert fits == ["verdict_fqe", "verdict_fqe"]  # judged alone: both fitted
    reused = result["verdict"]
    assert reused["estimators"] == ["model", "fqe", "model+fqe"]
    for mine, theirs in zip(reused["candidates"], again["candidates"], strict=True):
        assert mine["estimates"] == theirs["estimates"]
    assert reused["decision"] == again["decision"]
