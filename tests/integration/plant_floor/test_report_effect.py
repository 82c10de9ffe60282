"""The shadow report's estimate of following the policy, with a plant model of the mixing
tank fitted on its historian log: one step ahead under the operators' and the policy's
actions, per channel with intervals, the out-of-data share, and a model of another task
refused by name."""

from __future__ import annotations

import csv
import itertools
import json
import shutil

import numpy as np
import pytest

from neorl_industrial.integration.plant_floor.report import (
    ESTIMATOR,
    NO_PLANT_MODEL,
    estimate_effect,
    log_to_mlflow,
    shadow_report,
)
from neorl_industrial.integration.plant_floor.ticklog import TickLog
from neorl_industrial.wrappers.models import PlantModel, PlantModelError
from tests.integration.plant_floor.plant_fixtures import TASK
from tests.wrappers.agents.test_export_report import EXAMPLE

OBSERVATIONS = TASK["observation_names"]
ACTIONS = TASK["action_names"]
#: The tick (of the log below) whose observation lies far outside the plant's data.
OUT_OF_DATA_TICK = 7


@pytest.fixture(scope="module")
def plant_model(tmp_path_factory):
    """A tiny model of the mixing tank (2 members of 16 x 16, 100 updates), saved."""
    from neorl_industrial.core.models import DynamicsConfig
    from neorl_industrial.integration.datasets import load_any
    from neorl_industrial.wrappers.models import FitSettings

    dataset, card = load_any(EXAMPLE / "mixing_tank.csv", schema=EXAMPLE / "schema.yaml")
    config = DynamicsConfig.create(hidden=(16, 16), n_members=2, n_elites=2)
    model = PlantModel(card.task(dataset), config, definitions=card.definitions, reward_row="next")
    settings = FitSettings(
        max_updates=100, chunk_updates=100, batch_size=32, horizon=5, windows=4, samples=2
    )
    model.fit(dataset, settings, dataset_name=card.name)
    return model.save(tmp_path_factory.mktemp("plant-model") / "mixing-tank", plots=False)


@pytest.fixture(scope="module")
def shadow_log(tmp_path_factory):
    """A shadow log of the mixing tank in the bridge's format: 30 consecutive ticks whose
    observations are the historian's rows, the operators' applied values those of the row
    before (the actuators' state after acting on the previous reading), and a policy that
    pumps 15 points more than the operators (within bounds). One tick reads a temperature
    far outside the data."""
    with (EXAMPLE / "mixing_tank.csv").open() as handle:
        rows = list(csv.DictReader(handle))[200:231]
    header = {
        "mode": "shadow",
        "policy": {"version": "v1", "source": "policy"},
        "task": {
            key: TASK[key]
            for key in (
                "observation_names",
                "action_names",
                "observation_units",
                "action_units",
                "action_low",
                "action_high",
            )
        },
        "constraints": [],
    }
    path = tmp_path_factory.mktemp("shadow") / "shadow.jsonl"
    with TickLog(path, header) as log:
        for tick in range(1, len(rows)):
            observation = [float(rows[tick][name]) for name in OBSERVATIONS]
            if tick == OUT_OF_DATA_TICK:
                observation[1] = 95.0
            operators = [float(rows[tick][name]) for name in ACTIONS]
            policy = [operators[0], min(operators[1] + 15.0, 100.0)]
            log.write(
                {
                    "kind": "tick",
                    "tick": tick,
                    "faults": {},
                    "observation": observation,
                    "applied": [float(rows[tick - 1][name]) for name in ACTIONS],
                    "proposed": policy,
                    "action": policy,
                    "overridden": False,
                    "violated": [],
                }
            )
    return path


def logged(path):
    """Per paired tick: the observation, the operators' action and the policy's."""
    records = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    pairs = itertools.pairwise(records)
    triples = [(r["observation"], n["applied"], r["action"]) for r, n in pairs]
    return [np.asarray(x) for x in zip(*triples, strict=True)]


