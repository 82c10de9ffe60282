"""Calls to an MLflow tracking server, sent from a background thread.

Training never waits for MLflow: the Trainer's callbacks only put operations on a queue.
A worker thread sends them in order. When a call fails (the server is down, slow past its
timeout, or refuses), the worker warns once, keeps the operation and everything after it
in order, and tries again every ``retry_interval`` seconds. :meth:`BufferedSender.close`
waits at most ``flush_timeout`` seconds for the queue to drain; what could not be sent by
then is written to a *spool* file (JSON lines) that :func:`replay` sends later::

    neorl-industrial mlflow replay runs/main/mlflow-spool.jsonl

Operations name runs by a key of their own (``parent``, ``seed-0``); the server's run ids
are learned when a run is created, and the spool records them (``bind`` lines) so a replay
continues the same runs, or creates them again in a store that does not have them.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import queue
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "SPOOL_FORMAT",
    "BufferedSender",
    "MlflowUnavailableWarning",
    "SendSummary",
    "SpoolError",
    "execute",
    "replay",
]

SPOOL_FORMAT = "neorl_industrial.mlflow-spool"
SPOOL_VERSION = 1
# MLflow's limits per log_batch call and on a parameter's value.
_MAX_METRICS, _MAX_PARAMS, _MAX_TAGS = 1000, 100, 100
MAX_PARAM_LENGTH = 6000
_CLOSE = object()


class MlflowUnavailableWarning(UserWarning):
    """The tracking server could not be reached; training goes on."""


class SpoolError(ValueError):
    """A spool file that cannot be replayed; the message names the file and line."""


@dataclasses.dataclass
class SendSummary:
    """What a sender did: operations sent, written to the spool, and where."""

    sent: int
    spooled: int
    spool_path: Path | None
    run_ids: dict[str, str]
    results: dict[str, Any]
    errors: list[str]

    @property
    def complete(self) -> bool:
        return self.spooled == 0


def _now_ms() -> int:
    return int(time.time() * 1000)


def quiet_http_retries() -> None:
    """Bounds MLflow's own HTTP retries (by default minutes per call) so that the sender's
    retry loop decides; a value the user has set is kept."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")


# ----- operations ----------------------------------------------------------------------
def execute(
    client: Any, op: dict[str, Any], run_ids: dict[str, str], results: dict[str, Any]
) -> Any:
    """Performs one operation with ``client`` (an ``MlflowClient``); ``run_ids`` maps run
    keys to the server's ids and learns the ids of runs it creates; ``results`` holds what
    earlier operations returned (a ``register`` reads the version ``log_model`` made)."""
    kind, key, args = op["op"], op.get("run"), op.get("args", {})
    if kind in ("create_run", "bind"):
        return _create_or_bind(client, kind, key, args, run_ids)
    if kind == "register":
        args = dict(args)
        if args.get("version") is None:
            logged = results.get("log_model") or {}
            if logged.get("version") is None:
                raise KeyError("register: the policy model was not logged and registered")
            args["version"] = logged["version"]
        return _register(client, args)
    if key not in run_ids:
        raise KeyError(f"operation {kind!r} names the run {key!r}, which was never created")
    run_id = run_ids[key]
    if kind == "log_batch":
        _log_batch(client, run_id, args)
    elif kind == "log_artifact":
        path = Path(args["path"])
        if not path.exists():
            raise FileNotFoundError(f"{path}: the artifact to log no longer exists")
        if path.is_dir():
            client.log_artifacts(run_id, str(path), args.get("artifact_path"))
        else:
            client.log_artifact(run_id, str(path), args.get("artifact_path"))
    elif kind == "log_model":
        return _log_model(client, run_id, args)
    elif kind == "end_run":
        client.set_terminated(run_id, args.get("status", "FINISHED"), end_time=args.get("time"))
    else:
        raise ValueError(f"unknown operation {kind!r}")
    return None


