"""The exported policy: a directory that a server loads and serves without training code.

:func:`export_policy` closes a deterministic policy over its parameters (the
observation normalizer included), puts the safety shield behind it and serializes the
result with :mod:`jax.export`, batch size symbolic, so one artifact serves one
observation or thousands on the platforms it was lowered for. The layout::

    manifest.json           format version, versions, sizes, names, action bounds,
                            constraint names, status bits, metadata, sha256 of every file
    serve.jaxexport         any batch size (used below 64 rows, the shield's BRANCH_MIN_BATCH)
    serve_large.jaxexport   batches of 64 rows or more (the shield branches once per batch)
    constraints.yaml        the constraint spec the shield enforces
    params.msgpack          the policy's parameters by path, for inspection only

:class:`PolicyArtifact` verifies every file before it deserializes anything and answers
:meth:`PolicyArtifact.predict` with numpy arrays. This module imports JAX, numpy and the
safety layer only: neither optax nor the agents nor the training loops.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from neorl_industrial import __version__
from neorl_industrial.core.safety import TOLERANCE, ConstraintSpec, ConstraintSpecError, shield
from neorl_industrial.core.safety.shield import (
    BRANCH_MIN_BATCH,
    FALLBACK,
    INFEASIBLE,
    INVALID,
    OVERRIDDEN,
    PROJECTED,
)

__all__ = ["FORMAT", "FORMAT_VERSION", "PolicyArtifact", "PolicyArtifactError", "PolicyDecision"]

FORMAT = "neorl_industrial.policy"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
CONSTRAINTS = "constraints.yaml"
PARAMETERS = "params.msgpack"
OUTPUTS = ("action", "proposed", "status", "margin")
STATUS_BITS = {
    "overridden": OVERRIDDEN,
    "projected": PROJECTED,
    "fallback": FALLBACK,
    "invalid": INVALID,
    "infeasible": INFEASIBLE,
}
# Serialized functions by the smallest batch each serves: below BRANCH_MIN_BATCH rows
# the shield repairs every row in one select, from there on it branches once per batch
# (which a symbolic batch size can only do when the export knows which side it is on).
_FUNCTIONS = (("serve.jaxexport", 1), ("serve_large.jaxexport", BRANCH_MIN_BATCH))


class PolicyArtifactError(ValueError):
    """An artifact that cannot be written or loaded; the message names the file or field."""


# ----- export ------------------------------------------------------------------------
def export_policy(
    path: str | os.PathLike[str],
    *,
    act: Callable[[Any, jax.Array], jax.Array],
    policy_params: Any,
    observation_size: int,
    action_size: int,
    action_low: Sequence[float] | np.ndarray,
    action_high: Sequence[float] | np.ndarray,
    constraints_spec: ConstraintSpec | None = None,
    observation_names: Sequence[str] | None = None,
    action_names: Sequence[str] | None = None,
    metadata: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    platforms: Sequence[str] = ("cpu", "cuda"),
) -> Path:
    """Writes a self-contained policy artifact directory (see the module docstring).

    Args:
        path: the directory to create (atomically: it appears complete or not at all).
        act: ``act(policy_params, observation) -> action``, a pure deterministic JAX
            function of one ``[observation_size]`` observation.
        policy_params: what ``act`` reads; baked into the serialized function.
        observation_size: length of an observation.
        action_size: length of an action.
        action_low: ``[action_size]`` the plant's action bounds, low ...
        action_high: ... and high. They bound every action the spec leaves unbounded.
        constraints_spec: the hard constraints the shield enforces; ``None``: the action
            bounds alone, with the hold-previous fallback.
        observation_names: names of the features (default ``observation_i``).
        action_names: names of the actions (default ``action_i``).
        metadata: JSON data stored in the manifest (algorithm, config, training summary).
        overwrite: replace an existing artifact at ``path``.
        platforms: the platforms the function is lowered for.

    Returns:
        ``path``.

    Raises:
        PolicyArtifactError: for arguments that cannot be exported, naming them.
        ConstraintSpecError: for a spec that does not fit these names and sizes.
        FileExistsError: if ``path`` exists and ``overwrite`` is false.
    """
    target = Path(path)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target}: already exists; pass overwrite=True to replace it")
    observation_size = _positive_int(observation_size, "observation_size")
    action_size = _positive_int(action_size, "action_size")
    observation_names = _names(observation_names, observation_size, "observation")
    action_names = _names(action_names, action_size, "action")
    low = _bound(action_low, action_size, "action_low")
    high = _bound(action_high, action_size, "action_high")
    if np.any(low > high):
        column = int(np.argmax(low > high))
        raise PolicyArtifactError(
            f"action_low: {low[column]} is above action_high {high[column]} "
            f"for action {action_names[column]!r}"
        )
    spec = _effective_spec(constraints_spec, action_names, low, high)
    compiled = spec.compile(observation_size, action_size, observation_names, action_names)
    metadata = _plain(dict(metadata or {}), "metadata")
    _check_act(act, policy_params, observation_size, action_size)

    def serving(rowwise: bool) -> Callable[[jax.Array, jax.Array], tuple[jax.Array, ...]]:
        # Below BRANCH_MIN_BATCH the shield's batch path selects every row's repair; the
        # row-wise shield under vmap is the same select and needs no bound on the batch
        # size. From there on the batch shield branches once for the whole batch.
        guard = functools.partial(shield, compiled)
        guard = jax.vmap(guard) if rowwise else guard

        def serve(observations: jax.Array, prev_actions: jax.Array) -> tuple[jax.Array, ...]:
            proposed = jax.vmap(lambda observation: act(policy_params, observation))(observations)
            proposed = jnp.asarray(proposed, jnp.float32)
            safe, report = guard(observations, proposed, prev_actions)
            return safe, proposed, report.status.astype(jnp.int32), report.margin

        return serve

    platforms = tuple(platforms)
    files: dict[str, bytes] = {}
    functions = []
    for name, min_batch in _FUNCTIONS:
        function = serving(rowwise=min_batch < BRANCH_MIN_BATCH)
        constraints = () if min_batch == 1 else (f"batch >= {min_batch}",)
        (batch,) = jax.export.symbolic_shape("batch", constraints=constraints)
        try:
            exported = jax.export.export(jax.jit(function), platforms=platforms)(
                jax.ShapeDtypeStruct((batch, observation_size), jnp.float32),
                jax.ShapeDtypeStruct((batch, action_size), jnp.float32),
            )
            files[name] = exported.serialize()
        except ImportError as error:
            raise PolicyArtifactError(f"{name}: cannot serialize the policy: {error}") from None
        except Exception as error:
            raise PolicyArtifactError(
                f"{name}: cannot export the policy for platforms {list(platforms)}: {error}"
            ) from error
        functions.append({"file": name, "min_batch": min_batch})
    files[CONSTRAINTS] = spec.to_yaml().encode()
    files[PARAMETERS] = serialization.msgpack_serialize(_parameters_by_path(policy_params))

    manifest: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "versions": _versions(exported.calling_convention_version),
        "platforms": list(platforms),
        "observation_size": observation_size,
        "action_size": action_size,
        "observation_names": list(observation_names),
        "action_names": list(action_names),
        "action_low": low.tolist(),
        "action_high": high.tolist(),
        "constraints": {
            "file": CONSTRAINTS,
            "name": spec.name,
            "names": list(compiled.names),
            "fallback": compiled.fallback_kind,
        },
        "status_bits": dict(STATUS_BITS),
        "functions": functions,
        "inputs": ["observations [batch, observation_size]", "prev_actions [batch, action_size]"],
        "outputs": list(OUTPUTS),
        "metadata": metadata,
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())},
    }
    manifest["manifest_sha256"] = _digest(manifest)
    files[MANIFEST] = json.dumps(manifest, indent=2, allow_nan=False).encode()
    with _atomic_directory(target, overwrite=overwrite) as staging:
        for name, data in files.items():
            (staging / name).write_bytes(data)
    return target


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
            f"constraints_spec: expected a ConstraintSpec (e.g. ConstraintSpec.from_yaml), "
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


def _plain(value: Any, where: str) -> Any:
    """``value`` as JSON data, or an error naming the offending entry."""
    if isinstance(value, np.generic) and value.ndim == 0:
        value = value.item()
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PolicyArtifactError(
                f"{where}: {value} is not valid JSON; store null or a string instead"
            )
        return value
    if isinstance(value, Mapping):
        plain = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise PolicyArtifactError(f"{where}: keys must be strings, got {key!r}")
            plain[key] = _plain(item, f"{where}[{key!r}]")
        return plain
    if isinstance(value, list | tuple):
        return [_plain(item, f"{where}[{i}]") for i, item in enumerate(value)]
    hint = " (convert arrays with .tolist())" if hasattr(value, "shape") else ""
    if dataclasses.is_dataclass(value):
        hint = " (convert dataclasses with dataclasses.asdict)"
    raise PolicyArtifactError(f"{where}: {type(value).__name__} is not JSON data{hint}")


def _parameters_by_path(policy_params: Any) -> dict[str, np.ndarray]:
    leaves = jax.tree_util.tree_flatten_with_path(policy_params)[0]
    return {
        jax.tree_util.keystr(path, simple=True, separator="/"): np.asarray(leaf)
        for path, leaf in leaves
        if hasattr(leaf, "shape")
    }


def _versions(calling_convention: int) -> dict[str, Any]:
    try:
        jaxlib_version = version("jaxlib")
    except PackageNotFoundError:
        jaxlib_version = "unknown"
    return {
        "python": ".".join(map(str, sys.version_info[:3])),
        "jax": jax.__version__,
        "jaxlib": jaxlib_version,
        "neorl_industrial": __version__,
        "jax_export_calling_convention": calling_convention,
    }


def _digest(manifest: Mapping[str, Any]) -> str:
    body = {key: value for key, value in manifest.items() if key != "manifest_sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


@contextlib.contextmanager
def _atomic_directory(target: Path, *, overwrite: bool) -> Iterator[Path]:
    """Yields an empty sibling directory that becomes ``target`` when the block ends.

    An existing ``target`` is replaced only with ``overwrite`` and only if it is an
    artifact (or empty): it is moved aside, the new one renamed into place, and only
    then the old one deleted. On any error the staging directory is removed.
    """
    _check_replaceable(target, overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield staging
        for file in staging.iterdir():
            _fsync(file)
        _fsync(staging)
        _check_replaceable(target, overwrite)
        if target.exists():
            retired = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
            os.rename(target, retired)
            try:
                os.rename(staging, target)
            except BaseException:
                os.rename(retired, target)
                raise
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.rename(staging, target)
        _fsync(target.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _check_replaceable(target: Path, overwrite: bool) -> None:
    if not target.exists():
        return
    if not overwrite:
        raise FileExistsError(f"{target}: already exists; pass overwrite=True to replace it")
    if not target.is_dir() or (any(target.iterdir()) and not (target / MANIFEST).is_file()):
        raise FileExistsError(
            f"{target}: exists and is not a policy artifact (no {MANIFEST}); refusing to replace it"
        )


def _fsync(path: Path) -> None:
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        if path.is_dir():  # directories cannot be opened on every platform
            return
        raise
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


# ----- loading and serving -----------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PolicyDecision:
    """What the policy proposed and the shield applied, as numpy arrays.

    For one observation the arrays have no batch axis; for a batch their first axis is
    the row. ``status`` holds the shield's bits (``manifest["status_bits"]``); the
    boolean flags are read from it.
    """

    action: np.ndarray  # [..., action_size] the action to apply
    proposed: np.ndarray  # [..., action_size] the policy's own action (may be NaN)
    status: np.ndarray  # [...] int32 bit flags
    margin: np.ndarray  # [..., n_constraints] slack of the proposal per constraint
    overridden: np.ndarray  # [...] bool: the applied action differs from the proposal
    projected: np.ndarray  # [...] bool: the proposal was projected onto the constraints
    fallback: np.ndarray  # [...] bool: the fallback replaced the proposal
    invalid: np.ndarray  # [...] bool: the proposal was NaN or infinite
    infeasible: np.ndarray  # [...] bool: no action kept every constraint
    constraint_names: tuple[str, ...]

    @property
    def violated_mask(self) -> np.ndarray:
        """``[..., n_constraints]`` the constraints the proposal broke."""
        return ~(self.margin >= -TOLERANCE)

    @functools.cached_property
    def violated(self) -> tuple[str, ...] | tuple[tuple[str, ...], ...]:
        """Names of the constraints the proposal broke: a tuple for one observation, a
        tuple per row for a batch."""
        mask = self.violated_mask
        names = np.asarray(self.constraint_names, dtype=object)
        if mask.ndim == 1:
            return tuple(names[mask].tolist())
        # Rows share few patterns: each distinct pattern (a row's bits packed into bytes)
        # is named once.
        packed = np.ascontiguousarray(np.packbits(mask, axis=-1))
        patterns, row_pattern = np.unique(
            packed.view(f"V{packed.shape[-1]}").reshape(-1), return_inverse=True
        )
        width = mask.shape[-1]
        named = []
        for pattern in patterns:
            bits = np.unpackbits(np.frombuffer(pattern.tobytes(), np.uint8), count=width)
            named.append(tuple(names[bits.astype(bool)].tolist()))
        return tuple(named[pattern] for pattern in row_pattern.reshape(-1).tolist())


class PolicyArtifact:
    """A loaded, verified policy artifact. Build it with :meth:`load`."""

    def __init__(self, path: Path, manifest: dict[str, Any], functions: list, spec_text: str):
        self._path = path
        self._manifest = manifest
        self._spec_text = spec_text
        self._traced: list[int] = []
        # Largest first, so a batch takes the first function whose minimum it reaches.
        self._functions = sorted(
            ((entry["min_batch"], self._compiled(exported)) for entry, exported in functions),
            key=lambda item: -item[0],
        )
        self._observation_size = int(manifest["observation_size"])
        self._action_size = int(manifest["action_size"])
        self._names = tuple(manifest["constraints"]["names"])
        self._bits = {name: int(bit) for name, bit in manifest["status_bits"].items()}

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PolicyArtifact:
        """Reads and verifies the artifact at ``path``.

        Raises:
            PolicyArtifactError: naming the file that is missing, corrupt, of an unknown
                format version, or lowered for platforms this machine has none of.
        """
        path = Path(path)
        manifest = _read_manifest(path)
        digests = manifest["files"]
        for name in sorted({entry["file"] for entry in manifest["functions"]} | {CONSTRAINTS}):
            if name not in digests:
                raise PolicyArtifactError(f"{path / MANIFEST}: lists no sha256 for {name}")
        contents = {name: _verified(path, name, digest) for name, digest in digests.items()}
        platform = jax.default_backend()
        functions = []
        for entry in manifest["functions"]:
            name = entry["file"]
            try:
                exported = jax.export.deserialize(bytearray(contents[name]))
            except Exception as error:
                raise PolicyArtifactError(
                    f"{path / name}: cannot deserialize the policy function with jax "
                    f"{jax.__version__}: {type(error).__name__}: {error}"
                ) from None
            if platform not in exported.platforms:
                raise PolicyArtifactError(
                    f"{path / name}: lowered for {list(exported.platforms)}, but this machine "
                    f"runs on {platform!r}; export it again with platforms including {platform!r}"
                )
            functions.append((entry, exported))
        spec_text = contents[CONSTRAINTS].decode()
        artifact = cls(path, manifest, functions, spec_text)
        if artifact.constraint_spec.hard_names != artifact.constraint_names:
            raise PolicyArtifactError(
                f"{path / CONSTRAINTS}: its constraints {list(artifact.constraint_spec.hard_names)}"
                f" differ from the manifest's {list(artifact.constraint_names)}"
            )
        return artifact

    def _compiled(self, exported: jax.export.Exported) -> Callable:
        def call(observations: jax.Array, prev_actions: jax.Array) -> tuple[jax.Array, ...]:
            self._traced.append(int(observations.shape[0]))  # runs once per traced shape
            return exported.call(observations, prev_actions)

        return jax.jit(call)

    # ----- serving ---------------------------------------------------------------------
    def predict(
        self, observation: np.ndarray | Sequence[float], prev_action: np.ndarray | None = None
    ) -> PolicyDecision:
        """The shielded action for one observation ``[obs]`` or a batch ``[b, obs]``.

        Args:
            observation: raw plant observations (the normalizer is inside the artifact).
            prev_action: the actions applied at the previous step, ``[act]`` or
                ``[b, act]`` like the observation; ``None``: zeros, an episode's start.

        Raises:
            ValueError: for an observation or a previous action of the wrong shape or with
                values that are not finite, naming the field, row and feature.
        """
        observations, single = self._rows(observation, "observation", self.observation_names)
        rows = len(observations)
        if prev_action is None:
            prev_actions = np.zeros((rows, self._action_size), np.float32)
        else:
            prev_actions, prev_single = self._rows(prev_action, "prev_action", self.action_names)
            if prev_single != single or len(prev_actions) != rows:
                expected = [self._action_size] if single else [rows, self._action_size]
                raise ValueError(
                    f"prev_action: expected the shape {expected} of one action per "
                    f"observation, got {np.shape(prev_action)}"
                )
        padded = 1 << (rows - 1).bit_length()
        if padded != rows:
            # Batches are padded to a power of two (repeating the last row, so padding
            # cannot make the shield branch), which bounds the shapes that get compiled.
            pad = ((0, padded - rows), (0, 0))
            observations = np.pad(observations, pad, mode="edge")
            prev_actions = np.pad(prev_actions, pad, mode="edge")
        serve = next(function for min_batch, function in self._functions if padded >= min_batch)
        outputs = [output[:rows] for output in jax.device_get(serve(observations, prev_actions))]
        if single:
            outputs = [output[0] for output in outputs]
        action, proposed, status, margin = outputs
        flags = {name: (status & bit) != 0 for name, bit in self._bits.items()}
        return PolicyDecision(
            action=action,
            proposed=proposed,
            status=status,
            margin=margin,
            constraint_names=self._names,
            **{name: flags[name] for name in STATUS_BITS},
        )

    def warmup(self, batch_sizes: Sequence[int] = (1,)) -> None:
        """Compiles the shapes that ``batch_sizes`` use, so no request pays for it."""
        for size in batch_sizes:
            self.predict(np.zeros((size, self._observation_size), np.float32))

    def _rows(self, values: Any, field: str, names: tuple[str, ...]) -> tuple[np.ndarray, bool]:
        size = len(names)
        try:
            array = np.asarray(values, np.float32)
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"{field}: expected numbers, [{size}] or [batch, {size}]: {error}"
            ) from None
        if array.ndim not in (1, 2) or array.shape[-1] != size or array.size == 0:
            raise ValueError(
                f"{field}: expected shape [{size}] or [batch, {size}] (batch >= 1) with "
                f"columns {list(names[:8])}{' ...' if size > 8 else ''}, got {array.shape}"
            )
        single = array.ndim == 1
        array = array.reshape(-1, size)
        finite = np.isfinite(array)
        if not finite.all():
            row, column = (int(i) for i in np.argwhere(~finite)[0])
            where = "" if single else f" row {row}"
            raise ValueError(
                f"{field}:{where} {names[column]!r} is {array[row, column]}; expected a finite "
                "number (float32)"
            )
        return array, single

    # ----- description -------------------------------------------------------------------
    @property
    def path(self) -> Path:
        return self._path

    @property
    def manifest(self) -> dict[str, Any]:
        return json.loads(json.dumps(self._manifest))  # a copy the caller may change

    @property
    def metadata(self) -> dict[str, Any]:
        return self.manifest["metadata"]

    @property
    def observation_names(self) -> tuple[str, ...]:
        return tuple(self._manifest["observation_names"])

    @property
    def action_names(self) -> tuple[str, ...]:
        return tuple(self._manifest["action_names"])

    @property
    def action_low(self) -> np.ndarray:
        return np.asarray(self._manifest["action_low"], np.float32)

    @property
    def action_high(self) -> np.ndarray:
        return np.asarray(self._manifest["action_high"], np.float32)

    @property
    def constraint_names(self) -> tuple[str, ...]:
        """The hard constraints, in the order of ``PolicyDecision.margin``."""
        return self._names

    @property
    def constraint_spec(self) -> ConstraintSpec:
        try:
            return ConstraintSpec.from_yaml_text(self._spec_text, str(self._path / CONSTRAINTS))
        except ConstraintSpecError as error:
            raise PolicyArtifactError(str(error)) from None

    @property
    def traced_batch_sizes(self) -> tuple[int, ...]:
        """The (padded) batch sizes compiled so far, one entry per trace."""
        return tuple(self._traced)

    def parameters(self) -> dict[str, np.ndarray]:
        """The policy's parameters by path (``actor/params/...``), for inspection; the
        serialized function carries its own copy."""
        return serialization.msgpack_restore((self._path / PARAMETERS).read_bytes())

    def __repr__(self) -> str:
        algorithm = self._manifest["metadata"].get("algorithm", "policy")
        return (
            f"PolicyArtifact({str(algorithm)!r}, observations={self._observation_size}, "
            f"actions={self._action_size}, constraints={len(self._names)}, path={self._path})"
        )


def _read_manifest(path: Path) -> dict[str, Any]:
    file = path / MANIFEST
    if not file.is_file():
        raise PolicyArtifactError(f"{file}: missing; {path} is not a policy artifact")
    try:
        manifest = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise PolicyArtifactError(f"{file}: cannot be read as JSON: {error}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise PolicyArtifactError(f"{file}: not a {FORMAT} manifest (no 'format': {FORMAT!r})")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise PolicyArtifactError(
            f"{file}: format_version {manifest.get('format_version')!r} is unknown; this "
            f"neorl_industrial reads format_version {FORMAT_VERSION}"
        )
    if manifest.get("manifest_sha256") != _digest(manifest):
        raise PolicyArtifactError(f"{file}: corrupt (its content does not match its sha256)")
    return manifest


def _verified(path: Path, name: str, digest: str) -> bytes:
    file = path / name
    if Path(name).name != name:
        raise PolicyArtifactError(f"{path / MANIFEST}: file name {name!r} is not in the artifact")
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        raise PolicyArtifactError(f"{file}: missing from the policy artifact") from None
    if hashlib.sha256(data).hexdigest() != digest:
        raise PolicyArtifactError(f"{file}: corrupt (sha256 differs from the manifest's)")
    return data
