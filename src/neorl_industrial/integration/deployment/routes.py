"""The endpoints of the policy server, as one router.

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

Lengths that depend on the policy (observation and action sizes, rows per batch), names
given for ``/v1/act``'s observation and previous action, and previous actions outside the
action's bounds are checked here, after the schemas, with a 422 in the same shape as
pydantic's that names the field, row and element.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import difflib
import gc
import itertools
import logging
import os
import re
import time
import uuid
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from neorl_industrial.core.safety import TOLERANCE
from neorl_industrial.integration.deployment.deps import (
    ActKeyDep,
    AdminKeyDep,
    MetricsDep,
    PolicyDep,
    ServingDep,
    SettingsDep,
)
from neorl_industrial.integration.deployment.middleware import OrjsonRoute
from neorl_industrial.integration.deployment.policy import load_policy_source
from neorl_industrial.integration.deployment.schemas import (
    ActRequest,
    ActResponse,
    BatchRequest,
    BatchResponse,
    ReloadRequest,
)
from neorl_industrial.integration.safety import AuditLogError
from neorl_industrial.wrappers.agents.artifact import STATUS_BITS
from neorl_industrial.wrappers.agents.readings import decision_inputs

__all__ = ["orjson_response", "router"]

log = logging.getLogger("neorl_industrial.serve")

router = APIRouter(route_class=OrjsonRoute)  # bodies parsed by orjson

_FLAGS = tuple(STATUS_BITS)  # the decision's flags, in the artifact's order


@router.post("/v1/act", response_model=ActResponse, tags=["policy"])
async def act(
    body: ActRequest, request: Request, _: ActKeyDep, policy: PolicyDep, serving: ServingDep
) -> Any:
    observation = body.observation
    if isinstance(observation, dict):
        observation = _by_name(observation, _spec(policy).observation_index, "observation")
    observations = _check_rows(
        [observation],
        policy.observation_size,
        "observation",
        "one per observation feature",
        single=True,
    )
    prev = None
    if body.prev_action is not None:
        spec = _spec(policy)
        given = body.prev_action
        named = isinstance(given, dict)
        if named:
            given = _by_name(given, spec.action_index, "prev_action")
        prev = _check_rows([given], policy.action_size, "prev_action", "one per action", True)
        _check_bounds(prev, spec, "prev_action", single=True, named=named)
    observations, prev = _readings(policy, observations, prev, "observation")
    rid = _request_id(request.headers.get("x-request-id"), body.request_id)
    decision = await _decide(serving, request.scope, observations, prev, "observation")
    return orjson_response(_answer_one(serving, policy, observations, decision, rid, _key(request)))


def _answer_one(
    serving: Any,
    policy: Any,
    observations: np.ndarray,
    decision: Any,
    rid: str,
    key: str | None,
) -> dict[str, Any]:
    """``/v1/act``'s answer, once the decision is recorded in the monitor, metrics and
    audit (the route's and :class:`ActFastPath`'s)."""
    serving.record(policy, observations, decision, [rid], key)
    return {
        "action": decision.action.tolist()[0],
        "proposed": decision.proposed.tolist()[0],
        "report": _reports(decision)[0],
        "request_id": rid,
        "policy_version": policy.version,
    }


@router.post("/v1/act/batch", response_model=BatchResponse, tags=["policy"])
async def act_batch(
    body: BatchRequest, request: Request, _: ActKeyDep, policy: PolicyDep, serving: ServingDep
) -> Any:
    max_batch = serving.settings.max_batch
    if len(body.observations) > max_batch:
        raise _unprocessable(
            ("observations",),
            f"at most {max_batch} observations per request, got {len(body.observations)}",
        )
    observations = _check_rows(
        body.observations,
        policy.observation_size,
        "observations",
        "one per observation feature",
    )
    prev = None
    if body.prev_actions is not None:
        if len(body.prev_actions) != len(body.observations):
            raise _unprocessable(
                ("prev_actions",),
                f"expected one previous action per observation ({len(body.observations)}), "
                f"got {len(body.prev_actions)}",
            )
        prev = _check_rows(body.prev_actions, policy.action_size, "prev_actions", "one per action")
        _check_bounds(prev, _spec(policy), "prev_actions")
    observations, prev = _readings(policy, observations, prev, "observations")
    rid = _request_id(request.headers.get("x-request-id"), body.request_id)
    decision = await _decide(serving, request.scope, observations, prev, "observations")
    ids = [f"{rid}/{row}" for row in range(len(observations))]
    serving.record(policy, observations, decision, ids, _key(request))
    return orjson_response(
        {
            "actions": decision.action.tolist(),
            "proposed": decision.proposed.tolist(),
            "reports": _reports(decision),
            "request_id": rid,
            "policy_version": policy.version,
        }
    )


@router.get("/v1/policy", tags=["policy"])
async def policy_info(_: ActKeyDep, policy: PolicyDep, serving: ServingDep) -> dict[str, Any]:
    audit = serving.audit
    return {
        **policy.describe(),
        "safety": serving.monitor.summary(),
        "audit": None if audit is None else audit.stats(),
    }


@router.post("/v1/admin/reload", tags=["admin"])
async def reload(
    _: AdminKeyDep,
    serving: ServingDep,
    settings: SettingsDep,
    body: ReloadRequest | None = None,
) -> dict[str, Any]:
    # Not a PolicyDep: FastAPI keeps dependency values until the response is sent, and
    # that reference would keep the replaced policy alive past the collection below.
    if not serving.ready:
        raise HTTPException(503, "no policy loaded yet")
    source = (body.model if body else None) or serving.policy.source
    async with serving.reload_lock:
        previous = serving.policy  # another reload may have swapped it while this one waited
        started = time.perf_counter()
        try:
            loaded = await asyncio.to_thread(
                load_policy_source,
                source,
                settings.tracking_uri,
                serving.batch_sizes,
                trust=settings.trust(),
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
        try:
            serving.install(loaded)  # all or nothing: the next batch uses the new policy
        except (AuditLogError, OSError) as error:
            raise HTTPException(
                503,
                f"audit log: {error}; reload refused, {previous.version} keeps serving "
                "(restart the server once the audit log is sorted out)",
            ) from None
        answer = {
            "previous": previous.version,
            "version": loaded.version,
            "source": source,
            "seconds": time.perf_counter() - started,
        }
        del previous, loaded
        # A batch already running on the policy thread still uses the replaced policy:
        # wait for it, so the collection below frees it now and not at the next reload.
        await serving.batcher.barrier()
        _release_garbage(settings.tune_gc)
        # Requests that began before the swap hold the replaced policy until they answer
        # (milliseconds); sweep again once they have, or it waits for the next reload.
        asyncio.get_running_loop().call_later(
            RELEASE_AGAIN_AFTER_S, _release_garbage, settings.tune_gc
        )
    return answer


#: Seconds after a reload's swap at which the replaced policy is collected a second time.
RELEASE_AGAIN_AFTER_S = 1.0


def _release_garbage(tune_gc: bool) -> None:
    """Frees the replaced policy: its artifact and jitted functions refer to each other,
    so only the cyclic collector frees them (and the compiled executables and buffers
    they hold). With ``tune_gc`` the startup objects were frozen into the permanent
    generation, where the first policy would stay forever: unfreeze, collect, freeze."""
    if tune_gc:
        gc.unfreeze()
    gc.collect()
    _clear_staging_caches()
    if tune_gc:
        gc.freeze()
    _trim_heap()


def _clear_staging_caches() -> None:
    # JAX's tracing caches (LRU, bounded in entries, not bytes) keep every loaded policy's
    # deserialized module alive: abstract evaluations of the exported call, the jaxprs
    # traced for each batch size. The served policy's compiled executables live in its
    # own jitted function's cache, which this leaves alone, so nothing is traced or
    # compiled again for the shapes it was warmed up for.
    from jax._src import util as jax_util

    with contextlib.suppress(AttributeError):  # a JAX without it: the caches stay bounded
        jax_util.clear_all_caches()


def _trim_heap() -> None:
    # glibc keeps freed arenas mapped; the executables of a replaced policy are large,
    # scattered frees, so without a trim the RSS keeps them after they are freed.
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL(None).malloc_trim(0)


@router.get("/healthz", tags=["operations"])
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", tags=["operations"])
async def readyz(serving: ServingDep) -> Response:
    if not serving.ready:
        return JSONResponse({"status": "loading"}, status_code=503)
    return JSONResponse({"status": "ready", "version": serving.policy.version})


@router.get("/metrics", tags=["operations"])
async def prometheus(metrics: MetricsDep) -> Response:
    body, content_type = metrics.exposition()
    return Response(body, media_type=content_type)


def orjson_response(content: Any) -> Response:
    """A JSON response written by orjson (NaN and infinity become null); the route's
    ``response_model`` documents it in the OpenAPI schema."""
    return Response(orjson.dumps(content), media_type="application/json")


def _unprocessable(field: tuple[Any, ...], message: str) -> HTTPException:
    return HTTPException(422, [{"loc": ["body", *field], "msg": message, "type": "value_error"}])


@dataclasses.dataclass(frozen=True)
class _Spec:
    """What the input checks need of a policy, computed once per loaded policy."""

    observation_index: dict[str, int]
    observation_names: tuple[str, ...]
    action_index: dict[str, int]
    action_names: tuple[str, ...]
    low: np.ndarray
    high: np.ndarray
    # The bounds widened by the shield's tolerance: an applied action on a bound, sent
    # back as JSON, may land a rounding step outside it.
    low_tolerated: np.ndarray
    high_tolerated: np.ndarray
    #: ``(low, high)`` tolerated, per action, as Python numbers: the fast path checks a
    #: previous action of a few values without a NumPy call.
    tolerated: tuple[tuple[float, float], ...]

    def within_bounds(self, values: list[float]) -> bool:
        """Whether every previous action in ``values`` (float32 values) lies within its
        tolerated bounds: :func:`_check_bounds`' test, on Python numbers."""
        for value, (low, high) in zip(values, self.tolerated, strict=True):
            if value < low or value > high:
                return False
        return True


