"""A short training run tracked in MLflow, read back as a user would: through
``MlflowClient``, the pyfunc model, ``mlflow models serve`` and the CLI. The run is the
main job as ``neorl-industrial run`` runs it (at a small size); the command's own output,
refusals, resume, evaluation and export are checked on the same run."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks.harness import free_port, interpreter_environment, wait_for_http
from neorl_industrial import cli
from neorl_industrial.cli import run_glue
from neorl_industrial.cli.run_glue import run_training
from neorl_industrial.wrappers.training import RunConfig
from tests.shared import mlflow_store

SMALL_RUN = {
    "data": {"trajectories": 2},
    "algorithm": {"name": "td3bc-lag", "hyperparameters": {"hidden": [16, 16]}},
    "training": {"updates": 100, "chunk": 50, "batch_size": 32, "seeds": [0, 1]},
    "evaluation": {"every": 50, "episodes": 2, "horizon": 50},
    "checkpoints": {"every": 50},
}
MODEL = "test-policy"
ROOT = Path(__file__).resolve().parents[3]


def _config(tmp: Path, uri: str, name: str, **tracking) -> RunConfig:
    values = {
        **SMALL_RUN,
        "name": name,
        "output": str(tmp / "runs"),
        "tracking": {"uri": uri, "registered_model": MODEL, "promote": True, **tracking},
        # Signed: the registry promotes signed policies only.
        "export": {"signing_keys": str(tmp / "keys"), "create_keys": True},
    }
    return RunConfig.from_dict(values)


def _sets(values: dict, prefix: str = "") -> list[str]:
    """``values`` as the command line's ``--set key=value`` arguments."""
    arguments = []
    for key, value in values.items():
        if isinstance(value, dict):
            arguments += _sets(value, f"{prefix}{key}.")
        else:
            arguments += ["--set", f"{prefix}{key}={json.dumps(value)}"]
    return arguments


def _main_job(tmp: Path, uri: str) -> list[str]:
    """``neorl-industrial run`` (the main job) at SMALL_RUN's size, named ``first``,
    tracked in ``uri`` and signed with a key pair it makes under ``tmp``."""
    values = {
        **SMALL_RUN,
        "name": "first",
        "output": str(tmp / "runs"),
        "tracking": {"uri": uri, "registered_model": MODEL},
        "export": {"signing_keys": str(tmp / "keys")},
    }
    return ["--no-cache", "run", *_sets(values)]


@pytest.fixture(scope="module")
def main_job(tmp_path_factory):
    """The main job run once for the module, as a person runs it: what it printed, and
    the outcome the command's ``run_training`` returned (recorded on its way out)."""
    tmp = tmp_path_factory.mktemp("tracked")
    uri = mlflow_store(tmp)
    outcomes = []

    def recorded(*args, **kwargs):
        outcomes.append(run_training(*args, **kwargs))
        return outcomes[-1]

    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        patch.setattr(run_glue, "run_training", recorded)
        assert cli.main(_main_job(tmp, uri)) == 0
    (outcome,) = outcomes
    return {"outcome": outcome, "printed": printed.getvalue(), "uri": uri, "tmp": tmp}


@pytest.fixture(scope="module")
def tracked(main_job):
    from mlflow import MlflowClient

    uri = main_job["uri"]
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    return main_job["outcome"], client, uri, main_job["tmp"]


