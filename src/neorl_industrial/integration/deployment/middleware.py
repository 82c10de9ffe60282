"""What stands between a client and the routes: the uvicorn protocol that cuts slow
clients and keeps the connection cap from locking anyone out, and the ASGI middleware that
enforces the body size limit and records every request in the metrics.

The middleware is plain ASGI rather than Starlette's ``BaseHTTPMiddleware``: no task and
no stream per request, and a chunked body is counted as it arrives, so an oversized one is
refused before it is all read.

The protocol (:func:`guarded_protocol`, on uvicorn's httptools parser by default) exists
because uvicorn alone can be starved: it has no deadline for a request's headers or body
(its keep-alive timeout is cancelled by the first byte of the next request), and its
``limit_concurrency`` answers 503 to every new request, health probes included, once slow
clients hold the connections.
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

__all__ = [
    "METRICS_STATE_KEY",
    "LimitsAndMetrics",
    "OrjsonRoute",
    "guarded_protocol",
    "send_json",
]

_ACT_ROUTES = ("/v1/act", "/v1/act/batch")
#: Answered even when every connection is busy: the probes must never be starved.
_PROBES = frozenset({"/healthz", "/readyz"})
#: The key of the app's :class:`ServerMetrics` in the ASGI lifespan state, where the
#: protocol (which uvicorn builds without the app) finds it.
METRICS_STATE_KEY = "neorl.metrics"
#: The status the middleware records for a request whose client went away (or was cut)
#: before the body was in; as nginx logs it.
CLIENT_CLOSED = 499
#: The status recorded for a request the server itself cut: 408 where it answered "request
#: not received in time", 444 (nginx's "closed without a response") where it shed the
#: connection to make room. Kept in the request's scope under this key by the protocol.
TIMED_OUT = 408
SHED = 444
CUT_STATUS_KEY = "neorl.cut_status"


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
                if message["type"] != "http.request":  # the client went away, or was cut
                    status = scope.get(CUT_STATUS_KEY, CLIENT_CLOSED)
                    metrics.request(path, status, time.perf_counter() - started)
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
                # Whatever the app answered, nobody read it: the server's cut (a 408, or
                # shed) counts as itself, a client that left as 499.
                status = scope.get(CUT_STATUS_KEY, CLIENT_CLOSED)
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


async def send_json(send: Any, status: int, body: bytes, *headers: tuple[bytes, bytes]) -> None:
    """Answers with the JSON ``body`` through ASGI's ``send`` directly, past the framework
    (``headers``: any beyond its length and type, which come first as the framework's
    responses have them)."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-length", str(len(body)).encode()),
                (b"content-type", b"application/json"),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _too_large(send: Any, limit: int) -> None:
    body = f'{{"detail":"request body larger than {limit} bytes"}}'.encode()
    await send_json(send, 413, body)


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
    parser: str = "httptools",
) -> type:
    """uvicorn's HTTP protocol with deadlines for slow clients and a connection cap that
    sheds slow clients rather than refusing fresh ones. Pass the class as
    ``uvicorn.run(..., http=guarded_protocol(...))``, without ``limit_concurrency``.

    * Headers: the request line and headers must be complete ``header_timeout_s`` after
      the request's first byte (or after the connection opened), and at most uvicorn's
      ``h11_max_incomplete_event_size`` bytes long (past it: a 431 on httptools, h11's
      own 400 on h11, and the connection closed).
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

    Args:
        parser: ``"httptools"`` (uvicorn's C parser, the default: about 75 us less per
            request than h11) or ``"h11"`` (pure Python).

    Raises:
        ValueError: for a non-positive timeout or cap, a negative rate, or an unknown
            parser.
    """
    if header_timeout_s <= 0 or body_timeout_s <= 0:
        raise ValueError(
            f"header_timeout_s and body_timeout_s must be > 0, got {header_timeout_s} and "
            f"{body_timeout_s}"
        )
    if body_min_rate < 0:
        raise ValueError(f"body_min_rate must be >= 0 bytes/s, got {body_min_rate}")
    if max_connections < 1:
        raise ValueError(f"max_connections must be >= 1, got {max_connections}")
    if parser not in ("httptools", "h11"):
        raise ValueError(f"parser must be 'httptools' or 'h11', got {parser!r}")
    limits = {
        "header_timeout": header_timeout_s,
        "body_timeout": body_timeout_s,
        "min_rate": body_min_rate,
        "connection_cap": max_connections,
    }
    if parser == "h11":
        return type("GuardedH11Protocol", (_GuardedH11,), limits)
    return type("GuardedHttpToolsProtocol", (_GuardedHttpTools,), limits)


