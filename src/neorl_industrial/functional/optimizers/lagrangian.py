"""Lagrange multipliers for constrained offline RL.

One interface, :class:`Multiplier` (``init(n_costs) -> state``,
``update(state, cost_value, threshold) -> state``, ``state.multiplier``), for the
multiplier ``λ >= 0`` of each constraint ``J_c <= threshold``:

* the PID controller (:func:`pid_multiplier`; the default of the safe agents): fast to
  react, little oscillation;
* gradient ascent on ``λ (J_c - threshold)`` with any optax optimizer, on ``log λ`` so
  that ``λ`` stays positive (:func:`gradient_ascent_multiplier`, the classic dual update).

They are defined with the safe agents in the core (``core.agents.multipliers``, which
the core's agents use and the core cannot import from here) and are re-exported here,
with the threshold an episode cost limit implies (``core.agents.cost``).
"""

from __future__ import annotations

from neorl_industrial.core.agents.cost import per_step_cost_threshold
from neorl_industrial.core.agents.multipliers import (
    GradientAscentConfig,
    GradientMultiplierState,
    Multiplier,
    PIDConfig,
    PIDState,
    gradient_ascent_multiplier,
    pid_init,
    pid_multiplier,
    pid_update,
)

# The names this module had before the interface moved to the core.
LagrangeMultiplier = Multiplier
MultiplierState = GradientMultiplierState

__all__ = [
    "GradientAscentConfig",
    "GradientMultiplierState",
    "LagrangeMultiplier",
    "Multiplier",
    "MultiplierState",
    "PIDConfig",
    "PIDState",
    "gradient_ascent_multiplier",
    "per_step_cost_threshold",
    "pid_init",
    "pid_multiplier",
    "pid_update",
]