def test_the_main_job_trains_saves_exports_reports_and_refuses_to_overwrite(main_job, capsys):
    tmp, run = main_job["tmp"], main_job["outcome"].run_dir
    assert run == tmp / "runs" / "first"
    assert (run / "policy" / "signature.json").is_file()
    assert (tmp / "keys" / "policy-signing.key").stat().st_mode & 0o077 == 0
    for part in ("agent/agent.json", "policy/manifest.json", "report.json", "config.yaml"):
        assert (run / part).is_file(), part
    out = main_job["printed"]
    assert "best evaluation of each run" in out and str(run / "agent") in out
    assert "training runs: http://127.0.0.1:5000/#/experiments/" in out
    report = json.loads((run / "report.json").read_text())
    assert report["training"]["updates"] == 100 and len(report["best"]) == 2
    assert all(b["metrics"]["hard_violation_steps"] == 0 for b in report["best"])

    # A second run into the same directory is refused; nothing is overwritten.
    before = (run / "report.json").read_text()
    assert cli.main(_main_job(tmp, main_job["uri"])) == 2
    refused = capsys.readouterr().err
    assert "holds an earlier run" in refused and "--resume" in refused
    assert (run / "report.json").read_text() == before

    # --resume of a run that has no checkpoint, or with checkpoints turned off, is refused
    # before anything is written (it would otherwise train afresh over the run).
    config = str(run / "config.yaml")
    fresh = _sets({"training": {"updates": 150}, "name": "never-ran"})
    assert cli.main(["--no-cache", "train", "-c", config, *fresh, "--resume"]) == 2
    assert "nothing to resume" in capsys.readouterr().err
    assert not (tmp / "runs" / "never-ran").exists()
    off = _sets({"training": {"updates": 150}, "checkpoints": {"every": 0}})
    assert cli.main(["--no-cache", "train", "-c", config, *off, "--resume"]) == 2
    assert "--resume needs checkpoints" in capsys.readouterr().err
    assert (run / "report.json").read_text() == before


def _parent_and_children(client, outcome):
    tracking = outcome.report["tracking"]
    parent = client.get_run(tracking["run_id"])
    children = {seed: client.get_run(run_id) for seed, run_id in tracking["seed_run_ids"].items()}
    return parent, children


def test_params_tags_and_nested_runs(tracked):
    outcome, client, _, _ = tracked
    parent, children = _parent_and_children(client, outcome)
    assert parent.info.status == "FINISHED" and parent.info.run_name == "first"
    params = parent.data.params
    assert params["training.updates"] == "100"
    assert params["algorithm.name"] == "td3bc-lag"
    assert params["training.seeds"] == "[0, 1]"
    assert params["algorithm.hyperparameters.hidden"] == "[16, 16]"
    assert json.loads(params["resolved.cost_limits"]) == [100.0, 100.0]
    # the reward scaling TD3BC-Lag trains with, as fitted on the data
    scaling = outcome.report["training"]["reward_scale"]
    assert params["resolved.reward_scaling.kind"] == scaling["kind"] == "std"
    assert float(params["resolved.reward_scaling.scale"]) == pytest.approx(scaling["scale"])
    tags = parent.data.tags
    assert tags["env"] == "IB-v0" and tags["algorithm"] == "td3bc-lag"
    assert tags["dataset"] == outcome.report["data"]["name"]
    assert len(tags["dataset.fingerprint"]) == 16
    assert tags["version.jax"] and tags["version.neorl-industrial"]
    # The settings the run used: the generated data and the simulator's evaluation, the
    # horizon as evaluated; not where its files and store are.
    assert (params["data.quality"], params["data.trajectories"]) == ("medium", "2")
    assert params["env.id"] == "IB-v0" and params["evaluation.horizon"] == "50"
    assert params["evaluation.episodes"] == "2" and "best/episodes_mean" not in parent.data.metrics
    assert not {"tracking.uri", "output", "name", "data.path"} & set(params)
    assert not [key for key in params if key.startswith("evaluation.ope.")]
    assert params["tracking.registered_model"] == MODEL
    assert sorted(children) == ["0", "1"]
    for seed, child in children.items():
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.tags["seed"] == seed and child.info.status == "FINISHED"
        assert child.data.params["data.quality"] == "medium" and child.data.params["seed"] == seed
    # Every run's dataset input is the training data, its fingerprint the digest.
    for run in (parent, *children.values()):
        (logged,) = run.inputs.dataset_inputs
        assert logged.dataset.name == outcome.report["data"]["name"]
        assert logged.dataset.digest == tags["dataset.fingerprint"]
        assert logged.dataset.source_type == "code"
        assert "generate_dataset('IB-v0', 'medium', 2, seed=0" in logged.dataset.source
    # The report links the UI's training runs and the run's page.
    experiment = parent.info.experiment_id
    tracking = outcome.report["tracking"]
    assert tracking["experiment_id"] == experiment
    assert tracking["links"]["runs"].endswith(
        f"/#/experiments/{experiment}/runs?workflowType=machine_learning"
    )
    assert f"/#/experiments/{experiment}/runs/{parent.info.run_id}?" in tracking["links"]["run"]


