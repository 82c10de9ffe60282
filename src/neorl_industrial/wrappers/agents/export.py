"""The exported policy: a directory that a server loads and serves without training code.

:func:`export_policy` puts the safety shield behind a deterministic policy and
serializes the result with :mod:`jax.export`, batch size symbolic, so one artifact serves
one observation or thousands on the platforms it was lowered for. The functions take the
policy's parameters (the observation normalizer included) as their first argument, stored
beside them in ``params.npz``: policies of one architecture are one program, compiled
once by a server that loads them in turn (JAX's compilation caches hold it). The layout::

    manifest.json           format version, versions, sizes, names, action bounds,
                            observation bounds, the data's range, constraint names,
                            status bits, outputs, metadata, sha256 of every file
    serve.jaxexport         serve(parameters, observations, prev_actions), any batch
                            size (used below 64 rows, BRANCH_MIN_BATCH)
    serve_large.jaxexport   batches of 64 rows or more (the same function, its batch
                            size bounded; both branch once per batch on the repair)
    check.jaxexport         batches below 64 rows: the policy and the shield's reading
                            without the repair; a batch that keeps every rule is served
                            from it (the same outputs), any other by serve (every
                            function takes the parameters first)
    constraints.yaml        the constraint spec the shield enforces
    params.npz              the parameters the functions take: leaf_0 ... leaf_<n-1>,
                            the array leaves of the parameter tree in its order
    params.msgpack          the policy's parameters by path, for inspection only
    signature.json          (when signed) Ed25519 signature of the manifest (:mod:`.signing`)

:class:`~.artifact.PolicyArtifact` (re-exported here) loads and serves it. Neither module
imports optax, the agents or the training loops.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import io
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flax import serialization

from neorl_industrial.core.safety import CompiledConstraints, ConstraintSpec, shield
from neorl_industrial.core.safety.shield import BRANCH_MIN_BATCH, shield_check
from neorl_industrial.version import __version__
from neorl_industrial.wrappers.agents.artifact import (
    _FUNCTIONS,
    CHECK,
    CONSTRAINTS,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    OUTPUTS,
    PARAMETERS,
    STATUS_BITS,
    PolicyArtifact,
    PolicyArtifactError,
    PolicyDecision,
    _digest,
)
from neorl_industrial.wrappers.agents.artifact_files import PARAMETER_ARRAYS
from neorl_industrial.wrappers.agents.signing import (
    SIGNATURE,
    SigningError,
    load_private_key,
    sign_manifest,
)
from neorl_industrial.wrappers.constraint_files import constraint_spec_yaml
from neorl_industrial.wrappers.hostio import (
    to_json_data,
    write_directory_atomic,
)

__all__ = [
    "FORMAT",
    "FORMATS",
    "FORMAT_VERSION",
    "ExportOptions",
    "PolicyArtifact",
    "PolicyArtifactError",
    "PolicyDecision",
    "PolicyExport",
    "PolicyInterface",
    "PolicyProgram",
    "export_policy",
]


#: What ``export_policy(format=...)`` writes: the serialized JAX functions, or those and
#: the same function as one ONNX graph.
FORMATS = ("jax", "onnx")


# ----- what is exported --------------------------------------------------------------
@dataclass(frozen=True)
class PolicyProgram:
    """The policy to serve.

    Attributes:
        act: ``act(policy_params, observation) -> action``, a pure deterministic JAX
            function of one ``[observation_size]`` observation.
        policy_params: what ``act`` reads; its array leaves are the serialized
            functions' first argument (``params.npz``), its other leaves (Python numbers,
            weakly typed scalars, PRNG keys) are baked into them.
    """

    act: Callable[[Any, jax.Array], jax.Array]
    policy_params: Any


@dataclass(frozen=True)
class PolicyInterface:
    """The task the exported function is built for: sizes, names, units and bounds. The
    manifest records it, and a server compares it with the task it pins.

    Attributes:
        observation_size: length of an observation.
        action_size: length of an action.
        action_low: ``[action_size]`` the plant's action bounds, low ...
        action_high: ... and high. They bound every action the spec leaves unbounded.
        observation_names: names of the features (default ``observation_i``).
        action_names: names of the actions (default ``action_i``).
        observation_bounds: ``(low, high)`` physical bounds per feature (``±inf`` where
            unknown): the shield sends the fallback for an observation outside them.
        observation_units: the unit of each feature (``None``: not stated).
        action_units: the unit of each action (``None``: not stated).
        data_bounds: ``(low, high)`` per feature, the range of the data the policy learnt
            from (``±inf`` where not checked; a task's ``data_low``/``data_high``): an
            observation outside it is flagged ``out_of_distribution`` and decided as any
            other. ``None``: nothing is flagged.
    """

    observation_size: int
    action_size: int
    action_low: Sequence[float] | np.ndarray
    action_high: Sequence[float] | np.ndarray
    observation_names: Sequence[str] | None = None
    action_names: Sequence[str] | None = None
    observation_bounds: tuple[Sequence[float], Sequence[float]] | None = None
    observation_units: Sequence[str | None] | None = None
    action_units: Sequence[str | None] | None = None
    data_bounds: tuple[Sequence[float], Sequence[float]] | None = None


@dataclass(frozen=True)
class ExportOptions:
    """How the artifact is written.

    Attributes:
        overwrite: replace an existing artifact at the path.
        platforms: the platforms the function is lowered for.
        signing_key: an Ed25519 private key (object or PEM file) that signs the
            manifest into ``signature.json``; ``None``: unsigned.
        format: ``"jax"``, the serialized JAX functions; ``"onnx"``, those and
            ``policy.onnx``, the same function as one ONNX graph (opset 18, any batch
            size), checked against the JAX function on the shield's edge cases before it
            is written (:mod:`.onnx_export`). The manifest lists it and its sha256 like
            every other file, so a signature covers it.
    """

    overwrite: bool = False
    platforms: Sequence[str] = ("cpu", "cuda")
    signing_key: str | os.PathLike[str] | Ed25519PrivateKey | None = None
    format: str = "jax"


@dataclass(frozen=True)
class PolicyExport:
    """Everything :func:`export_policy` writes: the policy, its task, the hard
    constraints, the metadata and how to write them.

    Attributes:
        policy: the policy's function and parameters.
        interface: the task's sizes, names, units and bounds.
        constraints_spec: the hard constraints the shield enforces; ``None``: the action
            bounds alone, with the hold-previous fallback.
        metadata: JSON data stored in the manifest (algorithm, config, training summary).
        options: overwrite, platforms, signing and format.
    """

    policy: PolicyProgram
    interface: PolicyInterface
    constraints_spec: ConstraintSpec | None = None
    metadata: Mapping[str, Any] | None = None
    options: ExportOptions = ExportOptions()

    @classmethod
    def from_arguments(cls, **arguments: Any) -> PolicyExport:
        """The export of ``export_policy``'s keyword arguments, one per field of the
        groups (``act=..., observation_size=..., format=...``).

        Raises:
            TypeError: for an argument no group has, or a required one missing.
        """
        groups = {}
        for group in (PolicyProgram, PolicyInterface, ExportOptions):
            names = [field.name for field in fields(group) if field.name in arguments]
            groups[group] = group(**{name: arguments.pop(name) for name in names})
        return cls(
            groups[PolicyProgram],
            groups[PolicyInterface],
            options=groups[ExportOptions],
            **arguments,
        )


@dataclass(frozen=True)
class _Parameters:
    """A policy's parameters as the serialized functions take them.

    Attributes:
        arrays: the array leaves of the parameter tree in its order, as given: the
            functions' first argument and the arrays of ``params.npz``.
        rebuild: the parameter tree of such arrays (tracers when traced), with the
            leaves that are not arguments as given.
    """

    arrays: tuple[Any, ...]
    rebuild: Callable[[Sequence[Any]], Any]

    @classmethod
    def of(cls, policy_params: Any) -> _Parameters:
        leaves, treedef = jax.tree.flatten(policy_params)
        positions = [index for index, leaf in enumerate(leaves) if _is_argument(leaf)]

        def rebuild(arrays: Sequence[Any]) -> Any:
            filled = list(leaves)
            for index, array in zip(positions, arrays, strict=True):
                filled[index] = array
            return jax.tree.unflatten(treedef, filled)

        return cls(tuple(leaves[index] for index in positions), rebuild)

    def file(self) -> bytes:
        """``params.npz``: the arrays as ``leaf_0`` ... ``leaf_<n-1>``."""
        buffer = io.BytesIO()
        np.savez(buffer, **{f"leaf_{i}": np.asarray(a) for i, a in enumerate(self.arrays)})
        return buffer.getvalue()


def _is_argument(leaf: Any) -> bool:
    """Whether a parameter leaf is passed to the serialized functions: an array of
    numbers. A weakly typed scalar stays a constant (as an argument it would be strongly
    typed, and could promote what it is combined with differently), as do Python numbers
    and PRNG keys."""
    if isinstance(leaf, jax.Array):
        return not leaf.weak_type and not jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)
    return isinstance(leaf, np.ndarray | np.generic) and leaf.dtype != np.dtype(object)


@dataclass(frozen=True)
class _Checked:
    """An export's arguments as validated: what the serialized function and the manifest
    are built from."""

    interface: PolicyInterface  # sizes as ints, names as tuples, units as lists or None
    low: np.ndarray
    high: np.ndarray
    spec: ConstraintSpec  # with the action bounds on every action it leaves unbounded
    compiled: CompiledConstraints
    metadata: dict[str, Any]
    signing_key: Ed25519PrivateKey | None
    platforms: tuple[str, ...]


# ----- export ------------------------------------------------------------------------
def export_policy(
    path: str | os.PathLike[str], export: PolicyExport | None = None, **arguments: Any
) -> Path:
    """Writes a self-contained policy artifact directory (see the module docstring).

    Args:
        path: the directory to create (atomically: it appears complete or not at all).
        export: what to write (:class:`PolicyExport`).
        **arguments: instead of ``export``, its fields one by one, as
            :meth:`PolicyExport.from_arguments` takes them (``act``, ``policy_params``,
            ``observation_size``, ..., ``format``).

    Every call returns the action, the proposal, the shield's status bits and its
    ``[batch, 2, n_constraints]`` margins (of the proposed action, then of the applied
    one), read by :class:`~.artifact.PolicyArtifact` as ``PolicyDecision.margin`` and
    ``applied_margin``.

    Returns:
        ``path``.

    Raises:
        PolicyArtifactError: for arguments that cannot be exported, naming them.
        OnnxExportError: (a ``PolicyArtifactError``) for ``format="onnx"`` and a policy
            whose function has no ONNX form, naming the JAX primitive, or an ONNX graph
            whose actions differ from the JAX function's.
        ConstraintSpecError: for a spec that does not fit these names and sizes.
        FileExistsError: if ``path`` exists and ``overwrite`` is false.
        TypeError: for both ``export`` and ``arguments``, or arguments it does not take.
    """
    if export is None:
        export = PolicyExport.from_arguments(**arguments)
    elif arguments:
        raise TypeError(f"export_policy: pass export or its fields, not both: {sorted(arguments)}")
    target = Path(path)
    checked = _checked(target, export)
    parameters = _Parameters.of(export.policy.policy_params)
    serve = _serving_function(export.policy.act, parameters, checked.compiled)
    files, functions, calling_convention = _serialized(serve, parameters, checked)
    check = _check_function(export.policy.act, parameters, checked.compiled)
    files[CHECK] = _serialized_check(check, parameters, checked)
    onnx = export.options.format == "onnx"
    onnx_entry = _onnx_graph(files, serve, parameters, checked) if onnx else None
    files[CONSTRAINTS] = constraint_spec_yaml(checked.spec).encode()
    files[PARAMETER_ARRAYS] = parameters.file()
    files[PARAMETERS] = serialization.msgpack_serialize(
        _parameters_by_path(export.policy.policy_params)
    )
    versions = _versions(calling_convention, onnx=onnx)
    manifest = _manifest(checked, functions, versions, len(parameters.arrays))
    manifest["check"] = {"file": CHECK, "max_batch": BRANCH_MIN_BATCH - 1}
    if onnx_entry is not None:
        manifest["onnx"] = onnx_entry
    manifest["files"] = {
        name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())
    }
    manifest["manifest_sha256"] = _digest(manifest)
    files[MANIFEST] = json.dumps(manifest, indent=2, allow_nan=False).encode()
    if checked.signing_key is not None:
        signature = sign_manifest(manifest, checked.signing_key)
        files[SIGNATURE] = json.dumps(signature, indent=2).encode()
    write_directory_atomic(
        target, files, marker=MANIFEST, what="a policy artifact", overwrite=export.options.overwrite
    )
    return target


def _checked(target: Path, export: PolicyExport) -> _Checked:
    """``export`` validated, in the order the errors are reported: format, target,
    signing key, sizes, names, action bounds, units, constraints, metadata, ``act``.

    Raises:
        PolicyArtifactError, ConstraintSpecError, FileExistsError: as
        :func:`export_policy` lists them.
    """
    options, given = export.options, export.interface
    if options.format not in FORMATS:
        raise PolicyArtifactError(
            f"format: expected one of {list(FORMATS)}, got {options.format!r}"
        )
    if target.exists() and not options.overwrite:
        raise FileExistsError(f"{target}: already exists; pass overwrite=True to replace it")
    signing_key = None
    if options.signing_key is not None:
        try:
            signing_key = load_private_key(options.signing_key)
        except SigningError as error:
            raise PolicyArtifactError(f"signing_key: {error}") from None
    observation_size = _positive_int(given.observation_size, "observation_size")
    action_size = _positive_int(given.action_size, "action_size")
    observation_names = _names(given.observation_names, observation_size, "observation")
    action_names = _names(given.action_names, action_size, "action")
    low = _bound(given.action_low, action_size, "action_low")
    high = _bound(given.action_high, action_size, "action_high")
    if np.any(low > high):
        column = int(np.argmax(low > high))
        raise PolicyArtifactError(
            f"action_low: {low[column]} is above action_high {high[column]} "
            f"for action {action_names[column]!r}"
        )
    interface = replace(
        given,
        observation_size=observation_size,
        action_size=action_size,
        observation_names=observation_names,
        action_names=action_names,
        observation_units=_units(given.observation_units, observation_size, "observation"),
        action_units=_units(given.action_units, action_size, "action"),
    )
    spec = _effective_spec(export.constraints_spec, action_names, low, high)
    compiled = spec.compile(
        observation_size,
        action_size,
        observation_names,
        action_names,
        observation_bounds=given.observation_bounds,
        data_bounds=given.data_bounds,
    )
    try:
        metadata = to_json_data(dict(export.metadata or {}), where="metadata", strict=True)
    except ValueError as error:
        raise PolicyArtifactError(str(error)) from None
    _check_act(export.policy.act, export.policy.policy_params, observation_size, action_size)
    platforms = tuple(options.platforms)
    return _Checked(interface, low, high, spec, compiled, metadata, signing_key, platforms)


#: ``function(parameter_arrays, observations, prev_actions) -> outputs``.
_Function = Callable[[Sequence[jax.Array], jax.Array, jax.Array], tuple[jax.Array, ...]]


def _proposals(
    act: Callable[[Any, jax.Array], jax.Array], policy_params: Any, observations: jax.Array
) -> jax.Array:
    """The policy's float32 action for every row of ``observations``."""
    proposed = jax.vmap(lambda observation: act(policy_params, observation))(observations)
    return jnp.asarray(proposed, jnp.float32)


def _serving_function(
    act: Callable[[Any, jax.Array], jax.Array],
    parameters: _Parameters,
    compiled: CompiledConstraints,
) -> _Function:
    """``serve(parameter_arrays, observations, prev_actions) -> (action, proposed, status,
    margins)``: the policy on every row, behind the shield."""
    # The batch shield branches once for the whole batch: the repair runs only when some
    # row needs it (the shield under vmap would compute every row's repair).
    guard = functools.partial(shield, compiled)

    def serve(
        arrays: Sequence[jax.Array], observations: jax.Array, prev_actions: jax.Array
    ) -> tuple[jax.Array, ...]:
        proposed = _proposals(act, parameters.rebuild(arrays), observations)
        safe, report = guard(observations, proposed, prev_actions)
        # The report's one margins array (proposed and applied): one output buffer.
        return safe, proposed, report.status.astype(jnp.int32), report.margins

    return serve


def _check_function(
    act: Callable[[Any, jax.Array], jax.Array],
    parameters: _Parameters,
    compiled: CompiledConstraints,
) -> _Function:
    """``check(parameter_arrays, observations, prev_actions) -> (kept, action, status,
    margins)``: the policy on every row and the shield's reading without its repair
    (:func:`~neorl_industrial.core.safety.shield.shield_check`); where ``kept`` the
    outputs are :func:`_serving_function`'s (the proposal applied untouched)."""

    def check(
        arrays: Sequence[jax.Array], observations: jax.Array, prev_actions: jax.Array
    ) -> tuple[jax.Array, ...]:
        proposed = _proposals(act, parameters.rebuild(arrays), observations)
        kept, status, margins = shield_check(compiled, observations, proposed, prev_actions)
        return kept, proposed, status.astype(jnp.int32), margins

    return check


def _serialized_check(check: _Function, parameters: _Parameters, checked: _Checked) -> bytes:
    """``check`` serialized with :mod:`jax.export` for batches below the branch size."""
    constraints = (f"batch <= {BRANCH_MIN_BATCH - 1}",)
    return _exported(check, parameters, CHECK, constraints, checked).serialize()


def _exported(
    function: _Function,
    parameters: _Parameters,
    name: str,
    constraints: tuple[str, ...],
    checked: _Checked,
) -> Any:
    """``function(parameter_arrays, observations, prev_actions)`` exported for the
    artifact's platforms: the arrays of the shapes and dtypes of ``parameters.arrays``,
    the batch size symbolic under ``constraints``; a failure is named by its file
    ``name``."""
    platforms = checked.platforms
    interface = checked.interface
    (batch,) = jax.export.symbolic_shape("batch", constraints=constraints)
    arrays = tuple(jax.ShapeDtypeStruct(np.shape(a), a.dtype) for a in parameters.arrays)
    try:
        return jax.export.export(jax.jit(function), platforms=platforms)(
            arrays,
            jax.ShapeDtypeStruct((batch, interface.observation_size), jnp.float32),
            jax.ShapeDtypeStruct((batch, interface.action_size), jnp.float32),
        )
    except ImportError as error:
        raise PolicyArtifactError(f"{name}: cannot serialize the policy: {error}") from None
    except Exception as error:
        raise PolicyArtifactError(
            f"{name}: cannot export the policy for platforms {list(platforms)}: {error}"
        ) from error


def _serialized(
    serve: _Function, parameters: _Parameters, checked: _Checked
) -> tuple[dict[str, bytes], list[dict[str, Any]], int]:
    """``serve`` serialized with :mod:`jax.export`, once per entry of ``_FUNCTIONS``:
    ``(files, their manifest entries, the calling convention version)``."""
    files: dict[str, bytes] = {}
    functions = []
    for name, min_batch in _FUNCTIONS:
        constraints = () if min_batch == 1 else (f"batch >= {min_batch}",)
        exported = _exported(serve, parameters, name, constraints, checked)
        files[name] = exported.serialize()
        functions.append({"file": name, "min_batch": min_batch})
    return files, functions, exported.calling_convention_version


def _manifest(
    checked: _Checked,
    functions: list[dict[str, Any]],
    versions: dict[str, Any],
    n_parameters: int,
) -> dict[str, Any]:
    """The manifest up to its ``check``, ``onnx``, ``files`` and digest entries, of
    functions taking ``n_parameters`` arrays first."""
    interface, compiled = checked.interface, checked.compiled
    data_range = compiled.checks_data_range
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "versions": versions,
        "platforms": list(checked.platforms),
        "observation_size": interface.observation_size,
        "action_size": interface.action_size,
        "observation_names": list(interface.observation_names),
        "action_names": list(interface.action_names),
        "action_low": checked.low.tolist(),
        "action_high": checked.high.tolist(),
        "observation_low": _finite_or_none(compiled.observation_low),
        "observation_high": _finite_or_none(compiled.observation_high),
        # The range the shield flags observations outside of (null: no range given).
        "data_low": _finite_or_none(compiled.data_low) if data_range else None,
        "data_high": _finite_or_none(compiled.data_high) if data_range else None,
        "observation_units": interface.observation_units,
        "action_units": interface.action_units,
        "constraints": {
            "file": CONSTRAINTS,
            "name": checked.spec.name,
            "names": list(compiled.names),
            "fallback": compiled.fallback_kind,
        },
        "status_bits": dict(STATUS_BITS),
        "functions": functions,
        "inputs": [
            f"parameters: the {n_parameters} arrays of {PARAMETER_ARRAYS} (leaf_0 ...)",
            "observations [batch, observation_size]",
            "prev_actions [batch, action_size]",
        ],
        "outputs": list(OUTPUTS),
        "metadata": checked.metadata,
    }


