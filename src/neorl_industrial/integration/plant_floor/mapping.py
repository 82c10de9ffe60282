"""The map file: which OPC UA node carries each of the task's observations, which node
the bridge writes each action to and which node reports the action actually applied, the
sampling period and what a fault does.

    task: ../mixing-tank/dataset.json   # optional: the dataset card or task file the map is for
    sampling_period: 10                 # seconds (default: the task's, i.e. the dataset card's)
    stale_after: 25                     # a value whose source timestamp is older is stale
    on_fault: fallback                  # or hand_back: stop writing, the operators keep control
    observations:
      level_m: {node: "ns=2;s=Tank.Level", unit: m}
      temperature_c: {node: "ns=2;s=Tank.Temperature", unit: degF, convert: true}
    actions:
      valve_pct: {write: "ns=2;s=Tank.ValveSetpoint", applied: "ns=2;s=Tank.ValvePosition",
                  unit: "%"}

The file is untrusted input: it is validated whole (unknown keys are named, with the
closest known one; every duration has a finite range, named with the value when it is
outside it), node ids are parsed as OPC UA node ids and each node has one meaning (one
sensor bound to two features, two actions reading one ``applied`` node, or a written node
that is also read are refused), and :func:`check_map` compares it with the task before
anything connects: every observation and action of the task bound, nothing else, and each
binding's unit the task's (:mod:`neorl_industrial.core.units`: ``°C`` is ``degC``), or a
real conversion the binding asks for with ``convert: true``.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from neorl_industrial.core.environments.history import frame_of
from neorl_industrial.core.units import (
    Conversion,
    IncompatibleUnitsError,
    UnitError,
    conversion,
    parse_unit,
)
from neorl_industrial.core.utils.messages import quote, validation_lines
from neorl_industrial.integration.plant_floor.errors import (
    MapError,
    NodeIdError,
    UnitMismatchError,
    UnknownFeatureError,
)
from neorl_industrial.wrappers.hostio import YamlError, read_yaml

__all__ = [
    "LIMITS",
    "ActionBinding",
    "ObservationBinding",
    "PlantMap",
    "check_map",
    "load_map",
]

#: What a fault does when the map does not say.
ON_FAULT = ("fallback", "hand_back")

#: The allowed range of each duration, in seconds: ``(low, high, low included)``. A
#: reading a day old is not the plant's present, a clock five minutes off is a clock to
#: fix, and a request that takes ten minutes is a lost connection.
LIMITS: dict[str, tuple[float, float, bool]] = {
    "sampling_period": (0.0, 86400.0, False),
    "stale_after": (0.0, 86400.0, False),
    "clock_skew": (0.0, 300.0, True),
    "request_timeout": (0.0, 600.0, False),
}


def _in_range(name: str) -> Any:
    low, high, closed = LIMITS[name]
    interval = f"{'[' if closed else '('}{low:g}, {high:g}] seconds"

    def check(value: float) -> float:
        above = value >= low if closed else value > low
        if not (math.isfinite(value) and above and value <= high):
            raise ValueError(f"{value!r} is outside the allowed range {interval}")
        return value

    return AfterValidator(check)


def _seconds(name: str) -> Any:
    return Annotated[float, Field(allow_inf_nan=True), _in_range(name)]


def _unit_text(value: str | None) -> str | None:
    """A stated unit, read by the units library here so that a map with a unit that is
    not one is refused with the file's name (an empty text states none)."""
    if value is None or not value.strip():
        return None
    try:
        parse_unit(value)
    except UnitError as error:
        if "characters no unit has" in str(error) or "longer than" in str(error):
            raise ValueError(str(error)) from None
        # A unit the library does not know is compared as written (check_map says so).
    return value.strip()


Unit = Annotated[str | None, Field(max_length=64), AfterValidator(_unit_text)]