def test_metric_history_per_chunk_and_evaluation(tracked):
    outcome, client, _, _ = tracked
    parent, children = _parent_and_children(client, outcome)
    for run in (parent, *children.values()):
        history = client.get_metric_history(run.info.run_id, "train/critic_loss")
        assert [m.step for m in history] == [50, 100]
        assert all(np.isfinite(m.value) for m in history)
        evaluations = client.get_metric_history(run.info.run_id, "eval/return")
        assert [m.step for m in evaluations] == [50, 100]
        assert "eval/normalized_score" in run.data.metrics
        assert "eval/override_rate" in run.data.metrics
        assert "eval/normalized_cost/fatigue" in run.data.metrics
    # The parent's metrics are the mean over seeds.
    last = [
        client.get_metric_history(c.info.run_id, "eval/return")[-1].value for c in children.values()
    ]
    assert parent.data.metrics["eval/return"] == pytest.approx(np.mean(last))
    assert [
        m.step for m in client.get_metric_history(parent.info.run_id, "train/updates_per_s")
    ] == [
        50,
        100,
    ]
    # Aggregates over seeds: mean and 95 % CI of the best evaluations.
    summary = outcome.report["summary"]
    assert parent.data.metrics["best/return_mean"] == pytest.approx(summary["return"]["mean"])
    assert parent.data.metrics["best/return_ci95"] == pytest.approx(summary["return"]["ci"])


def test_artifacts_plots_report_checkpoint_and_agent(tracked):
    outcome, client, _, tmp = tracked
    run_id = outcome.report["tracking"]["run_id"]

    def names(path=None):
        return sorted(a.path for a in client.list_artifacts(run_id, path))

    top = names()
    for expected in ("agent", "checkpoint", "config.yaml", "dataset.json", "plots", "report.json"):
        assert expected in top, expected
    assert names("plots") == ["plots/learning_curves.png", "plots/safety.png"]
    assert names("checkpoint") == ["checkpoint/100"]
    local = Path(client.download_artifacts(run_id, "", str(tmp / "downloaded")))
    assert (local / "plots" / "learning_curves.png").read_bytes()[:4] == b"\x89PNG"
    report = json.loads((local / "report.json").read_text())
    assert report["tracking"]["run_id"] == run_id
    assert (local / "agent" / "agent.json").is_file()
    card = json.loads((local / "dataset.json").read_text())
    assert card["name"] == outcome.report["data"]["name"]


