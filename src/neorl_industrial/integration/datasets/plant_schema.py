"""The YAML schema that says how a plant log (CSV or Parquet) becomes transitions.

Example::

    name: boiler-3-2024
    timestamp: time             # ISO timestamps or numeric seconds
    sampling_period: 60         # seconds between rows
    gap_factor: 1.5             # a gap > 1.5 x 60 s starts a new episode
    missing: error              # a row with an empty/NaN value: error | drop | split
    episode: batch_id           # optional: explicit episode ids
    terminal: tripped           # optional: true on a row whose state is terminal
    observations:
      - {column: temperature, unit: degC, physical: [0, 500]}  # the sensor's range
      - pressure                # a bare column name: no unit, no physical range
      - {column: feed_temp, unit: degC, exogenous: true}  # no action moves it
    actions:
      - {column: valve, unit: "%", bounds: [0, 100]}   # bounds are required
    reward: -abs(temperature - 350) - 0.01 * valve
    costs:
      - {name: overheating, expression: max(temperature - 420, 0), limit: 5.0}
      - {name: alarm}           # the column 'alarm' itself; no episode limit

Every number has a sane range, so that no schema can switch a check off:
``sampling_period`` is 1 µs to one week, ``gap_factor`` 1 to 100, bounds and limits are
within ±1e12 (an observation's ``physical`` side may be ``.inf``: open), and names and
units are printable text (no escape codes or newlines).

An observation's ``physical`` range is what its sensor can read: a value outside it is
an invalid reading (refused, or dropped with ``missing: drop|split``, on import; the
shield's fallback at run time). ``bounds`` on an observation is the older name of the
same range. The range of the data itself (min and max of each column) is measured on
import and recorded on the card: outside it an observation is only flagged as out of
distribution.

An observation marked ``exogenous: true`` is one the actions cannot move: a measured
disturbance (feed temperature, ambient, upstream flow) or a setpoint schedule. Where the
log holds its future (the held-out episodes a verdict judges candidates on), the plant
model takes it from the log instead of predicting it, for the candidates and today's
operation alike. Mark only what no action can move: a candidate's actions cannot change
a value taken from the log.

``history: H`` (1 to 64, default 1) makes each observation the last ``H`` rows, newest
first: the newest row's columns under their own names, each earlier row's as
``column@t-1`` ... ``column@t-{H-1}``. Set it when the plant's next row depends on more
than the current one: a transport or dead time, a slow analyser, a hidden drift (the
plant model's memory check measures how much earlier rows explain; ``model history``
compares histories by the held-out error over the long horizon). Before an episode's
first row the history repeats that row. Agents, the plant model and the verdict see the
stacked observation; a server is sent it whole, the plant-floor loop keeps the last rows
itself.
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from neorl_industrial.core.utils.limits import (
    MAX_MAGNITUDE,
    check_seconds,
    check_text,
)
from neorl_industrial.core.utils.messages import validation_lines
from neorl_industrial.integration.datasets.errors import DatasetFormatError
from neorl_industrial.wrappers.hostio import YamlError, file_kind, read_yaml

#: The shortest and longest sampling period (seconds) and the largest gap factor.
MIN_SAMPLING_PERIOD = 1e-6
MAX_GAP_FACTOR = 100.0
#: The most rows one observation may stack (``history``).
MAX_HISTORY = 64


def _range(bounds: tuple[float, float] | None) -> tuple[float, float] | None:
    """``[low, high]`` with ``low <= high``, neither NaN, each side within ±1e12 or
    ``±.inf`` (open on that side)."""
    if bounds is None:
        return None
    if any(math.isnan(value) for value in bounds):
        raise ValueError(f"{list(bounds)} has NaN; write .inf or -.inf for an open side")
    for value in bounds:
        if math.isfinite(value) and abs(value) > MAX_MAGNITUDE:
            raise ValueError(
                f"{value} is outside the allowed range [{-MAX_MAGNITUDE:g}, {MAX_MAGNITUDE:g}]; "
                "write .inf or -.inf for an open side, or state the column in a larger unit"
            )
    if not bounds[0] <= bounds[1]:
        raise ValueError(f"low {bounds[0]} must not exceed high {bounds[1]}")
    return bounds


class ColumnSpec(BaseModel):
    """One observation column; a bare string is shorthand for ``{column: <string>}``.

    ``physical`` is the sensor's range: a reading outside it is invalid (``bounds``, the
    older name, means the same; give one of the two). ``exogenous``: no action moves it
    (see the module docstring).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    column: str = Field(min_length=1)
    unit: str | None = None
    physical: tuple[float, float] | None = None
    bounds: tuple[float, float] | None = None
    exogenous: bool = False

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, data: Any) -> Any:
        return {"column": data} if isinstance(data, str) else data

    @field_validator("column", "unit")
    @classmethod
    def _printable(cls, text: str | None) -> str | None:
        return None if text is None else check_text(text, "")

    @field_validator("physical", "bounds")
    @classmethod
    def _ordered(cls, bounds: tuple[float, float] | None) -> tuple[float, float] | None:
        return _range(bounds)

    @model_validator(mode="after")
    def _one_range(self) -> ColumnSpec:
        if self.physical is not None and self.bounds is not None:
            raise ValueError(
                "give 'physical' (the sensor's range) only; 'bounds' is its older name"
            )
        return self

    @property
    def physical_range(self) -> tuple[float, float] | None:
        """The sensor's range, whichever name gave it."""
        return self.physical if self.physical is not None else self.bounds


