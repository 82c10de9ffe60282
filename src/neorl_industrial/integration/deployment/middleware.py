"""ASGI middleware of the policy server: the body size limit, per-request metrics, and
the count of act requests still being read that the micro-batcher waits for.

Plain ASGI rather than Starlette's ``BaseHTTPMiddleware``: no task and no stream per
request, and a chunked body is counted as it arrives, so an oversized one is refused
before it is all read.
"""

from __future__ import annotations

import time
from typing import Any

from neorl_industrial.integration.deployment.metrics import ServerMetrics

__all__ = ["LimitsAndMetrics"]

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
