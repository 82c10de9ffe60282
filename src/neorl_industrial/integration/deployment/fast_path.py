"""``POST /v1/act``'s common form (an observation, and a previous action, as lists of
numbers) answered without the framework's routing: :class:`ActFastPath`, an ASGI layer in
front of the app that hands every request it does not answer as it is to the route in
:mod:`~neorl_industrial.integration.deployment.routes`."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson
from fastapi import HTTPException

from neorl_industrial.integration.deployment.middleware import send_json
from neorl_industrial.integration.deployment.routes import (
    _REQUEST_ID,
    _answer_one,
    _decide,
    _readings,
    _request_id,
    _spec,
)
from neorl_industrial.wrappers.agents.readings import SMALLEST_NORMAL

__all__ = ["ActFastPath"]

log = logging.getLogger("neorl_industrial.serve")

_FLOAT32_MAX = float(np.finfo(np.float32).max)
_NUMBERS = frozenset({float, int})  # strict, as the schema: no bool, no str
#: Up to this many values a row is judged by Python's builtins, past it by NumPy.
_LOOP_MAX = 16
_ACT_FIELDS = frozenset({"observation", "prev_action", "request_id"})


class ActFastPath:
    """``POST /v1/act`` with its observation (and previous action) as lists, answered
    without the framework's routing, dependency solving and pydantic validation, which
    cost more than the shielded decision itself.

    The same checks as the route, in the same order: the caller's key
    (:meth:`ServingState.identify`), the body's fields, the values' JSON types (numbers,
    not booleans or strings), lengths, finiteness, float32's range and the previous
    action's bounds; then the same decision, monitor, metrics, audit record and answer.
    A request that does not pass every check as it is (a missing or wrong key, named
    values, a malformed body, any wrong value) is handed to the framework's route with
    its body untouched, which answers it, errors included, as it answers any request:
    the fast path never writes an error of its own for bad input.

    Off (everything through the route) while a test overrides dependencies, and when CORS
    is configured (its middleware sits between the client and the route).

    Args:
        app: the framework (the routes and their middleware).
        serving: the serving state.
        overrides: the app's ``dependency_overrides``.
        enabled: False: every request goes to ``app``.
    """

    def __init__(
        self, app: Any, serving: Any, overrides: Mapping[Any, Any], enabled: bool = True
    ) -> None:
        self.app = app
        self.serving = serving
        self.overrides = overrides
        self.enabled = enabled
        self.answered = 0  # requests answered here (the tests' and the profile's count)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        serving = self.serving
        if (
            scope["path"] != "/v1/act"
            or scope["method"] != "POST"
            or not self.enabled
            or self.overrides
            or not serving.ready
        ):
            await self.app(scope, receive, send)
            return
        content_type = authorization = api_key = request_id = None
        for name, value in scope["headers"]:  # the first of each, as Starlette reads them
            if name == b"content-type" and content_type is None:
                content_type = value
            elif name == b"authorization" and authorization is None:
                authorization = value.decode("latin-1")
            elif name == b"x-api-key" and api_key is None:
                api_key = value.decode("latin-1")
            elif name == b"x-request-id" and request_id is None:
                request_id = value.decode("latin-1")
        message = await receive()
        messages = [message]
        while message["type"] == "http.request" and message.get("more_body", False):
            message = await receive()
            messages.append(message)
        if message["type"] == "http.request":
            if len(messages) == 1:
                body = message.get("body", b"")
            else:
                body = b"".join(m.get("body", b"") for m in messages)
            try:
                request = self._checked(body, content_type, authorization, api_key)
            except Exception:  # anything unexpected: the route decides (and logs)
                request = None
            if request is not None:
                await self._answer(scope, send, request, request_id)
                return

        async def replay() -> dict:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    def _checked(
        self,
        body: bytes,
        content_type: bytes | None,
        authorization: str | None,
        api_key: str | None,
    ) -> tuple[Any, str | None, np.ndarray, np.ndarray | None, str | None] | None:
        """``(policy, key, observations, prev, request_id)`` for a request that passes
        every check; None for one the route must answer."""
        if content_type is not None and (
            content_type.split(b";", 1)[0].strip().lower() != b"application/json"
        ):
            return None
        serving = self.serving
        headers = {}
        if authorization is not None:
            headers["authorization"] = authorization
        if api_key is not None:
            headers["x-api-key"] = api_key
        try:
            _, key = serving.identify(headers)
        except HTTPException:
            return None
        if b"true" in body or b"false" in body:
            # A JSON boolean, which the schema refuses as a number (or a request id that
            # spells one, which the route answers as well).
            return None
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if type(data) is not dict or "observation" not in data or not data.keys() <= _ACT_FIELDS:
            return None
        policy = serving.policy
        observations, usual = _plain_row(data["observation"], policy.observation_size)
        if observations is None:
            return None
        prev = data.get("prev_action")
        if prev is not None:
            prev, prev_usual = _plain_row(prev, policy.action_size)
            if prev is None or not _spec(policy).within_bounds(prev.tolist()[0]):
                return None
            usual = usual and prev_usual
        if not usual:  # a zero or a subnormal value: read as every entry point reads them
            observations, prev = _readings(policy, observations, prev, "observation")
        rid = data.get("request_id")
        if rid is not None and (type(rid) is not str or not _REQUEST_ID.fullmatch(rid)):
            return None
        return policy, key, observations, prev, rid

    async def _answer(
        self, scope: dict, send: Any, request: tuple[Any, ...], header_id: str | None
    ) -> None:
        policy, key, observations, prev, given = request
        serving = self.serving
        rid = _request_id(header_id, given)
        try:
            decision = await _decide(serving, scope, observations, prev, "observation")
            status = 200
            content = _answer_one(serving, policy, observations, decision, rid, key)
        except HTTPException as error:  # as the framework's handler writes it
            status, content = error.status_code, {"detail": error.detail}
        except Exception:  # as the app's handler of unexpected errors answers
            log.exception("unexpected error on /v1/act")
            status, content = 500, {"detail": "internal error; see the server log"}
        self.answered += 1
        await send_json(send, status, orjson.dumps(content))


def _plain_row(values: Any, width: int) -> tuple[np.ndarray | None, bool]:
    """``[1, width]`` float32 of a JSON list of ``width`` numbers within float32, and
    whether every value is a normal float32 number (nonzero, not subnormal), which
    :func:`_readings` would hand on unchanged; ``(None, False)`` for anything else (the
    schema then says what is wrong). The caller has seen that the body writes no JSON
    boolean, which NumPy would read as a number.

    A few values are judged by Python's builtins, a longer list by a handful of NumPy
    calls over the whole row (Python's per-element passes cost more there)."""
    if type(values) is not list or len(values) != width:
        return None, False
    if width <= _LOOP_MAX:
        if not set(map(type, values)) <= _NUMBERS:
            return None, False
        read = values
        magnitudes = list(map(abs, values))
        high, low = max(magnitudes), min(magnitudes)
    else:
        # NumPy's own reading of the list: anything but numbers (a string, null, a
        # nested list) gives another kind of array, or none.
        try:
            read = np.asarray(values)
        except ValueError:
            return None, False
        if read.ndim != 1 or read.dtype.kind not in "fiu":
            return None, False
        read = read.astype(np.float64, copy=False)  # JSON integers as float64 reads them
        magnitudes = np.abs(read)
        high, low = np.maximum.reduce(magnitudes), np.minimum.reduce(magnitudes)
    # orjson reads no NaN or infinity (they are no JSON numbers) and a JSON integer too
    # large for 64 bits as a float: every magnitude is a finite number.
    if high > _FLOAT32_MAX:
        return None, False
    return np.array((read,), np.float32), bool(low >= SMALLEST_NORMAL)
