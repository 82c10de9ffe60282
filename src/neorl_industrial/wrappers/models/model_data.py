"""What a plant model takes from its data before fitting: its settings, the data's
fingerprint, the split into training and held-out episodes, the channels it computes from
their definitions instead of learning them, and the card's records of the layout and the
fit."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from neorl_industrial.core.environments import Task
from neorl_industrial.core.models import DynamicsLayout, KnownSignal, KnownSignals, match_row
from neorl_industrial.core.models.signals import ROWS, compile_expression, computable_rows
from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.wrappers.models.model_files import PlantModelError

#: Held-out transitions below which fidelity and early stopping mean nothing.
MIN_HOLDOUT_TRANSITIONS = 20
#: Training transitions below which a model is not fitted.
MIN_TRAIN_TRANSITIONS = 50


@dataclasses.dataclass(frozen=True)
class FitSettings:
    """How a model is fitted and its fidelity measured.

    Attributes:
        seeds: one ensemble per seed, all fitted at once (the first is the one used).
        max_updates: Adam steps per member at most.
        chunk_updates: steps fused into one compiled call (held-out scoring between).
        batch_size: transitions per step and member.
        patience: chunks without a 1 % held-out improvement of any member before stopping.
        holdout: share of the episodes held out (whole episodes).
        split_seed: the shuffle of the episodes before the split.
        horizon: steps of the open-loop fidelity windows (at most the longest held-out
            episode); the errors are reported at 1, 10 and this many steps.
        windows: held-out windows the fidelity is measured on, at most.
        samples: sampled trajectories per member for the interval.
        window_steps: steps per training window: 1 fits each member one step ahead of
            the logged observation; more rolls it that many steps forward on its own
            predictions and scores every step against the log (a multi-step loss: what
            the errors grow into over a rollout is trained, not only the next step).
            Longer rollouts (the verdict's) then drift less from the log; each update
            costs about that many times as much. Features nothing in the log predicts
            (a setpoint schedule, a measured disturbance) can get worse: check the
            verdict's calibration check either way.
    """

    seeds: tuple[int, ...] = (0,)
    max_updates: int = 10_000
    chunk_updates: int = 500
    batch_size: int = 256
    patience: int = 4
    holdout: float = 0.2
    split_seed: int = 0
    horizon: int = 100
    windows: int = 128
    samples: int = 8
    window_steps: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "seeds", tuple(int(seed) for seed in self.seeds))
        if not self.seeds:
            raise PlantModelError("seeds: expected at least one seed")
        for name in (
            "max_updates",
            "chunk_updates",
            "batch_size",
            "patience",
            "horizon",
            "windows",
            "samples",
            "window_steps",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlantModelError(f"{name}: expected a positive integer, got {value!r}")
        if not 0.0 < self.holdout < 1.0:
            raise PlantModelError(f"holdout: expected a share in (0, 1), got {self.holdout}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"seeds": list(self.seeds)}


def dataset_fingerprint(dataset: Dataset) -> str:
    """``sha256:<hex>`` of a dataset's stored arrays (observations as stored, actions,
    rewards, costs, flags, episode lengths; dtype and shape of each): equal for the same
    data however it was loaded, different when any value differs."""
    digest = hashlib.sha256()
    digest.update(f"frame_stack={dataset.frame_stack};".encode())
    for name, array in sorted(dataset.stored_arrays().items()):
        array = np.ascontiguousarray(array)
        digest.update(f"{name}:{array.dtype.str}:{array.shape};".encode())
        digest.update(array.tobytes())
    return f"sha256:{digest.hexdigest()}"


def split_episodes(
    dataset: Dataset, holdout: float, split_seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Episode ids ``(train, holdout)``, or a refusal with the numbers."""
    episodes = dataset.n_episodes
    lengths = np.asarray(jax.device_get(dataset.episode_lengths))
    n_holdout = round(episodes * holdout)
    advice = (
        "log more episodes (an 'episode' column or time gaps split a log), or change "
        "the held-out share"
    )
    if n_holdout < 1 or n_holdout >= episodes:
        raise PlantModelError(
            f"dataset: {dataset.n_transitions} transitions in {episodes} episode(s); a "
            f"held-out share of {holdout} leaves {n_holdout} episode(s) held out "
            f"and {episodes - n_holdout} to train on, and both need at least one; {advice}"
        )
    order = np.random.default_rng(split_seed).permutation(episodes)
    holdout, train = np.sort(order[:n_holdout]), np.sort(order[n_holdout:])
    held, trained = int(lengths[holdout].sum()), int(lengths[train].sum())
    if held < MIN_HOLDOUT_TRANSITIONS or trained < MIN_TRAIN_TRANSITIONS:
        raise PlantModelError(
            f"dataset: {dataset.n_transitions} transitions in {episodes} episodes; the "
            f"split holds out {held} transitions ({n_holdout} episodes) and trains on "
            f"{trained}, a model needs at least {MIN_HOLDOUT_TRANSITIONS} held out and "
            f"{MIN_TRAIN_TRANSITIONS} to train on; {advice}"
        )
    return train, holdout


