"""Dual ascent on Lagrange multipliers as optax transformations.

A safe agent weighs each cost channel ``c`` by a multiplier ``λ_c >= 0`` of the constraint
``J_c <= d_c``. The multipliers minimize the dual loss ``-sum_c λ_c (J_c - d_c)`` (the gap
held constant), whose gradient is ``-(J_c - d_c)``: a transformation here takes that
gradient and the current ``λ`` (``[n_costs]``, the parameters) and returns the change of
``λ``, so one :func:`~neorl_industrial.core.optimizers.gradients.apply_gradients` steps the
multipliers as it steps a network (:func:`ascend`). Two are offered:

* :func:`pid_ascent`: the PID controller (Stooke, Achiam & Abbeel, 2020; OSRL's default),
  fast to react with little oscillation; with ``error = J_c - d_c``::

    integral   = max(0, integral + error)
    derivative = max(0, error - previous error)
    λ          = min(max_multiplier, max(0, K_p max(0, error) + K_i integral + K_d derivative))

* :func:`gradient_ascent`: the classic dual update, an optax optimizer (Adam) ascending
  ``λ (J_c - d_c)`` on ``log λ`` so that ``λ`` stays positive.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import optax
from flax import struct

from neorl_industrial.core.optimizers.gradients import apply_gradients, make_optimizer

__all__ = [
    "GradientAscentConfig",
    "LogMultiplierState",
    "PIDConfig",
    "PIDState",
    "ascend",
    "gradient_ascent",
    "pid_ascent",
]


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


def _needs_multiplier(params: jax.Array | None) -> jax.Array:
    if params is None:
        raise ValueError("params: a dual ascent needs the current multipliers, got None")
    return params


@struct.dataclass
class PIDState:
    """The controller's memory, one entry per cost channel."""

    integral: jax.Array  # [n_costs]
    previous_error: jax.Array  # [n_costs]


def pid_ascent(config: PIDConfig | None = None) -> optax.GradientTransformation:
    """The PID controller of ``config`` (OSRL's gains by default) as a transformation of
    the dual loss's gradient ``-(J_c - d_c)`` into the change of ``λ``."""
    config = PIDConfig() if config is None else config

    def init(params: jax.Array) -> PIDState:
        zeros = jnp.zeros_like(params)
        return PIDState(integral=zeros, previous_error=zeros)

    def update(
        updates: jax.Array, state: PIDState, params: jax.Array | None = None
    ) -> tuple[jax.Array, PIDState]:
        multiplier = _needs_multiplier(params)
        error = -updates  # the constraint's violation J_c - d_c
        integral = jax.nn.relu(state.integral + error)
        derivative = jax.nn.relu(error - state.previous_error)
        target = jax.nn.relu(
            config.kp * jax.nn.relu(error) + config.ki * integral + config.kd * derivative
        )
        target = jnp.minimum(target, config.max_multiplier)
        return target - multiplier, PIDState(integral=integral, previous_error=error)

    return optax.GradientTransformation(init, update)


@struct.dataclass
class LogMultiplierState:
    """``log λ`` per cost channel, where the inner optimizer steps, and its state."""

    log_multiplier: jax.Array  # [n_costs]
    inner: optax.OptState


def gradient_ascent(
    optimizer: optax.GradientTransformation | float = 3e-4,
) -> optax.GradientTransformation:
    """Gradient ascent of ``λ (J_c - d_c)`` by ``optimizer`` (Adam at the given rate when a
    number is given) on ``log λ``: the gradient in ``λ`` is carried to ``log λ`` by the
    chain rule, and the new ``λ`` is ``exp(log λ)``, positive whatever the step."""
    if isinstance(optimizer, int | float):
        optimizer = make_optimizer(float(optimizer))

    def init(params: jax.Array) -> LogMultiplierState:
        log_multiplier = jnp.log(params)
        return LogMultiplierState(log_multiplier, optimizer.init(log_multiplier))

    def update(
        updates: jax.Array, state: LogMultiplierState, params: jax.Array | None = None
    ) -> tuple[jax.Array, LogMultiplierState]:
        multiplier = _needs_multiplier(params)
        # d/d(log λ) = d/dλ · λ, with λ = exp(log λ) as the inner optimizer last left it.
        grads = updates * jnp.exp(state.log_multiplier)
        steps, inner = optimizer.update(grads, state.inner, state.log_multiplier)
        log_multiplier = optax.apply_updates(state.log_multiplier, steps)
        return jnp.exp(log_multiplier) - multiplier, LogMultiplierState(log_multiplier, inner)

    return optax.GradientTransformation(init, update)


def ascend(
    dual_ascent: optax.GradientTransformation,
    multiplier: jax.Array,
    opt_state: optax.OptState,
    violation: jax.Array,
) -> tuple[jax.Array, optax.OptState]:
    """One step of the multipliers (``[n_costs]``) on the dual loss
    ``-sum_c λ_c violation_c``, with ``violation = J_c - d_c`` held constant.

    Returns:
        ``(multiplier, opt_state)`` after the step.
    """
    gap = jax.lax.stop_gradient(jnp.asarray(violation, jnp.float32))

    def dual_loss(multiplier: jax.Array) -> tuple[jax.Array, None]:
        return -jnp.sum(multiplier * gap), None

    multiplier, opt_state, _, _ = apply_gradients(dual_loss, multiplier, dual_ascent, opt_state)
    return multiplier, opt_state
