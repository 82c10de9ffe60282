"""What the routes depend on: the serving state and ``Annotated`` dependency aliases.

One :class:`ServingState` per app, on ``app.state.serving``, holds everything requests
share: the settings, the loaded policy (swapped whole by a reload), the safety monitor
built for it, the audit log (opened once, kept across reloads), the micro-batcher, the
metrics and the API keys. Routes never
reach for it through globals or closures; they declare what they need::

    @router.get("/v1/policy")
    async def policy_info(_: ActKeyDep, policy: PolicyDep, serving: ServingDep): ...

so a test can replace any piece with ``app.dependency_overrides[get_policy] = ...``.

Every dependency is ``async``: FastAPI runs a plain ``def`` dependency on a worker thread,
a hop that costs more than the work it does here.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import logging
from collections.abc import Mapping
from typing import Annotated, Any

import numpy as np
from fastapi import Depends, HTTPException, Request

from neorl_industrial.integration.deployment.batcher import MicroBatcher
from neorl_industrial.integration.deployment.metrics import ServerMetrics
from neorl_industrial.integration.deployment.policy import LoadedPolicy, padded_sizes
from neorl_industrial.integration.deployment.settings import ServerSettings, SettingsError
from neorl_industrial.integration.safety import AuditLog, SafetyMonitor

log = logging.getLogger("neorl_industrial.serve")

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
    "key_fingerprint",
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
        self._keys = [(key.encode(), role, key_fingerprint(key)) for key, role in keys.items()]
        if not settings.auth:
            log.warning(
                "auth is off (--no-auth / NEORL_SERVE_AUTH=false): anyone who reaches this "
                "server gets shielded actions without a key; reload is refused"
            )
        if settings.audit_key_rate > 0 and settings.audit_window_s <= 0:
            raise SettingsError(
                f"audit_key_rate: {settings.audit_key_rate:g} full records per key per second "
                "folds the rest into aggregate records, which needs audit_window_s > 0"
            )

    @property
    def ready(self) -> bool:
        """A policy is installed and the batcher is running."""
        return self.policy is not None and self.batcher is not None

    def install(self, loaded: LoadedPolicy) -> None:
        """Serves ``loaded`` from the next batch on, with a fresh monitor; all or nothing.

        The audit log is opened by the first install and kept by the next (records carry
        the version that decided them). Everything that can fail runs before the swap:
        opening the log, or checking that the open log can go on.

        Raises:
            AuditLogError: the audit log cannot be opened (another process holds it, its
                last record is corrupt) or can no longer be written; nothing changed.
            OSError: the audit log's file cannot be created; nothing changed.
        """
        settings = self.settings
        audit = self.audit
        if settings.audit_log is not None:
            if audit is None:
                audit = AuditLog(
                    settings.audit_log,
                    policy_version=loaded.version,
                    fsync=settings.audit_fsync,
                    max_bytes=settings.audit_max_bytes,
                    backups=settings.audit_backups,
                    window_s=settings.audit_window_s,
                    key_rate=settings.audit_key_rate,
                )
            else:
                audit.check()
        monitor = SafetyMonitor(loaded.names)
        # The swap: assignments only, nothing that can fail between them.
        self.audit, self.monitor, self.policy = audit, monitor, loaded
        self.metrics.policy_loaded(loaded.version, loaded.source)

    def predict(self, observations: np.ndarray, prev: np.ndarray | None) -> Any:
        """The batcher's call (on its worker thread): the policy installed when it runs.

        ``[rows, obs]`` and ``[rows, act]`` float32 rows the routes have checked (lengths,
        finite, within float32, previous actions within their bounds), so the artifact's
        own checks of :meth:`~PolicyArtifact.predict` are not run again; ``prev`` None:
        unknown (NaN, the shield leaves the rate limits out)."""
        policy = self.policy
        if prev is None:
            prev = _unknown(len(observations), policy.action_size)
        # The routes read every row with decision_inputs (subnormals already zero).
        return policy.artifact.decide_rows(observations, prev, read=True)

    async def decide(self, scope: dict, observations: np.ndarray, prev: np.ndarray | None) -> Any:
        """The decision for these rows, micro-batched with concurrent requests."""
        self.metrics.submitted(scope)
        return await self.batcher.submit(observations, prev)

    def record(
        self,
        loaded: LoadedPolicy,
        observations: np.ndarray,
        decision: Any,
        ids: list[str],
        key: str | None = None,
    ) -> None:
        """Counts a decision in the monitor and metrics; writes its overrides to the audit
        under the version that decided and the caller's key fingerprint."""
        self.monitor.observe(decision, policy_version=loaded.version)
        self.metrics.decisions(decision)
        audit = self.audit
        if audit is not None and bool(decision.overridden.any()):
            audit.write_overrides(
                observations,
                decision.proposed,
                decision.action,
                decision,
                loaded.names,
                ids,
                policy_version=loaded.version,
                key=key,
            )

    def role_of(self, headers: Mapping[str, str]) -> str:
        """The role of the request's API key (``act`` when auth is off).

        Raises:
            HTTPException: 401 for a missing or unknown key.
        """
        return self.identify(headers)[0]

    def identify(self, headers: Mapping[str, str]) -> tuple[str, str | None]:
        """The role and fingerprint of the request's API key (``("act", None)`` when
        auth is off: without keys the server acts for anyone and administers for no one).

        Raises:
            HTTPException: 401 for a missing or unknown key.
        """
        header = headers.get("authorization", "")
        given = header[7:].strip() if header.lower().startswith("bearer ") else ""
        given = given or headers.get("x-api-key", "")
        if not self.settings.auth:
            return "act", None
        if not given:
            raise HTTPException(
                401, "missing API key (Authorization: Bearer <key> or X-API-Key)",
                headers={"WWW-Authenticate": "Bearer"},
            )  # fmt: skip
        candidate = given.encode()
        found = None
        for key, role, fingerprint in self._keys:  # every key compared, in constant time each
            if hmac.compare_digest(candidate, key):
                found = role, fingerprint
        if found is None:
            raise HTTPException(401, "invalid API key", headers={"WWW-Authenticate": "Bearer"})
        return found

    def close(self) -> None:
        if self.audit is not None:
            self.audit.close()


@functools.lru_cache(maxsize=64)
def _unknown(rows: int, width: int) -> np.ndarray:
    """``[rows, width]`` NaN (previous actions unknown), read-only and shared: most
    requests send none."""
    unknown = np.full((rows, width), np.nan, np.float32)
    unknown.flags.writeable = False
    return unknown


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
    """The role of a key that may act (either role); 401 without one. The key's
    fingerprint goes on ``request.state.key`` for the audit log."""
    role, request.state.key = serving.identify(request.headers)
    return role


def key_fingerprint(key: str) -> str:
    """What the audit log writes for an API key: the first 16 hex digits of its SHA-256
    (keys are high-entropy secrets, so this names a key without revealing it)."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


ActKeyDep = Annotated[str, Depends(require_act_key)]


async def require_admin_key(role: ActKeyDep, serving: ServingDep) -> str:
    """An admin key's role; 403 for a key that may only act, and for everyone on a
    server without keys (anyone who reaches it could otherwise swap its policy)."""
    if not serving.settings.auth:
        raise HTTPException(
            403,
            "administration needs an admin API key and this server runs without keys "
            "(auth off); restart it with keys to reload, or to serve another policy",
        )
    if role != "admin":
        raise HTTPException(403, "this key may act but not administer; use an admin key")
    return role


AdminKeyDep = Annotated[str, Depends(require_admin_key)]
