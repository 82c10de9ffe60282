"""The bridge's named errors: each says what is wrong and what to do, and every one of
them about the map, the task or the policy is raised before anything connects."""

from __future__ import annotations

__all__ = [
    "BridgeError",
    "ClosedLoopRefused",
    "MapError",
    "NodeIdError",
    "PlantConnectionError",
    "PolicyTaskError",
    "SecurityError",
    "UnitMismatchError",
    "UnknownFeatureError",
]


class BridgeError(ValueError):
    """The bridge cannot start; the message names the file, binding or node."""


class MapError(BridgeError):
    """A map file that cannot be read or does not validate."""


class UnknownFeatureError(MapError):
    """The map binds an observation or action the task does not have, or leaves one of
    the task's unbound."""


class UnitMismatchError(MapError):
    """The unit a map binding (or the node's own EngineeringUnits) states is not the
    task's unit for that feature or action."""


class NodeIdError(MapError):
    """A node id that is not OPC UA node-id syntax, or that the server does not have."""


class PolicyTaskError(BridgeError):
    """The policy was exported for another task than the map's."""


class ClosedLoopRefused(BridgeError):
    """Closed loop asked for a policy without a verified signature by a trusted key."""


class SecurityError(BridgeError):
    """Certificates, keys or credentials that cannot be used, or a server that requires
    a security policy the bridge was not given."""


class PlantConnectionError(BridgeError):
    """The server cannot be reached at start (later losses are faults, not errors)."""
