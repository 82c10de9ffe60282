"""``PlantModel``: a learned model of a plant from its logs, for people.

    model = PlantModel(task, definitions=card.definitions)      # reward/cost expressions
    report = model.fit(dataset, dataset_name=card.name)          # ensemble, elites, fidelity
    model.fidelity_rows                                          # plant units, held out
    prediction = model.predict(observations, actions)            # actions in plant units
    rollout = model.rollout(first_observations, actions)         # open loop, plant units
    model.save("models/boiler-3"); PlantModel.load("models/boiler-3", dataset=dataset)

The model is an ensemble of probabilistic dynamics networks (``core.models``) fitted as one
compiled program over members and seeds (``functional.transformations.dynamics``) on the
episodes not held out; the held-out episodes choose each member's best parameters, each
seed's elites, and measure fidelity open loop. Actions reach the networks in the policy's
[-1, 1] through the task's action scaler; channels the schema defines as expressions of
observations and actions (and that reproduce the logged values) are computed, not learned.

For model-based evaluation and learning, :attr:`PlantModel.dynamics` and
:meth:`PlantModel.params` give the pure step: ``dynamics.step(params, observation,
action_in_unit_box, key) -> StepOutput`` (jit, vmap over starts, members and policies).

A saved model carries a card (``model.json``: the task, the dataset's name and
fingerprint, the held-out episodes, settings, fidelity table, what is computed and what
learned) beside its parameters and a plot of predicted against logged trajectories. It
is refused by name when loaded against another task or another dataset.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

import neorl_industrial
from neorl_industrial.core.environments import Task, TaskError
from neorl_industrial.core.models import (
    Dynamics,
    DynamicsConfig,
    DynamicsLayout,
    DynamicsParams,
    KnownSignal,
    KnownSignals,
    make_dynamics,
    match_row,
    out_of_distribution,
)
from neorl_industrial.core.models.signals import ROWS, computable_rows
from neorl_industrial.functional.state_management import ActionScaler, Dataset
from neorl_industrial.functional.transformations.dynamics import (
    OpenLoop,
    data_statistics,
    fidelity_table,
    fit_ensemble,
    open_loop,
    open_loop_windows,
    select_elites,
)
from neorl_industrial.wrappers.hostio import (
    remove_stale_staging,
    to_json_data,
    write_directory_atomic,
)
from neorl_industrial.wrappers.models.outside_data import (
    OutsideDataWarning,
    OutsideFeature,
    outside_features,
    outside_message,
)

__all__ = [
    "FitSettings",
    "OutsideDataWarning",
    "PlantModel",
    "PlantModelError",
    "dataset_fingerprint",
]

FORMAT = "neorl-industrial-plant-model/1"
CARD = "model.json"
PARAMS = "params.msgpack"
PLOT = "trajectories.png"
#: Held-out transitions below which fidelity and early stopping mean nothing.
MIN_HOLDOUT_TRANSITIONS = 20
#: Training transitions below which a model is not fitted.
MIN_TRAIN_TRANSITIONS = 50
#: The 90 % interval of the calibration check.
LEVEL = 0.9


class PlantModelError(ValueError):
    """A plant model that cannot be fitted, loaded or used as asked: names what and why."""


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


def _scaler(task: Task) -> ActionScaler | None:
    if ActionScaler.is_identity(task.action_low, task.action_high):
        return None
    return ActionScaler.create(task.action_low, task.action_high, task.action_names)


class PlantModel:
    """An ensemble model of the plant ``task`` describes (see the module docstring).

    Args:
        task: the process: names, units and action bounds.
        config: the ensemble's hyperparameters.
        definitions: reward and cost definitions by channel (``reward`` and each cost
            name), as a plant's schema or dataset card gives them; a definition that is
            an expression of observations (and actions) is computed when it reproduces
            the data's channel, otherwise the channel is learned.
        reward_row: the schema's ``reward_row`` (``current`` or ``next``) when known;
            None tries both on the data.

    Raises:
        PlantModelError: for a discrete task, or a definition outside the expression
            grammar (naming the channel).
    """

    def __init__(
        self,
        task: Task,
        config: DynamicsConfig | None = None,
        *,
        definitions: Mapping[str, str] | None = None,
        reward_row: str | None = None,
    ):
        if task.discrete:
            raise PlantModelError(
                f"task {task.name!r}: discrete actions; a plant model needs continuous ones"
            )
        if reward_row is not None and reward_row not in ROWS:
            raise PlantModelError(f"reward_row: expected one of {list(ROWS)}, got {reward_row!r}")
        self.task = task
        self.config = config or DynamicsConfig()
        self.definitions = dict(definitions or {})
        unknown = sorted(set(self.definitions) - {"reward", *task.cost_names})
        if unknown:
            raise PlantModelError(
                f"definitions: {unknown} are neither 'reward' nor a cost of {task.name!r} "
                f"({list(task.cost_names)})"
            )
        for channel, source in self.definitions.items():
            try:
                computable_rows(str(source), task.observation_names, task.action_names)
            except ValueError as error:
                raise PlantModelError(f"definitions.{channel}: {error}") from None
        self.reward_row = reward_row
        self.scaler = _scaler(task)
        self.dynamics: Dynamics | None = None
        self._params: DynamicsParams | None = None  # networks [S, E, ...]
        self.card: dict[str, Any] = {}
        self._open_loop: OpenLoop | None = None
        self._programs: dict[tuple, Any] = {}

    # ----- state ------------------------------------------------------------------------
    @property
    def fitted(self) -> bool:
        return self._params is not None

    def _require_fitted(self, what: str) -> None:
        if not self.fitted:
            raise PlantModelError(f"{what}: the model is not fitted; call fit(dataset) first")

    def params(self, seed: int = 0) -> DynamicsParams:
        """The step's parameters of the ensemble of seed number ``seed`` (its position in
        the fit's seeds): the elites' networks with a leading member axis."""
        self._require_fitted("params")
        count = jax.tree.leaves(self._params.networks)[0].shape[0]
        if not 0 <= seed < count:
            raise PlantModelError(f"seed: expected 0..{count - 1}, got {seed}")
        return self._params.replace(
            networks=jax.tree.map(lambda leaf: leaf[seed], self._params.networks)
        )

    @property
    def fidelity_rows(self) -> list[dict[str, Any]]:
        """The fidelity table of the held-out episodes: one row per feature or channel
        and step (``functional.transformations.dynamics.fidelity_table``)."""
        return list(self.card.get("fidelity", {}).get("rows", []))

    # ----- data -------------------------------------------------------------------------
    def check_dataset(self, dataset: Dataset, *, name: str = "dataset") -> None:
        """Raises :class:`PlantModelError` when ``dataset`` does not fit the model's task
        (shapes and cost channels), naming the difference."""
        try:
            self.task.check_dataset(dataset, source=name)
        except TaskError as error:
            raise PlantModelError(str(error)) from None

    def check_task(self, task: Task, *, name: str = "dataset") -> None:
        """Raises :class:`PlantModelError` unless ``task`` is the model's task, by name and
        by its observations and actions."""
        mine = (self.task.name, self.task.observation_names, self.task.action_names)
        if (task.name, task.observation_names, task.action_names) != mine:
            raise PlantModelError(
                f"{name}: task {task.name!r} ({', '.join(task.observation_names[:4])}, ...) "
                f"is not the model's task {self.task.name!r} "
                f"({', '.join(self.task.observation_names[:4])}, ...); fit a model on it"
            )

    def check_same_data(
        self, dataset: Dataset, *, name: str = "dataset", task: Task | None = None
    ) -> None:
        """Raises :class:`PlantModelError` unless ``dataset`` (and ``task``, when given) is
        the one the model was fitted on: the task by name and features, the data by
        fingerprint."""
        self._require_fitted("check_same_data")
        if task is not None:
            self.check_task(task, name=name)
        self.check_dataset(dataset, name=name)
        recorded = self.card["dataset"]
        fingerprint = dataset_fingerprint(dataset)
        if fingerprint != recorded["fingerprint"]:
            raise PlantModelError(
                f"{name}: fingerprint {fingerprint[:19]}... is not that of "
                f"{recorded['name']!r} ({recorded['fingerprint'][:19]}..., "
                f"{recorded['n_transitions']} transitions in {recorded['n_episodes']} "
                f"episodes) that the model was fitted on; fit a model on this dataset"
            )

    def _split(self, dataset: Dataset, settings: FitSettings) -> tuple[np.ndarray, np.ndarray]:
        """Episode ids ``(train, holdout)``, or a refusal with the numbers."""
        episodes = dataset.n_episodes
        lengths = np.asarray(jax.device_get(dataset.episode_lengths))
        n_holdout = round(episodes * settings.holdout)
        advice = (
            "log more episodes (an 'episode' column or time gaps split a log), or change "
            "the held-out share"
        )
        if n_holdout < 1 or n_holdout >= episodes:
            raise PlantModelError(
                f"dataset: {dataset.n_transitions} transitions in {episodes} episode(s); a "
                f"held-out share of {settings.holdout} leaves {n_holdout} episode(s) held out "
                f"and {episodes - n_holdout} to train on, and both need at least one; {advice}"
            )
        order = np.random.default_rng(settings.split_seed).permutation(episodes)
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

    def _known_signals(self, dataset: Dataset) -> tuple[KnownSignals, dict[str, str]]:
        """The channels computed from their definitions, and for every channel how the
        model obtains it (the card's ``signals``)."""
        names = KnownSignals(
            observation_names=tuple(self.task.observation_names),
            action_names=tuple(self.task.action_names),
        )
        if not self.definitions:  # nothing to check against the data (no copy of it made)
            how = {
                channel: "learned (no definition)" for channel in ("reward", *self.task.cost_names)
            }
            return names, how
        flat = dataset.to_flat()
        actions = np.asarray(flat["actions"], np.float64).reshape(dataset.n_transitions, -1)
        columns = {"reward": (None, flat["rewards"])}
        for index, name in enumerate(self.task.cost_names):
            columns[name] = (index, flat["costs"][:, index])
        rows = ROWS if self.reward_row is None else (self.reward_row,)
        known, how = [], {}
        for channel, (index, logged) in columns.items():
            source = self.definitions.get(channel)
            if source is None:
                how[channel] = "learned (no definition)"
                continue
            possible = computable_rows(source, self.task.observation_names, self.task.action_names)
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
                self.task.observation_names,
                self.task.action_names,
                rows,
            )
            if row is None:
                how[channel] = f"learned: {source} does not reproduce the logged values"
                continue
            known.append(KnownSignal(channel=channel, index=index, source=source, row=row))
            how[channel] = f"computed: {source} (on the {row} row)"
        return dataclasses.replace(names, signals=tuple(known)), how

    def _unit_actions(self, dataset: Dataset) -> Dataset:
        if self.scaler is None:
            return dataset
        return dataset.replace(actions=self.scaler.scale(dataset.actions))

    # ----- fitting ----------------------------------------------------------------------
    def fit(
        self,
        dataset: Dataset,
        settings: FitSettings | None = None,
        *,
        dataset_name: str = "dataset",
        callback: Callable[[int, dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Fits the ensemble on ``dataset`` (actions in plant units) and measures its
        fidelity on the held-out episodes.

        Returns:
            The model's card (also :attr:`card`).

        Raises:
            PlantModelError: for data that does not fit the task, or too little data for
                the held-out split (with the numbers).
        """
        settings = settings or FitSettings()
        self.check_dataset(dataset, name=dataset_name)
        train_ids, holdout_ids = self._split(dataset, settings)
        known, how = self._known_signals(dataset)
        frame_size = dataset.frame_size
        layout = DynamicsLayout(
            observation_size=dataset.observation_size,
            frame_size=frame_size,
            action_size=dataset.action_size,
            n_costs=dataset.n_costs,
            known=known,
            terminals=bool(np.asarray(jax.device_get(dataset.terminals)).any()),
        )
        self.dynamics = make_dynamics(self.config, layout)
        unit = self._unit_actions(dataset)
        train = unit.select_episodes(train_ids)
        holdout = unit.select_episodes(holdout_ids)
        low, high = self.task.action_low, self.task.action_high
        stats = data_statistics(
            train,
            self.dynamics,
            low,
            high,
            self.task.observation_low[:frame_size],
            self.task.observation_high[:frame_size],
        )
        result = fit_ensemble(
            self.dynamics,
            stats,
            train,
            holdout,
            seeds=settings.seeds,
            max_updates=settings.max_updates,
            chunk_updates=settings.chunk_updates,
            batch_size=settings.batch_size,
            patience=settings.patience,
            callback=callback,
        )
        self._params, elites = select_elites(result.state, stats, self.config.n_elites)
        scores = np.asarray(jax.device_get(result.state.best_score))
        self.card = {
            "format": FORMAT,
            "neorl_industrial": neorl_industrial.__version__,
            "jax": jax.__version__,
            "created": datetime.now(UTC).isoformat(),
            "task": self.task.to_dict(),
            "config": self.config.to_dict(),
            "layout": {
                "observation_size": layout.observation_size,
                "frame_size": layout.frame_size,
                "frame_stack": layout.frame_stack,
                "action_size": layout.action_size,
                "n_costs": layout.n_costs,
                "terminals": layout.terminals,
                "known": known.to_dict(),
            },
            "definitions": dict(self.definitions),
            "reward_row": self.reward_row,
            "signals": how,
            "physics": physical_ranges(self.task, stats),
            "settings": settings.to_dict(),
            "dataset": {
                "name": dataset_name,
                "fingerprint": dataset_fingerprint(dataset),
                "n_transitions": dataset.n_transitions,
                "n_episodes": dataset.n_episodes,
                "train_episodes": train_ids.tolist(),
                "holdout_episodes": holdout_ids.tolist(),
                "holdout_transitions": holdout.n_transitions,
            },
            "fit": {
                "seconds": result.seconds,
                "updates": int(result.history[-1]["updates"]),
                "stopped_early": result.stopped_early,
                "elites": elites.tolist(),
                "holdout_mse": scores.tolist(),
                "history": [
                    {"updates": entry["updates"], "seconds": entry["seconds"]}
                    | {
                        key: np.mean(value, axis=-1).tolist()
                        for key, value in entry["metrics"].items()
                    }
                    for entry in result.history
                ],
            },
        }
        self.card["fidelity"] = self.fidelity(dataset, episodes=holdout_ids, checked=True)
        return self.card

    # ----- fidelity ---------------------------------------------------------------------
    def fidelity(
        self,
        dataset: Dataset,
        *,
        episodes: Sequence[int] | None = None,
        seed: int = 0,
        horizon: int | None = None,
        checked: bool = False,
    ) -> dict[str, Any]:
        """Open-loop fidelity on ``episodes`` of ``dataset`` (plant units; by default the
        held-out episodes of the data the model was fitted on, which ``dataset`` must
        then be): errors at 1, 10 and ``horizon`` steps per feature, and the share of
        logged values inside the ensemble's 90 % interval.

        Raises:
            PlantModelError: when no episode is long enough for one window, or (default
                episodes) ``dataset`` is not the fitted one.
        """
        self._require_fitted("fidelity")
        settings = self.card["settings"]
        if episodes is None:
            if not checked:
                self.check_same_data(dataset)
            episodes = self.card["dataset"]["holdout_episodes"]
        else:
            self.check_dataset(dataset)
        held = self._unit_actions(dataset).select_episodes(np.asarray(episodes, np.int64))
        longest = int(np.asarray(jax.device_get(held.episode_lengths)).max())
        horizon = min(int(horizon or settings["horizon"]), longest)
        starts = open_loop_windows(held, horizon, settings["windows"])
        run = open_loop(
            self.dynamics,
            self.params(seed),
            held,
            starts,
            horizon,
            jax.random.PRNGKey(seed),
            n_samples=settings["samples"],
        )
        self._open_loop = run
        steps = sorted({step for step in (1, 10, horizon) if step <= horizon})
        frame = self.dynamics.layout.frame_size
        names = list(self.task.observation_names[:frame])
        spread = dataset.observation_moments()[1][:frame]  # 0 for a constant feature
        signal_names = ["reward", *self.task.cost_names]
        flat_signals = np.concatenate(
            [
                np.asarray(jax.device_get(dataset.rewards))[:, None],
                np.asarray(jax.device_get(dataset.costs)),
            ],
            axis=1,
        )
        rows = fidelity_table(
            run,
            names,
            spread,
            signal_names,
            flat_signals.std(axis=0),
            steps,
            LEVEL,
        )
        units = dict(zip(self.task.observation_names, self.task.observation_units, strict=True))
        for row in rows:
            row["unit"] = units.get(row["name"]) if row["kind"] == "observation" else None
        return {
            "episodes": [int(e) for e in episodes],
            "windows": len(starts),
            "horizon": horizon,
            "steps": steps,
            "level": LEVEL,
            "rows": rows,
        }

    def simulator_fidelity(
        self, *, episodes: int = 16, seed: int = 0, horizon: int | None = None
    ) -> dict[str, Any]:
        """Where the task has a simulator: the same open-loop fidelity against it, on
        episodes of uniformly random actions (states the behaviour data rarely or never
        visited), with the share of their observations outside the data's range.

        Raises:
            PlantModelError: when the task has no simulator.
        """
        from neorl_industrial.core.environments.rollout import rollout, uniform_random_policy

        self._require_fitted("simulator_fidelity")
        try:
            env, params = self.task.make_simulator()
        except TaskError as error:
            raise PlantModelError(str(error)) from None
        steps = int(horizon or self.card["settings"]["horizon"])
        result = jax.jit(
            lambda key: rollout(
                key, env, params, uniform_random_policy(env), episodes, steps, record=True
            )
        )(jax.random.PRNGKey(seed))
        data = Dataset.from_rollout(result.transitions, name=f"{self.task.name} simulator")
        held_out_run = self._open_loop  # the plot stays that of the held-out episodes
        fidelity = self.fidelity(data, episodes=np.arange(data.n_episodes), seed=0)
        self._open_loop = held_out_run
        observations = np.asarray(jax.device_get(data.transition_observations()))
        actions = np.asarray(jax.device_get(data.actions)).reshape(data.n_transitions, -1)
        with warnings.catch_warnings():  # random actions leave the data by design
            warnings.simplefilter("ignore", OutsideDataWarning)
            outside = self.predict(observations, actions)["outside_data"]
        measured = fidelity | {
            "source": f"simulator {self.task.env_id}, uniformly random actions",
            "outside_data_share": float(np.mean(outside)),
        }
        self.card["simulator_fidelity"] = measured
        return measured

    def trajectory_plot(self, *, title: str | None = None) -> bytes:
        """A PNG of the last fidelity run's predicted against logged trajectories."""
        from neorl_industrial.wrappers.models.plots import trajectory_plot

        if self._open_loop is None:
            raise PlantModelError("trajectory_plot: measure fidelity first (fit or fidelity)")
        frame = self.dynamics.layout.frame_size
        return trajectory_plot(
            self._open_loop,
            self.task.observation_names[:frame],
            (self.task.observation_units or (None,) * frame)[:frame],
            ["reward", *self.task.cost_names],
            level=LEVEL,
            title=title if title is not None else f"{self.task.name}: open loop, held out",
        )

    # ----- use --------------------------------------------------------------------------
    def predict(self, observations: Any, actions: Any, *, seed: int = 0) -> dict[str, np.ndarray]:
        """One step ahead of raw ``observations`` ``[..., obs_size]`` under ``actions``
        ``[..., action_size]`` in plant units: the ensemble's mean next observation and
        its standard deviation (members' noise and disagreement) for the newest frame,
        reward, costs, termination probability, the members' disagreement, and how far
        each input lies outside the data (``out_of_distribution``; 0 inside, flagged by
        ``outside_data``).

        Warns:
            OutsideDataWarning: when an observation or action lies outside the range of
                the data the model was fitted on, naming each such feature, its most
                extreme value and the data's bound it passes (plant units).

        Raises:
            PlantModelError: for inputs of the wrong size or not finite.
        """
        self._require_fitted("predict")
        plant_actions = actions
        observations, actions = self._inputs(observations, actions)
        params = self.params(seed)
        program = self._program(("predict",), lambda: _predict_program(self.dynamics))
        result = program(params, observations, actions)
        self._warn_outside("predict", params, observations, actions, plant_actions)
        return {key: np.asarray(value) for key, value in jax.device_get(result).items()}

    def rollout(
        self,
        observations: Any,
        actions: Any,
        *,
        seed: int = 0,
        key: int = 0,
        member: int | None = None,
        deterministic: bool = False,
    ) -> dict[str, np.ndarray]:
        """Open-loop rollouts from raw ``observations`` ``[N, obs_size]`` under
        ``actions`` ``[N, H, action_size]`` in plant units: observations ``[N, H + 1,
        obs_size]``, rewards ``[N, H]``, costs ``[N, H, n_costs]``, done, the members'
        disagreement and the out-of-distribution measure per step. Each step follows a
        member drawn per step (or ``member``), sampled unless ``deterministic``.

        Warns:
            OutsideDataWarning: when a first observation or an action lies outside the
                range of the data the model was fitted on, or the rollout's own
                predicted states leave it, naming each feature, its most extreme value
                and the data's bound it passes (plant units).

        Raises:
            PlantModelError: for inputs of the wrong shape or not finite.
        """
        self._require_fitted("rollout")
        observations = np.asarray(observations, np.float32)
        actions = np.asarray(actions, np.float32)
        if observations.ndim != 2 or actions.ndim != 3 or len(actions) != len(observations):
            raise PlantModelError(
                f"rollout: expected observations [N, {self.task.observation_size}] and actions "
                f"[N, H, {self.task.action_size}], got {observations.shape} and {actions.shape}"
            )
        plant_actions = actions
        observations, unit = self._inputs(observations, actions)
        params = self.params(seed)
        program = self._program(
            ("rollout", member, deterministic),
            lambda: _rollout_program(self.dynamics, member, deterministic),
        )
        result = program(params, observations, unit, jax.random.PRNGKey(key))
        result = {name: np.asarray(value) for name, value in jax.device_get(result).items()}
        reached = result["observations"][:, 1:]
        self._warn_outside("rollout", params, observations, unit, plant_actions, reached)
        return result

    def _program(self, key: tuple, build: Callable[[], Any]) -> Any:
        if key not in self._programs:
            self._programs[key] = build()
        return self._programs[key]

    def outside_data(
        self,
        observations: Any,
        actions: Any,
        *,
        seed: int = 0,
    ) -> list[OutsideFeature]:
        """The observation features and actions (plant units, any leading axes) that lie
        outside the range of the data the model was fitted on: each with its most
        extreme value, the data's bound it passes and how many rows do (empty inside)."""
        self._require_fitted("outside_data")
        plant_actions = actions
        observations, unit = self._inputs(observations, actions)
        return self._outside(self.params(seed), observations, unit, plant_actions)

    def _outside(
        self,
        params: DynamicsParams,
        observations: Any,
        unit_actions: Any,
        plant_actions: Any,
    ) -> list[OutsideFeature]:
        """Observations compared raw and actions in [-1, 1], as ``out_of_distribution``
        compares them (so the two agree), reported in the plant's units."""
        bounds = jax.device_get(
            (
                params.obs_low,
                params.obs_high,
                params.policy_action_low,
                params.policy_action_high,
            )
        )
        obs_low, obs_high, act_low, act_high = (np.asarray(b) for b in bounds)
        task = self.task
        found = outside_features(
            np.asarray(observations),
            obs_low,
            obs_high,
            task.observation_names,
            task.observation_units or (None,) * task.observation_size,
        )
        scaled = self.scaler is not None
        return found + outside_features(
            np.asarray(unit_actions),
            act_low,
            act_high,
            task.action_names,
            task.action_units or (None,) * task.action_size,
            shown=np.asarray(plant_actions, np.float32),
            to_plant=(np.asarray(task.action_low), np.asarray(task.action_high))
            if scaled
            else None,
        )

    def _warn_outside(
        self,
        what: str,
        params: DynamicsParams,
        observations: Any,
        unit_actions: Any,
        plant_actions: Any,
        reached: np.ndarray | None = None,
    ) -> None:
        given = self._outside(params, observations, unit_actions, plant_actions)
        beyond = []
        if reached is not None:  # the newest frame: older frames repeat earlier ones
            frame = self.dynamics.layout.frame_size
            task = self.task
            beyond = outside_features(
                reached[..., :frame],
                np.asarray(jax.device_get(params.obs_low))[:frame],
                np.asarray(jax.device_get(params.obs_high))[:frame],
                task.observation_names[:frame],
                (task.observation_units or (None,) * task.observation_size)[:frame],
                counted="predicted states",
            )
        if not given and not beyond:
            return
        recorded = self.card.get("dataset", {})
        dataset = (
            f"{len(recorded.get('train_episodes', ()))} of the "
            f"{recorded.get('n_episodes', 0)} episodes of {recorded.get('name', 'dataset')!r}"
        )
        message = outside_message(what, dataset, given, beyond)
        warnings.warn(OutsideDataWarning(message, (*given, *beyond)), stacklevel=3)

    def _inputs(self, observations: Any, actions: Any) -> tuple[jax.Array, jax.Array]:
        observations = np.asarray(observations, np.float32)
        actions = np.asarray(actions, np.float32)
        for what, array, size in (
            ("observations", observations, self.task.observation_size),
            ("actions", actions, self.task.action_size),
        ):
            if array.ndim == 0 or array.shape[-1] != size:
                raise PlantModelError(
                    f"{what}: expected {size} values in the last axis, got shape {array.shape}"
                )
            if not np.all(np.isfinite(array)):
                raise PlantModelError(f"{what}: NaN or infinite values")
        # As the scaler maps them, but not clipped: an action outside its plant bounds stays
        # outside [-1, 1], where the out-of-distribution measure sees it.
        low = np.asarray(self.task.action_low, np.float32)
        high = np.asarray(self.task.action_high, np.float32)
        unit = actions if self.scaler is None else 2.0 * (actions - low) / (high - low) - 1.0
        return jnp.asarray(observations), jnp.asarray(unit, jnp.float32)

    # ----- files ------------------------------------------------------------------------
    def save(self, path: str | Path, *, overwrite: bool = False, plots: bool = True) -> Path:
        """Writes the model to the directory ``path`` atomically: ``model.json`` (the
        card), ``params.msgpack`` and, with ``plots``, ``trajectories.png``.

        Raises:
            PlantModelError: before fitting, or when ``path`` exists and ``overwrite`` is
                False.
        """
        self._require_fitted("save")
        card = json.dumps(to_json_data(self.card), indent=2, allow_nan=False)
        files = {
            CARD: card.encode(),
            PARAMS: serialization.to_bytes(jax.device_get(self._params)),
        }
        if plots and self._open_loop is not None:
            files[PLOT] = self.trajectory_plot()
        remove_stale_staging(Path(path).absolute().parent)
        try:
            return write_directory_atomic(
                path, files, marker=CARD, what="a saved plant model", overwrite=overwrite
            )
        except FileExistsError as error:
            raise PlantModelError(str(error)) from None

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        dataset: Dataset | None = None,
        task: Task | None = None,
        dataset_name: str = "dataset",
    ) -> PlantModel:
        """The model saved at ``path``; given ``dataset`` (and ``task``), refused unless
        they are the ones it was fitted on.

        Raises:
            PlantModelError: naming the file that is missing, unreadable or of another
                format, or the task or dataset that differs.
        """
        path = Path(path)
        card_path = path / CARD
        try:
            card = json.loads(card_path.read_text())
        except FileNotFoundError:
            raise PlantModelError(
                f"{card_path}: missing; {path} is not a saved plant model"
            ) from None
        except json.JSONDecodeError as error:
            raise PlantModelError(f"{card_path}: not valid JSON ({error})") from None
        if not isinstance(card, dict) or card.get("format") != FORMAT:
            found = card.get("format") if isinstance(card, dict) else None
            raise PlantModelError(f"{card_path}: format {found!r}; this version reads {FORMAT!r}")
        try:
            saved_task = Task.from_dict(card["task"], f"{card_path}: task")
            config = DynamicsConfig.create(**card["config"])
            saved = card["layout"]
            layout = DynamicsLayout(
                observation_size=int(saved["observation_size"]),
                frame_size=int(saved["frame_size"]),
                action_size=int(saved["action_size"]),
                n_costs=int(saved["n_costs"]),
                known=KnownSignals.from_dict(saved["known"]),
                terminals=bool(saved["terminals"]),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise PlantModelError(f"{card_path}: malformed ({error})") from None
        model = cls(
            saved_task,
            config,
            definitions=card.get("definitions") or {},
            reward_row=card.get("reward_row"),
        )
        model.dynamics = make_dynamics(config, layout)
        model.card = card
        template = _template(model.dynamics, len(card["settings"]["seeds"]), config.n_elites)
        try:
            state = serialization.msgpack_restore((path / PARAMS).read_bytes())
            # Models saved before the physical bounds were kept: the card's bounds.
            for name, value in _saved_bounds(card, layout).items():
                state.setdefault(name, value)
            params = serialization.from_state_dict(template, state)
        except FileNotFoundError:
            raise PlantModelError(f"{path / PARAMS}: missing") from None
        except (ValueError, KeyError, TypeError) as error:
            raise PlantModelError(
                f"{path / PARAMS}: does not match the saved configuration ({error})"
            ) from None
        model._params = jax.tree.map(jnp.asarray, params)
        if dataset is not None:
            model.check_same_data(dataset, name=dataset_name, task=task)
        elif task is not None:
            model.check_task(task, name=dataset_name)
        return model


def physical_ranges(task: Task, stats: DynamicsParams) -> dict[str, Any]:
    """The card's ``physics``: per predicted feature the range a prediction is held to
    and where it comes from (``schema``, or ``data`` where the schema gives no finite
    bound: the data's range is used), and the learned signals' ranges from the data."""
    frame_low = np.asarray(jax.device_get(stats.frame_low), np.float64)
    frame_high = np.asarray(jax.device_get(stats.frame_high), np.float64)
    features = {}
    for i, low in enumerate(frame_low):
        schema = (task.observation_low[i], task.observation_high[i])
        sources = ["schema" if np.isfinite(bound) else "data" for bound in schema]
        features[task.observation_names[i]] = {
            "low": float(low),
            "high": float(frame_high[i]),
            "source": sources[0] if sources[0] == sources[1] else "/".join(sources),
        }
    from_data = [name for name, entry in features.items() if "data" in entry["source"]]
    return {
        "features": features,
        "from_data": from_data,
        "note": (
            f"no physical range in the schema for {', '.join(from_data)}: the data's range is used"
            if from_data
            else None
        ),
        "reward": [float(stats.reward_low), float(stats.reward_high)],
        "cost_high": [float(x) for x in np.asarray(jax.device_get(stats.cost_high))],
    }


def _saved_bounds(card: dict[str, Any], layout: DynamicsLayout) -> dict[str, np.ndarray]:
    """The bounds of a model saved before they were part of its parameters: the frame's
    from the card's ``physics`` or, without it, the data's range; learned signals
    unbounded."""
    frame = layout.frame_size
    features = list((card.get("physics") or {}).get("features", {}).values())
    if len(features) == frame:
        low = np.asarray([f["low"] for f in features], np.float32)
        high = np.asarray([f["high"] for f in features], np.float32)
    else:
        low = np.full(frame, -np.inf, np.float32)
        high = np.full(frame, np.inf, np.float32)
    return {
        "frame_low": low,
        "frame_high": high,
        "cost_high": np.full(layout.n_costs, np.inf, np.float32),
        "reward_low": np.asarray(-np.inf, np.float32),
        "reward_high": np.asarray(np.inf, np.float32),
    }


def _template(dynamics: Dynamics, n_seeds: int, n_elites: int) -> DynamicsParams:
    layout = dynamics.layout
    keys = jax.random.split(jax.random.PRNGKey(0), n_seeds * n_elites).reshape(
        n_seeds, n_elites, -1
    )
    networks = jax.eval_shape(jax.vmap(jax.vmap(dynamics.init)), keys)
    networks = jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), networks)
    obs, target, act = layout.observation_size, layout.target_size, layout.action_size
    zeros = np.zeros
    return DynamicsParams(
        networks=networks,
        obs_mean=zeros(obs, np.float32),
        obs_std=zeros(obs, np.float32),
        target_mean=zeros(target, np.float32),
        target_std=zeros(target, np.float32),
        target_fixed=zeros(target, bool),
        cost_low=zeros(layout.n_costs, np.float32),
        obs_low=zeros(obs, np.float32),
        obs_high=zeros(obs, np.float32),
        policy_action_low=zeros(act, np.float32),
        policy_action_high=zeros(act, np.float32),
        action_low=zeros(act, np.float32),
        action_high=zeros(act, np.float32),
        frame_low=zeros(layout.frame_size, np.float32),
        frame_high=zeros(layout.frame_size, np.float32),
        cost_high=zeros(layout.n_costs, np.float32),
        reward_low=zeros((), np.float32),
        reward_high=zeros((), np.float32),
    )


def _predict_program(dynamics: Dynamics) -> Callable[..., dict[str, jax.Array]]:
    """The compiled one-step prediction of a batch of any leading shape."""
    layout = dynamics.layout
    frame = layout.frame_size

    @jax.jit
    def program(params: DynamicsParams, observations: jax.Array, actions: jax.Array):
        shape = observations.shape[:-1]
        flat_obs = observations.reshape(-1, observations.shape[-1])
        flat_act = jnp.broadcast_to(actions, (*shape, actions.shape[-1])).reshape(
            flat_obs.shape[0], -1
        )
        members = jax.vmap(dynamics.predict, in_axes=(0, None, None, None))(
            params.networks, params, flat_obs, flat_act
        )  # [E, B, T] normalized
        variance = jnp.mean(jnp.exp(2.0 * members.log_std), axis=0) + jnp.var(members.mean, axis=0)
        variance = jnp.where(params.target_fixed, 0.0, variance)

        def member_mean(member: jax.Array) -> tuple[jax.Array, ...]:
            return jax.vmap(
                lambda o, a: dynamics.transition(params, o, a, jax.random.PRNGKey(0), member, True)
            )(flat_obs, flat_act)

        next_obs, rewards, costs, _ = jax.vmap(member_mean)(jnp.arange(params.n_members))
        ood = out_of_distribution(params, flat_obs, flat_act)
        result = {
            "next_observation": jnp.mean(next_obs, axis=0),
            "next_frame_std": jnp.sqrt(variance[:, :frame]) * params.target_std[:frame],
            "reward": jnp.mean(rewards, axis=0),
            "costs": jnp.mean(costs, axis=0),
            "done_probability": jnp.mean(jax.nn.sigmoid(members.logit), axis=0) * layout.terminals,
            "member_std": jnp.std(next_obs[..., :frame], axis=0),
            "out_of_distribution": ood,
            "outside_data": ood > 0.0,
        }
        return jax.tree.map(lambda x: x.reshape(*shape, *x.shape[1:]), result)

    return program


def _rollout_program(
    dynamics: Dynamics, member: int | None, deterministic: bool
) -> Callable[..., dict[str, jax.Array]]:
    """The compiled open-loop rollout of a batch of starts."""

    @jax.jit
    def program(params, observations, actions, key):
        def one(observation, actions, key):
            def body(observation, inputs):
                action, key = inputs
                out = dynamics.step(params, observation, action, key, member, deterministic)
                return out.next_observation, out

            keys = jax.random.split(key, actions.shape[0])
            _, outs = jax.lax.scan(body, observation, (actions, keys))
            return outs

        keys = jax.random.split(key, observations.shape[0])
        outs = jax.vmap(one)(observations, actions, keys)
        return {
            "observations": jnp.concatenate([observations[:, None], outs.next_observation], axis=1),
            "rewards": outs.reward,
            "costs": outs.costs,
            "done": outs.done,
            "member_std": outs.member_std,
            "out_of_distribution": outs.out_of_distribution,
        }

    return program
