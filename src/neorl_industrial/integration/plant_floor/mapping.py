"""The map file: which OPC UA node carries each of the task's observations, which node
the bridge writes each action to and which node reports the action actually applied, the
sampling period and what a fault does.

    task: ../mixing-tank/dataset.json   # optional: the dataset card or task file the map is for
    sampling_period: 10                 # seconds (default: the task's, i.e. the dataset card's)
    stale_after: 25                     # a value whose source timestamp is older is stale
    on_fault: fallback                  # or hand_back: stop writing, the operators keep control
    observations:
      level_m: {node: "ns=2;s=Tank.Level", unit: m}
    actions:
      valve_pct: {write: "ns=2;s=Tank.ValveSetpoint", applied: "ns=2;s=Tank.ValvePosition",
                  unit: "%"}

The file is untrusted input: it is validated whole (unknown keys are named, with the
closest known one), node ids are parsed as OPC UA node ids, and :func:`check_map`
compares it with the task before anything connects (every observation and action of the
task bound, nothing else, units equal where the task states them).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from neorl_industrial.core.utils.messages import quote, validation_lines
from neorl_industrial.integration.plant_floor.errors import (
    MapError,
    NodeIdError,
    UnitMismatchError,
    UnknownFeatureError,
)
from neorl_industrial.wrappers.hostio import YamlError, read_yaml

__all__ = ["ActionBinding", "ObservationBinding", "PlantMap", "check_map", "load_map"]

#: What a fault does when the map does not say.
ON_FAULT = ("fallback", "hand_back")


class ObservationBinding(BaseModel):
    """One observation: the node it is read from and its unit there."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str = Field(min_length=1, max_length=512)
    unit: str | None = Field(None, max_length=64)


class ActionBinding(BaseModel):
    """One action: the node the bridge writes (closed loop) and the node that reports the
    value actually applied (the operators' in shadow mode; the previous action)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    write: str = Field(min_length=1, max_length=512)
    applied: str = Field(min_length=1, max_length=512)
    unit: str | None = Field(None, max_length=64)


class PlantMap(BaseModel):
    """A validated map file (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The dataset card or task file the map is written for, relative to the map.
    task: str | None = None
    #: Seconds between decisions; ``None``: the task's sampling period.
    sampling_period: float | None = Field(None, gt=0.0, le=86400.0)
    #: Seconds after which a value's source timestamp is stale; ``None``: 2.5 periods.
    stale_after: float | None = Field(None, gt=0.0)
    #: Seconds a source timestamp may lie ahead of the bridge's clock (clock skew).
    clock_skew: float = Field(2.0, ge=0.0)
    #: ``fallback``: the shield's fallback replaces the action on a faulty tick;
    #: ``hand_back``: the bridge stops writing for good and the operators keep control.
    on_fault: Literal["fallback", "hand_back"] = "fallback"
    observations: dict[str, ObservationBinding] = Field(min_length=1)
    actions: dict[str, ActionBinding] = Field(min_length=1)

    @field_validator("observations", "actions")
    @classmethod
    def _names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if not name.strip() or len(name) > 256:
                raise ValueError(f"a feature name must be non-empty text, got {quote(name)}")
        return value

    def period(self, task_period: float | None, where: str) -> float:
        """The sampling period: the map's, else the task's.

        Raises:
            MapError: when neither states one.
        """
        period = self.sampling_period if self.sampling_period is not None else task_period
        if period is None:
            raise MapError(
                f"{where}: sampling_period: the map states none and the task has none (its "
                "dataset card names no sampling_period); state it in the map, in seconds"
            )
        return float(period)

    def stale_limit(self, period: float) -> float:
        return self.stale_after if self.stale_after is not None else 2.5 * period

    def digest(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()


def _check_node(node: str, field: str, where: str) -> None:
    from asyncua import ua

    try:
        ua.NodeId.from_string(node)
    except Exception as error:  # asyncua raises several kinds for a malformed id
        raise NodeIdError(
            f"{where}: {field}: {quote(node)} is not an OPC UA node id "
            f"(e.g. ns=2;s=Tank.Level or ns=2;i=1001): {error}"
        ) from None


def load_map(path: str | Path) -> PlantMap:
    """Reads and validates the map at ``path`` (YAML or JSON).

    Raises:
        MapError: naming the file and every field that is wrong.
        NodeIdError: for a node id that is not OPC UA node-id syntax, or one node bound
            to two things the bridge writes.
    """
    path = Path(path)
    try:
        data = read_yaml(path, what="map file")
    except YamlError as error:
        raise MapError(str(error)) from None
    if not isinstance(data, dict):
        raise MapError(
            f"{path}: expected a mapping with observations and actions, got {type(data).__name__}"
        )
    try:
        plant_map = PlantMap.model_validate(data)
    except ValidationError as error:
        raise MapError("; ".join(validation_lines(error, PlantMap, str(path)))) from None
    written: dict[str, str] = {}
    for name, binding in plant_map.observations.items():
        _check_node(binding.node, f"observations.{name}.node", str(path))
    for name, action in plant_map.actions.items():
        _check_node(action.write, f"actions.{name}.write", str(path))
        _check_node(action.applied, f"actions.{name}.applied", str(path))
        if action.write in written:
            raise NodeIdError(
                f"{path}: actions.{name}.write: node {quote(action.write)} is also written for "
                f"{written[action.write]!r}; each action needs a node of its own"
            )
        written[action.write] = name
    read = {b.node: f"observations.{n}" for n, b in plant_map.observations.items()}
    for node, name in written.items():
        if node in read:
            raise NodeIdError(
                f"{path}: actions.{name}.write: node {quote(node)} is read as {read[node]}; the "
                "bridge would write a sensor"
            )
    return plant_map


def check_map(plant_map: PlantMap, task: Any, where: str) -> None:
    """Checks the map against the task (a :class:`~neorl_industrial.integration.
    deployment.pin.ServedTask`): every observation and action bound, nothing else, and
    each binding's unit the task's where the task states one.

    Raises:
        UnknownFeatureError: naming a bound feature the task lacks, or a task feature the
            map leaves unbound.
        UnitMismatchError: naming the feature, the map's unit and the task's.
    """
    for what, bound, names, units in (
        ("observations", plant_map.observations, task.observation_names, task.observation_units),
        ("actions", plant_map.actions, task.action_names, task.action_units),
    ):
        unknown = [name for name in bound if name not in names]
        if unknown:
            raise UnknownFeatureError(
                f"{where}: {what}: {', '.join(map(quote, unknown[:5]))} "
                f"{'is' if len(unknown) == 1 else 'are'} not in the task, whose {what} are "
                f"{list(names)}"
            )
        missing = [name for name in names if name not in bound]
        if missing:
            raise UnknownFeatureError(
                f"{where}: {what}: the task's {', '.join(map(repr, missing[:5]))} "
                f"{'is' if len(missing) == 1 else 'are'} not bound to a node; the policy "
                "reads (or sets) every one of them"
            )
        for name, unit in zip(names, units, strict=True):
            stated = bound[name].unit
            if unit is None:
                continue
            if stated is None:
                raise UnitMismatchError(
                    f"{where}: {what}.{name}.unit: not stated, but the task's {name!r} is in "
                    f"{unit!r}; state the unit the node delivers"
                )
            if stated.strip() != unit:
                raise UnitMismatchError(
                    f"{where}: {what}.{name}.unit: the node is bound in {stated!r}, the task's "
                    f"{name!r} is in {unit!r}; convert on the server or bind the node that "
                    f"delivers {unit!r}"
                )
