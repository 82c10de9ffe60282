"""The served policy on ONNX Runtime: an artifact exported with ``format="onnx"`` whose
``policy.onnx`` answers instead of its serialized JAX functions.

:class:`OnnxPolicyArtifact` is a :class:`~neorl_industrial.wrappers.agents.PolicyArtifact`
(the same ``load``, with ONNX Runtime's ``threads`` besides, the same checks and refusals,
``predict``, ``decide_rows``, ``warmup``, ``with_guard`` and descriptions, the same
:class:`PolicyDecision`), so the server's trust, pin, probes and guard apply to it
unchanged; only the function that computes a batch's action, proposal, status and margins
is the ONNX graph. The graph's bytes are read once and checked against the manifest's
sha256 before ONNX Runtime sees them: a changed ``policy.onnx`` is refused like any
changed file of the artifact, and a signature covers it through the manifest.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from neorl_industrial.wrappers.agents.artifact import (
    ArtifactFiles,
    Guard,
    PolicyArtifact,
    PolicyArtifactError,
    PolicyDecision,
)
from neorl_industrial.wrappers.agents.artifact_files import verified_file

__all__ = ["RUNTIMES", "OnnxPolicyArtifact", "load_artifact"]

#: The runtimes a served artifact's function may run on.
RUNTIMES = ("jax", "onnx")


class OnnxPolicyArtifact(PolicyArtifact):
    """A loaded, verified policy artifact served by ONNX Runtime. Build it with
    :meth:`load`."""

    def __init__(
        self,
        files: ArtifactFiles,
        guard: Guard | None = None,
        on_incident: Callable[[PolicyDecision], None] | None = None,
        *,
        session: Any,
    ):
        self._session = session
        # The guard's check of the served actions, jitted once per padded batch size.
        self._accepts = None if guard is None else jax.jit(guard.accepts)
        super().__init__(files, guard, on_incident)

    @classmethod
    def _open_runtime(cls, files: ArtifactFiles, threads: int = 1) -> dict[str, Any]:
        """The ONNX Runtime session of the artifact's graph, for :meth:`PolicyArtifact.load`
        (which reads and verifies the artifact first and refuses what it refuses).

        Args:
            threads: ONNX Runtime's intra-op threads (1: lowest latency for a plant's
                small batches).

        Raises:
            PolicyArtifactError: an artifact exported without an ONNX graph; a
                ``policy.onnx`` that differs from the manifest's sha256, that ONNX Runtime
                cannot load, or whose inputs and outputs are not the manifest's.
        """
        from neorl_industrial.wrappers.agents.onnx_export import runtime_session
        from neorl_industrial.wrappers.agents.onnx_graph import OnnxExportError

        path, manifest = files.path, files.manifest
        entry = manifest.get("onnx")
        if not isinstance(entry, dict) or "file" not in entry:
            raise PolicyArtifactError(
                f"{path}: exported without an ONNX graph (no 'onnx' in its manifest); "
                "export it with format='onnx' (neorl-industrial export --format onnx)"
            )
        name = str(entry["file"])
        digest = manifest["files"].get(name)
        if Path(name).name != name or digest is None:
            raise PolicyArtifactError(f"{path / 'manifest.json'}: lists no sha256 for {name}")
        file = path / name
        # The bytes ONNX Runtime gets are the bytes checked here (read once).
        data = verified_file(path, name, digest)
        try:
            session = runtime_session(data, threads)
        except OnnxExportError as error:
            raise PolicyArtifactError(f"{file}: {error}") from None
        _check_graph_interface(file, session, manifest)
        return {"session": session}

    #: Every batch through the ONNX graph: the check is a serialized JAX function.
    _serves_check = False

    def _runtime_arguments(self) -> dict[str, Any]:
        """A copy with another guard (:meth:`with_guard`) serves on the same session."""
        return {"session": self._session}

    def _compiled(self, exported: Any) -> Callable:
        """The ONNX graph in place of the serialized JAX function (one graph serves every
        batch size); the guard's check, if any, on its actions. The result is laid out as
        :meth:`PolicyArtifact._compiled`'s: one float32 ``[batch, columns]`` array of the
        action, the proposal, the status bits, the guard's verdict and the margins."""
        session, accepts = self._session, self._accepts
        outputs = ["action", "proposed", "status", "margins"]

        def call(observations: np.ndarray, prev_actions: np.ndarray) -> np.ndarray:
            feeds = {"observations": observations, "prev_actions": prev_actions}
            action, proposed, status, margins = session.run(outputs, feeds)
            if accepts is None:
                accepted = np.ones(status.shape, np.float32)
            else:
                accepted = np.asarray(accepts(observations, prev_actions, action), np.float32)
            rows = status.shape[0]
            return np.concatenate(
                [
                    action,
                    proposed,
                    status.astype(np.float32)[:, None],
                    accepted[:, None],
                    margins.reshape(rows, -1),
                ],
                axis=1,
            )

        return call

    @property
    def runtime(self) -> str:
        return "onnx"

    def __repr__(self) -> str:
        return "Onnx" + super().__repr__()


def _check_graph_interface(file: Path, session: Any, manifest: dict[str, Any]) -> None:
    """Refuses a graph whose inputs or outputs are not the manifest's sizes."""
    observation_size = int(manifest["observation_size"])
    action_size = int(manifest["action_size"])
    n_constraints = len(manifest["constraints"]["names"])
    expected_inputs = {
        "observations": [observation_size],
        "prev_actions": [action_size],
    }
    expected_outputs = {
        "action": [action_size],
        "proposed": [action_size],
        "status": [],
        "margins": [2, n_constraints],
    }
    for what, found, expected in (
        ("inputs", session.get_inputs(), expected_inputs),
        ("outputs", session.get_outputs(), expected_outputs),
    ):
        shapes = {value.name: list(value.shape[1:]) for value in found}
        if shapes != expected:
            raise PolicyArtifactError(
                f"{file}: its {what} {shapes} are not the manifest's {expected} ([batch, ...] each)"
            )


def load_artifact(
    path: str | os.PathLike[str], runtime: str = "jax", **options: Any
) -> PolicyArtifact:
    """:meth:`PolicyArtifact.load` (``runtime="jax"``) or :meth:`OnnxPolicyArtifact.load`
    (``"onnx"``) with the same ``options``.

    Raises:
        ValueError: for another runtime.
        PolicyArtifactError: as the loader does.
    """
    if runtime == "jax":
        return PolicyArtifact.load(path, **options)
    if runtime == "onnx":
        return OnnxPolicyArtifact.load(path, **options)
    raise ValueError(f"runtime: expected one of {list(RUNTIMES)}, got {runtime!r}")
