"""Team mode: a real ``mlflow server`` on PostgreSQL (started by deploy/mlflow's script),
a short training logged to it over HTTP, metrics and the registered model read back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from benchmarks.harness import free_port, wait_for_http
from neorl_industrial.pipeline import run_training
from neorl_industrial.wrappers.training import RunConfig

SCRIPT = Path(__file__).parents[3] / "deploy" / "mlflow" / "mlflow-server.sh"
PG = {"host": "127.0.0.1", "port": 5432, "user": "postgres"}


def _postgres_or_skip():
    psycopg = pytest.importorskip("psycopg")
    try:
        return psycopg.connect(**PG, dbname="postgres", autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as error:
        pytest.skip(f"PostgreSQL is not reachable on 127.0.0.1:5432: {error}")


@pytest.fixture(scope="module")
def team_server(tmp_path_factory):
    admin = _postgres_or_skip()
    database = f"neorl_test_{uuid.uuid4().hex[:10]}"
    tmp = tmp_path_factory.mktemp("team")
    port = free_port()
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "MLFLOW_DB": database,
        "PORT": str(port),
        "ARTIFACTS": str(tmp / "artifacts"),
        "WORKERS": "1",
        # Authentication is the script's default; this test is about the PostgreSQL store
        # (the script's auth checks are tested in tests/test_deployment_files.py).
        "MLFLOW_AUTH": "off",
    }
    log = (tmp / "server.log").open("w")
    server = subprocess.Popen(
        ["bash", str(SCRIPT)], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(f"{url}/health", server, 180, log=tmp / "server.log")
        yield url, tmp, database
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()
        admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        admin.close()


@pytest.mark.slow
def test_training_against_a_postgres_backed_server(team_server):
    from mlflow import MlflowClient

    url, tmp, database = team_server
    config = RunConfig.from_dict(
        {
            "name": "team",
            "output": str(tmp / "runs"),
            "data": {"trajectories": 2},
            "algorithm": {"name": "td3bc-lag", "hyperparameters": {"hidden": [16, 16]}},
            "training": {"updates": 100, "chunk": 50, "batch_size": 32, "seeds": [0]},
            "evaluation": {"every": 50, "episodes": 2, "horizon": 50},
            "tracking": {"uri": url, "registered_model": "team-policy", "promote": True},
        }
    )
    outcome = run_training(config)
    tracking = outcome.report["tracking"]
    assert tracking["spooled"] == 0 and tracking["errors"] == []

    client = MlflowClient(tracking_uri=url, registry_uri=url)
    parent = client.get_run(tracking["run_id"])
    assert parent.data.params["training.updates"] == "100"
    history = client.get_metric_history(parent.info.run_id, "eval/return")
    assert [m.step for m in history] == [50, 100]
    assert "plots" in [a.path for a in client.list_artifacts(parent.info.run_id)]
    champion = client.get_model_version_by_alias("team-policy", "champion")
    assert champion.run_id == parent.info.run_id

    # The data lives in PostgreSQL: the run is a row of the server's database.
    import psycopg

    with psycopg.connect(**PG, dbname=database) as connection:
        row = connection.execute(
            "SELECT name, status FROM runs WHERE run_uuid = %s", (parent.info.run_id,)
        ).fetchone()
    assert row == ("team", "FINISHED")
