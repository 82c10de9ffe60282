"""The bridge's loop: every sampling period, read the plant's observations and applied
actions, decide with the shielded policy and, in closed loop, write the action.

Faults are the normal case and none of them writes a value the shield did not decide:

* a reading that is not Good, stale, ahead of the clock, not of its node's declared data
  type, not a number, or whose node's EngineeringUnits no longer state its binding's unit
  (:func:`.opcua.judge`, :func:`.opcua.judge_units`) makes the tick faulty: its action is
  the task's fallback, decided by the server's shield from the usable readings
  (``on_fault: fallback``), or the bridge stops writing for good and leaves the plant to
  the operators (``on_fault: hand_back``);
* a lost connection (a failed read or write) is logged, counted and followed by
  reconnection with exponential back-off (and jitter); the nodes are checked again
  before the next tick; with ``hand_back`` the bridge writes no more;
* a tick that passes without a decision (the loop overran, or the connection was down)
  is counted as missed; with ``hand_back`` it hands back;
* a write the server refuses (a bad status code per node) is logged, counted and
  audited; with ``hand_back`` it hands back;
* a value that is not finite or outside the task's action bounds is never written;
* an actuator never jumps: the previous action the shield decides from is the position
  the plant reports; where it cannot be read, the last value written since it was, or
  else the last position reported within ``stale_after``; where none of these is known
  (the first ticks with an unreadable position, say) the tick writes nothing and the
  plant's own control keeps the actuators (``withheld``: ``position_unknown``). Every
  write keeps each rate limit from every position the actuator may be at (the last one
  reported and the values written since), or none of the tick is written
  (``withheld``: ``rate_limit``).

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
from neorl_industrial.integration.plant_floor.opcua import (
    PlantConnection,
    Security,
    judge,
    judge_units,
)
from neorl_industrial.integration.plant_floor.plan import BridgePlan
from neorl_industrial.integration.plant_floor.positions import ActuatorPositions
from neorl_industrial.integration.plant_floor.tick import Tick, fault_kind
from neorl_industrial.integration.plant_floor.ticklog import TickLog, numbers
from neorl_industrial.wrappers.agents.readings import decision_inputs

__all__ = ["Backoff", "BridgeSummary", "PlantBridge", "Reconnection"]

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

    def __post_init__(self) -> None:
        for name, low, high in (("initial", 0.001, 600.0), ("maximum", 0.001, 3600.0)):
            value = getattr(self, name)
            if not (math.isfinite(value) and low <= value <= high):
                raise ValueError(
                    f"back-off {name}: {value!r} is outside the allowed range "
                    f"[{low:g}, {high:g}] seconds"
                )
        if self.maximum < self.initial:
            raise ValueError(
                f"back-off maximum {self.maximum:g} s is below its initial {self.initial:g} s"
            )
        if not (math.isfinite(self.jitter) and 0.0 <= self.jitter < 1.0):
            raise ValueError(f"back-off jitter: {self.jitter!r} is outside the range [0, 1)")

    def next(self) -> float:
        delay = min(self.maximum, self.initial * 2.0**self.attempt)
        self.attempt += 1
        return delay * (1.0 + random.uniform(-self.jitter, self.jitter))

    def reset(self) -> None:
        self.attempt = 0


@dataclasses.dataclass(frozen=True)
class Reconnection:
    """When the bridge counts its connection as lost, and how it connects again.

    Attributes:
        request_timeout: seconds a read or write may take before the connection counts
            as lost (default: the map's ``request_timeout``, else the sampling period,
            at least 1 s).
        backoff: the delays between attempts to reconnect.
    """

    request_timeout: float | None = None
    backoff: Backoff = dataclasses.field(default_factory=Backoff)


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
    withheld_writes: int = 0
    reconnects: int = 0
    handed_back: bool = False


class PlantBridge:
    """Runs a :class:`~.plan.BridgePlan` against an OPC UA server.

    Args:
        plan: the checked map, task and policy.
        endpoint: ``opc.tcp://...``.
        log_path: the tick log (JSON Lines).
        security: certificates and credentials (from files).
        audit_path: the audit log of writes and overrides (closed loop; required there).
        metrics: where the counters go (default: a registry of its own).
        reconnection: when the connection counts as lost and the delays before
            reconnecting (default: the map's timeout, :class:`Backoff`'s delays).
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
        reconnection: Reconnection | None = None,
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
        reconnection = reconnection or Reconnection()
        self.backoff = reconnection.backoff
        request_timeout = reconnection.request_timeout
        if request_timeout is None:
            request_timeout = plan.plant_map.timeout(plan.period)
        if not (math.isfinite(request_timeout) and 0.0 < request_timeout <= 600.0):
            raise ValueError(
                f"request_timeout: {request_timeout!r} is outside the allowed range (0, 600] s"
            )
        self.request_timeout = float(request_timeout)
        self.fsync = fsync
        self.summary = BridgeSummary()
        self._handed_back = False
        self._positions = ActuatorPositions(plan)
        self._audit: Any = None
        self._log: TickLog | None = None
        bindings = plan.plant_map
        names_obs, names_act = plan.read_names, plan.action_names
        self._read_ids = [bindings.observations[n].node for n in names_obs] + [
            bindings.actions[n].applied for n in names_act
        ]
        self._read_labels = [f"observations.{n}" for n in names_obs] + [
            f"actions.{n}.applied" for n in names_act
        ]
        self._write_ids = [bindings.actions[n].write for n in names_act]
        # Node unit into task unit, per node read (observations, then applied actions),
        # and per action (their inverse converts what is written).
        same = _Same()
        self._action_units = [plan.converter(f"actions.{n}") or same for n in names_act]
        self._converters = [
            plan.converter(f"observations.{n}") or same for n in names_obs
        ] + self._action_units
        # The unit each binding states, in the order of the nodes read, then written.
        self._units = [bindings.observations[n].unit for n in names_obs] + [
            bindings.actions[n].unit for n in names_act
        ] * 2
        self._read_nodes: list[Any] = []
        self._write_nodes: list[Any] = []
        #: The rows read on the last ``history - 1`` ticks, newest first (None: none yet,
        #: or the history broke: a faulty, missed or disconnected tick).
        self._earlier: np.ndarray | None = None

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
        self._earlier = None
        await self.connection.close()
        await self._connect(stop)

    def _missed(self, count: int) -> None:
        self._earlier = None
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
        """Reads, decides (the shielded policy, or the fallback on a faulty tick) and, in
        closed loop, writes what the checks let through; the tick log gets its record."""
        started = time.perf_counter()
        state = await self._read(tick)
        self._decide(state)
        await self._act(state)
        self.metrics.latency.observe(time.perf_counter() - started)
        self.metrics.last_tick.set(time.time())

    async def _read(self, tick: int) -> Tick:
        """Reads the observations and the applied actions and judges each reading; the
        tick's record starts with what was read."""
        values, units = await asyncio.wait_for(
            self.connection.read_with_units(self._read_nodes), self.request_timeout
        )
        read_at = asyncio.get_running_loop().time()
        readings, faults = self._judge_readings(values, units)
        n_obs = len(self.plan.read_names)
        row, applied = readings[:n_obs], readings[n_obs:]
        prev = self._previous(applied, read_at)
        return Tick.read(tick, self._stacked(row, faults), applied, prev, faults)

    def _stacked(self, row: np.ndarray, faults: dict[str, str]) -> np.ndarray:
        """The observation of the tick's ``row``: with a history, the row and the rows of
        the ticks before it, newest first. Rows one sampling period apart only: after a
        faulty, missed or disconnected tick the history starts again from the row read,
        repeated, as an imported log starts an episode."""
        history = self.plan.history
        if history == 1:
            return row
        earlier = self._earlier
        if earlier is None:
            earlier = np.repeat(row[None], history - 1, axis=0)
        rows = np.concatenate([row[None], earlier])
        self._earlier = None if faults else rows[:-1]
        return rows.reshape(-1)

    def _judge_readings(
        self, values: list[Any], units: list[Any]
    ) -> tuple[np.ndarray, dict[str, str]]:
        """Each reading in the task's unit (NaN where it is faulty) and why each faulty
        one is, by the label of its node."""
        plan = self.plan
        now = dt.datetime.now(dt.UTC)
        readings = np.full(len(values), np.nan)
        faults: dict[str, str] = {}
        types = self.connection.read_types
        for i, (label, value) in enumerate(zip(self._read_labels, values, strict=True)):
            reason = judge(value, now, plan.stale_after, plan.plant_map.clock_skew, types[i])
            if reason is None and units[i] is not None:
                reason = self._judge_unit(units[i], self.connection.units[i])
            if reason is None:
                readings[i] = self._converters[i](float(value.Value.Value))
            else:
                faults[label] = reason
        return readings, faults

    def _decide(self, state: Tick) -> None:
        """The shielded policy's action, or the task's fallback on a faulty tick."""
        plan = self.plan
        rows = None
        if not state.faults:
            # As every entry point reads them: subnormals as zero, a reading that is no
            # finite float32 (a converted value beyond its range) a fault; a NaN position
            # is unknown (the write is withheld later).
            try:
                rows = decision_inputs(
                    state.observation,
                    state.prev,
                    plan.observation_names,
                    plan.action_names,
                )
            except ValueError as error:
                state.faults["observation"] = f"not a finite number: {error}"
        if state.faults:
            self._fall_back(state)
        else:
            self._decided(state, rows)

    def _fall_back(self, state: Tick) -> None:
        """A faulty tick: counted, logged, and its action the task's fallback."""
        plan, faults = self.plan, state.faults
        for reason in faults.values():
            self.metrics.faults.labels(fault_kind(reason)).inc()
        self.metrics.ticks.labels("fault").inc()
        self.metrics.fallbacks.inc()
        self.summary.faulty += 1
        action = plan.fallback(state.observation, state.prev)
        log.warning("tick %d: %s", state.number, "; ".join(f"{k}: {v}" for k, v in faults.items()))
        state.fell_back(action)
        self._fault_in_closed_loop(f"tick {state.number}: {next(iter(faults.values()))}")

    def _decided(self, state: Tick, rows: Any) -> None:
        """The shielded policy's decision on the tick's readings (``rows``: the decision's
        inputs), counted and recorded."""
        decision = self.plan.loaded.artifact.decide_rows(rows[0], rows[1])
        self.summary.decided += 1
        self.metrics.ticks.labels("decided").inc()
        violated, flags, overridden = state.decided(decision)
        if overridden:
            for name in violated:
                self.metrics.overrides.labels(name).inc()
        if flags["fallback"]:
            self.metrics.fallbacks.inc()

    async def _act(self, state: Tick) -> None:
        """In closed loop, writes the action the checks let through (or withholds it);
        the tick's record goes to the tick log either way."""
        record = state.record
        record["written"] = False
        withheld = self._withhold(state.action, state.prev)
        if withheld is not None:
            record["withheld"] = withheld  # in shadow mode too: what closed loop would do
        try:
            # A faulty tick with hand_back has handed back above: nothing is written.
            if self.plan.closed_loop and not self._handed_back and self._safe(state):
                if withheld is not None:
                    self._withheld(state, withheld)
                else:
                    await self._write(state)
        finally:  # a write cut by a lost connection is logged too
            record["handed_back"] = self._handed_back
            self._log.write(record)

    def _judge_unit(self, value: Any, unit: str | None) -> str | None:
        """Why a node's EngineeringUnits, read with its value, are not its binding's unit
        (``None``: they are)."""
        status = value.StatusCode
        if status is not None and not status.is_good():
            return f"EngineeringUnits cannot be read: status {status.name}"
        return judge_units(value.Value.Value if value.Value is not None else None, unit)

    def _previous(self, applied: np.ndarray, read_at: float) -> np.ndarray:
        """The previous action the shield decides from (:meth:`.ActuatorPositions.previous`)."""
        return self._positions.previous(applied, read_at)

    def _withhold(self, action: np.ndarray, prev: np.ndarray) -> dict[str, Any] | None:
        """Why the tick's action must not be written (:meth:`.ActuatorPositions.withhold`;
        ``None``: it may be)."""
        return self._positions.withhold(action, prev)

    def _sent(self, action: np.ndarray) -> None:
        """The actuators may now be anywhere between where they were and ``action``."""
        self._positions.sent(action)

    def _withheld(self, state: Tick, withheld: dict[str, Any]) -> None:
        """A closed-loop tick that writes nothing: logged, counted and audited; a value
        beyond a rate limit is a fault (the shield keeps them), an unknown position not."""
        reason = withheld["reason"]
        self.summary.withheld_writes += 1
        self.metrics.withheld.labels(reason).inc()
        log.warning(
            "tick %d: not written (%s: %s): %s",
            state.number,
            reason,
            ", ".join(withheld["actions"]),
            withheld["detail"],
        )
        state.record["write_status"] = []
        self._audit_write(state, {}, outcome="withheld")
        if reason == "rate_limit":
            self._fault_in_closed_loop(f"tick {state.number}: {withheld['detail']}")

    def _safe(self, state: Tick) -> bool:
        """False, logged and counted, for an action not finite or outside the task's
        bounds: never written."""
        plan, action = self.plan, state.action
        low, high = plan.action_low, plan.action_high
        safe = np.isfinite(action) & (action >= low) & (action <= high)
        if safe.all():
            return True
        self.summary.blocked_writes += 1
        self.metrics.faults.labels("unsafe_value").inc()
        names = [n for n, ok in zip(plan.action_names, safe.tolist(), strict=True) if not ok]
        log.error("tick %d: not written: %s not finite or out of bounds", state.number, names)
        state.record["blocked"] = names
        self._fault_in_closed_loop(f"tick {state.number}: an unsafe value for {names}")
        return False

    async def _write(self, state: Tick) -> None:
        """Writes the tick's action (the override audited first, as the policy server
        writes it) and audits the write with the server's answer."""
        plan, tick, action, record = self.plan, state.number, state.action, state.record
        decision = state.decision
        if decision is not None and bool(decision.overridden[0]):
            self._audit.write_overrides(
                state.observation[None],
                decision.proposed,
                decision.action,
                decision,
                plan.loaded.names,
                [f"tick-{tick}"],
                policy_version=plan.loaded.version,
            )
        values = [
            convert.inverse(float(value))
            for convert, value in zip(self._action_units, action, strict=True)
        ]
        try:
            statuses = await asyncio.wait_for(
                self.connection.write(self._write_nodes, values), self.request_timeout
            )
        except BaseException as error:
            # Sent or not: the server did not answer. Audited as unknown, then handled as
            # a lost connection; the actuators may be on their way to it.
            self._sent(action)
            record["write_status"] = [f"unknown: {type(error).__name__}"] * len(plan.action_names)
            self._audit_write(state, {}, outcome="unknown")
            raise
        refused = {
            f"actions.{name}.write": status.name
            for name, status in zip(plan.action_names, statuses, strict=True)
            if not status.is_good()
        }
        record["written"] = not refused
        record["write_status"] = [status.name for status in statuses]
        if values != action.tolist():
            record["node_values"] = numbers(np.asarray(values))  # in the nodes' units
        if not refused:
            self._sent(action)
        self._audit_write(state, refused, outcome="refused" if refused else "written")
        if refused:
            self.summary.refused_writes += 1
            self.metrics.writes.labels("refused").inc()
            self.metrics.faults.labels("write_refused").inc()
            log.error("tick %d: the server refused the write: %s", tick, refused)
            self._fault_in_closed_loop(f"tick {tick}: write refused ({refused})")
            return
        self.summary.writes += 1
        self.metrics.writes.labels("ok").inc()

    def _audit_write(self, state: Tick, refused: dict[str, str], *, outcome: str) -> None:
        """One ``write`` record in the audit log: what was written where, from what, with
        the server's answer (``outcome``: written, refused, unknown when the connection
        was lost during the write, or withheld when the bridge wrote nothing, and why),
        under the policy version that decided."""
        entry = state.write_entry(self.connection.endpoint, self._write_ids, refused, outcome)
        self._audit.append(entry, self.plan.loaded.version)


class _Same:
    """The conversion of a node in the task's unit."""

    def __call__(self, value: float) -> float:
        return value

    def inverse(self, value: float) -> float:
        return value


def _is_ua_error(error: BaseException) -> bool:
    from asyncua import ua

    return isinstance(error, ua.UaError)
