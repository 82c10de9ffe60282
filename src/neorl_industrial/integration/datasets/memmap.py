"""Sampling a native dataset that does not fit in memory, from memory-mapped files.

The arrays stay on disk (``np.load(mmap_mode="r")``); the operating system pages in what
each batch touches. The only index kept in memory is the end of every episode, so the
index memory is 8 bytes per *episode*: a transition's episode is found by a binary search
of the (sorted) batch indices, and its steps to the episode's end follow from it.

A background thread samples and moves the next batches to the device while the caller
trains on the current one, so disk latency overlaps compute as long as the disk (or the
page cache) keeps up; throughput is bounded by random reads, not by this code.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any

import jax
import numpy as np

from neorl_industrial.functional.state_management import Batch
from neorl_industrial.functional.state_management.dataset import gather_stacked, stored_rows
from neorl_industrial.integration.datasets.arrays import episode_bounds
from neorl_industrial.integration.datasets.card import DatasetCard
from neorl_industrial.integration.datasets.native import read_native_arrays

_POLL_SECONDS = 0.05


class _Failure:
    """Carries an exception from the prefetch thread to the consumer."""

    def __init__(self, error: BaseException):
        self.error = error


class MemmapSampler:
    """Uniform (and n-step) batches from a native dataset on disk, prefetched to device.

    Iterate to get device batches (:class:`~neorl_industrial.functional.state_management.Batch`,
    the same fields and values as the in-memory samplers give)::

        with MemmapSampler("plant-2024", batch_size=256, n_step=3) as sampler:
            for step, batch in zip(range(10_000), sampler):
                state, metrics = update(state, batch, key)

    Use either iteration or :meth:`sample` on one sampler, not both at once: they share
    the random generator. Close the sampler (or use it in a ``with`` block): a running
    prefetch thread keeps it, and its prefetched batches, alive.

    Args:
        path: a native dataset directory (see :func:`save_native`).
        batch_size: transitions per batch.
        n_step: steps summed into each reward (1: one-step transitions).
        gamma: discount for n-step returns and bootstrap factors.
        seed: seed of the index generator (batches are reproducible per seed).
        prefetch: batches kept ready on the device ahead of the consumer.
        device: where batches go; the default device if ``None``.
        verify: check every file's sha256 first (reads the whole dataset once).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        batch_size: int,
        *,
        n_step: int = 1,
        gamma: float = 0.99,
        seed: int = 0,
        prefetch: int = 2,
        device: jax.Device | None = None,
        verify: bool = False,
    ):
        if batch_size < 1 or n_step < 1 or prefetch < 1:
            raise ValueError(
                f"batch_size, n_step and prefetch must be >= 1, got {batch_size}, {n_step}, "
                f"{prefetch}"
            )
        arrays, card = read_native_arrays(path, verify=verify, mmap=True)
        self.card: DatasetCard = card
        self._observations = arrays["observations"]
        self._actions = arrays["actions"]
        self._rewards = arrays["rewards"]
        self._costs = arrays["costs"]
        self._terminals = arrays["terminals"]
        self._frame_stack = card.frame_stack
        _, self._episode_ends = episode_bounds(np.asarray(arrays["episode_lengths"]))
        self.n_transitions = int(self._episode_ends[-1])
        self.batch_size = batch_size
        self.n_step = n_step
        self.gamma = np.float32(gamma)
        self._rng = np.random.default_rng(seed)
        self._device = device
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=prefetch)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def n_episodes(self) -> int:
        return len(self._episode_ends)

    # ----- host-side sampling ---------------------------------------------------------
    def sample_indices(self) -> np.ndarray:
        """Uniform transition indices, sorted so the reads walk the files forwards."""
        return np.sort(self._rng.integers(0, self.n_transitions, self.batch_size))

    def sample(self) -> Batch:
        """One batch of host (numpy) arrays, without the prefetch thread."""
        return self.gather(self.sample_indices())

    def gather(self, indices: np.ndarray) -> Batch:
        """The batch at transition ``indices`` as host arrays: one-step transitions, or
        ``n_step`` returns truncated at the episode's end (same definition as
        :func:`~neorl_industrial.functional.state_management.gather_nstep`)."""
        indices = np.asarray(indices, np.int64)
        episode = np.searchsorted(self._episode_ends, indices, side="right")
        rows = stored_rows(indices, episode, self._frame_stack)
        steps_to_end = self._episode_ends[episode] - indices
        if self.n_step == 1:
            terminals = np.asarray(self._terminals[indices])
            return Batch(
                observations=np.asarray(self._observations_at(rows)),
                actions=np.asarray(self._actions[indices]),
                rewards=np.asarray(self._rewards[indices]),
                costs=np.asarray(self._costs[indices]),
                next_observations=np.asarray(self._observations_at(rows + 1)),
                terminals=terminals,
                discounts=np.where(terminals, np.float32(0.0), self.gamma).astype(np.float32),
            )
        offsets = np.arange(self.n_step)
        horizon = np.minimum(steps_to_end, self.n_step)
        steps = np.minimum(indices[:, None] + offsets, self.n_transitions - 1)
        weights = np.where(
            offsets[None, :] < horizon[:, None],
            np.power(self.gamma, offsets.astype(np.float32)),
            np.float32(0.0),
        ).astype(np.float32)
        flat_steps = steps.reshape(-1)
        rewards = np.asarray(self._rewards[flat_steps]).reshape(steps.shape)
        costs = np.asarray(self._costs[flat_steps]).reshape(*steps.shape, -1)
        terminals = np.asarray(self._terminals[indices + horizon - 1])
        discounts = np.where(
            terminals, np.float32(0.0), np.power(self.gamma, horizon.astype(np.float32))
        )
        return Batch(
            observations=np.asarray(self._observations_at(rows)),
            actions=np.asarray(self._actions[indices]),
            rewards=np.sum(weights * rewards, axis=1, dtype=np.float32),
            costs=np.einsum("bn,bnc->bc", weights, costs).astype(np.float32),
            next_observations=np.asarray(self._observations_at(rows + horizon)),
            terminals=terminals,
            discounts=discounts.astype(np.float32),
        )

    def _observations_at(self, rows: np.ndarray) -> np.ndarray:
        return gather_stacked(self._observations, rows, self._frame_stack)

    # ----- prefetching iterator -------------------------------------------------------
    def __iter__(self) -> MemmapSampler:
        self.start()
        return self

    def __next__(self) -> Batch:
        if self._closed:
            raise StopIteration
        self.start()
        while True:
            try:
                item = self._queue.get(timeout=_POLL_SECONDS)
                break
            except queue.Empty:
                if self._closed:
                    raise StopIteration from None
        if isinstance(item, _Failure):
            self.close()
            raise item.error
        return item

    def start(self) -> None:
        """Starts the prefetch thread (iteration does this on its own).

        Raises:
            RuntimeError: if the sampler was closed.
        """
        if self._closed:
            raise RuntimeError("the sampler is closed; open a new MemmapSampler")
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._produce, name="memmap-prefetch", daemon=True)
        self._thread.start()

    def _produce(self) -> None:
        try:
            while not self._stop.is_set():
                self._offer(jax.device_put(self.sample(), self._device))
        except BaseException as error:
            self._offer(_Failure(error))

    def _offer(self, item: Any) -> None:
        # A bounded wait, so a full queue cannot keep the thread alive after close().
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_SECONDS)
                return
            except queue.Full:
                continue

    @property
    def running(self) -> bool:
        """Whether the prefetch thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def close(self, timeout: float = 5.0) -> None:
        """Stops the prefetch thread and drops the prefetched batches; idempotent.

        Raises:
            RuntimeError: if the thread does not stop within ``timeout`` seconds.
        """
        self._closed = True
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                raise RuntimeError(f"memmap prefetch thread did not stop within {timeout} s")
        while not self._queue.empty():
            self._queue.get_nowait()

    def __enter__(self) -> MemmapSampler:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"MemmapSampler({self.card.name!r}, transitions={self.n_transitions}, "
            f"episodes={self.n_episodes}, batch_size={self.batch_size}, n_step={self.n_step})"
        )
