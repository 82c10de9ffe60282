"""Request and response bodies of the policy server.

Requests refuse unknown fields, non-finite numbers, numbers outside float32, and strings
or booleans given as numbers, so a 422 names the field that is wrong. ``/v1/act`` takes
its observation and previous action as a list in the policy's order or as a mapping of
name to value. The responses document the OpenAPI schema; the act routes write them with
orjson (:func:`.routes.orjson_response`) rather than through these models.
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    model_validator,
)
from pydantic_core import ValidationError as CoreValidationError

__all__ = [
    "ActRequest",
    "ActResponse",
    "BatchRequest",
    "BatchResponse",
    "ReloadRequest",
    "Report",
]

_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _within_float32(value: float) -> float:
    # Finite JSON that overflows float32 would become inf inside the batch: refused here,
    # at the edge, so the 422 names the element.
    if abs(value) > _FLOAT32_MAX:
        raise ValueError(f"{value!r} is outside float32 (|x| <= {_FLOAT32_MAX:.7g})")
    return value


# Strict: a string or a boolean is not a number (an int is).
Finite = Annotated[float, Field(strict=True, allow_inf_nan=False), AfterValidator(_within_float32)]
RequestId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:/\-]+$")]


def _form(value: Any) -> str:
    return "named" if isinstance(value, dict) else "ordered"


# A list in the policy's order, or {name: value}. The discriminator picks one form by the
# JSON type, so the array form costs one function call over a plain list.
Values = Annotated[
    Annotated[list[Finite], Tag("ordered")] | Annotated[dict[str, Finite], Tag("named")],
    Discriminator(_form),
]
_TAGS = ("ordered", "named")


class ActRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    observation: Values = Field(
        description="one value per observation feature: a list in the policy's order "
        "(GET /v1/policy), or {name: value} with every observation name"
    )
    prev_action: Values | None = Field(
        default=None,
        description="the action applied at the previous step, in plant units, as a list "
        "or {name: value}; within the action's bounds; left out: unknown, and rate limits "
        "cannot apply",
    )
    request_id: RequestId | None = None

    @model_validator(mode="wrap")
    @classmethod
    def _untagged(cls, data: Any, handler: Any) -> Any:
        # pydantic puts the form's tag into an error's location (observation.ordered.2);
        # the 422 names the field as the client wrote it (observation.2).
        try:
            return handler(data)
        except ValidationError as error:
            raise _without_tags(error) from None


def _without_tags(error: ValidationError) -> CoreValidationError:
    details = []
    for item in error.errors():
        loc = item["loc"]
        if len(loc) > 1 and loc[1] in _TAGS:
            loc = (loc[0], *loc[2:])
        detail = {"type": item["type"], "loc": loc, "input": item["input"]}
        if "ctx" in item:
            detail["ctx"] = item["ctx"]
        details.append(detail)
    return CoreValidationError.from_exception_data(error.title, details)


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
    invalid_observation: bool = Field(
        description="a reading outside the task's physical bounds (or not a number): the "
        "fallback was sent"
    )
    out_of_distribution: bool = Field(
        default=False,
        description="a reading outside the range of the data the policy learnt from (a "
        "flag only: the decision is the same; never set without the data's range)",
    )
    status: int
    violated: list[str]
    violated_after: list[str] | None = Field(
        default=None,
        description="hard constraints the applied action still breaks or cannot be shown "
        "to keep (absent: the policy's shield does not say)",
    )
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
