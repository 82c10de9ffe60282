"""Random-number helpers for the hot path."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.extend.random import threefry_2x32


def uniform(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Float32 uniforms in [0, 1) from a threefry key, using every word the hash yields.

    ``jax.random.uniform`` in its partitionable layout spends one threefry block per
    32-bit word; this draws the counters ``0..n-1`` through ``threefry_2x32`` directly,
    which fills two words per block and halves the cost of the generator on the CPU.
    Keys of other implementations fall back to ``jax.random.uniform``.
    """
    key_words = jax.random.key_data(key) if _is_typed_key(key) else key
    if key_words.shape != (2,):
        return jax.random.uniform(key, shape)
    count = math.prod(shape)
    bits = threefry_2x32(key_words, jnp.arange(count, dtype=jnp.uint32))
    # 23 random mantissa bits under the exponent of 1.0 give a float in [1, 2).
    mantissa = (bits >> jnp.uint32(9)) | jnp.uint32(0x3F800000)
    floats = jax.lax.bitcast_convert_type(mantissa, jnp.float32) - jnp.float32(1.0)
    return floats.reshape(shape)


def _is_typed_key(key: jax.Array) -> bool:
    return jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
