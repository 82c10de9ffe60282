"""Named safe controllers: the fallback a constraint spec can point to by name.

A safe controller is a pure JAX function ``controller(observation, prev_action,
constraints) -> action`` (one observation, ``[action_size]`` out) that a plant engineer
trusts, e.g. the plant's conventional controller. It is looked up by name when a spec is
compiled, so the name in a YAML file is checked before anything runs; whatever it returns
is still clipped into the action box and checked by the shield.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["SafeController", "get_safe_controller", "register_safe_controller", "safe_controllers"]

SafeController = Callable[[jax.Array, jax.Array, Any], jax.Array]

_CONTROLLERS: dict[str, SafeController] = {}


def register_safe_controller(
    name: str, controller: SafeController | None = None, *, overwrite: bool = False
) -> Any:
    """Registers ``controller`` under ``name`` (usable as a decorator).

    Raises:
        ValueError: for an empty name, or a name already taken (unless ``overwrite``).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: a safe controller needs a non-empty name, got {name!r}")

    def register(function: SafeController) -> SafeController:
        if not callable(function):
            raise ValueError(f"controller: {name!r} must be callable, got {function!r}")
        if name in _CONTROLLERS and not overwrite and _CONTROLLERS[name] is not function:
            raise ValueError(f"name: a safe controller {name!r} is already registered")
        _CONTROLLERS[name] = function
        return function

    return register if controller is None else register(controller)


def get_safe_controller(name: str) -> SafeController:
    """The controller registered under ``name``.

    Raises:
        KeyError: naming the unknown controller and the registered ones.
    """
    if name not in _CONTROLLERS:
        raise KeyError(f"unknown safe controller {name!r}; registered: {sorted(_CONTROLLERS)}")
    return _CONTROLLERS[name]


def safe_controllers() -> tuple[str, ...]:
    return tuple(sorted(_CONTROLLERS))


@register_safe_controller("zero")
def zero_action(observation: jax.Array, prev_action: jax.Array, constraints: Any) -> jax.Array:
    """No change: for actions that are increments (the Industrial Benchmark's), zero
    leaves every setting where it is."""
    return jnp.zeros_like(jnp.asarray(prev_action, jnp.float32))


@register_safe_controller("hold_previous")
def hold_previous(observation: jax.Array, prev_action: jax.Array, constraints: Any) -> jax.Array:
    """Repeats the previous action (zero where it is not finite)."""
    prev_action = jnp.asarray(prev_action, jnp.float32)
    return jnp.where(jnp.isfinite(prev_action), prev_action, 0.0)
