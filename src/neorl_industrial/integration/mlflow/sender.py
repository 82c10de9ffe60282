"""Delivery of queued operations to an MLflow store, from a background thread.

The sender is a transport. It delivers *operations* in the order they were submitted,
retries them while the store is unreachable, writes what it could not deliver to a spool
file, and delivers a spool file again (:func:`replay`); what an operation does is not its
business. The modules that know register them by name (:func:`register_operations`):
:mod:`.runs` for runs, params, metrics and artifacts, :mod:`.registry` for the policy
model and its registration. The package registers both when it is imported, so every
sender and every replay can deliver either.

Training never waits: :meth:`BufferedSender.submit` only queues. When a delivery fails
(the store is down, slow past its timeout, or refuses), the worker warns once, keeps the
operation and everything after it in order, and tries again every ``retry_interval``
seconds. :meth:`BufferedSender.close` waits at most ``flush_timeout`` seconds for the
queue to drain; what was not delivered by then goes to the spool (JSON lines)::

    neorl-industrial mlflow replay runs/main/mlflow-spool.jsonl

An operation names what it acts on by a key of the caller's (``parent``, ``seed-0``; the
spool's lines call it ``run``). An operation that creates something in the store binds its
key to the store's id (:meth:`Delivery.bind`) and says how to bind it again; the spool
starts with those operations, so a replay continues the same objects, or creates them
again in a store that does not have them.

A spool is data, and a replay treats it as untrusted: it sends to the store the user
names (or the default), never to a URI written in the file, and uploads only files inside
the spool's own run directory (:func:`replay`).
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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from neorl_industrial.wrappers.hostio import json_default, write_text_atomic

__all__ = [
    "DEFAULT_TRACKING_URI",
    "SPOOL_FORMAT",
    "BufferedSender",
    "Delivery",
    "Handler",
    "MlflowUnavailableWarning",
    "SendSummary",
    "SpoolError",
    "deliver",
    "names_local_files",
    "quiet_http_retries",
    "read_spool",
    "register_operations",
    "registered_operations",
    "replay",
    "resolve_tracking_uri",
]

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
SPOOL_FORMAT = "neorl_industrial.mlflow-spool"
SPOOL_VERSION = 1
_CLOSE = object()


class MlflowUnavailableWarning(UserWarning):
    """The tracking server could not be reached; training goes on."""


class SpoolError(ValueError):
    """A spool file that cannot be replayed; the message names the file and line."""


def resolve_tracking_uri(uri: str | None = None) -> str:
    """``uri``, else ``$MLFLOW_TRACKING_URI``, else the embedded ``sqlite:///mlflow.db``."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def quiet_http_retries() -> None:
    """Bounds MLflow's own HTTP retries (by default minutes per call) so that the sender's
    retry loop decides; a value the user has set is kept."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")


# ----- operations ----------------------------------------------------------------------
@dataclasses.dataclass
class Delivery:
    """What the operations delivered to one store share.

    Attributes:
        client: the store's ``MlflowClient`` (rebuilt after a failure).
        ids: the store's id of every key bound so far.
        results: the latest result of every operation that returned one, by operation
            name (an operation may read what an earlier one made).
        rebinds: for every bound key, the operation that binds it again; a spool written
            after this point starts with them.
    """

    client: Any = None
    ids: dict[str, str] = dataclasses.field(default_factory=dict)
    results: dict[str, Any] = dataclasses.field(default_factory=dict)
    rebinds: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def bind(self, key: str, store_id: str, rebind: dict[str, Any]) -> None:
        """Records that ``key`` is ``store_id`` in this store, and ``rebind``: the
        operation (``{"op", "run", "args"}``) that binds it again in a later replay."""
        self.ids[key] = store_id
        self.rebinds.pop(key, None)  # keeps the spool's rebinds in the order of binding
        self.rebinds[key] = rebind


#: ``handler(delivery, key, args)``: delivers one operation and returns its result (or
#: None). A handler raises ``KeyError`` (a key or an earlier result it needs is missing)
#: or ``FileNotFoundError`` (a file to send is gone) for what retrying cannot mend; any
#: other error counts as the store failing, and the operation is tried again. A local
#: file or directory it reads is named by an argument ``path`` or ``<what>_dir``
#: (:func:`names_local_files`), which a replay confines to the run's directory.
Handler = Callable[[Delivery, str | None, dict[str, Any]], Any]

_OPERATIONS: dict[str, Handler] = {}


def register_operations(handlers: Mapping[str, Handler]) -> None:
    """Makes ``handlers`` (operation name → :data:`Handler`) deliverable by every sender
    and every replay.

    Raises:
        ValueError: for a name already registered to another handler.
    """
    for name, handler in handlers.items():
        known = _OPERATIONS.get(name)
        if known is not None and known is not handler:
            raise ValueError(f"operation {name!r} is already registered to {known.__qualname__}")
    _OPERATIONS.update(handlers)


def registered_operations() -> tuple[str, ...]:
    """The names of the operations that can be delivered, sorted."""
    return tuple(sorted(_OPERATIONS))


def _handler(name: str) -> Handler:
    handler = _OPERATIONS.get(name)
    if handler is None:
        known = ", ".join(registered_operations()) or "none"
        raise ValueError(f"unknown operation {name!r}; the registered ones are: {known}")
    return handler


def deliver(delivery: Delivery, op: dict[str, Any]) -> Any:
    """Delivers one operation (``{"op": name, "run": key, "args": {...}}``) and keeps
    its result, if any, in ``delivery.results``."""
    result = _handler(op["op"])(delivery, op.get("run"), op.get("args", {}))
    if result is not None:
        delivery.results[op["op"]] = result
    return result


@dataclasses.dataclass
class SendSummary:
    """What a sender did: operations sent, written to the spool, and where.

    ``run_ids`` holds the store's id of every key the operations bound.
    """

    sent: int
    spooled: int
    spool_path: Path | None
    run_ids: dict[str, str]
    results: dict[str, Any]
    errors: list[str]

    @property
    def complete(self) -> bool:
        return self.spooled == 0


# ----- the sender ----------------------------------------------------------------------
class BufferedSender:
    """Delivers operations to MLflow in order, from a background thread.

    Args:
        client_factory: builds the ``MlflowClient`` (called in the worker thread).
        spool_path: where undelivered operations go when :meth:`close` gives up.
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
        self._delivery = Delivery()
        self.errors: list[str] = []
        self.sent = 0
        self._submitted = 0
        self._finished = 0
        self._failing = False
        self._thread = threading.Thread(target=self._work, name="mlflow-sender", daemon=True)
        self._thread.start()

    def submit(self, op: str, key: str | None = None, /, **args: Any) -> None:
        """Queues the operation ``op`` on ``key`` with ``args``; returns at once.

        Raises:
            ValueError: for an operation that is not registered.
            RuntimeError: after :meth:`close`.
        """
        _handler(op)
        if self._closing.is_set():
            raise RuntimeError("the sender is closed")
        with self._lock:
            self._submitted += 1
        self._queue.put({"op": op, "run": key, "args": args})

    @property
    def run_ids(self) -> dict[str, str]:
        """The store's id of every key bound so far (``{"parent": "<run id>", ...}``)."""
        return self._delivery.ids

    @property
    def results(self) -> dict[str, Any]:
        """The latest result of every operation that returned one, by operation name."""
        return self._delivery.results

    @property
    def healthy(self) -> bool:
        """False while the server is failing."""
        return not self._pending

    def _work(self) -> None:
        delivery = self._delivery
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
                    self._pending.append(item)
                    if self._abandoned:
                        return
                op = item
            # A try that started before close() was called is not the last one: the
            # server may have come back while it failed.
            last_try = self._closing.is_set()
            try:
                if delivery.client is None:
                    delivery.client = self._client_factory()
                self._send(op)
            except Exception as error:
                delivery.client = None
                self._failed(op, error)
                if last_try:
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

    def _send(self, op: dict[str, Any]) -> Any:
        last: Exception | None = None
        for attempt in range(self._attempts):
            try:
                return deliver(self._delivery, op)
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
        if left:
            header = {"format": SPOOL_FORMAT, "version": SPOOL_VERSION, **self._header}
            _write_spool(self.spool_path, header, self._delivery, left)
        return SendSummary(
            sent=self.sent,
            spooled=len(left),
            spool_path=self.spool_path if left else None,
            run_ids=dict(self._delivery.ids),
            results=dict(self._delivery.results),
            errors=list(self.errors),
        )


