"""The dataset card: what a dataset is, where it came from and how to check it.

A card travels with every dataset (``dataset.json`` in the native format) and is built on
the fly for formats that carry less (NeoRL ``.npz``, Minari, plant logs). Only the array
schema and checksums are needed to load a native dataset; everything else is optional
provenance that makes results comparable (reference returns, cost limits, seeds).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from neorl_industrial.core.environments import Task, TaskError, registered_envs
from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.integration.datasets.errors import DatasetFormatError
from neorl_industrial.version import __version__

CARD_FORMAT_VERSION = 1


class BehaviourPolicy(BaseModel):
    """The policy that generated the data, when one did."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    version: str | None = None
    mean_return: float | None = Field(None, description="measured mean episode return")


class ColumnInfo(BaseModel):
    """Physical meaning of one observation or action column (known for plant logs):
    ``bounds`` is an action's range, or an observation's physical range (outside it a
    reading is invalid); ``observed`` is the range an observation spans in the data
    (outside it an observation is flagged as out of distribution); ``exogenous``: an
    observation no action moves (a measured disturbance, a setpoint schedule)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    unit: str | None = None
    bounds: tuple[float, float] | None = None
    observed: tuple[float, float] | None = None
    exogenous: bool = False

    @field_validator("bounds", "observed")
    @classmethod
    def _ordered(cls, bounds: tuple[float, float] | None) -> tuple[float, float] | None:
        if bounds is not None and bounds[0] > bounds[1]:
            raise ValueError(f"low {bounds[0]} is above high {bounds[1]}")
        return bounds


class ArraySpec(BaseModel):
    """dtype and shape of one stored array, checked on load."""

    model_config = ConfigDict(extra="forbid")

    dtype: str
    shape: list[int]


class DatasetSizes(BaseModel):
    """Sizes a reader can check (or show) without opening the arrays."""

    model_config = ConfigDict(extra="forbid")

    n_transitions: int
    n_episodes: int
    observation_size: int
    action_size: int
    n_costs: int = 0
    discrete: bool = False
    #: Frames per observation as stored (``observations.npy`` holds frames when > 1).
    frame_stack: int = Field(1, ge=1)

    @classmethod
    def of(cls, dataset: Dataset) -> DatasetSizes:
        """The sizes of ``dataset``."""
        return cls(
            n_transitions=dataset.n_transitions,
            n_episodes=dataset.n_episodes,
            observation_size=dataset.observation_size,
            action_size=dataset.action_size,
            n_costs=dataset.n_costs,
            discrete=dataset.discrete,
            frame_stack=dataset.frame_stack,
        )


class DatasetCard(BaseModel):
    """Provenance, reference numbers and integrity data of one dataset.

    Unknown keys are kept (``extra="allow"``) so a card written by a newer version loads
    and re-saves without losing fields.
    """

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    format_version: int = CARD_FORMAT_VERSION
    name: str = "dataset"
    description: str | None = None
    source: str | None = Field(
        None, description='where the data came from: "generated", "neorl", "minari", "plant-log"'
    )
    env_id: str | None = None
    env_params: dict[str, Any] = Field(default_factory=dict)
    behaviour_policy: BehaviourPolicy | None = None
    random_return: float | None = None
    expert_return: float | None = None
    cost_names: list[str] = Field(default_factory=list)
    cost_limits: dict[str, float] = Field(
        default_factory=dict, description="episode-level limit per cost name"
    )
    seed: int | None = None
    package_version: str = Field(default_factory=lambda: __version__)
    created: datetime = Field(default_factory=lambda: datetime.now(UTC))
    sampling_period: float | None = Field(None, description="seconds between steps")
    observation_columns: list[ColumnInfo] | None = None
    action_columns: list[ColumnInfo] | None = None
    definitions: dict[str, str] = Field(
        default_factory=dict, description="how reward and costs were computed (expressions)"
    )
    reward_row: Literal["current", "next"] | None = Field(
        None,
        description="the row reward and costs of transition t were computed on (a plant "
        "log's schema): 'current' (row t, with the action taken there) or 'next' (row t + 1)",
    )
    sizes: DatasetSizes | None = None
    # "schema" would shadow a (deprecated) BaseModel attribute, hence the alias.
    array_schema: dict[str, ArraySpec] = Field(default_factory=dict, alias="schema")
    checksums: dict[str, str] = Field(default_factory=dict, description="sha256 per array file")

    @model_validator(mode="after")
    def _limits_name_known_costs(self) -> DatasetCard:
        unknown = sorted(set(self.cost_limits) - set(self.cost_names))
        if unknown:
            raise ValueError(
                f"cost_limits names {unknown} that are not in cost_names {self.cost_names}"
            )
        return self

    # ----- use ------------------------------------------------------------------------
    def normalized_score(self, returns: Any) -> np.ndarray:
        """D4RL-style score ``100 * (R - random) / (expert - random)`` of episode returns.

        Raises:
            ValueError: if the card has no reference returns.
        """
        if self.random_return is None or self.expert_return is None:
            raise ValueError(
                f"dataset card '{self.name}': normalized_score needs random_return and "
                "expert_return; set both on the card"
            )
        return normalized_score(returns, self.random_return, self.expert_return)

    @property
    def frame_stack(self) -> int:
        """Frames per stored observation row (1 for a card without sizes)."""
        return self.sizes.frame_stack if self.sizes is not None else 1

    def with_sizes(self, dataset: Dataset) -> DatasetCard:
        """A copy with ``sizes`` (and default cost names) taken from ``dataset``.

        Raises:
            ValueError: if the card names a different number of costs than the data has.
        """
        cost_names = self.cost_names or [f"cost_{i}" for i in range(dataset.n_costs)]
        if len(cost_names) != dataset.n_costs:
            raise ValueError(
                f"dataset card '{self.name}': cost_names {cost_names} has {len(cost_names)} "
                f"entries but the data has {dataset.n_costs} costs"
            )
        return self.model_copy(
            update={"sizes": DatasetSizes.of(dataset), "cost_names": list(cost_names)}
        )

    def task(self, dataset: Dataset | None = None, *, name: str | None = None) -> Task:
        """The process this dataset describes, as a :class:`Task`.

        * A card with columns (a plant log's): names, units and bounds of every feature
          and action, the cost channels with their definitions and limits, the sampling
          period; a simulator only when the card names a registered ``env_id``.
        * A card of a registered simulator without columns (a generated dataset): that
          simulator's task with the card's ``env_params``.
        * Otherwise (NeoRL, Minari): generic names, and action bounds fitted to
          ``dataset``'s actions (min and max per action, as d3rlpy's MinMaxActionScaler).

        Raises:
            ValueError: naming the card and the field when the card does not describe a
                usable task (no action bounds and no data to fit them, a zero-width action
                range, ...).
        """
        source = f"dataset card '{self.name}'"
        has_simulator = self.env_id is not None and self.env_id in registered_envs()
        try:
            if self.observation_columns is None and has_simulator:
                return Task.from_env(self.env_id, self.env_params)
            observations = _observation_columns(self, dataset)
            sizes = self.sizes
            discrete = bool(sizes.discrete) if sizes else bool(dataset and dataset.discrete)
            actions = _action_columns(self, dataset, discrete)
            return Task.create(
                name=name or self.name,
                observation_names=observations.names,
                action_names=actions.names,
                action_low=actions.low,
                action_high=actions.high,
                observation_low=observations.low,
                observation_high=observations.high,
                data_low=observations.data_low,
                data_high=observations.data_high,
                observation_units=observations.units,
                action_units=actions.units,
                cost_names=tuple(self.cost_names),
                cost_definitions={
                    key: value for key, value in self.definitions.items() if key != "reward"
                },
                cost_limits=dict(self.cost_limits),
                sampling_period=self.sampling_period,
                discrete=discrete,
                num_actions=_num_actions(dataset) if discrete else None,
                env_id=self.env_id if has_simulator else None,
                env_params=dict(self.env_params) if has_simulator else {},
                exogenous=tuple(c.name for c in self.observation_columns or () if c.exogenous),
            )
        except (TaskError, ValueError) as error:
            raise ValueError(f"{source}: {error}") from None

    # ----- files ----------------------------------------------------------------------
    def to_json(self) -> str:
        """The card as indented JSON, with the ``schema`` key spelled as in the file."""
        return self.model_dump_json(by_alias=True, indent=2)

    @classmethod
    def read(cls, path: str | Path) -> DatasetCard:
        """Reads a card from a JSON file.

        Raises:
            DatasetFormatError: naming the file and pydantic's field path when the card is
                malformed.
        """
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise DatasetFormatError("dataset card not found", path=path) from None
        try:
            return cls.model_validate_json(text)
        except ValidationError as error:
            raise DatasetFormatError(f"invalid dataset card\n{error}", path=path) from error


class _Columns(NamedTuple):
    """One side of a task (observations or actions) as :meth:`Task.create` takes it:
    names, then units, physical ranges and the data's ranges where known (else None)."""

    names: tuple[str, ...]
    units: tuple[str | None, ...] | None = None
    low: tuple[float, ...] | None = None
    high: tuple[float, ...] | None = None
    data_low: tuple[float, ...] | None = None
    data_high: tuple[float, ...] | None = None


