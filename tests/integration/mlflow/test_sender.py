"""The background sender: order, no blocking, retries, the spool and its replay."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import mlflow.entities  # noqa: F401  (the handlers import it on first use; see below)
import pytest

from neorl_industrial.integration.mlflow.sender import (
    BufferedSender,
    SpoolError,
    read_spool,
    replay,
)
from tests.shared import mlflow_store


class FakeClient:
    """Records calls like an MlflowClient; ``down`` makes every call fail, ``delay``
    makes every call slow."""

    def __init__(self, down=False, delay=0.0):
        self.down = down
        self.delay = delay
        self.calls = []
        self.runs = {}
        self.tracking_uri = "fake://"

    def _call(self, name, *args):
        if self.delay:
            time.sleep(self.delay)
        if self.down:
            raise ConnectionError("connection refused")
        self.calls.append((name, *args))

    def get_experiment_by_name(self, name):
        self._call("get_experiment_by_name", name)
        return SimpleNamespace(experiment_id="1", lifecycle_stage="active")

    def create_run(self, experiment_id, start_time=None, tags=None, run_name=None):
        self._call("create_run", run_name, dict(tags or {}))
        run_id = f"id-{len(self.runs)}"
        self.runs[run_id] = run_name
        return SimpleNamespace(info=SimpleNamespace(run_id=run_id, status="RUNNING"))

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        self._call("log_batch", run_id, list(metrics), list(params), list(tags))

    def set_terminated(self, run_id, status, end_time=None):
        self._call("set_terminated", run_id, status)


def _ops(sender):
    sender.submit("create_run", "parent", experiment="e", name="run")
    sender.submit("create_run", "seed-0", experiment="e", name="run/seed-0", parent="parent")
    for step in range(3):
        sender.submit("log_batch", "seed-0", metrics=[("loss", 1.0 / (step + 1), step, 0)])
    sender.submit("end_run", "parent", status="FINISHED")


def test_operations_arrive_in_order_with_nested_runs(tmp_path):
    # MLflow is imported above, not by the first log_batch inside close's 10 s: a first
    # import takes longer than that on a loaded machine, and the rest would be spooled.
    client = FakeClient()
    sender = BufferedSender(lambda: client, spool_path=tmp_path / "spool.jsonl")
    _ops(sender)
    summary = sender.close(timeout=10)
    assert summary.complete and summary.sent == 6 and not (tmp_path / "spool.jsonl").exists()
    names = [call[0] for call in client.calls if call[0] != "get_experiment_by_name"]
    assert names == ["create_run", "create_run", *["log_batch"] * 3, "set_terminated"]
    child_tags = client.calls[[c[0] for c in client.calls].index("create_run") + 2][2]
    assert child_tags["mlflow.parentRunId"] == summary.run_ids["parent"]
    losses = [call[2][0].value for call in client.calls if call[0] == "log_batch"]
    assert losses == [1.0, 0.5, pytest.approx(1 / 3)]


def test_a_slow_server_does_not_block_the_caller(tmp_path):
    client = FakeClient(delay=0.2)
    sender = BufferedSender(lambda: client, spool_path=tmp_path / "spool.jsonl")
    started = time.perf_counter()
    _ops(sender)  # 6 operations, 7 calls of 0.2 s each on the server side
    submitted = time.perf_counter() - started
    assert submitted < 0.1
    summary = sender.close(timeout=10)
    assert summary.complete and summary.sent == 6


def test_a_slow_server_past_the_flush_timeout_leaves_the_rest_in_the_spool(tmp_path):
    client = FakeClient(delay=0.3)
    sender = BufferedSender(lambda: client, spool_path=tmp_path / "spool.jsonl")
    _ops(sender)
    summary = sender.close(timeout=0.5)
    assert summary.spooled >= 1 and summary.sent + summary.spooled >= 6
    _, ops = read_spool(tmp_path / "spool.jsonl")
    assert ops[-1]["op"] == "end_run"


def test_a_server_that_is_down_warns_once_and_spools_everything(tmp_path):
    client = FakeClient(down=True)
    warnings = []
    sender = BufferedSender(
        lambda: client,
        spool_path=tmp_path / "spool.jsonl",
        header={"tracking_uri": "http://127.0.0.1:9", "experiment": "e"},
        retry_interval=0.05,
        warn=warnings.append,
    )
    started = time.perf_counter()
    _ops(sender)
    assert time.perf_counter() - started < 0.1
    time.sleep(0.3)  # several retries
    assert not sender.healthy
    summary = sender.close(timeout=1)
    assert len(warnings) == 1 and "http://127.0.0.1:9" in warnings[0]
    assert summary.sent == 0 and summary.spooled == 6
    header, ops = read_spool(summary.spool_path)
    assert header["tracking_uri"] == "http://127.0.0.1:9"
    assert [op["op"] for op in ops] == ["create_run", "create_run", *["log_batch"] * 3, "end_run"]


def test_a_server_that_comes_back_gets_everything_in_order(tmp_path):
    client = FakeClient(down=True)
    sender = BufferedSender(
        lambda: client, spool_path=tmp_path / "spool.jsonl", retry_interval=0.05, warn=print
    )
    _ops(sender)
    time.sleep(0.2)
    client.down = False
    summary = sender.close(timeout=5)
    assert summary.complete and summary.sent == 6
    losses = [call[2][0].value for call in client.calls if call[0] == "log_batch"]
    assert losses == [1.0, 0.5, pytest.approx(1 / 3)]


def test_runs_created_before_the_outage_are_bound_in_the_spool(tmp_path):
    client = FakeClient()
    gate = threading.Event()
    sender = BufferedSender(
        lambda: client, spool_path=tmp_path / "spool.jsonl", retry_interval=0.05, warn=print
    )
    sender.submit("create_run", "parent", experiment="e", name="run")
    assert sender.wait_idle(5)
    client.down = True
    sender.submit("log_batch", "parent", metrics=[("loss", 2.0, 1, 0)])
    gate.wait(0.2)
    summary = sender.close(timeout=0.5)
    _, ops = read_spool(summary.spool_path)
    assert ops[0] == {
        "op": "bind",
        "run": "parent",
        "args": {"experiment": "e", "name": "run", "run_id": summary.run_ids["parent"]},
    }
    assert ops[1]["op"] == "log_batch"


def test_replay_sends_a_spool_to_a_real_store_and_continues_bound_runs(tmp_path):
    from mlflow import MlflowClient

    uri = mlflow_store(tmp_path)
    store = MlflowClient(tracking_uri=uri)
    experiment = store.create_experiment("replayed")
    existing = store.create_run(experiment, run_name="before").info.run_id
    spool = tmp_path / "spool.jsonl"
    lines = [
        {"format": "neorl_industrial.mlflow-spool", "version": 1, "tracking_uri": "http://x"},
        {"op": "bind", "run": "parent", "args": {"run_id": existing, "experiment": "replayed"}},
        {"op": "log_batch", "run": "parent", "args": {"metrics": [["loss", 0.5, 10, 1]]}},
        {
            "op": "create_run",
            "run": "seed-0",
            "args": {"experiment": "replayed", "name": "child", "parent": "parent"},
        },
        {"op": "log_batch", "run": "seed-0", "args": {"params": {"lr": 0.001}}},
        {"op": "end_run", "run": "seed-0", "args": {"status": "FINISHED"}},
    ]
    spool.write_text("".join(json.dumps(line) + "\n" for line in lines))
    summary = replay(spool, tracking_uri=uri)
    assert summary.run_ids["parent"] == existing
    assert [m.value for m in store.get_metric_history(existing, "loss")] == [0.5]
    child = store.get_run(summary.run_ids["seed-0"])
    assert child.data.params == {"lr": "0.001"}
    assert child.data.tags["mlflow.parentRunId"] == existing
    assert child.info.status == "FINISHED"
    assert not spool.exists() and spool.with_name("spool.jsonl.replayed").exists()


def test_replay_that_fails_keeps_what_was_not_sent(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    spool = tmp_path / "spool.jsonl"
    lines = [
        {"format": "neorl_industrial.mlflow-spool", "version": 1, "tracking_uri": uri},
        {"op": "create_run", "run": "parent", "args": {"experiment": "e", "name": "r"}},
        {"op": "log_artifact", "run": "parent", "args": {"path": str(tmp_path / "gone.png")}},
        {"op": "end_run", "run": "parent", "args": {"status": "FINISHED"}},
    ]
    spool.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(FileNotFoundError, match=r"gone\.png"):
        replay(spool, tracking_uri=uri)
    _, ops = read_spool(spool)
    assert [op["op"] for op in ops] == ["bind", "log_artifact", "end_run"]


def test_spool_errors_name_the_file_and_line(tmp_path):
    spool = tmp_path / "spool.jsonl"
    with pytest.raises(SpoolError, match="no such spool file"):
        read_spool(spool)
    spool.write_text('{"format": "neorl_industrial.mlflow-spool", "version": 1}\nnot json\n')
    with pytest.raises(SpoolError, match=r"spool\.jsonl:2: not a JSON line"):
        read_spool(spool)
    spool.write_text('{"format": "other", "version": 1}\n')
    with pytest.raises(SpoolError, match=r":1: format 'other'"):
        read_spool(spool)
    spool.write_text('{"op": "log_batch"}\n')
    with pytest.raises(SpoolError, match="no header line"):
        read_spool(spool)


# ----- a spool is untrusted data -----------------------------------------------------------
HEADER = {"format": "neorl_industrial.mlflow-spool", "version": 1}


def _spool(run_dir, *ops, header=None):
    run_dir.mkdir(parents=True, exist_ok=True)
    spool = run_dir / "mlflow-spool.jsonl"
    lines = [{**HEADER, **(header or {})}, *ops]
    spool.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return spool


def _store(tmp_path):
    """A sqlite store whose experiment keeps artifacts under ``tmp_path``."""
    from mlflow import MlflowClient

    uri = mlflow_store(tmp_path)
    MlflowClient(tracking_uri=uri).create_experiment(
        "e", artifact_location=(tmp_path / "artifacts").as_uri()
    )
    return uri


def test_replay_never_sends_to_the_store_written_in_the_spool(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    uri = _store(tmp_path)
    planted = tmp_path / "elsewhere.db"
    spool = _spool(
        tmp_path / "run",
        {"op": "create_run", "run": "parent", "args": {"experiment": "e", "name": "r"}},
        header={"tracking_uri": f"sqlite:///{planted}", "registry_uri": f"sqlite:///{planted}"},
    )
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    summary = replay(spool)  # no URI given: the user's default, not the spool's
    assert not planted.exists()
    assert MlflowClient(tracking_uri=uri).get_run(summary.run_ids["parent"]).info.run_name == "r"


def test_replay_uploads_files_of_its_own_run_directory(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    uri = _store(tmp_path)
    run_dir = tmp_path / "runs" / "main"
    (run_dir / "plots").mkdir(parents=True)
    (run_dir / "report.json").write_text("{}")
    (run_dir / "plots" / "curve.png").write_bytes(b"png")
    (run_dir / "latest.json").symlink_to(run_dir / "report.json")  # a link that stays inside
    monkeypatch.chdir(tmp_path)  # relative paths as a run under runs/main wrote them
    spool = _spool(
        run_dir,
        {"op": "create_run", "run": "parent", "args": {"experiment": "e", "name": "r"}},
        {"op": "log_artifact", "run": "parent", "args": {"path": "runs/main/report.json"}},
        {"op": "log_artifact", "run": "parent", "args": {"path": str(run_dir / "latest.json")}},
        {"op": "log_artifact", "run": "parent", "args": {"path": "plots", "artifact_path": "p"}},
    )
    summary = replay(spool, tracking_uri=uri)
    listed = MlflowClient(tracking_uri=uri).list_artifacts(summary.run_ids["parent"])
    assert sorted(item.path for item in listed) == ["p", "report.json"]


@pytest.mark.parametrize(
    ("path", "complaint"),
    [
        ("/etc/passwd", r"'/etc/passwd' resolves to /etc/passwd, outside the run directory"),
        ("../secret.txt", r"'\.\./secret\.txt' contains '\.\.'"),
        ("runs/main/../../secret.txt", r"'runs/main/\.\./\.\./secret\.txt' contains '\.\.'"),
        ("leak.txt", r"'leak\.txt' resolves to .*secret\.txt, outside the run directory"),
        ("bundle", r".*/bundle/inner links to .*secret\.txt, outside the run directory"),
        ("", r"expected a path, got ''"),
    ],
)
def test_a_hostile_spool_is_refused_naming_the_line_before_anything_is_sent(
    tmp_path, monkeypatch, path, complaint
):
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    run_dir = tmp_path / "runs" / "main"
    (run_dir / "bundle").mkdir(parents=True)
    (run_dir / "leak.txt").symlink_to(secret)
    (run_dir / "bundle" / "inner").symlink_to(secret)
    monkeypatch.chdir(run_dir)
    spool = _spool(
        run_dir,
        {"op": "create_run", "run": "parent", "args": {"experiment": "e", "name": "r"}},
        {"op": "log_artifact", "run": "parent", "args": {"path": path}},
    )
    before = spool.read_text()
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with pytest.raises(SpoolError, match=rf"mlflow-spool\.jsonl:3: log_artifact path: {complaint}"):
        replay(spool, tracking_uri=uri)
    assert spool.read_text() == before  # nothing sent, nothing rewritten
    assert not (tmp_path / "mlflow.db").exists()


def test_a_policy_outside_the_run_is_refused_too(tmp_path):
    (tmp_path / "policy").mkdir()
    spool = _spool(
        tmp_path / "run",
        {"op": "log_model", "run": "parent", "args": {"policy_dir": str(tmp_path / "policy")}},
    )
    with pytest.raises(SpoolError, match=r"jsonl:2: log_model policy_dir: .* outside the run"):
        replay(spool, tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ({"op": "os.system", "args": {}}, "unknown operation 'os.system'"),
        ({"op": "log_batch", "run": "parent", "args": ["x"]}, "'args' must be an object"),
        ({"op": "log_batch", "run": ["parent"], "args": {}}, "'run' must be a string"),
    ],
)
def test_malformed_operations_name_their_line(tmp_path, line, complaint):
    spool = _spool(tmp_path / "run", line)
    with pytest.raises(SpoolError, match=rf"jsonl:2: .*{complaint}"):
        replay(spool, tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
