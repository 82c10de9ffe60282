"""The served policy: an exported artifact (a directory or a ``models:/`` URI), verified,
compiled for every padded batch size, and what the server says about it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

__all__ = ["LoadedPolicy", "load_policy_source", "padded_sizes"]


class LoadedPolicy:
    """A verified, compiled policy artifact and what the server says about it."""

    def __init__(self, artifact: Any, source: str, registry: dict[str, Any] | None) -> None:
        self.artifact = artifact
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
        }


def load_policy_source(
    source: str, tracking_uri: str | None, batch_sizes: list[int]
) -> LoadedPolicy:
    """Loads and compiles the policy at ``source`` (directory or ``models:/`` URI)."""
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
    artifact = PolicyArtifact.load(path)
    artifact.warmup(batch_sizes)
    return LoadedPolicy(artifact, source, registry)


def padded_sizes(max_batch: int, sizes: list[int]) -> list[int]:
    """The powers of two the artifact pads to, up to the largest batch served."""
    largest = max(max_batch, *sizes)
    return [1 << k for k in range(math.ceil(math.log2(largest)) + 1)]
