"""The Agent facade (fit / predict / save / load / export) and the exported policy
artifact.

Names are imported lazily: a server that only loads an exported policy
(``neorl_industrial.wrappers.agents.artifact``) imports no training code.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Agent": "neorl_industrial.wrappers.agents.agent",
    "AgentError": "neorl_industrial.wrappers.agents.agent",
    "PolicyArtifact": "neorl_industrial.wrappers.agents.artifact",
    "PolicyArtifactError": "neorl_industrial.wrappers.agents.artifact",
    "PolicyDecision": "neorl_industrial.wrappers.agents.artifact",
    "export_policy": "neorl_industrial.wrappers.agents.export",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