def _observation_columns(card: DatasetCard, dataset: Dataset | None) -> _Columns:
    """The card's observation columns (unbounded where a column gives no bounds; the
    data's ranges where any column records one), or generic names for the observation
    size of the card or ``dataset``."""
    columns = card.observation_columns
    if columns is None:
        sizes = card.sizes
        size = sizes.observation_size if sizes else _size(dataset, "observation_size")
        return _Columns(names=tuple(f"observation_{i}" for i in range(size)))
    spans = [c.observed for c in columns]
    observed = any(s is not None for s in spans)
    return _Columns(
        names=tuple(c.name for c in columns),
        units=tuple(c.unit for c in columns),
        low=tuple(-np.inf if c.bounds is None else c.bounds[0] for c in columns),
        high=tuple(np.inf if c.bounds is None else c.bounds[1] for c in columns),
        data_low=tuple(-np.inf if s is None else s[0] for s in spans) if observed else None,
        data_high=tuple(np.inf if s is None else s[1] for s in spans) if observed else None,
    )


def _action_columns(card: DatasetCard, dataset: Dataset | None, discrete: bool) -> _Columns:
    """The card's action columns (bounds fitted to ``dataset`` when any column has
    none), one action in [0, 1] for discrete data, or generic names with fitted bounds.

    Raises:
        ValueError: when bounds must be fitted and there is no ``dataset``.
    """
    units = None
    if card.action_columns is not None:
        names = [c.name for c in card.action_columns]
        units = tuple(c.unit for c in card.action_columns)
        bounds = [c.bounds for c in card.action_columns]
        if any(b is None for b in bounds):
            if dataset is None:
                raise ValueError(
                    "action_columns: every action needs bounds (or pass the data to fit them)"
                )
            bounds = _fitted_bounds(dataset)
    elif discrete:
        return _Columns(names=("action",), low=(0.0,), high=(1.0,))
    else:
        if dataset is None:
            raise ValueError(
                "action_columns: the card has no action bounds; pass the dataset to "
                "fit them from the logged actions"
            )
        bounds = _fitted_bounds(dataset)
        names = [f"action_{i}" for i in range(len(bounds))]
    return _Columns(
        names=tuple(names),
        units=units,
        low=tuple(b[0] for b in bounds),
        high=tuple(b[1] for b in bounds),
    )


