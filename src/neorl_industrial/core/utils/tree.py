"""PyTree helpers."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def tree_where(mask: jax.Array, on_true: Any, on_false: Any) -> Any:
    """Selects leaf-wise between two PyTrees of the same structure.

    ``mask`` has the leading (batch) shape of the leaves; it is broadcast over their
    trailing dimensions.
    """

    def select(a: jax.Array, b: jax.Array) -> jax.Array:
        condition = jnp.reshape(mask, mask.shape + (1,) * (a.ndim - mask.ndim))
        return jnp.where(condition, a, b)

    return jax.tree.map(select, on_true, on_false)


def tree_bytes(tree: Any) -> int:
    """Total number of bytes held by the array leaves of ``tree``."""
    return sum(int(leaf.size) * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree))
