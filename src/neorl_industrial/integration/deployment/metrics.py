"""Prometheus metrics of the policy server (prometheus-client, one registry per app)."""

from __future__ import annotations

from typing import Any

import numpy as np
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from neorl_industrial.wrappers.agents.artifact import STATUS_BITS

__all__ = [
    "CUT_BODY_TIMEOUT",
    "CUT_HEADER_TIMEOUT",
    "CUT_REASONS",
    "CUT_SHED",
    "UNAVAILABLE_CONNECTION_LIMIT",
    "UNAVAILABLE_LOADING",
    "UNAVAILABLE_REASONS",
    "UNAVAILABLE_SHUTTING_DOWN",
    "ServerMetrics",
]

# Why the server closed a connection (the ``reason`` of ``neorl_connections_cut_total``).
CUT_HEADER_TIMEOUT = "header_timeout"  # request line and headers not in time
CUT_BODY_TIMEOUT = "body_timeout"  # body not in time, or slower than the minimum rate
CUT_SHED = "shed"  # closed to make room for a new connection at the cap
CUT_REASONS = (CUT_HEADER_TIMEOUT, CUT_BODY_TIMEOUT, CUT_SHED)
# Why the server answered 503 (the ``reason`` of ``neorl_unavailable_total``).
UNAVAILABLE_CONNECTION_LIMIT = "connection_limit"  # every connection answering a request
UNAVAILABLE_LOADING = "loading"  # no policy compiled yet
UNAVAILABLE_SHUTTING_DOWN = "shutting_down"
UNAVAILABLE_REASONS = (UNAVAILABLE_CONNECTION_LIMIT, UNAVAILABLE_LOADING, UNAVAILABLE_SHUTTING_DOWN)

# Latency buckets from 0.25 ms to 2.5 s: a shielded action takes well under a millisecond
# of compute, so the interesting part of the distribution is at the low end.
_LATENCY = (0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256,
            0.512, 1.024, 2.5)  # fmt: skip
_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_ROUTES = {"/v1/act", "/v1/act/batch", "/v1/policy", "/v1/admin/reload", "/healthz", "/readyz",
           "/metrics"}  # fmt: skip


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "neorl_requests", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.latency = Histogram(
            "neorl_request_seconds", "request latency by route", ["route"], buckets=_LATENCY,
            registry=r,
        )  # fmt: skip
        self.batch_rows = Histogram(
            "neorl_batch_rows", "rows per compiled policy call (micro-batches)", buckets=_ROWS,
            registry=r,
        )  # fmt: skip
        self.decided = Counter("neorl_decisions", "actions decided", registry=r)
        self.flags = Counter(
            "neorl_shield", "shield outcomes by kind (overridden, projected, fallback, invalid, "
            "infeasible)", ["kind"], registry=r,
        )  # fmt: skip
        self.violations = Counter(
            "neorl_overrides_by_constraint",
            "proposed actions that broke a hard constraint (and were overridden), per constraint",
            ["constraint"],
            registry=r,
        )
        self.policy = Gauge(
            "neorl_policy_info",
            "the served policy (value 1); source: its models:/ URI or directory",
            ["version", "source"],
            registry=r,
        )
        self.cut = Counter(
            "neorl_connections_cut",
            "connections the server closed, by reason (header_timeout, body_timeout: a slow "
            "client; shed: closed to make room at the connection cap)",
            ["reason"],
            registry=r,
        )
        self.unavailable_answers = Counter(
            "neorl_unavailable",
            "503 answers by reason (connection_limit, loading, shutting_down)",
            ["reason"],
            registry=r,
        )
        self._children: dict[tuple[str, int], tuple[Any, Any]] = {}
        # Every reason is exported from the start (at 0), so an alert on a rate has a series.
        self._cut = {reason: self.cut.labels(reason) for reason in CUT_REASONS}
        self._unavailable = {
            reason: self.unavailable_answers.labels(reason) for reason in UNAVAILABLE_REASONS
        }

    def connection_cut(self, reason: str) -> None:
        self._cut[reason].inc()

    def unavailable(self, reason: str) -> None:
        self._unavailable[reason].inc()

    # Requests that arrived at an act route and have not reached the batcher yet (read
    # and changed on the event loop only).
    arriving = 0
    # Requests read in full and not answered yet, on any route, as ``serve``'s protocol
    # counts them (None: no such protocol, e.g. an app in a test client).
    requests_in: int | None = None

    def arrived(self, scope: dict) -> None:
        scope.setdefault("state", {})["neorl.arriving"] = True
        self.arriving += 1

    def submitted(self, scope: dict) -> None:
        state = scope.get("state") or {}
        if state.get("neorl.arriving"):
            state["neorl.arriving"] = False
            self.arriving -= 1

    def request(self, path: str, status: int, seconds: float) -> None:
        route = path if path in _ROUTES else "other"
        # The labelled children, looked up once per route and status (a bounded set: a
        # client's own paths all count as "other"), not on every request.
        children = self._children.get((route, status))
        if children is None:
            children = (self.requests.labels(route, str(status)), self.latency.labels(route))
            self._children[route, status] = children
        children[0].inc()
        children[1].observe(seconds)

    def decisions(self, decision: Any) -> None:
        status = decision.status
        self.decided.inc(status.size)
        if status.any():  # every flag is a bit of the status: none set, nothing to count
            for kind in STATUS_BITS:
                count = int(np.count_nonzero(getattr(decision, kind)))
                if count:
                    self.flags.labels(kind).inc(count)
        mask = decision.violated_mask
        if mask.any():
            counts = mask.reshape(-1, mask.shape[-1]).sum(axis=0)
            for name, count in zip(decision.constraint_names, counts.tolist(), strict=True):
                if count:
                    self.violations.labels(name).inc(count)

    def policy_loaded(self, version: str, source: str) -> None:
        # /metrics is served without auth: a registry URI names the model, a directory is
        # only said to be one (its path stays behind the act key, at /v1/policy).
        kind = source if source.startswith("models:/") else "directory"
        self.policy.clear()
        self.policy.labels(version, kind).set(1)

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
