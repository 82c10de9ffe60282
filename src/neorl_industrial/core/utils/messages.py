"""Error messages that quote untrusted input: values cut to a readable length, and
pydantic's validation errors as ``source: field.path: message`` lines with a "did you
mean" for a misspelled key.

A value read from a file or a request can be megabytes long; every error that quotes
one goes through :func:`quote`, so a message stays a line, whatever the input.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

__all__ = ["QUOTE_LIMIT", "quote", "shorten", "unknown_key", "validation_lines"]

# Characters of a quoted value kept in a message.
QUOTE_LIMIT = 80


def quote(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)``, cut to ``limit`` characters with the full length said, e.g.
    ``'xxxx…' (20971520 characters)``."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = len(value) if isinstance(value, str | bytes) else len(text)
    unit = "bytes" if isinstance(value, bytes) else "characters"
    return f"{text[:limit]}… ({size} {unit})"


def shorten(text: str, limit: int = 4 * QUOTE_LIMIT) -> str:
    """``text`` (a message from a library that may embed an input value) cut to
    ``limit`` characters, with its full length said."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


def unknown_key(key: Any, known: Sequence[str]) -> str:
    """``unknown field 'x'; did you mean 'y'?`` (or the known fields when none is close)."""
    close = difflib.get_close_matches(str(key), list(known), n=3) if isinstance(key, str) else []
    if close:
        hint = " or ".join(repr(name) for name in close)
        return f"unknown field {quote(key)}; did you mean {hint}?"
    return f"unknown field {quote(key)}; expected one of {sorted(known)}"


def validation_lines(error: ValidationError, model: type[BaseModel], source: str) -> list[str]:
    """One ``source: field.path: message`` line per error of ``model``'s validation
    (``field.path: message`` when ``source`` is empty).

    An unknown key (``extra="forbid"``) names the closest fields of the model it was
    found in; values quoted by pydantic are cut by :func:`quote`.
    """
    lines = []
    for item in error.errors():
        location = tuple(item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            parent = _model_at(model, location[:-1])
            if parent is not None:
                message = unknown_key(location[-1], _field_names(parent))
        prefix = f"{source}: " if source else ""
        lines.append(f"{prefix}{_path(location) or '<root>'}: {shorten(message)}")
    return lines


def _path(location: tuple[Any, ...]) -> str:
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def _field_names(model: type[BaseModel]) -> list[str]:
    names = []
    for name, field in model.model_fields.items():
        names.append(field.alias or name)
    return names


def _model_at(model: type[BaseModel], location: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that the value at ``location`` (inside ``model``) is validated
    as, or None when it cannot be told (a union of models, say)."""
    annotation: Any = model
    for part in location:
        annotation = _unwrap(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if not isinstance(part, str) or part not in annotation.model_fields:
                return None
            annotation = annotation.model_fields[part].annotation
            continue
        origin = typing.get_origin(annotation)
        arguments = typing.get_args(annotation)
        if origin in (list, tuple, Sequence) and arguments and isinstance(part, int):
            annotation = arguments[0]
        elif origin in (dict, Mapping) and len(arguments) == 2:
            annotation = arguments[1]
        else:
            return None
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _unwrap(annotation: Any) -> Any:
    """``X`` of ``X | None`` (or of a union whose only model is ``X``)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [
            argument
            for argument in typing.get_args(annotation)
            if isinstance(argument, type) and issubclass(argument, BaseModel)
        ]
        others = [
            argument
            for argument in typing.get_args(annotation)
            if argument is not type(None) and argument not in models
        ]
        if len(models) == 1:
            return models[0]
        if len(others) == 1 and not models:
            return others[0]
    return annotation
