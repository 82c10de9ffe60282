"""A plant model from a plant log with no simulator: fitted and inspected through the
command line, known channels computed, saved and loaded, and bad input refused."""

from __future__ import annotations

import contextlib
import io
import json
import textwrap
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest

from neorl_industrial import cli
from neorl_industrial.core.environments import Task
from neorl_industrial.functional.transformations.dynamics_memory import one_step_errors
from neorl_industrial.integration.datasets import load_any
from neorl_industrial.wrappers.models import (
    FitSettings,
    OutsideDataWarning,
    PlantModel,
    PlantModelError,
)
from neorl_industrial.wrappers.models.model_programs import predict_program
from tests.shared import mlflow_store

SCHEMA = """\
name: heater-2
timestamp: time
sampling_period: 60
observations:
  - {column: temperature, unit: degC, bounds: [0, 500]}
  - {column: pressure, unit: bar}
actions:
  - {column: valve, unit: "%", bounds: [0, 100]}
reward: -abs(temperature - 350) - 0.01 * valve
costs:
  - {name: overheating, expression: "max(temperature - 365, 0)", limit: 5.0}
  - {name: alarm}
"""


def write_log(path, episodes: int, steps: int, seed: int = 0):
    """A heater under a noisy operator: ``T' = 0.8 T + 0.2 (300 + valve) + noise``,
    pressure following the temperature; an alarm column the schema does not define.
    Episodes are separated by an hour's gap."""
    rng = np.random.default_rng(seed)
    seconds, temperature, pressure, valve, alarm = [], [], [], [], []
    stamp = 0
    for _ in range(episodes):
        t = rng.uniform(330, 370)
        for _ in range(steps + 1):
            v = float(np.clip(50 + 0.8 * (350 - t) + rng.normal(0, 8), 0, 100))
            seconds.append(stamp)
            temperature.append(t)
            pressure.append(1.0 + 0.01 * t + rng.normal(0, 0.01))
            valve.append(v)
            alarm.append(float(t > 362 and rng.random() < 0.5))
            t = 0.8 * t + 0.2 * (300 + v) + rng.normal(0, 0.5)
            stamp += 60
        stamp += 3600
    table = pa.table(
        {
            "time": pa.array(np.datetime64("2024-03-01T00:00:00", "s") + np.asarray(seconds)),
            "temperature": temperature,
            "pressure": pressure,
            "valve": valve,
            "alarm": alarm,
        }
    )
    pcsv.write_csv(table, path)
    return path


@pytest.fixture(scope="module")
def plant(tmp_path_factory):
    root = tmp_path_factory.mktemp("plant")
    log = write_log(root / "heater.csv", episodes=12, steps=30)
    schema = root / "schema.yaml"
    schema.write_text(textwrap.dedent(SCHEMA))
    out = root / "model"
    argv = ["model", "fit", "--data", str(log), "--schema", str(schema), "--out", str(out)]
    argv += ["--hidden", "32,32", "--members", "3", "--elites", "2", "--updates", "600"]
    argv += ["--chunk", "300", "--batch-size", "64", "--horizon", "12", "--windows", "16"]
    argv += ["--window-steps", "3"]  # each member trained 3 steps on its own predictions
    argv += ["--track", "--tracking-uri", mlflow_store(root)]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert cli.main(argv) == 0
    (root / "fit.out").write_text(printed.getvalue())
    return root, log, schema, out


