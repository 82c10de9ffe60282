"""What one tick of the bridge records: the tick log's record (what was read, what the
shield decided or the fallback that stood in, what was written) and the audit log's
``write`` record of a closed-loop write."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from neorl_industrial.integration.plant_floor.ticklog import numbers
from neorl_industrial.wrappers.agents.artifact import STATUS_BITS

#: The decision's flags a tick record holds: the shield's (``overridden`` has a field of
#: its own) and the guard's ``incident``.
TICK_FLAGS = (*(name for name in STATUS_BITS if name != "overridden"), "incident")


@dataclasses.dataclass
class Tick:
    """One tick as it goes: what was read (``prev``: the previous action the shield
    decides from), the faults found, what was decided and the tick log's record."""

    number: int
    observation: np.ndarray
    prev: np.ndarray
    faults: dict[str, str]
    record: dict[str, Any]
    action: np.ndarray | None = None
    decision: Any = None  # the shield's decision (None on a faulty tick)

    @classmethod
    def read(
        cls,
        number: int,
        observation: np.ndarray,
        applied: np.ndarray,
        prev: np.ndarray,
        faults: dict[str, str],
    ) -> Tick:
        """A tick whose record starts with what was read."""
        record: dict[str, Any] = {
            "kind": "tick",
            "tick": number,
            "observation": numbers(observation),
            "applied": numbers(applied),
        }
        if not np.array_equal(prev, applied, equal_nan=True):
            record["previous"] = numbers(prev)  # what the shield decided from
        return cls(number, observation, prev, faults, record)

    def fell_back(self, action: np.ndarray) -> None:
        """Records the fallback ``action`` of a faulty tick (no proposal)."""
        self.action = action
        self.record.update(
            faults=self.faults,
            proposed=numbers(np.full(len(action), np.nan)),
            action=numbers(action),
            overridden=True,
            fallback=True,
            violated=[],
            flags={"fallback": True},
        )

    def decided(self, decision: Any) -> tuple[list[str], dict[str, bool], bool]:
        """Records the shield's ``decision`` (of one row); its violated constraints, flags
        and whether it overrode the proposal."""
        action = np.asarray(decision.action[0], np.float64)
        violated = list(decision.violated[0])
        flags = {name: bool(getattr(decision, name)[0]) for name in TICK_FLAGS}
        overridden = bool(decision.overridden[0])
        self.record.update(
            faults={},
            proposed=numbers(decision.proposed[0]),
            action=numbers(action),
            overridden=overridden,
            fallback=flags["fallback"],
            violated=violated,
            violated_after=None
            if decision.violated_after is None
            else list(decision.violated_after[0]),
            flags=flags,
        )
        self.action, self.decision = action, decision
        return violated, flags, overridden

    def write_entry(
        self, endpoint: str, nodes: list[Any], refused: dict[str, str], outcome: str
    ) -> dict[str, Any]:
        """The audit log's ``write`` record: what was written where (``nodes``), from
        what, with the server's answer (``outcome``: written, refused, unknown when the
        connection was lost during the write, or withheld when nothing was written, and
        why)."""
        record = self.record
        return {
            "kind": "write",
            "request_id": f"tick-{self.number}",
            "endpoint": endpoint,
            "nodes": list(nodes),
            "observation": numbers(self.observation),
            "proposed": record["proposed"],
            "written": numbers(self.action),
            "outcome": outcome,
            "withheld": record.get("withheld"),
            "node_values": record.get("node_values"),
            "status": record["write_status"],
            "refused": refused,
            "overridden": bool(record["overridden"]),
            "fallback": bool(record["fallback"]),
            "violated": list(record["violated"]),
            "faults": dict(record["faults"]),
        }


def fault_kind(reason: str) -> str:
    """The metrics' label of a reading's fault, from the reason it was judged faulty."""
    if reason.startswith("status"):
        return "bad_quality"
    if reason.startswith(("stale", "source timestamp", "no timestamp")):
        return "stale"
    if reason.startswith("data type"):
        return "data_type"
    if reason.startswith("EngineeringUnits"):
        return "unit"
    return "not_a_number"