def test_the_report_estimates_the_effect_with_the_plant_model(plant_model, shadow_log, tmp_path):
    report = shadow_report(shadow_log, tmp_path / "report", plant_model=plant_model)
    effect = report.effect
    assert effect is not None and effect.estimator == ESTIMATOR == "plant model, one step ahead"
    assert effect.model == str(plant_model) and effect.members == 2
    observations, operators, policy = logged(shadow_log)
    assert effect.ticks == len(observations) == 29
    assert [c.name for c in effect.channels] == ["reward", "high_level"]
    # The same numbers as the model's own one-step prediction (the mean over members of
    # their deterministic predictions), under each action.
    model = PlantModel.load(plant_model)
    under_operators = model.predict(observations, operators)
    under_policy = model.predict(observations, policy)
    reward = effect.channels[0]
    assert reward.operators == pytest.approx(under_operators["reward"].mean(), abs=1e-4)
    assert reward.policy == pytest.approx(under_policy["reward"].mean(), abs=1e-4)
    expected = under_policy["reward"] - under_operators["reward"]
    assert reward.difference == pytest.approx(expected.mean(), abs=1e-4)
    cost = effect.channels[1]
    assert cost.difference == pytest.approx(
        (under_policy["costs"][:, 0] - under_operators["costs"][:, 0]).mean(), abs=1e-4
    )
    for channel in effect.channels:
        low, high = channel.interval
        assert low <= channel.difference <= high
        first, last = channel.member_range
        assert first <= channel.difference <= last
        apart = min(low, first) > 0 or max(high, last) < 0
        assert ("cannot tell them apart" in channel.reading) is not apart
    # The bootstrap spans the ticks' spread: wider than nothing, narrower than it.
    assert 0 < reward.interval[1] - reward.interval[0] < np.ptp(expected)
    # One tick of 29 reads outside the data (either action outside counts too).
    outside = under_operators["outside_data"] | under_policy["outside_data"]
    assert effect.out_of_distribution == pytest.approx(outside.mean())
    assert outside[OUT_OF_DATA_TICK - 1] and effect.reliable
    assert report.plant_effect.startswith("reward ") and ESTIMATOR in report.plant_effect
    text = (tmp_path / "report" / "report.md").read_text()
    section = text.split("## Estimated effect of following the policy")[1]
    assert ESTIMATOR in section and str(plant_model) in section and NO_PLANT_MODEL not in text
    assert "| high_level |" in section and "relative RMSE" in section
    saved = json.loads((tmp_path / "report" / "report.json").read_text())
    assert saved["effect"]["estimator"] == ESTIMATOR
    assert saved["effect"]["channels"][0]["interval"] == pytest.approx(reward.interval)
    # Logged on the policy's registered version: the headline and each channel as tags.
    tags = logged_tags(report, tmp_path)
    assert tags["shadow_report.plant_effect"] == report.plant_effect
    assert tags["shadow_report.effect.estimator"] == ESTIMATOR
    assert tags["shadow_report.effect.reward"].startswith(f"{reward.difference:+.4g} [")
    # A policy that does what the operators did: no difference the model could tell.
    same = estimate_effect(model, plant_model, observations, operators, operators)
    for channel in same.channels:
        assert channel.difference == 0.0 and channel.interval == [0.0, 0.0]
        assert "cannot tell them apart" in channel.reading


def logged_tags(report, tmp_path):
    """The tags ``log_to_mlflow`` sets on a version registered in the suite's store."""
    import os
    import uuid

    from mlflow import MlflowClient

    store, name = os.environ["MLFLOW_TRACKING_URI"], f"mixing-tank-{uuid.uuid4().hex[:8]}"
    client = MlflowClient(tracking_uri=store, registry_uri=store)
    experiment = client.create_experiment(name, artifact_location=str(tmp_path / "artifacts"))
    run_id = client.create_run(experiment).info.run_id
    client.create_registered_model(name)
    version = client.create_model_version(name, str(tmp_path), run_id)
    log_to_mlflow(report, tmp_path / "report", f"models:/{name}/{version.version}", store)
    return client.get_model_version(name, version.version).tags


def test_a_plant_model_of_another_task_is_refused_by_name(plant_model, shadow_log, tmp_path):
    other = tmp_path / "other-model"
    shutil.copytree(plant_model, other)
    card = json.loads((other / "model.json").read_text())
    card["task"] |= {"name": "boiler", "observation_names": ["level_ft", "temp_f", "flow_gpm"]}
    (other / "model.json").write_text(json.dumps(card))
    with pytest.raises(PlantModelError, match=r"task 'boiler'.*level_ft.*level_m"):
        shadow_report(shadow_log, tmp_path / "report", plant_model=other)
    assert not (tmp_path / "report").exists()


def test_the_command_line_prints_the_estimate(plant_model, shadow_log, tmp_path, capsys):
    from neorl_industrial.cli.entry import main

    out = tmp_path / "report"
    argv = ["--no-cache", "shadow-report", str(shadow_log), "--out", str(out)]
    assert main([*argv, "--plant-model", str(plant_model)]) == 0
    printed = capsys.readouterr().out
    assert ESTIMATOR in printed and "member range" in printed and "high_level" in printed
    assert main([*argv, "--plant-model", str(tmp_path / "nothing")]) == 2
    assert "not a saved plant model" in capsys.readouterr().err
