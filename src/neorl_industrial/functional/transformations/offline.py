"""Offline training as compiled chunks: N updates fused in one ``lax.scan`` with the
batches sampled inside it, and many seeds at once by ``vmap`` over separate parameters.

Metrics leave the device once per chunk, as one PyTree: the mean over the chunk's
updates, per seed.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from neorl_industrial.core.agents.types import Algorithm
from neorl_industrial.functional.state_management import Dataset, sample
from neorl_industrial.functional.state_management.train_state import (
    TrainState,
    donatable,
    init_train_states,
)

#: ``sampler(dataset, key, batch_size) -> batch``.
Sampler = Callable[[Dataset, jax.Array, int], Any]


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How much one training call runs and in what pieces.

    Attributes:
        n_updates: updates per run in the call; rounded up to whole chunks.
        chunk_updates: updates fused into one compiled call (at most ``n_updates``: a
            short call compiles a chunk of its own length, it does not run a long one).
        batch_size: transitions per update.

    Raises:
        ValueError: naming the first field that is not a positive integer.
    """

    n_updates: int
    chunk_updates: int = 1000
    batch_size: int = 256

    def __post_init__(self) -> None:
        check_positive_ints(
            n_updates=self.n_updates, chunk_updates=self.chunk_updates, batch_size=self.batch_size
        )

    @property
    def chunk(self) -> int:
        """Updates per compiled call: ``chunk_updates``, at most ``n_updates``."""
        return min(self.chunk_updates, self.n_updates)


#: Host callback after every chunk: ``(updates_done, metrics per seed as numpy) -> None``.
ChunkCallback = Callable[[int, dict[str, Any]], None]


def make_chunk(
    algorithm: Algorithm,
    batch_size: int,
    n_updates: int,
    sampler: Sampler = sample,
) -> Callable[[Any, Dataset, jax.Array], tuple[Any, dict[str, jax.Array]]]:
    """``chunk(state, dataset, key) -> (state, mean metrics)``: ``n_updates`` updates of
    one seed, each on a freshly sampled batch. Pure; jit and vmap it at the call site.

    The dataset is an argument, not a closed-over constant, so the compiled program does
    not embed it and one compilation serves every dataset of the same shapes.
    """

    def one_update(state: Any, inputs: tuple[jax.Array, Dataset]):
        key, dataset = inputs
        sample_key, update_key = jax.random.split(key)
        batch = sampler(dataset, sample_key, batch_size)
        return algorithm.update(state, batch, update_key)

    def chunk(state: Any, dataset: Dataset, key: jax.Array):
        def body(state, key):
            return one_update(state, (key, dataset))

        state, metrics = jax.lax.scan(body, state, jax.random.split(key, n_updates))
        return state, jax.tree.map(jnp.mean, metrics)

    return chunk


def make_seeded_chunk(
    algorithm: Algorithm, batch_size: int, n_updates: int, sampler: Sampler = sample
) -> Callable[[Any, Dataset, jax.Array], tuple[Any, dict[str, jax.Array]]]:
    """:func:`make_chunk` vmapped over seeds: states and keys carry a leading seed axis,
    the dataset is shared."""
    return jax.vmap(make_chunk(algorithm, batch_size, n_updates, sampler), in_axes=(0, None, 0))


def init_seeds(algorithm: Algorithm, seeds: jax.Array | list[int]) -> Any:
    """Initial algorithm states of several seeds, stacked on a leading axis (the
    ``agent`` of :func:`init_train_states`)."""
    return init_train_states(algorithm, seeds).agent


def make_train_chunk(
    algorithm: Algorithm, batch_size: int, n_updates: int, sampler: Sampler = sample
) -> Callable[[TrainState, Dataset], tuple[TrainState, dict[str, jax.Array]]]:
    """``chunk(train_state, dataset) -> (train_state, mean metrics)`` for runs with a
    leading seed axis: the chunk's key is split from each run's own key, so the result
    depends only on the state (training resumes exactly from any saved state)."""
    seeded = make_seeded_chunk(algorithm, batch_size, n_updates, sampler)

    def chunk(state: TrainState, dataset: Dataset):
        pairs = jax.vmap(jax.random.split)(state.key)
        agent, metrics = seeded(state.agent, dataset, pairs[:, 1])
        return TrainState(agent=agent, key=pairs[:, 0], updates=state.updates + n_updates), metrics

    return chunk


