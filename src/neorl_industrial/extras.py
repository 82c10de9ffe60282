"""The optional parts of the install, and the one line that names a missing one.

The core install trains, evaluates, saves and exports from Python. Each extra adds what one
use needs (``pip install 'neorl-industrial[serve]'``); :data:`EXTRAS` is the one table of
which extra provides which importable package. A missing package of an extra is reported
as :class:`MissingExtraError`, a ``ModuleNotFoundError`` whose message is one line naming
the extra to install: by :func:`require` (a package that needs an extra as a whole checks
on import), by :func:`optional_imports` (around the imports of a module that needs an
extra) and by the command line (any ``ModuleNotFoundError`` of a package in the table).
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from typing import NamedTuple

__all__ = [
    "DISTRIBUTION",
    "EXTRAS",
    "Extra",
    "MissingExtraError",
    "extra_of",
    "install_command",
    "missing_extra_message",
    "optional_imports",
    "require",
]

#: The distribution's name on the package index.
DISTRIBUTION = "neorl-industrial"


class Extra(NamedTuple):
    """One extra: the use it serves (the subject of "... needs the extra") and the
    top-level modules it makes importable that this package imports."""

    use: str
    modules: tuple[str, ...]


#: The extras by name (pyproject.toml's ``[project.optional-dependencies]``).
EXTRAS: dict[str, Extra] = {
    "serve": Extra(
        "serving",
        (
            "fastapi",
            "starlette",
            "uvicorn",
            "h11",
            "orjson",
            "pydantic_settings",
            "zxcvbn",
        ),
    ),
    "track": Extra(
        "tracking in MLflow (and its plots)",
        ("mlflow", "matplotlib", "pandas", "sqlalchemy", "alembic"),
    ),
    "team": Extra("a team's MLflow server (PostgreSQL, authentication)", ("psycopg", "flask_wtf")),
    "plant": Extra("reading plant logs (CSV, Parquet) and Minari datasets", ("pyarrow", "h5py")),
    "bridge": Extra("the OPC UA bridge to the plant floor", ("asyncua",)),
    "onnx": Extra("exporting or running ONNX policies", ("onnx", "onnxruntime")),
}

_EXTRA_OF_MODULE = {module: name for name, extra in EXTRAS.items() for module in extra.modules}


def extra_of(module: str | None) -> str | None:
    """The extra that provides ``module`` (a dotted name: its top-level package counts),
    or None for a module no extra provides."""
    if not module:
        return None
    return _EXTRA_OF_MODULE.get(module.partition(".")[0])


def install_command(extra: str) -> str:
    """``pip install 'neorl-industrial[<extra>]'``."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def missing_extra_message(extra: str) -> str:
    """The one line: ``serving needs the 'serve' extra: pip install 'neorl-industrial[serve]'``.

    Raises:
        KeyError: for an extra not in :data:`EXTRAS`.
    """
    return f"{EXTRAS[extra].use} needs the '{extra}' extra: {install_command(extra)}"


class MissingExtraError(ModuleNotFoundError):
    """A package of an extra is not installed; the message names the extra to install and
    ``name`` the missing module."""

    def __init__(self, extra: str, module: str) -> None:
        super().__init__(missing_extra_message(extra), name=module)
        self.extra = extra

    @classmethod
    def from_error(cls, error: ModuleNotFoundError) -> MissingExtraError | None:
        """The error for ``error``'s missing module, or None when no extra provides it."""
        if isinstance(error, MissingExtraError):
            return error
        extra = extra_of(error.name)
        return None if extra is None else cls(extra, error.name or "")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a broken module
        return False


def require(extra: str) -> None:
    """Checks that every module of ``extra`` can be imported, without importing any.

    Raises:
        MissingExtraError: naming ``extra``, for the first module that cannot.
        KeyError: for an extra not in :data:`EXTRAS`.
    """
    for module in EXTRAS[extra].modules:
        if not _installed(module):
            raise MissingExtraError(extra, module)


@contextlib.contextmanager
def optional_imports() -> Iterator[None]:
    """Around imports of optional packages: a ``ModuleNotFoundError`` for a module an
    extra provides becomes :class:`MissingExtraError` naming that extra; any other passes
    unchanged."""
    try:
        yield
    except ModuleNotFoundError as error:
        missing = MissingExtraError.from_error(error)
        if missing is None or missing is error:
            raise
        raise missing from error