def test_the_policy_is_registered_promoted_and_predicts_shielded_actions(tracked):
    import mlflow

    outcome, client, uri, _ = tracked
    model = outcome.report["tracking"]["model"]
    assert model["name"] == MODEL and model["version"] == "1" and model["promoted"]
    version = client.get_model_version_by_alias(MODEL, "champion")
    assert str(version.version) == "1" and version.run_id == outcome.report["tracking"]["run_id"]
    best = outcome.report["best"][outcome.report["selected_run"]]["metrics"]
    assert float(version.tags["return"]) == pytest.approx(best["return"])
    assert float(version.tags["normalized_cost"]) == pytest.approx(best["normalized_cost"])
    assert "no champion yet" in version.tags["promotion.reason"]

    from neorl_industrial.integration.mlflow.pyfunc import tracking_uri_for

    with tracking_uri_for(uri, None):
        loaded = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")
    names = loaded.metadata.get_input_schema().input_names()
    artifact_names = list(outcome.agent.task.observation_names)
    assert names[: len(artifact_names)] == artifact_names
    rng = np.random.default_rng(0)
    observations = rng.normal(50, 30, (5, len(artifact_names))).astype(np.float32)
    frame = pd.DataFrame(observations, columns=artifact_names)
    out = loaded.predict(frame)
    from neorl_industrial.wrappers.agents.artifact import PolicyArtifact

    expected = PolicyArtifact.load(outcome.policy_dir).predict(observations)
    action_names = list(outcome.agent.task.action_names)
    np.testing.assert_allclose(out[action_names].to_numpy(), expected.action, rtol=1e-6)
    np.testing.assert_array_equal(out["overridden"].to_numpy(), expected.overridden)
    assert [c for c in out.columns if c.startswith("margin_")] == [
        f"margin_{n}" for n in expected.constraint_names
    ]
    # Previous actions change the rate constraints' outcome; partial columns are refused.
    previous = frame.assign(**{f"prev_{n}": 0.9 for n in action_names})
    np.testing.assert_allclose(
        loaded.predict(previous)[action_names].to_numpy(),
        PolicyArtifact.load(outcome.policy_dir)
        .predict(observations, np.full((5, len(action_names)), 0.9, np.float32))
        .action,
        rtol=1e-6,
    )
    with pytest.raises(Exception, match="prev_"):
        loaded.predict(frame.assign(**{f"prev_{action_names[0]}": 0.0}))
    with pytest.raises(Exception, match="fatigue"):
        loaded.predict(frame.drop(columns=["fatigue"]))

    # The Python API takes the same URIs.
    from neorl_industrial.integration.mlflow import load_agent, load_policy

    policy = load_policy(f"models:/{MODEL}@champion", uri)
    np.testing.assert_allclose(policy.predict(observations).action, expected.action)
    agent = load_agent(f"models:/{MODEL}/1", uri)
    np.testing.assert_allclose(
        agent.predict(observations), outcome.agent.predict(observations), rtol=1e-6
    )


def test_a_second_run_registers_a_challenger_and_the_rule_decides(tracked):
    _, client, uri, tmp = tracked
    second = run_training(_config(tmp, uri, "second"))
    model = second.report["tracking"]["model"]
    assert model["version"] == "2"
    version = client.get_model_version(MODEL, "2")
    assert version.tags["promotion.decision"] in ("true", "false")
    champion = client.get_model_version_by_alias(MODEL, "champion")
    if model["promoted"]:
        assert str(champion.version) == "2" and "higher return" in model["reason"]
    else:
        assert str(champion.version) == "1" and "does not beat" in model["reason"]
        assert str(client.get_model_version_by_alias(MODEL, "challenger").version) == "2"


def test_cli_models_list_promote_export_and_evaluate_by_uri(tracked, capsys):
    _, client, uri, tmp = tracked
    base = ["--no-cache"]
    assert cli.main([*base, "models", "list", MODEL, "--tracking-uri", uri]) == 0
    listing = capsys.readouterr().out
    assert "champion" in listing and "td3bc-lag" in listing
    assert cli.main([*base, "models", "list", "no-such-model", "--tracking-uri", uri]) == 2
    assert "no registered model 'no-such-model'" in capsys.readouterr().err

    # The champion again: nothing to do, and --check says so with exit code 1.
    champion = str(client.get_model_version_by_alias(MODEL, "champion").version)
    args = [*base, "models", "promote", MODEL, "--version", champion, "--tracking-uri", uri]
    assert cli.main([*args, "--check"]) == 1
    assert "is the champion" in capsys.readouterr().out

    out = tmp / "exported-policy"
    export = [*base, "models", "export", f"models:/{MODEL}@champion", "--out", str(out)]
    assert cli.main([*export, "--tracking-uri", uri]) == 0
    assert (out / "manifest.json").is_file()
    assert cli.main([*export, "--tracking-uri", uri]) == 2  # exists: not overwritten
    assert "already exists" in capsys.readouterr().err

    old = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        metrics = tmp / "metrics.json"
        command = [*base, "evaluate", f"models:/{MODEL}/1", "--episodes", "2", "--horizon", "20"]
        assert cli.main([*command, "--json", str(metrics)]) == 0
        assert len(json.loads(metrics.read_text())["runs"]) == 2
        assert cli.main([*base, "evaluate", f"models:/{MODEL}/99", "--episodes", "1"]) == 2
        assert f"models:/{MODEL}/99" in capsys.readouterr().err
    finally:
        if old is None:
            os.environ.pop("MLFLOW_TRACKING_URI")
        else:
            os.environ["MLFLOW_TRACKING_URI"] = old


