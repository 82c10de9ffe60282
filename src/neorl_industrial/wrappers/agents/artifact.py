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
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, Self

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from neorl_industrial.core.safety import (
    TOLERANCE,
    CompiledConstraints,
    ConstraintSpec,
    ConstraintSpecError,
)
from neorl_industrial.core.safety import margins as constraint_margins
from neorl_industrial.core.safety.shield import (
    BRANCH_MIN_BATCH,
    FALLBACK,
    INFEASIBLE,
    INVALID,
    INVALID_OBSERVATION,
    OUT_OF_DISTRIBUTION,
    OVERRIDDEN,
    PROJECTED,
)
from neorl_industrial.core.utils.messages import shorten
from neorl_industrial.wrappers.agents.artifact_files import (
    CONSTRAINTS,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    PARAMETERS,
    ArtifactFiles,
    PolicyArtifactError,
    _read_regular,
    read_artifact_files,
)
from neorl_industrial.wrappers.agents.artifact_files import (
    _digest as _digest,  # the manifest's digest, imported from here too
)
from neorl_industrial.wrappers.agents.readings import decision_inputs, flush_subnormals
from neorl_industrial.wrappers.constraint_files import constraint_spec_from_text

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "ArtifactFiles",
    "PolicyArtifact",
    "PolicyArtifactError",
    "PolicyDecision",
]

OUTPUTS = ("action", "proposed", "status", "margins")
STATUS_BITS = {
    "overridden": OVERRIDDEN,
    "projected": PROJECTED,
    "fallback": FALLBACK,
    "invalid": INVALID,
    "infeasible": INFEASIBLE,
    "invalid_observation": INVALID_OBSERVATION,
    "out_of_distribution": OUT_OF_DISTRIBUTION,
}
# Serialized functions by the smallest batch each serves: below BRANCH_MIN_BATCH rows
# the shield repairs every row in one select, from there on it branches once per batch
# (which a symbolic batch size can only do when the export knows which side it is on).
_FUNCTIONS = (("serve.jaxexport", 1), ("serve_large.jaxexport", BRANCH_MIN_BATCH))
#: The check: the policy and the shield's reading without its repair, for batches below
#: BRANCH_MIN_BATCH rows. ``check(observations, prev_actions) -> (kept, action, status,
#: margins)``; where ``kept`` (one boolean for the batch) is true the outputs are
#: ``serve``'s, bit for bit, and where it is false ``serve`` decides. Listed in the
#: manifest's ``check`` entry; an artifact without one is served by ``serve`` alone.
CHECK = "check.jaxexport"


class Guard(Protocol):
    """The loader's own check of served actions (a server builds it from the constraints
    it enforces; see :mod:`neorl_industrial.integration.deployment.pin`)."""

    def accepts(
        self, observations: jax.Array, prev_actions: jax.Array, action: jax.Array
    ) -> jax.Array:
        """``[batch]`` bool: the row's action is served as it is. Pure JAX: it runs inside
        the artifact's jitted call, one program per batch."""
        ...

    def repair(
        self, observations: np.ndarray, prev_actions: np.ndarray, action: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """For rows not accepted: the action to serve and ``[rows]`` bool, whether it
        differs from the artifact's (an incident). On the host, rarely."""
        ...


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
    #: ``[...]`` bool: the observation left the range of the data the policy learnt from
    #: (a flag only: the decision is the same). Never set by an artifact exported without
    #: the data's range.
    out_of_distribution: np.ndarray
    constraint_names: tuple[str, ...]
    #: ``[...]`` bool: the loader's own check replaced the artifact's action (it broke the
    #: loader's constraints); such rows are also ``overridden``. All false without a guard.
    incident: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((), bool))
    #: ``[..., n_constraints]`` slack of the applied action per constraint (NaN: it reads
    #: an invalid sensor and cannot be checked); ``None`` from an artifact of format 1,
    #: which does not say.
    applied_margin: np.ndarray | None = None

    @functools.cached_property
    def violated_mask(self) -> np.ndarray:
        """``[..., n_constraints]`` the constraints the proposal broke."""
        return ~(self.margin >= -TOLERANCE)

    @functools.cached_property
    def violated(self) -> tuple[str, ...] | tuple[tuple[str, ...], ...]:
        """Names of the constraints the proposal broke: a tuple for one observation, a
        tuple per row for a batch."""
        return self._named(self.violated_mask)

    @functools.cached_property
    def violated_after_mask(self) -> np.ndarray | None:
        """``[..., n_constraints]`` the constraints the applied action breaks or cannot be
        shown to keep; ``None`` when the artifact does not say."""
        if self.applied_margin is None:
            return None
        return ~(self.applied_margin >= -TOLERANCE)

    @functools.cached_property
    def violated_after(self) -> tuple[str, ...] | tuple[tuple[str, ...], ...] | None:
        """Names of the constraints the applied action breaks or cannot be shown to keep
        (shaped like :attr:`violated`); ``None`` when the artifact does not say."""
        mask = self.violated_after_mask
        return None if mask is None else self._named(mask)

    def _named(self, mask: np.ndarray) -> tuple[str, ...] | tuple[tuple[str, ...], ...]:
        if not mask.any():  # the common case: nothing broken, no names to look up
            return () if mask.ndim == 1 else ((),) * len(mask)
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


