"""To the plant floor: the OPC UA bridge that runs an exported policy against a plant in
shadow mode (read, decide, log beside what the operators did; write nothing) or closed
loop (write the shielded action, audited), and the shadow report that judges a shadow
run (``neorl-industrial bridge``, ``neorl-industrial shadow-report``)."""

from __future__ import annotations

from neorl_industrial.core.utils.lazy import lazy_exports

_EXPORTS = {
    "BridgeError": ".errors",
    "ClosedLoopRefused": ".errors",
    "MapError": ".errors",
    "NodeIdError": ".errors",
    "PolicyTaskError": ".errors",
    "SecurityError": ".errors",
    "UnitMismatchError": ".errors",
    "UnknownFeatureError": ".errors",
    "PlantMap": ".mapping",
    "load_map": ".mapping",
    "BridgePlan": ".plan",
    "prepare": ".plan",
    "PlantBridge": ".bridge",
    "Backoff": ".bridge",
    "Reconnection": ".bridge",
    "BridgeMetrics": ".metrics",
    "Security": ".opcua",
    "read_tick_log": ".ticklog",
    "ShadowReport": ".report",
    "shadow_report": ".report",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