@pytest.mark.slow  # ~30 s (MLflow's server starts its own interpreters); the champion's
# pyfunc predicts the same shielded actions in process in the default suite (above)
def test_mlflow_models_serve_returns_shielded_actions(tracked):
    outcome, _, uri, tmp = tracked
    port = free_port()
    env = interpreter_environment(MLFLOW_TRACKING_URI=uri)
    command = [
        sys.executable, "-m", "mlflow", "models", "serve", "-m", f"models:/{MODEL}@champion",
        "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port),
    ]  # fmt: skip
    log = (tmp / "serve.log").open("w")
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/ping", server, log=tmp / "serve.log")
        names = list(outcome.agent.task.observation_names)
        observations = np.full((2, len(names)), 60.0, np.float32)
        body = json.dumps({"dataframe_split": {"columns": names, "data": observations.tolist()}})
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations",
            body.encode(),
            {"Content-Type": "application/json"},
        )
        predictions = json.loads(urllib.request.urlopen(request, timeout=60).read())["predictions"]
    finally:
        server.terminate()
        server.wait(30)
        log.close()
    from neorl_industrial.wrappers.agents.artifact import PolicyArtifact

    expected = PolicyArtifact.load(outcome.policy_dir).predict(observations)
    served = np.asarray([[row[n] for n in outcome.agent.task.action_names] for row in predictions])
    np.testing.assert_allclose(served, expected.action, rtol=1e-6)
    assert [row["overridden"] for row in predictions] == expected.overridden.tolist()


@pytest.mark.slow  # ~30 s; test_sender replays a spool to a real store in the default suite
def test_training_goes_on_when_the_server_is_down_and_the_spool_replays(tracked, capsys):
    _, _, _, tmp = tracked
    down = f"http://127.0.0.1:{free_port()}"
    config = _config(tmp, down, "offline", flush_timeout=2.0)
    started = time.perf_counter()
    outcome = run_training(config)
    assert time.perf_counter() - started < 120
    tracking = outcome.report["tracking"]
    assert tracking["run_id"] is None and tracking["spooled"] > 0
    spool = Path(tracking["spool"])
    assert spool.is_file() and (outcome.run_dir / "agent" / "agent.json").is_file()

    target = f"sqlite:///{tmp}/replayed.db"
    assert cli.main(["--no-cache", "mlflow", "replay", str(spool), "--tracking-uri", target]) == 0
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=target, registry_uri=target)
    runs = client.search_runs([client.get_experiment_by_name("neorl-industrial").experiment_id])
    parent = next(run for run in runs if run.info.run_name == "offline")
    assert [m.step for m in client.get_metric_history(parent.info.run_id, "eval/return")] == [
        50,
        100,
    ]
    assert len(runs) == 3 and parent.info.status == "FINISHED"
    # The dataset inputs were spooled and replayed with the rest.
    for run in runs:
        assert [i.dataset.name for i in run.inputs.dataset_inputs] == [
            outcome.report["data"]["name"]
        ]
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == "1"


