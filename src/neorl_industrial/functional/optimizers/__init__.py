"""Optax chains and Lagrange-multiplier (PID) updates.

Filled by the algorithm and safety work; empty until then."""
