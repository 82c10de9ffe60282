"""The whole journey for a plant with no simulator behind it, on the shipped example log
(examples/mixing-tank), run as the README prints it: import, train (off-policy
evaluation), evaluate --ope, serve, two requests (one the shield passes, one it
overrides); then the outputs, one more request of the wrong length, and MLflow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from neorl_industrial.cli import main
from neorl_industrial.integration.deployment import ServerSettings, create_app
from tests.compile_flags import user_environment
from tests.processes import free_port
from tests.readme import link_repository, plant_journey


@pytest.fixture(scope="module")
def journey(tmp_path_factory):
    root = tmp_path_factory.mktemp("plant")
    link_repository(root)
    # As printed, but on a free port (8000 may be taken on a test machine).
    script = plant_journey().replace("8000", str(free_port()))
    environment = {
        **user_environment(),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    environment.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=root,
        env=environment,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    decoder, responses, start = json.JSONDecoder(), [], done.stdout.find('{"action"')
    while start >= 0:
        response, end = decoder.raw_decode(done.stdout, start)
        responses.append(response)
        start = done.stdout.find('{"action"', end)
    return {
        "root": root,
        "dataset": root / "datasets" / "mixing-tank",
        "run": root / "runs" / "mixing-tank-iql-lag",
        "uri": f"sqlite:///{root / 'mlflow.db'}",
        "responses": responses,
        "stdout": done.stdout,
    }


def test_training_on_a_plant_log_is_evaluated_off_policy_and_says_so(journey):
    report = json.loads((journey["run"] / "report.json").read_text())
    assert report["task"]["kind"] == "plant" and report["env"] is None
    assert report["task"]["actions"] == ["valve_pct", "pump_pct"]
    assert report["task"]["action_units"] == ["%", "%"]
    assert report["evaluation"] == "fqe"
    assert report["cost_limits"] == [30.0] and report["cost_limit_sources"] == ["task"]
    best = report["best"][report["selected_run"]]["metrics"]
    assert best["estimate"] == "fqe" and best["heldout_episodes"] >= 1
    assert best["return_ci"] is not None and best["normalized_cost"] >= 0
    assert report["outputs"]["policy"]
    # IQL-Lag trains on the IQL paper's reward scaling, fitted on the log's episodes
    assert report["training"]["reward_scale"]["kind"] == "return_range"


def test_evaluate_needs_logged_data_for_a_plant_and_estimates_with_it(journey, capsys):
    # The README's `evaluate --ope` printed the estimates of the three runs.
    printed = " ".join(journey["stdout"].split())
    assert "off-policy estimates" in printed and "behaviour" in printed
    agent = str(journey["run"] / "agent")
    assert main(["--no-cache", "evaluate", agent]) == 2
    assert "has no simulator" in capsys.readouterr().out


def test_the_served_plant_policy_speaks_plant_units_through_the_plants_shield(journey):
    calm, held = journey["responses"]
    valve, pump = calm["action"]
    assert 30.0 <= valve <= 60.0 and 10.0 <= pump <= 100.0  # percent, not [-1, 1]
    assert set(calm["report"]["margin"]) == {
        "bounds/valve_pct",
        "bounds/pump_pct",
        "rate/valve_pct",
        "pump-hard-when-level-high",
        "valve-not-far-above-pump",
    }
    # The valve was at 95 %: it may close by 15 % per step at most, whatever the policy
    # proposes, and with the level high the pump must run at 60 % or more.
    report = held["report"]
    valve, pump = held["action"]
    assert report["overridden"] and "rate/valve_pct" in report["violated"]
    assert valve >= 80.0 - 1e-3 and pump >= 60.0 - 1e-3 and valve - pump <= 40.0 + 1e-3
    # The key pair the run made beside itself (keys/), as `serve` in that directory finds it;
    # one observation at a time (one compiled batch size, not nine: the request is refused
    # before any policy runs).
    settings = ServerSettings(
        model=str(journey["run"] / "policy"),
        auth=False,
        trusted_keys=[journey["root"] / "keys" / "policy-signing.pub"],
        batch_sizes=[1],
        max_batch=1,
    )
    with TestClient(create_app(settings)) as client:
        wrong = client.post("/v1/act", json={"observation": [2.7, 50.0]})
    assert wrong.status_code == 422
    assert "expected 3 values" in json.dumps(wrong.json())


def test_the_plant_run_lands_in_mlflow_with_its_registered_model(journey):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(journey["uri"])
    runs = client.search_runs(
        [client.get_experiment_by_name("neorl-industrial").experiment_id],
        "tags.`task.kind` = 'plant'",
    )
    parents = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    assert len(parents) == 1 and len(runs) == 4, "a parent run and a run per seed"
    run = parents[0]
    assert {"ope/return", "best/ope_return_mean"} <= set(run.data.metrics)
    assert run.data.tags["evaluation"] == "fqe"
    # the plan a plant run uses: no simulator's fields; its log as the dataset input
    assert not {"data.quality", "data.trajectories"} & set(run.data.params)
    assert not any(name.startswith("env.") for name in run.data.params)
    assert [d.dataset.name for d in run.inputs.dataset_inputs] == ["mixing-tank"]
    artifacts = {item.path for item in client.list_artifacts(run.info.run_id)}
    assert {"plots", "agent", "config.yaml", "dataset.json"} <= artifacts
    versions = client.search_model_versions("name = 'mixing-tank-policy'")
    assert versions and versions[0].tags.get("env") == "mixing-tank"
