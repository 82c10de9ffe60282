"""Constraint PyTrees, per-step costs and the lax.cond safety shield.

Filled by the safety work (constraint specs, shield, cost critics); empty until then."""
