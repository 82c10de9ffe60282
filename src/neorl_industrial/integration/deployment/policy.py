"""The served policy: an exported artifact (a directory or a ``models:/`` URI), verified,
checked against what the server pins, compiled for every padded batch size, and what the
server says about it.

What the server trusts is its own, not the artifact's: :class:`PolicyTrust` holds the
public keys whose signatures are accepted (a signature is required unless the server
was started with ``allow_unsigned``, which it logs as a warning at every load), the
constraint spec the safety engineer pinned and the task it pins (names in order, units,
bounds). An artifact that fails any of them is refused before it serves (at start and at
reload). What the artifact's function does is checked too, with the server's own code
(:mod:`.pin`): probe inputs at load, and every served action at run time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import math
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "Incidents",
    "LoadedPolicy",
    "PolicyTrust",
    "load_policy_source",
    "padded_sizes",
    "synchronous_cpu_dispatch",
]

log = logging.getLogger("neorl_industrial.serve")


@dataclasses.dataclass(frozen=True)
class PolicyTrust:
    """The trusted signing keys (by fingerprint), whether unsigned policies are allowed,
    and the pinned constraint spec and task.

    The default trusts nothing: every artifact is refused until keys are given (or
    ``allow_unsigned`` says, on purpose, that unsigned policies may serve).
    """

    keys: dict[str, Any] = dataclasses.field(default_factory=dict)
    key_files: tuple[str, ...] = ()
    pinned: Any = None  # a ConstraintSpec
    pinned_file: str | None = None
    pinned_sha256: str | None = None
    task: Any = None  # a Task
    task_file: str | None = None
    task_sha256: str | None = None
    allow_unsigned: bool = False

    @property
    def require_signature(self) -> bool:
        return not self.allow_unsigned

    @classmethod
    def from_files(
        cls,
        key_files: Sequence[str | os.PathLike[str]] = (),
        pinned_constraints: str | os.PathLike[str] | None = None,
        pinned_task: str | os.PathLike[str] | None = None,
        *,
        allow_unsigned: bool = False,
    ) -> PolicyTrust:
        """Reads the public keys, the pinned spec and the pinned task.

        Raises:
            SettingsError: naming the key, spec or task file that cannot be used; no key
                while signatures are required; a pinned spec without a pinned task.
        """
        from neorl_industrial.core.safety import ConstraintSpecError
        from neorl_industrial.integration.deployment.errors import SettingsError
        from neorl_industrial.integration.deployment.pin import load_pinned_task
        from neorl_industrial.wrappers.agents.signing import SigningError, load_public_keys
        from neorl_industrial.wrappers.constraint_files import constraint_spec_from_text

        try:
            keys = load_public_keys(key_files)
        except SigningError as error:
            raise SettingsError(f"trusted_keys: {error}") from None
        if not keys and not allow_unsigned:
            raise SettingsError(NO_KEY)
        values: dict[str, Any] = {
            "keys": keys,
            "key_files": tuple(map(str, key_files)),
            "allow_unsigned": allow_unsigned,
        }
        if pinned_constraints is not None and pinned_task is None:
            raise SettingsError(
                f"pinned_constraints {pinned_constraints}: pin the task too (--pinned-task / "
                "NEORL_SERVE_PINNED_TASK: the dataset card, e.g. the run's dataset.json, or a "
                "task file): without the plant's observation and action names in order, a "
                "policy exported with its columns permuted would pass the pin"
            )
        if pinned_constraints is not None:
            path = Path(pinned_constraints)
            try:
                data = path.read_bytes()
                spec = constraint_spec_from_text(data.decode(), str(path))
            except (OSError, UnicodeDecodeError) as error:
                raise SettingsError(f"pinned_constraints {path}: cannot be read: {error}") from None
            except ConstraintSpecError as error:
                raise SettingsError(f"pinned_constraints: {error}") from None
            values.update(
                pinned=spec, pinned_file=str(path), pinned_sha256=hashlib.sha256(data).hexdigest()
            )
        if pinned_task is not None:
            try:
                task, digest = load_pinned_task(pinned_task)
            except ValueError as error:
                raise SettingsError(str(error)) from None
            values.update(task=task, task_file=str(pinned_task), task_sha256=digest)
            if values.get("pinned") is not None:
                # A pinned spec that names what the pinned task lacks can never pass.
                from neorl_industrial.integration.deployment.pin import (
                    ServedTask,
                    server_constraints,
                )

                try:
                    server_constraints(values["pinned"], ServedTask.of_task(task))
                except ConstraintSpecError as error:
                    raise SettingsError(
                        f"pinned_constraints {pinned_constraints} does not fit the pinned task "
                        f"{pinned_task}: {error}"
                    ) from None
        return cls(**values)

    def check(self, artifact: Any) -> tuple[Any, Any]:
        """Refuses an artifact whose task differs from the pinned task or whose bundled
        constraints enforce other limits than the pinned ones (prose such as the name and
        description does not count).

        Returns:
            The constraints the server enforces on it, compiled by the server (the pinned
            spec, else the artifact's bundled one) and the task they are compiled for (the
            pinned task, else the artifact's), a :class:`~.pin.ServedTask`.

        Raises:
            PolicyArtifactError: naming what differs.
        """
        from neorl_industrial.core.safety import ConstraintSpecError
        from neorl_industrial.integration.deployment.pin import (
            ServedTask,
            enforced_differences,
            server_constraints,
            task_differences,
        )
        from neorl_industrial.wrappers.agents.artifact import PolicyArtifactError

        served = ServedTask.of_manifest(artifact.manifest)
        task = served
        if self.task is not None:
            task = ServedTask.of_task(self.task)
            differences = task_differences(served, task)
            if differences:
                raise PolicyArtifactError(
                    f"{artifact.path}: its task differs from the pinned task {self.task_file} "
                    f"(sha256 {self.task_sha256}): {'; '.join(differences)}; the server serves "
                    "only policies exported for the pinned task"
                )
        try:
            bundled = server_constraints(artifact.constraint_spec, task)
        except ConstraintSpecError as error:
            raise PolicyArtifactError(
                f"{artifact.path}: its constraints.yaml does not fit the task it is served "
                f"for: {error}"
            ) from None
        enforced = bundled
        if self.pinned is not None:
            enforced = server_constraints(self.pinned, task)
            fields = enforced_differences(bundled, enforced)
            if fields:
                raise PolicyArtifactError(
                    f"{artifact.path}: its constraints.yaml differs from the pinned constraint "
                    f"spec {self.pinned_file} (sha256 {self.pinned_sha256}) in {fields}; the "
                    "server serves only policies that enforce the pinned spec"
                )
        return enforced, task

    def describe(self, artifact: Any) -> dict[str, Any]:
        signature = artifact.signature
        return {
            "signature": signature,
            "signature_required": self.require_signature,
            "allow_unsigned": self.allow_unsigned,
            "trusted_keys": sorted(self.keys),
            "pinned_constraints": (
                {"file": self.pinned_file, "sha256": self.pinned_sha256}
                if self.pinned is not None
                else None
            ),
            "pinned_task": (
                {"file": self.task_file, "sha256": self.task_sha256}
                if self.task is not None
                else None
            ),
            "enforced_constraints": "pinned" if self.pinned is not None else "bundled",
        }


#: Why a server without trusted keys does not start, and what to do.
NO_KEY = (
    "trusted_keys: no key to verify policy signatures with (no --trusted-key or "
    "NEORL_SERVE_TRUSTED_KEYS, and no keys/policy-signing.pub in the working directory); "
    "give the public key of whoever signs the policies (neorl-industrial keys generate, or "
    "the keys/ that a first `neorl-industrial run` makes), or start with --allow-unsigned "
    "(NEORL_SERVE_ALLOW_UNSIGNED=true) to serve unsigned policies, for development only"
)


class Incidents:
    """Counts and logs the served actions that the server's own check replaced."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.count = 0
        self._lock = threading.Lock()

    def __call__(self, decision: Any) -> None:
        rows = int(decision.incident.sum())
        with self._lock:
            self.count += rows
            total = self.count
        log.warning(
            "safety incident: the policy from %s served %d action(s) that break the "
            "enforced constraints; the server's own shield replaced them (%d so far)",
            self.source,
            rows,
            total,
        )


class LoadedPolicy:
    """A verified, compiled policy artifact and what the server says about it."""

    def __init__(
        self,
        artifact: Any,
        source: str,
        registry: dict[str, Any] | None,
        trust: PolicyTrust | None = None,
        incidents: Incidents | None = None,
    ) -> None:
        self.artifact = artifact
        self.trust = trust or PolicyTrust()
        self.incidents = incidents or Incidents(source)
        self.source = source
        self.registry = registry or {}
        manifest = artifact.manifest
        if self.registry.get("version"):
            self.version = f"{self.registry['name']}/{self.registry['version']}"
        else:
            self.version = str(manifest.get("manifest_sha256", ""))[:12] or "unversioned"
        self.observation_size = int(manifest["observation_size"])
        self.action_size = int(manifest["action_size"])
        self.names = tuple(artifact.constraint_names)

    def describe(self) -> dict[str, Any]:
        from neorl_industrial.core.environments.history import frame_of

        artifact = self.artifact
        spec = artifact.constraint_spec
        return {
            "version": self.version,
            "source": self.source,
            "registry": self.registry or None,
            "metadata": artifact.metadata,
            "observation": {
                "size": self.observation_size,
                "names": artifact.observation_names,
                # Rows the observation stacks (names@t-1, ...: the client sends them all).
                "history": frame_of(artifact.observation_names)[1],
            },
            "action": {
                "size": self.action_size,
                "names": artifact.action_names,
                "low": artifact.action_low.tolist(),
                "high": artifact.action_high.tolist(),
            },
            "constraints": {
                "hard": list(self.names),
                "spec": spec.model_dump(mode="json", by_alias=True, exclude_none=True),
            },
            "trust": {
                **self.trust.describe(artifact),
                "guarded": artifact.guarded,
                "incidents": self.incidents.count,
            },
        }


def load_policy_source(
    source: str,
    tracking_uri: str | None,
    batch_sizes: list[int],
    *,
    trust: PolicyTrust | None = None,
) -> LoadedPolicy:
    """Loads, checks and compiles the policy at ``source`` (directory or ``models:/`` URI).

    Args:
        source: an artifact directory or a registry URI.
        tracking_uri: the MLflow store of ``models:/`` URIs.
        batch_sizes: the batch sizes compiled before it serves.
        trust: the keys, pins and opt-outs; ``None``: nothing is trusted (every artifact
            is refused).

    Raises:
        PolicyArtifactError: for an artifact that is corrupt, unsigned (unless allowed) or
            signed by a key not trusted, exported for another task than the pinned one,
            bundling other constraints than the pinned ones, or whose function serves
            actions the enforced constraints do not allow, naming why.
    """
    trust = trust or PolicyTrust()
    synchronous_cpu_dispatch()
    from neorl_industrial.integration.deployment.pin import ServerCheck, probe_refusals
    from neorl_industrial.wrappers.agents.artifact import PolicyArtifact, PolicyArtifactError

    if trust.allow_unsigned:
        log.warning(
            "allow_unsigned: loading %s without requiring a signature by a trusted key; "
            "anyone who can write the policy can change what this server serves",
            source,
        )
    registry: dict[str, Any] | None = None
    with _local_policy(source, tracking_uri) as path:
        if source.startswith("models:/"):
            from neorl_industrial.integration.mlflow.registry import describe_model_uri

            registry = describe_model_uri(source, tracking_uri)
        artifact = PolicyArtifact.load(
            path,
            trusted_keys=list(trust.keys.values()) if trust.keys else None,
            require_signature=trust.require_signature,
        )
    enforced, task = trust.check(artifact)
    check = ServerCheck(enforced)
    check.warmup()
    artifact = artifact.with_guard(check)
    # What the function does, not what it says: probe inputs through the server's check,
    # which must not have to replace a single action.
    refusals = probe_refusals(artifact, check, task, batch_sizes)
    if refusals:
        raise PolicyArtifactError(
            f"{artifact.path}: its serialized policy function does not keep the "
            f"{'pinned' if trust.pinned is not None else 'bundled'} constraints: "
            f"{'; '.join(refusals)}; the server serves only functions whose every probe "
            "action its own shield passes"
        )
    incidents = Incidents(source)
    artifact.set_incident_handler(incidents)
    artifact.warmup(batch_sizes)
    return LoadedPolicy(artifact, source, registry, trust, incidents)


def synchronous_cpu_dispatch() -> bool:
    """Asks JAX to run CPU programs on the calling thread (``jax_cpu_enable_async_dispatch``
    off), where the backend is not created yet: a served call is a few microseconds of
    work, and handing it to a worker thread and waiting for the result costs about as
    much again in CPU time (more on a busy machine). Results are the same either way.

    Returns:
        Whether the setting applies (False: the CPU backend was created before, and keeps
        its dispatch; a server in a process that already ran JAX code).
    """
    import jax
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        return False
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    return True


@contextlib.contextmanager
def _local_policy(source: str, tracking_uri: str | None) -> Iterator[Path]:
    """The artifact's directory; a registry URI's download is removed afterwards."""
    if not source.startswith(("models:/", "runs:/")):
        yield Path(source)
        return
    from neorl_industrial.integration.mlflow.registry import downloaded_policy_dir

    with downloaded_policy_dir(source, tracking_uri) as path:
        yield path


def padded_sizes(max_batch: int, sizes: list[int]) -> list[int]:
    """The powers of two the artifact pads to, up to the largest batch served."""
    largest = max(max_batch, *sizes)
    return [1 << k for k in range(math.ceil(math.log2(largest)) + 1)]