class ActionColumnSpec(BaseModel):
    """One action column; its bounds are required and every logged value is checked."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    column: str = Field(min_length=1)
    unit: str | None = None
    bounds: tuple[float, float]

    @field_validator("column", "unit")
    @classmethod
    def _printable(cls, text: str | None) -> str | None:
        return None if text is None else check_text(text, "")

    @field_validator("bounds")
    @classmethod
    def _finite(cls, bounds: tuple[float, float]) -> tuple[float, float]:
        if not all(math.isfinite(value) and abs(value) <= MAX_MAGNITUDE for value in bounds):
            raise ValueError(
                f"{list(bounds)}: an action's bounds must be finite numbers within "
                f"[{-MAX_MAGNITUDE:g}, {MAX_MAGNITUDE:g}]"
            )
        return _range(bounds)  # type: ignore[return-value]


class CostSpec(BaseModel):
    """A named per-step cost: an expression over columns, or the column of that name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    expression: str | None = None
    limit: float | None = Field(
        None, description="episode cost limit; leave it out for a channel without one"
    )

    @field_validator("name")
    @classmethod
    def _printable(cls, name: str) -> str:
        return check_text(name, "")

    @field_validator("limit")
    @classmethod
    def _finite(cls, limit: float | None) -> float | None:
        if limit is not None and not (math.isfinite(limit) and 0.0 <= limit <= MAX_MAGNITUDE):
            raise ValueError(
                f"must be a finite number in [0, {MAX_MAGNITUDE:g}], got {limit}; for no limit, "
                "leave 'limit' out"
            )
        return limit

    @property
    def definition(self) -> str:
        return self.expression if self.expression is not None else self.name