#: h11's default bound on a request's line and headers, which uvicorn applies by default.
_DEFAULT_MAX_HEADER_BYTES = 16 * 1024
#: What a connection is reading: a request's line and headers, or its body.
_HEADERS, _BODY = "headers", "body"


class _Guard:
    """The deadlines, the connection cap and their counters, shared by both parsers'
    protocols; each subclass tells it where a request's phases begin and end
    (:meth:`_reading`, :meth:`_headers_in`, :meth:`_request_in`, :meth:`_idle`)."""

    header_timeout: float
    body_timeout: float
    min_rate: float
    connection_cap: int
    # uvicorn's protocol attributes this class uses
    app: Any
    app_state: dict
    connections: set
    cycle: Any
    loop: asyncio.AbstractEventLoop
    transport: Any
    config: Any

    def _guard_init(self) -> None:
        self.limit_concurrency = None  # replaced by the shedding cap below
        self._app = self.app
        self._deadline: asyncio.TimerHandle | None = None
        self._phase: str | None = None  # _HEADERS, _BODY or None (answering, or idle)
        # The current request's first byte (or the connection's opening); None while no
        # request is being read (answering one, or idle between requests).
        self._reading_since: float | None = None
        self._idle_since: float | None = None
        self._received = 0  # bytes of the current request
        self._body_since: float | None = None
        self._body_offset = 0  # bytes of the request before its body
        self._metrics: ServerMetrics | None = None
        self._counted = False  # in the metrics' requests_in
        # uvicorn's bound on a request's headers (None: h11's default, 16 KiB).
        limit = getattr(self.config, "h11_max_incomplete_event_size", None)
        self._max_header_bytes = _DEFAULT_MAX_HEADER_BYTES if limit is None else int(limit)

    def _opened(self) -> None:
        self._metrics = metrics = self.app_state.get(METRICS_STATE_KEY)
        if metrics is not None and metrics.requests_in is None:
            metrics.requests_in = 0
        self._reading()
        self._arm()
        over = len(self.connections) > self.connection_cap
        if over and self._open() > self.connection_cap and not self._make_room():
            self.app = self._admit  # its request decides: room then, or a 503

    # -- a request's phases

    def _reading(self) -> None:
        """A request's first byte (or a new connection): its headers' deadline starts
        (the timer is set by :meth:`_arm`)."""
        self._phase = _HEADERS
        self._reading_since = self.loop.time()
        self._idle_since = None
        self._received = 0

    def _headers_in(self) -> None:
        """The headers are in; the body's deadline starts (the timer is set by
        :meth:`_arm`)."""
        self._disarm()
        self._phase = _BODY
        self._body_since = self.loop.time()
        # Everything so far counts as headers: the body's first bytes in this chunk buy
        # no time (stricter, never looser, than exact).
        self._body_offset = self._received

    def _arm(self) -> None:
        """Sets the timer of the phase a connection is left in once what has arrived is
        parsed. A request that arrived whole in one read (the common case) needs none:
        the deadlines of its phases run from when each began, so setting the timer after
        the parse, not at each phase's start, moves no deadline."""
        if self._deadline is not None or self._phase is None:
            return
        if self._phase == _HEADERS:
            due = self._reading_since + self.header_timeout
            self._deadline = self.loop.call_at(due, self._header_timed_out)
        else:
            self._deadline = self.loop.call_at(
                self._body_since + self.body_timeout, self._body_check
            )

    def _request_in(self) -> None:
        """The request is in: the app answers it, no client deadline applies."""
        self._disarm()
        self._phase = None
        self._reading_since = self._body_since = None
        if not self._counted and self._metrics is not None:
            # Counted before any request's task runs: the micro-batcher sees the requests
            # that arrived together, and decides a lone one at once.
            self._counted = True
            self._metrics.requests_in += 1

    def _idle(self) -> None:
        """The answer is sent and the connection kept alive (uvicorn's keep-alive
        timeout governs it now)."""
        self._phase = None
        self._reading_since = self._body_since = None
        self._idle_since = self.loop.time()

    def _closed(self) -> None:
        self._disarm()
        self._uncount()
        self._phase = None
        self._reading_since = self._idle_since = None

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
        if self._phase == _HEADERS:
            self._cut(CUT_HEADER_TIMEOUT, answer=self._received > 0)

    def _body_check(self) -> None:
        self._deadline = None
        if self._phase != _BODY or self._body_since is None:
            return
        due = self._body_since + self.body_timeout
        if self.min_rate > 0:
            due += (self._received - self._body_offset) / self.min_rate
        if self.loop.time() >= due:
            self._cut(CUT_BODY_TIMEOUT, answer=True)
        else:
            self._deadline = self.loop.call_at(due, self._body_check)

    def _cut(self, reason: str, answer: bool, response: bytes | None = None) -> None:
        """Closes the connection (a 408, or ``response``, first when a request was under
        way)."""
        transport = self.transport
        if transport.is_closing():
            return
        cycle = self.cycle
        started = cycle is not None and not cycle.response_complete
        cut_status = SHED
        if answer and not (started and cycle.response_started):
            if response is None:
                body = b'{"detail":"request not received in time"}'
                response = _TIMED_OUT % (len(body), body)
            transport.write(response)
            cut_status = int(response[9:12])  # "HTTP/1.1 408 ..."
        if started:
            # How the request's metrics count it (the app then sees a disconnect).
            cycle.scope[CUT_STATUS_KEY] = cut_status
            cycle.disconnected = True  # the app's own answer, if any, goes nowhere
            cycle.message_event.set()
        self._closed()
        transport.close()
        if self._metrics is not None and reason is not None:
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


