"""Data-parallel training of one run: the dataset in shards of whole episodes, one or more
per device, every update's batch drawn from all shards and its gradients averaged over
devices and processes.

The layout is a one-axis :class:`~jax.sharding.Mesh` (``"data"``) and compiled
shardings, not per-device code:

* the shards are stacked on a leading axis, padded to common sizes, and that axis is laid
  over the mesh, so each device (and each process of JAX's distributed runtime) holds only
  its shards - a process loads only its episodes (``load_native_shards`` memory-maps the
  native files and reads its range);
* each update draws ``batch_size / n_shards`` transitions uniformly from every shard
  (a vmap over the shard axis: a gather each device does on its own shards) and the batch
  keeps its sharding over ``"data"``;
* the parameters are replicated; the algorithm's update is the one of ``train_offline``,
  and because its losses are means over the batch, XLA's partitioner computes each
  device's part of the gradient and all-reduces it (over gloo between CPU processes).

With shards of equal size this is uniform sampling from the whole dataset: the same
distribution of batches as one device would draw. Shards are contiguous ranges of episodes
balanced by transitions (:func:`plan_shards`); they differ by less than one episode, and
each shard's transitions are drawn with probability ``1 / (n_shards * shard size)``.
The result does not depend on how the shards are laid over devices: one device with four
shards and four devices with one each run the same program up to the order of the
gradient sums.

Where it pays (docs/training.md): a dataset that does not fit one device or host. It does
not make one run faster on a CPU host whose cores one run already keeps busy.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from neorl_industrial.core.agents.types import Algorithm
from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.functional.state_management.dataset import episodes_dataset
from neorl_industrial.functional.state_management.sampling import gather_nstep, gather_transitions
from neorl_industrial.functional.state_management.train_state import (
    TrainState,
    init_train_states,
)
from neorl_industrial.functional.transformations.offline import (
    ChunkCallback,
    Schedule,
    check_positive_ints,
    make_train_chunk,
    run_chunks,
)
from neorl_industrial.functional.transformations.sweep import SweepError, place, to_host

DATA_AXIS = "data"


class DataParallelError(SweepError):
    """A data-parallel layout that cannot work: the message names the value and the fix."""


def data_mesh(devices: Sequence[Any] | None = None) -> Mesh:
    """A one-axis mesh (``"data"``) over ``devices`` (default: every device of every
    process)."""
    return Mesh(np.asarray(list(devices) if devices is not None else jax.devices()), (DATA_AXIS,))


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """Which episodes each shard holds and the padded sizes every shard is stored at.

    Attributes:
        bounds: ``[n_shards + 1]`` episode boundaries: shard ``s`` holds episodes
            ``bounds[s] .. bounds[s + 1] - 1``.
        transitions: transitions of each shard.
        frame_stack: frames per observation of the stored data (the same in every shard).
    """

    bounds: tuple[int, ...]
    transitions: tuple[int, ...]
    frame_stack: int = 1

    @property
    def n_shards(self) -> int:
        return len(self.bounds) - 1

    def episodes(self, shard: int) -> tuple[int, int]:
        """``(first, stop)`` episodes of ``shard``."""
        return self.bounds[shard], self.bounds[shard + 1]

    @property
    def padded_transitions(self) -> int:
        return max(self.transitions)

    @property
    def padded_episodes(self) -> int:
        return max(b - a for a, b in itertools.pairwise(self.bounds))

    @property
    def padded_rows(self) -> int:
        """Stored observation rows of the largest shard, at the most episodes."""
        return self.padded_transitions + self.padded_episodes * self.frame_stack


def plan_shards(episode_lengths: Any, n_shards: int, frame_stack: int = 1) -> ShardPlan:
    """Contiguous ranges of whole episodes, balanced by transitions: shard ``s`` ends at
    the episode boundary nearest ``(s + 1) / n_shards`` of the transitions.

    Raises:
        DataParallelError: when there are fewer episodes than shards.
    """
    lengths = np.asarray(episode_lengths, np.int64)
    if isinstance(n_shards, bool) or not isinstance(n_shards, int) or n_shards < 1:
        raise DataParallelError(f"n_shards: expected a positive integer, got {n_shards!r}")
    if len(lengths) < n_shards:
        raise DataParallelError(
            f"data: {len(lengths)} episodes cannot fill {n_shards} shards of whole episodes; "
            f"use at most {len(lengths)} shards (devices)"
        )
    ends = np.cumsum(lengths)
    total = int(ends[-1])
    bounds = [0]
    for shard in range(1, n_shards):
        target = total * shard / n_shards
        cut = int(np.argmin(np.abs(ends - target))) + 1
        # Every shard keeps at least one episode, and enough are left for the rest.
        cut = min(max(cut, bounds[-1] + 1), len(lengths) - (n_shards - shard))
        bounds.append(cut)
    bounds.append(len(lengths))
    transitions = tuple(int(lengths[a:b].sum()) for a, b in itertools.pairwise(bounds))
    return ShardPlan(tuple(bounds), transitions, frame_stack)


def pad_shard(shard: Dataset, plan: ShardPlan) -> Dataset:
    """``shard`` with every array padded (zeros; steps to the end 1) to the plan's common
    sizes, as host arrays (they go to the mesh's devices next). Padding is never sampled:
    indices are drawn below the shard's own count."""
    if shard.frame_stack != plan.frame_stack:
        raise DataParallelError(
            f"shard: stores {shard.frame_stack} frame(s) per observation, the plan "
            f"{plan.frame_stack}; build every shard with the plan's frame_stack"
        )
    sizes = {
        "observations": plan.padded_rows,
        "episode_starts": plan.padded_episodes,
        "episode_lengths": plan.padded_episodes,
    }

    def pad(name: str, leaf: Any) -> np.ndarray:
        leaf = np.asarray(leaf)
        target = sizes.get(name, plan.padded_transitions)
        widths = [(0, target - leaf.shape[0])] + [(0, 0)] * (leaf.ndim - 1)
        return np.pad(leaf, widths, constant_values=1 if name == "steps_to_end" else 0)

    return shard.replace(
        **{
            field.name: pad(field.name, getattr(shard, field.name))
            for field in dataclasses.fields(shard)
            if field.name != "frame_stack"
        }
    )


@struct.dataclass
class ShardedDataset:
    """Shards of one dataset stacked on a leading axis (laid over the ``"data"`` mesh).

    Attributes:
        shards: a :class:`Dataset` whose every array has a leading ``[n_shards]`` axis.
        counts: ``[n_shards]`` real transitions of each shard.
    """

    shards: Dataset
    counts: jax.Array

    @property
    def n_shards(self) -> int:
        return int(self.counts.shape[0])


def shard_dataset(
    local_shards: Sequence[Dataset], plan: ShardPlan, mesh: Mesh | None = None
) -> ShardedDataset:
    """The global :class:`ShardedDataset` from this process's shards.

    Args:
        local_shards: the shards this process holds, in order: all of them in one
            process; in a distributed run, the ``n_shards / process_count`` consecutive
            shards of this process (see :func:`local_shard_ids`).
        plan: the plan every process made from the same episode lengths.
        mesh: the ``"data"`` mesh (default :func:`data_mesh`); the shard axis is laid over
            it, each device holding ``n_shards / n_devices`` shards.

    Raises:
        DataParallelError: when the shards do not divide over the devices.
    """
    mesh = data_mesh() if mesh is None else mesh
    n_devices = int(mesh.devices.size)
    if plan.n_shards % n_devices:
        raise DataParallelError(
            f"data: {plan.n_shards} shards do not divide over {n_devices} devices; use a "
            f"multiple of {n_devices} shards"
        )
    padded = [pad_shard(shard, plan) for shard in local_shards]
    local = jax.tree.map(lambda *leaves: np.stack(leaves), *padded)
    counts = np.asarray([shard.n_transitions for shard in local_shards], np.int32)
    sharding = NamedSharding(mesh, PartitionSpec(DATA_AXIS))

    def globalize(leaf: np.ndarray) -> jax.Array:
        shape = (plan.n_shards, *leaf.shape[1:])
        return jax.make_array_from_process_local_data(sharding, leaf, shape)

    return ShardedDataset(shards=jax.tree.map(globalize, local), counts=globalize(counts))


def local_shard_ids(plan: ShardPlan) -> range:
    """The shards this process holds: a consecutive ``n_shards / process_count`` of them.

    Raises:
        DataParallelError: when the shards do not divide over the processes.
    """
    count, index = jax.process_count(), jax.process_index()
    if plan.n_shards % count:
        raise DataParallelError(
            f"data: {plan.n_shards} shards do not divide over {count} processes"
        )
    per = plan.n_shards // count
    return range(index * per, (index + 1) * per)


def split_dataset(
    dataset: Dataset, n_shards: int | None = None, mesh: Mesh | None = None
) -> ShardedDataset:
    """An in-memory dataset in ``n_shards`` shards (default: one per device of ``mesh``)
    laid over ``mesh``; in a distributed run every process passes the whole dataset and
    keeps only its own shards."""
    mesh = data_mesh() if mesh is None else mesh
    n_shards = int(mesh.devices.size) if n_shards is None else n_shards
    plan = plan_shards(
        np.asarray(jax.device_get(dataset.episode_lengths)), n_shards, dataset.frame_stack
    )
    arrays = dataset.stored_arrays()  # one host copy for every shard
    shards = [
        episodes_dataset(arrays, *plan.episodes(s), dataset.frame_stack)
        for s in local_shard_ids(plan)
    ]
    return shard_dataset(shards, plan, mesh)


def observation_moments(local_shards: Sequence[Dataset]) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation of every observation feature over the shards of every
    process (each process's sums gathered once), as :meth:`Dataset.observation_moments`
    of the whole dataset gives them: what a normalizer needs when no process holds it."""
    rows = []
    for shard in local_shards:
        mean, std = shard.observation_moments()
        count = shard.n_transitions + shard.n_episodes
        rows.append(np.concatenate([[count], mean, count * std**2]))
    stats = np.stack(rows)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        stats = np.asarray(multihost_utils.process_allgather(stats), np.float64)
        stats = stats.reshape(-1, stats.shape[-1])
    # Chan et al.'s pairwise combination: each shard's squared deviations about its own
    # mean, plus its mean's deviation from the total mean (no E[x^2] - E[x]^2 cancellation).
    size = (stats.shape[1] - 1) // 2
    counts, means, squares = stats[:, :1], stats[:, 1 : 1 + size], stats[:, 1 + size :]
    mean = (counts * means).sum(0) / counts.sum()
    variance = (squares + counts * (means - mean) ** 2).sum(0) / counts.sum()
    return mean, np.sqrt(variance)


def sharded_sampler(mesh: Mesh, n_step: int = 1, gamma: float = 0.99):
    """``sampler(sharded, key, batch_size) -> Batch``: ``batch_size / n_shards`` uniform
    transitions (or ``n_step`` returns) from each shard, concatenated shard-major and
    constrained to the ``"data"`` sharding."""
    batch_sharding = NamedSharding(mesh, PartitionSpec(DATA_AXIS))

    def sampler(data: ShardedDataset, key: jax.Array, batch_size: int):
        n_shards = data.n_shards
        per_shard = batch_size // n_shards

        def one(shard: Dataset, count: jax.Array, shard_key: jax.Array):
            indices = jax.random.randint(shard_key, (per_shard,), 0, count)
            if n_step == 1:
                return gather_transitions(shard, indices, gamma)
            return gather_nstep(shard, indices, n_step, gamma)

        batch = jax.vmap(one)(data.shards, data.counts, jax.random.split(key, n_shards))
        batch = jax.tree.map(lambda x: x.reshape(n_shards * per_shard, *x.shape[2:]), batch)
        return jax.lax.with_sharding_constraint(batch, batch_sharding)

    return sampler


def data_parallel_chunk(
    algorithm: Algorithm,
    batch_size: int,
    chunk_updates: int,
    mesh: Mesh,
    n_step: int = 1,
    gamma: float = 0.99,
):
    """The jitted ``chunk(train_state, sharded) -> (train_state, metrics)`` of
    :func:`~neorl_industrial.functional.transformations.offline.make_train_chunk` with
    batches from every shard; state and metrics come out replicated over ``mesh``."""
    replicated = NamedSharding(mesh, PartitionSpec())
    program = make_train_chunk(
        algorithm, batch_size, chunk_updates, sharded_sampler(mesh, n_step, gamma)
    )
    return jax.jit(program, donate_argnums=0, out_shardings=(replicated, replicated))


def check_batch(batch_size: int, n_shards: int) -> None:
    """Raises DataParallelError when ``batch_size`` does not divide into the shards."""
    if batch_size % n_shards:
        raise DataParallelError(
            f"batch_size: {batch_size} transitions do not divide into {n_shards} shards; "
            f"use a multiple of {n_shards}"
        )


def replicate(tree: Any, mesh: Mesh) -> Any:
    """``tree``'s arrays replicated on every device of ``mesh`` (as global arrays)."""
    return place(tree, NamedSharding(mesh, PartitionSpec()))


def localize(tree: Any) -> Any:
    """Replicated global arrays as ordinary arrays on this process's default device (for
    evaluation, checkpoints and export, which run per process)."""
    return jax.tree.map(jnp.asarray, to_host(tree))


def train_data_parallel(
    algorithm: Algorithm,
    data: ShardedDataset,
    schedule: Schedule,
    *,
    mesh: Mesh | None = None,
    seeds: Sequence[int] = (0,),
    n_step: int = 1,
    gamma: float = 0.99,
    callback: ChunkCallback | None = None,
    state: TrainState | None = None,
) -> tuple[TrainState, list[dict[str, Any]]]:
    """Trains one run per seed on the sharded data, each update's batch drawn from every
    shard and its gradient averaged over the ``"data"`` mesh.

    Args:
        algorithm: the agent (the same on every process).
        data: from :func:`shard_dataset` / :func:`split_dataset` on ``mesh``.
        mesh: the ``"data"`` mesh the data lies on (default :func:`data_mesh`).
        seeds: one run per seed (vmapped; each draws its own batches).
        schedule: updates per run in this call, per compiled chunk, and the batch size
            (transitions per update over all shards; a multiple of the shards).
        n_step: steps summed into each reward (1: one-step transitions).
        gamma: discount of n-step returns and bootstrap factors.
        callback: called on the host after every chunk.
        state: continue these runs instead of starting fresh ones from ``seeds``.

    Returns:
        ``(state, history)`` as :func:`~neorl_industrial.functional.transformations.train_offline`:
        every process holds the (replicated) final state.

    Raises:
        DataParallelError: for a batch that does not divide into the shards.
    """
    check_positive_ints(n_step=n_step)
    batch_size, chunk_updates = schedule.batch_size, schedule.chunk
    mesh = data_mesh() if mesh is None else mesh
    check_batch(batch_size, data.n_shards)
    if state is None:
        if not seeds:
            raise ValueError("seeds: expected at least one seed")
        state = init_train_states(algorithm, list(seeds))
    state = replicate(state, mesh)
    chunk = data_parallel_chunk(algorithm, batch_size, chunk_updates, mesh, n_step, gamma)
    state, history = run_chunks(
        lambda state: chunk(state, data),
        state,
        schedule,
        state.n_seeds,
        callback,
        to_host=to_host,
    )
    return localize(state), history
