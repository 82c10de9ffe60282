"""The policy server: a FastAPI app whose every action has passed the safety shield.

``create_app(settings)`` loads the policy (an exported directory or a registry URI) in the
app's lifespan, compiles it for every padded batch size, and serves

=========================  ======  ============================================================
``POST /v1/act``           act     one observation → the shielded action and its SafetyReport
``POST /v1/act/batch``     act     many observations → one compiled call
``GET /v1/policy``         act     observation and action spec, constraints, version, run
``POST /v1/admin/reload``  admin   load another version and swap, with no failed request
``GET /healthz``                   the process is alive
``GET /readyz``                    a policy is loaded and compiled (503 until then)
``GET /metrics``                   Prometheus: requests, latency, overrides per constraint,
                                   batch sizes
=========================  ======  ============================================================

Concurrent requests are micro-batched (:mod:`.batcher`). Overrides are counted by the
safety monitor and written to the audit log with their request id. Bad input (wrong
lengths, NaN or infinity, wrong types, empty or oversized batches) gets a 422 that names
the field; a body over the size limit a 413.

The server imports the policy artifact's loader, the safety layer's monitor and audit log
and (for ``models:/`` URIs) MLflow — never the training code.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import orjson
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from neorl_industrial.integration.deployment.batcher import MicroBatcher
from neorl_industrial.integration.deployment.metrics import ServerMetrics
from neorl_industrial.integration.deployment.settings import ServerSettings
from neorl_industrial.integration.safety import AuditLog, SafetyMonitor

__all__ = ["LoadedPolicy", "create_app", "load_policy_source"]

log = logging.getLogger("neorl_industrial.serve")

Finite = Annotated[float, Field(allow_inf_nan=False)]
RequestId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:\-]+$")]


# ----- request and response bodies ----------------------------------------------------
class ActRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    observation: list[Finite] = Field(description="one value per observation feature")
    prev_action: list[Finite] | None = Field(
        default=None, description="the action applied at the previous step (zeros if left out)"
    )
    request_id: RequestId | None = None


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    observations: list[list[Finite]] = Field(min_length=1)
    prev_actions: list[list[Finite]] | None = None
    request_id: RequestId | None = None


class Report(BaseModel):
    overridden: bool
    projected: bool
    fallback: bool
    invalid: bool
    infeasible: bool
    status: int
    violated: list[str]
    margin: dict[str, float | None] = Field(
        description="slack of the proposed action per hard constraint (null: not active)"
    )


class ActResponse(BaseModel):
    action: list[float]
    proposed: list[float | None]
    report: Report
    request_id: str
    policy_version: str


class BatchResponse(BaseModel):
    actions: list[list[float]]
    proposed: list[list[float | None]]
    reports: list[Report]
    request_id: str
    policy_version: str


class ReloadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(
        default=None, description="directory or models:/ URI; default: the current source"
    )


# ----- the policy -----------------------------------------------------------------------
class LoadedPolicy:
    """A verified, compiled policy artifact and what the server says about it."""

    def __init__(self, artifact: Any, source: str, registry: dict[str, Any] | None) -> None:
        self.artifact = artifact
        self.source = source
        self.registry = registry or {}
        manifest = artifact.manifest
        if self.registry.get("version"):
            self.version = f"{self.registry['name']}/{self.registry['version']}"
        else:
            self.version = str(manifest.get("manifest_sha256", ""))[:12] or "unversioned"
        self.observation_size = int(manifest["observation_size"])
        self.action_size = int(manifest["action_size"])
        self.names = tuple(artifact.constraint_names)

    def describe(self) -> dict[str, Any]:
        artifact = self.artifact
        spec = artifact.constraint_spec
        return {
            "version": self.version,
            "source": self.source,
            "registry": self.registry or None,
            "metadata": artifact.metadata,
            "observation": {"size": self.observation_size, "names": artifact.observation_names},
            "action": {
                "size": self.action_size,
                "names": artifact.action_names,
                "low": artifact.action_low.tolist(),
                "high": artifact.action_high.tolist(),
            },
            "constraints": {
                "hard": list(self.names),
                "spec": spec.model_dump(mode="json", by_alias=True, exclude_none=True),
            },
        }


def load_policy_source(
    source: str, tracking_uri: str | None, batch_sizes: list[int]
) -> LoadedPolicy:
    """Loads and compiles the policy at ``source`` (directory or ``models:/`` URI)."""
    from neorl_industrial.wrappers.agents.artifact import PolicyArtifact

    registry: dict[str, Any] | None = None
    path: str | Path = source
    if source.startswith(("models:/", "runs:/")):
        from neorl_industrial.integration.mlflow.registry import (
            describe_model_uri,
            resolve_policy_dir,
        )

        path = resolve_policy_dir(source, tracking_uri)
        registry = describe_model_uri(source, tracking_uri)
    artifact = PolicyArtifact.load(path)
    artifact.warmup(batch_sizes)
    return LoadedPolicy(artifact, source, registry)


def _padded_sizes(max_batch: int, sizes: list[int]) -> list[int]:
    """The powers of two the artifact pads to, up to the largest batch served."""
    largest = max(max_batch, *sizes)
    return [1 << k for k in range(math.ceil(math.log2(largest)) + 1)]


# ----- the app ----------------------------------------------------------------------------
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
        from neorl_industrial.integration.deployment.settings import SettingsError

        raise SettingsError("model: no policy to serve; set NEORL_SERVE_MODEL or --model")
    metrics = ServerMetrics()
    sizes = _padded_sizes(settings.max_batch, settings.batch_sizes)
    state: dict[str, Any] = {"policy": policy, "batcher": None, "audit": None, "monitor": None}
    reload_lock = asyncio.Lock()

    def predict(observations: np.ndarray, prev: np.ndarray | None) -> Any:
        current: LoadedPolicy = state["policy"]
        return current.artifact.predict(observations, prev)

    def install(loaded: LoadedPolicy) -> None:
        state["policy"] = loaded
        state["monitor"] = SafetyMonitor(loaded.names)
        metrics.policy_loaded(loaded.version, loaded.source)
        if settings.audit_log is not None:
            previous = state["audit"]
            state["audit"] = AuditLog(
                settings.audit_log, policy_version=loaded.version, fsync=settings.audit_fsync
            )
            if previous is not None:
                previous.close()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loaded = state["policy"]
        if loaded is None:
            loaded = await asyncio.to_thread(
                load_policy_source, settings.model, settings.tracking_uri, sizes
            )
        else:
            await asyncio.to_thread(loaded.artifact.warmup, sizes)
        install(loaded)
        batcher = MicroBatcher(
            predict,
            action_size=loaded.action_size,
            max_batch=max(settings.max_batch, 1),
            max_wait=settings.max_wait_ms / 1000.0,
            on_batch=metrics.batch_rows.observe,
            arriving=lambda: metrics.arriving,
        )
        batcher.start()
        state["batcher"] = batcher
        if settings.tune_gc:
            gc.collect()
            gc.freeze()
            gc.set_threshold(50_000, 50, 100)
        log.info("serving %s (%s)", loaded.version, loaded.source)
        try:
            yield
        finally:
            await batcher.stop()
            if state["audit"] is not None:
                state["audit"].close()

    app = FastAPI(
        title="neorl_industrial policy server",
        version="1",
        description="Shielded actions of a safe offline-RL policy.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.server = state
    app.state.metrics = metrics
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "X-API-Key", "Content-Type", "X-Request-ID"],
        )
    app.add_middleware(_LimitsAndMetrics, metrics=metrics, max_body=settings.max_body_bytes)

    # ----- auth ----------------------------------------------------------------------
    encoded = [(key.encode(), role) for key, role in keys.items()]

    def role_of(request: Request) -> str | None:
        header = request.headers.get("authorization", "")
        given = header[7:].strip() if header.lower().startswith("bearer ") else ""
        given = given or request.headers.get("x-api-key", "")
        if not settings.auth:
            return "admin"
        if not given:
            raise HTTPException(
                401, "missing API key (Authorization: Bearer <key> or X-API-Key)",
                headers={"WWW-Authenticate": "Bearer"},
            )  # fmt: skip
        candidate = given.encode()
        found = None
        for key, role in encoded:  # every key compared, in constant time each
            if hmac.compare_digest(candidate, key):
                found = role
        if found is None:
            raise HTTPException(401, "invalid API key", headers={"WWW-Authenticate": "Bearer"})
        return found

    def act_role(request: Request) -> str | None:
        return role_of(request)

    def admin_role(request: Request) -> str | None:
        role = role_of(request)
        if role != "admin":
            raise HTTPException(403, "this key may act but not administer; use an admin key")
        return role

    acting = [Depends(act_role)]
    administering = [Depends(admin_role)]

    # ----- helpers ---------------------------------------------------------------------
    def current() -> LoadedPolicy:
        loaded = state["policy"]
        if loaded is None or state["batcher"] is None:
            raise HTTPException(503, "no policy loaded yet")
        return loaded

    def unprocessable(field: tuple[Any, ...], message: str) -> HTTPException:
        return HTTPException(
            422, [{"loc": ["body", *field], "msg": message, "type": "value_error"}]
        )

    def check_rows(
        values: list[list[float]], width: int, field: str, what: str, single: bool = False
    ) -> np.ndarray:
        for row, value in enumerate(values):
            if len(value) != width:
                where = (field,) if single else (field, row)
                raise unprocessable(where, f"expected {width} values ({what}), got {len(value)}")
        return np.asarray(values, np.float32).reshape(len(values), width)

    def request_id(request: Request, given: str | None) -> str:
        return given or request.headers.get("x-request-id") or uuid.uuid4().hex

    def reports(decision: Any) -> list[dict[str, Any]]:
        names = decision.constraint_names
        # Inactive state-conditional constraints have an infinite margin: null in JSON.
        margins = np.where(np.isfinite(decision.margin), decision.margin, np.nan).tolist()
        violated = decision.violated
        flags = [
            (name, getattr(decision, name).tolist())
            for name in ("overridden", "projected", "fallback", "invalid", "infeasible")
        ]
        statuses = decision.status.tolist()
        return [
            {
                **{name: values[i] for name, values in flags},
                "status": statuses[i],
                "violated": list(violated[i]),
                "margin": dict(zip(names, margins[i], strict=True)),
            }
            for i in range(len(statuses))
        ]

    def observe(
        loaded: LoadedPolicy, observations: np.ndarray, decision: Any, ids: list[str]
    ) -> None:
        state["monitor"].observe(decision, policy_version=loaded.version)
        metrics.decisions(decision)
        audit = state["audit"]
        if audit is not None and bool(decision.overridden.any()):
            audit.write_overrides(
                observations, decision.proposed, decision.action, decision, loaded.names, ids
            )

    async def decide(request: Request, observations: np.ndarray, prev: np.ndarray | None) -> Any:
        metrics.submitted(request.scope)
        return await state["batcher"].submit(observations, prev)

    # ----- endpoints -------------------------------------------------------------------
    @app.post("/v1/act", response_model=ActResponse, tags=["policy"], dependencies=acting)
    async def act(body: ActRequest, request: Request) -> Any:
        loaded = current()
        observations = check_rows(
            [body.observation],
            loaded.observation_size,
            "observation",
            "one per observation feature",
            single=True,
        )
        prev = None
        if body.prev_action is not None:
            prev = check_rows(
                [body.prev_action], loaded.action_size, "prev_action", "one per action", True
            )
        rid = request_id(request, body.request_id)
        decision = await decide(request, observations, prev)
        observe(loaded, observations, decision, [rid])
        return _json(
            {
                "action": decision.action[0].tolist(),
                "proposed": decision.proposed[0].tolist(),
                "report": reports(decision)[0],
                "request_id": rid,
                "policy_version": loaded.version,
            }
        )

    @app.post("/v1/act/batch", response_model=BatchResponse, tags=["policy"], dependencies=acting)
    async def act_batch(body: BatchRequest, request: Request) -> Any:
        loaded = current()
        if len(body.observations) > settings.max_batch:
            raise unprocessable(
                ("observations",),
                f"at most {settings.max_batch} observations per request, "
                f"got {len(body.observations)}",
            )
        observations = check_rows(
            body.observations,
            loaded.observation_size,
            "observations",
            "one per observation feature",
        )
        prev = None
        if body.prev_actions is not None:
            if len(body.prev_actions) != len(body.observations):
                raise unprocessable(
                    ("prev_actions",),
                    f"expected one previous action per observation ({len(body.observations)}), "
                    f"got {len(body.prev_actions)}",
                )
            prev = check_rows(
                body.prev_actions, loaded.action_size, "prev_actions", "one per action"
            )
        rid = request_id(request, body.request_id)
        decision = await decide(request, observations, prev)
        ids = [f"{rid}/{row}" for row in range(len(observations))]
        observe(loaded, observations, decision, ids)
        return _json(
            {
                "actions": decision.action.tolist(),
                "proposed": decision.proposed.tolist(),
                "reports": reports(decision),
                "request_id": rid,
                "policy_version": loaded.version,
            }
        )

    @app.get("/v1/policy", tags=["policy"], dependencies=acting)
    async def policy_info() -> dict[str, Any]:
        loaded = current()
        return {**loaded.describe(), "safety": state["monitor"].summary()}

    @app.post("/v1/admin/reload", tags=["admin"], dependencies=administering)
    async def reload(body: ReloadRequest | None = None) -> dict[str, Any]:
        source = (body.model if body else None) or current().source
        async with reload_lock:
            previous = current()
            started = time.perf_counter()
            try:
                loaded = await asyncio.to_thread(
                    load_policy_source, source, settings.tracking_uri, sizes
                )
            except Exception as error:  # nothing swapped: the old policy keeps serving
                raise HTTPException(422, f"model: cannot load {source!r}: {error}") from None
            if (loaded.observation_size, loaded.action_size) != (
                previous.observation_size,
                previous.action_size,
            ):
                raise HTTPException(
                    422,
                    f"model: {source!r} takes {loaded.observation_size} observations and gives "
                    f"{loaded.action_size} actions; the served policy {previous.observation_size} "
                    f"and {previous.action_size} (start a new server for another plant)",
                )
            install(loaded)  # one assignment: the next batch uses the new policy
            if settings.tune_gc:
                gc.freeze()
        return {
            "previous": previous.version,
            "version": loaded.version,
            "source": source,
            "seconds": time.perf_counter() - started,
        }

    @app.get("/healthz", tags=["operations"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["operations"])
    async def readyz() -> Response:
        loaded = state["policy"]
        if loaded is None or state["batcher"] is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        return JSONResponse({"status": "ready", "version": loaded.version})

    @app.get("/metrics", tags=["operations"])
    async def prometheus() -> Response:
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        detail = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
            for e in error.errors()
        ]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        log.exception("unexpected error on %s", request.url.path)
        return JSONResponse({"detail": "internal error; see the server log"}, status_code=500)

    return app


_ACT_ROUTES = ("/v1/act", "/v1/act/batch")


def _json(content: Any) -> Response:
    """A JSON response written by orjson (NaN and infinity become null); the route's
    ``response_model`` documents it in the OpenAPI schema."""
    return Response(orjson.dumps(content), media_type="application/json")


class _LimitsAndMetrics:
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