def _num_actions(dataset: Dataset | None) -> int:
    """The action count of discrete data: one more than the largest logged action."""
    if dataset is None:
        raise ValueError("a discrete dataset's task needs the data (action count)")
    return int(np.asarray(dataset.actions).max()) + 1


def _size(dataset: Dataset | None, attribute: str) -> int:
    if dataset is None:
        raise ValueError("sizes: the card records no sizes; pass the dataset")
    return int(getattr(dataset, attribute))


def _fitted_bounds(dataset: Dataset) -> list[tuple[float, float]]:
    """Per action, the min and max of the logged actions (widened by a tiny margin where
    an action never moved, so the range has a width)."""
    actions = np.asarray(dataset.actions, np.float64).reshape(dataset.n_transitions, -1)
    low, high = actions.min(axis=0), actions.max(axis=0)
    flat = high - low <= 0
    margin = np.maximum(np.abs(low), 1.0) * 1e-3
    low = np.where(flat, low - margin, low)
    high = np.where(flat, high + margin, high)
    return list(zip(low.tolist(), high.tolist(), strict=True))


def normalized_score(returns: Any, random_return: float, expert_return: float) -> np.ndarray:
    """D4RL-style normalized score ``100 * (R - random) / (expert - random)``.

    Args:
        returns: one episode return or an array of them.
        random_return: mean return of a uniformly random policy (scores 0).
        expert_return: mean return of an expert policy (scores 100).

    Raises:
        ValueError: if the two reference returns are equal.
    """
    if expert_return == random_return:
        raise ValueError(
            f"expert_return and random_return are both {expert_return}; the score is undefined"
        )
    returns = np.asarray(returns, np.float64)
    return 100.0 * (returns - random_return) / (expert_return - random_return)
