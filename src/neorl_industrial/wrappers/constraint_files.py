"""Constraint specs as files: what a safety engineer writes in YAML, read into a
:class:`~neorl_industrial.core.safety.ConstraintSpec` (safely: no aliases, a size cap,
errors that name the file and the field) and written back.

    spec = load_constraint_spec("examples/mixing-tank/constraints.yaml")
    text = constraint_spec_yaml(spec)       # what an artifact or a saved agent stores
    assert constraint_spec_from_text(text) == spec
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from neorl_industrial.core.safety import ConstraintSpec, ConstraintSpecError
from neorl_industrial.wrappers.hostio import YamlError, dump_yaml, load_yaml_text, read_yaml

__all__ = ["constraint_spec_from_text", "constraint_spec_yaml", "load_constraint_spec"]


def load_constraint_spec(
    source: ConstraintSpec | str | Path | Mapping[str, Any],
) -> ConstraintSpec:
    """A constraint spec from a YAML file, a mapping, or a spec (returned as is).

    Raises:
        ConstraintSpecError: naming the file and the field.
    """
    if isinstance(source, ConstraintSpec):
        return source
    if isinstance(source, Mapping):
        return ConstraintSpec.from_dict(source)
    try:
        data = read_yaml(source, what="constraint spec")
    except YamlError as error:
        raise ConstraintSpecError(str(error)) from None
    return ConstraintSpec.from_dict(data if data is not None else {}, str(source))


def constraint_spec_from_text(text: str, source: str = "constraint spec") -> ConstraintSpec:
    """A constraint spec from YAML text (as stored in a manifest or an artifact).

    Raises:
        ConstraintSpecError: naming ``source`` and the field.
    """
    try:
        data = load_yaml_text(text, source)
    except YamlError as error:
        raise ConstraintSpecError(str(error)) from None
    return ConstraintSpec.from_dict(data if data is not None else {}, source)


def constraint_spec_yaml(spec: ConstraintSpec) -> str:
    """``spec`` as YAML that :func:`constraint_spec_from_text` reads back."""
    return dump_yaml(spec.to_dict())
