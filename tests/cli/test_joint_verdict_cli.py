"""``neorl-industrial verdict``: one verdict over a training run's and a sweep's
candidates from the command line, the first exported by name with ``export
--candidate``; what is not a run, two runs of one name and a candidate of another run are
refused in one line."""

from __future__ import annotations

import json
import textwrap

import pytest

from neorl_industrial import cli
from tests.cli.test_verdict_cli import fit_model, run_yaml
from tests.wrappers.training.test_verdict import SCHEMA, write_log


def test_what_is_not_a_run_and_two_runs_of_one_name_are_refused(tmp_path, capsys):
    argv = ["--no-cache", "verdict", str(tmp_path), "--plant-model", str(tmp_path)]
    assert cli.main(argv) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert f"{tmp_path}: neither a run's directory (no agent/agent.json)" in error
    for parent in ("a", "b"):
        (tmp_path / parent / "heater" / "agent").mkdir(parents=True)
        (tmp_path / parent / "heater" / "agent" / "agent.json").write_text("{}")
    runs = [str(tmp_path / "a" / "heater"), str(tmp_path / "b" / "heater")]
    assert cli.main(["--no-cache", "verdict", *runs, "--plant-model", str(tmp_path)]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "a second run named 'heater'" in error and len(error.splitlines()) == 1


@pytest.mark.slow
def test_one_verdict_over_a_run_and_a_sweep_then_the_first_exported(tmp_path, capsys):
    write_log(tmp_path / "log.csv", episodes=20, steps=30)
    schema = tmp_path / "schema.yaml"
    schema.write_text(textwrap.dedent(SCHEMA))
    fit_model(tmp_path / "log.csv", schema, tmp_path / "model")
    for name, track in (("heater-bc", True), ("heater-sweep", False)):
        (tmp_path / f"{name}.yaml").write_text(
            run_yaml(tmp_path / "log.csv", schema, tmp_path, name=name, track=track,
                     export={"signing_keys": None})
        )  # fmt: skip
    model = str(tmp_path / "model")
    train = ["--no-cache", "train", "-c", str(tmp_path / "heater-bc.yaml")]
    assert cli.main([*train, "--plant-model", model]) == 0
    sweep = ["--no-cache", "sweep", "-c", str(tmp_path / "heater-sweep.yaml")]
    assert cli.main([*sweep, "--grid", "algorithm.hyperparameters.learning_rate=[3e-4,1e-3]"]) == 0
    runs = [str(tmp_path / "runs" / name) for name in ("heater-bc", "heater-sweep")]
    out = tmp_path / "verdict"
    capsys.readouterr()
    argv = ["--no-cache", "verdict", *runs, "--plant-model", model, "--out", str(out)]
    assert cli.main([*argv, "--ope-updates", "50"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    report = json.loads((out / "report.json").read_text())
    names = [row["name"] for row in report["verdict"]["candidates"]]
    assert names == ["heater-bc/seed0", "heater-bc/seed1"] + [
        f"heater-sweep/config{c}-seed{s}" for c in (0, 1) for s in (0, 1)
    ]
    first = report["first"]
    assert report["ranking"][0] == f"{first['run']}/{first['candidate']}"
    # One candidate of the six selected on the episodes the runs trained on, ranked first
    # unless another were recommended (none can be: only the selected one is tested).
    selection = report["verdict"]["evidence"]["selection"]
    assert selection["chosen"] == report["ranking"][0] and selection["episodes"] >= 4
    assert report["verdict"]["recommended"] in (None, selection["chosen"])
    assert f"Ranked first: {report['ranking'][0]}" in printed
    assert report["tracking"]["run_id"] and report["heldout"]["episodes"] == 4
    from mlflow import MlflowClient

    run = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db").get_run(
        report["tracking"]["run_id"]
    )
    assert run.data.tags["verdict.first"] == report["ranking"][0]
    assert run.data.tags["verdict.selected"] == selection["chosen"]
    assert "verdict/recommend" in run.data.metrics
    policy = tmp_path / "first-policy"
    argv = ["--no-cache", "export", str(tmp_path / "runs" / first["run"]), "--out", str(policy)]
    assert cli.main([*argv, "--candidate", report["ranking"][0]]) == 0
    metadata = json.loads((policy / "manifest.json").read_text())["metadata"]
    assert metadata["candidate"] == first["candidate"]
    capsys.readouterr()
    argv = ["--no-cache", "export", runs[0], "--out", str(tmp_path / "other")]
    assert cli.main([*argv, "--candidate", "heater-sweep/config0-seed0"]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "a candidate of run 'heater-sweep', not of 'heater-bc'" in error
