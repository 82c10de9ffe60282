"""``mlflow replay`` sends a spool to the store the user names, never the spool's own."""

from __future__ import annotations

import json
from pathlib import Path

from neorl_industrial import cli
from tests.shared import mlflow_store


def test_replay_sends_to_the_default_store_not_the_spools(tmp_path, monkeypatch, capsys):
    from mlflow import MlflowClient

    uri = mlflow_store(tmp_path)
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


def test_register_refuses_unsigned_and_registers_a_signed_export_that_can_be_promoted(
    tmp_path, monkeypatch, capsys
):
    """``models register`` is how a signed export reaches the registry: verified,
    tagged with its signature, promotable; an unsigned one only on request (never
    promoted). Loading a ``models:/`` URI leaves nothing in the temporary directory."""
    import tempfile

    from mlflow import MlflowClient

    from neorl_industrial.integration.deployment.policy import PolicyTrust, load_policy_source
    from neorl_industrial.integration.mlflow.registry import load_policy
    from neorl_industrial.wrappers.agents.signing import PUBLIC_KEY, generate_key_pair
    from tests.wrappers.agents.test_export import exported_policy

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    uri = mlflow_store(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    key = generate_key_pair(tmp_path / "keys")
    signed = exported_policy(tmp_path / "signed", signing_key=key)
    unsigned = exported_policy(tmp_path / "unsigned")

    assert cli.main(["models", "register", str(unsigned), "--name", "plant-policy"]) == 2
    assert "unsigned" in " ".join(capsys.readouterr().err.split())
    assert cli.main(["models", "register", str(unsigned), "--name", "plant-policy",
                     "--allow-unsigned"]) == 0  # fmt: skip
    stranger = generate_key_pair(tmp_path / "stranger").parent / PUBLIC_KEY
    trusted = str(key.parent / PUBLIC_KEY)
    refused = ["models", "register", str(signed), "--name", "p", "--trusted-key", str(stranger)]
    assert cli.main(refused) == 2
    arguments = ["models", "register", str(signed), "--name", "plant-policy", "--trusted-key",
                 trusted, "--metric", "return=1.5", "--metric", "normalized_cost=0.5",
                 "--promote"]  # fmt: skip
    assert cli.main(arguments) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "models:/plant-policy/2" in printed and "promoted to @champion" in printed

    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    first, second = (client.get_model_version("plant-policy", v) for v in ("1", "2"))
    assert first.tags["signature"] == "unsigned"
    assert second.tags["signature"].startswith("sha256:")
    assert str(client.get_model_version_by_alias("plant-policy", "champion").version) == "2"

    before = sorted(scratch.iterdir())
    artifact = load_policy("models:/plant-policy@champion", uri)
    assert artifact.signature["key_fingerprint"] == second.tags["signature"]
    trust = PolicyTrust.from_files([trusted])
    loaded = load_policy_source("models:/plant-policy@champion", uri, [1], trust=trust)
    assert loaded.registry["version"] == "2"
    assert loaded.artifact.predict([50.0] * 6).action.shape == (3,)
    assert sorted(scratch.iterdir()) == before  # every download removed


def test_a_resolved_download_is_removed_when_the_process_ends(tmp_path):
    """``resolve_policy_dir`` (the CLI's agents, the benchmarks) hands its caller a
    download to read: it is gone once the process has ended."""
    import os
    import subprocess
    import sys

    script = (
        "import tempfile, sys\n"
        "from pathlib import Path\n"
        "from unittest import mock\n"
        "import neorl_industrial.integration.mlflow.registry as r\n"
        "def fake(uri, store, target):\n"
        "    (target / 'artifacts' / 'policy').mkdir(parents=True)\n"
        "    return target\n"
        "with mock.patch.object(r, '_download', fake):\n"
        "    path = r.resolve_policy_dir('models:/m/1', 'sqlite:///x.db')\n"
        "print(path)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert str(path).startswith(str(tmp_path)) and path.name == "policy"
    assert list(tmp_path.iterdir()) == []


def test_model_fit_says_where_the_data_s_range_stands_in_for_physics(capsys):
    from neorl_industrial.cli.common import make_console
    from neorl_industrial.cli.plant_model import _report

    card = {
        "task": {"name": "heater"},
        "config": {"n_members": 2, "n_elites": 2},
        "dataset": {"name": "log", "n_transitions": 10, "n_episodes": 2, "fingerprint": "0" * 64},
        "fit": {"stopped_early": False, "seconds": 1.0, "updates": 100},
        "signals": {"reward": "computed"},
        "fidelity": {"episodes": [0], "windows": 1, "level": 0.9, "rows": []},
        "physics": {"note": "no physical range in the schema for pressure_bar: the data's range"},
    }
    _report(make_console(), card, "models/heater")
    assert "physics: no physical range in the schema for pressure_bar" in capsys.readouterr().out
    _report(make_console(), {**card, "physics": {"note": None}}, "models/heater")
    assert "physics:" not in capsys.readouterr().out
