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

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from neorl_industrial.integration.safety.audit_aggregate import (
    Aggregation,
    Group,
    aggregate_entry,
)
from neorl_industrial.integration.safety.audit_chain import (
    ChainCheck,
    ChainState,
    check_chain,
    verify_file,
)
from neorl_industrial.integration.safety.audit_files import claim, release_claim
from neorl_industrial.integration.safety.audit_files import take_lock as _take_lock  # noqa: F401
from neorl_industrial.integration.safety.audit_records import (
    FLAGS,
    GENESIS,
    AuditLogError,
    ShieldOutcome,
    batch_rows,
    encode_vector,
    parse_json,
    row_classes,
    rows_digest_update,
    utc_now,
)
from neorl_industrial.integration.safety.audit_writer import ChainWriter, log
from neorl_industrial.integration.safety.monitor import host_report

__all__ = [
    "GENESIS",
    "AuditLog",
    "AuditLogError",
    "ChainCheck",
    "ShieldOutcome",
    "check_chain",
    "claim",
    "release_claim",
    "rows_digest_update",
]

_clock = time.monotonic  # windows and rates run on it (a test replaces it)


class _OverrideRows(NamedTuple):
    """The overridden rows of one report, ready to write: the batch flattened to rows,
    the rows' indices, each distinct (violated, violated_after, flags) once and each row's
    index into them, and each row's observation, proposed and applied action as one
    little-endian float64 block (what the aggregates' digest reads)."""

    observations: np.ndarray
    proposed: np.ndarray
    applied: np.ndarray
    request_ids: Sequence[str | None] | None
    rows: list[int]
    classes: list[tuple[Any, ...]]
    class_of: list[int]
    blocks: np.ndarray

    def full_entry(self, index: int, key: str | None) -> dict[str, Any]:
        """The ``override`` record of the ``index``-th overridden row, in full."""
        row = self.rows[index]
        violated, still, row_flags = self.classes[self.class_of[index]]
        return {
            "kind": "override",
            "key": key,
            "request_id": self.request_id(index),
            "observation": encode_vector(self.observations[row]),
            "proposed": encode_vector(self.proposed[row]),
            "applied": encode_vector(self.applied[row]),
            "violated": list(violated),
            "violated_after": None if still is None else list(still),
            **dict(zip(FLAGS, row_flags, strict=True)),
        }

    def request_id(self, index: int) -> str | None:
        """The request id of the ``index``-th overridden row (None without ids)."""
        return None if self.request_ids is None else self.request_ids[self.rows[index]]


def _override_rows(
    observations: Any,
    proposed: Any,
    applied: Any,
    report: Any,
    constraint_names: Sequence[str],
    request_ids: str | Sequence[str | None] | None,
) -> _OverrideRows:
    """The overridden rows of ``report`` (see :meth:`AuditLog.write_overrides`).

    Raises:
        ValueError: when the arguments do not line up with the report.
    """
    host = host_report(report, len(constraint_names))
    observations = batch_rows(observations, host.batch_shape, "observations")
    proposed = batch_rows(proposed, host.batch_shape, "proposed")
    applied = batch_rows(applied, host.batch_shape, "applied")
    if isinstance(request_ids, str):
        request_ids = [request_ids]
    if request_ids is not None and len(request_ids) != host.rows:
        raise ValueError(f"request_ids: {len(request_ids)} ids for {host.rows} rows")
    rows = np.flatnonzero(host.overridden)
    classes, class_of = row_classes(host, rows, np.asarray(constraint_names, dtype=object))
    blocks = np.concatenate([observations, proposed, applied], axis=1)[rows]
    blocks = np.ascontiguousarray(blocks, "<f8")
    return _OverrideRows(
        observations, proposed, applied, request_ids, rows.tolist(), classes, class_of, blocks
    )


