"""The verdict from the command line, on a plant log with no simulator: a plant model
fitted on the log (`model fit`), `train --plant-model` writing the verdict into
report.json and MLflow, `evaluate --ope --plant-model` on the training log leaving the
training episodes out loudly and printing the answer, and a plant model of another log
refused by its fingerprint."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from neorl_industrial import cli
from tests.shared import built_once, mlflow_store
from tests.wrappers.training.test_verdict import SCHEMA, write_log

#: The heater runs of this file, the Agent's verdict (test_agent_verdict.py) and the
#: candidates' tests (test_candidates.py): one size, so the three files' training and FQE
#: programs are compiled once in a test run (the suite's compilation cache).
HEATER_HIDDEN = (16,)
HEATER_TRAINING = {"updates": 100, "chunk": 100, "seeds": (0, 1)}
HEATER_OPE = {"updates": 50, "seeds": (0, 1), "hidden": (8,)}


def run_yaml(
    log: Path, schema: Path, root: Path, *, name: str = "heater-bc", track: bool = True, **sections
) -> str:
    """The heater run's configuration (BC at the heater size, FQE on a fifth held out),
    named ``name``, tracked in ``root``'s store or not, with ``sections`` added."""
    run = {
        "name": name,
        "data": {"path": str(log), "schema": str(schema)},
        "algorithm": {"name": "bc", "hyperparameters": {"hidden": list(HEATER_HIDDEN)}},
        "training": HEATER_TRAINING,
        "evaluation": {"ope": {"holdout": 0.2, **HEATER_OPE}},
        "tracking": {"enabled": track, "uri": mlflow_store(root), "log_model": False},
        "output": f"{root}/runs",
        **sections,
    }
    return json.dumps(run, indent=1)  # JSON is YAML


def fit_model(log, schema, out, seed=0):
    argv = ["--no-cache", "model", "fit", "--data", str(log), "--schema", str(schema)]
    argv += ["--out", str(out), "--hidden", "32", "--members", "2", "--elites", "2"]
    argv += ["--updates", "400", "--chunk", "200", "--batch-size", "64", "--horizon", "5"]
    argv += ["--windows", "8", "--seeds", str(seed)]
    assert cli.main(argv) == 0


def heater_plant(target: Path) -> Path:
    """The heater's log (20 episodes of 30 steps, ``log.csv``), its ``schema.yaml`` and
    a plant model of it fitted by ``model fit`` (:func:`fit_model`, ``model/``), copied
    into ``target``. Fitted once per test run (tests/shared.py): the verdict's command
    line, the Agent's verdict and the candidates' tests judge with the same model."""

    def build(directory: Path) -> None:
        write_log(directory / "log.csv", episodes=20, steps=30)
        (directory / "schema.yaml").write_text(textwrap.dedent(SCHEMA))
        fit_model(directory / "log.csv", directory / "schema.yaml", directory / "model")

    shutil.copytree(built_once("heater-plant", build), target, dirs_exist_ok=True)
    return target


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = heater_plant(tmp_path_factory.mktemp("verdict-cli"))
    schema = root / "schema.yaml"
    config = root / "run.yaml"
    config.write_text(run_yaml(root / "log.csv", schema, root))
    argv = ["--no-cache", "train", "-c", str(config), "--plant-model", str(root / "model")]
    assert cli.main(argv) == 0
    return root


def test_train_writes_the_verdict_into_the_report_and_mlflow(run):
    from mlflow import MlflowClient

    report = json.loads((run / "runs" / "heater-bc" / "report.json").read_text())
    verdict = report["verdict"]
    assert verdict["kind"] == "estimate"
    assert verdict["estimators"] == ["model", "fqe", "model+fqe"]
    assert verdict["decision"] in ("recommend", "keep the current operation")
    assert len(verdict["candidates"]) == 2 and verdict["evidence"]["heldout_episodes"] == 4
    client = MlflowClient(tracking_uri=f"sqlite:///{run}/mlflow.db")
    experiment = client.get_experiment_by_name("neorl-industrial")
    (parent,) = [
        r
        for r in client.search_runs([experiment.experiment_id])
        if r.info.run_id == report["tracking"]["run_id"]
    ]
    assert parent.data.metrics["verdict/recommend"] == float(verdict["decision"] == "recommend")
    assert "verdict/candidate_1/model_fqe/improvement_lower" in parent.data.metrics
    assert parent.data.tags["verdict.decision"] == verdict["decision"]
    assert parent.data.params["verdict.penalty"] == "1.0"


def test_evaluate_on_the_training_log_says_so_and_prints_the_answer(run, capsys):
    agent = run / "runs" / "heater-bc" / "agent"
    argv = ["--no-cache", "evaluate", str(agent), "--ope", str(run / "log.csv")]
    argv += ["--schema", str(run / "schema.yaml"), "--plant-model", str(run / "model")]
    argv += ["--ope-updates", "100", "--json", str(run / "evaluation.json")]
    capsys.readouterr()
    assert cli.main(argv) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "16 episodes of" in printed and "trained this agent and were left out" in printed
    assert "Is it better than the current operation? (estimates)" in printed
    assert "Keep the current operation" in printed or "Recommend run" in printed
    written = json.loads((run / "evaluation.json").read_text())["ope"]
    assert written["evaluated_episodes"] == 4 and written["verdict"]["kind"] == "estimate"
    # Selected on the 16 episodes the agent trained on before the test, and said so.
    selection = written["verdict"]["evidence"]["selection"]
    assert selection["episodes"] == 16 and selection["chosen"].startswith("run ")
    assert "One candidate was selected on 16 training episodes before the test" in printed
    assert f"{selection['chosen']} was selected on the training episodes" in printed


def test_a_plant_model_of_another_log_is_refused_by_fingerprint(run, capsys):
    write_log(run / "other.csv", episodes=20, steps=30, seed=9)
    agent = run / "runs" / "heater-bc" / "agent"
    argv = ["--no-cache", "evaluate", str(agent), "--ope", str(run / "other.csv")]
    argv += ["--schema", str(run / "schema.yaml"), "--plant-model", str(run / "model")]
    capsys.readouterr()
    assert cli.main(argv) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "plant_model:" in error and "is not that of 'heater-verdict'" in error
