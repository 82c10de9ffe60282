"""Vectorized sampling from a :class:`Dataset`: uniform transitions, n-step returns and
windows of consecutive steps. Every sampler is a few gathers, jit- and vmap-compatible.

:class:`Batch` is the core's (``core.agents.types``), re-exported here."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from neorl_industrial.core.agents.types import Batch
from neorl_industrial.functional.state_management.dataset import Dataset


@struct.dataclass
class Windows:
    """Fixed-length windows of consecutive steps of one episode: ``[B, L, ...]``."""

    observations: jax.Array  # [B, L + 1, obs_size]: the window's observations and the next
    actions: jax.Array  # [B, L, ...]
    rewards: jax.Array  # [B, L]
    costs: jax.Array  # [B, L, n_costs]
    terminals: jax.Array  # [B, L]
    timeouts: jax.Array  # [B, L]
    start: jax.Array  # [B] first transition index of each window


def sample_indices(dataset: Dataset, key: jax.Array, batch_size: int) -> jax.Array:
    """Uniform transition indices."""
    return jax.random.randint(key, (batch_size,), 0, dataset.n_transitions)


def gather_transitions(dataset: Dataset, indices: jax.Array, gamma: float = 0.99) -> Batch:
    """One-step transitions at ``indices``."""
    rows = dataset.observation_index[indices]
    terminals = dataset.terminals[indices]
    return Batch(
        observations=dataset.observations_at(rows),
        actions=dataset.actions[indices],
        rewards=dataset.rewards[indices],
        costs=dataset.costs[indices],
        next_observations=dataset.observations_at(rows + 1),
        terminals=terminals,
        discounts=jnp.where(terminals, 0.0, jnp.asarray(gamma, jnp.float32)),
    )


def sample(dataset: Dataset, key: jax.Array, batch_size: int, gamma: float = 0.99) -> Batch:
    """Uniformly sampled one-step transitions."""
    return gather_transitions(dataset, sample_indices(dataset, key, batch_size), gamma)


def gather_nstep(dataset: Dataset, indices: jax.Array, n_step: int, gamma: float) -> Batch:
    """``n_step`` returns from ``indices``, truncated at the end of the episode.

    Steps past the episode's end are masked out; the bootstrap observation is the one
    ``k = min(n_step, steps_to_end)`` steps ahead, with discount ``gamma ** k`` (0 if the
    episode terminated within those steps).
    """
    offsets = jnp.arange(n_step)
    horizon = jnp.minimum(dataset.steps_to_end[indices], n_step)  # [B]
    steps = jnp.minimum(indices[:, None] + offsets, dataset.n_transitions - 1)  # [B, n]
    valid = offsets[None, :] < horizon[:, None]
    weights = jnp.where(valid, jnp.asarray(gamma, jnp.float32) ** offsets, 0.0)
    rewards = jnp.sum(weights * dataset.rewards[steps], axis=1)
    costs = jnp.einsum("bn,bnc->bc", weights, dataset.costs[steps])
    last = indices + horizon - 1
    terminals = dataset.terminals[last]
    rows = dataset.observation_index[indices]
    discounts = jnp.where(terminals, 0.0, jnp.asarray(gamma, jnp.float32) ** horizon)
    return Batch(
        observations=dataset.observations_at(rows),
        actions=dataset.actions[indices],
        rewards=rewards,
        costs=costs,
        next_observations=dataset.observations_at(rows + horizon),
        terminals=terminals,
        discounts=discounts.astype(jnp.float32),
    )


def sample_nstep(
    dataset: Dataset, key: jax.Array, batch_size: int, n_step: int, gamma: float = 0.99
) -> Batch:
    """Uniformly sampled ``n_step`` transitions (see :func:`gather_nstep`)."""
    return gather_nstep(dataset, sample_indices(dataset, key, batch_size), n_step, gamma)


def window_starts(dataset: Dataset, length: int) -> jax.Array:
    """Transition indices where a window of ``length`` steps fits inside one episode.

    Computed once (on the host) per window length, like the other indices.

    Raises:
        ValueError: if no episode is at least ``length`` steps long.
    """
    steps_to_end = jax.device_get(dataset.steps_to_end)
    starts = (steps_to_end >= length).nonzero()[0]
    if len(starts) == 0:
        raise ValueError(
            f"length: no episode has {length} steps; the longest has "
            f"{int(jax.device_get(dataset.episode_lengths).max())}"
        )
    return jnp.asarray(starts, jnp.int32)


def gather_windows(dataset: Dataset, starts: jax.Array, length: int) -> Windows:
    """Windows of ``length`` consecutive steps beginning at transition ``starts``."""
    steps = starts[:, None] + jnp.arange(length)  # [B, L]
    first_rows = dataset.observation_index[starts]
    rows = first_rows[:, None] + jnp.arange(length + 1)
    return Windows(
        observations=dataset.observations_at(rows),
        actions=dataset.actions[steps],
        rewards=dataset.rewards[steps],
        costs=dataset.costs[steps],
        terminals=dataset.terminals[steps],
        timeouts=dataset.timeouts[steps],
        start=starts,
    )


def sample_windows(
    dataset: Dataset, valid_starts: jax.Array, key: jax.Array, batch_size: int, length: int
) -> Windows:
    """Uniformly sampled windows; ``valid_starts`` comes from :func:`window_starts`."""
    choice = jax.random.randint(key, (batch_size,), 0, valid_starts.shape[0])
    return gather_windows(dataset, valid_starts[choice], length)
