"""Lagrange multipliers of the safe agents, behind one interface.

A :class:`Multiplier` is a pair of pure functions, ``init(n_costs) -> state`` and
``update(state, cost_value, threshold) -> state``, whose state exposes
``state.multiplier`` (``[n_costs]``, ``>= 0``): the weight of each cost channel for a
constraint ``J_c <= threshold``. Two are offered:

* the PID controller (Stooke, Achiam & Abbeel, 2020; OSRL's default), fast to react with
  little oscillation::

    error      = J_c - threshold
    integral   = max(0, integral + error)
    derivative = max(0, error - previous error)
    multiplier = min(max_multiplier, max(0, K_p max(0, error) + K_i integral + K_d derivative))

* gradient ascent on ``λ (J_c - threshold)`` with an optax optimizer, on ``log λ`` so that
  ``λ`` stays positive (the classic dual update).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

__all__ = [
    "GradientAscentConfig",
    "GradientMultiplierState",
    "Multiplier",
    "PIDConfig",
    "PIDState",
    "gradient_ascent_multiplier",
    "pid_init",
    "pid_multiplier",
    "pid_update",
]


class Multiplier(NamedTuple):
    """A Lagrange multiplier per cost channel as two pure functions.

    Attributes:
        init: ``init(n_costs) -> state``; ``state.multiplier`` is ``[n_costs]``.
        update: ``update(state, cost_value, threshold) -> state`` from the estimated cost
            value ``J_c`` and the threshold it should stay under (both ``[n_costs]``,
            possibly traced).
    """

    init: Callable[[int], Any]
    update: Callable[[Any, jax.Array, jax.Array], Any]


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


def pid_multiplier(config: PIDConfig | None = None) -> Multiplier:
    """The PID controller of ``config`` (OSRL's gains by default) as a :class:`Multiplier`."""
    config = PIDConfig() if config is None else config
    return Multiplier(
        init=pid_init,
        update=lambda state, cost_value, threshold: pid_update(
            config, state, cost_value, threshold
        ),
    )


@dataclasses.dataclass(frozen=True)
class GradientAscentConfig:
    """Settings of the gradient-ascent multiplier: Adam's learning rate on ``log λ`` and
    the multiplier it starts from."""

    lr: float = 3e-4
    initial: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lr) and self.lr > 0.0):
            raise ValueError(f"gradient.lr: must be a finite positive number, got {self.lr}")
        if not (math.isfinite(self.initial) and self.initial > 0.0):
            raise ValueError(
                f"gradient.initial: the multiplier starts positive, got {self.initial}"
            )


@struct.dataclass
class GradientMultiplierState:
    """``log λ`` per cost channel and its optimizer's state."""

    log_multiplier: jax.Array  # [n_costs]
    opt_state: optax.OptState

    @property
    def multiplier(self) -> jax.Array:
        return jnp.exp(self.log_multiplier)


def gradient_ascent_multiplier(
    optimizer: optax.GradientTransformation | float = 3e-4, initial: float = 1.0
) -> Multiplier:
    """A multiplier per cost channel updated by ``optimizer`` (Adam at the given rate
    when a number is given) to increase ``λ (J_c - threshold)``.

    Raises:
        ValueError: for a non-positive initial multiplier.
    """
    if not initial > 0.0:
        raise ValueError(f"initial: the multiplier starts positive, got {initial}")
    if isinstance(optimizer, int | float):
        optimizer = optax.adam(float(optimizer))

    def init(n_costs: int) -> GradientMultiplierState:
        log_multiplier = jnp.full((n_costs,), jnp.log(initial), jnp.float32)
        return GradientMultiplierState(log_multiplier, optimizer.init(log_multiplier))

    def update(
        state: GradientMultiplierState, cost_value: jax.Array, threshold: jax.Array
    ) -> GradientMultiplierState:
        gap = jax.lax.stop_gradient(jnp.asarray(cost_value, jnp.float32) - threshold)

        def dual_loss(log_multiplier: jax.Array) -> jax.Array:  # minimized: ascent on λ · gap
            return -jnp.sum(jnp.exp(log_multiplier) * gap)

        grads = jax.grad(dual_loss)(state.log_multiplier)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.log_multiplier)
        return GradientMultiplierState(
            optax.apply_updates(state.log_multiplier, updates), opt_state
        )

    return Multiplier(init=init, update=update)
