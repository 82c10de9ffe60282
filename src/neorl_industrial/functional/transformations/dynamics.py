"""Fitting a dynamics ensemble as one compiled program.

Every member of every seed trains at once: the update is ``vmap`` over members and seeds
of one member's Adam step on its own batch, and ``lax.scan`` fuses a chunk of updates.
Each member draws its batches from its own bootstrap of the training *episodes* (indices
precomputed on the host, as the dataset's own), so members differ by data as well as by
initialization, and disagree where the episodes they saw do not settle the answer.
After every chunk the members are scored on held-out episodes
(mean squared error of the normalized prediction) and each member keeps its best
parameters; training stops when no member improved by more than 1 % for ``patience``
chunks (MBPO's rule), and each seed keeps its ``n_elites`` best members. How well the
fitted model predicts: :mod:`~neorl_industrial.functional.transformations.dynamics_fidelity`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from neorl_industrial.core.models.dynamics import (
    Dynamics,
    DynamicsConfig,
    DynamicsLayout,
    DynamicsParams,
    ModelBatch,
    make_dynamics,
)
from neorl_industrial.core.optimizers import apply_gradients, make_optimizer
from neorl_industrial.functional.state_management.dataset import Dataset
from neorl_industrial.functional.state_management.train_state import donatable
from neorl_industrial.functional.transformations.offline import Schedule, check_positive_ints

__all__ = [
    "EnsembleTrainState",
    "FitResult",
    "data_statistics",
    "fit_ensemble",
    "init_ensemble",
    "make_fit_chunk",
    "model_batch",
    "select_elites",
    "window_batch",
]

#: Spreads below this count as constant (a fixed setpoint): such targets are not scaled.
MIN_STD = 1e-6
#: Relative improvement of a member's held-out error that counts as progress (MBPO's).
IMPROVEMENT = 0.01
#: Held-out transitions scored after every chunk, at most (a fixed, evenly spaced subset).
HOLDOUT_ROWS = 8192


@struct.dataclass
class EnsembleTrainState:
    """Training state of ``S`` seeds × ``M`` members (leading axes ``[S, M]``)."""

    networks: Any
    opt_state: Any
    best_networks: Any
    best_score: jax.Array  # [S, M]: held-out error of best_networks
    key: jax.Array  # [S, M, 2]
    updates: jax.Array  # [] updates done per member


class FitResult(NamedTuple):
    """What :func:`fit_ensemble` returns."""

    state: EnsembleTrainState
    history: list[dict[str, Any]]
    stopped_early: bool
    seconds: float


def _optimizer(dynamics: Dynamics) -> optax.GradientTransformation:
    config = dynamics.config
    return make_optimizer(config.learning_rate, weight_decay=config.weight_decay)


def data_statistics(
    dataset: Dataset,
    dynamics: Dynamics,
    action_low: Sequence[float],
    action_high: Sequence[float],
    physical_low: Sequence[float] | None = None,
    physical_high: Sequence[float] | None = None,
) -> DynamicsParams:
    """The statistics of ``dataset`` (actions in [-1, 1]) a model is fitted with and
    steps by, computed once on the host: observation and target mean and spread, the
    data's range of every feature and action, and the plant-unit action bounds. The
    ``networks`` field is None.

    The bounds a prediction is held to: each feature of the newest frame within
    ``physical_low``/``physical_high`` (``[frame_size]``, plant units) where finite, else
    within the data's range; a learned reward and every learned cost within the data's
    range (a 0/1 alarm is at most 1 a step)."""
    layout = dynamics.layout
    host = jax.device_get(dataset)
    frames = np.asarray(host.observations, np.float64)
    rows = np.asarray(host.observation_index)
    obs_mean, obs_std = dataset.observation_moments()
    stored = dataset.observation_rows()
    low = np.tile(frames[stored].min(axis=0), layout.frame_stack)
    high = np.tile(frames[stored].max(axis=0), layout.frame_stack)
    targets = dynamics.targets(
        frames[rows],
        None,
        frames[rows + 1],
        np.asarray(host.rewards, np.float64),
        np.asarray(host.costs, np.float64),
    )
    targets = np.asarray(targets, np.float64)
    actions = np.asarray(host.actions, np.float64).reshape(dataset.n_transitions, -1)

    def spread(std: np.ndarray) -> jax.Array:
        return jnp.asarray(np.where(std > MIN_STD, std, 1.0), jnp.float32)

    frame = layout.frame_size
    frame_low, frame_high = low[:frame].copy(), high[:frame].copy()
    for given, bound in ((physical_low, frame_low), (physical_high, frame_high)):
        if given is not None:
            given = np.asarray(given, np.float64)[:frame]
            bound[:] = np.where(np.isfinite(given), given, bound)
    rewards = np.asarray(host.rewards, np.float64)
    costs = np.asarray(host.costs, np.float64).reshape(dataset.n_transitions, -1)

    return DynamicsParams(
        networks=None,
        obs_mean=jnp.asarray(obs_mean, jnp.float32),
        obs_std=spread(obs_std),
        target_mean=jnp.asarray(targets.mean(axis=0), jnp.float32),
        target_std=spread(targets.std(axis=0)),
        target_fixed=jnp.asarray(targets.std(axis=0) <= MIN_STD),
        cost_low=jnp.asarray(np.asarray(host.costs).min(axis=0, initial=np.inf), jnp.float32),
        obs_low=jnp.asarray(low, jnp.float32),
        obs_high=jnp.asarray(high, jnp.float32),
        policy_action_low=jnp.asarray(actions.min(axis=0), jnp.float32),
        policy_action_high=jnp.asarray(actions.max(axis=0), jnp.float32),
        action_low=jnp.asarray(np.asarray(action_low, np.float64), jnp.float32),
        action_high=jnp.asarray(np.asarray(action_high, np.float64), jnp.float32),
        frame_low=jnp.asarray(frame_low, jnp.float32),
        frame_high=jnp.asarray(frame_high, jnp.float32),
        cost_high=jnp.asarray(costs.max(axis=0, initial=-np.inf), jnp.float32),
        reward_low=jnp.asarray(rewards.min(initial=np.inf), jnp.float32),
        reward_high=jnp.asarray(rewards.max(initial=-np.inf), jnp.float32),
    )


def model_batch(dataset: Dataset, dynamics: Dynamics, indices: jax.Array) -> ModelBatch:
    """The transitions ``indices`` of ``dataset`` as a model learns them: raw
    observations, actions (already in [-1, 1]), raw targets and terminal flags. Gathers
    only the newest frame of the next observation."""
    rows = dataset.observation_index[indices]
    observations = dataset.observations_at(rows)
    targets = dynamics.targets(
        observations,
        None,
        dataset.observations[rows + 1],
        dataset.rewards[indices],
        dataset.costs[indices],
    )
    actions = dataset.actions[indices].reshape(indices.shape[0], -1)
    return ModelBatch(
        observations=observations,
        actions=actions,
        targets=targets,
        terminals=dataset.terminals[indices],
    )


def window_batch(
    dataset: Dataset, dynamics: Dynamics, first: jax.Array, steps: int
) -> tuple[ModelBatch, jax.Array]:
    """Windows of ``steps`` consecutive transitions from each of ``first`` (a
    :class:`ModelBatch` with ``[B, steps]`` leading axes) and ``valid [B, steps]``: the
    step lies inside the first one's episode (a window reaching the episode's end is
    cut there)."""
    rows = jnp.minimum(first[:, None] + jnp.arange(steps), dataset.n_transitions - 1)
    batch = jax.vmap(lambda r: model_batch(dataset, dynamics, r), in_axes=1, out_axes=1)(rows)
    valid = jnp.arange(steps)[None] < dataset.steps_to_end[first][:, None]
    return batch, valid


def init_ensemble(dynamics: Dynamics, seeds: Sequence[int]) -> EnsembleTrainState:
    """Fresh networks of every seed's members (``[S, M]``), their optimizer states and
    keys; best scores start at infinity."""
    build = _init_program(dynamics.config, dynamics.layout, len(seeds))
    return build(jnp.asarray(np.asarray([int(seed) for seed in seeds], np.uint32)))


@functools.lru_cache(maxsize=16)
def _init_program(
    config: DynamicsConfig, layout: DynamicsLayout, n_seeds: int
) -> Callable[[jax.Array], EnsembleTrainState]:
    """:func:`init_ensemble` as one compiled program (not one eager operation per layer
    and leaf), shared by every fit of the same model shape in the process (a history
    check's, a sweep's)."""
    dynamics = make_dynamics(config, layout)
    members = config.n_members
    optimizer = _optimizer(dynamics)

    @jax.jit
    def build(seed_values: jax.Array) -> EnsembleTrainState:
        keys = jax.vmap(lambda seed: jax.random.split(jax.random.PRNGKey(seed), members * 2))(
            seed_values
        ).reshape(n_seeds, members, 2, -1)
        init_keys, run_keys = keys[:, :, 0], keys[:, :, 1]
        networks = jax.vmap(jax.vmap(dynamics.init))(init_keys)
        return EnsembleTrainState(
            networks=networks,
            opt_state=jax.vmap(jax.vmap(optimizer.init))(networks),
            best_networks=networks,
            best_score=jnp.full((n_seeds, members), jnp.inf, jnp.float32),
            key=run_keys,
            updates=jnp.zeros((), jnp.int32),
        )

    return build


def bootstrap_indices(episode_id: np.ndarray, n_seeds: int, n_members: int, seed: int) -> jax.Array:
    """``[S, M, N]`` transitions each member trains on, drawn on the host from a bootstrap
    of the training *episodes*: each member and seed resamples the ``E`` episodes with
    replacement and draws its ``N`` transitions from the episodes it drew (an episode drawn
    twice weighs twice). Transitions of one episode are not independent, so a member fitted
    on its own resample of transitions sees every episode and agrees with its siblings
    where they all extrapolate; members fitted on different episodes disagree there, and
    their spread carries the fit's uncertainty into every interval built on them. With a
    single episode it is a bootstrap of that episode's transitions."""
    episode_id = np.asarray(episode_id)
    n_transitions = int(episode_id.shape[0])
    rng = np.random.default_rng(seed)
    _, episode_of = np.unique(episode_id, return_inverse=True)
    n_episodes = int(episode_of.max()) + 1 if n_transitions else 0
    out = np.empty((n_seeds, n_members, n_transitions), np.int64)
    for s in range(n_seeds):
        for m in range(n_members):
            if n_episodes < 2:
                out[s, m] = rng.integers(0, n_transitions, n_transitions)
                continue
            weight = rng.multinomial(n_episodes, np.full(n_episodes, 1.0 / n_episodes))
            per_transition = weight[episode_of].astype(np.float64)
            out[s, m] = rng.choice(
                n_transitions, n_transitions, p=per_transition / per_transition.sum()
            )
    return jnp.asarray(out, jnp.int32)