def test_fit_through_the_cli_saves_card_fidelity_and_plot(plant, capsys):
    root, log, schema, out = plant
    said = " ".join((root / "fit.out").read_text().split())
    assert "each member trained on 3-step windows of its own predictions" in said
    card = json.loads((out / "model.json").read_text())
    assert (out / "trajectories.png").read_bytes()[:4] == b"\x89PNG"
    assert card["task"]["name"] == "heater-2" and card["task"]["env_id"] is None
    # Known channels are computed from the predicted observations, the alarm is learned.
    assert card["signals"]["reward"].startswith("computed")
    assert card["signals"]["overheating"].startswith("computed")
    assert card["signals"]["alarm"].startswith("learned")
    known = {s["channel"]: s["row"] for s in card["layout"]["known"]["signals"]}
    assert known == {"reward": "current", "overheating": "current"}
    dataset, _ = load_any(log, schema=schema)
    from neorl_industrial.wrappers.models import dataset_fingerprint

    assert card["dataset"]["fingerprint"] == dataset_fingerprint(dataset)
    assert card["dataset"]["n_transitions"] == 12 * 30
    assert card["settings"]["window_steps"] == 3
    assert len(card["dataset"]["holdout_episodes"]) == 2  # 20 % of 12 episodes
    rows = card["fidelity"]["rows"]
    assert {(r["name"], r["step"]) for r in rows} >= {("temperature", 1), ("temperature", 12)}
    temperature = next(r for r in rows if r["name"] == "temperature" and r["step"] == 1)
    assert temperature["unit"] == "degC" and 0.0 <= temperature["coverage"] <= 1.0
    assert temperature["rmse"] < 10.0  # degC: a spread of ~10, a model of 600 updates
    # The reward, computed from the current (logged) row, is exact one step ahead: its
    # zero-width interval holds the logged value (within the tolerance it was matched to).
    reward = next(r for r in rows if r["name"] == "reward" and r["step"] == 1)
    assert reward["coverage"] == 1.0
    # Predictions are held to the schema's physical range; without one, to the data's.
    physics = card["physics"]
    assert physics["features"]["temperature"] == {"low": 0.0, "high": 500.0, "source": "schema"}
    pressure = physics["features"]["pressure"]
    assert pressure["source"] == "data" and 4.0 < pressure["low"] < pressure["high"] < 5.0
    assert physics["from_data"] == ["pressure"]
    assert (
        physics["note"] == "no physical range in the schema for pressure: the data's range is used"
    )
    assert physics["cost_high"][1] == 1.0  # the alarm: at most 1 a step
    # The memory check: the share of each feature's one-step error the 3 earlier steps
    # explain, out of sample over the 2 held-out episodes (a heater fully observed).
    memory = card["fidelity"]["memory"]
    assert (memory["lags"], memory["episodes"], memory["transitions"]) == (3, 2, 2 * 27)
    assert [row["name"] for row in memory["rows"]] == ["temperature", "pressure"]
    assert all(0.0 <= row["explained"] <= 1.0 for row in memory["rows"])
    assert "Share of the model's one-step error the earlier steps (1 to 3 back) explain" in said
    assert f"temperature {100 * memory['rows'][0]['explained']:.0f} %" in said

    capsys.readouterr()
    assert (
        cli.main(["model", "inspect", str(out), "--data", str(log), "--schema", str(schema)]) == 0
    )
    printed = " ".join(capsys.readouterr().out.split())
    assert "heater-2" in printed and "measured now" in printed and "temperature" in printed
    assert "computed: -abs(temperature - 350) - 0.01 * valve" in printed


def test_the_fit_is_tracked_in_mlflow(plant):
    from mlflow import MlflowClient

    root, _, _, out = plant
    client = MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    experiment = client.get_experiment_by_name("plant-model/heater-2")
    (run,) = client.search_runs([experiment.experiment_id])
    card = json.loads((out / "model.json").read_text())
    assert run.data.tags["dataset_fingerprint"] == card["dataset"]["fingerprint"]
    assert run.data.params["config.n_members"] == "3"
    row = next(r for r in card["fidelity"]["rows"] if r["name"] == "temperature")
    logged = run.data.metrics[f"fidelity/temperature/rmse_{row['step']}"]
    assert logged == pytest.approx(row["rmse"])
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "plant_model")}
    assert "plant_model/model.json" in artifacts and "plant_model/params.msgpack" in artifacts