def _experiment_id(client: Any, name: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            client.restore_experiment(experiment.experiment_id)
        return experiment.experiment_id
    try:
        return client.create_experiment(name)
    except Exception:
        # Created by another process in the meantime.
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def _create_or_bind(
    client: Any, kind: str, key: str, args: dict[str, Any], run_ids: dict[str, str]
) -> str:
    from mlflow.exceptions import MlflowException

    if kind == "bind" and args.get("run_id"):
        try:
            run = client.get_run(args["run_id"])
        except MlflowException:
            run = None  # not in this store: create it again below
        if run is not None:
            run_ids[key] = run.info.run_id
            if args.get("reopen") and run.info.status != "RUNNING":
                client.update_run(run.info.run_id, status="RUNNING")
            return run.info.run_id
    tags = dict(args.get("tags", {}))
    parent = args.get("parent")
    if parent is not None:
        if parent not in run_ids:
            raise KeyError(f"run {key!r}: its parent run {parent!r} was never created")
        tags["mlflow.parentRunId"] = run_ids[parent]
    run = client.create_run(
        _experiment_id(client, args["experiment"]),
        start_time=args.get("time"),
        tags=tags,
        run_name=args.get("name"),
    )
    run_ids[key] = run.info.run_id
    return run.info.run_id


def _log_batch(client: Any, run_id: str, args: dict[str, Any]) -> None:
    from mlflow.entities import Metric, Param, RunTag

    metrics = [Metric(k, float(v), int(t), int(s)) for k, v, s, t in args.get("metrics", [])]
    params = [
        Param(k, str(v)[:MAX_PARAM_LENGTH]) for k, v in sorted(args.get("params", {}).items())
    ]
    tags = [RunTag(k, str(v)) for k, v in sorted(args.get("tags", {}).items())]
    while metrics or params or tags:
        client.log_batch(
            run_id,
            metrics=metrics[:_MAX_METRICS],
            params=params[:_MAX_PARAMS],
            tags=tags[:_MAX_TAGS],
        )
        metrics, params, tags = (
            metrics[_MAX_METRICS:],
            params[_MAX_PARAMS:],
            tags[_MAX_TAGS:],
        )


def _log_model(client: Any, run_id: str, args: dict[str, Any]) -> dict[str, Any]:
    from neorl_industrial.integration.mlflow.pyfunc import log_policy_model

    info = log_policy_model(
        client.tracking_uri,
        run_id,
        policy_dir=args["policy_dir"],
        agent_dir=args.get("agent_dir"),
        dataset_card=args.get("dataset_card"),
        input_example=args.get("input_example"),
        registered_model=args.get("registered_model"),
        # The client's registry: a replay into another store registers the model there.
        registry_uri=getattr(client, "_registry_uri", None) or client.tracking_uri,
    )
    return info


def _register(client: Any, args: dict[str, Any]) -> Any:
    from neorl_industrial.integration.mlflow.registry import finish_registration

    return finish_registration(client, **args)


# ----- the sender ----------------------------------------------------------------------
class BufferedSender:
    """Sends operations to MLflow in order, from a background thread.

    Args:
        client_factory: builds the ``MlflowClient`` (called in the worker thread).
        spool_path: where unsent operations go when :meth:`close` gives up.
        header: written at the top of the spool (tracking URI, experiment, run).
        attempts: tries per operation before it counts as failed.
        retry_interval: seconds between retries while the server is unreachable.
        warn: called once with a message when the server first fails (default: a
            :class:`MlflowUnavailableWarning`).
    """

    def __init__(
        self,
        client_factory: Callable[[], Any],
        *,
        spool_path: str | Path,
        header: dict[str, Any] | None = None,
        attempts: int = 2,
        retry_interval: float = 5.0,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self._client_factory = client_factory
        self.spool_path = Path(spool_path)
        self._header = dict(header or {})
        self._attempts = max(1, attempts)
        self._retry_interval = retry_interval
        self._warn = warn or (lambda message: warnings.warn(message, MlflowUnavailableWarning, 2))
        self._queue: queue.Queue[Any] = queue.Queue()
        self._pending: collections.deque[dict[str, Any]] = collections.deque()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._abandoned = False
        self._warned = False
        self._unsendable: list[dict[str, Any]] = []
        self.run_ids: dict[str, str] = {}
        self._run_args: dict[str, dict[str, Any]] = {}
        self.results: dict[str, Any] = {}
        self.errors: list[str] = []
        self.sent = 0
        self._submitted = 0
        self._finished = 0
        self._failing = False
        self._thread = threading.Thread(target=self._work, name="mlflow-sender", daemon=True)
        self._thread.start()

    def submit(self, op: str, run: str | None = None, **args: Any) -> None:
        """Queues one operation; returns at once."""
        if self._closing.is_set():
            raise RuntimeError("the sender is closed")
        if op in ("create_run", "bind"):
            self._run_args[run or ""] = args
        with self._lock:
            self._submitted += 1
        self._queue.put({"op": op, "run": run, "args": args})

    @property
    def healthy(self) -> bool:
        """False while the server is failing."""
        return not self._pending

    def _work(self) -> None:
        client = None
        while True:
            with self._lock:
                if self._abandoned:
                    return
                op = self._pending[0] if self._pending else None
            if op is None:
                item = self._queue.get()
                if item is _CLOSE:
                    return
                with self._lock:
                    if self._abandoned:
                        self._pending.append(item)
                        return
                    self._pending.append(item)
                op = item
            try:
                if client is None:
                    client = self._client_factory()
                result = self._send(client, op)
            except Exception as error:
                client = None
                self._failed(op, error)
                if self._closing.is_set():
                    return  # the last try after close() failed: close() spools the rest
                # Wait, but wake when close() is called so the last try is prompt.
                self._closing.wait(self._retry_interval)
                continue
            with self._lock:
                if self._pending and self._pending[0] is op:
                    self._pending.popleft()
                self.sent += 1
                self._finished += 1
                self._failing = False
                if result is not None and op["op"] in ("log_model", "register"):
                    self.results[op["op"]] = result

    def _send(self, client: Any, op: dict[str, Any]) -> Any:
        last: Exception | None = None
        for attempt in range(self._attempts):
            try:
                return execute(client, op, self.run_ids, self.results)
            except (KeyError, FileNotFoundError):
                raise
            except Exception as error:
                last = error
                if attempt + 1 < self._attempts:
                    time.sleep(0.2 * 2**attempt)
        assert last is not None
        raise last

    def _failed(self, op: dict[str, Any], error: Exception) -> None:
        message = f"{op['op']}: {type(error).__name__}: {str(error).splitlines()[0][:300]}"
        self.errors.append(message)
        if isinstance(error, KeyError | FileNotFoundError):
            # Cannot succeed later either: keep it for the spool, go on with the rest.
            with self._lock:
                if self._pending and self._pending[0] is op:
                    self._pending.popleft()
                self._unsendable.append(op)
                self._finished += 1
            return
        self._failing = True
        if not self._warned:
            self._warned = True
            self._warn(
                f"MLflow at {self._header.get('tracking_uri', '?')} is not answering "
                f"({message}); training goes on, calls are kept and retried every "
                f"{self._retry_interval:g} s, and what is still unsent at the end is written "
                f"to {self.spool_path}"
            )

    def wait_idle(self, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds until everything submitted so far was handled;
        returns at once (False) while the server is failing."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self._finished >= self._submitted:
                    return True
                if self._failing:
                    return False
            time.sleep(0.02)
        return False

    def close(self, timeout: float = 30.0) -> SendSummary:
        """Waits up to ``timeout`` seconds for everything queued to be sent, then writes
        what is left to the spool file. Idempotent."""
        if not self._closing.is_set():
            self._closing.set()
            self._queue.put(_CLOSE)
        self._thread.join(timeout)
        with self._lock:
            self._abandoned = True
            left = list(self._pending) + list(self._unsendable)
            self._pending.clear()
            self._unsendable.clear()
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not _CLOSE:
                    left.append(item)
        spooled = 0
        if left:
            spooled = self._write_spool(left)
        return SendSummary(
            sent=self.sent,
            spooled=spooled,
            spool_path=self.spool_path if spooled else None,
            run_ids=dict(self.run_ids),
            results=dict(self.results),
            errors=list(self.errors),
        )

    def _write_spool(self, ops: list[dict[str, Any]]) -> int:
        lines = [{"format": SPOOL_FORMAT, "version": SPOOL_VERSION, **self._header}]
        creating = {op["run"] for op in ops if op["op"] in ("create_run", "bind")}
        for key, run_id in self.run_ids.items():
            if key not in creating:
                args = {**self._run_args.get(key, {}), "run_id": run_id}
                lines.append({"op": "bind", "run": key, "args": args})
        lines.extend(ops)
        _append_lines(self.spool_path, lines)
        return len(ops)


def _append_lines(path: Path, lines: list[dict[str, Any]]) -> None:
    """Writes ``lines`` to ``path`` (replacing it) atomically: a temporary file, fsynced,
    renamed over. An existing spool is kept: its lines come first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    previous: list[str] = []
    if path.exists():
        previous = [line for line in path.read_text().splitlines() if line.strip()]
        # A second header would repeat the first.
        lines = [line for line in lines if "format" not in line]
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with temporary.open("w") as handle:
        for line in previous:
            handle.write(line + "\n")
        for line in lines:
            handle.write(json.dumps(line, default=_json_default) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def _json_default(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON-serializable: {type(value).__name__}")


# ----- replay --------------------------------------------------------------------------
def read_spool(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The header and operations of a spool file.

    Raises:
        SpoolError: for a missing file, a line that is not JSON or an unknown format.
    """
    path = Path(path)
    if not path.is_file():
        raise SpoolError(f"{path}: no such spool file")
    header: dict[str, Any] | None = None
    ops = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as error:
            raise SpoolError(f"{path}:{number}: not a JSON line ({error.msg})") from None
        if not isinstance(item, dict):
            raise SpoolError(f"{path}:{number}: expected an object, got {type(item).__name__}")
        if "format" in item:
            if item["format"] != SPOOL_FORMAT or item.get("version") != SPOOL_VERSION:
                raise SpoolError(
                    f"{path}:{number}: format {item.get('format')!r} version "
                    f"{item.get('version')!r}; expected {SPOOL_FORMAT!r} version {SPOOL_VERSION}"
                )
            header = item
            continue
        if "op" not in item:
            raise SpoolError(f"{path}:{number}: a line without 'op'")
        ops.append(item)
    if header is None:
        raise SpoolError(f"{path}: no header line; not a spool file of neorl_industrial")
    return header, ops


def replay(path: str | Path, tracking_uri: str | None = None) -> SendSummary:
    """Sends the operations of a spool file, in order, to ``tracking_uri`` (default: the
    one the spool was written for). On success the file is renamed to ``*.replayed``; if a
    call fails, the operations not yet sent are written back and the error is raised.
    """
    from mlflow import MlflowClient

    path = Path(path)
    header, ops = read_spool(path)
    uri = tracking_uri or header.get("tracking_uri")
    if not uri:
        raise SpoolError(f"{path}: names no tracking URI; pass one")
    client = MlflowClient(tracking_uri=uri, registry_uri=header.get("registry_uri") or uri)
    run_ids: dict[str, str] = {}
    results: dict[str, Any] = {}
    for done, op in enumerate(ops):
        try:
            result = execute(client, op, run_ids, results)
        except Exception:
            rest = ops[done:]
            later = {item["run"] for item in rest if item["op"] in ("create_run", "bind")}
            keep = [{**header}]
            keep += [
                {"op": "bind", "run": k, "args": {"run_id": v}}
                for k, v in run_ids.items()
                if k not in later
            ]
            if path.exists():
                path.unlink()
            _append_lines(path, keep + rest)
            raise
        if result is not None and op["op"] in ("log_model", "register"):
            results[op["op"]] = result
    path.replace(path.with_name(path.name + ".replayed"))
    return SendSummary(
        sent=len(ops), spooled=0, spool_path=None, run_ids=run_ids, results=results, errors=[]
    )
