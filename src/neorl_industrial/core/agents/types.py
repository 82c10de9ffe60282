"""Types shared by every algorithm of the core: the batch it learns from and the algorithm
itself (the gradient step every network takes is ``core.optimizers.apply_gradients``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
from flax import struct

Metrics = dict[str, jax.Array]


@struct.dataclass
class Batch:
    """A batch of transitions.

    ``discounts`` is the factor that multiplies the bootstrap value of ``next_observations``:
    ``gamma ** k`` after ``k`` steps, and 0 after a terminal state.
    """

    observations: jax.Array  # [B, obs_size]
    actions: jax.Array  # [B, action_size] or [B]
    rewards: jax.Array  # [B]: one-step reward, or the discounted n-step return
    costs: jax.Array  # [B, n_costs]: one-step cost, or the discounted n-step cost
    next_observations: jax.Array  # [B, obs_size]
    terminals: jax.Array  # [B] bool: a terminal state was reached
    discounts: jax.Array  # [B] float32


class Algorithm(NamedTuple):
    """An agent as pure functions (the optax style: a factory closes over the config).

    Attributes:
        init: ``init(key) -> state``.
        update: ``update(state, batch, key) -> (state, metrics)``; metrics are scalars.
        act: ``act(policy_params, observation, key, deterministic=False) -> action``, for
            one observation or a batch; ``deterministic`` is a Python bool.
    """

    init: Callable[[jax.Array], Any]
    update: Callable[[Any, Batch, jax.Array], tuple[Any, Metrics]]
    act: Callable[..., jax.Array]
