"""The Agent facade (fit / predict / save / load / export) and the exported policy
artifact.

Names are imported lazily: a server that only loads an exported policy
(``neorl_industrial.wrappers.agents.artifact``) imports no training code.
"""

from __future__ import annotations

from neorl_industrial.core.utils.lazy import lazy_exports

_EXPORTS = {
    "Agent": "neorl_industrial.wrappers.agents.agent",
    "AgentError": "neorl_industrial.wrappers.agents.agent",
    "OPESettings": "neorl_industrial.wrappers.agents.agent",
    "PolicyArtifact": "neorl_industrial.wrappers.agents.artifact",
    "PolicyArtifactError": "neorl_industrial.wrappers.agents.artifact",
    "PolicyDecision": "neorl_industrial.wrappers.agents.artifact",
    "PolicyExport": "neorl_industrial.wrappers.agents.export",
    "JointVerdict": "neorl_industrial.wrappers.agents.joint_verdict",
    "export_policy": "neorl_industrial.wrappers.agents.export",
    "judge_together": "neorl_industrial.wrappers.agents.joint_verdict",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
