"""Plant logs (CSV or Parquet, read with pyarrow) turned into episodes by a YAML schema.

Rows are samples in time. Consecutive rows of one episode make a transition: observation
and action of row ``t``, reward and costs evaluated on row ``t`` (or ``t + 1`` with
``reward_row: next``), next observation from row ``t + 1``. The last row of an episode
only provides the final next observation. Episodes end where the ``episode`` column
changes, where the time gap exceeds ``gap_factor * sampling_period``, and after a row
flagged ``terminal``; a stretch of a single row makes no transition and is skipped (with
a warning).

An observation outside its column's ``physical`` range is an invalid reading, handled
like a missing value (refused, or dropped with ``missing: drop|split``). The range each
observation column actually spans is recorded on the card (``observed``): the data's
range, outside which a served observation is flagged as out of distribution.

Rows in error messages are 0-based data rows, the header not counted (as pandas and
pyarrow number them). Values quoted in errors are cut to a readable length.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from neorl_industrial.extras import optional_imports

with optional_imports():  # the 'plant' extra
    import pyarrow as pa
    import pyarrow.compute as pc

from neorl_industrial.core.environments.history import stacked_names
from neorl_industrial.core.utils.messages import quote, shorten
from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.integration.datasets.card import ColumnInfo, DatasetCard
from neorl_industrial.integration.datasets.errors import DatasetFormatError
from neorl_industrial.integration.datasets.expressions import Expression
from neorl_industrial.integration.datasets.plant_schema import (
    MAX_HISTORY,
    PlantLogSchema,
    load_plant_schema,
    require_regular_file,
)
from neorl_industrial.integration.datasets.plant_table import (
    CSV_SUFFIXES,
    MISSING_HINT,
    PARQUET_SUFFIXES,
    column_names,
    first_null,
    numeric_values,
    read_table,
)

# Nanoseconds since 1970 in 64 bits: about 292 years either side.
_MAX_EPOCH_SECONDS = 9.2e9
_TIME_RANGE = "1678-01-01 to 2261-12-31, what nanoseconds since 1970 in 64 bits hold"


def is_table(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a CSV or Parquet file (by its suffix)."""
    name = Path(path).name.lower()
    return name.endswith(CSV_SUFFIXES + PARQUET_SUFFIXES)


def load_plant_log(
    table_path: str | os.PathLike[str],
    schema_path: str | os.PathLike[str],
    *,
    missing: str | None = None,
    history: int | None = None,
) -> tuple[Dataset, DatasetCard]:
    """Reads a plant log as episodes of transitions, as its schema describes.

    Args:
        table_path: a ``.csv`` (optionally compressed) or ``.parquet`` file.
        schema_path: the YAML schema (see :class:`PlantLogSchema`).
        missing: rows with missing values: ``error``, ``drop`` or ``split`` (None: the
            schema's ``missing``).
        history: rows per observation in place of the schema's ``history`` (None: the
            schema's), to compare histories on one log (``model history``).

    Returns:
        ``(dataset, card)``; the card carries units and bounds of every column, the
        reward and cost definitions and the row they were evaluated on (``reward_row``),
        cost limits and the sampling period.

    Raises:
        DatasetFormatError: naming the file, column and row of a missing column, a null,
            NaN or infinite value, a timestamp out of order, an action outside its bounds,
            or naming the schema file and field of a schema error.
    """
    table_path, schema_path = Path(table_path), Path(schema_path)
    require_regular_file(table_path, "plant log")
    schema = _with_missing(load_plant_schema(schema_path), missing, schema_path)
    schema = _with_history(schema, history, schema_path)
    available = column_names(table_path)
    definitions = _definitions(schema, available, schema_path)
    numeric = _numeric_columns(schema, definitions)
    _require_columns(table_path, schema_path, schema, numeric, available)
    table = read_table(table_path, schema, numeric)
    physical = {
        spec.column: spec.physical_range
        for spec in schema.observations
        if spec.physical_range is not None
    }
    dropped, breaks = 0, None
    if schema.missing != "error":
        table, dropped, breaks = _drop_missing(
            table, list(numeric), schema.missing == "split", physical
        )
    values = {column: numeric_values(table, column, table_path) for column in numeric}
    log = _LogSegments(table, schema, table_path, breaks)
    for column, bounds in physical.items():
        _check_physical(values[column], column, bounds, table_path)
    for spec in schema.actions:
        _check_bounds(values[spec.column], spec.column, spec.bounds, table_path)
    offset = 1 if schema.reward_row == "next" else 0
    used = log.transition_rows(offset)
    signals = {
        field: _evaluate(definition, values, log.n_rows, used, field, table_path)
        for field, definition in definitions.items()
    }
    observations = np.stack([values[s.column] for s in schema.observations], axis=1)
    actions = np.stack([values[s.column] for s in schema.actions], axis=1)
    costs = [signals[f"costs '{cost.name}'"] for cost in schema.costs]
    episodes = _episodes(
        log,
        observations,
        actions,
        signals["reward"],
        np.stack(costs, axis=1) if costs else None,
        offset,
    )
    try:
        dataset = Dataset.from_episodes(episodes, name=str(table_path), history=schema.history)
    except ValueError as error:
        raise DatasetFormatError(str(error), path=table_path) from error
    if dropped:
        warnings.warn(
            f"{table_path}: dropped {dropped} row(s) with missing, infinite or invalid "
            f"(outside the physical range) values (missing: {schema.missing})",
            stacklevel=2,
        )
    card = _card(schema, table_path, dataset, observations, log.segments)
    if dropped:
        card = card.model_copy(update={"dropped_rows": dropped, "missing": schema.missing})
    return dataset, card


