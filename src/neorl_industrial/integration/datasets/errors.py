"""The one error type every dataset reader and writer raises for bad input."""

from __future__ import annotations

from os import PathLike


class DatasetFormatError(ValueError):
    """A dataset file or schema is malformed; the message names the file, column and row.

    The location is also kept as attributes (``path``, ``column``, ``row``) so a CLI or a
    UI can point at the offending cell without parsing the message.

    Args:
        message: what is wrong and, where it helps, what would be right.
        path: the file (or directory) that holds the bad input.
        column: the column, key or array the problem is in.
        row: the 0-based data row (header not counted) of the first bad value.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | PathLike[str] | None = None,
        column: str | None = None,
        row: int | None = None,
    ):
        self.path = None if path is None else str(path)
        self.column = column
        self.row = row
        where = []
        if column is not None:
            where.append(f"column '{column}'")
        if row is not None:
            where.append(f"row {row}")
        prefix = f"{self.path}: " if self.path is not None else ""
        location = f"{', '.join(where)}: " if where else ""
        super().__init__(f"{prefix}{location}{message}")