def make_fit_chunk(
    dynamics: Dynamics, batch_size: int, n_updates: int, window_steps: int = 1
) -> Callable[..., tuple[EnsembleTrainState, dict[str, jax.Array]]]:
    """``chunk(state, stats, train, bootstrap, holdout) -> (state, metrics)``: ``n_updates``
    Adam steps (on ``batch_size`` transitions, or as many windows of ``window_steps``
    consecutive steps from them: :func:`window_batch`) of every member of every seed (one
    ``vmap`` over members and seeds inside one ``lax.scan``), then every member scored on
    the ``holdout`` batch; a member that scores better than before keeps these parameters
    as its best. Metrics are ``[S, M]``: the chunk's mean training loss and the held-out
    MSE and NLL. Pure; jit it."""
    optimizer = _optimizer(dynamics)

    def member_update(networks, opt_state, key, indices, stats, train):
        position = jax.random.randint(key, (batch_size,), 0, indices.shape[0])
        first = indices[position]
        if window_steps > 1:
            batch, valid = window_batch(train, dynamics, first, window_steps)
            objective = functools.partial(
                dynamics.window_loss, params=stats, batch=batch, valid=valid
            )
        else:
            objective = functools.partial(
                dynamics.loss, params=stats, batch=model_batch(train, dynamics, first)
            )
        networks, opt_state, loss, _ = apply_gradients(objective, networks, optimizer, opt_state)
        return networks, opt_state, loss

    update = jax.vmap(
        jax.vmap(member_update, in_axes=(0, 0, 0, 0, None, None)),
        in_axes=(0, 0, 0, 0, None, None),
    )

    def member_score(networks, stats, holdout):
        if window_steps > 1:
            _, metrics = dynamics.window_loss(networks, stats, *holdout)
        else:
            _, metrics = dynamics.loss(networks, stats, holdout)
        return metrics["mse"], metrics["nll"]

    score = jax.vmap(jax.vmap(member_score, in_axes=(0, None, None)), in_axes=(0, None, None))

    def chunk(
        state: EnsembleTrainState,
        stats: DynamicsParams,
        train: Dataset,
        bootstrap: jax.Array,
        holdout: ModelBatch,
    ):
        def body(carry, _):
            networks, opt_state, key = carry
            pairs = jax.vmap(jax.vmap(jax.random.split))(key)
            networks, opt_state, loss = update(
                networks, opt_state, pairs[:, :, 1], bootstrap, stats, train
            )
            return (networks, opt_state, pairs[:, :, 0]), loss

        (networks, opt_state, key), losses = jax.lax.scan(
            body, (state.networks, state.opt_state, state.key), None, length=n_updates
        )
        mse, nll = score(networks, stats, holdout)
        better = mse < state.best_score

        def keep(new, old):
            mask = better.reshape(better.shape + (1,) * (new.ndim - 2))
            return jnp.where(mask, new, old)

        state = EnsembleTrainState(
            networks=networks,
            opt_state=opt_state,
            best_networks=jax.tree.map(keep, networks, state.best_networks),
            best_score=jnp.where(better, mse, state.best_score),
            key=key,
            updates=state.updates + n_updates,
        )
        return state, {"loss": jnp.mean(losses, axis=0), "holdout_mse": mse, "holdout_nll": nll}

    return chunk