def _h11_base() -> type:
    from uvicorn.protocols.http.h11_impl import H11Protocol

    return H11Protocol


def _httptools_base() -> type:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    return HttpToolsProtocol


class _OneWrite:
    """A response's view of its connection's transport, on which the status line and
    headers (uvicorn's first write of a response) wait for the body and go out with it in
    one socket write: one segment and one wake-up of the client instead of two, the
    largest cost of a small answer after the policy call. Headers whose body does not
    follow at once are sent at the event loop's next turn; anything else is the
    transport's."""

    __slots__ = ("_held", "_loop", "transport")

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self.transport.write(held + data)
        elif data[:5] == b"HTTP/" and data[-4:] == b"\r\n\r\n":
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self.transport.write(data)

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self.transport.is_closing():
            self.transport.write(held)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class _GuardedHttpTools(_httptools_base(), _Guard):  # type: ignore[misc]
    """The guard on uvicorn's httptools protocol: the parser's callbacks mark a request's
    phases (they run inside :meth:`data_received`, pipelined requests included). A
    response's headers and body leave in one write (:class:`_OneWrite`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guard_init()
        self._one_write: _OneWrite | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._opened()

    def data_received(self, data: bytes) -> None:
        if self._phase is None and (self.cycle is None or self.cycle.response_complete):
            self._reading()  # a kept-alive connection's next request
        self._received += len(data)
        super().data_received(data)
        limit = self._max_header_bytes
        if limit and self._phase == _HEADERS and self._received > limit:
            self._cut(None, answer=True, response=_HEADERS_TOO_LARGE)
        else:
            self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._phase is None:  # pipelined behind a request being answered
            self._reading()

    def on_headers_complete(self) -> None:
        self._headers_in()
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.transport is self.transport:
            if self._one_write is None:
                self._one_write = _OneWrite(self.transport, self.loop)
            cycle.transport = self._one_write

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._request_in()

    def on_response_complete(self) -> None:
        self._uncount()
        pipelined = bool(self.pipeline)  # the next request, already read, is answered now
        super().on_response_complete()
        if self._phase is None and not pipelined and not self.transport.is_closing():
            self._idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed()
        super().connection_lost(exc)


class _GuardedH11(_h11_base(), _Guard):  # type: ignore[misc]
    """The guard on uvicorn's h11 protocol: h11's states mark a request's phases."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guard_init()

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._opened()

    def data_received(self, data: bytes) -> None:
        import h11

        if self._phase is None:
            if self.conn.their_state is not h11.IDLE or self.conn.our_state is not h11.IDLE:
                super().data_received(data)  # pipelined behind a request being answered
                return
            self._reading()  # a kept-alive connection's next request
        self._received += len(data)
        super().data_received(data)
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if self._phase == _HEADERS:
                self._headers_in()
        elif state is not h11.IDLE and self._phase is not None:
            self._request_in()
        self._arm()

    def on_response_complete(self) -> None:
        import h11

        self._uncount()
        super().on_response_complete()
        if self.conn.their_state is h11.IDLE:  # kept alive: uvicorn's keep-alive timeout
            self._idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed()
        super().connection_lost(exc)


_HEADERS_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: 47\r\n\r\n"
    b'{"detail":"request line and headers too large"}'
)


async def _unavailable(send: Any) -> None:
    await send_json(send, 503, _UNAVAILABLE_BODY, (b"retry-after", b"1"), (b"connection", b"close"))