def test_a_resumed_run_continues_its_mlflow_runs_then_evaluates_and_exports(tracked):
    """``train --resume`` continues the main job's run from its checkpoints to more
    updates, in the same MLflow runs; the resumed agent evaluates and exports."""
    outcome, client, _, tmp = tracked
    run = outcome.run_dir
    more = _sets({"training": {"updates": 150}})
    assert cli.main(["--no-cache", "train", "-c", str(run / "config.yaml"), *more, "--resume"]) == 0
    resumed = json.loads((run / "report.json").read_text())
    assert resumed["training"]["resumed_from"] == 100 and resumed["training"]["updates"] == 150
    tracking = resumed["tracking"]
    assert tracking["run_id"] == outcome.report["tracking"]["run_id"]
    assert tracking["seed_run_ids"] == outcome.report["tracking"]["seed_run_ids"]
    history = client.get_metric_history(tracking["run_id"], "train/critic_loss")
    assert [m.step for m in history] == [50, 100, 150]
    mlflow_run = client.get_run(tracking["run_id"])
    assert mlflow_run.info.status == "FINISHED" and mlflow_run.data.tags["resumed_from"] == "100"
    # The same dataset input, not a second one; the same pages.
    assert [i.dataset.name for i in mlflow_run.inputs.dataset_inputs] == [resumed["data"]["name"]]
    assert tracking["links"] == outcome.report["tracking"]["links"]

    metrics = tmp / "resumed-metrics.json"
    evaluate = ["--no-cache", "evaluate", str(run / "agent"), "--episodes", "2"]
    assert cli.main([*evaluate, "--horizon", "20", "--json", str(metrics)]) == 0
    assert len(json.loads(metrics.read_text())["runs"]) == 2
    out = tmp / "exported"
    assert cli.main(["--no-cache", "export", str(run / "agent"), "--out", str(out)]) == 0
    assert (out / "manifest.json").is_file()


def _screenshots():
    """docs/mlflow_screenshot.py, which makes the docs' pictures of the UI."""
    spec = importlib.util.spec_from_file_location(
        "mlflow_screenshot", ROOT / "docs" / "mlflow_screenshot.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_ui_shows_the_training_runs_and_the_run_with_its_dataset(tracked):
    """What a person sees on the pages a run prints: headless Chromium on `mlflow ui`."""
    screenshots = _screenshots()
    chromium = screenshots.find_chromium()
    if chromium is None:
        pytest.skip("needs Chromium (apt-get install chromium)")
    outcome, client, uri, tmp = tracked
    tracking = outcome.report["tracking"]
    parent = client.get_run(tracking["run_id"])
    dataset = parent.inputs.dataset_inputs[0].dataset
    with screenshots.mlflow_ui(uri, log=tmp / "ui.log") as base:
        pages = {
            name: screenshots.browse(
                chromium,
                link.replace("http://127.0.0.1:5000", base),
                tmp / f"mlflow-ui-{name}.png",
            )
            for name, link in tracking["links"].items()
        }
    assert sorted(pages) == ["run", "runs"]
    for name, text in pages.items():
        # The run by its name, and its dataset as the Datasets column and section show it.
        assert f">{parent.info.run_name}<" in text, name
        assert f"{dataset.name} ({dataset.digest})" in text, name
    assert ">Runs<" in pages["runs"] and ">Datasets<" in pages["run"]


def test_the_policy_server_loads_a_registry_uri(tracked):
    from fastapi.testclient import TestClient

    from neorl_industrial.integration.deployment import ServerSettings, create_app

    outcome, client, uri, _ = tracked
    champion = client.get_model_version_by_alias(MODEL, "champion")
    settings = ServerSettings(
        model=f"models:/{MODEL}@champion", tracking_uri=uri, auth=False,
        batch_sizes=[1, 2], max_batch=2,
        trusted_keys=[Path(outcome.config.export.signing_keys) / "policy-signing.pub"],
    )  # fmt: skip
    with TestClient(create_app(settings)) as server:
        info = server.get("/v1/policy").json()
        assert info["version"] == f"{MODEL}/{champion.version}"
        assert info["registry"]["run_id"] == champion.run_id
        assert "champion" in info["registry"]["aliases"]
        names = list(outcome.agent.task.observation_names)
        response = server.post("/v1/act", json={"observation": [50.0] * len(names)})
        assert response.status_code == 200 and response.json()["policy_version"] == info["version"]