def _with_missing(schema: PlantLogSchema, missing: str | None, schema_path: Path) -> PlantLogSchema:
    """``schema`` with its ``missing`` policy overridden by ``missing`` (None: kept)."""
    if missing is None:
        return schema
    if missing not in ("error", "drop", "split"):
        raise DatasetFormatError(
            f"missing: expected 'error', 'drop' or 'split', got {missing!r}", path=schema_path
        )
    return schema.model_copy(update={"missing": missing})


def _with_history(schema: PlantLogSchema, history: int | None, schema_path: Path) -> PlantLogSchema:
    """``schema`` with its ``history`` overridden by ``history`` (None: kept)."""
    if history is None:
        return schema
    if type(history) is not int or not 1 <= history <= MAX_HISTORY:
        raise DatasetFormatError(
            f"history: expected a whole number from 1 to {MAX_HISTORY}, got {history!r}",
            path=schema_path,
        )
    return schema.model_copy(update={"history": history})


def _definitions(
    schema: PlantLogSchema, available: list[str], schema_path: Path
) -> dict[str, str | Expression]:
    """The reward's and every cost's definition, by the field that holds it."""
    definitions = {"reward": _resolve(schema.reward, "reward", available, schema_path)}
    for cost in schema.costs:
        definitions[f"costs '{cost.name}'"] = _resolve(
            cost.definition, f"costs '{cost.name}'", available, schema_path
        )
    return definitions


def _episodes(
    log: _LogSegments,
    observations: np.ndarray,
    actions: np.ndarray,
    rewards: np.ndarray,
    costs: np.ndarray | None,
    offset: int,
) -> list[dict[str, Any]]:
    """One episode per segment of ``log``: its rows' observations, the actions of all
    rows but the last, and reward and costs of the rows ``offset`` later."""
    episodes = []
    for start, stop in log.segments:
        steps = slice(start + offset, stop - 1 + offset)
        episodes.append(
            {
                "observations": observations[start:stop],
                "actions": actions[start : stop - 1],
                "rewards": rewards[steps],
                "costs": None if costs is None else costs[steps],
                "terminated": bool(log.terminal[stop - 1]),
                "first_row": start,
            }
        )
    return episodes


def _drop_missing(
    table: pa.Table,
    columns: list[str],
    split: bool,
    physical: dict[str, tuple[float, float]] | None = None,
) -> tuple[pa.Table, int, np.ndarray | None]:
    """``table`` without the rows that hold a missing or infinite value in ``columns``,
    or an observation outside its ``physical`` range, how many were dropped, and (with
    ``split``) a mask of the kept rows that start a new episode because rows before them
    were dropped."""
    physical = physical or {}
    bad = np.zeros(table.num_rows, bool)
    for column in columns:
        array = table.column(column)
        bad |= pc.is_null(array).to_numpy(zero_copy_only=False)
        if pa.types.is_floating(array.type) or pa.types.is_integer(array.type):
            values = array.to_numpy(zero_copy_only=False).astype(np.float64)
            bad |= ~np.isfinite(values)
            if column in physical:
                low, high = physical[column]
                with np.errstate(invalid="ignore"):
                    bad |= (values < low) | (values > high)
    if not bad.any():
        return table, 0, None
    kept = ~bad
    breaks = None
    if split:
        # A kept row right after dropped ones starts a new episode.
        after_dropped = np.zeros(table.num_rows, bool)
        after_dropped[1:] = bad[:-1]
        breaks = (after_dropped & kept)[kept]
    return table.filter(pa.array(kept)), int(bad.sum()), breaks


