"""Prometheus metrics of the bridge (prometheus-client, one registry per bridge), served
on their own port (``--metrics-port``) at ``/metrics``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = ["FAULT_KINDS", "WITHHELD_REASONS", "BridgeMetrics"]

#: The ``kind`` of ``neorl_bridge_faults_total``.
FAULT_KINDS = (
    "bad_quality",  # an OPC UA status code that is not Good
    "stale",  # a source timestamp older than stale_after (or ahead of the clock)
    "not_a_number",  # a value that is not a finite number
    "data_type",  # a value of another data type than its node declares
    "unit",  # a node whose EngineeringUnits no longer state its binding's unit
    "disconnected",  # the connection was lost
    "missed_tick",  # a sampling tick passed without a decision
    "write_refused",  # the server refused a write
    "unsafe_value",  # a value the bridge would not write (not finite, out of bounds)
)
#: The ``reason`` of ``neorl_bridge_withheld_writes_total``.
WITHHELD_REASONS = (
    "position_unknown",  # an actuator whose position is not known: nothing to move from
    "rate_limit",  # a value beyond a rate limit from where the actuator may be
)
_LATENCY = (
    0.0005,
    0.001,
    0.002,
    0.004,
    0.008,
    0.016,
    0.032,
    0.064,
    0.128,
    0.256,
    0.512,
    1.024,
    2.5,
    5.0,
)


class BridgeMetrics:
    """The bridge's counters and gauges; :meth:`serve` exposes them over HTTP."""

    def __init__(self, constraint_names: Sequence[str]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ticks = Counter(
            "neorl_bridge_ticks",
            "sampling ticks by outcome (decided, fault)",
            ["outcome"],
            registry=r,
        )
        self.faults = Counter("neorl_bridge_faults", "faults by kind", ["kind"], registry=r)
        self.writes = Counter(
            "neorl_bridge_writes", "action writes by result (ok, refused)", ["result"], registry=r
        )
        self.withheld = Counter(
            "neorl_bridge_withheld_writes",
            "closed-loop ticks that wrote nothing (the plant's own control keeps the "
            "actuators), by reason",
            ["reason"],
            registry=r,
        )
        self.overrides = Counter(
            "neorl_bridge_overrides",
            "decisions the shield changed, by the constraint the proposal broke",
            ["constraint"],
            registry=r,
        )
        self.fallbacks = Counter(
            "neorl_bridge_fallbacks", "decisions that are the task's fallback", registry=r
        )
        self.reconnects = Counter(
            "neorl_bridge_reconnects", "connections made again after a loss", registry=r
        )
        self.connected = Gauge("neorl_bridge_connected", "1 while connected", registry=r)
        self.closed_loop = Gauge(
            "neorl_bridge_closed_loop", "1 while the bridge writes the plant's actions", registry=r
        )
        self.handed_back = Gauge(
            "neorl_bridge_handed_back",
            "1 once the bridge stopped writing after a fault",
            registry=r,
        )
        self.latency = Histogram(
            "neorl_bridge_tick_seconds",
            "read, decide and write, per tick",
            buckets=_LATENCY,
            registry=r,
        )
        self.last_tick = Gauge(
            "neorl_bridge_last_tick_timestamp_seconds",
            "when the last tick was decided",
            registry=r,
        )
        for kind in FAULT_KINDS:
            self.faults.labels(kind)
        for name in constraint_names:
            self.overrides.labels(name)
        for result in ("ok", "refused"):
            self.writes.labels(result)
        for reason in WITHHELD_REASONS:
            self.withheld.labels(reason)
        self._server: Any = None

    def serve(self, port: int, address: str = "127.0.0.1") -> None:
        """Serves ``/metrics`` on ``address:port`` from a daemon thread."""
        self._server = start_http_server(port, address, registry=self.registry)

    def close(self) -> None:
        if self._server is not None:
            server, _thread = self._server
            server.shutdown()
            self._server = None

    def value(self, name: str, **labels: str) -> float:
        """A sample's value (0 when absent), e.g. ``value("neorl_bridge_faults_total",
        kind="stale")``."""
        found = self.registry.get_sample_value(name, labels or None)
        return 0.0 if found is None else float(found)
