"""The hash chain an audit log is written as: appending records to ``audit.jsonl``,
rotating it by size into numbered files and the archive, the anchor and the writer lock
beside it, and picking the chain up again when the log is opened (a torn last line cut, a
log cut before its anchor marked with a ``gap`` record). What the records say is
:class:`~neorl_industrial.integration.safety.audit.AuditLog`'s."""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from neorl_industrial.integration.safety.audit_files import (
    count_lines,
    first_record,
    last_line,
    read_anchor,
    release_lock,
    take_over_claim,
)
from neorl_industrial.integration.safety.audit_records import (
    CHAIN_FIELDS,
    GENESIS,
    AuditLogError,
    is_header,
    parse_json,
    record_hash,
    utc_now,
)

#: The anchor is rewritten in place at a fixed length, so one ``pwrite`` replaces it.
ANCHOR_BYTES = 256

log = logging.getLogger("neorl_industrial.audit")


class ChainWriter:
    """Appends records to the hash chain at ``path`` (created with its directory if
    missing), holding its writer lock until :meth:`_close_files`.

    Args:
        path: the JSON Lines file.
        policy_version: written into records that are not given one.
        fsync: ``os.fsync`` after every write (durable across power loss; slower).
        max_bytes: rotate before a record would take the file past this size (0: never).
        backups: rotated files kept beside the log (``path.1`` newest .. ``path.<backups>``);
            older ones move to ``path.archive/``; with 0 the log never rotates.

    Attributes:
        recovered_bytes: bytes of a torn last line cut off when the log was opened.

    Raises:
        AuditLogError: when another process holds the log, or the existing file's last
            whole record is not valid.
    """

    #: The counts :attr:`_stats` holds, in the order they are reported.
    _COUNTS: tuple[str, ...] = (
        "records",
        "archived_files",
        "archived_records",
        "gaps",
        "torn_bytes",
    )

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
        self._stats = dict.fromkeys(self._COUNTS, 0)
        self._failed: str | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd = self._acquire()
        try:
            self._open_chain()
        except BaseException:
            self._release()
            raise

    # ----- names beside the log -------------------------------------------------------
    def _beside(self, suffix: str) -> Path:
        return self.path.with_name(f"{self.path.name}.{suffix}")

    def _rotated(self, index: int) -> Path:
        return self._beside(str(index))

    # ----- the lock -------------------------------------------------------------------
    def _acquire(self) -> int:
        return take_over_claim(self.path)

    def _release(self) -> None:
        release_lock(self._lock_fd)

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
                last = last_line(handle, size)[1] if size else None
            previous_file = first_record(self._rotated(1))
        self._sequence, self._last_hash = self._resume(last)
        self._size = self.path.stat().st_size
        header = first_record(self.path)
        if self._size == 0:
            number = 0
            if previous_file is not None and previous_file.get("kind") == "file":
                number = int(previous_file.get("file", -1)) + 1
            self._file_number, self._file_records = number, 0
            counted = count_lines(self._rotated(1)) if number else 0
            self._write_header(counted)
        else:
            self._file_number = int(header["file"]) if is_header(header) else 0
            self._file_records = count_lines(self.path)
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
            start, line = last_line(handle, size)
            try:
                whole = line.endswith(b"\n") and isinstance(parse_json(line), dict)
            except ValueError:
                whole = False
            if whole:
                return 0, line
            self._keep_torn(line, start)
            handle.truncate(start)
            previous = last_line(handle, start)[1] if start else None
            return size - start, previous

    def _keep_torn(self, data: bytes, offset: int) -> None:
        side = self._beside("torn")
        entry = {
            "time": utc_now(),
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
            record = parse_json(line)
            valid = record_hash(record) == record.get("hash")
            sequence = record.get("sequence")
        except (ValueError, AttributeError, RecursionError):
            valid, sequence = False, None
        if not valid or not isinstance(sequence, int):
            raise AuditLogError(f"{self.path}: the last record's hash does not match its content")
        return sequence + 1, record["hash"]

    def _reconcile_anchor(self) -> None:
        """Compares the anchor with the log's end; a log that ends before its anchor (or
        has records but no anchor) gets a ``gap`` record saying so, then a fresh anchor."""
        anchor = read_anchor(self._beside("anchor"))
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

    # ----- the chain's state ----------------------------------------------------------
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

    # ----- writing --------------------------------------------------------------------
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
        reserved = sorted(set(entry) & CHAIN_FIELDS)
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
            "timestamp": utc_now(),
            "policy_version": policy_version,
            **entry,
            "prev_hash": self._last_hash,
        }
        record["hash"] = record_hash(record)
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
        data = text.ljust(ANCHOR_BYTES - 1).encode() + b"\n"
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
        header = first_record(file)
        number = int(header["file"]) if is_header(header) else self._file_number - self.backups
        # The file after it says how many records it holds: no need to read it whole.
        after = first_record(self._rotated(self.backups - 1) if self.backups > 1 else self.path)
        records = int(after.get("previous_records", 0)) if is_header(after) else None
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

    def _close_files(self) -> None:
        """Closes the log and the anchor and releases the lock; the caller holds the lock."""
        self._file.close()
        os.close(self._anchor_fd)
        self._release()
