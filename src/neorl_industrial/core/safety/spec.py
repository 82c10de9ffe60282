"""Constraint specifications: validated data (pydantic) compiled into PyTrees. Files (YAML)
are read and written by ``neorl_industrial.wrappers.constraint_files``.

A :class:`ConstraintSpec` names features and actions; :meth:`ConstraintSpec.compile`
resolves those names against an environment's ``observation_names`` and ``action_names``
and returns :class:`~neorl_industrial.core.safety.constraints.CompiledConstraints`, a
PyTree of arrays that the shield evaluates under ``jit`` and ``vmap``.

Hard constraints (the shield enforces them on every action):

* ``action_bounds``: ``{action: [low, high]}``;
* ``rate_limits``: ``{action: max_change}``, ``|a_t - a_{t-1}| <= max_change``;
* ``state_limits``: while an observed feature is above (or below) a threshold, an action
  may not exceed ``max`` (or fall below ``min``);
* ``linear``: ``sum_i c_i * obs_i + sum_j d_j * action_j <= bound``.

Every rate limit, state limit and linear constraint has a ``priority`` (a whole number,
larger wins; by default interlocks, i.e. state limits, 300, linear constraints 200, rate
limits 100). When no action keeps them all, the shield keeps the highest-priority ones
that can be kept; the action bounds always hold.

The ``fallback`` replaces an action that cannot be repaired by projection: hold the
previous setting, a constant, or a registered safe controller. ``costs`` are the soft
constraints a safe agent is trained against: a cost of 1 per step whose next observed
feature is above (or below) a threshold, with an episode ``cost_limit``.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from neorl_industrial.core.safety.constraints import DEFAULT_PRIORITY, CompiledConstraints
from neorl_industrial.core.safety.controllers import get_safe_controller
from neorl_industrial.core.utils.limits import (
    MAX_MAGNITUDE,
    check_coefficient,
    check_magnitude,
    check_text,
)
from neorl_industrial.core.utils.messages import quote, validation_lines

__all__ = [
    "ActionBound",
    "ConstraintSpec",
    "ConstraintSpecError",
    "CostSpec",
    "FallbackSpec",
    "LinearConstraint",
    "RateLimit",
    "StateCondition",
    "StateLimit",
]

# A priority: a whole number >= 0 (not a bool, not a float); None: the kind's default.
_PRIORITY = Field(None, ge=0, strict=True, description="larger wins; None: the default")


class ConstraintSpecError(ValueError):
    """A constraint specification that cannot be used; the message names the field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _finite(value: float, what: str) -> float:
    """``value`` if finite and within ±1e12: a limit that float32 (the shield's) turns
    into infinity, or a difference of two into NaN, would switch its rule off."""
    if not math.isfinite(value):
        raise ValueError(
            f"{what} must be a finite number in [{-MAX_MAGNITUDE:g}, {MAX_MAGNITUDE:g}], "
            f"got {value}"
        )
    return check_magnitude(value, what)


class ActionBound(_Model):
    """``[low, high]`` of one action."""

    low: float
    high: float

    @model_validator(mode="before")
    @classmethod
    def _from_pair(cls, value: Any) -> Any:
        if isinstance(value, Sequence) and not isinstance(value, str):
            if len(value) != 2:
                raise ValueError(f"expected [low, high], got {list(value)}")
            return {"low": value[0], "high": value[1]}
        return value

    @model_validator(mode="after")
    def _ordered(self) -> ActionBound:
        _finite(self.low, "low")
        _finite(self.high, "high")
        if self.low > self.high:
            raise ValueError(f"low {self.low} is above high {self.high}")
        return self


class StateCondition(_Model):
    """``feature > above`` or ``feature < below`` (exactly one of the two)."""

    feature: str
    above: float | None = None
    below: float | None = None

    @model_validator(mode="after")
    def _one_threshold(self) -> StateCondition:
        if (self.above is None) == (self.below is None):
            raise ValueError("give exactly one of 'above' or 'below'")
        _finite(self.threshold, "the threshold")
        return self

    @property
    def threshold(self) -> float:
        return self.above if self.above is not None else self.below  # type: ignore[return-value]