def _resolve(text: str, field: str, available: list[str], schema_path: Path) -> str | Expression:
    """A definition that is exactly a column name is that column (whatever characters it
    has); anything else is an expression."""
    if text in available:
        return text
    try:
        return Expression(text)
    except ValueError as error:
        raise DatasetFormatError(f"{field}: {error}", path=schema_path) from error


def _numeric_columns(
    schema: PlantLogSchema, definitions: dict[str, str | Expression]
) -> dict[str, str]:
    """Every numeric column the schema uses, mapped to the first field that uses it."""
    used: dict[str, str] = {}
    for spec in schema.observations:
        used.setdefault(spec.column, "observations")
    for spec in schema.actions:
        used.setdefault(spec.column, "actions")
    for field, definition in definitions.items():
        names = [definition] if isinstance(definition, str) else sorted(definition.names)
        for name in names:
            used.setdefault(name, field)
    return used


def _require_columns(
    table_path: Path,
    schema_path: Path,
    schema: PlantLogSchema,
    numeric: dict[str, str],
    available: list[str],
) -> None:
    referenced = dict(numeric)
    referenced.setdefault(schema.timestamp, "timestamp")
    for field in ("episode", "terminal"):
        if getattr(schema, field) is not None:
            referenced.setdefault(getattr(schema, field), field)
    for column, field in referenced.items():
        if column not in available:
            raise DatasetFormatError(
                f"not in the file, but {schema_path.name} uses it ({field}); the file has "
                f"columns: {shorten(', '.join(available))}",
                path=table_path,
                column=column,
            )


def _check_physical(
    values: np.ndarray, column: str, bounds: tuple[float, float], path: Path
) -> None:
    low, high = bounds
    _check_range(
        values,
        bounds,
        lambda value: (
            f"reading {value} is outside the sensor's physical range [{low}, {high}] "
            f"(an invalid reading); {MISSING_HINT}"
        ),
        path,
        column,
    )


def _check_bounds(values: np.ndarray, column: str, bounds: tuple[float, float], path: Path) -> None:
    low, high = bounds
    _check_range(
        values,
        bounds,
        lambda value: f"action {value} is outside the declared bounds [{low}, {high}]",
        path,
        column,
    )


def _check_range(
    values: np.ndarray,
    bounds: tuple[float, float],
    problem: Callable[[Any], str],
    path: Path,
    column: str,
) -> None:
    """Refuses the first of ``values`` outside ``bounds`` (inclusive), naming column and
    row; ``problem(value)`` says what is wrong with it."""
    low, high = bounds
    outside = (values < low) | (values > high)
    if outside.any():
        row = int(np.argmax(outside))
        raise DatasetFormatError(problem(values[row]), path=path, column=column, row=row)


def _evaluate(
    definition: str | Expression,
    values: dict[str, np.ndarray],
    n_rows: int,
    used: np.ndarray,
    field: str,
    path: Path,
) -> np.ndarray:
    if isinstance(definition, str):
        return values[definition]
    result = definition.evaluate(values, n_rows)
    bad = used & ~np.isfinite(result)
    if bad.any():
        row = int(np.argmax(bad))
        raise DatasetFormatError(
            f"{field} = {definition.source} is {result[row]} (not finite)", path=path, row=row
        )
    return result


