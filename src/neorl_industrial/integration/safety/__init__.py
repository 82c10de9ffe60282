"""Runtime safety: the monitor that aggregates the shield's reports and the append-only,
hash-chained audit log of every override."""

from neorl_industrial.integration.safety.audit import (
    GENESIS,
    AuditLog,
    AuditLogError,
    ShieldOutcome,
)
from neorl_industrial.integration.safety.monitor import HostReport, SafetyMonitor, host_report

__all__ = [
    "GENESIS",
    "AuditLog",
    "AuditLogError",
    "HostReport",
    "SafetyMonitor",
    "ShieldOutcome",
    "host_report",
]
