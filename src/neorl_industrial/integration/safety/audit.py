"""An append-only audit log of the shield's overrides (JSON Lines, hash-chained).

Every override record holds the time (UTC), a sequence number, the request id, the policy
version that decided, the API key's fingerprint, the observation, the proposed and the
applied action, the constraints the proposal broke (``violated``) and those the applied
action still breaks (``violated_after``, where the report says), and how the shield
repaired it. Each record carries the SHA-256 of its canonical JSON (``hash``) and the
previous record's hash (``prev_hash``), so an edited, deleted, inserted or reordered record
breaks the chain. A log found on opening to end before its anchor (or without one) gets a
``gap`` record saying so, which verification reports.

**Files.** ``audit.jsonl`` is the file being written. With ``max_bytes`` and ``backups`` it
rotates by size as :class:`logging.handlers.RotatingFileHandler` does (``audit.jsonl`` →
``.1`` → ``.2`` ...), except that nothing is ever deleted: the file that would pass
``backups`` is moved to the archive directory ``audit.jsonl.archive/`` (named by its file
number), with a warning in the log and a count in :meth:`AuditLog.stats`. Shipping the
archive elsewhere and emptying it is the operator's job. Every file starts with a ``file``
record (chained like the others) holding its file number and how many records the previous
file had. Beside the log:

* ``audit.jsonl.anchor``: the newest file's number, the next sequence number and the chain's
  head hash, rewritten after every write, so records cut from the end are detected;
* ``audit.jsonl.lock``: an exclusive ``flock`` held while a process writes, with its pid; a
  second writer is refused (two writers would interleave and break the chain);
* ``audit.jsonl.torn``: the bytes of a torn last line (a crash mid-write), cut off when the
  log is opened again, one JSON line each (base64), never discarded.

:func:`check_chain` verifies the archive, the rotated files and the current one as one chain
against the anchor: a file deleted from the middle, every rotated file deleted, a cut head
or tail, an edited record and reordered files are each named. A log rewritten whole with
fresh hashes and a fresh anchor is only caught against a head hash kept elsewhere
(``check_chain(..., anchor=HASH)``, ``neorl-industrial audit verify LOG --anchor HASH``).

**Volume.** With ``window_s``, overrides of one key with the same violated constraints,
shield flags and policy version within a window are written as one full record (the first)
and one ``aggregate`` record when the window closes: the count, the first and last time and
request id, and a SHA-256 of the rows (:func:`rows_digest_update`). With ``key_rate``,
each key gets that many full records per second (burst: ten seconds' worth); past it, rows
are folded into aggregates too. Nothing is dropped: every overridden row is in a full
record or counted in an aggregate.

Writes are one ``write`` per record followed by a flush (and, with ``fsync=True``, an
``os.fsync`` of the log and the anchor). One process owns a log; its threads may share it.
Files are created with mode 0600 (owner only).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as dt
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from neorl_industrial.integration.safety.monitor import host_report

__all__ = [
    "GENESIS",
    "AuditLog",
    "AuditLogError",
    "ChainCheck",
    "check_chain",
    "claim",
    "release_claim",
    "rows_digest_update",
]

GENESIS = "0" * 64
_TAIL_CHUNK = 1 << 16
#: The anchor is rewritten in place at a fixed length, so one ``pwrite`` replaces it.
_ANCHOR_BYTES = 256
#: The fields the chain sets on every record; an appended entry may not set them.
_CHAIN_FIELDS = frozenset({"sequence", "timestamp", "policy_version", "prev_hash", "hash"})
#: Open aggregation groups kept at most; past it the oldest is written out early.
_MAX_GROUPS = 4096
_FLAGS = (
    "projected",
    "fallback",
    "infeasible",
    "invalid",
    "invalid_observation",
    "out_of_distribution",
)

log = logging.getLogger("neorl_industrial.audit")
_clock = time.monotonic  # windows and rates run on it (a test replaces it)


#: Writer locks this process took before opening their logs (:func:`claim`), by the lock
#: file's resolved path; the :class:`AuditLog` opened on the log takes its claim over.
_claims: dict[str, int] = {}
_claims_guard = threading.Lock()


def _lock_file(path: Path) -> Path:
    return path.with_name(f"{path.name}.lock")


def _take_lock(path: Path) -> int:
    """The writer lock of the log at ``path``, held by this process from now on.

    Raises:
        AuditLogError: another process holds it (naming its pid).
    """
    lock = _lock_file(path)
    descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(descriptor, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(descriptor)
        raise AuditLogError(
            f"audit log {path}: held by another process (pid {holder}, lock {lock}); "
            "two writers would interleave and break the hash chain: stop that process "
            "or give this one another audit log"
        ) from None
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
    return descriptor


def claim(path: str | os.PathLike[str]) -> None:
    """Takes the writer lock of the log at ``path`` now, before a long start (a server
    loads and compiles its policy for a minute or more): a log another process holds is
    refused at once, not after the loading. The :class:`AuditLog` this process opens on
    ``path`` later takes the claim over; claiming a log twice is claiming it once.

    Raises:
        AuditLogError: another process holds the log.
        OSError: its directory or lock file cannot be created.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = str(_lock_file(path).resolve())
    with _claims_guard:
        if key not in _claims:
            _claims[key] = _take_lock(path)


