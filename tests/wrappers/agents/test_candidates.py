"""Every candidate of a run and a sweep, and one verdict over them: with a plant model a
run keeps the verdict's first, a sweep keeps every configuration x seed policy (saved,
loaded, exported by name), the candidates of several runs are judged together and a run
of another log is refused by name; a run whose policy cannot act fails by name and is
never selected, and a training in which none can act is refused."""

from __future__ import annotations

import copy
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.integration.datasets import load_any
from neorl_industrial.wrappers.agents import Agent, AgentError, OPESettings
from neorl_industrial.wrappers.agents.joint_verdict import judge_together
from neorl_industrial.wrappers.models import PlantModel
from neorl_industrial.wrappers.training import context as context_module
from neorl_industrial.wrappers.training.selection import verdict_ranking
from neorl_industrial.wrappers.training.verdict import VerdictSettings
from tests.cli.test_verdict_cli import HEATER_HIDDEN, HEATER_OPE, HEATER_TRAINING, heater_plant

VERDICT = VerdictSettings(horizon=30, bootstrap=200, fqe=False)
OPE = OPESettings(**HEATER_OPE)
SHORT = dict(**HEATER_TRAINING, ope=OPE)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = heater_plant(tmp_path_factory.mktemp("candidates"))
    dataset, card = load_any(root / "log.csv", schema=root / "schema.yaml")
    task = card.task(dataset)
    model = PlantModel.load(root / "model", dataset=dataset, task=task, dataset_name=card.name)
    fitted = Agent("bc", task=task, hidden=HEATER_HIDDEN)
    fitted.fit(dataset, **SHORT, card=card, plant_model=model, verdict=VERDICT)
    swept = Agent("bc", task=task, hidden=HEATER_HIDDEN)
    table = swept.sweep(
        dataset,
        {"learning_rate": [3e-4, 1e-3]},
        **SHORT,
        card=card,
        plant_model=model,
        verdict=VERDICT,
    )
    swept.save(root / "sweep-agent")
    return {
        "root": root,
        "dataset": dataset,
        "card": card,
        "model": model,
        "fitted": fitted,
        "swept": swept,
        "table": table,
        "loaded": Agent.load(root / "sweep-agent"),
    }


def test_a_run_with_a_plant_model_keeps_the_verdicts_first(runs):
    agent = runs["fitted"]
    first = verdict_ranking(agent.result.verdict)[0]
    assert agent.result.selection == {"by": "verdict", "candidate": first}
    assert first == f"run {agent.selected} (seed {agent.seeds[agent.selected]})"
    assert agent.selected_candidate == f"seed{agent.seeds[agent.selected]}"
    assert agent.candidates == ["seed0", "seed1"]


def test_a_sweep_keeps_every_configuration_and_seed(runs, tmp_path):
    swept, loaded, table = runs["swept"], runs["loaded"], runs["table"]
    names = ["config0-seed0", "config0-seed1", "config1-seed0", "config1-seed1"]
    assert swept.candidates == loaded.candidates == names
    # The verdict ranks, and the table and the agent follow it.
    first = verdict_ranking(table["verdict"])[0]
    assert table["reason"].startswith(f"the verdict ranks {first} first")
    assert first == f"configuration {table['selected']} (seed {swept.seeds[swept.selected]})"
    observations = np.asarray(runs["dataset"].initial_observations())[:5]
    for name in names:
        ours, theirs = swept.candidate(name), loaded.candidate(name)
        assert ours.selected_candidate == theirs.selected_candidate == name
        np.testing.assert_array_equal(
            ours.predict(observations, run=ours.selected),
            theirs.predict(observations, run=theirs.selected),
        )
    other = loaded.candidate("configuration 1 (seed 1)")
    assert other.hyperparameters["learning_rate"] == 1e-3 and other.seeds[other.selected] == 1
    # Two configurations' policies differ: each candidate is its own.
    zero, one = loaded.candidate("config0-seed1"), other
    assert not np.array_equal(
        zero.predict(
            observations,
            run=1,
        ),
        one.predict(observations, run=1),
    )
    path = one.export(tmp_path / "policy")
    metadata = json.loads((path / "manifest.json").read_text())["metadata"]
    assert metadata["candidate"] == "config1-seed1" and metadata["seed"] == 1
    for wrong, message in (
        ("seed1", "no 'seed1' in this agent"),
        ("config2-seed0", "no 'config2-seed0'"),
        ("best", "'best' is not a candidate's name"),
    ):
        with pytest.raises(AgentError, match=message):
            loaded.candidate(wrong)


def test_one_verdict_over_the_candidates_of_a_run_and_a_sweep(runs):
    joint = judge_together(
        {"bc": runs["fitted"], "bc-sweep": runs["loaded"]},
        runs["dataset"],
        runs["model"],
        card=runs["card"],
        settings=VERDICT,
    )
    names = [row["name"] for row in joint.verdict.candidates]
    assert names == ["bc/seed0", "bc/seed1"] + [
        f"bc-sweep/config{c}-seed{s}" for c in (0, 1) for s in (0, 1)
    ]
    assert joint.ranking == verdict_ranking(joint.verdict.to_dict())
    assert sorted(joint.ranking) == sorted(names)
    assert joint.first == tuple(joint.ranking[0].split("/"))
    # Held out from both runs and the model: 20 % of 20 episodes, the same split.
    assert joint.heldout["episodes"] == 4 and joint.heldout["of"] == 20
    assert json.loads(json.dumps(joint.to_dict()))["first"]["run"] == joint.first[0]
    stranger = copy.copy(runs["fitted"])
    stranger.result = dataclasses.replace(
        stranger.result,
        dataset={**stranger.result.dataset, "fingerprint": "sha256:" + "0" * 64},
    )
    with pytest.raises(AgentError, match=r"^other: trained on log 'heater-verdict' \(sha256:0"):
        judge_together({"bc": runs["fitted"], "other": stranger}, runs["dataset"], runs["model"])


def test_a_policy_that_cannot_act_is_never_selected(runs, monkeypatch):
    real = context_module.policy_health
    poisoned_runs: list[int] = []

    def poisoned(act, policies, observations, **options):
        rows = jnp.asarray([run in poisoned_runs for run in range(2)])
        policies = jax.tree.map(
            lambda leaf: jnp.where(rows.reshape((-1,) + (1,) * (leaf.ndim - 1)), jnp.nan, leaf),
            policies,
        )
        return real(act, policies, observations, **options)

    monkeypatch.setattr(context_module, "policy_health", poisoned)
    task, dataset = runs["fitted"].task, runs["dataset"]
    poisoned_runs[:] = [0]
    agent = Agent("bc", task=task, hidden=(16,))
    agent.fit(dataset, updates=100, chunk=100, seeds=(0, 1), evaluate=False)
    assert agent.selected == 1 and agent.candidates == ["seed1"]
    (failed,) = agent.result.failed_runs
    assert failed["candidate"] == "seed0" and "parameters hold NaN" in failed["reason"]
    with pytest.raises(AgentError, match="candidate seed0: failed"):
        agent.candidate("seed0")
    poisoned_runs[:] = [0, 1]
    with pytest.raises(AgentError, match=r"^training: no policy can act, none is kept: seed 0"):
        Agent("bc", task=task, hidden=(16,)).fit(
            dataset, updates=100, chunk=100, seeds=(0, 1), evaluate=False
        )
