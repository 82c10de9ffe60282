"""Lagrange multipliers for constrained offline RL.

Two updates for the multiplier ``λ >= 0`` of a constraint ``J_c <= threshold``:

* the PID controller (the default of the safe agents; defined with them in the core and
  re-exported here): fast to react, little oscillation;
* gradient ascent on ``λ (J_c - threshold)`` with any optax optimizer, on ``log λ`` so
  that ``λ`` stays positive (the classic dual update).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from neorl_industrial.core.agents.cost import (
    PIDConfig,
    PIDState,
    per_step_cost_threshold,
    pid_init,
    pid_update,
)

__all__ = [
    "LagrangeMultiplier",
    "MultiplierState",
    "PIDConfig",
    "PIDState",
    "gradient_ascent_multiplier",
    "per_step_cost_threshold",
    "pid_init",
    "pid_update",
]


@struct.dataclass
class MultiplierState:
    log_multiplier: jax.Array  # [n_costs]
    opt_state: optax.OptState

    @property
    def multiplier(self) -> jax.Array:
        return jnp.exp(self.log_multiplier)


class LagrangeMultiplier(NamedTuple):
    """``init(n_costs) -> state`` and ``update(state, cost_value, threshold) -> state``."""

    init: object
    update: object


def gradient_ascent_multiplier(
    optimizer: optax.GradientTransformation | float = 3e-4, initial: float = 1.0
) -> LagrangeMultiplier:
    """A multiplier per cost channel updated by ``optimizer`` (Adam at the given rate
    when a number is given) to increase ``λ (J_c - threshold)``.

    Raises:
        ValueError: for a non-positive initial multiplier.
    """
    if not initial > 0.0:
        raise ValueError(f"initial: the multiplier starts positive, got {initial}")
    if isinstance(optimizer, int | float):
        optimizer = optax.adam(float(optimizer))

    def init(n_costs: int) -> MultiplierState:
        log_multiplier = jnp.full((n_costs,), jnp.log(initial), jnp.float32)
        return MultiplierState(log_multiplier, optimizer.init(log_multiplier))

    def update(state: MultiplierState, cost_value: jax.Array, threshold: jax.Array):
        gap = jax.lax.stop_gradient(jnp.asarray(cost_value, jnp.float32) - threshold)

        def dual_loss(log_multiplier):  # minimized: ascent on λ · gap
            return -jnp.sum(jnp.exp(log_multiplier) * gap)

        grads = jax.grad(dual_loss)(state.log_multiplier)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.log_multiplier)
        return MultiplierState(optax.apply_updates(state.log_multiplier, updates), opt_state)

    return LagrangeMultiplier(init=init, update=update)