class RateLimit(_Model):
    """``|a_t - a_{t-1}| <= max_change``; a bare number is shorthand for
    ``{max_change: <number>}``."""

    max_change: float
    priority: int | None = _PRIORITY

    @model_validator(mode="before")
    @classmethod
    def _from_number(cls, value: Any) -> Any:
        return value if isinstance(value, Mapping | RateLimit) else {"max_change": value}

    @model_validator(mode="after")
    def _non_negative(self) -> RateLimit:
        if not (math.isfinite(self.max_change) and 0.0 <= self.max_change <= MAX_MAGNITUDE):
            raise ValueError(
                f"must be a finite number in [0, {MAX_MAGNITUDE:g}], got {self.max_change}"
            )
        return self


class StateLimit(_Model):
    """While ``when`` holds, ``action`` stays within ``[min, max]``."""

    name: str = Field(min_length=1)
    when: StateCondition
    action: str
    max: float | None = None
    min: float | None = None
    priority: int | None = _PRIORITY

    @model_validator(mode="after")
    def _some_limit(self) -> StateLimit:
        if self.max is None and self.min is None:
            raise ValueError("give 'max', 'min' or both")
        for value, what in ((self.max, "max"), (self.min, "min")):
            if value is not None:
                _finite(value, what)
        if self.max is not None and self.min is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        return self


class LinearConstraint(_Model):
    """``observation · obs + action · a <= bound`` with coefficients by name."""

    name: str = Field(min_length=1)
    observation: dict[str, float] = Field(default_factory=dict)
    action: dict[str, float]
    bound: float
    priority: int | None = _PRIORITY

    @model_validator(mode="after")
    def _useful(self) -> LinearConstraint:
        _finite(self.bound, "bound")
        for part in (self.observation, self.action):
            for key, value in part.items():
                _finite(value, f"coefficient of {quote(key)}")
                check_coefficient(value, f"coefficient of {quote(key)}")
        if not any(value != 0.0 for value in self.action.values()):
            raise ValueError("'action' needs at least one non-zero coefficient")
        return self


class FallbackSpec(_Model):
    """What replaces an action that projection cannot repair."""

    kind: Literal["hold_previous", "constant", "controller"] = "hold_previous"
    value: float | dict[str, float] | None = None
    controller: str | None = None

    @model_validator(mode="after")
    def _complete(self) -> FallbackSpec:
        if self.kind == "constant" and self.value is None:
            raise ValueError("a 'constant' fallback needs a 'value'")
        if self.kind != "constant" and self.value is not None:
            raise ValueError(f"'value' belongs to a 'constant' fallback, not {self.kind!r}")
        if self.kind == "controller" and not self.controller:
            raise ValueError("a 'controller' fallback needs the 'controller' name")
        if self.kind != "controller" and self.controller is not None:
            raise ValueError(f"'controller' belongs to a 'controller' fallback, not {self.kind!r}")
        values = self.value.values() if isinstance(self.value, dict) else [self.value]
        for value in values:
            if value is not None:
                _finite(value, "value")
        return self


class CostSpec(_Model):
    """A per-step cost of 1 while the next observation's ``feature`` passes a threshold."""

    name: str = Field(min_length=1)
    feature: str
    above: float | None = None
    below: float | None = None
    cost_limit: float = Field(ge=0.0)

    @model_validator(mode="after")
    def _one_threshold(self) -> CostSpec:
        if (self.above is None) == (self.below is None):
            raise ValueError("give exactly one of 'above' or 'below'")
        _finite(self.threshold, "the threshold")
        _finite(self.cost_limit, "cost_limit")
        check_text(self.name, "name")
        return self

    @property
    def threshold(self) -> float:
        return self.above if self.above is not None else self.below  # type: ignore[return-value]

    @property
    def definition(self) -> str:
        """The per-step definition as text (``fatigue > 60.0``)."""
        if self.above is not None:
            return f"{self.feature} > {float(self.above)}"
        return f"{self.feature} < {float(self.below)}"  # type: ignore[arg-type]