def _padded(rows: int) -> int:
    """The batch size ``rows`` rows are served at: the next power of two (padding
    bounds the shapes that get compiled)."""
    return 1 << (rows - 1).bit_length()


@dataclasses.dataclass(frozen=True)
class _ParameterBuffers:
    """An artifact's parameter arrays (format 3) on the device as one buffer per dtype,
    and where each array lies in them. The serving functions take the buffers and slice
    the arrays back inside their program (the outputs are bit-identical): every argument
    of a jitted call costs its dispatch on every request, and a policy has a dozen arrays.
    The check's call for IB's TD3BC-Lag actor (8 arrays, one row), medians of alternating
    runs on one core, three processes: 33.3, 30.0, 35.4 us with an argument per array;
    30.8, 27.8, 31.8 us with one buffer; 28.3, 26.2, 28.0 us with the parameters as
    constants (one program per policy, which the buffers avoid)."""

    #: One device buffer per dtype (empty: formats 1 and 2, whose functions hold them).
    buffers: tuple[jax.Array, ...]
    #: Per array, in the order the functions take them: (buffer, offset, shape).
    layout: tuple[tuple[int, int, tuple[int, ...]], ...]

    @classmethod
    def of(cls, arrays: Sequence[np.ndarray]) -> _ParameterBuffers:
        # Not jax.flatten_util.ravel_pytree: it promotes mixed dtypes to one (inexact for
        # large integers) and concatenates on the device, an eager program per architecture
        # at every load; NumPy joins each dtype's arrays and one transfer moves them.
        arrays = [np.asarray(array) for array in arrays]
        dtypes = list(dict.fromkeys(array.dtype for array in arrays))
        parts: list[list[np.ndarray]] = [[] for _ in dtypes]
        layout = []
        for array in arrays:
            part = parts[dtypes.index(array.dtype)]
            offset = sum(piece.size for piece in part)
            layout.append((dtypes.index(array.dtype), offset, array.shape))
            part.append(array.ravel())
        buffers = tuple(jax.device_put(np.concatenate(part)) for part in parts)
        return cls(buffers, tuple(layout))

    def arguments(self, buffers: Sequence[jax.Array]) -> tuple[Any, ...]:
        """What the serialized functions take before the batch, from ``buffers`` (traced):
        the tuple of parameter arrays, or nothing for formats 1 and 2."""
        if not self.layout:
            return ()
        return (
            tuple(
                buffers[index][offset : offset + int(np.prod(shape))].reshape(shape)
                for index, offset, shape in self.layout
            ),
        )


