"""The served policy: an exported artifact (a directory or a ``models:/`` URI), verified,
compiled for every padded batch size, and what the server says about it.

What the server trusts is its own, not the artifact's: :class:`PolicyTrust` holds the
public keys whose signatures are accepted and the constraint spec the safety engineer
pinned; an artifact that fails either is refused before it serves (at start and at reload).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["LoadedPolicy", "PolicyTrust", "load_policy_source", "padded_sizes"]


@dataclasses.dataclass(frozen=True)
class PolicyTrust:
    """The trusted signing keys (by fingerprint) and the pinned constraint spec."""

    keys: dict[str, Any] = dataclasses.field(default_factory=dict)
    key_files: tuple[str, ...] = ()
    pinned: Any = None  # a ConstraintSpec
    pinned_file: str | None = None
    pinned_sha256: str | None = None

    @property
    def require_signature(self) -> bool:
        return bool(self.keys)

    @classmethod
    def from_files(
        cls,
        key_files: Sequence[str | os.PathLike[str]] = (),
        pinned_constraints: str | os.PathLike[str] | None = None,
    ) -> PolicyTrust:
        """Reads the public keys and the pinned spec.

        Raises:
            SettingsError: naming the key or spec file that cannot be used.
        """
        from neorl_industrial.core.safety import ConstraintSpecError
        from neorl_industrial.integration.deployment.settings import SettingsError
        from neorl_industrial.wrappers.agents.signing import SigningError, load_public_keys
        from neorl_industrial.wrappers.constraint_files import constraint_spec_from_text

        try:
            keys = load_public_keys(key_files)
        except SigningError as error:
            raise SettingsError(f"trusted_keys: {error}") from None
        if pinned_constraints is None:
            return cls(keys, tuple(map(str, key_files)))
        path = Path(pinned_constraints)
        try:
            data = path.read_bytes()
            pinned = constraint_spec_from_text(data.decode(), str(path))
        except (OSError, UnicodeDecodeError) as error:
            raise SettingsError(f"pinned_constraints {path}: cannot be read: {error}") from None
        except ConstraintSpecError as error:
            raise SettingsError(f"pinned_constraints: {error}") from None
        return cls(
            keys, tuple(map(str, key_files)), pinned, str(path), hashlib.sha256(data).hexdigest()
        )

    def check(self, artifact: Any) -> None:
        """Refuses an artifact whose bundled constraints differ from the pinned ones.

        The pinned spec gets the plant's action bounds on the actions it leaves unbounded,
        as :func:`~neorl_industrial.wrappers.agents.export_policy` does for the bundled one.

        Raises:
            PolicyArtifactError: naming the fields that differ.
        """
        if self.pinned is None:
            return
        import numpy as np

        from neorl_industrial.wrappers.agents.artifact import PolicyArtifactError
        from neorl_industrial.wrappers.agents.export import _effective_spec

        manifest = artifact.manifest
        pinned = _effective_spec(
            self.pinned,
            tuple(manifest["action_names"]),
            np.asarray(manifest["action_low"], np.float64),
            np.asarray(manifest["action_high"], np.float64),
        ).to_dict()
        bundled = artifact.constraint_spec.to_dict()
        if pinned != bundled:
            fields = sorted(
                key for key in pinned.keys() | bundled.keys() if pinned.get(key) != bundled.get(key)
            )
            raise PolicyArtifactError(
                f"{artifact.path}: its constraints.yaml differs from the pinned constraint spec "
                f"{self.pinned_file} (sha256 {self.pinned_sha256}) in {fields}; the server "
                "serves only policies that enforce the pinned spec"
            )

    def describe(self, artifact: Any) -> dict[str, Any]:
        signature = artifact.signature
        return {
            "signature": signature,
            "signature_required": self.require_signature,
            "trusted_keys": sorted(self.keys),
            "pinned_constraints": (
                {"file": self.pinned_file, "sha256": self.pinned_sha256}
                if self.pinned is not None
                else None
            ),
        }


class LoadedPolicy:
    """A verified, compiled policy artifact and what the server says about it."""

    def __init__(
        self,
        artifact: Any,
        source: str,
        registry: dict[str, Any] | None,
        trust: PolicyTrust | None = None,
    ) -> None:
        self.artifact = artifact
        self.trust = trust or PolicyTrust()
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
        artifact = self.artifact
        spec = artifact.constraint_spec
        return {
            "version": self.version,
            "source": self.source,
            "registry": self.registry or None,
            "metadata": artifact.metadata,
            "observation": {"size": self.observation_size, "names": artifact.observation_names},
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
            "trust": self.trust.describe(artifact),
        }


def load_policy_source(
    source: str,
    tracking_uri: str | None,
    batch_sizes: list[int],
    *,
    trust: PolicyTrust | None = None,
) -> LoadedPolicy:
    """Loads and compiles the policy at ``source`` (directory or ``models:/`` URI).

    Args:
        source: an artifact directory or a registry URI.
        tracking_uri: the MLflow store of ``models:/`` URIs.
        batch_sizes: the batch sizes compiled before it serves.
        trust: the keys whose signatures are required and the pinned constraints;
            ``None``: an artifact's own sha256s are all that is checked.

    Raises:
        PolicyArtifactError: for an artifact that is corrupt, unsigned or signed by a key
            not trusted (when keys are given), or bundles other constraints than the
            pinned ones, naming why.
    """
    trust = trust or PolicyTrust()
    from neorl_industrial.wrappers.agents.artifact import PolicyArtifact

    registry: dict[str, Any] | None = None
    path: str | Path = source
    if source.startswith(("models:/", "runs:/")):
        from neorl_industrial.integration.mlflow.registry import (
            describe_model_uri,
            resolve_policy_dir,
        )

        path = resolve_policy_dir(source, tracking_uri)
        registry = describe_model_uri(source, tracking_uri)
    artifact = PolicyArtifact.load(
        path,
        trusted_keys=list(trust.keys.values()) if trust.keys else None,
        require_signature=trust.require_signature,
    )
    trust.check(artifact)
    artifact.warmup(batch_sizes)
    return LoadedPolicy(artifact, source, registry, trust)


def padded_sizes(max_batch: int, sizes: list[int]) -> list[int]:
    """The powers of two the artifact pads to, up to the largest batch served."""
    largest = max(max_batch, *sizes)
    return [1 << k for k in range(math.ceil(math.log2(largest)) + 1)]
