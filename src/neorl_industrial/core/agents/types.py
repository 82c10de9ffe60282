"""Types shared by every algorithm of the core."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

Metrics = dict[str, jax.Array]


class Algorithm(NamedTuple):
    """An agent as pure functions (the optax style: a factory closes over the config).

    Attributes:
        init: ``init(key) -> state``.
        update: ``update(state, batch, key) -> (state, metrics)``; metrics are scalars.
        act: ``act(policy_params, observation, key, deterministic=False) -> action``, for
            one observation or a batch; ``deterministic`` is a Python bool.
    """

    init: Callable[[jax.Array], Any]
    update: Callable[[Any, Any, jax.Array], tuple[Any, Metrics]]
    act: Callable[..., jax.Array]
