"""The policy server: a FastAPI app whose every action has passed the safety shield.

``create_app(settings)`` loads the policy (an exported directory or a registry URI) in the
app's lifespan, compiles it for every padded batch size, and serves the endpoints of
:mod:`.routes`: shielded actions one at a time or in batches, the policy's description,
hot reload for admins, health, readiness and Prometheus metrics.

The app is assembled from parts in the shape of the FastAPI full-stack template:

* :mod:`.settings` — pydantic-settings from ``NEORL_SERVE_*`` and a secrets file;
* :mod:`.deps` — the serving state on ``app.state.serving`` and the ``Annotated``
  dependencies the routes declare (``PolicyDep``, ``ActKeyDep``, ``AdminKeyDep``, ...);
* :mod:`.schemas` — request and response bodies; :mod:`.routes` — the endpoints, and
  ``/v1/act``'s fast path for its common form (every check of the route, without the
  framework's routing; anything else goes to the route);
* :mod:`.middleware` — the body size limit and per-request metrics, and the uvicorn
  protocol that cuts slow clients and sheds them at the connection cap;
* :mod:`.batcher` — concurrent requests micro-batched into one compiled call.

Overrides are counted by the safety monitor and written to the audit log with their
request id. Bad input (wrong lengths, NaN or infinity, wrong types, empty or oversized
batches) gets a 422 that names the field; a body over the size limit a 413.

The server imports the policy artifact's loader, the safety layer's monitor and audit log
and (for ``models:/`` URIs) MLflow — never the training code.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse

from neorl_industrial.integration.deployment.batcher import MicroBatcher
from neorl_industrial.integration.deployment.deps import ServingState
from neorl_industrial.integration.deployment.fast_path import ActFastPath
from neorl_industrial.integration.deployment.middleware import (
    METRICS_STATE_KEY,
    LimitsAndMetrics,
)
from neorl_industrial.integration.deployment.policy import LoadedPolicy, load_policy_source
from neorl_industrial.integration.deployment.routes import router
from neorl_industrial.integration.deployment.settings import ServerSettings, SettingsError

__all__ = ["LoadedPolicy", "create_app", "load_policy_source"]

log = logging.getLogger("neorl_industrial.serve")


def create_app(
    settings: ServerSettings | None = None, *, policy: LoadedPolicy | None = None
) -> FastAPI:
    """The server for ``settings`` (default: from the environment). ``policy``: an already
    loaded policy (tests); otherwise ``settings.model`` is loaded at start-up.

    Raises:
        SettingsError: for settings the server cannot start with (no API keys, ...).
    """
    settings = settings or ServerSettings()
    keys = settings.keys()
    if policy is None and not settings.model:
        raise SettingsError("model: no policy to serve; set NEORL_SERVE_MODEL or --model")
    serving = ServingState(settings, keys, policy)

    app = _PolicyServer(
        title="neorl_industrial policy server",
        version="1",
        description="Shielded actions of a safe offline-RL policy.",
        lifespan=_lifespan,
    )
    app.state.serving = serving
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "X-API-Key", "Content-Type", "X-Request-ID"],
        )
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(Exception, _unexpected)
    app.include_router(router)
    # Outermost: the body limit and every request's metrics, then /v1/act's fast path, then
    # the framework (its middleware and routes).
    app.front = LimitsAndMetrics(
        ActFastPath(
            app.framework,
            serving,
            app.dependency_overrides,
            enabled=not settings.cors_origins,
        ),
        metrics=serving.metrics,
        max_body=settings.max_body_bytes,
        ready=lambda: serving.ready,
    )
    return app


class _PolicyServer(FastAPI):
    """The FastAPI app whose HTTP requests enter through ``front`` (set by
    :func:`create_app`); the lifespan goes to the framework directly."""

    front: Any = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.front is not None:
            await self.front(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)

    async def framework(self, scope: dict, receive: Any, send: Any) -> None:
        """The framework's own handling: its middleware, routing and routes."""
        await super().__call__(scope, receive, send)


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[dict]:
    """Loads and compiles the policy, starts the batcher; on shutdown drains and closes.

    Yields the lifespan state, through which the uvicorn protocol of ``serve`` counts the
    connections it cuts and the 503s it answers in this app's metrics."""
    serving: ServingState = app.state.serving
    settings = serving.settings
    loaded = serving.policy
    if loaded is None:
        loaded = await asyncio.to_thread(
            load_policy_source,
            settings.model,
            settings.tracking_uri,
            serving.batch_sizes,
            trust=settings.trust(),
        )
    else:
        await asyncio.to_thread(loaded.artifact.warmup, serving.batch_sizes)
    serving.install(loaded)
    metrics = serving.metrics
    batcher = MicroBatcher(
        serving.predict,
        action_size=loaded.action_size,
        max_batch=max(settings.max_batch, 1),
        max_wait=settings.max_wait_ms / 1000.0,
        on_batch=metrics.batch_rows.observe,
        arriving=lambda: metrics.arriving,
        alone=lambda: metrics.requests_in is not None and metrics.requests_in <= 1,
        loop_rows=settings.loop_batch_rows,
    )
    batcher.start()
    serving.batcher = batcher
    if settings.tune_gc:
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 50, 100)
    log.info("serving %s (%s)", loaded.version, loaded.source)
    try:
        yield {METRICS_STATE_KEY: metrics}
    finally:
        await batcher.stop()
        serving.close()


async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
    detail = [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
        for e in error.errors()
    ]
    return JSONResponse({"detail": detail}, status_code=422)


async def _unexpected(request: Request, error: Exception) -> JSONResponse:
    log.exception("unexpected error on %s", request.url.path)
    return JSONResponse({"detail": "internal error; see the server log"}, status_code=500)