def known_signals(
    task: Task,
    definitions: Mapping[str, str],
    reward_row: str | None,
    dataset: Dataset,
) -> tuple[KnownSignals, dict[str, str]]:
    """The channels computed from their ``definitions`` (expressions of the task's
    observations and actions that reproduce the logged values on ``reward_row``, or any
    row), and for every channel how the model obtains it (the card's ``signals``).

    A cost the ``definitions`` do not define is tried with the task's own definition of it
    (a constraint's threshold, ``level < 0.05``) when that is an expression: the data
    decides, as for any definition, whether it is the channel that was logged."""
    names = KnownSignals(
        observation_names=tuple(task.observation_names),
        action_names=tuple(task.action_names),
    )
    definitions = dict(definitions) | {
        name: source
        for name, source in task.cost_definitions.items()
        if name not in definitions and _is_expression(source)
    }
    if not definitions:  # nothing to check against the data (no copy of it made)
        how = {channel: "learned (no definition)" for channel in ("reward", *task.cost_names)}
        return names, how
    flat = dataset.to_flat()
    actions = np.asarray(flat["actions"], np.float64).reshape(dataset.n_transitions, -1)
    columns = {"reward": (None, flat["rewards"])}
    for index, name in enumerate(task.cost_names):
        columns[name] = (index, flat["costs"][:, index])
    rows = ROWS if reward_row is None else (reward_row,)
    known, how = [], {}
    # A channel that never changed in the data (a limit never crossed) is reproduced on
    # either row: it is matched last, first on the row most of the others were found on.
    constant = {channel for channel, (_, logged) in columns.items() if np.ptp(logged) == 0}
    for channel in sorted(columns, key=lambda channel: channel in constant):
        index, logged = columns[channel]
        if channel in constant:
            found = [signal.row for signal in known]
            rows = tuple(sorted(rows, key=lambda row: -found.count(row)))
        source = definitions.get(channel)
        if source is None:
            how[channel] = "learned (no definition)"
            continue
        possible = computable_rows(source, task.observation_names, task.action_names)
        if not any(row in possible for row in rows):
            how[channel] = f"learned: {source} reads columns the model does not predict" + (
                " (actions of the next row)" if possible else ""
            )
            continue
        row = match_row(
            source,
            logged,
            flat["observations"],
            actions,
            flat["next_observations"],
            task.observation_names,
            task.action_names,
            rows,
        )
        if row is None:
            how[channel] = f"learned: {source} does not reproduce the logged values"
            continue
        known.append(KnownSignal(channel=channel, index=index, source=source, row=row))
        how[channel] = f"computed: {source} (on the {row} row)"
    position = {channel: i for i, channel in enumerate(columns)}
    known.sort(key=lambda signal: position[signal.channel])
    how = {channel: how[channel] for channel in columns}
    return dataclasses.replace(names, signals=tuple(known)), how


def _is_expression(source: str) -> bool:
    """Whether ``source`` is written in the expression language (a task may define a
    channel in a sentence, for people)."""
    try:
        compile_expression(source, np)
    except ValueError:
        return False
    return True


def given_features(task: Task, frame_size: int) -> tuple[int, ...]:
    """Positions in the newest frame of the task's exogenous features (what a rollout
    from a logged start may take from the log).

    Raises:
        PlantModelError: for an exogenous feature that is not in the newest frame.
    """
    frame = list(task.observation_names[:frame_size])
    outside = [name for name in task.exogenous if name not in frame]
    if outside:
        raise PlantModelError(
            f"task {task.name!r}: exogenous features {outside} are not in the newest "
            f"frame of {frame_size} features ({', '.join(frame[:6])}...)"
        )
    return tuple(sorted(frame.index(name) for name in task.exogenous))


def layout_record(layout: DynamicsLayout) -> dict[str, Any]:
    """The card's ``layout``."""
    return {
        "observation_size": layout.observation_size,
        "frame_size": layout.frame_size,
        "frame_stack": layout.frame_stack,
        "action_size": layout.action_size,
        "n_costs": layout.n_costs,
        "terminals": layout.terminals,
        "known": layout.known.to_dict(),
        "given": list(layout.given),
    }


def fit_record(result: Any, elites: np.ndarray, scores: np.ndarray) -> dict[str, Any]:
    """The card's ``fit``: time, updates, early stop, elites, held-out errors and the
    history per chunk (means over members)."""
    return {
        "seconds": result.seconds,
        "updates": int(result.history[-1]["updates"]),
        "stopped_early": result.stopped_early,
        "elites": elites.tolist(),
        "holdout_mse": scores.tolist(),
        "history": [
            {"updates": entry["updates"], "seconds": entry["seconds"]}
            | {key: np.mean(value, axis=-1).tolist() for key, value in entry["metrics"].items()}
            for entry in result.history
        ],
    }
