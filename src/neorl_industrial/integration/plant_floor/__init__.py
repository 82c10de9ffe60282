"""To the plant floor: the OPC UA bridge that runs an exported policy against a plant in
shadow mode (read, decide, log beside what the operators did; write nothing) or closed
loop (write the shielded action, audited), and the shadow report that judges a shadow
run (``neorl-industrial bridge``, ``neorl-industrial shadow-report``)."""

from __future__ import annotations

from neorl_industrial.core.utils.lazy import lazy_exports

# Each module and the names it defines for the package.
_MODULES = {
    ".errors": (
        "BridgeError",
        "ClosedLoopRefused",
        "MapError",
        "NodeIdError",
        "PolicyTaskError",
        "SecurityError",
        "UnitMismatchError",
        "UnknownFeatureError",
    ),
    ".mapping": ("PlantMap", "load_map"),
    ".plan": ("BridgePlan", "prepare"),
    ".bridge": ("PlantBridge", "Backoff", "Reconnection"),
    ".metrics": ("BridgeMetrics",),
    ".opcua": ("Security",),
    ".ticklog": ("read_tick_log",),
    ".report": ("ShadowReport", "shadow_report"),
}


__getattr__, __dir__, __all__ = lazy_exports(__name__, _MODULES)
