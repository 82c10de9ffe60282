"""A heater whose fuel's heat reaches the outlet two samples after the valve moves: one
logged row does not show what the outlet answers to, the last three rows do (the schema's
``history: 3``). The plant model's memory check says so, the history check chooses the
three rows by their held-out error over many steps, the verdict judges with a model that
sees the delay and reproduces today's operation, its clone of the operators reads the
newest row, and a policy of the stacked rows exports and serves by name."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
from fastapi.testclient import TestClient

from neorl_industrial.integration.deployment import create_app
from neorl_industrial.wrappers.agents import Agent
from neorl_industrial.wrappers.agents.signing import generate_key_pair
from neorl_industrial.wrappers.training.verdict import (
    PlantRules,
    VerdictCandidates,
    VerdictSettings,
    model_verdict,
)
from neorl_industrial.wrappers.training.verdict_fqe import _behaviour_clone
from tests.integration.deployment.test_server import AS_ACT, _settings
from tests.wrappers.training.heater_plant import fitted_histories, write_csv

SCHEMA = """\
name: delayed-heater
timestamp: time
sampling_period: 60
observations:
  - {column: temperature, unit: degC, physical: [0, 600]}
  - {column: valve_position, unit: "%", physical: [0, 100]}
actions:
  - {column: valve, unit: "%", bounds: [0, 100]}
reward: -abs(temperature - 350) - 0.01 * valve
costs:
  - {name: overheating, expression: "max(temperature - 365, 0)", limit: 5.0}
"""


def write_log(path, episodes: int = 30, steps: int = 40, seed: int = 0) -> None:
    """Row ``k``: the outlet, the valve's position (the move made at ``k - 1``) and the
    operators' move (a P loop on the outlet, with their noise); the outlet at ``k + 1``
    follows the move made at ``k - 2``."""
    rng = np.random.default_rng(seed)
    seconds, temperature, position, valve = [], [], [], []
    stamp = 0
    for _ in range(episodes):
        t = rng.uniform(335, 365)
        moves = [float(np.clip(50 + 0.8 * (350 - t), 0, 100))] * 2
        for _ in range(steps + 1):
            v = float(np.clip(50 + 0.8 * (350 - t) + rng.normal(0, 8), 0, 100))
            seconds.append(stamp)
            temperature.append(t)
            position.append(moves[-1])
            valve.append(v)
            t = 0.8 * t + 0.2 * (300 + moves[-2]) + rng.normal(0, 0.3)
            moves = [moves[-1], v]
            stamp += 60
        stamp += 3600
    columns = {"temperature": temperature, "valve_position": position, "valve": valve}
    write_csv(path, seconds, columns)


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """The same log imported with one row per observation and with the last three,
    compared by the history check: its report and the two fitted plants."""
    return fitted_histories(
        tmp_path_factory.mktemp("delayed-heater"), SCHEMA, write_log, histories=(1, 3)
    )


@pytest.fixture(scope="module")
def plants(compared):
    return compared[1]


def _explained(plant, feature):
    rows = plant["model"].card["fidelity"]["memory"]["rows"]
    return next(row["explained"] for row in rows if row["name"] == feature)


def test_the_memory_check_sees_the_delay_one_row_misses_and_the_history_shows(plants):
    one, three = plants[1], plants[3]
    assert three["task"].observation_names[2:4] == ("temperature@t-1", "valve_position@t-1")
    assert three["dataset"].frame_stack == 3 and one["dataset"].frame_stack == 1
    # One row: the move two samples back is missing, and the earlier steps explain most
    # of the outlet's one-step error. Three rows: it is in the observation.
    assert _explained(one, "temperature") > 0.5
    assert _explained(three, "temperature") < 0.1
    # The position is the last move: nothing earlier explains it either way.
    assert _explained(one, "valve_position") < 0.1 and _explained(three, "valve_position") < 0.1


def test_the_history_check_chooses_the_rows_that_hold_the_delay(compared):
    report, plants = compared
    rows = {row["history"]: row for row in report["rows"]}
    # Each model scored on the same held-out episodes, over the fit's horizon.
    assert report["heldout_episodes"] == plants[1]["model"].card["dataset"]["holdout_episodes"]
    assert report["heldout_episodes"] == plants[3]["model"].card["dataset"]["holdout_episodes"]
    assert report["horizon"] == 10
    # One row misses the move two samples back; its open-loop error grows with it.
    one, three = rows[1]["long_horizon_error"], rows[3]["long_horizon_error"]
    assert three < 0.7 * one, (one, three)
    assert report["choice"] == 3
    assert rows[3]["errors"]["10"]["relative_rmse"] == three


def act(params, observation, key=None, deterministic=True):
    """``valve = 50 + gain (350 - T)``, in the policy's [-1, 1]: reads the newest row."""
    del key, deterministic
    valve = 50.0 + params["gain"] * (350.0 - observation[0])
    return jnp.clip(valve / 50.0 - 1.0, -1.0, 1.0)[None]


