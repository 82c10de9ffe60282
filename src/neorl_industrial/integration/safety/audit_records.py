"""The audit log's record format: the canonical JSON a record's SHA-256 is taken over, the
numbers and flags a record holds, and what every reader of the log's lines shares.

A record is a JSON object; its ``hash`` is the SHA-256 of the object without ``hash``,
serialised with sorted keys, no spaces and no NaN (non-finite numbers are written as the
strings ``"nan"``, ``"inf"`` and ``"-inf"``). ``prev_hash`` holds the previous record's
``hash`` (:data:`GENESIS` for the first).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

GENESIS = "0" * 64
#: The fields the chain sets on every record; an appended entry may not set them.
CHAIN_FIELDS = frozenset({"sequence", "timestamp", "policy_version", "prev_hash", "hash"})
#: The shield's flags an override record holds, in the order aggregation keys hold them.
FLAGS = (
    "projected",
    "fallback",
    "infeasible",
    "invalid",
    "invalid_observation",
    "out_of_distribution",
)


@dataclasses.dataclass(frozen=True)
class ShieldOutcome:
    """What the shield made of one overridden decision, beyond the constraints the
    proposal broke: the constraints the applied action still breaks and the shield's
    flags (:data:`FLAGS`).

    Attributes:
        violated_after: names of the hard constraints the applied action breaks
            (``None``: not known).
        projected: the override is a projection of the proposal.
        fallback: the override is the fallback.
        infeasible: no action kept every constraint.
        invalid: the proposal was NaN or infinite.
        invalid_observation: the observation left its physical bounds.
        out_of_distribution: the observation left the training data's range.
    """

    violated_after: Sequence[str] | None = None
    projected: bool = False
    fallback: bool = False
    infeasible: bool = False
    invalid: bool = False
    invalid_observation: bool = False
    out_of_distribution: bool = False


class AuditLogError(ValueError):
    """An audit log that cannot be written or continued; the message names the file."""


def encode_number(value: float) -> float | str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def encode_vector(values: Any) -> list[float | str]:
    return [encode_number(x) for x in np.asarray(values, np.float64).reshape(-1).tolist()]


def record_hash(record: dict[str, Any]) -> str:
    body = {key: value for key, value in record.items() if key != "hash"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def parse_json(line: bytes | str) -> Any:
    """``json.loads`` whose every failure is a ValueError: JSON nested deeper than the
    parser's recursion (an edited line) raises RecursionError, which no caller of a
    reader of untrusted lines expects."""
    try:
        return json.loads(line)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


def batch_rows(values: Any, batch_shape: tuple[int, ...], name: str) -> np.ndarray:
    """``values`` with leading axes ``batch_shape``, flattened to ``[rows, width]``."""
    array = np.asarray(values, np.float64)
    if array.shape[: len(batch_shape)] != batch_shape:
        raise ValueError(
            f"{name}: shape {array.shape} does not start with the report's {batch_shape}"
        )
    width = math.prod(array.shape[len(batch_shape) :])
    return array.reshape(math.prod(batch_shape), width)


def rows_digest_update(
    digest: Any, request_id: str | None, observation: Any, proposed: Any, applied: Any
) -> None:
    """Adds one row to an aggregate's ``rows_sha256``: the request id in UTF-8 and a NUL
    byte, then the observation, the proposed and the applied action as little-endian
    float64 — what anyone holding the rows can recompute."""
    digest.update((request_id or "").encode() + b"\0")
    for values in (observation, proposed, applied):
        digest.update(np.asarray(values, "<f8").tobytes())


def row_classes(
    host: Any, rows: np.ndarray, names: np.ndarray
) -> tuple[list[tuple[Any, ...]], list[int]]:
    """The distinct (violated, violated_after, flags) of ``rows`` and each row's index
    into them: rows share few patterns, so each is named once."""
    columns = [host.violated[rows]]
    after = host.violated_after
    if after is not None:
        columns.append(after[rows])
    columns.append(np.stack([getattr(host, name)[rows] for name in FLAGS], axis=-1))
    bits = np.concatenate(columns, axis=1)
    patterns, inverse = np.unique(bits, axis=0, return_inverse=True)
    width = host.violated.shape[1]
    classes = []
    for pattern in patterns:
        violated = tuple(names[pattern[:width]].tolist())
        still = None if after is None else tuple(names[pattern[width : 2 * width]].tolist())
        flags = tuple(bool(flag) for flag in pattern[-len(FLAGS) :])
        classes.append((violated, still, flags))
    return classes, inverse.reshape(-1).tolist()


def is_header(record: dict[str, Any] | None) -> bool:
    return (
        isinstance(record, dict)
        and record.get("kind") == "file"
        and isinstance(record.get("file"), int)
    )
