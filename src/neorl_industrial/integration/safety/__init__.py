"""Runtime safety monitor, audit log and safety reports.

Filled by the safety work; empty until then."""
