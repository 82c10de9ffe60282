"""MLflow gets the plan a run uses, not the configuration's defaults: a plant run (a log
imported with no simulator behind it) logs no simulator settings, a simulator run logs
the ones it uses, and every run has its training data as an MLflow dataset input.

Nothing trains here: the tracker of a resolved plan opens its runs in a real store as a
training run does (``on_train_begin``), and the store is read back."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from neorl_industrial.cli.run_glue import plan_run
from neorl_industrial.integration.datasets import load_any, save_native
from neorl_industrial.integration.mlflow import flatten
from neorl_industrial.integration.mlflow.run_logging import open_tracker, plan_params
from neorl_industrial.integration.mlflow.tracking import summary_entries, ui_links
from neorl_industrial.wrappers.training import RunConfig
from tests.shared import mlflow_store

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "mixing-tank"
SIMULATOR_FIELDS = ("data.quality", "data.trajectories", "data.seed")
SIMULATOR_EVALUATION = ("evaluation.episodes", "evaluation.horizon", "evaluation.shield")


@pytest.fixture(scope="module")
def plant_data(tmp_path_factory):
    dataset, card = load_any(EXAMPLE / "mixing_tank.csv", schema=EXAMPLE / "schema.yaml")
    path = tmp_path_factory.mktemp("plant") / "mixing-tank"
    save_native(dataset, path, card)
    return path


def _plant_config(tmp: Path, data: Path, **sections) -> RunConfig:
    values = {
        "name": "plant",
        "output": str(tmp / "runs"),
        "data": {"path": str(data)},
        "algorithm": {"name": "td3bc-lag", "hyperparameters": {"hidden": [8]}},
        "training": {"updates": 20, "chunk": 10, "seeds": [0, 1]},
        "safety": {"constraints": str(EXAMPLE / "constraints.yaml")},
        "tracking": {"uri": mlflow_store(tmp)},
        **sections,
    }
    return RunConfig.from_dict(values)


def _open_runs(plan):
    """The tracker of ``plan`` after a training run's first callback, closed: the runs as
    a run that stopped there leaves them."""
    tracker = open_tracker(plan, None)
    tracker.on_train_begin(types.SimpleNamespace(seeds=list(plan.training.seeds)), 0, 20)
    tracker.sender.wait_idle(60)
    links = tracker.links()
    summary = tracker.close()
    assert summary.complete, summary.errors
    return tracker, summary, links


def test_a_plant_run_logs_what_it_uses_and_no_simulator_fields(tmp_path, plant_data):
    from mlflow import MlflowClient

    plan = plan_run(_plant_config(tmp_path, plant_data))
    assert not plan.task.has_simulator
    tracker, summary, links = _open_runs(plan)
    client = MlflowClient(tracking_uri=tracker.tracking_uri)
    parent = client.get_run(summary.run_ids["parent"])
    params = parent.data.params
    for field in (*SIMULATOR_FIELDS, *SIMULATOR_EVALUATION, "evaluation.seed"):
        assert field not in params, field
    assert not [key for key in params if key.startswith("env.")]
    # Where files and the store are is no setting of the run.
    assert not {"output", "name", "tracking.uri", "tracking.enabled"} & set(params)
    assert params["data.path"] == str(plant_data) and "data.allow_mismatch" not in params
    assert params["data.transitions"] == str(plan.facts["transitions"])
    assert params["evaluation.ope.updates"] == "2000"  # FQE is how a plant run is evaluated
    assert params["training.updates"] == "20" and params["training.seeds"] == "[0, 1]"
    assert params["algorithm.hyperparameters.hidden"] == "[8]"
    # The registered model's name comes from the task (the plant's dataset).
    assert params["tracking.registered_model"] == "mixing-tank-policy"
    assert json.loads(params["safety.cost_limits.resolved"]) == [30.0]

    # Every run's input is the dataset: the card's name, the data's fingerprint.
    fingerprint = parent.data.tags["dataset.fingerprint"]
    for run_id in summary.run_ids.values():
        inputs = client.get_run(run_id).inputs.dataset_inputs
        assert len(inputs) == 1
        dataset = inputs[0].dataset
        assert (dataset.name, dataset.digest) == ("mixing-tank", fingerprint)
        assert dataset.source_type == "local"
        assert json.loads(dataset.source)["uri"] == str(plant_data.absolute())
        columns = [c["name"] for c in json.loads(dataset.schema)["mlflow_colspec"]]
        assert columns[:3] == ["observation.level_m", "observation.temperature_c",
                               "observation.inflow_m3h"]  # fmt: skip
        assert columns[3:] == ["action.valve_pct", "action.pump_pct", "reward", "cost.high_level"]
        assert json.loads(dataset.profile)["transitions"] == plan.facts["transitions"]
        assert {(t.key, t.value) for t in inputs[0].tags} == {("mlflow.data.context", "training")}

    experiment = parent.info.experiment_id
    assert tracker.experiment_id == experiment
    assert links == {
        "runs": f"http://127.0.0.1:5000/#/experiments/{experiment}/runs"
        "?workflowType=machine_learning",
        "run": f"http://127.0.0.1:5000/#/experiments/{experiment}/runs/{parent.info.run_id}"
        "?workflowType=machine_learning",
    }


def test_a_simulator_run_logs_the_simulator_settings_it_uses():
    values = {
        "env": {"id": "IB-classic-v0", "params": {"setpoint": 30.0}},
        "data": {"quality": "random", "trajectories": 2},
        "tracking": {"registered_model": None},
    }
    plan = plan_run(RunConfig.from_dict(values))
    params = flatten(plan_params(plan, None))
    assert params["env.id"] == "IB-classic-v0" and params["env.params.setpoint"] == "30.0"
    assert (params["data.quality"], params["data.trajectories"]) == ("random", "2")
    # The horizon the evaluation uses: the simulator's, when the run leaves it open.
    assert params["evaluation.horizon"] == str(plan.task.episode_length)
    assert params["evaluation.episodes"] == "10" and params["evaluation.shield"] == "true"
    assert "data.path" not in params
    # Off-policy evaluation runs beside the simulator only when asked.
    assert not [key for key in params if key.startswith("evaluation.ope.")]
    assert params["tracking.registered_model"] == "ib-policy"
    # Held-out episodes need a few of them (the plan splits them off when it resolves).
    always = plan.config.with_overrides(["evaluation.ope.always=true", "data.trajectories=5"])
    both = flatten(plan_params(plan_run(always), None))
    assert both["evaluation.ope.updates"] == "2000"


def test_a_sweeps_parent_leaves_the_swept_values_to_its_configurations():
    values = {"data": {"quality": "random", "trajectories": 2}}
    values["algorithm"] = {"name": "td3bc-lag", "hyperparameters": {"alpha": 2.5, "hidden": [8]}}
    plan = plan_run(RunConfig.from_dict(values))
    params = flatten(plan_params(plan, {"alpha": [1.0, 4.0]}))
    assert "algorithm.hyperparameters.alpha" not in params
    assert params["algorithm.hyperparameters.hidden"] == "[8]"


def test_an_evaluations_settings_are_params_and_its_results_metrics():
    summary = {
        "return": {"mean": -12.5, "ci": 1.25, "n": 2},
        "normalized_cost": {"mean": 0.5, "ci": None, "n": 2},
        "fqe_updates": {"mean": 2000.0, "ci": 0.0, "n": 2},
        "discount": {"mean": 0.99, "ci": 0.0, "n": 2},
        "heldout_episodes": {"mean": 3.0, "ci": 0.0, "n": 2},
    }
    metrics, params = summary_entries(summary, "ope/", estimated=True)
    assert metrics == {"ope/return_mean": -12.5, "ope/return_ci95": 1.25,
                       "ope/normalized_cost_mean": 0.5}  # fmt: skip
    assert params == {"ope.fqe_updates": "2000", "ope.discount": "0.99",
                      "ope.heldout_episodes": "3"}  # fmt: skip
    # A simulator's episodes are the run's evaluation.episodes: neither metric nor param.
    simulated = summary_entries({"episodes": {"mean": 10.0, "ci": 0.0}}, "eval/", estimated=False)
    assert simulated == ({}, {})


def test_links_to_the_ui_of_a_server_and_of_a_local_store():
    assert ui_links("http://mlflow.example:5000/", "7", "abc") == {
        "runs": "http://mlflow.example:5000/#/experiments/7/runs?workflowType=machine_learning",
        "run": "http://mlflow.example:5000/#/experiments/7/runs/abc?workflowType=machine_learning",
    }
    local = ui_links("sqlite:///mlflow.db", "1")
    assert local == {
        "runs": "http://127.0.0.1:5000/#/experiments/1/runs?workflowType=machine_learning"
    }
    assert ui_links("sqlite:///mlflow.db", None, "abc") == {}


def test_a_run_prints_the_links_whole_on_a_narrow_terminal():
    from rich.console import Console

    from neorl_industrial.cli.training import _print_tracking

    links = ui_links("sqlite:///mlflow.db", "3", "0123456789abcdef0123456789abcdef")
    console = Console(record=True, width=60)
    _print_tracking(
        console,
        {"run_id": "r", "experiment": "neorl-industrial", "uri": "sqlite:///mlflow.db",
         "ui": "mlflow ui --backend-store-uri sqlite:///mlflow.db --port 5000", "links": links},
    )  # fmt: skip
    lines = console.export_text().splitlines()
    assert f"  training runs: {links['runs']}" in lines  # one line: copied whole
    assert f"  this run:      {links['run']}" in lines
    quiet = Console(record=True, width=60)
    _print_tracking(quiet, {"run_id": None, "experiment": "e", "uri": "u", "ui": "x", "links": {}})
    assert "training runs" not in quiet.export_text()  # nothing reached the store