# ----- the spool -----------------------------------------------------------------------
def _write_spool(
    path: Path, header: dict[str, Any], delivery: Delivery, ops: list[dict[str, Any]]
) -> None:
    """Writes ``header``, the operations that bind again what ``delivery`` bound, and
    ``ops`` to the spool at ``path``, atomically. The lines of an existing spool are kept
    and come first (its header stands for both)."""
    previous: list[str] = []
    lines = [header, *delivery.rebinds.values(), *ops]
    if path.exists():
        previous = [line for line in path.read_text().splitlines() if line.strip()]
        lines = lines[1:]
    text = [*previous, *(json.dumps(line, default=json_default) for line in lines)]
    write_text_atomic(path, "\n".join(text) + "\n")


def read_spool(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The header and operations of a spool file.

    Raises:
        SpoolError: for a missing file, a line that is not JSON or an unknown format.
    """
    header, numbered = _read_spool_lines(Path(path))
    return header, [op for _, op in numbered]


def _read_spool_lines(path: Path) -> tuple[dict[str, Any], list[tuple[int, dict[str, Any]]]]:
    """The header and the operations of a spool, each with its line number."""
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
        ops.append((number, item))
    if header is None:
        raise SpoolError(f"{path}: no header line; not a spool file of neorl_industrial")
    return header, ops


def replay(path: str | Path, tracking_uri: str | None = None) -> SendSummary:
    """Delivers the operations of a spool file, in order, to ``tracking_uri`` (default:
    ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``; never a URI written in the
    spool, which is data). On success the file is renamed to ``*.replayed``; if a delivery
    fails, the operations not yet delivered are written back (after those that bind again
    what the replay bound) and the error is raised.

    Every line is checked before anything is sent: a known operation, and files to
    upload that lie inside the spool's own directory (the run's), after resolving
    symbolic links; a path with ``..``, one that leaves the directory, or a directory
    with a link leading out refuses the whole replay.

    Raises:
        SpoolError: naming the file and line of an operation that cannot be replayed.
    """
    from mlflow import MlflowClient

    path = Path(path)
    header, numbered = _read_spool_lines(path)
    run_dir = path.absolute().parent.resolve()
    ops = [_checked(op, f"{path}:{number}", run_dir) for number, op in numbered]
    uri = resolve_tracking_uri(tracking_uri)
    delivery = Delivery(MlflowClient(tracking_uri=uri, registry_uri=uri))
    for done, op in enumerate(ops):
        try:
            deliver(delivery, op)
        except Exception:
            path.unlink(missing_ok=True)
            _write_spool(path, header, delivery, ops[done:])
            raise
    path.replace(path.with_name(path.name + ".replayed"))
    return SendSummary(
        sent=len(ops),
        spooled=0,
        spool_path=None,
        run_ids=delivery.ids,
        results=delivery.results,
        errors=[],
    )


def _checked(op: dict[str, Any], where: str, run_dir: Path) -> dict[str, Any]:
    """``op`` from a spool line, its files resolved inside ``run_dir``.

    Raises:
        SpoolError: naming ``where`` (file and line) and what is wrong.
    """
    name = op["op"]
    if name not in _OPERATIONS:
        known = ", ".join(registered_operations()) or "none"
        raise SpoolError(f"{where}: unknown operation {name!r}; the registered ones are: {known}")
    if not isinstance(op.get("args", {}), dict):
        raise SpoolError(f"{where}: {name}: 'args' must be an object")
    if not isinstance(op.get("run"), str | None):
        raise SpoolError(f"{where}: {name}: 'run' must be a string")
    args = dict(op.get("args", {}))
    for argument, value in args.items():
        if names_local_files(argument) and value is not None:
            args[argument] = _inside(value, f"{where}: {name} {argument}", run_dir)
    return {**op, "args": args}


def names_local_files(argument: str) -> bool:
    """Whether an operation's argument names a local file or directory that its handler
    reads (to upload it): ``path`` and ``*_dir``, by the operations' convention. A replay
    confines those to the spool's run directory; name other arguments otherwise."""
    return argument == "path" or argument.endswith("_dir")