# Weak keys: a replaced policy is freed by a reload, not kept alive by this cache.
_SPECS: weakref.WeakKeyDictionary[Any, _Spec] = weakref.WeakKeyDictionary()


def _spec(policy: Any) -> _Spec:
    spec = _SPECS.get(policy)
    if spec is None:
        artifact = policy.artifact
        low = np.asarray(artifact.action_low, np.float64)
        high = np.asarray(artifact.action_high, np.float64)
        slack = TOLERANCE * np.maximum(1.0, np.maximum(np.abs(low), np.abs(high)))
        spec = _Spec(
            observation_index={n: i for i, n in enumerate(artifact.observation_names)},
            observation_names=tuple(artifact.observation_names),
            action_index={n: i for i, n in enumerate(artifact.action_names)},
            action_names=tuple(artifact.action_names),
            low=low,
            high=high,
            low_tolerated=low - slack,
            high_tolerated=high + slack,
            tolerated=tuple(zip((low - slack).tolist(), (high + slack).tolist(), strict=True)),
        )
        _SPECS[policy] = spec
    return spec


def _by_name(values: Mapping[str, float], index: Mapping[str, int], field: str) -> list[float]:
    """``{name: value}`` in the policy's order; every name required, none unknown."""
    unknown = [name for name in values if name not in index]
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(name, list(index), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        more = f" ({len(unknown)} unknown names in all)" if len(unknown) > 1 else ""
        raise _unprocessable((field, name), f"unknown name {name!r}{hint}{more}")
    if len(values) != len(index):
        missing = [name for name in index if name not in values]
        shown = ", ".join(repr(name) for name in missing[:8])
        shown += f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        raise _unprocessable((field,), f"missing {len(missing)} of the {len(index)} names: {shown}")
    ordered = [0.0] * len(index)
    for name, value in values.items():
        ordered[index[name]] = value
    return ordered


def _check_bounds(
    prev: np.ndarray, spec: _Spec, field: str, single: bool = False, named: bool = False
) -> None:
    """A 422 naming the first previous action outside the action's bounds."""
    outside = (prev < spec.low_tolerated) | (prev > spec.high_tolerated)
    if not outside.any():
        return
    row, column = (int(i) for i in np.argwhere(outside)[0])
    name = spec.action_names[column]
    where = (field, name if named else column) if single else (field, row, column)
    raise _unprocessable(
        where,
        f"{float(prev[row, column])!r} is outside the bounds "
        f"[{spec.low[column]:g}, {spec.high[column]:g}] of {name!r}; the action applied at "
        "the previous step is within them",
    )


def _key(request: Request) -> str | None:
    """The caller's key fingerprint (``require_act_key`` set it; None without auth)."""
    return getattr(request.state, "key", None)


def _check_rows(
    values: list[list[float]], width: int, field: str, what: str, single: bool = False
) -> np.ndarray:
    for row, value in enumerate(values):
        if len(value) != width:
            where = (field,) if single else (field, row)
            raise _unprocessable(where, f"expected {width} values ({what}), got {len(value)}")
    return np.asarray(values, np.float32).reshape(len(values), width)


def _readings(
    policy: Any, observations: np.ndarray, prev: np.ndarray | None, field: str
) -> tuple[np.ndarray, np.ndarray | None]:
    """The rows as every entry point hands them to a policy
    (:func:`~neorl_industrial.wrappers.agents.readings.decision_inputs`: subnormals read as
    zero; non-finite values, which the schemas refuse first, refused); ``prev`` stays None
    when unknown, so the batcher groups it with the other unknown ones."""
    spec = _spec(policy)
    try:
        observations, known, _ = decision_inputs(
            observations, prev, spec.observation_names, spec.action_names
        )
    except ValueError as error:
        raise _unprocessable((field,), str(error)) from None
    return observations, None if prev is None else known


async def _decide(
    serving: Any, scope: dict, observations: np.ndarray, prev: np.ndarray | None, field: str
) -> Any:
    # The batcher isolates a request whose rows break the policy call; that request (and
    # only it) gets a 422 naming its field rather than a 500.
    try:
        return await serving.decide(scope, observations, prev)
    except RuntimeError as error:
        if "shutting down" in str(error):
            raise HTTPException(503, str(error)) from None
        raise _unprocessable((field,), f"the policy cannot decide this input: {error}") from None
    except (ValueError, ArithmeticError, FloatingPointError) as error:
        raise _unprocessable((field,), f"the policy cannot decide this input: {error}") from None


# The body's request_id is checked by its schema; the header by the same rule here. An id
# that breaks it is replaced by a generated one, never written to the audit as given.
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/\-]{1,128}")