class PlantLogSchema(BaseModel):
    """How the columns of a plant log map to observations, actions, reward and costs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = None
    description: str | None = None
    env_id: str | None = None
    timestamp: str = Field(min_length=1)
    sampling_period: float = Field(description="seconds between consecutive rows")
    gap_factor: float = Field(1.5, description="a gap > gap_factor x sampling_period splits")
    missing: Literal["error", "drop", "split"] = Field(
        "error",
        description="a row with a missing (empty, NA, NaN) or infinite value in a column "
        "the schema uses: 'error' refuses the file naming column and row; 'drop' drops the "
        "row (the time-gap rule then decides whether the episode goes on); 'split' drops "
        "it and always starts a new episode after it",
    )
    episode: str | None = None
    terminal: str | None = None
    observations: list[ColumnSpec] = Field(min_length=1)
    actions: list[ActionColumnSpec] = Field(min_length=1)
    reward: str = Field(min_length=1, description="a column name or an expression")
    reward_row: Literal["current", "next"] = Field(
        "current",
        description="evaluate reward and costs of transition t on row t, or on row t + 1",
    )
    costs: list[CostSpec] = Field(default_factory=list)
    history: int = Field(
        1,
        strict=True,
        ge=1,
        le=MAX_HISTORY,
        description="rows per observation, newest first (earlier rows named column@t-1, ...)",
    )

    @field_validator("sampling_period")
    @classmethod
    def _period(cls, seconds: float) -> float:
        return check_seconds(seconds, "", low=MIN_SAMPLING_PERIOD, open_low=False)

    @field_validator("gap_factor")
    @classmethod
    def _gap(cls, factor: float) -> float:
        if not (math.isfinite(factor) and 1.0 <= factor <= MAX_GAP_FACTOR):
            raise ValueError(
                f"{factor} is outside the allowed range [1, {MAX_GAP_FACTOR:g}] (a gap longer "
                "than gap_factor x sampling_period starts a new episode)"
            )
        return factor

    @field_validator("name", "env_id", "timestamp", "episode", "terminal")
    @classmethod
    def _printable(cls, text: str | None) -> str | None:
        return None if text is None else check_text(text, "")

    @field_validator("description")
    @classmethod
    def _printable_lines(cls, text: str | None) -> str | None:
        return None if text is None else check_text(text, "", max_length=10_000, allow="\n")

    @field_validator("reward", mode="before")
    @classmethod
    def _number_as_text(cls, reward: Any) -> Any:
        # YAML reads `reward: 0` as a number; it is a (constant) expression all the same.
        return str(reward) if isinstance(reward, int | float) else reward

    @model_validator(mode="after")
    def _unique_names(self) -> PlantLogSchema:
        for what, names in (
            ("observations", [spec.column for spec in self.observations]),
            ("actions", [spec.column for spec in self.actions]),
            ("costs", [spec.name for spec in self.costs]),
        ):
            repeated = sorted({name for name in names if names.count(name) > 1})
            if repeated:
                raise ValueError(f"{what} lists {repeated} more than once")
        return self


def load_plant_schema(path: str | os.PathLike[str]) -> PlantLogSchema:
    """Reads and validates a plant-log schema.

    Raises:
        DatasetFormatError: naming the schema file, with the field path and message for a
            wrong, misspelled (with the closest field names) or missing field, or YAML's
            line for a syntax error, an anchor or alias, or a document over 1 MiB.
    """
    path = Path(path)
    require_regular_file(path, "plant-log schema")
    try:
        # No anchors or aliases, at most 1 MiB: a schema is untrusted input.
        document = read_yaml(path, what="plant-log schema")
    except YamlError as error:
        raise DatasetFormatError(str(error).removeprefix(f"{path}: "), path=path) from None
    if not isinstance(document, dict):
        raise DatasetFormatError(
            f"expected a mapping of schema fields, got {type(document).__name__}", path=path
        )
    try:
        return PlantLogSchema.model_validate(document)
    except ValidationError as error:
        # One line: "field.path: message" per error, a "did you mean" for a misspelled key.
        details = "; ".join(validation_lines(error, PlantLogSchema, ""))
        raise DatasetFormatError(f"invalid plant-log schema: {details}", path=path) from None


def require_regular_file(path: str | os.PathLike[str], what: str) -> None:
    """Refuses, before anything opens it, a path that is not a regular file: a FIFO would
    block the reader forever, a device could be endless.

    Raises:
        DatasetFormatError: naming the path and what it is.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise DatasetFormatError(f"cannot read the {what}: no such file", path=path) from None
    except OSError as error:
        raise DatasetFormatError(f"cannot read the {what}: {error.strerror}", path=path) from None
    if not stat.S_ISREG(mode):
        raise DatasetFormatError(
            f"a {file_kind(mode)}, not a regular file; a {what} is read from a regular file "
            "(nothing was read)",
            path=path,
        )