class PolicyArtifact:
    """A loaded, verified policy artifact. Build it with :meth:`load`."""

    def __init__(
        self,
        files: ArtifactFiles,
        guard: Guard | None = None,
        on_incident: Callable[[PolicyDecision], None] | None = None,
    ):
        self._files = files
        path, manifest, functions = files.path, files.manifest, files.functions
        self._path = path
        self._signature = files.signature
        self._manifest = manifest
        self._spec_text = files.spec_text
        self._traced: list[int] = []
        self._traced_check: list[int] = []
        self._guard = guard
        self._on_incident = on_incident
        # What every function takes before the batch: the parameters, on the device once
        # (format 3), or nothing (formats 1 and 2: the functions hold them).
        self._parameters = _ParameterBuffers.of(files.parameters or ())
        # Largest first, so a batch takes the first function whose minimum it reaches.
        self._functions = sorted(
            ((entry["min_batch"], self._compiled(exported)) for entry, exported in functions),
            key=lambda item: -item[0],
        )
        self._observation_size = int(manifest["observation_size"])
        self._action_size = int(manifest["action_size"])
        self._names = tuple(manifest["constraints"]["names"])
        bits = {name: int(bit) for name, bit in manifest["status_bits"].items()}
        # The bit of each flag in STATUS_BITS' order; an artifact whose manifest lacks a bit
        # was exported by a shield without it (0: never set).
        self._flag_bits = np.asarray([bits.get(name, 0) for name in STATUS_BITS], np.int32)
        # Format 1 returns the proposal's margins alone; format 2 the applied ones too.
        self._applied_margins = int(manifest["format_version"]) >= 2
        self._incident_margins: Callable | None = None
        # The check (CHECK) serves batches up to its size that keep every rule; None:
        # every batch through its serving function.
        self._check: tuple[int, Callable] | None = None
        if files.check is not None and self._serves_check:
            entry, exported = files.check
            self._check = (int(entry["max_batch"]), self._compiled_check(exported))

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        trusted_keys: Iterable[str | os.PathLike[str] | Any] | None = None,
        require_signature: bool = False,
        guard: Guard | None = None,
        on_incident: Callable[[PolicyDecision], None] | None = None,
        **runtime: Any,
    ) -> Self:
        """Reads and verifies the artifact at ``path``.

        Args:
            path: the artifact directory.
            trusted_keys: Ed25519 public keys (objects or PEM files) whose signatures are
                accepted; a signed artifact is verified against them. ``None``: a
                signature is read but not verified.
            require_signature: refuse an artifact without a signature by a trusted key.
            guard: the loader's own check of every served action (see :class:`Guard`),
                run in the same compiled call; ``None``: the artifact's actions as they are.
            on_incident: called with a decision in which the guard replaced some action.
            runtime: a runtime subclass's own options (see its :meth:`_open_runtime`).

        Raises:
            PolicyArtifactError: naming the file that is missing, corrupt, not a regular
                file, of an unknown format version, or lowered for platforms this machine
                has none of; an unsigned artifact when a signature is required, a signature
                by a key not trusted, or one that does not match the manifest.
        """
        path = Path(path)
        files = read_artifact_files(path, trusted_keys, require_signature)
        opened = cls._open_runtime(files, **runtime)
        try:
            artifact = cls(files, guard, on_incident, **opened)
        except PolicyArtifactError:
            raise
        except (KeyError, TypeError, ValueError) as error:
            # A manifest whose sha256 matches but whose fields are not what the exporter
            # writes (the digest is no signature: anyone can recompute it).
            raise PolicyArtifactError(
                f"{path / MANIFEST}: malformed ({type(error).__name__}: {shorten(str(error))})"
            ) from None
        if artifact.constraint_spec.hard_names != artifact.constraint_names:
            raise PolicyArtifactError(
                f"{path / CONSTRAINTS}: its constraints {list(artifact.constraint_spec.hard_names)}"
                f" differ from the manifest's {list(artifact.constraint_names)}"
            )
        return artifact

    def with_guard(
        self, guard: Guard, on_incident: Callable[[PolicyDecision], None] | None = None
    ) -> PolicyArtifact:
        """The same artifact serving through ``guard`` (see :class:`Guard`), compiled anew
        (a runtime subclass keeps what :meth:`_runtime_arguments` hands on)."""
        return type(self)(self._files, guard, on_incident, **self._runtime_arguments())

    @classmethod
    def _open_runtime(cls, files: ArtifactFiles) -> dict[str, Any]:
        """What a runtime subclass's constructor takes beyond the artifact, opened from
        the verified ``files`` with the subclass's options of :meth:`load` (none here)."""
        return {}

    def _runtime_arguments(self) -> dict[str, Any]:
        """What a runtime subclass's constructor takes beyond the artifact (none here)."""
        return {}

    def set_incident_handler(self, on_incident: Callable[[PolicyDecision], None] | None) -> None:
        """Who hears of a decision in which the guard replaced an action."""
        self._on_incident = on_incident

    #: Whether this runtime serves from the artifact's check (:data:`CHECK`); a runtime
    #: whose serving function is not the serialized JAX one (ONNX) does not.
    _serves_check = True

    def _compiled(self, exported: jax.export.Exported) -> Callable:
        """``call(observations, prev_actions)``: ``exported`` and the guard's verdict,
        packed by :meth:`_packed`, jitted once per batch size. The parameters are an
        argument of the jitted call, not a constant in it: policies of one architecture
        (and constraints and guard) compile to one program, which JAX's compilation
        caches then hold for all of them (a reload of a retrained policy compiles
        nothing)."""

        def call(
            arguments: tuple[Any, ...], observations: jax.Array, prev_actions: jax.Array
        ) -> jax.Array:
            self._traced.append(int(observations.shape[0]))  # runs once per traced shape
            serve = functools.partial(exported.call, *self._parameters.arguments(arguments))
            return self._packed(serve, observations, prev_actions)

        return functools.partial(jax.jit(call), self._parameters.buffers)

    def _compiled_check(self, exported: jax.export.Exported) -> Callable:
        """The check's call, packed as :meth:`_compiled`'s with one column more: whether
        every row keeps every rule (then the row's outputs are the serving function's)."""

        def call(
            arguments: tuple[Any, ...], observations: jax.Array, prev_actions: jax.Array
        ) -> jax.Array:
            self._traced_check.append(int(observations.shape[0]))  # once per traced shape
            arrays = self._parameters.arguments(arguments)
            kept, *outputs = exported.call(*arrays, observations, prev_actions)
            action = outputs[0]
            packed = self._packed(lambda *_: (action, *outputs), observations, prev_actions)
            column = jnp.broadcast_to(kept.astype(jnp.float32), (packed.shape[0], 1))
            return jnp.concatenate([packed, column], axis=1)

        return functools.partial(jax.jit(call), self._parameters.buffers)

    def _packed(
        self, serve: Callable, observations: jax.Array, prev_actions: jax.Array
    ) -> jax.Array:
        """``serve(observations, prev_actions) -> (action, proposed, status, margins)``
        and the guard's verdict on the action, as one float32 array."""
        guard = self._guard
        action, proposed, status, margins = serve(observations, prev_actions)
        if guard is None:
            accepted = jnp.ones(status.shape, bool)
        else:
            # The guard's check in the same program: one call per batch, fused by XLA.
            accepted = guard.accepts(observations, prev_actions, action)
        # Every output in one float32 array, so a call makes one host transfer (each
        # array copied out separately cost more than the program ran). The status bits
        # and the guard's verdict are small integers, exact in float32.
        return jnp.concatenate(
            [
                action.astype(jnp.float32),
                proposed.astype(jnp.float32),
                status.astype(jnp.float32)[:, None],
                accepted.astype(jnp.float32)[:, None],
                margins.astype(jnp.float32).reshape(status.shape[0], -1),
            ],
            axis=1,
        )

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
            ValueError: for an observation or a previous action of the wrong shape, a
                reading that is not a finite number or an infinite previous action,
                naming the field, row and feature (the rules of every entry point:
                :func:`~neorl_industrial.wrappers.agents.readings.decision_inputs`).
        """
        observations, prev_actions, single = decision_inputs(
            observation, prev_action, self.observation_names, self.action_names
        )
        return self._decide(observations, prev_actions, single)

    def decide_rows(
        self, observations: np.ndarray, prev_actions: np.ndarray, *, read: bool = False
    ) -> PolicyDecision:
        """:meth:`predict` for ``[b, obs]`` float32 rows, unvalidated: a ``NaN`` previous
        action is unknown (no rate limit) row by row. For callers that have checked the
        rows themselves (a server's routes) or that probe the artifact. Subnormal values
        are read as zero here too, as every entry point reads them, so that a probe, the
        JAX program and the ONNX graph decide on the same numbers; ``read``: the rows come
        from :func:`~neorl_industrial.wrappers.agents.readings.decision_inputs`, which has
        done that already (the server's hot path skips a second pass)."""
        observations = np.asarray(observations, np.float32)
        prev_actions = np.asarray(prev_actions, np.float32)
        if not read:
            observations, prev_actions = (
                flush_subnormals(observations),
                flush_subnormals(prev_actions),
            )
        return self._decide(observations, prev_actions, False)

    def _decide(
        self, observations: np.ndarray, prev_actions: np.ndarray, single: bool
    ) -> PolicyDecision:
        rows = len(observations)
        padded = _padded(rows)
        if padded != rows:
            # Batches are padded to a power of two (repeating the last row, so padding
            # cannot make the shield branch), which bounds the shapes that get compiled.
            pad = ((0, padded - rows), (0, 0))
            observations = np.pad(observations, pad, mode="edge")
            prev_actions = np.pad(prev_actions, pad, mode="edge")
        packed = self._served(observations, prev_actions, padded)[:rows]  # views from here on
        n_act = self._action_size
        action = packed[:, :n_act]
        proposed = packed[:, n_act : 2 * n_act]
        status = packed[:, 2 * n_act].astype(np.int32)
        accepted = packed[:, 2 * n_act + 1] != 0
        margins = packed[:, 2 * n_act + 2 :]
        if self._applied_margins:  # [rows, 2, n]: the proposal's, then the applied action's
            margins = margins.reshape(rows, 2, -1)
            margin, applied_margin = margins[:, 0], margins[:, 1]
        else:
            margin, applied_margin = margins, None
        incident = np.zeros(rows, bool)
        if not accepted.all():
            # Rows the guard does not accept as they are (a fallback for a bad reading, an
            # infeasible row, or an action that breaks the loader's constraints): its
            # repair decides them on the host.
            rejected = ~accepted
            fixed, replaced = self._guard.repair(
                observations[:rows][rejected], prev_actions[:rows][rejected], action[rejected]
            )
            action = action.copy()
            action[rejected] = fixed
            incident[rejected] = replaced
            status = np.where(incident, status | OVERRIDDEN, status)
            if applied_margin is not None and incident.any():
                # The artifact's margins are of the action the guard replaced: the served
                # one's are computed anew (rarely: only for incidents).
                applied_margin = applied_margin.copy()
                applied_margin[incident] = self._margins_of(
                    observations[:rows][incident], prev_actions[:rows][incident], action[incident]
                )
        if single:
            action, proposed, status, margin, incident = (
                value[0] for value in (action, proposed, status, margin, incident)
            )
            applied_margin = None if applied_margin is None else applied_margin[0]
        # Every flag from the status in one operation; each flag a view of its column.
        flags = (status[..., None] & self._flag_bits) != 0
        decision = PolicyDecision(
            action=action,
            proposed=proposed,
            status=status,
            margin=margin,
            **{name: flags[..., column] for column, name in enumerate(STATUS_BITS)},
            constraint_names=self._names,
            incident=incident,
            applied_margin=applied_margin,
        )
        if self._on_incident is not None and incident.any():
            self._on_incident(decision)
        return decision

    def _served(self, observations: np.ndarray, prev_actions: np.ndarray, padded: int):
        """The packed outputs for a padded batch: from the check where every row keeps
        every rule (the serving function's outputs, without its repair), else from the
        serving function for the batch's size."""
        if self._check is not None and padded <= self._check[0]:
            packed = np.asarray(self._check[1](observations, prev_actions))
            if packed[0, -1]:
                return packed[:, :-1]
        return np.asarray(self._serving(padded)(observations, prev_actions))

    def _serving(self, padded: int) -> Callable:
        """The serving function of a batch of ``padded`` rows."""
        return next(function for min_batch, function in self._functions if padded >= min_batch)

    def _margins_of(
        self, observations: np.ndarray, prev_actions: np.ndarray, actions: np.ndarray
    ) -> np.ndarray:
        """``[rows, n_constraints]`` slack of ``actions`` under the artifact's constraints."""
        if self._incident_margins is None:
            compiled = self.compiled_constraints
            self._incident_margins = jax.jit(functools.partial(constraint_margins, compiled))
        rows = len(observations)
        # Padded to a power of two, as served batches are, to bound the compiled shapes.
        pad = ((0, _padded(rows) - rows), (0, 0))
        padded = (np.pad(x, pad, mode="edge") for x in (observations, actions, prev_actions))
        return np.asarray(self._incident_margins(*padded))[:rows]

    def warmup(self, batch_sizes: Sequence[int] = (1,)) -> None:
        """Compiles the shapes that ``batch_sizes`` use, so no request pays for it: the
        check's and the serving function's alike (a batch the check does not keep goes on
        to the serving function)."""
        for size in batch_sizes:
            self.predict(np.zeros((size, self._observation_size), np.float32))
            padded = _padded(size)
            if self._check is not None and padded <= self._check[0]:
                zeros = np.zeros((padded, self._observation_size), np.float32)
                unknown = np.full((padded, self._action_size), np.nan, np.float32)
                self._serving(padded)(zeros, unknown)

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

    @functools.cached_property
    def compiled_constraints(self) -> CompiledConstraints:
        """The artifact's constraints compiled with the task's physical bounds and the
        data's range recorded in the manifest (what its shield enforces and flags)."""
        manifest = self._manifest
        data_low, data_high = manifest.get("data_low"), manifest.get("data_high")
        return self.constraint_spec.compile(
            self._observation_size,
            self._action_size,
            self.observation_names,
            self.action_names,
            observation_bounds=(
                _bounds(manifest.get("observation_low"), -np.inf, self._observation_size),
                _bounds(manifest.get("observation_high"), np.inf, self._observation_size),
            ),
            data_bounds=None
            if data_low is None
            else (
                _bounds(data_low, -np.inf, self._observation_size),
                _bounds(data_high, np.inf, self._observation_size),
            ),
        )

    @property
    def data_range(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(low, high)`` per feature, the range of the data the policy learnt from that
        the artifact flags observations outside of (``±inf``: not checked); ``None``:
        exported without one."""
        low, high = self._manifest.get("data_low"), self._manifest.get("data_high")
        if low is None:
            return None
        size = self._observation_size
        return _bounds(low, -np.inf, size), _bounds(high, np.inf, size)

    @property
    def signature(self) -> dict[str, Any] | None:
        """``{"key_fingerprint": ..., "verified": bool}`` of a signed artifact (verified
        against the trusted keys it was loaded with), ``None`` for an unsigned one."""
        return dict(self._signature) if self._signature is not None else None

    @property
    def traced_batch_sizes(self) -> tuple[int, ...]:
        """The (padded) batch sizes the serving functions compiled so far, one entry per
        trace."""
        return tuple(self._traced)

    @property
    def traced_check_sizes(self) -> tuple[int, ...]:
        """The (padded) batch sizes the check (:data:`CHECK`) compiled so far."""
        return tuple(self._traced_check)

    @property
    def guarded(self) -> bool:
        """Whether the loader's own check runs on every served action."""
        return self._guard is not None

    def parameters(self) -> dict[str, np.ndarray]:
        """The policy's parameters by path (``actor/params/...``), for inspection; the
        functions take theirs from ``params.npz`` (format 3) or carry their own copy."""
        data = _read_regular(self._path / PARAMETERS)
        if hashlib.sha256(data).hexdigest() != self._manifest["files"].get(PARAMETERS):
            raise PolicyArtifactError(
                f"{self._path / PARAMETERS}: corrupt (sha256 differs from the manifest's)"
            )
        return serialization.msgpack_restore(data)

    def __repr__(self) -> str:
        algorithm = self._manifest["metadata"].get("algorithm", "policy")
        return (
            f"PolicyArtifact({str(algorithm)!r}, observations={self._observation_size}, "
            f"actions={self._action_size}, constraints={len(self._names)}, path={self._path})"
        )


def _bounds(values: Sequence[float | None] | None, missing: float, size: int) -> np.ndarray:
    """Manifest bounds (null: none known) as floats, ``missing`` for none."""
    if values is None:
        return np.full(size, missing)
    return np.asarray([missing if v is None else float(v) for v in values], np.float64)
