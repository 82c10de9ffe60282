"""The bridge's tick log (JSON Lines): a header saying what decided (the policy's version
and signature, the task, the map's digest, the mode), then one record per sampling tick
and one per event (a lost connection, a reconnection, a hand-back, missed ticks).

A tick record holds what the bridge read (the observation and the applied actions, i.e.
what the operators or the previous write set), what the policy proposed, what the shield
made of it (the action, whether it overrode the proposal, which constraints the proposal
broke, its flags), the faults of the tick and, in closed loop, what was written and the
server's answer. Numbers that are not finite are written as ``null``. The shadow report
(:mod:`.report`) reads it; a closed-loop log reads the same way.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["LOG_FORMAT", "TickLog", "TickLogError", "read_tick_log"]

LOG_FORMAT = "neorl_industrial.bridge_log"
LOG_VERSION = 1


class TickLogError(ValueError):
    """A tick log that cannot be written or read; the message names the file and line."""


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


def numbers(values: Any) -> list[float | None]:
    """``values`` as a JSON list, ``None`` where not finite."""
    return [
        float(x) if math.isfinite(x) else None
        for x in np.asarray(values, np.float64).reshape(-1).tolist()
    ]


class TickLog:
    """Appends records to ``path`` (created with its directory, mode 0600); one line per
    record, flushed (and with ``fsync`` synced) as written."""

    def __init__(
        self, path: str | os.PathLike[str], header: dict[str, Any], *, fsync: bool = False
    ):
        self.path = Path(path)
        self.fsync = fsync
        self.path.parent.mkdir(parents=True, exist_ok=True)
        existing = self.path.exists() and self.path.stat().st_size > 0
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as error:
            raise TickLogError(f"{self.path}: cannot be opened for writing: {error}") from None
        self._file = os.fdopen(fd, "a", encoding="utf-8")
        # A log continued by a later bridge gets a header of its own: the report reads
        # each stretch with the header before it.
        self.write(
            {
                "kind": "header",
                "format": LOG_FORMAT,
                "format_version": LOG_VERSION,
                "continues": existing,
                **header,
            }
        )

    def write(self, record: dict[str, Any]) -> None:
        record = {"time": now(), **record}
        line = json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"
        self._file.write(line)
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())

    def event(self, event: str, **details: Any) -> None:
        self.write({"kind": "event", "event": event, **details})

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> TickLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        handle = path.open(encoding="utf-8")
    except OSError as error:
        raise TickLogError(f"{path}: cannot be read: {error}") from None
    with handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                yield number, line


def read_tick_log(
    path: str | os.PathLike[str],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The headers and the other records of the log at ``path``, in order; each tick and
    event record gets ``header``: the index of the header it follows.

    Raises:
        TickLogError: for a file that is not a bridge log, a line that is not a JSON
            object, or a tick before any header, naming the line. A torn last line (the
            bridge killed mid-write) is left out.
    """
    path = Path(path)
    headers: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    lines = list(_lines(path))
    for position, (number, line) in enumerate(lines):
        try:
            record = json.loads(line)
        except ValueError:
            if position == len(lines) - 1 and not line.endswith("\n"):
                break  # torn last line
            raise TickLogError(f"{path}: line {number}: not valid JSON") from None
        if not isinstance(record, dict) or "kind" not in record:
            raise TickLogError(f"{path}: line {number}: not a bridge log record")
        if record["kind"] == "header":
            if record.get("format") != LOG_FORMAT:
                raise TickLogError(
                    f"{path}: line {number}: a header of format {record.get('format')!r}, "
                    f"expected {LOG_FORMAT!r} (is it a bridge log?)"
                )
            headers.append(record)
            continue
        if not headers:
            raise TickLogError(
                f"{path}: line {number}: a {record['kind']!r} record before any header "
                "(is it a bridge log?)"
            )
        record["header"] = len(headers) - 1
        records.append(record)
    if not headers:
        raise TickLogError(f"{path}: no header: empty, or not a bridge log")
    return headers, records
