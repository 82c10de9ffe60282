"""Optimizers of the training state: optax chains, and the Lagrange multipliers of the safe
agents (the PID controller, and a gradient-ascent multiplier built on optax)."""

from neorl_industrial.functional.optimizers.lagrangian import (
    LagrangeMultiplier,
    PIDConfig,
    PIDState,
    gradient_ascent_multiplier,
    per_step_cost_threshold,
    pid_init,
    pid_update,
)

__all__ = [
    "LagrangeMultiplier",
    "PIDConfig",
    "PIDState",
    "gradient_ascent_multiplier",
    "per_step_cost_threshold",
    "pid_init",
    "pid_update",
]
