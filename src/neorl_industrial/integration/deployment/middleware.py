"""ASGI middleware of the policy server: the body size limit, per-request metrics, and
the count of act requests still being read that the micro-batcher waits for.

Plain ASGI rather than Starlette's ``BaseHTTPMiddleware``: no task and no stream per
request, and a chunked body is counted as it arrives, so an oversized one is refused
before it is all read.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from neorl_industrial.integration.deployment.metrics import ServerMetrics

__all__ = ["LimitsAndMetrics", "header_timeout_protocol"]

_ACT_ROUTES = ("/v1/act", "/v1/act/batch")


class LimitsAndMetrics:
    """ASGI middleware: refuses bodies over ``max_body`` bytes (413) and records every
    request's count and latency by route and status."""

    def __init__(self, app: Any, metrics: ServerMetrics, max_body: int) -> None:
        self.app = app
        self.metrics = metrics
        self.max_body = max_body

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        path = scope.get("path", "")
        status = {"code": 500}
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            await _too_large(send, self.max_body)
            self.metrics.request(path, 413, time.perf_counter() - started)
            return
        if declared is None and scope.get("method") in ("POST", "PUT", "PATCH"):
            # A body without a declared length (chunked) is read here, up to the limit.
            chunks, size = [], 0
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    break
                chunks.append(message.get("body", b""))
                size += len(chunks[-1])
                if size > self.max_body:
                    await _too_large(send, self.max_body)
                    self.metrics.request(path, 413, time.perf_counter() - started)
                    return
                if not message.get("more_body", False):
                    break
            buffered = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

            async def replay() -> dict:
                return buffered.pop() if buffered else await receive()

            receive = replay

        async def tracking_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        acting = path in _ACT_ROUTES
        if acting:
            self.metrics.arrived(scope)
        try:
            await self.app(scope, receive, tracking_send)
        finally:
            if acting:
                self.metrics.submitted(scope)  # no-op when the handler submitted
            self.metrics.request(path, status["code"], time.perf_counter() - started)


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


def header_timeout_protocol(seconds: float) -> type:
    """uvicorn's h11 protocol, closing a connection whose request line and headers are
    not complete ``seconds`` after its first byte (or after it connected).

    uvicorn has no such limit (its ``timeout_keep_alive`` is cancelled by the first byte
    of the next request), and ASGI middleware only runs once the headers are in, so a
    client trickling its headers would hold a connection for as long as it likes. Pass
    the class as ``uvicorn.run(..., http=header_timeout_protocol(10.0))``.
    """
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeoutH11Protocol(H11Protocol):
        header_timeout = seconds
        _header_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_header_deadline()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is h11.IDLE:
                self._arm_header_deadline()  # a request line or headers still arriving
            else:
                self._cancel_header_deadline()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_header_deadline()
            super().connection_lost(exc)

        def _arm_header_deadline(self) -> None:
            if self._header_deadline is None:
                self._header_deadline = self.loop.call_later(
                    self.header_timeout, self._header_timed_out
                )

        def _cancel_header_deadline(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
                self._header_deadline = None

        def _header_timed_out(self) -> None:
            self._header_deadline = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutH11Protocol
