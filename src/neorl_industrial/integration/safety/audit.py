"""An append-only audit log of the shield's overrides (JSON Lines, hash-chained).

Every record holds the time (UTC), a sequence number, the request id and policy version,
the observation, the proposed and the applied action, the constraints the proposal broke
and how the shield repaired it. Each record carries the SHA-256 of its canonical JSON
(``hash``) and the previous record's hash (``prev_hash``), so :meth:`AuditLog.verify`
detects an edited, deleted, inserted or reordered record and names the first bad line.
The chain alone cannot reveal records cut off the end or a log rewritten with fresh
hashes; keep :attr:`AuditLog.last_hash` somewhere else to anchor it.

Writes are one ``write`` per record followed by a flush (and, with ``fsync=True``, an
``os.fsync``). A crash can leave a torn last line; opening the log again cuts it off
(``recovered_bytes`` says how much) and continues the chain from the last whole record.
One process owns a log; its threads may share it.

With ``max_bytes``, the log rotates by size as :class:`logging.handlers.RotatingFileHandler`
does: before a record would take ``audit.jsonl`` past ``max_bytes``, it becomes
``audit.jsonl.1`` (``.1`` becomes ``.2`` ..., the one past ``backups`` is deleted) and a new
``audit.jsonl`` is started. The chain runs on across files: the first record of the new file
carries the previous file's last hash and the next sequence number, so
:meth:`AuditLog.verify_rotated` checks the kept files as one log. Files are created with
mode 0600 (owner only).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from neorl_industrial.integration.safety.monitor import host_report

__all__ = ["GENESIS", "AuditLog", "AuditLogError"]

GENESIS = "0" * 64
_TAIL_CHUNK = 1 << 16


class AuditLogError(ValueError):
    """An audit log that cannot be continued (its last whole record is corrupt)."""


def _encode_number(value: float) -> float | str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def _vector(values: Any) -> list[float | str]:
    return [_encode_number(x) for x in np.asarray(values, np.float64).reshape(-1).tolist()]


def _digest(record: dict[str, Any]) -> str:
    body = {key: value for key, value in record.items() if key != "hash"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _rows(values: Any, batch_shape: tuple[int, ...], name: str) -> np.ndarray:
    """``values`` with leading axes ``batch_shape``, flattened to ``[rows, width]``."""
    array = np.asarray(values, np.float64)
    if array.shape[: len(batch_shape)] != batch_shape:
        raise ValueError(
            f"{name}: shape {array.shape} does not start with the report's {batch_shape}"
        )
    width = math.prod(array.shape[len(batch_shape) :])
    return array.reshape(math.prod(batch_shape), width)


def _last_line(handle: Any, size: int) -> tuple[int, bytes]:
    """The offset and bytes of the file's last line (with its newline, if any)."""
    end = size
    if end and (handle.seek(end - 1), handle.read(1))[1] == b"\n":
        end -= 1  # the newline that ends the last line belongs to it
    position, tail = end, b""
    while position > 0:
        step = min(_TAIL_CHUNK, position)
        position -= step
        handle.seek(position)
        tail = handle.read(step) + tail
        cut = tail.rfind(b"\n")
        if cut >= 0:
            start = position + cut + 1
            break
    else:
        start = 0
    handle.seek(start)
    return start, handle.read(size - start)