def _request_id(header: str | None, given: str | None) -> str:
    """The body's id, else the ``X-Request-ID`` header's where it keeps the rule, else a
    new one: 32 hex digits, this process's random half and a count (unique without a
    random draw per request, which costs a system call)."""
    if given:
        return given
    if header and _REQUEST_ID.fullmatch(header):
        return header
    return f"{_ID_PREFIX}{next(_ID_COUNT):016x}"


def _new_id_prefix() -> None:
    global _ID_PREFIX, _ID_COUNT
    _ID_PREFIX, _ID_COUNT = uuid.uuid4().hex[:16], itertools.count()


_new_id_prefix()
os.register_at_fork(after_in_child=_new_id_prefix)  # a forked worker counts on its own


def _reports(decision: Any) -> list[dict[str, Any]]:
    """Each row's report, for :func:`orjson_response` (which writes the infinite margin of
    an inactive state-conditional constraint, and NaN, as null)."""
    names = decision.constraint_names
    margins = decision.margin.tolist()
    violated = decision.violated
    statuses = decision.status.tolist()
    flags = None  # each flag's column, read once a row has a status bit set
    reports = []
    for i, status in enumerate(statuses):
        if status:
            if flags is None:
                flags = [(name, getattr(decision, name).tolist()) for name in _FLAGS]
            report = {name: values[i] for name, values in flags}
        else:  # every flag is a bit of the status: none set, every flag false
            report = dict(_NO_FLAGS)
        report["status"] = status
        report["violated"] = list(violated[i])
        report["margin"] = dict(zip(names, margins[i], strict=True))
        reports.append(report)
    # What the applied action still breaks, where the policy's shield reports it.
    applied_margin = getattr(decision, "applied_margin", None)
    if applied_margin is not None:
        broken = ~(np.asarray(applied_margin) >= -TOLERANCE)
        if not broken.any():  # the common case
            for report in reports:
                report["violated_after"] = []
            return reports
        labels = np.asarray(names, dtype=object)
        for report, row in zip(reports, broken.reshape(len(reports), -1), strict=True):
            report["violated_after"] = labels[row].tolist()
    return reports


_NO_FLAGS = dict.fromkeys(_FLAGS, False)
