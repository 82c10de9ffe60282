"""``TrainState``: everything an offline training run needs to continue exactly.

A run's state is the algorithm's own state (parameters, optimizer moments, target
networks, multipliers: a PyTree defined by the algorithm), the PRNG key from which the
next chunk's randomness is split, and the number of updates done. Keeping the key in the
state is what makes training deterministic given a seed *and* resumable: a run saved
after any chunk and continued later ends with parameters identical to an uninterrupted
run of the same seed.

Several seeds are one ``TrainState`` whose leaves carry a leading seed axis.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from neorl_industrial.core.agents.types import Algorithm


@struct.dataclass
class TrainState:
    """State of one or several (leading axis) offline training runs.

    Attributes:
        agent: the algorithm's state, as returned by ``algorithm.init``.
        key: PRNG key of the next chunk, ``[2]`` uint32 per run.
        updates: updates done so far, int32 per run.
    """

    agent: Any
    key: jax.Array
    updates: jax.Array

    @property
    def n_seeds(self) -> int | None:
        """Runs held (the leading axis), or None for a single run without that axis."""
        return None if self.updates.ndim == 0 else int(self.updates.shape[0])


def init_train_state(algorithm: Algorithm, seed: int | jax.Array) -> TrainState:
    """The state of a fresh run: the agent initialized from ``seed`` and the sampling key
    derived from it (independent of the initialization key)."""
    root = jax.random.PRNGKey(seed)
    return TrainState(
        agent=algorithm.init(root),
        key=jax.random.fold_in(root, 1),
        updates=jnp.zeros((), jnp.int32),
    )


def init_train_states(algorithm: Algorithm, seeds: Any) -> TrainState:
    """Fresh runs of several seeds, stacked on a leading axis (for ``vmap``)."""
    seeds = jnp.asarray(seeds, jnp.uint32)
    if seeds.ndim != 1 or seeds.shape[0] < 1:
        raise ValueError(f"seeds: expected a non-empty list of seeds, got shape {seeds.shape}")
    return _init_stacked(algorithm, seeds)


@functools.partial(jax.jit, static_argnums=0)
def _init_stacked(algorithm: Algorithm, seeds: jax.Array) -> TrainState:
    # One compiled program per algorithm (its functions are the static key), instead of
    # the dozens of one-operation programs that initialising eagerly under vmap compiles.
    return jax.vmap(lambda seed: init_train_state(algorithm, seed))(seeds)


def donatable(tree: Any) -> Any:
    """``tree`` with every leaf in a buffer of its own, for a program that donates it: a
    fresh state may hold one buffer twice (a target network starts as its online network),
    and the caller's arrays must survive the donation. The runtime copies the buffers; no
    program is compiled (a ``jnp.copy`` per leaf compiled one per leaf shape)."""
    return jax.tree.map(lambda leaf: jax.device_put(leaf, may_alias=False), tree)


def uncommitted(tree: Any) -> Any:
    """``tree``'s arrays as a computation makes them: in JAX's default placement, not
    committed to a device. A checkpoint restores arrays committed to their device, and a
    program called with committed arguments is another program (its arguments carry
    explicit shardings): a resumed run would compile its training and evaluation again.
    A host round trip (once per restore); typed PRNG keys go through their key data."""

    def fresh(leaf: Any) -> Any:
        if not isinstance(leaf, jax.Array):
            return leaf
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            data = jnp.asarray(np.asarray(jax.random.key_data(leaf)))
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(leaf))
        return jnp.asarray(np.asarray(leaf))

    return jax.tree.map(fresh, tree)
