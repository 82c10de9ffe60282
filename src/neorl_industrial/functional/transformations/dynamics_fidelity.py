"""How well a fitted dynamics ensemble predicts, measured open loop on held-out episodes:
from a window's first observation the model is driven by the logged actions, and its
predictions at step 1, 10 and ``H`` are compared with the log, per feature in the plant's
units (and relative to the feature's spread), with the share of logged values inside the
ensemble's 90 % interval. The features the model's layout marks ``given`` (no action moves
them) are taken from the log step by step, as a verdict takes them, and are not scored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from neorl_industrial.core.models.dynamics import Dynamics, DynamicsParams
from neorl_industrial.functional.state_management.dataset import Dataset
from neorl_industrial.functional.transformations.dynamics import MIN_STD

__all__ = ["OpenLoop", "coverage", "fidelity_table", "open_loop", "open_loop_windows"]


class OpenLoop(NamedTuple):
    """Logged windows and the model's open-loop predictions of them (host arrays).

    Shapes: ``W`` windows, ``H`` steps, ``P`` particles (members × samples), ``F``
    features of the newest frame, ``C`` channels (reward, then costs). A window that
    reaches its episode's end before ``H`` steps is ``valid`` only up to that end.
    """

    truth: np.ndarray  # [W, H, F]: the logged newest frame after each step
    point: np.ndarray  # [W, H, F]: mean over members of their mean trajectories
    particles: np.ndarray  # [W, P, H, F]: sampled trajectories of every member
    signal_truth: np.ndarray  # [W, H, C]
    signal_point: np.ndarray  # [W, H, C]
    signal_particles: np.ndarray  # [W, P, H, C]
    valid: np.ndarray  # [W, H] bool: the step lies inside the window's episode
    starts: np.ndarray  # [W]: transition index of each window's first step


def open_loop_windows(dataset: Dataset, horizon: int, n_windows: int) -> np.ndarray:
    """Up to ``n_windows`` transition indices where open-loop windows start: half of them
    evenly spread over the transitions where ``horizon`` steps fit inside the episode,
    the others evenly spread over all transitions (their windows end with the episode),
    so short and long horizons are both measured from states all over the data."""
    steps_to_end = np.asarray(jax.device_get(dataset.steps_to_end))
    full = np.flatnonzero(steps_to_end >= horizon)

    def spread(candidates: np.ndarray, count: int) -> np.ndarray:
        if len(candidates) <= count:
            return candidates
        return candidates[np.linspace(0, len(candidates) - 1, count).round().astype(np.int64)]

    half = n_windows // 2 if len(full) else 0
    anywhere = spread(np.arange(dataset.n_transitions), n_windows - half)
    return np.unique(np.concatenate([spread(full, half), anywhere]))


class _Windows(NamedTuple):
    first: jax.Array  # [W, obs_size]
    actions: jax.Array  # [W, H, action_size]
    frames: jax.Array  # [W, H, F]: the newest frame after each step
    signals: jax.Array  # [W, H, 1 + n_costs]
    valid: jax.Array  # [W, H]


def _gather_windows(dataset: Dataset, starts: jax.Array, horizon: int) -> _Windows:
    """Windows of ``horizon`` steps from ``starts``, steps past the episode's end held at
    its last transition (and marked invalid)."""
    last = starts + dataset.steps_to_end[starts] - 1
    wanted = starts[:, None] + jnp.arange(horizon)
    steps = jnp.minimum(wanted, last[:, None])
    actions = dataset.actions[steps]
    return _Windows(
        first=dataset.observations_at(dataset.observation_index[starts]),
        actions=actions.reshape(*steps.shape, -1),
        frames=dataset.observations[dataset.observation_index[steps] + 1],
        signals=jnp.concatenate([dataset.rewards[steps][..., None], dataset.costs[steps]], -1),
        valid=wanted <= last[:, None],
    )


def open_loop(
    dynamics: Dynamics,
    params: DynamicsParams,
    dataset: Dataset,
    starts: np.ndarray,
    horizon: int,
    key: jax.Array,
    n_samples: int = 8,
) -> OpenLoop:
    """The model driven by the logged actions of the windows at ``starts`` (``dataset``'s
    actions in [-1, 1]; ``params`` with one member axis): every member's mean trajectory
    (their average is the point prediction) and ``n_samples`` sampled trajectories per
    member, as one compiled program (the layout's given features from the log)."""
    members = params.n_members
    frame = dynamics.layout.frame_size
    takes_log = bool(dynamics.layout.given)

    def trajectory(observation, actions, logged, key, member, deterministic):
        def body(observation, inputs):
            action, given, key = inputs
            next_observation, reward, costs, _ = dynamics.transition(
                params, observation, action, key, member, deterministic,
                given if takes_log else None,
            )  # fmt: skip
            signals = jnp.concatenate([reward[None], costs])
            return next_observation, (next_observation[:frame], signals)

        keys = jax.random.split(key, actions.shape[0])
        _, (frames, signals) = jax.lax.scan(body, observation, (actions, logged, keys))
        return frames, signals

    @jax.jit
    def run(dataset, starts, key):
        windows = _gather_windows(dataset, starts, horizon)
        member_ids = jnp.arange(members)
        mean_run = jax.vmap(  # windows × members, deterministic
            jax.vmap(
                lambda o, a, g, m: trajectory(o, a, g, key, m, True), in_axes=(None, None, None, 0)
            ),
            in_axes=(0, 0, 0, None),
        )(windows.first, windows.actions, windows.frames, member_ids)
        particle_members = jnp.repeat(member_ids, n_samples)
        n_windows, n_particles = starts.shape[0], particle_members.shape[0]
        particle_keys = jax.random.split(key, n_windows * n_particles)
        particle_keys = particle_keys.reshape(n_windows, n_particles, -1)
        sampled = jax.vmap(
            jax.vmap(
                lambda o, a, g, k, m: trajectory(o, a, g, k, m, False),
                in_axes=(None, None, None, 0, 0),
            ),
            in_axes=(0, 0, 0, 0, None),
        )(windows.first, windows.actions, windows.frames, particle_keys, particle_members)
        return windows, mean_run, sampled

    windows, (mean_frames, mean_signals), (frames, signals) = jax.device_get(
        run(dataset, jnp.asarray(starts, jnp.int32), key)
    )

    def host(x: Any) -> np.ndarray:
        return np.asarray(x, np.float64)

    return OpenLoop(
        truth=host(windows.frames),
        point=host(mean_frames).mean(axis=1),
        particles=host(frames),
        signal_truth=host(windows.signals),
        signal_point=host(mean_signals).mean(axis=1),
        signal_particles=host(signals),
        valid=np.asarray(windows.valid, bool),
        starts=np.asarray(starts),
    )


def coverage(
    samples: Any, truth: Any, level: float = 0.9, axis: int = 0, tolerance: Any = 0.0
) -> Any:
    """Whether each ``truth`` value lies inside the central ``level`` interval of
    ``samples`` along ``axis`` (its empirical quantiles ``(1 - level) / 2`` and
    ``(1 + level) / 2``) widened by ``tolerance`` on each side, as booleans of
    ``truth``'s shape; the mean is the share inside. numpy or jax arrays alike. A value
    computed exactly has an interval of zero width, which its logged value (rounded
    differently) meets only within a tolerance.

    Raises:
        ValueError: for a level outside (0, 1).
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level: expected a share in (0, 1), got {level}")
    xp = jnp if isinstance(samples, jax.Array) else np
    lower = xp.quantile(samples, (1.0 - level) / 2.0, axis=axis)
    upper = xp.quantile(samples, (1.0 + level) / 2.0, axis=axis)
    return (truth >= lower - tolerance) & (truth <= upper + tolerance)


def fidelity_table(
    run: OpenLoop,
    feature_names: Sequence[str],
    feature_spread: Sequence[float],
    signal_names: Sequence[str],
    signal_spread: Sequence[float],
    steps: Sequence[int],
    level: float = 0.9,
    given: Sequence[bool] | None = None,
) -> list[dict[str, Any]]:
    """One row per feature (then per reward and cost channel) and step of ``steps``,
    over the windows that reach that step inside their episode (``windows``): RMSE and
    MAE of the point prediction in the plant's units, RMSE relative to the feature's
    spread over the data (``None`` for a constant feature), and the share of logged
    values inside the ensemble's ``level`` interval (errors are ``None`` where no
    window reaches the step). A feature ``given`` (taken from the log, not predicted)
    has ``"given": True`` and no errors."""
    given = [False] * len(feature_names) if given is None else [bool(g) for g in given]
    rows = []
    for kind, names, spreads, truth, point, particles in (
        ("observation", feature_names, feature_spread, run.truth, run.point, run.particles),
        (
            "signal",
            signal_names,
            signal_spread,
            run.signal_truth,
            run.signal_point,
            run.signal_particles,
        ),
    ):
        # The tolerance a computed channel is held to against its logged values
        # (``signals.match_row``): a zero-width interval of an exact value is inside.
        largest = np.max(np.abs(np.nan_to_num(truth)), axis=(0, 1), initial=0.0)
        tolerance = 1e-4 * np.maximum(1.0, largest)
        inside = coverage(particles, truth, level, axis=1, tolerance=tolerance)  # [W, H, F]
        for i, name in enumerate(names):
            spread = float(spreads[i])
            for step in steps:
                if kind == "observation" and given[i]:
                    rows.append(
                        {"kind": kind, "name": str(name), "step": int(step), "given": True,
                         "windows": int(run.valid[:, step - 1].sum()), "rmse": None,
                         "mae": None, "relative_rmse": None, "coverage": None}
                    )  # fmt: skip
                    continue
                valid = run.valid[:, step - 1]
                error = point[valid, step - 1, i] - truth[valid, step - 1, i]
                rmse = float(np.sqrt(np.mean(np.square(error)))) if valid.any() else None
                rows.append(
                    {
                        "kind": kind,
                        "name": str(name),
                        "step": int(step),
                        "windows": int(valid.sum()),
                        "rmse": rmse,
                        "mae": float(np.mean(np.abs(error))) if valid.any() else None,
                        "relative_rmse": (
                            rmse / spread if rmse is not None and spread > MIN_STD else None
                        ),
                        "coverage": (
                            float(np.mean(inside[valid, step - 1, i])) if valid.any() else None
                        ),
                    }
                )
    return rows
