"""A heater whose fuel's heat reaches the outlet two samples after the valve moves: one
logged row does not show what the outlet answers to, the last three rows do (the schema's
``history: 3``). The plant model's memory check says so, the verdict judges with a model
that sees the delay and reproduces today's operation, its clone of the operators reads
the newest row, and a policy of the stacked rows exports and serves by name."""

from __future__ import annotations

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
from tests.wrappers.training.heater_plant import fitted_plant, write_csv

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
def plants(tmp_path_factory):
    """The same log imported with one row per observation and with the last three."""
    return {
        history: fitted_plant(
            tmp_path_factory.mktemp(f"delayed-heater-{history}"),
            SCHEMA + f"history: {history}\n",
            write_log,
        )
        for history in (1, 3)
    }


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