def test_the_verdict_on_the_rows_reproduces_today_and_clones_the_newest_row(plants):
    plant = plants[3]
    task, heldout = plant["task"], plant["heldout"]
    settings = VerdictSettings(fqe=False, horizon=40, bootstrap=300, bc_updates=300)
    candidates = VerdictCandidates(["P 0.4", "P 0.8"], act, {"gain": jnp.asarray([0.4, 0.8])})
    rules = PlantRules(plant["scaler"], cost_limits=(5.0,), cost_names=task.cost_names)
    verdict = model_verdict(candidates, heldout, plant["model"], rules, settings)
    assert verdict.calibration.status == "passed", verdict.calibration
    # The clone of the operators reads the newest row: earlier rows change nothing.
    clone = _behaviour_clone(heldout, settings)
    observations = np.asarray(heldout.transition_observations()[:64])
    shuffled = observations.copy()
    shuffled[:, 2:] = np.random.default_rng(0).permutation(shuffled[:, 2:])
    np.testing.assert_array_equal(
        *(np.asarray(clone.act(clone.params, jnp.asarray(o))) for o in (observations, shuffled))
    )


def test_a_policy_of_the_rows_is_served_the_whole_observation_by_name(plants, tmp_path):
    plant = plants[3]
    agent = Agent("bc", task=plant["task"], hidden=(16, 16))
    agent.fit(plant["dataset"], updates=200, seeds=(0,), chunk=200, evaluate=False)
    model = agent.export(tmp_path / "policy", signing_key=generate_key_pair(tmp_path / "keys"))
    names = plant["task"].observation_names
    rows = {name: value for name, value in zip(names, [352.0, 40.0] * 3, strict=True)}
    with TestClient(create_app(_settings(tmp_path, model))) as client:
        described = client.get("/v1/policy", headers=AS_ACT).json()
        assert described["observation"]["names"] == list(names)
        assert described["observation"]["history"] == 3
        answer = client.post("/v1/act", json={"observation": rows}, headers=AS_ACT)
        assert answer.status_code == 200, answer.text
        assert 0.0 <= answer.json()["action"][0] <= 100.0
        # One row is not the observation: the earlier rows are named as missing.
        newest = {name: rows[name] for name in names[:2]}
        refused = client.post("/v1/act", json={"observation": newest}, headers=AS_ACT)
        assert refused.status_code == 422
        assert "missing 4 of the 6 names: 'temperature@t-1'" in refused.text


def test_model_history_compares_the_log_s_histories_and_says_which_to_set(tmp_path, capsys):
    """``model history`` is the check a user runs on their own log: small settings here,
    the same answer as the fixture's (three rows hold the delay)."""
    from neorl_industrial import cli

    write_log(tmp_path / "log.csv")
    (tmp_path / "schema.yaml").write_text(SCHEMA)
    argv = ["model", "history", "--data", str(tmp_path / "log.csv")]
    argv += ["--schema", str(tmp_path / "schema.yaml"), "--histories", "1,3"]
    argv += ["--hidden", "32,32", "--members", "3", "--elites", "3", "--updates", "1000"]
    argv += ["--chunk", "500", "--batch-size", "64", "--horizon", "10", "--windows", "16"]
    argv += ["--json", str(tmp_path / "history.json")]
    assert cli.main(argv) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "Choose history: 3 (the shortest history whose open-loop error at 10 steps" in said
    assert "Set history: 3 in" in said
    report = json.loads((tmp_path / "history.json").read_text())
    assert report["choice"] == 3 and [row["history"] for row in report["rows"]] == [1, 3]
    # The schema is the user's: the check does not change it.
    assert (tmp_path / "schema.yaml").read_text() == SCHEMA


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--histories", "3"], "expected at least two histories"),
        (["--histories", "1,x"], "expected histories such as 1,3,10"),
        (["--histories", "0,3"], "expected at least two histories >= 1"),
    ],
)
def test_model_history_refuses_bad_histories(argv, message, tmp_path, capsys):
    from neorl_industrial import cli

    base = ["model", "history", "--data", str(tmp_path / "log.csv"), "--schema", "s.yaml"]
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*base, *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_model_history_needs_a_plant_log_and_its_schema(tmp_path, capsys):
    from neorl_industrial import cli

    write_log(tmp_path / "log.csv")
    (tmp_path / "schema.yaml").write_text(SCHEMA)
    folder = tmp_path / "imported"
    assert cli.main(["datasets", "import", str(tmp_path / "log.csv"), "--schema",
                     str(tmp_path / "schema.yaml"), "--out", str(folder)]) == 0  # fmt: skip
    capsys.readouterr()
    argv = ["model", "history", "--data", str(folder), "--schema", str(tmp_path / "schema.yaml")]
    assert cli.main(argv) != 0
    said = " ".join(capsys.readouterr().err.split())
    assert "model history: expects a plant log (.csv or .parquet) and its --schema" in said