# ----- time and episodes -----------------------------------------------------------------
class _LogSegments:
    """Episode boundaries of a log: explicit ids, time gaps and terminal rows."""

    def __init__(
        self,
        table: pa.Table,
        schema: PlantLogSchema,
        path: Path,
        breaks: np.ndarray | None = None,
    ):
        self.n_rows = table.num_rows
        if self.n_rows < 2:
            raise DatasetFormatError(
                f"{self.n_rows} row(s); a transition needs at least two", path=path
            )
        starts = np.zeros(self.n_rows, bool)
        starts[0] = True
        if breaks is not None:
            starts |= breaks
        if schema.episode is not None:
            starts |= _episode_changes(table.column(schema.episode), schema.episode, path)
        stamps = table.column(schema.timestamp)
        nanoseconds = _nanoseconds(stamps, schema.timestamp, path)
        steps = np.diff(nanoseconds)
        backwards = (steps <= 0) & ~starts[1:]
        if backwards.any():
            row = int(np.argmax(backwards)) + 1
            raise DatasetFormatError(
                f"timestamp {shorten(str(stamps[row].as_py()))} is not after the previous "
                f"row's {shorten(str(stamps[row - 1].as_py()))}; sort the log by time and "
                "drop duplicate rows",
                path=path,
                column=schema.timestamp,
                row=row,
            )
        limit_ns = schema.gap_factor * schema.sampling_period * 1e9
        starts[1:] |= steps > limit_ns
        self.terminal = np.zeros(self.n_rows, bool)
        if schema.terminal is not None:
            self.terminal = numeric_values(table, schema.terminal, path) != 0
            starts[1:] |= self.terminal[:-1]
        first = np.flatnonzero(starts)
        stops = np.append(first[1:], self.n_rows)
        long_enough = stops - first >= 2
        if not long_enough.any():
            raise DatasetFormatError(
                "no two consecutive rows belong to one episode: check sampling_period "
                f"({schema.sampling_period} s) and gap_factor ({schema.gap_factor})",
                path=path,
            )
        if not long_enough.all():
            warnings.warn(
                f"{path}: skipped {int((~long_enough).sum())} isolated row(s) that make no "
                "transition (an episode boundary on both sides)",
                stacklevel=3,
            )
        self.segments = list(
            zip(first[long_enough].tolist(), stops[long_enough].tolist(), strict=True)
        )

    def transition_rows(self, offset: int) -> np.ndarray:
        """Mask of the rows whose reward and costs are used (``offset`` 1: the next row)."""
        used = np.zeros(self.n_rows, bool)
        for start, stop in self.segments:
            used[start + offset : stop - 1 + offset] = True
        return used


def _episode_changes(ids: pa.ChunkedArray, column: str, path: Path) -> np.ndarray:
    row = first_null(ids)
    if row is not None:
        raise DatasetFormatError("missing episode id", path=path, column=column, row=row)
    values = ids.to_numpy()
    changes = np.zeros(len(values), bool)
    changes[1:] = values[1:] != values[:-1]
    seen: set[Any] = {values[0]}
    for row in np.flatnonzero(changes).tolist():
        if values[row] in seen:
            raise DatasetFormatError(
                f"episode {quote(values[row])} appears again after other episodes; sort the log "
                "by episode, then by time",
                path=path,
                column=column,
                row=row,
            )
        seen.add(values[row])
    return changes


def _nanoseconds(stamps: pa.ChunkedArray, column: str, path: Path) -> np.ndarray:
    """Timestamps as int64 nanoseconds (ISO, date or timestamp types), or numeric seconds
    scaled to nanoseconds."""
    row = first_null(stamps)
    if row is not None:
        raise DatasetFormatError("missing timestamp", path=path, column=column, row=row)
    kind = stamps.type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        seconds = stamps.to_numpy().astype(np.float64)
        if not np.isfinite(seconds).all():
            row = int(np.argmin(np.isfinite(seconds)))
            raise DatasetFormatError(
                f"{seconds[row]} is not finite", path=path, column=column, row=row
            )
        _check_range(
            seconds,
            (-_MAX_EPOCH_SECONDS, _MAX_EPOCH_SECONDS),
            lambda value: (
                f"{value} s is outside the allowed range [-{_MAX_EPOCH_SECONDS:g}, "
                f"{_MAX_EPOCH_SECONDS:g}] s ({_TIME_RANGE})"
            ),
            path,
            column,
        )
        return np.round(seconds * 1e9).astype(np.int64)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        stamps = _parse_iso(stamps, column, path)
    elif pa.types.is_date(kind):
        stamps = pc.cast(stamps, pa.timestamp("s"))
    elif not pa.types.is_timestamp(stamps.type):
        raise DatasetFormatError(
            f"holds {kind}; expected ISO timestamps or numeric seconds", path=path, column=column
        )
    tz = stamps.type.tz
    try:
        nanoseconds = pc.cast(stamps, pa.timestamp("ns", tz=tz))
    except pa.ArrowInvalid:
        raise _out_of_range(stamps, column, path) from None
    return pc.cast(nanoseconds, pa.int64()).to_numpy()


