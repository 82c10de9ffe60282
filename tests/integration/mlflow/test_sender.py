"""The background sender: order, no blocking, retries, the spool and its replay."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import pytest

from neorl_industrial.integration.mlflow.sender import (
    BufferedSender,
    SpoolError,
    read_spool,
    replay,
)


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

    uri = f"sqlite:///{tmp_path}/mlflow.db"
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
        replay(spool)
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
