"""The project's own optimizers, as optax transformations every agent composes: Adam built
from a network's settings (learning rate, gradient clipping, weight decay), the one
gradient step (:func:`apply_gradients`) every network and every Lagrange multiplier takes,
and the multipliers' dual ascent (PID or gradient ascent)."""

from neorl_industrial.core.optimizers.dual_ascent import (
    GradientAscentConfig,
    LogMultiplierState,
    PIDConfig,
    PIDState,
    ascend,
    gradient_ascent,
    pid_ascent,
)
from neorl_industrial.core.optimizers.gradients import apply_gradients, make_optimizer

__all__ = [
    "GradientAscentConfig",
    "LogMultiplierState",
    "PIDConfig",
    "PIDState",
    "apply_gradients",
    "ascend",
    "gradient_ascent",
    "make_optimizer",
    "pid_ascent",
]
