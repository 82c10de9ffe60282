"""The optimizer every network of the project is trained with, built from its settings, and
the one gradient step they all take."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import jax
import optax

__all__ = ["apply_gradients", "make_optimizer"]


def make_optimizer(
    learning_rate: float | jax.Array,
    max_grad_norm: float | jax.Array | None = None,
    weight_decay: float | jax.Array = 0.0,
) -> optax.GradientTransformation:
    """Adam at ``learning_rate``, after clipping the gradient's global norm to
    ``max_grad_norm`` (None: no clipping), with decoupled ``weight_decay`` (AdamW) unless it
    is the number 0.

    Every setting may be traced (a swept field, ADR-0009); numbers are checked here.

    Raises:
        ValueError: for a ``max_grad_norm`` that is not positive or a negative
            ``weight_decay``.
    """
    if isinstance(max_grad_norm, numbers.Real) and not max_grad_norm > 0.0:
        raise ValueError(f"max_grad_norm: must be positive or None, got {max_grad_norm}")
    concrete_decay = isinstance(weight_decay, numbers.Real)
    if concrete_decay and not weight_decay >= 0.0:
        raise ValueError(f"weight_decay: must be >= 0, got {weight_decay}")
    if concrete_decay and weight_decay == 0.0:
        optimizer = optax.adam(learning_rate)
    else:
        optimizer = optax.adamw(learning_rate, weight_decay=weight_decay)
    if max_grad_norm is None:
        return optimizer
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), optimizer)


def apply_gradients(
    objective: Callable[[Any], tuple[jax.Array, Any]],
    params: Any,
    optimizer: optax.GradientTransformation,
    opt_state: optax.OptState,
) -> tuple[Any, optax.OptState, jax.Array, Any]:
    """One optimizer step on ``objective(params) -> (loss, aux)``: its gradient, the
    optimizer's update (which sees ``params``, as weight decay needs) and the new
    parameters.

    Returns:
        ``(params, opt_state, loss, aux)`` after the step; ``loss`` and ``aux`` are those
        of the parameters before it.
    """
    (loss, aux), grads = jax.value_and_grad(objective, has_aux=True)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, aux
