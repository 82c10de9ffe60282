"""Loading and serving an exported policy (see :mod:`.export` for the layout).

:class:`PolicyArtifact` verifies every file before it deserializes anything and answers
:meth:`PolicyArtifact.predict` with numpy arrays. This module imports JAX, numpy and the
safety layer only: neither optax nor the agents nor the training loops.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import serialization

from neorl_industrial.core.safety import TOLERANCE, ConstraintSpec, ConstraintSpecError
from neorl_industrial.core.safety.shield import (
    BRANCH_MIN_BATCH,
    FALLBACK,
    INFEASIBLE,
    INVALID,
    INVALID_OBSERVATION,
    OVERRIDDEN,
    PROJECTED,
)
from neorl_industrial.wrappers.agents.signing import (
    SIGNATURE,
    SigningError,
    load_public_keys,
    verify_manifest,
)
from neorl_industrial.wrappers.constraint_files import constraint_spec_from_text

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "PolicyArtifact",
    "PolicyArtifactError",
    "PolicyDecision",
]

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
    "invalid_observation": INVALID_OBSERVATION,
}
# Serialized functions by the smallest batch each serves: below BRANCH_MIN_BATCH rows
# the shield repairs every row in one select, from there on it branches once per batch
# (which a symbolic batch size can only do when the export knows which side it is on).
_FUNCTIONS = (("serve.jaxexport", 1), ("serve_large.jaxexport", BRANCH_MIN_BATCH))


class PolicyArtifactError(ValueError):
    """An artifact that cannot be written or loaded; the message names the file or field."""


def _digest(manifest: Mapping[str, Any]) -> str:
    body = {key: value for key, value in manifest.items() if key != "manifest_sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


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
    invalid_observation: np.ndarray  # [...] bool: the observation left its physical bounds
    constraint_names: tuple[str, ...]

    @functools.cached_property
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

    def __init__(
        self,
        path: Path,
        manifest: dict[str, Any],
        functions: list,
        spec_text: str,
        signature: dict[str, Any] | None = None,
    ):
        self._path = path
        self._signature = signature
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
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        trusted_keys: Iterable[str | os.PathLike[str] | Any] | None = None,
        require_signature: bool = False,
    ) -> PolicyArtifact:
        """Reads and verifies the artifact at ``path``.

        Args:
            path: the artifact directory.
            trusted_keys: Ed25519 public keys (objects or PEM files) whose signatures are
                accepted; a signed artifact is verified against them. ``None``: a
                signature is read but not verified.
            require_signature: refuse an artifact without a signature by a trusted key.

        Raises:
            PolicyArtifactError: naming the file that is missing, corrupt, of an unknown
                format version, or lowered for platforms this machine has none of; an
                unsigned artifact when a signature is required, a signature by a key not
                trusted, or one that does not match the manifest.
        """
        path = Path(path)
        manifest = _read_manifest(path)
        signature = _checked_signature(path, manifest, trusted_keys, require_signature)
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
        artifact = cls(path, manifest, functions, spec_text, signature)
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
            prev_action: the actions applied at the previous step, in plant units,
                ``[act]`` or ``[b, act]`` like the observation; ``None``: unknown, and the
                rate limits cannot apply (send it wherever the plant has rate limits).

        Raises:
            ValueError: for an observation or a previous action of the wrong shape or with
                values that are not finite, naming the field, row and feature.
        """
        observations, single = self._rows(observation, "observation", self.observation_names)
        rows = len(observations)
        if prev_action is None:
            # Unknown: the shield leaves rate limits out (a zero would be a real setting).
            prev_actions = np.full((rows, self._action_size), np.nan, np.float32)
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
            # An artifact whose manifest lacks a bit was exported by a shield without it.
            **{name: flags.get(name, np.zeros_like(status, bool)) for name in STATUS_BITS},
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
            return constraint_spec_from_text(self._spec_text, str(self._path / CONSTRAINTS))
        except ConstraintSpecError as error:
            raise PolicyArtifactError(str(error)) from None

    @property
    def signature(self) -> dict[str, Any] | None:
        """``{"key_fingerprint": ..., "verified": bool}`` of a signed artifact (verified
        against the trusted keys it was loaded with), ``None`` for an unsigned one."""
        return dict(self._signature) if self._signature is not None else None

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


def _checked_signature(
    path: Path,
    manifest: dict[str, Any],
    trusted_keys: Iterable[Any] | None,
    require_signature: bool,
) -> dict[str, Any] | None:
    """The artifact's signature, verified against ``trusted_keys`` when they are given."""
    file = path / SIGNATURE
    if not file.is_file():
        if require_signature:
            raise PolicyArtifactError(
                f"{path}: unsigned (no {SIGNATURE}), but a signature by a trusted key is "
                "required; export it with a signing key (neorl-industrial export --sign-key)"
            )
        return None
    try:
        signature = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise PolicyArtifactError(f"{file}: cannot be read as JSON: {error}") from None
    if not isinstance(signature, dict):
        raise PolicyArtifactError(f"{file}: expected a JSON object")
    if trusted_keys is None:
        if require_signature:
            raise PolicyArtifactError(
                f"{file}: a signature is required but no trusted keys were given to verify it"
            )
        return {"key_fingerprint": str(signature.get("key_fingerprint")), "verified": False}
    try:
        fingerprint = verify_manifest(
            manifest, signature, load_public_keys(trusted_keys), str(file)
        )
    except SigningError as error:
        raise PolicyArtifactError(str(error)) from None
    return {"key_fingerprint": fingerprint, "verified": True}
