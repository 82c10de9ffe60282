"""The bridge's loop: every sampling period, read the plant's observations and applied
actions, decide with the shielded policy and, in closed loop, write the action.

Faults are the normal case and none of them writes a value the shield did not decide:

* a reading that is not Good, stale, ahead of the clock or not a number (:func:`.opcua.
  judge`) makes the tick faulty: its action is the task's fallback, decided by the
  server's shield from the usable readings (``on_fault: fallback``), or the bridge stops
  writing for good and leaves the plant to the operators (``on_fault: hand_back``);
* a lost connection (a failed read or write) is logged, counted and followed by
  reconnection with exponential back-off (and jitter); the nodes are checked again
  before the next tick; with ``hand_back`` the bridge writes no more;
* a tick that passes without a decision (the loop overran, or the connection was down)
  is counted as missed; with ``hand_back`` it hands back;
* a write the server refuses (a bad status code per node) is logged, counted and
  audited; with ``hand_back`` it hands back;
* a value that is not finite or outside the task's action bounds is never written.

Every tick goes to the tick log (:mod:`.ticklog`); in closed loop every write (and every
override, as the policy server writes them) goes to the hash-chained audit log with the
policy version. Counters and gauges are Prometheus metrics (:mod:`.metrics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
import math
import random
import time
from pathlib import Path
from typing import Any

import numpy as np

from neorl_industrial.integration.plant_floor.errors import (
    NodeIdError,
    SecurityError,
    UnitMismatchError,
)
from neorl_industrial.integration.plant_floor.metrics import BridgeMetrics
from neorl_industrial.integration.plant_floor.opcua import PlantConnection, Security, judge
from neorl_industrial.integration.plant_floor.plan import BridgePlan
from neorl_industrial.integration.plant_floor.ticklog import TickLog, numbers

__all__ = ["Backoff", "BridgeSummary", "PlantBridge"]

log = logging.getLogger("neorl_industrial.bridge")

#: Errors that end the bridge rather than being retried: the configuration is wrong.
_FATAL = (SecurityError, NodeIdError, UnitMismatchError)


@dataclasses.dataclass
class Backoff:
    """Exponential back-off with jitter: ``initial``, doubling up to ``maximum`` seconds,
    each delay drawn within ``jitter`` of its value."""

    initial: float = 0.5
    maximum: float = 30.0
    jitter: float = 0.1
    attempt: int = 0

    def next(self) -> float:
        delay = min(self.maximum, self.initial * 2.0**self.attempt)
        self.attempt += 1
        return delay * (1.0 + random.uniform(-self.jitter, self.jitter))

    def reset(self) -> None:
        self.attempt = 0


@dataclasses.dataclass
class BridgeSummary:
    """What a run did."""

    ticks: int = 0
    decided: int = 0
    faulty: int = 0
    missed: int = 0
    disconnections: int = 0
    writes: int = 0
    refused_writes: int = 0
    blocked_writes: int = 0
    reconnects: int = 0
    handed_back: bool = False


def _fault_kind(reason: str) -> str:
    if reason.startswith("status"):
        return "bad_quality"
    if reason.startswith(("stale", "source timestamp", "no timestamp")):
        return "stale"
    return "not_a_number"


class PlantBridge:
    """Runs a :class:`~.plan.BridgePlan` against an OPC UA server.

    Args:
        plan: the checked map, task and policy.
        endpoint: ``opc.tcp://...``.
        log_path: the tick log (JSON Lines).
        security: certificates and credentials (from files).
        audit_path: the audit log of writes and overrides (closed loop; required there).
        metrics: where the counters go (default: a registry of its own).
        backoff: reconnection delays.
        request_timeout: seconds a read or write may take before the connection counts
            as lost (default: the sampling period, at least 1 s).
        fsync: sync the tick log after every record.
    """

    def __init__(
        self,
        plan: BridgePlan,
        endpoint: str,
        log_path: str | Path,
        *,
        security: Security | None = None,
        audit_path: str | Path | None = None,
        metrics: BridgeMetrics | None = None,
        backoff: Backoff | None = None,
        request_timeout: float | None = None,
        fsync: bool = False,
    ) -> None:
        self.plan = plan
        self.security = security or Security()
        self.security.check()
        self.connection = PlantConnection(endpoint, self.security)
        self.log_path = Path(log_path)
        if plan.closed_loop and audit_path is None:
            raise ValueError("closed loop: name the audit log of the writes (--audit-log)")
        self.audit_path = None if audit_path is None else Path(audit_path)
        self.metrics = metrics or BridgeMetrics(plan.loaded.names)
        self.backoff = backoff or Backoff()
        self.request_timeout = request_timeout or max(plan.period, 1.0)
        self.fsync = fsync
        self.summary = BridgeSummary()
        self._handed_back = False
        self._last_written: np.ndarray | None = None
        self._audit: Any = None
        self._log: TickLog | None = None
        bindings = plan.plant_map
        names_obs, names_act = plan.observation_names, plan.action_names
        self._read_ids = [bindings.observations[n].node for n in names_obs] + [
            bindings.actions[n].applied for n in names_act
        ]
        self._read_labels = [f"observations.{n}" for n in names_obs] + [
            f"actions.{n}.applied" for n in names_act
        ]
        self._write_ids = [bindings.actions[n].write for n in names_act]
        # The unit each binding states, in the order of the nodes read, then written.
        self._units = [bindings.observations[n].unit for n in names_obs] + [
            bindings.actions[n].unit for n in names_act
        ] * 2
        self._read_nodes: list[Any] = []
        self._write_nodes: list[Any] = []

    # ----- the run ----------------------------------------------------------------------
    async def run(
        self, stop: asyncio.Event | None = None, ticks: int | None = None
    ) -> BridgeSummary:
        """Runs until ``stop`` is set or ``ticks`` ticks have been decided or missed.

        Raises:
            SecurityError, NodeIdError, UnitMismatchError: on connecting, before the
                first tick (or after a reconnection, before the next): the server does not
                have a bound node, states other units, or requires other security.
        """
        stop = stop or asyncio.Event()
        plan = self.plan
        self._log = TickLog(self.log_path, plan.header(), fsync=self.fsync)
        loop = asyncio.get_running_loop()
        try:
            if plan.closed_loop:
                from neorl_industrial.integration.safety.audit import AuditLog

                self._audit = AuditLog(self.audit_path, policy_version=plan.loaded.version)
            self.metrics.closed_loop.set(1 if plan.closed_loop else 0)
            await self._connect(stop, first=True)
            next_time = loop.time()
            while not stop.is_set() and (ticks is None or self.summary.ticks < ticks):
                delay = next_time - loop.time()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                    if stop.is_set():
                        break
                self.summary.ticks += 1
                try:
                    await self._tick(self.summary.ticks)
                except _FATAL:
                    raise
                except (OSError, TimeoutError, ConnectionError) as error:
                    await self._lost(error, stop)
                except Exception as error:  # asyncua's UaError and its status errors
                    if not _is_ua_error(error):
                        raise
                    await self._lost(error, stop)
                next_time += plan.period
                late = loop.time() - next_time
                if late > 0:
                    missed = math.ceil(late / plan.period)
                    if ticks is not None:
                        missed = min(missed, max(ticks - self.summary.ticks, 0))
                    if missed:
                        self._missed(missed)
                    next_time += missed * plan.period
        finally:
            await self.connection.close()
            self.metrics.connected.set(0)
            if self._log is not None:
                self._log.event("stopped", summary=dataclasses.asdict(self.summary))
                self._log.close()
            if self._audit is not None:
                self._audit.close()
        return self.summary

    async def _connect(self, stop: asyncio.Event, first: bool = False) -> None:
        """Connects (retrying with back-off until ``stop``) and checks the nodes."""
        while not stop.is_set():
            try:
                await self.connection.connect()
                await self.connection.check_nodes(
                    list(zip(self._read_labels, self._read_ids, strict=True)),
                    [
                        (f"actions.{n}.write", node)
                        for n, node in zip(self.plan.action_names, self._write_ids, strict=True)
                    ],
                    self._units,
                )
            except _FATAL:
                await self.connection.close()
                raise
            except Exception as error:
                if not isinstance(error, OSError | TimeoutError | ConnectionError) and not (
                    _is_ua_error(error)
                ):
                    await self.connection.close()
                    raise
                await self.connection.close()
                delay = self.backoff.next()
                log.warning(
                    "cannot connect to %s (%s: %s); trying again in %.2f s",
                    self.connection.endpoint,
                    type(error).__name__,
                    error,
                    delay,
                )
                self._log.event(
                    "connect_failed", error=f"{type(error).__name__}: {error}", retry_in=delay
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                continue
            self._read_nodes = self.connection.nodes(self._read_ids)
            self._write_nodes = self.connection.nodes(self._write_ids)
            self.backoff.reset()
            self.metrics.connected.set(1)
            if not first:
                self.summary.reconnects += 1
                self.metrics.reconnects.inc()
            self._log.event(
                "connected" if first else "reconnected", endpoint=self.connection.endpoint
            )
            log.info(
                "%s %s", "connected to" if first else "reconnected to", self.connection.endpoint
            )
            return

    async def _lost(self, error: BaseException, stop: asyncio.Event) -> None:
        log.error(
            "connection to %s lost: %s: %s", self.connection.endpoint, type(error).__name__, error
        )
        self.metrics.connected.set(0)
        self.metrics.faults.labels("disconnected").inc()
        self.summary.disconnections += 1
        self._log.event(
            "disconnected", tick=self.summary.ticks, error=f"{type(error).__name__}: {error}"
        )
        self._fault_in_closed_loop("the connection was lost")
        await self.connection.close()
        await self._connect(stop)

    def _missed(self, count: int) -> None:
        self.summary.missed += count
        self.summary.ticks += count
        self.metrics.faults.labels("missed_tick").inc(count)
        log.warning("missed %d sampling tick(s) of %g s", count, self.plan.period)
        self._log.event("missed_ticks", count=count, tick=self.summary.ticks)
        self._fault_in_closed_loop(f"{count} sampling tick(s) missed")

    def _fault_in_closed_loop(self, reason: str) -> None:
        """With ``on_fault: hand_back``, a fault in closed loop ends the writing for good."""
        if (
            self.plan.closed_loop
            and self.plan.plant_map.on_fault == "hand_back"
            and not self._handed_back
        ):
            self._handed_back = True
            self.summary.handed_back = True
            self.metrics.handed_back.set(1)
            self.metrics.closed_loop.set(0)
            log.error("handed back to the operators: %s; the bridge writes no more", reason)
            self._log.event("handed_back", reason=reason, tick=self.summary.ticks)

    # ----- one tick ---------------------------------------------------------------------
    async def _tick(self, tick: int) -> None:
        plan = self.plan
        started = time.perf_counter()
        values = await asyncio.wait_for(
            self.connection.read(self._read_nodes), self.request_timeout
        )
        now = dt.datetime.now(dt.UTC)
        n_obs = len(plan.observation_names)
        readings = np.full(len(values), np.nan)
        faults: dict[str, str] = {}
        for i, (label, value) in enumerate(zip(self._read_labels, values, strict=True)):
            reason = judge(value, now, plan.stale_after, plan.plant_map.clock_skew)
            if reason is None:
                readings[i] = float(value.Value.Value)
            else:
                faults[label] = reason
        observation, applied = readings[:n_obs], readings[n_obs:]
        prev = applied.copy()
        if self._last_written is not None:
            # An applied value that cannot be read: the last one written stands in.
            unknown = ~np.isfinite(prev)
            prev[unknown] = self._last_written[unknown]
        record: dict[str, Any] = {
            "kind": "tick",
            "tick": tick,
            "observation": numbers(observation),
            "applied": numbers(applied),
        }
        if faults:
            for reason in faults.values():
                self.metrics.faults.labels(_fault_kind(reason)).inc()
            self.metrics.ticks.labels("fault").inc()
            self.metrics.fallbacks.inc()
            self.summary.faulty += 1
            action = plan.fallback(observation, prev)
            log.warning("tick %d: %s", tick, "; ".join(f"{k}: {v}" for k, v in faults.items()))
            record.update(
                faults=faults,
                proposed=numbers(np.full(len(plan.action_names), np.nan)),
                action=numbers(action),
                overridden=True,
                fallback=True,
                violated=[],
                flags={"fallback": True},
            )
            decision = None
            self._fault_in_closed_loop(f"tick {tick}: {next(iter(faults.values()))}")
        else:
            decision = plan.loaded.artifact.decide_rows(
                observation[None].astype(np.float32), prev[None].astype(np.float32)
            )
            self.summary.decided += 1
            self.metrics.ticks.labels("decided").inc()
            action = np.asarray(decision.action[0], np.float64)
            violated = list(decision.violated[0])
            flags = {
                name: bool(getattr(decision, name)[0])
                for name in (
                    "projected",
                    "fallback",
                    "invalid",
                    "infeasible",
                    "invalid_observation",
                    "out_of_distribution",
                    "incident",
                )
            }
            overridden = bool(decision.overridden[0])
            if overridden:
                for name in violated:
                    self.metrics.overrides.labels(name).inc()
            if flags["fallback"]:
                self.metrics.fallbacks.inc()
            record.update(
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
        record["written"] = False
        try:
            # A faulty tick with hand_back has handed back above: nothing is written.
            if plan.closed_loop and not self._handed_back:
                await self._write(tick, action, observation, decision, record)
        finally:  # a write cut by a lost connection is logged too
            record["handed_back"] = self._handed_back
            self._log.write(record)
        self.metrics.latency.observe(time.perf_counter() - started)
        self.metrics.last_tick.set(time.time())

    async def _write(
        self,
        tick: int,
        action: np.ndarray,
        observation: np.ndarray,
        decision: Any,
        record: dict[str, Any],
    ) -> None:
        plan = self.plan
        low, high = plan.action_low, plan.action_high
        safe = np.isfinite(action) & (action >= low) & (action <= high)
        if not safe.all():
            self.summary.blocked_writes += 1
            self.metrics.faults.labels("unsafe_value").inc()
            names = [n for n, ok in zip(plan.action_names, safe.tolist(), strict=True) if not ok]
            log.error("tick %d: not written: %s not finite or out of bounds", tick, names)
            record["blocked"] = names
            self._fault_in_closed_loop(f"tick {tick}: an unsafe value for {names}")
            return
        if decision is not None and bool(decision.overridden[0]):
            # The override, as the policy server writes it.
            self._audit.write_overrides(
                observation[None],
                decision.proposed,
                decision.action,
                decision,
                plan.loaded.names,
                [f"tick-{tick}"],
                policy_version=plan.loaded.version,
            )
        try:
            statuses = await asyncio.wait_for(
                self.connection.write(self._write_nodes, action.tolist()), self.request_timeout
            )
        except BaseException as error:
            # Sent or not: the server did not answer. Audited as unknown, then handled as
            # a lost connection.
            record["write_status"] = [f"unknown: {type(error).__name__}"] * len(plan.action_names)
            self._audit_write(tick, observation, action, record, {}, outcome="unknown")
            raise
        refused = {
            f"actions.{name}.write": status.name
            for name, status in zip(plan.action_names, statuses, strict=True)
            if not status.is_good()
        }
        record["written"] = not refused
        record["write_status"] = [status.name for status in statuses]
        self._audit_write(
            tick, observation, action, record, refused, outcome="refused" if refused else "written"
        )
        if refused:
            self.summary.refused_writes += 1
            self.metrics.writes.labels("refused").inc()
            self.metrics.faults.labels("write_refused").inc()
            log.error("tick %d: the server refused the write: %s", tick, refused)
            self._fault_in_closed_loop(f"tick {tick}: write refused ({refused})")
            return
        self.summary.writes += 1
        self.metrics.writes.labels("ok").inc()
        self._last_written = action.copy()

    def _audit_write(
        self,
        tick: int,
        observation: np.ndarray,
        action: np.ndarray,
        record: dict[str, Any],
        refused: dict[str, str],
        *,
        outcome: str,
    ) -> None:
        """One ``write`` record in the audit log: what was written where, from what, with
        the server's answer (``outcome``: written, refused, or unknown when the connection
        was lost during the write), under the policy version that decided."""
        audit = self._audit
        entry = {
            "kind": "write",
            "request_id": f"tick-{tick}",
            "endpoint": self.connection.endpoint,
            "nodes": list(self._write_ids),
            "observation": numbers(observation),
            "proposed": record["proposed"],
            "written": numbers(action),
            "outcome": outcome,
            "status": record["write_status"],
            "refused": refused,
            "overridden": bool(record["overridden"]),
            "fallback": bool(record["fallback"]),
            "violated": list(record["violated"]),
            "faults": dict(record["faults"]),
        }
        audit.append(entry, self.plan.loaded.version)


def _is_ua_error(error: BaseException) -> bool:
    from asyncua import ua

    return isinstance(error, ua.UaError)
