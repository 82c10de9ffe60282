"""``mlflow replay`` sends a spool to the store the user names, never the spool's own."""

from __future__ import annotations

import json

from neorl_industrial import cli


def test_replay_sends_to_the_default_store_not_the_spools(tmp_path, monkeypatch, capsys):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    MlflowClient(tracking_uri=uri).create_experiment(
        "e", artifact_location=(tmp_path / "artifacts").as_uri()
    )
    planted = tmp_path / "planted.db"
    spool = tmp_path / "run" / "mlflow-spool.jsonl"
    spool.parent.mkdir()
    lines = [
        {
            "format": "neorl_industrial.mlflow-spool",
            "version": 1,
            "tracking_uri": f"sqlite:///{planted}",
        },
        {"op": "create_run", "run": "parent", "args": {"experiment": "e", "name": "r"}},
    ]
    spool.write_text("".join(json.dumps(line) + "\n" for line in lines))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert cli.main(["mlflow", "replay", str(spool)]) == 0
    printed = "".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "".join(f"Replayed 1 MLflow call(s) from {spool} to {uri}".split()) in printed
    assert not planted.exists()
    runs = MlflowClient(tracking_uri=uri).search_runs(["1"])
    assert [run.info.run_name for run in runs] == ["r"]
