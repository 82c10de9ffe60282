"""What the routes depend on: the serving state and ``Annotated`` dependency aliases.

One :class:`ServingState` per app, on ``app.state.serving``, holds everything requests
share: the settings, the loaded policy (swapped whole by a reload), the safety monitor and
audit log built for it, the micro-batcher, the metrics and the API keys. Routes never
reach for it through globals or closures; they declare what they need::

    @router.get("/v1/policy")
    async def policy_info(_: ActKeyDep, policy: PolicyDep, serving: ServingDep): ...

so a test can replace any piece with ``app.dependency_overrides[get_policy] = ...``.

Every dependency is ``async``: FastAPI runs a plain ``def`` dependency on a worker thread,
a hop that costs more than the work it does here.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Mapping
from typing import Annotated, Any

import numpy as np
from fastapi import Depends, HTTPException, Request

from neorl_industrial.integration.deployment.batcher import MicroBatcher
from neorl_industrial.integration.deployment.metrics import ServerMetrics
from neorl_industrial.integration.deployment.policy import LoadedPolicy, padded_sizes
from neorl_industrial.integration.deployment.settings import ServerSettings
from neorl_industrial.integration.safety import AuditLog, SafetyMonitor

__all__ = [
    "ActKeyDep",
    "AdminKeyDep",
    "MetricsDep",
    "PolicyDep",
    "ServingDep",
    "ServingState",
    "SettingsDep",
    "get_metrics",
    "get_policy",
    "get_serving",
    "get_settings",
    "require_act_key",
    "require_admin_key",
]


class ServingState:
    """The state one server shares across requests.

    Args:
        settings: the server's settings.
        keys: every API key with its role (:meth:`ServerSettings.keys`).
        policy: an already loaded policy (tests); otherwise the lifespan installs one.
    """

    def __init__(
        self, settings: ServerSettings, keys: Mapping[str, str], policy: LoadedPolicy | None
    ) -> None:
        self.settings = settings
        self.metrics = ServerMetrics()
        self.batch_sizes = padded_sizes(settings.max_batch, settings.batch_sizes)
        self.policy = policy
        self.monitor: SafetyMonitor | None = None
        self.audit: AuditLog | None = None
        self.batcher: MicroBatcher | None = None
        self.reload_lock = asyncio.Lock()
        self._keys = [(key.encode(), role) for key, role in keys.items()]

    @property
    def ready(self) -> bool:
        """A policy is installed and the batcher is running."""
        return self.policy is not None and self.batcher is not None

    def install(self, loaded: LoadedPolicy) -> None:
        """Serves ``loaded`` from the next batch on, with a fresh monitor and audit log."""
        self.policy = loaded
        self.monitor = SafetyMonitor(loaded.names)
        self.metrics.policy_loaded(loaded.version, loaded.source)
        settings = self.settings
        if settings.audit_log is not None:
            previous = self.audit
            self.audit = AuditLog(
                settings.audit_log,
                policy_version=loaded.version,
                fsync=settings.audit_fsync,
                max_bytes=settings.audit_max_bytes,
                backups=settings.audit_backups,
            )
            if previous is not None:
                previous.close()

    def predict(self, observations: np.ndarray, prev: np.ndarray | None) -> Any:
        """The batcher's call (on its worker thread): the policy installed when it runs."""
        return self.policy.artifact.predict(observations, prev)

    async def decide(self, scope: dict, observations: np.ndarray, prev: np.ndarray | None) -> Any:
        """The decision for these rows, micro-batched with concurrent requests."""
        self.metrics.submitted(scope)
        return await self.batcher.submit(observations, prev)

    def record(
        self, loaded: LoadedPolicy, observations: np.ndarray, decision: Any, ids: list[str]
    ) -> None:
        """Counts a decision in the monitor and metrics; writes its overrides to the audit."""
        self.monitor.observe(decision, policy_version=loaded.version)
        self.metrics.decisions(decision)
        audit = self.audit
        if audit is not None and bool(decision.overridden.any()):
            audit.write_overrides(
                observations, decision.proposed, decision.action, decision, loaded.names, ids
            )

    def role_of(self, headers: Mapping[str, str]) -> str:
        """The role of the request's API key (``admin`` when auth is off).

        Raises:
            HTTPException: 401 for a missing or unknown key.
        """
        header = headers.get("authorization", "")
        given = header[7:].strip() if header.lower().startswith("bearer ") else ""
        given = given or headers.get("x-api-key", "")
        if not self.settings.auth:
            return "admin"
        if not given:
            raise HTTPException(
                401, "missing API key (Authorization: Bearer <key> or X-API-Key)",
                headers={"WWW-Authenticate": "Bearer"},
            )  # fmt: skip
        candidate = given.encode()
        found = None
        for key, role in self._keys:  # every key compared, in constant time each
            if hmac.compare_digest(candidate, key):
                found = role
        if found is None:
            raise HTTPException(401, "invalid API key", headers={"WWW-Authenticate": "Bearer"})
        return found

    def close(self) -> None:
        if self.audit is not None:
            self.audit.close()


async def get_serving(request: Request) -> ServingState:
    return request.app.state.serving


ServingDep = Annotated[ServingState, Depends(get_serving)]


async def get_settings(serving: ServingDep) -> ServerSettings:
    return serving.settings


SettingsDep = Annotated[ServerSettings, Depends(get_settings)]


async def get_metrics(serving: ServingDep) -> ServerMetrics:
    return serving.metrics


MetricsDep = Annotated[ServerMetrics, Depends(get_metrics)]


async def get_policy(serving: ServingDep) -> LoadedPolicy:
    """The currently loaded, compiled policy; 503 until the lifespan has installed one."""
    if not serving.ready:
        raise HTTPException(503, "no policy loaded yet")
    return serving.policy


PolicyDep = Annotated[LoadedPolicy, Depends(get_policy)]


async def require_act_key(request: Request, serving: ServingDep) -> str:
    """The role of a key that may act (either role); 401 without one."""
    return serving.role_of(request.headers)


ActKeyDep = Annotated[str, Depends(require_act_key)]


async def require_admin_key(role: ActKeyDep) -> str:
    """An admin key's role; 403 for a key that may only act."""
    if role != "admin":
        raise HTTPException(403, "this key may act but not administer; use an admin key")
    return role


AdminKeyDep = Annotated[str, Depends(require_admin_key)]
