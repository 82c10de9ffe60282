"""Request and response bodies of the policy server.

Requests refuse unknown fields, non-finite numbers, numbers outside float32, and strings
or booleans given as numbers, so a 422 names the field that is
wrong. The responses document the OpenAPI schema; the act routes write them with orjson
(:func:`.routes.orjson_response`) rather than through these models.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

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


class ActRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    observation: list[Finite] = Field(description="one value per observation feature")
    prev_action: list[Finite] | None = Field(
        default=None,
        description="the action applied at the previous step, in plant units; left out: "
        "unknown, and rate limits cannot apply",
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
    invalid_observation: bool = Field(
        description="a reading outside the task's physical bounds (or not a number): the "
        "fallback was sent"
    )
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
