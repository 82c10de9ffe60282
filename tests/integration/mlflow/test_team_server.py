"""Team mode: a real ``mlflow server`` on PostgreSQL (started by deploy/mlflow's script),
a short training logged to it over HTTP, metrics and the registered model read back."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from benchmarks.harness import free_port, wait_for_http
from neorl_industrial.cli.run_glue import run_training
from neorl_industrial.wrappers.training import RunConfig

SCRIPT = Path(__file__).parents[3] / "deploy" / "mlflow" / "mlflow-server.sh"
PG = {"host": "127.0.0.1", "port": 5432, "user": "postgres"}


def _postgres_or_skip():
    psycopg = pytest.importorskip("psycopg")
    try:
        return psycopg.connect(**PG, dbname="postgres", autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as error:
        pytest.skip(f"PostgreSQL is not reachable on 127.0.0.1:5432: {error}")


@contextlib.contextmanager
def _serve(tmp: Path, database: str, **overrides: str):
    """deploy/mlflow's script serving ``database`` on a free port; yields its URL."""
    port = free_port()
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "MLFLOW_DB": database,
        "PORT": str(port),
        "ARTIFACTS": str(tmp / "artifacts"),
        "AUTH_DB": str(tmp / "auth.db"),
        "WORKERS": "1",
        **overrides,
    }
    log = (tmp / "server.log").open("w")
    server = subprocess.Popen(
        ["bash", str(SCRIPT)], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(f"{url}/health", server, 180, log=tmp / "server.log")
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()


@contextlib.contextmanager
def _database():
    admin = _postgres_or_skip()
    database = f"neorl_test_{uuid.uuid4().hex[:10]}"
    try:
        yield database
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        admin.close()


@pytest.fixture(scope="module")
def team_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("team")
    # This test is about the PostgreSQL store; authentication has its own test below.
    with _database() as database, _serve(tmp, database, MLFLOW_AUTH="off") as url:
        yield url, tmp, database


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
            # the registry promotes signed policies only
            "export": {"signing_keys": str(tmp / "keys"), "create_keys": True},
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


@pytest.mark.slow
def test_the_team_server_requires_credentials(tmp_path, monkeypatch):
    """The script's default: MLflow's basic authentication, the admin password from a
    file; anonymous requests are refused, the admin's credentials log a run."""
    import httpx
    from mlflow import MlflowClient

    password_file = tmp_path / "admin-password"
    password_file.write_text("a-long-admin-password-for-tests\n")
    with (
        _database() as database,
        _serve(tmp_path, database, MLFLOW_ADMIN_PASSWORD_FILE=str(password_file)) as url,
    ):
        search = f"{url}/api/2.0/mlflow/experiments/search"
        assert httpx.post(search, json={"max_results": 1}).status_code == 401
        wrong = httpx.post(search, json={"max_results": 1}, auth=("admin", "not-the-password"))
        assert wrong.status_code == 401
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "a-long-admin-password-for-tests")
        client = MlflowClient(tracking_uri=url)
        experiment = client.create_experiment("authenticated")
        run = client.create_run(experiment)
        client.log_metric(run.info.run_id, "eval/return", 1.5)
        assert client.get_run(run.info.run_id).data.metrics == {"eval/return": 1.5}
