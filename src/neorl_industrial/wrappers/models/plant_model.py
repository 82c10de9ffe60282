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

import warnings
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import neorl_industrial
from neorl_industrial.core.environments import Task, TaskError
from neorl_industrial.core.models import (
    Dynamics,
    DynamicsConfig,
    DynamicsLayout,
    DynamicsParams,
    make_dynamics,
)
from neorl_industrial.core.models.signals import ROWS, computable_rows
from neorl_industrial.functional.state_management import ActionScaler, Dataset
from neorl_industrial.functional.transformations.dynamics import (
    data_statistics,
    fit_ensemble,
    select_elites,
)
from neorl_industrial.functional.transformations.dynamics_fidelity import OpenLoop
from neorl_industrial.functional.transformations.offline import Schedule
from neorl_industrial.wrappers.models.model_data import (
    FitSettings,
    dataset_fingerprint,
    fit_record,
    given_features,
    known_signals,
    layout_record,
    split_episodes,
)
from neorl_industrial.wrappers.models.model_fidelity import (
    LEVEL,
    open_loop_fidelity,
    simulator_fidelity,
)
from neorl_industrial.wrappers.models.model_files import (
    FORMAT,
    PlantModelError,
    load_model,
    physical_ranges,
    save_model,
)
from neorl_industrial.wrappers.models.model_programs import predict_program, rollout_program
from neorl_industrial.wrappers.models.outside_data import (
    OutsideDataWarning,
    OutsideFeature,
    outside_features,
    outside_message,
)


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
        train_ids, holdout_ids = split_episodes(dataset, settings.holdout, settings.split_seed)
        known, how = known_signals(self.task, self.definitions, self.reward_row, dataset)
        frame_size = dataset.frame_size
        layout = DynamicsLayout(
            observation_size=dataset.observation_size,
            frame_size=frame_size,
            action_size=dataset.action_size,
            n_costs=dataset.n_costs,
            known=known,
            terminals=bool(np.asarray(jax.device_get(dataset.terminals)).any()),
            given=given_features(self.task, frame_size),
        )
        self.dynamics = make_dynamics(self.config, layout)
        unit = self._unit_actions(dataset)
        train = unit.select_episodes(train_ids)
        holdout = unit.select_episodes(holdout_ids)
        task = self.task
        stats = data_statistics(
            train, self.dynamics, task.action_low, task.action_high,
            task.observation_low[:frame_size], task.observation_high[:frame_size],
        )  # fmt: skip
        schedule = Schedule(settings.max_updates, settings.chunk_updates, settings.batch_size)
        result = fit_ensemble(
            self.dynamics, stats, train, holdout, schedule=schedule, seeds=settings.seeds,
            patience=settings.patience, window_steps=settings.window_steps, callback=callback,
        )  # fmt: skip
        self._params, elites = select_elites(result.state, stats, self.config.n_elites)
        scores = np.asarray(jax.device_get(result.state.best_score))
        self.card = {
            "format": FORMAT,
            "neorl_industrial": neorl_industrial.__version__,
            "jax": jax.__version__,
            "created": datetime.now(UTC).isoformat(),
            "task": self.task.to_dict(),
            "config": self.config.to_dict(),
            "layout": layout_record(layout),
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
            "fit": fit_record(result, elites, scores),
        }
        self.card["fidelity"] = self.fidelity(dataset, episodes=holdout_ids, checked=True)
        return self.card

    # ----- fidelity ---------------------------------------------------------------------
    #: Open-loop fidelity on held-out episodes; see :func:`.model_fidelity.open_loop_fidelity`.
    fidelity = open_loop_fidelity
    #: The same against the task's simulator; see :func:`.model_fidelity.simulator_fidelity`.
    simulator_fidelity = simulator_fidelity

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
        program = self._program(("predict",), lambda: predict_program(self.dynamics))
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
            lambda: rollout_program(self.dynamics, member, deterministic),
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
        return save_model(self, path, overwrite=overwrite, plots=plots)

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
        return load_model(cls, path, dataset=dataset, task=task, dataset_name=dataset_name)