def release_claim(path: str | os.PathLike[str]) -> bool:
    """Releases a :func:`claim` no :class:`AuditLog` took over (a start that failed);
    whether there was one."""
    key = str(_lock_file(Path(path)).resolve())
    with _claims_guard:
        descriptor = _claims.pop(key, None)
    if descriptor is None:
        return False
    with contextlib.suppress(OSError):
        fcntl.flock(descriptor, fcntl.LOCK_UN)
        os.close(descriptor)
    return True


class AuditLogError(ValueError):
    """An audit log that cannot be written or continued; the message names the file."""


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


def _parse(line: bytes | str) -> Any:
    """``json.loads`` whose every failure is a ValueError: JSON nested deeper than the
    parser's recursion (an edited line) raises RecursionError, which no caller of a
    reader of untrusted lines expects."""
    try:
        return json.loads(line)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


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


def _first_record(path: Path) -> dict[str, Any] | None:
    """The file's first line as a record (``None``: empty, missing or not a record)."""
    try:
        with open(path, "rb") as handle:
            line = handle.readline()
        record = _parse(line) if line.strip() else None
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def rows_digest_update(
    digest: Any, request_id: str | None, observation: Any, proposed: Any, applied: Any
) -> None:
    """Adds one row to an aggregate's ``rows_sha256``: the request id in UTF-8 and a NUL
    byte, then the observation, the proposed and the applied action as little-endian
    float64 — what anyone holding the rows can recompute."""
    digest.update((request_id or "").encode() + b"\0")
    for values in (observation, proposed, applied):
        digest.update(np.asarray(values, "<f8").tobytes())


@dataclasses.dataclass
class _Group:
    """Overrides folded into one aggregate record while its window is open."""

    opened: float
    key: str | None
    policy_version: str
    violated: tuple[str, ...]
    violated_after: tuple[str, ...] | None
    flags: tuple[bool, ...]
    detailed: int | None  # the sequence of the full record that opened it
    count: int = 0
    rate_limited: int = 0
    first_time: str | None = None
    last_time: str | None = None
    first_request_id: str | None = None
    last_request_id: str | None = None
    digest: Any = dataclasses.field(default_factory=hashlib.sha256)


@dataclasses.dataclass
class _Bucket:
    tokens: float
    stamp: float
    warned: float = -math.inf