def test_the_one_step_errors_are_the_fidelity_tables_first_step(plant):
    """The memory check's one-step errors on every held-out transition, and the fidelity
    table's error one step ahead of its windows: the same prediction."""
    _, log, schema, out = plant
    dataset, card = load_any(log, schema=schema)
    model = PlantModel.load(out, dataset=dataset, task=card.task(dataset))
    holdout = np.asarray(model.card["dataset"]["holdout_episodes"])
    held = model._unit_actions(dataset).select_episodes(holdout)
    program = predict_program(model.dynamics)
    params = model.params(0)
    errors = one_step_errors(lambda o, a: program(params, o, a)["next_observation"], held)
    assert errors.shape == (held.n_transitions, 2)
    # the error of a transition is its logged next observation minus the model's predict
    last = held.n_transitions - 1
    frames = np.asarray(held.observations)[np.asarray(held.observation_index)[[0, last]] + 1]
    observations = np.asarray(held.observations_at(held.observation_index[np.array([0, last])]))
    point = program(params, observations, np.asarray(held.actions)[[0, last]])
    np.testing.assert_allclose(
        errors[[0, last]], frames - np.asarray(point["next_observation"]), rtol=1e-5, atol=1e-4
    )
    first = next(r for r in model.fidelity_rows if r["name"] == "temperature" and r["step"] == 1)
    rmse = float(np.sqrt(np.mean(np.square(errors[:, 0]))))
    assert 0.5 * first["rmse"] < rmse < 2.0 * first["rmse"]