class AuditLog:
    """Appends override records to ``path`` (created with its directory if missing).

    Args:
        path: the JSON Lines file.
        policy_version: written into every record.
        fsync: ``os.fsync`` after every write (durable across power loss; slower).
        max_bytes: rotate before a record would take the file past this size (0: never).
        backups: rotated files kept (``path.1`` newest .. ``path.<backups>``); with 0 the
            log never rotates, as with ``RotatingFileHandler``.

    Attributes:
        recovered_bytes: bytes of a torn last line cut off when the log was opened.

    Raises:
        AuditLogError: when the existing file's last whole record is not valid.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        policy_version: str,
        fsync: bool = False,
        max_bytes: int = 0,
        backups: int = 0,
    ) -> None:
        self.path = Path(path)
        self.policy_version = str(policy_version)
        self.fsync = fsync
        self.max_bytes = int(max_bytes)
        self.backups = int(backups)
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self._open()
        self.recovered_bytes, last = self._recover()
        if last is None and self._rotated(1).exists():
            # Rotated, then stopped before the new file's first record: chain on from .1.
            with open(self._rotated(1), "rb") as handle:
                size = handle.seek(0, os.SEEK_END)
                last = _last_line(handle, size)[1] if size else None
        self._sequence, self._last_hash = self._resume(last)
        self._size = self.path.stat().st_size

    def _open(self) -> Any:
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        return os.fdopen(descriptor, "ab")

    def _rotated(self, index: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{index}")

    def _rotate(self) -> None:
        """``path`` → ``path.1`` → ... → ``path.<backups>`` (dropped past it); the caller
        holds the lock."""
        self._file.close()
        for index in range(self.backups - 1, 0, -1):
            if self._rotated(index).exists():
                os.replace(self._rotated(index), self._rotated(index + 1))
        os.replace(self.path, self._rotated(1))
        self._file = self._open()
        self._size = 0

    # ----- opening --------------------------------------------------------------------
    def _recover(self) -> tuple[int, bytes | None]:
        """Cuts a torn last line (no newline, or not JSON); returns the bytes cut and the
        last whole line."""
        with open(self.path, "r+b") as handle:
            size = handle.seek(0, os.SEEK_END)
            if size == 0:
                return 0, None
            start, line = _last_line(handle, size)
            try:
                whole = line.endswith(b"\n") and isinstance(json.loads(line), dict)
            except ValueError:
                whole = False
            if whole:
                return 0, line
            handle.truncate(start)
            previous = _last_line(handle, start)[1] if start else None
            return size - start, previous

    def _resume(self, line: bytes | None) -> tuple[int, str]:
        if line is None:
            return 0, GENESIS
        try:
            record = json.loads(line)
            valid = _digest(record) == record.get("hash")
            sequence = record.get("sequence")
        except (ValueError, AttributeError):
            valid, sequence = False, None
        if not valid or not isinstance(sequence, int):
            raise AuditLogError(f"{self.path}: the last record's hash does not match its content")
        return sequence + 1, record["hash"]

    # ----- writing --------------------------------------------------------------------
    @property
    def last_hash(self) -> str:
        """The hash of the last record written (``GENESIS`` for an empty log)."""
        with self._lock:
            return self._last_hash

    @property
    def next_sequence(self) -> int:
        """The sequence number the next record gets."""
        with self._lock:
            return self._sequence

    def write_overrides(
        self,
        observations: Any,
        proposed: Any,
        applied: Any,
        report: Any,
        constraint_names: Sequence[str],
        request_ids: str | Sequence[str | None] | None = None,
    ) -> int:
        """Writes one record per overridden row of a single or batched report.

        The batch's records are written together, in row order, without records of other
        threads between them.

        Args:
            observations: ``[..., obs_size]`` what the policy saw.
            proposed: ``[..., act_size]`` the policy's actions.
            applied: ``[..., act_size]`` the shield's actions.
            report: the shield's ``SafetyReport`` with leading axes ``...``.
            constraint_names: the hard constraints' names, in the report's column order.
            request_ids: one id per row (row-major for several leading axes), or one id for
                a single report.

        Returns:
            The number of records written.

        Raises:
            ValueError: when the arguments do not line up with the report.
        """
        host = host_report(report, len(constraint_names))
        observations = _rows(observations, host.batch_shape, "observations")
        proposed = _rows(proposed, host.batch_shape, "proposed")
        applied = _rows(applied, host.batch_shape, "applied")
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        if request_ids is not None and len(request_ids) != host.rows:
            raise ValueError(f"request_ids: {len(request_ids)} ids for {host.rows} rows")
        names = np.asarray(constraint_names, dtype=object)
        entries = [
            {
                "request_id": None if request_ids is None else request_ids[row],
                "observation": _vector(observations[row]),
                "proposed": _vector(proposed[row]),
                "applied": _vector(applied[row]),
                "violated": names[host.violated[row]].tolist(),
                "projected": bool(host.projected[row]),
                "fallback": bool(host.fallback[row]),
                "infeasible": bool(host.infeasible[row]),
                "invalid": bool(host.invalid[row]),
                "invalid_observation": bool(
                    getattr(host, "invalid_observation", np.zeros_like(host.invalid))[row]
                ),
            }
            for row in np.flatnonzero(host.overridden).tolist()
        ]
        with self._lock:
            for entry in entries:
                self._append(entry)
        return len(entries)

    def record(
        self,
        *,
        observation: Any,
        proposed: Any,
        applied: Any,
        violated: Sequence[str],
        request_id: str | None = None,
        projected: bool = False,
        fallback: bool = False,
        infeasible: bool = False,
        invalid: bool = False,
    ) -> dict[str, Any]:
        """Appends one override record.

        Args:
            observation: what the policy saw.
            proposed: the policy's action.
            applied: the shield's action.
            violated: names of the hard constraints the proposal broke.
            request_id: the request the action answered.
            projected: the override is a projection of the proposal.
            fallback: the override is the fallback.
            infeasible: no action kept every constraint.
            invalid: the proposal was NaN or infinite.

        Returns:
            The record as written.
        """
        entry = {
            "request_id": request_id,
            "observation": _vector(observation),
            "proposed": _vector(proposed),
            "applied": _vector(applied),
            "violated": [str(name) for name in violated],
            "projected": bool(projected),
            "fallback": bool(fallback),
            "infeasible": bool(infeasible),
            "invalid": bool(invalid),
        }
        with self._lock:
            return self._append(entry)

    def _append(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Chains, writes and flushes one record; the caller holds the lock."""
        record = {
            "sequence": self._sequence,
            "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="microseconds"),
            "policy_version": self.policy_version,
            **entry,
            "prev_hash": self._last_hash,
        }
        record["hash"] = _digest(record)
        line = (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode()
        if (
            self.max_bytes > 0
            and self.backups > 0
            and self._size > 0
            and self._size + len(line) > self.max_bytes
        ):
            self._rotate()
        self._file.write(line)
        self._size += len(line)
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())
        self._sequence += 1
        self._last_hash = record["hash"]
        return record

    def close(self) -> None:
        """Closes the file; later writes raise ``ValueError``."""
        with self._lock:
            self._file.close()

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- reading --------------------------------------------------------------------
    @staticmethod
    def read(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
        """Every record of the log, in order (without checking the chain)."""
        with open(path, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]

    @staticmethod
    def verify(
        path: str | os.PathLike[str], previous_hash: str | None = GENESIS
    ) -> tuple[bool, int, str | None]:
        """Checks every record's hash, the chain and the sequence numbers of one file.

        Args:
            path: the JSON Lines file.
            previous_hash: what the first record's ``prev_hash`` must be (``None``: any,
                for a rotated file whose predecessor was deleted).

        Returns:
            ``(ok, records checked, None)`` for an intact log, otherwise ``(False, records
            checked before the first bad one, message naming its line number)``.
        """
        ok, checked, message, _ = _verify_file(Path(path), previous_hash, None)
        return ok, checked, message

    @staticmethod
    def verify_rotated(path: str | os.PathLike[str]) -> tuple[bool, int, str | None]:
        """Checks a rotated log as one chain: the kept ``path.<n>`` .. ``path.1``, then
        ``path``. The oldest kept file may start anywhere in the chain (older ones were
        deleted); every later file must start where the one before ended.

        Returns:
            as :meth:`verify`, the message naming the file and line.
        """
        path = Path(path)
        files = []
        index = 1
        while path.with_name(f"{path.name}.{index}").exists():
            files.insert(0, path.with_name(f"{path.name}.{index}"))
            index += 1
        files.append(path)
        state: tuple[str | None, int | None] = (None, None)
        total = 0
        for file in files:
            ok, checked, message, state = _verify_file(file, *state)
            total += checked
            if not ok:
                return False, total, f"{file.name}: {message}"
        return True, total, None


def _verify_file(
    path: Path, previous: str | None, expected: int | None
) -> tuple[bool, int, str | None, tuple[str | None, int | None]]:
    """One file of the chain: ok, records checked, the message, and the (last hash, next
    sequence) the next file starts from."""
    checked = 0
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                return False, checked, f"line {number}: not valid JSON", (previous, expected)
            if not isinstance(record, dict):
                return False, checked, f"line {number}: not a record", (previous, expected)
            if previous is not None and record.get("prev_hash") != previous:
                message = (
                    f"line {number}: breaks the chain "
                    "(a record before it was changed, removed or moved)"
                )
                return False, checked, message, (previous, expected)
            if _digest(record) != record.get("hash"):
                message = f"line {number}: the content does not match its hash"
                return False, checked, message, (previous, expected)
            sequence = record.get("sequence")
            if not isinstance(sequence, int) or expected not in (None, sequence):
                message = f"line {number}: sequence {sequence!r}, expected {expected}"
                return False, checked, message, (previous, expected)
            expected = sequence + 1
            previous = record["hash"]
            checked += 1
    return True, checked, None, (previous, expected)