class AuditLog:
    """Appends override records to ``path`` (created with its directory if missing).

    Args:
        path: the JSON Lines file.
        policy_version: written into records that are not given one.
        fsync: ``os.fsync`` after every write (durable across power loss; slower).
        max_bytes: rotate before a record would take the file past this size (0: never).
        backups: rotated files kept beside the log (``path.1`` newest .. ``path.<backups>``);
            older ones move to ``path.archive/``; with 0 the log never rotates.
        window_s: seconds an aggregation window stays open (0: every override in full).
        key_rate: full records per key per second (0: no limit; needs ``window_s``).

    Attributes:
        recovered_bytes: bytes of a torn last line cut off when the log was opened.

    Raises:
        AuditLogError: when another process holds the log, or the existing file's last
            whole record is not valid.
        ValueError: for a rate limit without an aggregation window.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        policy_version: str,
        fsync: bool = False,
        max_bytes: int = 0,
        backups: int = 0,
        window_s: float = 0.0,
        key_rate: float = 0.0,
    ) -> None:
        self.path = Path(path)
        self.policy_version = str(policy_version)
        self.fsync = fsync
        self.max_bytes = int(max_bytes)
        self.backups = int(backups)
        self.window_s = float(window_s)
        self.key_rate = float(key_rate)
        if self.key_rate > 0 and self.window_s <= 0:
            raise ValueError(
                f"audit log {self.path}: a rate limit per key ({self.key_rate:g}/s) folds rows "
                "into aggregates, which needs an aggregation window (window_s > 0)"
            )
        self._burst = max(1.0, 10.0 * self.key_rate)
        self._lock = threading.Lock()
        self._groups: dict[tuple[Any, ...], _Group] = {}
        self._buckets: dict[str | None, _Bucket] = {}
        self._stats = dict.fromkeys(
            (
                "records",
                "folded_rows",
                "rate_limited_rows",
                "aggregates",
                "archived_files",
                "archived_records",
                "gaps",
                "torn_bytes",
            ),
            0,
        )
        self._failed: str | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd = self._acquire()
        try:
            self._open_chain()
        except BaseException:
            self._release()
            raise
        self._stop = threading.Event()
        self._flusher = None
        if self.window_s > 0:
            self._flusher = threading.Thread(
                target=self._flush_loop, name=f"audit-flush:{self.path.name}", daemon=True
            )
            self._flusher.start()

    # ----- names beside the log -------------------------------------------------------
    def _beside(self, suffix: str) -> Path:
        return self.path.with_name(f"{self.path.name}.{suffix}")

    def _rotated(self, index: int) -> Path:
        return self._beside(str(index))

    # ----- the lock -------------------------------------------------------------------
    def _acquire(self) -> int:
        key = str(_lock_file(self.path).resolve())
        with _claims_guard:
            claimed = _claims.pop(key, None)
        return claimed if claimed is not None else _take_lock(self.path)

    def _release(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)

    # ----- opening --------------------------------------------------------------------
    def _open_file(self) -> Any:
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        return os.fdopen(descriptor, "ab")

    def _open_chain(self) -> None:
        self._file = self._open_file()
        self.recovered_bytes, last = self._recover()
        previous_file = None
        if last is None and self._rotated(1).exists():
            # Rotated, then stopped before the new file's header: chain on from .1.
            with open(self._rotated(1), "rb") as handle:
                size = handle.seek(0, os.SEEK_END)
                last = _last_line(handle, size)[1] if size else None
            previous_file = _first_record(self._rotated(1))
        self._sequence, self._last_hash = self._resume(last)
        self._size = self.path.stat().st_size
        header = _first_record(self.path)
        if self._size == 0:
            number = 0
            if previous_file is not None and previous_file.get("kind") == "file":
                number = int(previous_file.get("file", -1)) + 1
            self._file_number, self._file_records = number, 0
            counted = _count_lines(self._rotated(1)) if number else 0
            self._write_header(counted)
        else:
            self._file_number = int(header["file"]) if _is_header(header) else 0
            self._file_records = _count_lines(self.path)
        anchor_descriptor = os.open(self._beside("anchor"), os.O_RDWR | os.O_CREAT, 0o600)
        self._anchor_fd = anchor_descriptor
        self._reconcile_anchor()

    def _recover(self) -> tuple[int, bytes | None]:
        """Cuts a torn last line (no newline, or not JSON) into the side file; returns the
        bytes cut and the last whole line."""
        with open(self.path, "r+b") as handle:
            size = handle.seek(0, os.SEEK_END)
            if size == 0:
                return 0, None
            start, line = _last_line(handle, size)
            try:
                whole = line.endswith(b"\n") and isinstance(_parse(line), dict)
            except ValueError:
                whole = False
            if whole:
                return 0, line
            self._keep_torn(line, start)
            handle.truncate(start)
            previous = _last_line(handle, start)[1] if start else None
            return size - start, previous

    def _keep_torn(self, data: bytes, offset: int) -> None:
        side = self._beside("torn")
        entry = {
            "time": _now(),
            "file": self.path.name,
            "offset": offset,
            "bytes": len(data),
            "base64": base64.b64encode(data).decode(),
        }
        descriptor = os.open(side, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(descriptor, "ab") as handle:
            handle.write((json.dumps(entry) + "\n").encode())
            handle.flush()
            os.fsync(handle.fileno())
        self._stats["torn_bytes"] += len(data)
        log.warning(
            "audit log %s: cut a torn last line of %d bytes at offset %d (a write interrupted "
            "by a crash); the bytes are kept in %s",
            self.path,
            len(data),
            offset,
            side,
        )

    def _resume(self, line: bytes | None) -> tuple[int, str]:
        if line is None:
            return 0, GENESIS
        try:
            record = _parse(line)
            valid = _digest(record) == record.get("hash")
            sequence = record.get("sequence")
        except (ValueError, AttributeError, RecursionError):
            valid, sequence = False, None
        if not valid or not isinstance(sequence, int):
            raise AuditLogError(f"{self.path}: the last record's hash does not match its content")
        return sequence + 1, record["hash"]

    def _reconcile_anchor(self) -> None:
        """Compares the anchor with the log's end; a log that ends before its anchor (or
        has records but no anchor) gets a ``gap`` record saying so, then a fresh anchor."""
        anchor = _read_anchor(self._beside("anchor"))
        if anchor is None:
            if self._sequence > 1:  # more than a header: there was an anchor
                self._gap(None, "no anchor beside a log with records (deleted or unreadable)")
        elif anchor.get("head") != self._last_hash:
            sequence = anchor.get("sequence")
            if not isinstance(sequence, int) or sequence >= self._sequence:
                self._gap(
                    anchor,
                    f"the log ends at sequence {self._sequence}, its anchor at {sequence}: "
                    "records were cut from the end",
                )
            else:  # written before a crash stopped the anchor's update: a lower bound
                log.info(
                    "audit log %s: %d records after its anchor (the anchor was not updated "
                    "before the process stopped); anchor updated",
                    self.path,
                    self._sequence - sequence,
                )
        self._write_anchor()

    def _gap(self, anchor: dict[str, Any] | None, reason: str) -> None:
        log.error("audit log %s: %s; a gap record says so in the chain", self.path, reason)
        self._stats["gaps"] += 1
        self._append({"kind": "gap", "reason": reason, "anchor": anchor}, self.policy_version)

    # ----- writing --------------------------------------------------------------------
    @property
    def last_hash(self) -> str:
        """The hash of the last record written (the chain's head)."""
        with self._lock:
            return self._last_hash

    @property
    def next_sequence(self) -> int:
        """The sequence number the next record gets."""
        with self._lock:
            return self._sequence

    @property
    def file_number(self) -> int:
        """The number of the file being written (0 for the first, +1 per rotation)."""
        with self._lock:
            return self._file_number

    def stats(self) -> dict[str, int]:
        """Counts since the log was opened: ``records`` written, ``folded_rows`` counted in
        aggregates (``rate_limited_rows`` of them past a key's rate), ``aggregates``,
        ``archived_files`` and ``archived_records`` moved to the archive, ``gaps`` found
        against the anchor, ``torn_bytes`` cut on opening, and the open ``groups``."""
        with self._lock:
            return {**self._stats, "groups": len(self._groups)}

    def check(self) -> None:
        """Checks that the log can go on: still the file this process writes, no write has
        failed, nobody else changed its size.

        Raises:
            AuditLogError: naming the file and what changed.
        """
        with self._lock:
            if self._failed is not None:
                raise AuditLogError(f"audit log {self.path}: a write failed: {self._failed}")
            if self._file.closed:
                raise AuditLogError(f"audit log {self.path}: closed")
            held = os.fstat(self._file.fileno())
            try:
                current = os.stat(self.path)
            except FileNotFoundError:
                current = None
            if current is None or (current.st_dev, current.st_ino) != (held.st_dev, held.st_ino):
                raise AuditLogError(
                    f"audit log {self.path}: the file was moved, replaced or deleted while "
                    "this process wrote it; records would go to a file nobody reads"
                )
            if held.st_size != self._size:
                raise AuditLogError(
                    f"audit log {self.path}: {held.st_size} bytes on disk, {self._size} "
                    "written by this process: another writer changed it"
                )

    def write_overrides(
        self,
        observations: Any,
        proposed: Any,
        applied: Any,
        report: Any,
        constraint_names: Sequence[str],
        request_ids: str | Sequence[str | None] | None = None,
        *,
        policy_version: str | None = None,
        key: str | None = None,
    ) -> int:
        """Records every overridden row of a single or batched report, in full or (with a
        window) folded into an aggregate.

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
            policy_version: the version that decided (default: the log's).
            key: who asked (an API key's fingerprint); aggregation and the rate limit are
                per key.

        Returns:
            The number of overridden rows recorded.

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
        version = self.policy_version if policy_version is None else str(policy_version)
        rows = np.flatnonzero(host.overridden)
        classes, class_of = _classes(host, rows, np.asarray(constraint_names, dtype=object))
        # One contiguous float64 block per row: what the aggregates' digest reads.
        blocks = np.concatenate([observations, proposed, applied], axis=1)[rows]
        blocks = np.ascontiguousarray(blocks, "<f8")
        rows = rows.tolist()
        stamp = _now()
        with self._lock:
            now = _clock()
            if self._groups:
                self._flush_groups(now)
            for index, row in enumerate(rows):
                violated, still, row_flags = classes[class_of[index]]
                rid = None if request_ids is None else request_ids[row]
                group_key = (key, version, violated, still, row_flags)
                group = self._groups.get(group_key)
                limited = False
                if group is None:
                    if self._take_token(key, now):
                        entry = {
                            "kind": "override",
                            "key": key,
                            "request_id": rid,
                            "observation": _vector(observations[row]),
                            "proposed": _vector(proposed[row]),
                            "applied": _vector(applied[row]),
                            "violated": list(violated),
                            "violated_after": None if still is None else list(still),
                            **dict(zip(_FLAGS, row_flags, strict=True)),
                        }
                        record = self._append(entry, version)
                        if self.window_s > 0:
                            self._open_group(group_key, now, record["sequence"])
                        continue
                    limited = True
                    group = self._open_group(group_key, now, None)
                self._fold(group, rid, blocks[index], stamp, limited)
            if rows:
                self._write_anchor()
        return len(rows)

    def _take_token(self, key: str | None, now: float) -> bool:
        """Takes one full record of ``key``'s rate (always granted without a rate)."""
        if self.key_rate <= 0:
            return True
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(self._burst, now)
        bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.stamp) * self.key_rate)
        bucket.stamp = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return True
        if now - bucket.warned >= max(self.window_s, 1.0):
            bucket.warned = now
            log.warning(
                "audit log %s: key %s over %g full records per second; its overrides are "
                "counted in aggregate records",
                self.path,
                key,
                self.key_rate,
            )
        return False

    def _open_group(self, group_key: tuple[Any, ...], now: float, detailed: int | None) -> _Group:
        if len(self._groups) >= _MAX_GROUPS:
            oldest = min(self._groups, key=lambda k: self._groups[k].opened)
            self._write_group(self._groups.pop(oldest))
        key, version, violated, still, flags = group_key
        group = _Group(now, key, version, violated, still, flags, detailed)
        self._groups[group_key] = group
        return group

    def _fold(
        self, group: _Group, request_id: str | None, block: np.ndarray, stamp: str, limited: bool
    ) -> None:
        """Counts one row in ``group``; ``block``: its observation, proposed and applied
        action as one little-endian float64 row (``rows_digest_update``'s bytes)."""
        if group.count == 0:
            group.first_time, group.first_request_id = stamp, request_id
        group.last_time, group.last_request_id = stamp, request_id
        group.count += 1
        group.rate_limited += int(limited)
        group.digest.update((request_id or "").encode() + b"\0" + block.tobytes())
        self._stats["folded_rows"] += 1
        self._stats["rate_limited_rows"] += int(limited)

    def _flush_groups(self, now: float | None = None) -> None:
        """Writes the aggregates of closed windows (every one when ``now`` is None); the
        caller holds the lock."""
        closed = [
            key
            for key, group in self._groups.items()
            if now is None or now - group.opened >= self.window_s
        ]
        for key in closed:
            self._write_group(self._groups.pop(key))
        if closed:
            self._write_anchor()

    def _write_group(self, group: _Group) -> None:
        if group.count == 0:
            return
        entry = {
            "kind": "aggregate",
            "key": group.key,
            "violated": list(group.violated),
            "violated_after": None if group.violated_after is None else list(group.violated_after),
            **dict(zip(_FLAGS, group.flags, strict=True)),
            "count": group.count,
            "rate_limited": group.rate_limited,
            "first_time": group.first_time,
            "last_time": group.last_time,
            "first_request_id": group.first_request_id,
            "last_request_id": group.last_request_id,
            "rows_sha256": group.digest.hexdigest(),
            "detailed": group.detailed,
        }
        self._append(entry, group.policy_version)
        self._stats["aggregates"] += 1

    def _flush_loop(self) -> None:
        period = min(self.window_s, 1.0) / 2
        while not self._stop.wait(period):
            with self._lock:
                if self._groups and self._failed is None and not self._file.closed:
                    try:
                        self._flush_groups(_clock())
                    except OSError as error:  # recorded; the next write or check says so
                        log.error("audit log %s: writing aggregates failed: %s", self.path, error)

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
        invalid_observation: bool = False,
        out_of_distribution: bool = False,
        violated_after: Sequence[str] | None = None,
        policy_version: str | None = None,
        key: str | None = None,
    ) -> dict[str, Any]:
        """Appends one override record in full (no aggregation, no rate limit).

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
            invalid_observation: the observation left its physical bounds.
            out_of_distribution: the observation left the training data's range.
            violated_after: names of the hard constraints the applied action breaks
                (``None``: not known).
            policy_version: the version that decided (default: the log's).
            key: who asked (an API key's fingerprint).

        Returns:
            The record as written.
        """
        entry = {
            "kind": "override",
            "key": key,
            "request_id": request_id,
            "observation": _vector(observation),
            "proposed": _vector(proposed),
            "applied": _vector(applied),
            "violated": [str(name) for name in violated],
            "violated_after": None
            if violated_after is None
            else [str(name) for name in violated_after],
            "projected": bool(projected),
            "fallback": bool(fallback),
            "infeasible": bool(infeasible),
            "invalid": bool(invalid),
            "invalid_observation": bool(invalid_observation),
            "out_of_distribution": bool(out_of_distribution),
        }
        return self.append(entry, policy_version)

    def append(self, entry: Mapping[str, Any], policy_version: str | None = None) -> dict[str, Any]:
        """Appends one record of any ``kind`` in full to the chain (sequence, time, policy
        version and hashes added) and moves the anchor; what other writers (the OPC UA
        bridge's writes) record beside the server's overrides.

        Raises:
            AuditLogError: an entry without a ``kind`` or one that sets the chain's own
                fields, or a log that can no longer be written.
        """
        if not isinstance(entry.get("kind"), str) or not entry["kind"]:
            raise AuditLogError(f"audit log {self.path}: a record needs a 'kind'")
        reserved = sorted(set(entry) & _CHAIN_FIELDS)
        if reserved:
            raise AuditLogError(
                f"audit log {self.path}: a record may not set the chain's fields {reserved}"
            )
        with self._lock:
            record = self._append(dict(entry), policy_version or self.policy_version)
            self._write_anchor()
            return record

    def _append(self, entry: dict[str, Any], policy_version: str) -> dict[str, Any]:
        """Chains, writes and flushes one record (rotating first when it would not fit);
        the caller holds the lock."""
        if self._failed is not None:
            raise AuditLogError(f"audit log {self.path}: a write failed: {self._failed}")
        record = {
            "sequence": self._sequence,
            "timestamp": _now(),
            "policy_version": policy_version,
            **entry,
            "prev_hash": self._last_hash,
        }
        record["hash"] = _digest(record)
        line = (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode()
        if (
            entry.get("kind") != "file"
            and self.max_bytes > 0
            and self.backups > 0
            and self._size > 0
            and self._file_records > 1  # never a file of its header alone
            and self._size + len(line) > self.max_bytes
        ):
            self._rotate()
            return self._append(entry, policy_version)  # chained after the new header
        try:
            self._file.write(line)
            self._file.flush()
            if self.fsync:
                os.fsync(self._file.fileno())
        except OSError as error:
            self._failed = str(error)
            raise
        self._size += len(line)
        self._file_records += 1
        self._sequence += 1
        self._last_hash = record["hash"]
        self._stats["records"] += 1
        return record

    def _write_header(self, previous_records: int) -> None:
        header = {"kind": "file", "file": self._file_number, "previous_records": previous_records}
        self._append(header, self.policy_version)

    def _write_anchor(self) -> None:
        """Rewrites the anchor in place (one fixed-length ``pwrite``); the caller holds the
        lock (or is opening the log)."""
        anchor = {
            "file": self._file_number,
            "sequence": self._sequence,
            "head": self._last_hash,
            "records": self._file_records,
        }
        text = json.dumps(anchor, separators=(",", ":"))
        data = text.ljust(_ANCHOR_BYTES - 1).encode() + b"\n"
        os.pwrite(self._anchor_fd, data, 0)
        if self.fsync:
            os.fsync(self._anchor_fd)

    def _rotate(self) -> None:
        """``path`` → ``path.1`` → ... → ``path.<backups>`` → the archive; a new file with
        its header. The caller holds the lock."""
        self._file.close()
        oldest = self._rotated(self.backups)
        if oldest.exists():
            self._archive(oldest)
        for index in range(self.backups - 1, 0, -1):
            if self._rotated(index).exists():
                os.replace(self._rotated(index), self._rotated(index + 1))
        os.replace(self.path, self._rotated(1))
        previous_records = self._file_records
        self._file = self._open_file()
        self._size = 0
        self._file_number += 1
        self._file_records = 0
        self._write_header(previous_records)

    def _archive(self, file: Path) -> None:
        header = _first_record(file)
        number = int(header["file"]) if _is_header(header) else self._file_number - self.backups
        # The file after it says how many records it holds: no need to read it whole.
        after = _first_record(self._rotated(self.backups - 1) if self.backups > 1 else self.path)
        records = int(after.get("previous_records", 0)) if _is_header(after) else None
        archive = self._beside("archive")
        archive.mkdir(mode=0o700, exist_ok=True)
        target = archive / f"{self.path.name}.{number:06d}"
        if target.exists():  # never replace what the archive holds (it would delete it)
            target = archive / f"{target.name}.duplicate-{time.time_ns()}"
            log.error("audit log %s: the archive already holds file %d", self.path, number)
        os.replace(file, target)
        self._stats["archived_files"] += 1
        self._stats["archived_records"] += records or 0
        log.warning(
            "audit log %s: %d rotated files kept; moved file %d (%s records) to %s: "
            "ship it elsewhere and delete it there",
            self.path,
            self.backups,
            number,
            "?" if records is None else records,
            target,
        )

    def close(self) -> None:
        """Writes the open aggregates, closes the files and releases the lock; later
        writes raise ``ValueError``."""
        if getattr(self, "_flusher", None) is not None:
            self._stop.set()
            self._flusher.join()
        with self._lock:
            if self._file.closed:
                return
            try:
                if self._failed is None:
                    self._flush_groups()
                    self._write_anchor()
            finally:
                self._file.close()
                os.close(self._anchor_fd)
                self._release()

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- reading --------------------------------------------------------------------
    @staticmethod
    def read(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
        """Every record of one file, in order (without checking the chain)."""
        with open(path, encoding="utf-8") as handle:
            return [_parse(line) for line in handle if line.strip()]

    @staticmethod
    def verify(
        path: str | os.PathLike[str], previous_hash: str | None = GENESIS
    ) -> tuple[bool, int, str | None]:
        """Checks every record's hash, the chain and the sequence numbers of one file.

        Args:
            path: the JSON Lines file.
            previous_hash: what the first record's ``prev_hash`` must be (``None``: any,
                for a rotated file).

        Returns:
            ``(ok, records checked, None)`` for an intact file, otherwise ``(False, records
            checked before the first bad one, message naming its line number)``.
        """
        state = _ChainState(previous_hash, 0 if previous_hash == GENESIS else None)
        message = _verify_file(Path(path), state, expect_header=None)
        return message is None, state.records, message

    @staticmethod
    def verify_rotated(
        path: str | os.PathLike[str], *, anchor: str | None = None
    ) -> tuple[bool, int, str | None]:
        """Checks the whole log as one chain (:func:`check_chain`).

        Returns:
            as :meth:`verify`, the message naming the file and line.
        """
        result = check_chain(path, anchor=anchor)
        return result.ok, result.records, result.message


def _classes(
    host: Any, rows: np.ndarray, names: np.ndarray
) -> tuple[list[tuple[Any, ...]], list[int]]:
    """The distinct (violated, violated_after, flags) of ``rows`` and each row's index
    into them: rows share few patterns, so each is named once."""
    columns = [host.violated[rows]]
    after = host.violated_after
    if after is not None:
        columns.append(after[rows])
    columns.append(np.stack([getattr(host, name)[rows] for name in _FLAGS], axis=-1))
    bits = np.concatenate(columns, axis=1)
    patterns, inverse = np.unique(bits, axis=0, return_inverse=True)
    width = host.violated.shape[1]
    classes = []
    for pattern in patterns:
        violated = tuple(names[pattern[:width]].tolist())
        still = None if after is None else tuple(names[pattern[width : 2 * width]].tolist())
        flags = tuple(bool(flag) for flag in pattern[-len(_FLAGS) :])
        classes.append((violated, still, flags))
    return classes, inverse.reshape(-1).tolist()


def _is_header(record: dict[str, Any] | None) -> bool:
    return (
        isinstance(record, dict)
        and record.get("kind") == "file"
        and isinstance(record.get("file"), int)
    )


def _count_lines(path: Path) -> int:
    count = 0
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            count += block.count(b"\n")
    return count


def _read_anchor(path: Path) -> dict[str, Any] | None:
    try:
        anchor = _parse(path.read_bytes() or b"null")
    except (OSError, ValueError):
        return None
    return anchor if isinstance(anchor, dict) else None


# ----- verification -----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ChainCheck:
    """What :func:`check_chain` found.

    Attributes:
        ok: the whole log is intact.
        records: records checked before the first bad one (all of them when intact).
        head: the hash of the last record checked (the chain's head when intact).
        message: the first bad place (file and line) and what is wrong; ``None`` if ok.
        files: the files checked, oldest first.
        notes: facts that are not failures (records written after the anchor's update).
    """

    ok: bool
    records: int
    head: str
    message: str | None
    files: tuple[str, ...]
    notes: tuple[str, ...] = ()


@dataclasses.dataclass
class _ChainState:
    previous: str | None
    sequence: int | None
    records: int = 0
    file: int | None = None
    file_records: int = 0
    previous_file_records: int | None = None  # None: the first file checked
    seen_anchor: bool = False
    # Where the beside-the-log anchor's head was found: (file, records up to it, sequence).
    seen_head_at: tuple[int | None, int, int] | None = None


def _chain_files(path: Path) -> list[Path]:
    """The archive (by file number), the rotated files (oldest first), the current file."""
    archive = path.with_name(f"{path.name}.archive")
    numbered = re.compile(re.escape(path.name) + r"\.(\d+)")
    archived = []
    if archive.is_dir():
        archived = sorted(
            (int(m.group(1)), p) for p in archive.iterdir() if (m := numbered.fullmatch(p.name))
        )
    rotated = sorted(
        ((int(m.group(1)), p) for p in path.parent.iterdir() if (m := numbered.fullmatch(p.name))),
        reverse=True,
    )
    files = [p for _, p in archived] + [p for _, p in rotated]
    if path.exists():
        files.append(path)
    return files


def _records(path: Path) -> Iterator[tuple[int, str]]:
    with open(path, encoding="utf-8", errors="surrogateescape") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                yield number, line


def _verify_file(
    path: Path,
    state: _ChainState,
    *,
    expect_header: int | None,
    anchor: str | None = None,
    head: str | None = None,
) -> str | None:
    """Checks one file, continuing ``state``; the message of the first bad line or None.

    ``expect_header``: the file number its first record must declare (None: no header
    needed). ``anchor``: a hash to look for; ``head``: the beside-the-log anchor's head."""
    first = True
    state.file_records = 0
    for number, line in _records(path):
        try:
            record = _parse(line)
        except ValueError as error:
            return f"line {number}: not valid JSON ({error})"
        if not isinstance(record, dict):
            return f"line {number}: not a record"
        if first and expect_header is not None:
            if not _is_header(record):
                return (
                    f"line {number}: not a file header (the head of the file was cut, or it "
                    "was written by another program)"
                )
            declared = record["file"]
            if declared != expect_header:
                if declared > expect_header:
                    missing = (
                        f"file {expect_header} is"
                        if declared == expect_header + 1
                        else f"files {expect_header} to {declared - 1} are"
                    )
                    return (
                        f"is file {declared}, expected file {expect_header}: {missing} missing "
                        "(deleted, or renamed out of order)"
                    )
                return f"is file {declared}, expected file {expect_header}: files out of order"
            held = state.previous_file_records
            if held is not None and record.get("previous_records") != held:
                return (
                    f"line {number}: the previous file held {record.get('previous_records')} "
                    f"records, {held} were found in it"
                )
        first = False
        if state.previous is not None and record.get("prev_hash") != state.previous:
            return (
                f"line {number}: breaks the chain (a record before it was changed, removed or "
                "moved, or the end of the previous file was cut)"
            )
        try:
            matches = _digest(record) == record.get("hash")
        except (RecursionError, ValueError, TypeError):
            matches = False  # nested too deeply to hash: no record the log wrote
        if not matches:
            return f"line {number}: the content does not match its hash"
        sequence = record.get("sequence")
        if not isinstance(sequence, int) or state.sequence not in (None, sequence):
            return f"line {number}: sequence {sequence!r}, expected {state.sequence}"
        if record.get("kind") == "gap":
            return f"line {number}: records were lost before it ({record.get('reason')})"
        state.sequence = sequence + 1
        state.previous = record["hash"]
        state.records += 1
        state.file_records += 1
        if anchor is not None and record["hash"] == anchor:
            state.seen_anchor = True
        if head is not None and record["hash"] == head:
            state.seen_head_at = (expect_header, state.records, sequence)
    if first and expect_header is not None:
        return "empty: no file header"
    return None


def check_chain(
    path: str | os.PathLike[str], *, anchor: str | None = None, since_file: int = 0
) -> ChainCheck:
    """Verifies an audit log whole: every kept file (archive, rotated, current), their
    headers in order with no file missing, the chain across them, and its end against the
    anchor beside the log.

    Args:
        path: the log (``audit.jsonl``).
        anchor: a head hash kept elsewhere (printed by an earlier verification): it must be
            a record of the chain, or the log was cut before it or rewritten.
        since_file: the oldest file that must be present (files before it were shipped
            elsewhere and deleted on purpose); its first record may continue any chain.

    Returns:
        the :class:`ChainCheck`.
    """
    path = Path(path)
    files = _chain_files(path)
    names = tuple(str(file) for file in files)
    if since_file < 0:
        raise ValueError(f"since_file: expected a file number >= 0, got {since_file}")
    state = _ChainState(GENESIS if since_file == 0 else None, 0 if since_file == 0 else None)
    beside = _read_anchor(path.with_name(f"{path.name}.anchor"))

    def failed(message: str) -> ChainCheck:
        return ChainCheck(False, state.records, state.previous or GENESIS, message, names)

    if not path.exists():
        return failed(f"{path}: no such audit log")
    expected = since_file
    kept, numbers = [], []
    for file in files:
        header = _first_record(file)
        if _is_header(header):
            numbers.append(header["file"])
        if since_file and _is_header(header) and header["file"] < since_file:
            continue  # shipped off on purpose: only files from since_file on are checked
        kept.append(file)
    if not kept:
        # A usage error, not a broken log: nothing was checked.
        held = f"files {min(numbers)} to {max(numbers)}" if numbers else "no numbered file"
        raise AuditLogError(
            f"since_file {since_file}: the log holds {held}, none from file {since_file} on; "
            "pass the number of the oldest file kept (0 when none was shipped elsewhere)"
        )
    head = beside.get("head") if beside else None
    for index, file in enumerate(kept):
        state.previous_file_records = state.file_records if index else None
        message = _verify_file(file, state, expect_header=expected, anchor=anchor, head=head)
        if message is not None:
            return failed(f"{file.name}: {message}")
        state.file = expected
        expected += 1
    notes = []
    if beside is None:
        return failed(
            f"{path.name}.anchor: missing or unreadable; without it records cut from the end "
            "cannot be detected"
        )
    if state.seen_head_at is None:
        return failed(
            f"{path.name}: ends at sequence {state.sequence} (head {(state.previous or '')[:16]}), "
            f"its anchor at sequence {beside.get('sequence')} (head "
            f"{str(beside.get('head'))[:16]}): records were cut from the end or rewritten"
        )
    head_file, head_records, head_sequence = state.seen_head_at
    if beside.get("file") != head_file or beside.get("sequence") != head_sequence + 1:
        return failed(
            f"{path.name}.anchor: names file {beside.get('file')} and sequence "
            f"{beside.get('sequence')}, its head is record {head_sequence} of file "
            f"{head_file}: the anchor was edited, or files were removed or renamed"
        )
    if head_records < state.records:
        # A process stopped between a write and the anchor's update (a rotation included).
        notes.append(
            f"{state.records - head_records} records after the anchor (written when the "
            "process stopped before updating it)"
        )
    if anchor is not None and not state.seen_anchor:
        return failed(
            f"anchor {anchor[:16]}... is not a record of this log: it was cut before that "
            "record or rewritten"
        )
    return ChainCheck(True, state.records, state.previous or GENESIS, None, names, tuple(notes))