def test_saved_model_predicts_as_fitted_and_flags_inputs_outside_its_data(plant):
    _, log, schema, out = plant
    dataset, card = load_any(log, schema=schema)
    model = PlantModel.load(out, dataset=dataset, task=card.task(dataset))
    observations = np.asarray([[350.0, 4.5], [352.0, 4.52]], np.float32)
    actions = np.asarray([[40.0], [45.0]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", OutsideDataWarning)  # inside the data: no warning
        prediction = model.predict(observations, actions)
    assert prediction["next_observation"].shape == (2, 2)
    # The known reward is exact on the current row: -|T - 350| - 0.01 valve.
    np.testing.assert_allclose(prediction["reward"], [-0.4, -2.45], rtol=1e-5)
    assert not prediction["outside_data"].any()
    assert model.outside_data(observations, actions) == []


def test_a_question_outside_the_data_is_answered_flagged_and_named(plant):
    _, log, schema, out = plant
    dataset, card = load_any(log, schema=schema)
    model = PlantModel.load(out, dataset=dataset, task=card.task(dataset))
    # the range of the episodes it was fitted on (the held-out ones are not its data)
    fitted = dataset.select_episodes(np.asarray(model.card["dataset"]["train_episodes"]))
    high = float(np.asarray(fitted.observations)[:, 0].max())
    # 80 degC above anything logged: answered, flagged, and the warning names the
    # feature, its value and the data's bound, in degC.
    with pytest.warns(OutsideDataWarning, match=r"predict: asked outside .*'heater-2'") as caught:
        far = model.predict(np.asarray([[high + 80.0, 4.5], [350.0, 4.5]]), np.asarray([[40.0]]))
    assert far["outside_data"].tolist() == [True, False] and far["out_of_distribution"][0] > 1.0
    (feature,) = caught[0].message.features
    assert (feature.name, feature.unit, feature.side, feature.rows) == (
        "temperature",
        "degC",
        "above",
        1,
    )
    assert feature.value == pytest.approx(high + 80.0) and feature.bound == pytest.approx(high)
    assert f"temperature = {high + 80.0:.4g} degC, above the data's highest {high:.4g} degC" in str(
        caught[0].message
    )
    # A valve beyond anything the operators did (and beyond its plant bounds), in %.
    logged = np.asarray(fitted.actions)[:, 0]
    with pytest.warns(
        OutsideDataWarning, match=r"valve = 130 %, above the data's highest"
    ) as caught:
        beyond = model.predict(np.asarray([[350.0, 4.5]]), np.asarray([[130.0]]))
    assert beyond["outside_data"].all()
    assert caught[0].message.features[0].bound == pytest.approx(logged.max(), abs=1e-3)
    below = model.outside_data(np.asarray([[350.0, 4.5]]), np.asarray([[logged.min() - 5.0]]))
    assert [(f.name, f.side) for f in below] == [("valve", "below")]
    assert below[0].bound == pytest.approx(logged.min(), abs=1e-3)
    # A rollout driven far past the data (the burner shut, below anything logged): its own
    # predicted states leave the data, and it says so.
    with pytest.warns(OutsideDataWarning) as caught:
        model.rollout(np.asarray([[350.0, 4.5]]), np.full((1, 20, 1), 0.0), deterministic=True)
    message = str(caught[0].message)
    assert "rollout: the predicted states leave the range" in message
    assert "predicted states)" in message and "temperature" in message


def test_rollout_and_size_checks(plant):
    _, log, schema, out = plant
    dataset, card = load_any(log, schema=schema)
    model = PlantModel.load(out, dataset=dataset, task=card.task(dataset))
    observations = np.asarray([[350.0, 4.5], [352.0, 4.52]], np.float32)
    actions = np.asarray([[40.0], [45.0]], np.float32)
    rollout = model.rollout(observations, np.repeat(actions[:, None], 5, axis=1), key=1)
    assert rollout["observations"].shape == (2, 6, 2) and rollout["costs"].shape == (2, 5, 2)
    np.testing.assert_allclose(
        rollout["rewards"][:, 0], -np.abs(observations[:, 0] - 350) - 0.01 * actions[:, 0]
    )
    with pytest.raises(PlantModelError, match="observations: expected 2 values"):
        model.predict(np.zeros((1, 3)), actions[:1])
    with pytest.raises(PlantModelError, match="NaN"):
        model.predict(np.full((1, 2), np.nan), actions[:1])


def test_a_model_is_refused_against_another_dataset_or_task(plant, tmp_path, capsys):
    _, _, schema, out = plant
    other_log = write_log(tmp_path / "other.csv", episodes=12, steps=30, seed=5)
    other, card = load_any(other_log, schema=schema)
    with pytest.raises(PlantModelError, match=r"fingerprint .* is not that of 'heater-2'"):
        PlantModel.load(out, dataset=other, task=card.task(other))
    renamed = Task.from_dict(card.task(other).to_dict() | {"name": "boiler-7"})
    with pytest.raises(PlantModelError, match=r"task 'boiler-7' .* is not the model's task"):
        PlantModel.load(out, task=renamed)
    capsys.readouterr()
    argv = ["model", "inspect", str(out), "--data", str(other_log), "--schema", str(schema)]
    assert cli.main(argv) == 2
    assert "fitted on" in capsys.readouterr().err


def test_a_dataset_too_small_for_a_held_out_split_is_refused_with_its_numbers(
    plant, tmp_path, capsys
):
    _, _, schema, _ = plant
    small = write_log(tmp_path / "small.csv", episodes=1, steps=30)
    argv = ["model", "fit", "--data", str(small), "--schema", str(schema)]
    argv += ["--out", str(tmp_path / "m")]
    assert cli.main(argv) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "30 transitions in 1 episode(s)" in error and "held out" in error
    few = write_log(tmp_path / "few.csv", episodes=5, steps=3)
    dataset, card = load_any(few, schema=schema)
    with pytest.raises(PlantModelError, match=r"holds out 3 transitions .* at least 20"):
        PlantModel(card.task(dataset)).fit(dataset, FitSettings(max_updates=1))
    assert not (tmp_path / "m").exists()
    with pytest.raises(PlantModelError, match="window_steps: expected a positive integer"):
        FitSettings(window_steps=0)


def test_definitions_outside_the_grammar_or_the_task_are_refused(plant):
    _, log, schema, _ = plant
    dataset, card = load_any(log, schema=schema)
    task = card.task(dataset)
    with pytest.raises(PlantModelError, match=r"definitions.reward: .*not allowed"):
        PlantModel(task, definitions={"reward": "temperature.real"})
    with pytest.raises(PlantModelError, match=r"\['leak'\] are neither"):
        PlantModel(task, definitions={"leak": "pressure"})


def test_unfitted_missing_and_simulator_less_models_say_so(plant, tmp_path):
    _, log, schema, out = plant
    dataset, card = load_any(log, schema=schema)
    task = card.task(dataset)
    with pytest.raises(PlantModelError, match="not fitted"):
        PlantModel(task).save(tmp_path / "m")
    with pytest.raises(PlantModelError, match="is not a saved plant model"):
        PlantModel.load(tmp_path)
    (tmp_path / "model.json").write_text('{"format": "something-else"}')
    with pytest.raises(PlantModelError, match="format 'something-else'"):
        PlantModel.load(tmp_path)
    model = PlantModel.load(out)
    with pytest.raises(PlantModelError, match="'heater-2' has no simulator"):
        model.simulator_fidelity(episodes=2)
    with pytest.raises(PlantModelError, match="exists"):
        model.save(out.parent / "heater.csv")