class ConstraintSpec(_Model):
    """A plant's constraints, as written by a safety engineer (see the module docstring)."""

    name: str = "constraints"
    description: str = ""
    action_bounds: dict[str, ActionBound] = Field(default_factory=dict)
    rate_limits: dict[str, RateLimit] = Field(default_factory=dict)
    state_limits: list[StateLimit] = Field(default_factory=list)
    linear: list[LinearConstraint] = Field(default_factory=list)
    fallback: FallbackSpec = Field(default_factory=FallbackSpec)
    costs: list[CostSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> ConstraintSpec:
        names = [item.name for item in (*self.state_limits, *self.linear)]
        for name in names:
            # Names are printed in reports, logs and audit records.
            check_text(name, f"constraint name {quote(name)}")
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"constraint names must be unique; repeated: {duplicates}")
        cost_names = [cost.name for cost in self.costs]
        repeated = sorted({name for name in cost_names if cost_names.count(name) > 1})
        if repeated:
            raise ValueError(f"cost names must be unique; repeated: {repeated}")
        return self

    # ----- loading and saving --------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Any, source: str = "constraint spec") -> ConstraintSpec:
        """Validates ``data``; errors name ``source`` and the field path."""
        if not isinstance(data, Mapping):
            raise ConstraintSpecError(
                f"{source}: expected a mapping of constraint kinds, got {type(data).__name__}"
            )
        try:
            return cls.model_validate(dict(data))
        except ValidationError as error:
            # One line however many errors: what a log line and the CLI's refusal hold.
            raise ConstraintSpecError("; ".join(validation_lines(error, cls, source))) from None

    def to_dict(self) -> dict[str, Any]:
        """Plain data that :meth:`from_dict` turns back into this spec."""
        data = self.model_dump(mode="json", exclude_none=True)
        data["action_bounds"] = {
            action: [bound.low, bound.high] for action, bound in self.action_bounds.items()
        }
        # A rate limit without its own priority as the bare number.
        data["rate_limits"] = {
            action: limit.max_change if limit.priority is None else data["rate_limits"][action]
            for action, limit in self.rate_limits.items()
        }
        return data

    @property
    def priorities(self) -> dict[str, int]:
        """Per rate limit, state limit and linear constraint (``hard_names``), its
        priority: the spec's, else its kind's default (larger wins)."""
        return {
            **{
                f"rate/{action}": _priority(limit.priority, "rate_limits")
                for action, limit in self.rate_limits.items()
            },
            **{
                limit.name: _priority(limit.priority, "state_limits") for limit in self.state_limits
            },
            **{
                constraint.name: _priority(constraint.priority, "linear")
                for constraint in self.linear
            },
        }

    @property
    def hard_names(self) -> tuple[str, ...]:
        """Names of the hard constraints, in the order of ``SafetyReport.violated``."""
        return (
            *(f"bounds/{action}" for action in self.action_bounds),
            *(f"rate/{action}" for action in self.rate_limits),
            *(limit.name for limit in self.state_limits),
            *(constraint.name for constraint in self.linear),
        )

    @property
    def cost_limits(self) -> dict[str, float]:
        return {cost.name: cost.cost_limit for cost in self.costs}

    # ----- compiling -----------------------------------------------------------------
    def compile(
        self,
        obs_size: int,
        action_size: int,
        observation_names: Sequence[str] | None = None,
        action_names: Sequence[str] | None = None,
        observation_bounds: tuple[Sequence[float], Sequence[float]] | None = None,
        data_bounds: tuple[Sequence[float], Sequence[float]] | None = None,
    ) -> Any:
        """The spec as :class:`CompiledConstraints` for an environment's spaces.

        Names are resolved against ``observation_names`` and ``action_names`` (by default
        ``observation_i`` and ``action_i``); an unknown name raises
        :class:`ConstraintSpecError` naming the field and the closest known names.
        ``observation_bounds`` ``(low, high)``, one number per feature (``±inf`` where
        unknown; default: all unknown), are the physical bounds the shield checks every
        observation against: an observation outside them, or not a number, in a feature
        with a finite bound sends the fallback, flagged ``invalid_observation``.
        ``data_bounds`` ``(low, high)``, the same way, is the range of the data the policy
        learnt from: an observation outside it is flagged ``out_of_distribution``, and the
        decision is the same.
        """
        observation_names = _names(observation_names, obs_size, "observation", "features")
        action_names = _names(action_names, action_size, "action", "actions")
        observation_low, observation_high = _observation_bounds(
            observation_bounds, obs_size, "observation_bounds"
        )
        data_low, data_high = _observation_bounds(data_bounds, obs_size, "data_bounds")
        feature = _Resolver(observation_names, "observation feature")
        act = _Resolver(action_names, "action")

        bound_index = [act(name, f"action_bounds.{name}") for name in self.action_bounds]
        rate_index = [act(name, f"rate_limits.{name}") for name in self.rate_limits]
        state_feature, state_action = [], []
        for i, limit in enumerate(self.state_limits):
            state_feature.append(feature(limit.when.feature, f"state_limits[{i}].when.feature"))
            state_action.append(act(limit.action, f"state_limits[{i}].action"))
        linear_obs, linear_act = self._linear_rows(feature, act, obs_size, action_size)
        fallback_value = self._fallback_value(act, action_size)
        cost_feature = [
            feature(cost.feature, f"costs[{i}].feature") for i, cost in enumerate(self.costs)
        ]
        inf = np.inf
        return CompiledConstraints(
            bound_index=tuple(bound_index),
            bound_low=np.asarray([b.low for b in self.action_bounds.values()], np.float32),
            bound_high=np.asarray([b.high for b in self.action_bounds.values()], np.float32),
            rate_index=tuple(rate_index),
            rate_limit=np.asarray(
                [limit.max_change for limit in self.rate_limits.values()], np.float32
            ),
            state_feature=tuple(state_feature),
            state_threshold=np.asarray(
                [limit.when.threshold for limit in self.state_limits], np.float32
            ),
            state_above=np.asarray(
                [limit.when.above is not None for limit in self.state_limits], bool
            ),
            state_action=tuple(state_action),
            state_low=np.asarray(
                [-inf if limit.min is None else limit.min for limit in self.state_limits],
                np.float32,
            ),
            state_high=np.asarray(
                [inf if limit.max is None else limit.max for limit in self.state_limits],
                np.float32,
            ),
            linear_obs=linear_obs,
            linear_act=linear_act,
            linear_bound=np.asarray([c.bound for c in self.linear], np.float32),
            observation_low=observation_low,
            observation_high=observation_high,
            data_low=data_low,
            data_high=data_high,
            fallback_value=fallback_value,
            cost_feature=tuple(cost_feature),
            linear_support=tuple(tuple(int(f) for f in np.flatnonzero(row)) for row in linear_obs),
            cost_threshold=np.asarray([cost.threshold for cost in self.costs], np.float32),
            cost_above=np.asarray([cost.above is not None for cost in self.costs], bool),
            cost_limit=np.asarray([cost.cost_limit for cost in self.costs], np.float32),
            names=self.hard_names,
            cost_names=tuple(cost.name for cost in self.costs),
            fallback_kind=self.fallback.kind,
            controller=self.fallback.controller,
            action_size=action_size,
            rate_priority=tuple(
                _priority(limit.priority, "rate_limits") for limit in self.rate_limits.values()
            ),
            state_priority=tuple(
                _priority(limit.priority, "state_limits") for limit in self.state_limits
            ),
            linear_priority=tuple(
                _priority(constraint.priority, "linear") for constraint in self.linear
            ),
            checks_data_range=data_bounds is not None,
        ).to_device()

    def _linear_rows(
        self, feature: _Resolver, act: _Resolver, obs_size: int, action_size: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """``linear``'s coefficients as ``[rules, obs_size]`` and ``[rules, action_size]``
        rows, every name resolved."""
        linear_obs = np.zeros((len(self.linear), obs_size), np.float32)
        linear_act = np.zeros((len(self.linear), action_size), np.float32)
        for i, constraint in enumerate(self.linear):
            for name, coefficient in constraint.observation.items():
                linear_obs[i, feature(name, f"linear[{i}].observation.{name}")] = coefficient
            for name, coefficient in constraint.action.items():
                linear_act[i, act(name, f"linear[{i}].action.{name}")] = coefficient
        return linear_obs, linear_act

    def _fallback_value(self, act: _Resolver, action_size: int) -> np.ndarray:
        """The constant fallback's action (zeros for another kind); a controller
        fallback's name is checked against the registry."""
        fallback_value = np.zeros((action_size,), np.float32)
        if self.fallback.kind == "constant":
            if isinstance(self.fallback.value, dict):
                for name, value in self.fallback.value.items():
                    fallback_value[act(name, f"fallback.value.{name}")] = value
            else:
                fallback_value[:] = self.fallback.value
        if self.fallback.kind == "controller":
            try:
                get_safe_controller(self.fallback.controller)
            except KeyError as error:
                raise ConstraintSpecError(f"fallback.controller: {error.args[0]}") from None
        return fallback_value


def _names(given: Sequence[str] | None, size: int, kind: str, what: str) -> tuple[str, ...]:
    """``given`` (``{kind}_i`` by default) as a tuple of ``size`` names."""
    names = tuple(given or (f"{kind}_{i}" for i in range(size)))
    if len(names) != size:
        raise ConstraintSpecError(f"{kind}_names: {len(names)} names for {size} {what}")
    return names


def _priority(given: int | None, kind: str) -> int:
    return DEFAULT_PRIORITY[kind] if given is None else given


def _observation_bounds(
    bounds: tuple[Sequence[float], Sequence[float]] | None, obs_size: int, field: str
) -> tuple[np.ndarray, np.ndarray]:
    """``(low, high)`` as float32 arrays of ``obs_size``; errors name the field.

    Rounded outwards to float32, so a feature exactly at its declared bound passes."""
    if bounds is None:
        return np.full(obs_size, -np.inf, np.float32), np.full(obs_size, np.inf, np.float32)
    try:
        low, high = bounds
        low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
    except (TypeError, ValueError):
        raise ConstraintSpecError(
            f"{field}: expected (low, high), one number per feature each"
        ) from None
    for values, what in ((low, "low"), (high, "high")):
        if values.shape != (obs_size,):
            raise ConstraintSpecError(
                f"{field}: {what} has shape {values.shape}, expected ({obs_size},)"
            )
        if np.isnan(values).any():
            raise ConstraintSpecError(
                f"{field}: {what} has NaN at features "
                f"{np.flatnonzero(np.isnan(values)).tolist()}; use ±inf for unknown"
            )
    above = np.flatnonzero(low > high)
    if above.size:
        raise ConstraintSpecError(f"{field}: low is above high at features {above.tolist()}")
    low32 = low.astype(np.float32)
    high32 = high.astype(np.float32)
    low32 = np.where(low32 > low, np.nextafter(low32, np.float32(-np.inf)), low32)
    high32 = np.where(high32 < high, np.nextafter(high32, np.float32(np.inf)), high32)
    return low32.astype(np.float32), high32.astype(np.float32)


class _Resolver:
    """Maps names to indices with errors that name the field and suggest close names."""

    def __init__(self, names: Sequence[str], what: str):
        self.names = tuple(names)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.what = what

    def __call__(self, name: str, field: str) -> int:
        if name in self.index:
            return self.index[name]
        # The field path holds the name as written: cut like any quoted value.
        field = field if len(field) <= 120 else f"{field[:120]}…"
        close = difflib.get_close_matches(name, self.names, n=3)
        hint = f"did you mean {close}?" if close else f"known: {list(self.names[:8])}"
        more = "" if close or len(self.names) <= 8 else f" (and {len(self.names) - 8} more)"
        raise ConstraintSpecError(f"{field}: unknown {self.what} {quote(name)}; {hint}{more}")
