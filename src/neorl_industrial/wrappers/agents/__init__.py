"""The Agent facade (fit / predict / save / load / export) and the exported policy
artifact.

Names are imported lazily: a server that only loads an exported policy
(``neorl_industrial.wrappers.agents.artifact``) imports no training code.
"""

from __future__ import annotations

from neorl_industrial.core.utils.lazy import lazy_exports

# Each module and the names it defines for the package.
_MODULES = {
    ".agent": ("Agent", "AgentError", "OPESettings"),
    ".artifact": ("PolicyArtifact", "PolicyArtifactError", "PolicyDecision"),
    ".export": ("PolicyExport", "export_policy"),
    ".joint_verdict": ("JointVerdict", "judge_together"),
}


__getattr__, __dir__, __all__ = lazy_exports(__name__, _MODULES)