def train_offline(
    algorithm: Algorithm,
    dataset: Dataset,
    schedule: Schedule,
    *,
    seeds: list[int] | tuple[int, ...] = (0,),
    sampler: Sampler = sample,
    callback: ChunkCallback | None = None,
    state: TrainState | None = None,
    check_action_units: bool = True,
) -> tuple[TrainState, list[dict[str, Any]]]:
    """Trains one agent per seed on ``dataset``, all seeds in one vmapped program.

    Args:
        algorithm: the agent.
        dataset: the data, on device.
        schedule: updates per seed in this call, per compiled chunk, and the batch size.
        seeds: one independent run (initialization and sampling) per seed.
        sampler: how batches are drawn.
        callback: called on the host after every chunk.
        state: continue these runs (e.g. a saved :class:`TrainState`) instead of starting
            fresh ones from ``seeds``; its runs are not modified (they are copied).
        check_action_units: warn when continuous actions lie outside [-1, 1], where the
            agents' tanh policies cannot reach (False for learners that take any action,
            such as FQE).

    Returns:
        ``(state, history)``: the final :class:`TrainState` (leading seed axis; the
        algorithm states are ``state.agent``) and, per chunk, the updates done (in total),
        seconds, updates per second (all seeds) and the mean metrics per seed.
    """
    if state is None:
        if not seeds:
            raise ValueError("seeds: expected at least one seed")
        state = init_train_states(algorithm, list(seeds))
    elif state.n_seeds is None:
        raise ValueError("state: expected runs with a leading seed axis (init_train_states)")
    n_runs = state.n_seeds
    if check_action_units:
        _warn_about_action_units(dataset)
    chunk = jax.jit(
        make_train_chunk(algorithm, schedule.batch_size, schedule.chunk, sampler),
        donate_argnums=0,
    )
    # States are donated to every chunk; a fresh state may hold one buffer twice (a target
    # network starts as its online network), and a caller's state must survive, so each
    # leaf gets its own copy first.
    state = donatable(state)
    state, history = run_chunks(
        lambda state: chunk(state, dataset), state, schedule, n_runs, callback
    )
    return state, history


def run_chunks(
    step: Callable[[TrainState], tuple[TrainState, Any]],
    state: TrainState,
    schedule: Schedule,
    n_runs: int,
    callback: ChunkCallback | None = None,
    to_host: Callable[[Any], Any] = jax.device_get,
) -> tuple[TrainState, list[dict[str, Any]]]:
    """Calls the compiled chunk ``step`` (``schedule.chunk`` updates) until the
    schedule's ``n_updates`` are done; per chunk
    the updates done (in total), seconds, updates per second (all ``n_runs`` runs) and the
    metrics, brought to the host once with ``to_host`` and given to ``callback``. Returns
    the final state and those entries."""
    history: list[dict[str, Any]] = []
    done, chunk_updates = 0, schedule.chunk
    while done < schedule.n_updates:
        started = time.perf_counter()
        state, metrics = step(state)
        metrics = to_host(metrics)  # the one transfer of the chunk
        seconds = time.perf_counter() - started
        done += chunk_updates
        total = int(state.updates[0])
        history.append(
            {
                "updates": total,
                "seconds": seconds,
                "updates_per_s": n_runs * chunk_updates / seconds,
                "metrics": metrics,
            }
        )
        if callback is not None:
            callback(total, metrics)
    return state, history


def check_positive_ints(**values: Any) -> None:
    """Raises ValueError naming the first of ``values`` that is not a positive integer."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive integer, got {value!r}")


def _warn_about_action_units(dataset: Dataset) -> None:
    """The continuous-action agents act in [-1, 1] (a tanh): data logged in a plant's units
    (a valve in %, a flow in m³/h) must be scaled first, or the policy saturates at the
    bounds of [-1, 1]. Said once, on the host, before anything is compiled."""
    if dataset.discrete or dataset.n_transitions == 0:
        return
    actions = np.asarray(jax.device_get(dataset.actions))
    low, high = float(actions.min()), float(actions.max())
    if low < -1.0 - 1e-6 or high > 1.0 + 1e-6:
        warnings.warn(
            f"dataset: actions range over [{low:.4g}, {high:.4g}], outside the policies' "
            "[-1, 1]; scale them with functional.state_management.ActionScaler (and act "
            "through with_action_scaling), or train with the Agent, which does both",
            stacklevel=3,
        )