class AuditLog(ChainWriter):
    """Appends override records to ``path`` (created with its directory if missing).

    Args:
        path: the JSON Lines file.
        window_s: seconds an aggregation window stays open (0: every override in full).
        key_rate: full records per key per second (0: no limit; needs ``window_s``).
        chain: ``policy_version`` and the file's ``fsync``, ``max_bytes`` and ``backups``,
            as :class:`ChainWriter` takes them.

    Attributes:
        recovered_bytes: bytes of a torn last line cut off when the log was opened.

    Raises:
        AuditLogError: when another process holds the log, or the existing file's last
            whole record is not valid.
        ValueError: for a rate limit without an aggregation window.
    """

    _COUNTS = (
        "records",
        "folded_rows",
        "rate_limited_rows",
        "aggregates",
        *ChainWriter._COUNTS[1:],
    )

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        window_s: float = 0.0,
        key_rate: float = 0.0,
        **chain: Any,
    ) -> None:
        self.window_s = float(window_s)
        self.key_rate = float(key_rate)
        if self.key_rate > 0 and self.window_s <= 0:
            raise ValueError(
                f"audit log {Path(path)}: a rate limit per key ({self.key_rate:g}/s) folds rows "
                "into aggregates, which needs an aggregation window (window_s > 0)"
            )
        super().__init__(path, **chain)
        self._aggregation = Aggregation(self.path, self.window_s, self.key_rate, self._stats)
        self._stop = threading.Event()
        self._flusher = None
        if self.window_s > 0:
            self._flusher = threading.Thread(
                target=self._flush_loop, name=f"audit-flush:{self.path.name}", daemon=True
            )
            self._flusher.start()

    def stats(self) -> dict[str, int]:
        """Counts since the log was opened: ``records`` written, ``folded_rows`` counted in
        aggregates (``rate_limited_rows`` of them past a key's rate), ``aggregates``,
        ``archived_files`` and ``archived_records`` moved to the archive, ``gaps`` found
        against the anchor, ``torn_bytes`` cut on opening, and the open ``groups``."""
        with self._lock:
            return {**self._stats, "groups": len(self._aggregation.groups)}

    # ----- overrides ------------------------------------------------------------------
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
        batch = _override_rows(
            observations, proposed, applied, report, constraint_names, request_ids
        )
        version = self.policy_version if policy_version is None else str(policy_version)
        stamp = utc_now()
        aggregation = self._aggregation
        with self._lock:
            now = _clock()
            if aggregation.groups:
                self._flush_groups(now)
            for index in range(len(batch.rows)):
                violated, still, row_flags = batch.classes[batch.class_of[index]]
                group_key = (key, version, violated, still, row_flags)
                group = aggregation.groups.get(group_key)
                limited = False
                if group is None:
                    if aggregation.take_token(key, now):
                        record = self._append(batch.full_entry(index, key), version)
                        if self.window_s > 0:
                            self._open_group(group_key, now, record["sequence"])
                        continue
                    limited = True
                    group = self._open_group(group_key, now, None)
                rid = batch.request_id(index)
                aggregation.fold(group, rid, batch.blocks[index], stamp, limited)
            if batch.rows:
                self._write_anchor()
        return len(batch.rows)

    def _open_group(self, group_key: tuple[Any, ...], now: float, detailed: int | None) -> Group:
        """Opens a window (writing the oldest out first when too many are open); the
        caller holds the lock."""
        oldest = self._aggregation.make_room()
        if oldest is not None:
            self._write_group(oldest)
        return self._aggregation.open(group_key, now, detailed)

    def _flush_groups(self, now: float | None = None) -> None:
        """Writes the aggregates of closed windows (every one when ``now`` is None); the
        caller holds the lock."""
        closed = self._aggregation.closed(now)
        for key in closed:
            self._write_group(self._aggregation.groups.pop(key))
        if closed:
            self._write_anchor()

    def _write_group(self, group: Group) -> None:
        if group.count == 0:
            return
        self._append(aggregate_entry(group), group.policy_version)
        self._stats["aggregates"] += 1

    def _flush_loop(self) -> None:
        period = min(self.window_s, 1.0) / 2
        while not self._stop.wait(period):
            with self._lock:
                if self._aggregation.groups and self._failed is None and not self._file.closed:
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
        outcome: ShieldOutcome | None = None,
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
            outcome: what the applied action still breaks and how the shield overrode
                (default: not known, no flag set).
            policy_version: the version that decided (default: the log's).
            key: who asked (an API key's fingerprint).

        Returns:
            The record as written.
        """
        outcome = outcome or ShieldOutcome()
        after = outcome.violated_after
        entry = {
            "kind": "override",
            "key": key,
            "request_id": request_id,
            "observation": encode_vector(observation),
            "proposed": encode_vector(proposed),
            "applied": encode_vector(applied),
            "violated": [str(name) for name in violated],
            "violated_after": None if after is None else [str(name) for name in after],
            **{name: bool(getattr(outcome, name)) for name in FLAGS},
        }
        return self.append(entry, policy_version)

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
                self._close_files()

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- reading --------------------------------------------------------------------
    @staticmethod
    def read(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
        """Every record of one file, in order (without checking the chain)."""
        with open(path, encoding="utf-8") as handle:
            return [parse_json(line) for line in handle if line.strip()]

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
        state = ChainState(previous_hash, 0 if previous_hash == GENESIS else None)
        message = verify_file(Path(path), state, expect_header=None)
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