def holdout_batch(
    dataset: Dataset, dynamics: Dynamics, rows: int = HOLDOUT_ROWS, window_steps: int = 1
) -> Any:
    """Every held-out transition, or ``rows`` of them evenly spaced, as one batch; with
    ``window_steps`` > 1 the windows that start there (``(batch, valid)``, about ``rows``
    steps in all), scored as they are trained."""
    n = dataset.n_transitions
    count = min(n, max(rows // window_steps, 1))
    indices = jnp.asarray(np.linspace(0, n - 1, count).round().astype(np.int32))
    if window_steps > 1:
        return jax.jit(lambda d, i: window_batch(d, dynamics, i, window_steps))(dataset, indices)
    return jax.jit(lambda d, i: model_batch(d, dynamics, i))(dataset, indices)


def fit_ensemble(
    dynamics: Dynamics,
    stats: DynamicsParams,
    train: Dataset,
    holdout: Dataset,
    *,
    schedule: Schedule | None = None,
    seeds: Sequence[int] = (0,),
    patience: int = 5,
    window_steps: int = 1,
    callback: Callable[[int, dict[str, Any]], None] | None = None,
) -> FitResult:
    """Trains every member of every seed on ``train`` (actions in [-1, 1]) until no
    member's held-out error on ``holdout`` improved by more than 1 % for ``patience``
    chunks, or the schedule's ``n_updates`` per member (default: 20,000 in chunks of 500,
    batches of 256; every chunk is run whole). With ``window_steps`` > 1 every batch
    entry is a window of that many consecutive steps the member rolls forward on its own
    predictions (``Dynamics.window_loss``), and each member's best parameters and the
    elites are those of the lowest error over held-out windows of as many steps.

    Returns:
        The final state (each member's best parameters in ``best_networks``), one history
        entry per chunk (updates, seconds, metrics per seed and member), whether it
        stopped early and the seconds it took.
    """
    schedule = schedule or Schedule(n_updates=20_000, chunk_updates=500)
    check_positive_ints(patience=patience, window_steps=window_steps)
    max_updates, chunk_updates = schedule.n_updates, schedule.chunk_updates
    if not seeds:
        raise ValueError("seeds: expected at least one seed")
    started = time.perf_counter()
    state = init_ensemble(dynamics, seeds)
    bootstrap = bootstrap_indices(
        np.asarray(train.episode_id), len(seeds), dynamics.config.n_members, int(seeds[0])
    )
    held = holdout_batch(holdout, dynamics, window_steps=window_steps)
    program = make_fit_chunk(dynamics, schedule.batch_size, chunk_updates, window_steps)
    chunk = jax.jit(program, donate_argnums=0)
    state = donatable(state)
    history: list[dict[str, Any]] = []
    best = np.full((len(seeds), dynamics.config.n_members), np.inf)
    stale = 0
    stopped_early = False
    done = 0
    while done < max_updates:
        chunk_started = time.perf_counter()
        state, metrics = chunk(state, stats, train, bootstrap, held)
        metrics = jax.device_get(metrics)
        done += chunk_updates
        score = np.asarray(metrics["holdout_mse"], np.float64)
        improved = score < best * (1.0 - IMPROVEMENT)
        best = np.minimum(best, score)
        stale = 0 if improved.any() else stale + 1
        history.append(
            {
                "updates": done,
                "seconds": time.perf_counter() - chunk_started,
                "metrics": {key: np.asarray(value).tolist() for key, value in metrics.items()},
            }
        )
        if callback is not None:
            callback(done, metrics)
        if stale >= patience:
            stopped_early = True
            break
    return FitResult(
        state=state,
        history=history,
        stopped_early=stopped_early,
        seconds=time.perf_counter() - started,
    )


def select_elites(
    state: EnsembleTrainState, stats: DynamicsParams, n_elites: int
) -> tuple[DynamicsParams, np.ndarray]:
    """Each seed's ``n_elites`` members of lowest held-out error: parameters with leading
    ``[S, n_elites]`` member axes on the networks (statistics shared), and the chosen
    member indices ``[S, n_elites]``."""
    scores = np.asarray(jax.device_get(state.best_score))
    elites = np.argsort(scores, axis=1, kind="stable")[:, :n_elites]
    seeds = np.arange(elites.shape[0])[:, None]
    networks = jax.tree.map(  # on the host: no program per leaf shape
        lambda leaf: jnp.asarray(np.asarray(leaf)[seeds, elites]),
        jax.device_get(state.best_networks),
    )
    return stats.replace(networks=networks), elites