def _out_of_range(stamps: pa.ChunkedArray, column: str, path: Path) -> DatasetFormatError:
    """The error naming the first timestamp (of a coarser unit than ns) that nanoseconds
    since 1970 in 64 bits cannot hold."""
    unit = stamps.type.unit
    per_second = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[unit]
    counts = pc.cast(stamps, pa.int64()).to_numpy(zero_copy_only=False)
    limit = _MAX_EPOCH_SECONDS * per_second
    outside = np.abs(counts.astype(np.float64)) > limit
    row = int(np.argmax(outside)) if outside.any() else 0
    return DatasetFormatError(
        f"timestamp {shorten(str(stamps[row]))} is outside the allowed range ({_TIME_RANGE})",
        path=path,
        column=column,
        row=row,
    )


def _parse_iso(stamps: pa.ChunkedArray, column: str, path: Path) -> pa.ChunkedArray:
    for target in (pa.timestamp("ns"), pa.timestamp("ns", tz="UTC")):
        try:
            return pc.cast(stamps, target)
        except pa.ArrowInvalid:
            continue
    for target in (pa.timestamp("s"), pa.timestamp("s", tz="UTC")):
        # Dates nanoseconds cannot hold (year 9999, year 1) parse in seconds: name them.
        try:
            wide = pc.cast(stamps, target)
        except pa.ArrowInvalid:
            continue
        raise _out_of_range(wide, column, path)
    # Error path only: find the first row neither form parses, to name it.
    naive, aware = pa.timestamp("ns"), pa.timestamp("ns", tz="UTC")
    expects_zone = _parses(stamps[0], aware)
    target = aware if expects_zone else naive
    for row in range(len(stamps)):
        if not _parses(stamps[row], target):
            raise DatasetFormatError(
                f"{quote(stamps[row].as_py())} is not an ISO 8601 timestamp "
                f"({'with' if expects_zone else 'without'} a zone offset, like row 0)",
                path=path,
                column=column,
                row=row,
            )
    raise AssertionError("unreachable: the column failed to parse as a whole")


def _parses(value: pa.Scalar, target: pa.DataType) -> bool:
    try:
        pc.cast(pa.array([value.as_py()], pa.string()), target)
    except pa.ArrowInvalid:
        return False
    return True


# ----- card ------------------------------------------------------------------------------
def _card(
    schema: PlantLogSchema,
    table_path: Path,
    dataset: Dataset,
    observations: np.ndarray,
    segments: list[tuple[int, int]],
) -> DatasetCard:
    # The range of the observations in the dataset's episodes (rows in no episode left out).
    rows = np.concatenate([np.arange(start, stop) for start, stop in segments])
    seen = observations[rows]
    observed = [
        (float(low), float(high))
        for low, high in zip(seen.min(axis=0), seen.max(axis=0), strict=True)
    ]
    # With a history, each earlier row's columns follow the newest row's (column@t-1,
    # ...): the observation's layout, as the card's task names it.
    names = stacked_names([s.column for s in schema.observations], schema.history)
    sensors = [
        ColumnInfo(
            name=name,
            unit=s.unit,
            bounds=s.physical_range,
            observed=span,
            exogenous=s.exogenous and position < len(schema.observations),
        )
        for position, (name, s, span) in enumerate(
            zip(
                names,
                schema.observations * schema.history,
                observed * schema.history,
                strict=True,
            )
        )
    ]
    actuators = [ColumnInfo(name=s.column, unit=s.unit, bounds=s.bounds) for s in schema.actions]

    card = DatasetCard(
        name=schema.name or table_path.name.split(".")[0],
        description=schema.description,
        source="plant-log",
        env_id=schema.env_id,
        sampling_period=schema.sampling_period,
        cost_names=[cost.name for cost in schema.costs],
        cost_limits={cost.name: cost.limit for cost in schema.costs if cost.limit is not None},
        observation_columns=sensors,
        action_columns=actuators,
        definitions={"reward": schema.reward}
        | {cost.name: cost.definition for cost in schema.costs},
        reward_row=schema.reward_row,
    )
    return card.with_sizes(dataset)
