"""Per-transition losses shared by several agents (rlax style: one transition, ``vmap``ped
at the call site, shapes checked at entry)."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

__all__ = ["critic_loss", "expectile_loss"]


def critic_loss(q_t: jax.Array, target_t: jax.Array) -> jax.Array:
    """Squared TD error of every critic for one transition: ``q_t`` is ``[n_critics]``."""
    chex.assert_rank([q_t, target_t], [1, 0])
    chex.assert_type([q_t, target_t], float)
    return jnp.sum(jnp.square(q_t - target_t))


def expectile_loss(difference_t: jax.Array, expectile: float) -> jax.Array:
    """Asymmetric squared loss of ``Q - V`` for one transition."""
    chex.assert_rank(difference_t, 0)
    chex.assert_type(difference_t, float)
    weight = jnp.where(difference_t > 0, expectile, 1.0 - expectile)
    return weight * jnp.square(difference_t)