class ObservationBinding(BaseModel):
    """One observation: the node it is read from, its unit there and whether the bridge
    converts it into the task's unit (a real conversion, e.g. ``degF`` into ``degC``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str = Field(min_length=1, max_length=512)
    unit: Unit = None
    convert: bool = False


class ActionBinding(BaseModel):
    """One action: the node the bridge writes (closed loop) and the node that reports the
    value actually applied (the operators' in shadow mode; the previous action), their
    unit and whether the bridge converts between it and the task's unit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    write: str = Field(min_length=1, max_length=512)
    applied: str = Field(min_length=1, max_length=512)
    unit: Unit = None
    convert: bool = False


class PlantMap(BaseModel):
    """A validated map file (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The dataset card or task file the map is written for, relative to the map.
    task: str | None = Field(None, max_length=4096)
    #: Seconds between decisions; ``None``: the task's sampling period.
    sampling_period: _seconds("sampling_period") | None = None
    #: Seconds after which a value's source timestamp is stale; ``None``: 2.5 periods.
    stale_after: _seconds("stale_after") | None = None
    #: Seconds a source timestamp may lie ahead of the bridge's clock (clock skew).
    clock_skew: _seconds("clock_skew") = 2.0
    #: Seconds a read or write may take before the connection counts as lost; ``None``:
    #: the sampling period, at least 1 s.
    request_timeout: _seconds("request_timeout") | None = None
    #: ``fallback``: the shield's fallback replaces the action on a faulty tick;
    #: ``hand_back``: the bridge stops writing for good and the operators keep control.
    on_fault: Literal["fallback", "hand_back"] = "fallback"
    observations: dict[str, ObservationBinding] = Field(min_length=1, max_length=4096)
    actions: dict[str, ActionBinding] = Field(min_length=1, max_length=4096)

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
            MapError: when neither states one, or the task's is outside the range.
        """
        period = self.sampling_period if self.sampling_period is not None else task_period
        if period is None:
            raise MapError(
                f"{where}: sampling_period: the map states none and the task has none (its "
                "dataset card names no sampling_period); state it in the map, in seconds"
            )
        low, high, _ = LIMITS["sampling_period"]
        period = float(period)
        if not (math.isfinite(period) and low < period <= high):
            raise MapError(
                f"{where}: sampling_period: the task's {period!r} is outside the allowed "
                f"range ({low:g}, {high:g}] seconds; state one in the map"
            )
        return period

    def stale_limit(self, period: float) -> float:
        """``stale_after``, else 2.5 periods (at most its range's end)."""
        if self.stale_after is not None:
            return self.stale_after
        return min(2.5 * period, LIMITS["stale_after"][1])

    def timeout(self, period: float) -> float:
        """``request_timeout``, else the period (at least 1 s, at most its range's end)."""
        if self.request_timeout is not None:
            return self.request_timeout
        return min(max(period, 1.0), LIMITS["request_timeout"][1])

    def digest(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()


def _check_node(node: str, field: str, where: str) -> Any:
    """The parsed node id (equal ids written differently compare equal)."""
    from asyncua import ua

    try:
        return ua.NodeId.from_string(node)
    except Exception as error:  # asyncua raises several kinds for a malformed id
        raise NodeIdError(
            f"{where}: {field}: {quote(node)} is not an OPC UA node id "
            f"(e.g. ns=2;s=Tank.Level or ns=2;i=1001): {error}"
        ) from None


def load_map(path: str | Path) -> PlantMap:
    """Reads and validates the map at ``path`` (YAML or JSON).

    Raises:
        MapError: naming the file and every field that is wrong (a duration outside its
            range with the range).
        NodeIdError: for a node id that is not OPC UA node-id syntax, or a node with two
            meanings: one sensor bound to two features, one node written for two actions,
            two actions reading one ``applied`` node, a written node that is read.
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
    where = str(path)
    # Each node, parsed, with the one meaning it has: a second one is refused by name.
    read: dict[Any, str] = {}
    for name, binding in plant_map.observations.items():
        field = f"observations.{name}.node"
        node = _check_node(binding.node, field, where)
        if node in read:
            raise NodeIdError(
                f"{where}: {field}: node {quote(binding.node)} is also bound to "
                f"{read[node]}; one sensor is one feature (bind each feature to its own node)"
            )
        read[node] = f"observations.{name}"
    applied: dict[Any, str] = {}
    written: dict[Any, str] = {}
    for name, action in plant_map.actions.items():
        write = _check_node(action.write, f"actions.{name}.write", where)
        position = _check_node(action.applied, f"actions.{name}.applied", where)
        if position in applied:
            raise NodeIdError(
                f"{where}: actions.{name}.applied: node {quote(action.applied)} also reports "
                f"{applied[position]}; each action's applied value needs a node of its own"
            )
        applied[position] = f"actions.{name}.applied"
        if write in written:
            raise NodeIdError(
                f"{where}: actions.{name}.write: node {quote(action.write)} is also written for "
                f"{written[write]!r}; each action needs a node of its own"
            )
        written[write] = name
    for node, name in written.items():
        if node in read:
            raise NodeIdError(
                f"{where}: actions.{name}.write: node {quote(plant_map.actions[name].write)} is "
                f"read as {read[node]}; the bridge would write a sensor"
            )
        other = applied.get(node)
        if other is not None and other != f"actions.{name}.applied":
            raise NodeIdError(
                f"{where}: actions.{name}.write: node {quote(plant_map.actions[name].write)} "
                f"is read as {other}; the bridge would write another action's position"
            )
    return plant_map


def check_map(plant_map: PlantMap, task: Any, where: str) -> dict[str, Conversion]:
    """Checks the map against the task (a :class:`~neorl_industrial.integration.
    deployment.pin.ServedTask`): every observation (of the newest row, where the task's
    observations stack earlier rows) and action bound, nothing else, and
    each binding's unit the task's where the task states one: the same unit (``°C`` and
    ``degC``, by :mod:`neorl_industrial.core.units`), or a real conversion (``degF`` into
    ``degC``, ``bar`` into ``kPa``) that the binding asks for with ``convert: true``.

    Returns:
        The conversion of each binding that converts (``observations.<name>`` or
        ``actions.<name>``): node unit into task unit.

    Raises:
        UnknownFeatureError: naming a bound feature the task lacks, or a task feature the
            map leaves unbound.
        UnitMismatchError: naming the binding, the map's unit and the task's: a unit not
            stated where the task states one, another quantity, a real conversion the
            binding does not ask for, or ``convert`` where there is nothing to convert.
    """
    conversions: dict[str, Conversion] = {}
    # An observation of the last rows (column@t-1, ...) binds the newest row's features:
    # the bridge keeps the earlier rows itself.
    frame, _ = frame_of(task.observation_names)
    for what, bound, names, units in (
        ("observations", plant_map.observations, frame, task.observation_units[: len(frame)]),
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
            found = _unit_check(bound[name], unit, f"{where}: {what}.{name}", name)
            if found is not None:
                conversions[f"{what}.{name}"] = found
    return conversions


def _unit_check(binding: Any, unit: str | None, field: str, name: str) -> Conversion | None:
    stated = binding.unit
    if unit is None or not str(unit).strip():
        if binding.convert:
            raise UnitMismatchError(
                f"{field}.convert: the task states no unit for {name!r}; there is nothing to "
                "convert into"
            )
        return None
    if stated is None:
        raise UnitMismatchError(
            f"{field}.unit: not stated, but the task's {name!r} is in {unit!r}; state the "
            "unit the node delivers"
        )
    try:
        found = conversion(stated, unit)
    except IncompatibleUnitsError as error:
        raise UnitMismatchError(
            f"{field}.unit: the node is bound in {stated!r}, the task's {name!r} is in "
            f"{unit!r}, and no conversion relates them ({error}); bind the node that "
            f"delivers {unit!r}"
        ) from None
    except UnitError as error:
        if stated.strip() == str(unit).strip():
            return None  # a unit the library does not know, stated alike: the same
        raise UnitMismatchError(
            f"{field}.unit: the node is bound in {stated!r}, the task's {name!r} is in "
            f"{unit!r}, which cannot be compared: {error}"
        ) from None
    if found.identity:
        if binding.convert:
            raise UnitMismatchError(
                f"{field}.convert: {stated!r} is the task's unit {unit!r}; there is nothing "
                "to convert (remove convert)"
            )
        return None
    if not binding.convert:
        raise UnitMismatchError(
            f"{field}.unit: the node is bound in {stated!r}, the task's {name!r} is in "
            f"{unit!r}: a real conversion ({found.describe()}); add convert: true to the "
            f"binding to have the bridge convert, or bind the node that delivers {unit!r}"
        )
    return found
