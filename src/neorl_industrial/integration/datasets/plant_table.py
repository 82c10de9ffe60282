"""Reading a plant log's table with pyarrow: its column names, the typed read of the
columns a schema uses, and numeric columns as arrays, with errors that name the file,
column and data row (0-based, the header not counted) of bad input."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

import numpy as np

from neorl_industrial.extras import optional_imports

with optional_imports():  # the 'plant' extra
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

from neorl_industrial.core.utils.messages import quote, shorten
from neorl_industrial.integration.datasets.errors import DatasetFormatError
from neorl_industrial.integration.datasets.plant_schema import PlantLogSchema

__all__ = [
    "CSV_SUFFIXES",
    "MISSING_HINT",
    "PARQUET_SUFFIXES",
    "column_names",
    "first_null",
    "numeric_values",
    "read_table",
]

MISSING_HINT = (
    "to drop such rows instead, set 'missing: drop' (or 'missing: split', which also starts "
    "a new episode there) in the schema, or import with --missing drop|split"
)
_ENCODING_HINT = "save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8 in.csv > out.csv)"
CSV_SUFFIXES = (".csv", ".csv.gz", ".csv.bz2", ".csv.zst")
PARQUET_SUFFIXES = (".parquet", ".pq")
# pyarrow names a column by its index and no row: "In CSV column #2: CSV conversion
# error to double: invalid value 'abc'".
_CSV_CONVERSION = re.compile(
    r"In CSV column #(?P<index>\d+): (?:Row #\d+: )?CSV conversion error to "
    r"(?P<kind>[^:]+): (?P<detail>.*)",
    re.DOTALL,
)


def column_names(path: Path) -> list[str]:
    try:
        if path.name.lower().endswith(PARQUET_SUFFIXES):
            return list(pq.read_schema(path).names)
        if path.name.lower().endswith(CSV_SUFFIXES):
            with pcsv.open_csv(path) as reader:
                return list(reader.schema.names)
    except FileNotFoundError:
        raise DatasetFormatError("file not found", path=path) from None
    except UnicodeDecodeError as error:
        raise _encoding_error(path, error, "header") from None
    except pa.ArrowInvalid as error:
        # Opening a CSV parses its first block: a malformed row there fails here.
        raise _csv_error(path, error, names=[]) from error
    except (pa.ArrowException, OSError) as error:
        raise DatasetFormatError(f"unreadable table: {shorten(str(error))}", path=path) from error
    raise DatasetFormatError(
        f"unknown table type; expected one of {CSV_SUFFIXES + PARQUET_SUFFIXES}", path=path
    )


def _encoding_error(path: Path, error: UnicodeDecodeError, where: str) -> DatasetFormatError:
    """The file is not UTF-8: name the byte and its position, and how to convert."""
    byte = error.object[error.start : error.start + 1].hex()
    return DatasetFormatError(
        f"the {where} is not UTF-8 text (byte 0x{byte} at position {error.start} of a "
        f"block; Latin-1 or Windows-1252, perhaps): {_ENCODING_HINT}",
        path=path,
    )


def read_table(path: Path, schema: PlantLogSchema, numeric: dict[str, str]) -> pa.Table:
    columns = list(dict.fromkeys([*numeric, schema.timestamp]))
    columns += [c for c in (schema.episode, schema.terminal) if c is not None and c not in columns]
    try:
        if path.name.lower().endswith(PARQUET_SUFFIXES):
            return pq.read_table(path, columns=columns)
        # Declared types: inference from the first block would make an integer-looking
        # start of a float column fail later in the file.
        types = {column: pa.float64() for column in numeric}
        if schema.episode is not None:
            types[schema.episode] = pa.string()
        options = pcsv.ConvertOptions(include_columns=columns, column_types=types)
        return pcsv.read_csv(path, convert_options=options)
    except UnicodeDecodeError as error:
        raise _encoding_error(path, error, "file") from None
    except pa.ArrowInvalid as error:
        raise _csv_error(path, error) from error
    except (pa.ArrowException, OSError) as error:
        raise DatasetFormatError(f"unreadable table: {shorten(str(error))}", path=path) from error


def _csv_error(
    path: Path, error: pa.ArrowInvalid, names: list[str] | None = None
) -> DatasetFormatError:
    """pyarrow's CSV error as one that names the column by name and the data row
    (``names``: the file's columns, read from it when not given)."""
    conversion = _CSV_CONVERSION.match(str(error))
    if conversion is not None:
        names = column_names(path) if names is None else names
        index = int(conversion["index"])
        if index < len(names):
            column, kind = names[index], conversion["kind"].strip()
            expected = "a number" if kind in ("double", "float") else kind
            return DatasetFormatError(
                f"{shorten(conversion['detail'].strip())}, expected {expected}",
                path=path,
                column=column,
                row=_first_unconvertible(path, column, kind),
            )
    if str(error).startswith("CSV parse error"):
        malformed = _first_malformed_row(path)
        if malformed is not None:
            return DatasetFormatError(
                f"{malformed.actual_columns} field(s) where the header has "
                f"{malformed.expected_columns}: {quote(malformed.text)}",
                path=path,
                row=None if malformed.number is None else malformed.number - 2,
            )
    return DatasetFormatError(f"unreadable table: {shorten(str(error))}", path=path)


def _first_unconvertible(path: Path, column: str, kind: str) -> int | None:
    """The first data row of ``column`` that does not convert to ``kind`` (a pyarrow
    type name), read again as text; None if that cannot be told."""
    try:
        target = pa.type_for_alias(kind)
        options = pcsv.ConvertOptions(
            include_columns=[column], column_types={column: pa.string()}, strings_can_be_null=True
        )
        text = pcsv.read_csv(path, convert_options=options).column(column)
    except (pa.ArrowException, OSError, ValueError):
        return None
    # The CSV reader trims blanks around a number; a cast does not.
    return _first_failing_cast(pc.utf8_trim_whitespace(text), target)


def _first_failing_cast(values: pa.ChunkedArray, target: pa.DataType) -> int | None:
    """The first index of ``values`` that does not cast to ``target``, by bisecting over
    prefixes (a few casts, however long the column)."""

    def casts(stop: int) -> bool:
        try:
            pc.cast(values.slice(0, stop), target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return False
        return True

    if casts(len(values)):
        return None
    good, bad = 0, len(values)
    while bad - good > 1:
        middle = (good + bad) // 2
        if casts(middle):
            good = middle
        else:
            bad = middle
    return bad - 1


def _first_malformed_row(path: Path) -> Any:
    """pyarrow's description (``InvalidRow``) of the first row with the wrong number of
    fields; its ``number`` counts lines from 1, header included."""
    found = []

    def keep(row: Any) -> str:
        found.append(row)
        return "error"

    with contextlib.suppress(pa.ArrowException, OSError):
        pcsv.read_csv(
            path,
            read_options=pcsv.ReadOptions(use_threads=False),  # numbers rows
            parse_options=pcsv.ParseOptions(invalid_row_handler=keep),
        )
    return found[0] if found else None


def first_null(array: pa.ChunkedArray) -> int | None:
    if array.null_count == 0:
        return None
    return int(np.flatnonzero(pc.is_null(array).to_numpy())[0])


def numeric_values(table: pa.Table, column: str, path: Path) -> np.ndarray:
    array = table.column(column)
    kind = array.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        row = _first_failing_cast(pc.utf8_trim_whitespace(array), pa.float64())
        if row is not None:
            raise DatasetFormatError(
                f"{quote(array[row].as_py())} is not a number", path=path, column=column, row=row
            )
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)):
        raise DatasetFormatError(f"holds {kind}, expected numbers", path=path, column=column)
    row = first_null(array)
    if row is not None:
        raise DatasetFormatError(
            f"missing value (empty, NA or NaN); {MISSING_HINT}", path=path, column=column, row=row
        )
    values = array.to_numpy().astype(np.float64)
    finite = np.isfinite(values)
    if not finite.all():
        row = int(np.argmin(finite))
        raise DatasetFormatError(
            f"{values[row]} is not a finite number; {MISSING_HINT}",
            path=path,
            column=column,
            row=row,
        )
    return values
