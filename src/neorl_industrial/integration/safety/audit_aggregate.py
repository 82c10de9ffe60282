"""Folding an audit log's overrides into aggregate records: one aggregation window per key,
policy version, violated constraints and shield flags, and each key's rate of full records
(a token bucket)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np

from neorl_industrial.integration.safety.audit_records import FLAGS

#: Open aggregation groups kept at most; past it the oldest is written out early.
MAX_GROUPS = 4096

log = logging.getLogger("neorl_industrial.audit")


@dataclasses.dataclass
class Group:
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
class Bucket:
    tokens: float
    stamp: float
    warned: float = -math.inf


def aggregate_entry(group: Group) -> dict[str, Any]:
    """The ``aggregate`` record of a closed window (without the chain's fields)."""
    return {
        "kind": "aggregate",
        "key": group.key,
        "violated": list(group.violated),
        "violated_after": None if group.violated_after is None else list(group.violated_after),
        **dict(zip(FLAGS, group.flags, strict=True)),
        "count": group.count,
        "rate_limited": group.rate_limited,
        "first_time": group.first_time,
        "last_time": group.last_time,
        "first_request_id": group.first_request_id,
        "last_request_id": group.last_request_id,
        "rows_sha256": group.digest.hexdigest(),
        "detailed": group.detailed,
    }


class Aggregation:
    """The open aggregation windows of one log and each key's rate of full records; the
    log's lock guards every call.

    Args:
        path: the log (named in warnings).
        window_s: seconds a window stays open.
        key_rate: full records per key per second (0: no limit); the burst is ten
            seconds' worth (at least one).
        stats: the log's counts, where ``folded_rows`` and ``rate_limited_rows`` are kept.
    """

    def __init__(self, path: Path, window_s: float, key_rate: float, stats: dict[str, int]):
        self.path = path
        self.window_s = window_s
        self.key_rate = key_rate
        self.burst = max(1.0, 10.0 * key_rate)
        self.groups: dict[tuple[Any, ...], Group] = {}
        self.buckets: dict[str | None, Bucket] = {}
        self._stats = stats

    def take_token(self, key: str | None, now: float) -> bool:
        """Takes one full record of ``key``'s rate (always granted without a rate)."""
        if self.key_rate <= 0:
            return True
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = Bucket(self.burst, now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.stamp) * self.key_rate)
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

    def make_room(self) -> Group | None:
        """Takes the oldest group out when :data:`MAX_GROUPS` are open (to be written out
        early); ``None`` when there is room."""
        if len(self.groups) < MAX_GROUPS:
            return None
        oldest = min(self.groups, key=lambda k: self.groups[k].opened)
        return self.groups.pop(oldest)

    def open(self, group_key: tuple[Any, ...], now: float, detailed: int | None) -> Group:
        """A new window for ``group_key`` (key, policy version, violated, violated after,
        flags) opened at ``now``; ``detailed``: the sequence of its full record."""
        key, version, violated, still, flags = group_key
        group = Group(now, key, version, violated, still, flags, detailed)
        self.groups[group_key] = group
        return group

    def fold(
        self, group: Group, request_id: str | None, block: np.ndarray, stamp: str, limited: bool
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

    def closed(self, now: float | None) -> list[tuple[Any, ...]]:
        """The keys of the windows closed at ``now`` (every one when ``now`` is None)."""
        return [
            key
            for key, group in self.groups.items()
            if now is None or now - group.opened >= self.window_s
        ]
