"""PyTree helpers."""

from __future__ import annotations

from collections.abc import Mapping
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


def merge_nested(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``update`` merged in, section by section: where both hold a mapping
    under a key the two are merged, anywhere else ``update``'s value wins. Neither input
    is changed; the mappings of the result are new dicts all the way down."""
    merged = copy_nested(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_nested(merged[key], value)
        else:
            merged[key] = copy_nested(value)
    return merged


def copy_nested(value: Any) -> Any:
    """``value`` with every mapping in it copied into a new dict (other values shared)."""
    if isinstance(value, Mapping):
        return {key: copy_nested(item) for key, item in value.items()}
    return value