def _positive_int(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise PolicyArtifactError(f"{field}: expected a positive integer, got {value!r}")
    return int(value)


def _names(names: Sequence[str] | None, size: int, what: str) -> tuple[str, ...]:
    if names is None:
        return tuple(f"{what}_{i}" for i in range(size))
    names = tuple(names)
    if len(names) != size or not all(isinstance(name, str) and name for name in names):
        raise PolicyArtifactError(
            f"{what}_names: expected {size} non-empty names, got {len(names)}: {list(names)[:8]}"
        )
    if len(set(names)) != size:
        repeated = sorted({name for name in names if names.count(name) > 1})
        raise PolicyArtifactError(f"{what}_names: names must be unique; repeated: {repeated}")
    return names


def _units(units: Sequence[str | None] | None, size: int, what: str) -> list[str | None] | None:
    if units is None or len(units) == 0:
        return None
    units = list(units)
    if len(units) != size or not all(unit is None or isinstance(unit, str) for unit in units):
        raise PolicyArtifactError(
            f"{what}_units: expected {size} strings or nulls (one per {what}), got {units[:8]}"
        )
    return units


def _finite_or_none(values: Any) -> list[float | None]:
    """Bounds as JSON: an infinite bound (none known) as null."""
    return [float(v) if np.isfinite(v) else None for v in np.asarray(values, np.float64)]


def _bound(values: Any, size: int, field: str) -> np.ndarray:
    array = np.asarray(values, np.float64)
    if array.shape != (size,) or not np.all(np.isfinite(array)):
        raise PolicyArtifactError(
            f"{field}: expected {size} finite numbers (one per action), got {values!r}"
        )
    return array


def _effective_spec(
    spec: ConstraintSpec | None, action_names: tuple[str, ...], low: np.ndarray, high: np.ndarray
) -> ConstraintSpec:
    """The spec with ``[action_low, action_high]`` on every action it leaves unbounded."""
    if spec is None:
        spec = ConstraintSpec(name="action-bounds", description="the plant's action bounds")
    elif not isinstance(spec, ConstraintSpec):
        raise PolicyArtifactError(
            f"constraints_spec: expected a ConstraintSpec (e.g. load_constraint_spec), "
            f"got {type(spec).__name__}"
        )
    bounds = {name: [bound.low, bound.high] for name, bound in spec.action_bounds.items()}
    for name, lo, hi in zip(action_names, low.tolist(), high.tolist(), strict=True):
        bounds.setdefault(name, [lo, hi])
    if bounds.keys() == spec.action_bounds.keys():
        return spec
    return ConstraintSpec.from_dict({**spec.to_dict(), "action_bounds": bounds}, "constraints_spec")


def _check_act(act: Callable, policy_params: Any, observation_size: int, action_size: int) -> None:
    if not callable(act):
        raise PolicyArtifactError(f"act: expected a function, got {type(act).__name__}")
    observation = jax.ShapeDtypeStruct((observation_size,), jnp.float32)
    try:
        action = jax.eval_shape(act, policy_params, observation)
    except Exception as error:
        raise PolicyArtifactError(
            f"act: cannot be traced as act(policy_params, observation[{observation_size}]): "
            f"{type(error).__name__}: {error}"
        ) from error
    if (
        not isinstance(action, jax.ShapeDtypeStruct)
        or action.shape != (action_size,)
        or not jnp.issubdtype(action.dtype, jnp.floating)
    ):
        raise PolicyArtifactError(
            f"act: expected a float array [{action_size}] for one observation, got {action}"
        )


def _parameters_by_path(policy_params: Any) -> dict[str, np.ndarray]:
    leaves = jax.tree_util.tree_flatten_with_path(policy_params)[0]
    return {
        jax.tree_util.keystr(path, simple=True, separator="/"): np.asarray(leaf)
        for path, leaf in leaves
        if hasattr(leaf, "shape")
    }


def _onnx_graph(
    files: dict[str, bytes], function: _Function, parameters: _Parameters, checked: _Checked
) -> dict[str, Any]:
    """Adds ``policy.onnx`` (``function`` of ``parameters`` as one ONNX graph, the
    parameters its constants, checked against the serialized JAX function on the shield's
    edge cases) to ``files``; its manifest entry."""
    from neorl_industrial.wrappers.agents.onnx_export import (
        _PROBE_ROWS_PER_CLASS,
        EDGE_CLASSES,
        ONNX_FILE,
        edge_case_inputs,
        onnx_policy_graph,
    )

    # The function the JAX artifact serves batches of BRANCH_MIN_BATCH rows or more with
    # (it branches once per batch, which ONNX's If keeps): compared on more rows than that.
    compiled, data_bounds = checked.compiled, checked.interface.data_bounds
    large = jax.export.deserialize(bytearray(files[_FUNCTIONS[-1][0]]))
    reference = jax.jit(large.call)
    arrays = parameters.arrays
    probes = edge_case_inputs(
        compiled,
        max(_PROBE_ROWS_PER_CLASS * len(EDGE_CLASSES), BRANCH_MIN_BATCH),
        typical=None if data_bounds is None else _finite_range(data_bounds),
    )
    data, entry = onnx_policy_graph(
        functools.partial(function, arrays),
        checked.interface.observation_size,
        checked.interface.action_size,
        compiled.n_hard,
        trace_min_batch=BRANCH_MIN_BATCH,
        reference=lambda obs, prev: jax.device_get(reference(arrays, obs, prev)),
        probes=probes,
        metadata={"producer": "neorl_industrial", "neorl_industrial": __version__},
    )
    files[ONNX_FILE] = data
    return entry


def _finite_range(bounds: tuple[Sequence[float], Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    """``(low, high)`` with ``[-1, 1]`` where a side is not finite."""
    low, high = (np.asarray(bound, np.float64) for bound in bounds)
    known = np.isfinite(low) & np.isfinite(high)
    return np.where(known, low, -1.0), np.where(known, high, 1.0)


def _versions(calling_convention: int, onnx: bool = False) -> dict[str, Any]:
    try:
        jaxlib_version = version("jaxlib")
    except PackageNotFoundError:
        jaxlib_version = "unknown"
    versions = {
        "python": ".".join(map(str, sys.version_info[:3])),
        "jax": jax.__version__,
        "jaxlib": jaxlib_version,
        "neorl_industrial": __version__,
        "jax_export_calling_convention": calling_convention,
    }
    if onnx:
        versions.update({name: version(name) for name in ("onnx", "onnxruntime")})
    return versions
