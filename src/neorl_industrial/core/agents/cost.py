"""Pieces shared by the safe (Lagrangian) agents: cost thresholds and the PID multiplier.

OSRL's semantics: an episode cost limit ``L`` over episodes of ``T`` steps becomes a
threshold on the discounted cost value, ``L (1 - γ^T) / ((1 - γ) T)`` (the discounted sum
of a cost spread evenly at ``L / T`` per step), and a PID controller (Stooke, Achiam &
Abbeel, 2020) turns the gap between the policy's estimated cost value and that threshold
into a non-negative Lagrange multiplier per cost channel:

    error      = J_c - threshold
    integral   = max(0, integral + error)
    derivative = max(0, error - previous error)
    multiplier = max(0, K_p max(0, error) + K_i integral + K_d derivative)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

__all__ = ["PIDConfig", "PIDState", "per_step_cost_threshold", "pid_init", "pid_update"]


def per_step_cost_threshold(cost_limit: float, discount: float, episode_length: int) -> float:
    """The threshold on a discounted cost value that an episode cost limit implies.

    Raises:
        ValueError: for a negative limit, a discount outside (0, 1] or a non-positive length.
    """
    if not (math.isfinite(cost_limit) and cost_limit >= 0.0):
        raise ValueError(f"cost_limit: must be a finite number >= 0, got {cost_limit}")
    if not 0.0 < discount <= 1.0:
        raise ValueError(f"discount: must lie in (0, 1], got {discount}")
    if episode_length < 1:
        raise ValueError(f"episode_length: must be positive, got {episode_length}")
    if discount == 1.0:
        return float(cost_limit)
    return float(cost_limit * (1.0 - discount**episode_length) / (1.0 - discount) / episode_length)


@dataclasses.dataclass(frozen=True)
class PIDConfig:
    """Gains of the PID multiplier (OSRL's defaults) and an upper bound on it."""

    kp: float = 0.1
    ki: float = 0.003
    kd: float = 0.001
    max_multiplier: float = 1000.0

    def __post_init__(self) -> None:
        for name in ("kp", "ki", "kd"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"pid.{name}: must be a finite number >= 0, got {value}")
        if not self.max_multiplier > 0.0:
            raise ValueError(f"pid.max_multiplier: must be positive, got {self.max_multiplier}")


@struct.dataclass
class PIDState:
    """Controller state, one entry per cost channel."""

    integral: jax.Array  # [n_costs]
    previous_error: jax.Array  # [n_costs]
    multiplier: jax.Array  # [n_costs]


def pid_init(n_costs: int, initial_multiplier: float = 0.0) -> PIDState:
    zeros = jnp.zeros((n_costs,), jnp.float32)
    return PIDState(
        integral=zeros, previous_error=zeros, multiplier=zeros + jnp.float32(initial_multiplier)
    )


def pid_update(
    config: PIDConfig, state: PIDState, cost_value: jax.Array, threshold: jax.Array
) -> PIDState:
    """One controller step from the estimated cost value ``J_c`` (``[n_costs]``)."""
    error = jnp.asarray(cost_value, jnp.float32) - threshold
    integral = jax.nn.relu(state.integral + error)
    derivative = jax.nn.relu(error - state.previous_error)
    multiplier = jax.nn.relu(
        config.kp * jax.nn.relu(error) + config.ki * integral + config.kd * derivative
    )
    return PIDState(
        integral=integral,
        previous_error=error,
        multiplier=jnp.minimum(multiplier, config.max_multiplier),
    )


def thresholds(
    cost_limits: Sequence[float], discount: float, episode_length: int
) -> tuple[float, ...]:
    """Per-channel thresholds of :func:`per_step_cost_threshold`."""
    return tuple(per_step_cost_threshold(limit, discount, episode_length) for limit in cost_limits)


def check_safe_config(config: Any) -> None:
    """Validates the safety fields every Lagrangian config shares, naming the field."""
    limits = config.cost_limits
    if not limits:
        raise ValueError("cost_limits: give one episode cost limit per cost channel")
    for i, limit in enumerate(limits):
        if not (math.isfinite(limit) and limit >= 0.0):
            raise ValueError(f"cost_limits[{i}]: must be a finite number >= 0, got {limit}")
    thresholds(limits, config.discount, config.episode_length)
