"""Optimizers of the training state: optax chains, and the Lagrange multipliers of the safe
agents behind one interface, ``Multiplier(init, update)`` (the PID controller and a
gradient-ascent multiplier built on optax)."""

from neorl_industrial.functional.optimizers.lagrangian import (
    GradientAscentConfig,
    GradientMultiplierState,
    LagrangeMultiplier,
    Multiplier,
    MultiplierState,
    PIDConfig,
    PIDState,
    gradient_ascent_multiplier,
    per_step_cost_threshold,
    pid_init,
    pid_multiplier,
    pid_update,
)

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