def _inside(value: Any, where: str, run_dir: Path) -> str:
    """The file ``value`` names, resolved, if it lies in ``run_dir`` (with everything
    under it, for a directory)."""
    if not isinstance(value, str) or not value:
        raise SpoolError(f"{where}: expected a path, got {value!r}")
    named = Path(value)
    if ".." in named.parts:
        raise SpoolError(f"{where}: {value!r} contains '..'; a replay uploads only {run_dir}")
    # A relative path was written relative to the training's working directory, or is
    # read relative to the run directory.
    candidates = [named] if named.is_absolute() else [Path.cwd() / named, run_dir / named]
    resolved_candidates = [candidate.resolve() for candidate in candidates]
    inside = [c for c in resolved_candidates if c.is_relative_to(run_dir)]
    if not inside:
        raise SpoolError(
            f"{where}: {value!r} resolves to {resolved_candidates[0]}, outside the run "
            f"directory {run_dir}; a replay uploads only the run's own files"
        )
    resolved = next((c for c in inside if c.exists()), inside[0])
    if resolved.is_dir():
        for directory, subdirectories, files in os.walk(resolved):
            for entry in (*subdirectories, *files):
                target = Path(directory, entry).resolve()
                if not target.is_relative_to(run_dir):
                    raise SpoolError(
                        f"{where}: {Path(directory, entry)} links to {target}, outside the "
                        f"run directory {run_dir}; a replay uploads only the run's own files"
                    )
    return str(resolved)
