"""What stands between a client and the routes: the uvicorn protocol that cuts slow
clients and keeps the connection cap from locking anyone out, and the ASGI middleware that
enforces the body size limit and records every request in the metrics.

The middleware is plain ASGI rather than Starlette's ``BaseHTTPMiddleware``: no task and
no stream per request, and a chunked body is counted as it arrives, so an oversized one is
refused before it is all read.

The protocol (:func:`guarded_protocol`) exists because uvicorn alone can be starved: it
has no deadline for a request's headers or body (its keep-alive timeout is cancelled by
the first byte of the next request), and its ``limit_concurrency`` answers 503 to every
new request, health probes included, once slow clients hold the connections.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.routing import APIRoute

from neorl_industrial.integration.deployment.metrics import (
    CUT_BODY_TIMEOUT,
    CUT_HEADER_TIMEOUT,
    CUT_SHED,
    UNAVAILABLE_CONNECTION_LIMIT,
    UNAVAILABLE_LOADING,
    UNAVAILABLE_SHUTTING_DOWN,
    ServerMetrics,
)

__all__ = ["METRICS_STATE_KEY", "LimitsAndMetrics", "OrjsonRoute", "guarded_protocol"]

_ACT_ROUTES = ("/v1/act", "/v1/act/batch")
#: Answered even when every connection is busy: the probes must never be starved.
_PROBES = frozenset({"/healthz", "/readyz"})
#: The key of the app's :class:`ServerMetrics` in the ASGI lifespan state, where the
#: protocol (which uvicorn builds without the app) finds it.
METRICS_STATE_KEY = "neorl.metrics"
#: The status the middleware records for a request whose client went away (or was cut)
#: before the body was in; as nginx logs it.
CLIENT_CLOSED = 499


class LimitsAndMetrics:
    """ASGI middleware: refuses bodies over ``max_body`` bytes (413), records every
    request's count and latency by route and status, and every 503 the app answers by
    its reason (``ready()`` false: the policy is still loading; else shutting down).

    An act request counts as arriving (:meth:`ServerMetrics.arrived`, which the
    micro-batcher waits for) from when its body is complete until it is submitted: a
    client still sending its body is not worth waiting for.
    """

    def __init__(
        self, app: Any, metrics: ServerMetrics, max_body: int, ready: Callable[[], bool]
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.max_body = max_body
        self.ready = ready

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        path = scope["path"]
        metrics = self.metrics
        declared = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = value
                break
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            await _too_large(send, self.max_body)
            metrics.request(path, 413, time.perf_counter() - started)
            return
        if declared is None and scope["method"] in ("POST", "PUT", "PATCH"):
            # A body without a declared length (chunked) is read here, up to the limit.
            chunks, size = [], 0
            while True:
                message = await receive()
                if message["type"] != "http.request":  # the client went away
                    metrics.request(path, CLIENT_CLOSED, time.perf_counter() - started)
                    return
                chunks.append(message.get("body", b""))
                size += len(chunks[-1])
                if size > self.max_body:
                    await _too_large(send, self.max_body)
                    metrics.request(path, 413, time.perf_counter() - started)
                    return
                if not message.get("more_body", False):
                    break
            buffered = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

            async def replay() -> dict:
                return buffered.pop() if buffered else await receive()

            receive = replay

        status = 500
        gone = False  # the client went away (or was cut) before its body was in
        acting = path in _ACT_ROUTES
        if acting or scope["method"] in ("POST", "PUT", "PATCH"):
            inner_receive = receive

            body_in = False

            async def receive() -> dict:
                nonlocal gone, body_in
                message = await inner_receive()
                if message["type"] != "http.request":
                    gone = gone or not body_in
                elif not message.get("more_body", False):
                    body_in = True
                    if acting:
                        metrics.arrived(scope)
                return message

        async def tracking_send(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        finally:
            if acting:
                metrics.submitted(scope)  # no-op when the handler submitted
            if gone:
                status = CLIENT_CLOSED  # whatever the app answered, nobody read it
            elif status == 503:
                ready = self.ready()
                metrics.unavailable(UNAVAILABLE_SHUTTING_DOWN if ready else UNAVAILABLE_LOADING)
            metrics.request(path, status, time.perf_counter() - started)


class _OrjsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = orjson.loads(body)
            except orjson.JSONDecodeError:
                # NaN and Infinity literals, which orjson refuses and the standard parser
                # reads, so that the schema's 422 names the element; anything else fails
                # here too, with the standard parser's error.
                self._json = json.loads(body)
        return self._json


class OrjsonRoute(APIRoute):
    """A route whose JSON body is parsed by orjson: the standard library's parser takes
    ~10x as long for an observation of a few hundred numbers, the largest single cost of
    a request in the framework. The same values and the same errors (FastAPI's pattern of
    a custom ``Request`` and ``APIRoute`` class)."""

    def get_route_handler(self) -> Callable[[Request], Any]:
        handler = super().get_route_handler()

        async def orjson_handler(request: Request) -> Response:
            return await handler(_OrjsonRequest(request.scope, request.receive))

        return orjson_handler


async def _too_large(send: Any, limit: int) -> None:
    body = f'{{"detail":"request body larger than {limit} bytes"}}'.encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


_UNAVAILABLE_BODY = b'{"detail":"every connection is busy answering a request; retry shortly"}'
_TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)


def guarded_protocol(
    *,
    header_timeout_s: float,
    body_timeout_s: float,
    body_min_rate: float,
    max_connections: int,
) -> type:
    """uvicorn's h11 protocol with deadlines for slow clients and a connection cap that
    sheds slow clients rather than refusing fresh ones. Pass the class as
    ``uvicorn.run(..., http=guarded_protocol(...))``, without ``limit_concurrency``.

    * Headers: the request line and headers must be complete ``header_timeout_s`` after
      the request's first byte (or after the connection opened).
    * Body: it must be complete ``body_timeout_s`` after the headers, plus one second per
      ``body_min_rate`` bytes received (mod_reqtimeout's ``body=...,MinRate=...``): a body
      arriving at ``body_min_rate`` bytes per second or faster is never cut, a slower one
      is once it falls ``body_timeout_s`` behind. ``body_min_rate=0``: a fixed deadline.
    * A client that misses a deadline gets a 408 and its connection is closed.
    * At most ``max_connections`` connections: a connection past the cap makes room by
      closing the connection that has been reading a request the longest (slow clients;
      a fresh one reads its request in milliseconds), else the longest-idle keep-alive
      connection. Only when every other connection has a request being answered is the
      new connection's request refused with a 503 (and the connection closed);
      ``/healthz`` and ``/readyz`` are answered even then.

    Each connection cut and each 503 is counted in the app's :class:`ServerMetrics`
    (found in the lifespan state under :data:`METRICS_STATE_KEY`).

    Raises:
        ValueError: for a non-positive timeout or cap, or a negative rate.
    """
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    if header_timeout_s <= 0 or body_timeout_s <= 0:
        raise ValueError(
            f"header_timeout_s and body_timeout_s must be > 0, got {header_timeout_s} and "
            f"{body_timeout_s}"
        )
    if body_min_rate < 0:
        raise ValueError(f"body_min_rate must be >= 0 bytes/s, got {body_min_rate}")
    if max_connections < 1:
        raise ValueError(f"max_connections must be >= 1, got {max_connections}")
    idle, send_body = h11.IDLE, h11.SEND_BODY

    class GuardedH11Protocol(H11Protocol):
        header_timeout = header_timeout_s
        body_timeout = body_timeout_s
        min_rate = body_min_rate
        connection_cap = max_connections

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.limit_concurrency = None  # replaced by the shedding cap below
            self._app = self.app
            self._deadline: asyncio.TimerHandle | None = None
            # The current request's first byte (or the connection's opening); None while
            # no request is being read (answering one, or idle between requests).
            self._reading_since: float | None = None
            self._idle_since: float | None = None
            self._received = 0  # bytes of the current request
            self._body_since: float | None = None
            self._body_offset = 0  # bytes of the request before its body
            self._metrics: ServerMetrics | None = None
            self._counted = False  # in the metrics' requests_in

        # -- uvicorn's protocol interface

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._metrics = metrics = self.app_state.get(METRICS_STATE_KEY)
            if metrics is not None and metrics.requests_in is None:
                metrics.requests_in = 0
            self._reading_since = self.loop.time()
            self._deadline = self.loop.call_later(self.header_timeout, self._header_timed_out)
            over = len(self.connections) > self.connection_cap
            if over and self._open() > self.connection_cap and not self._make_room():
                self.app = self._admit  # its request decides: room then, or a 503

        def data_received(self, data: bytes) -> None:
            if self._reading_since is None:
                if self.conn.their_state is not idle or self.conn.our_state is not idle:
                    super().data_received(data)  # pipelined behind a request being answered
                    return
                self._reading_since = self.loop.time()  # a kept-alive connection's next request
                self._idle_since = None
                self._received = 0
            self._received += len(data)
            super().data_received(data)
            state = self.conn.their_state
            if state is idle:
                if self._deadline is None:
                    self._deadline = self.loop.call_later(
                        self.header_timeout, self._header_timed_out
                    )
            elif state is send_body:
                if self._body_since is None:
                    self._disarm()
                    self._body_since = self.loop.time()
                    # Everything so far counts as headers: the body's first bytes in
                    # this chunk buy no time (stricter, never looser, than exact).
                    self._body_offset = self._received
                    self._deadline = self.loop.call_later(self.body_timeout, self._body_check)
            else:  # the request is in: the app answers it, no client deadline applies
                self._disarm()
                self._reading_since = self._body_since = None
                if not self._counted and self._metrics is not None:
                    # Counted before any request's task runs: the micro-batcher sees the
                    # requests that arrived together, and decides a lone one at once.
                    self._counted = True
                    self._metrics.requests_in += 1

        def on_response_complete(self) -> None:
            self._uncount()
            super().on_response_complete()
            if self.conn.their_state is idle:  # kept alive: uvicorn's keep-alive timeout
                self._reading_since = self._body_since = None
                self._idle_since = self.loop.time()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._uncount()
            self._reading_since = self._idle_since = None
            super().connection_lost(exc)

        def _uncount(self) -> None:
            if self._counted:
                self._counted = False
                self._metrics.requests_in -= 1

        # -- deadlines

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _header_timed_out(self) -> None:
            self._deadline = None
            if self.conn.their_state is idle and self._reading_since is not None:
                self._cut(CUT_HEADER_TIMEOUT, answer=self._received > 0)

        def _body_check(self) -> None:
            self._deadline = None
            if self.conn.their_state is not send_body or self._body_since is None:
                return
            due = self._body_since + self.body_timeout
            if self.min_rate > 0:
                due += (self._received - self._body_offset) / self.min_rate
            if self.loop.time() >= due:
                self._cut(CUT_BODY_TIMEOUT, answer=True)
            else:
                self._deadline = self.loop.call_at(due, self._body_check)

        def _cut(self, reason: str, answer: bool) -> None:
            """Closes the connection (a 408 first when a request was under way)."""
            transport = self.transport
            if transport.is_closing():
                return
            cycle = self.cycle
            started = cycle is not None and not cycle.response_complete
            if answer and not (started and cycle.response_started):
                body = b'{"detail":"request not received in time"}'
                transport.write(_TIMED_OUT % (len(body), body))
            if started:
                cycle.disconnected = True  # the app's own answer, if any, goes nowhere
                cycle.message_event.set()
            self._disarm()
            self._reading_since = self._idle_since = None
            transport.close()
            if self._metrics is not None:
                self._metrics.connection_cut(reason)

        # -- the connection cap

        def _open(self) -> int:
            return sum(not other.transport.is_closing() for other in self.connections)

        def _make_room(self) -> bool:
            """Closes the connection reading a request the longest, else the longest-idle
            one; False when every other connection has a request being answered."""
            victim, oldest = None, None
            for other in self.connections:
                if other is self or other.transport.is_closing():
                    continue
                since = getattr(other, "_reading_since", None)
                key = (0, since)
                if since is None:
                    idle_since = getattr(other, "_idle_since", None)
                    if idle_since is None:
                        continue  # answering a request: never shed
                    key = (1, idle_since)
                if oldest is None or key < oldest:
                    victim, oldest = other, key
            if victim is None:
                return False
            victim._cut(CUT_SHED, answer=False)
            return True

        async def _admit(self, scope: dict, receive: Any, send: Any) -> None:
            """The app of a connection past the cap: room is made, or the request gets a
            503 (the probes are answered regardless)."""
            if self._open() <= self.connection_cap or self._make_room():
                self.app = self._app
            elif scope["path"] not in _PROBES:
                metrics = self._metrics
                if metrics is not None:
                    metrics.unavailable(UNAVAILABLE_CONNECTION_LIMIT)
                    metrics.request(scope["path"], 503, 0.0)
                await _unavailable(send)
                return
            await self._app(scope, receive, send)

    return GuardedH11Protocol


async def _unavailable(send: Any) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(_UNAVAILABLE_BODY)).encode()),
                (b"retry-after", b"1"),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": _UNAVAILABLE_BODY})
