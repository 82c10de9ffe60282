"""The task: the one description of a process that data, agent, shield and server agree on.

A :class:`Task` names the observation features and actions (with units and bounds), the
cost channels (with their per-step definitions and default episode limits), the hard
constraints a safety engineer would start from, the episode length that turns an episode
cost limit into a per-step threshold, and, optionally, a simulator (a registered
environment id and its parameters) for evaluation and data generation.

It comes from a registered environment (:meth:`Task.from_env`), from a plant log's
schema or a dataset card (``integration.datasets``: ``card.task()``), or is written by
hand. Nothing downstream assumes a simulator: a task without one trains, evaluates off
policy, exports and serves like any other.

Actions are in the plant's own units between ``action_low`` and ``action_high``; the
policy acts in [-1, 1] inside and is scaled to those units
(``functional.state_management.ActionScaler``), so an exported policy takes and returns
engineering units.
"""

from __future__ import annotations

import dataclasses
import math
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from neorl_industrial.core.environments.registry import make
from neorl_industrial.core.safety.spec import ConstraintSpec, ConstraintSpecError

__all__ = ["Task", "TaskError"]

#: Fields that :meth:`Task.create` fills when they are unset.
_FILLED = ("observation_low", "observation_high", "observation_units", "action_units")


class TaskError(ValueError):
    """A task description, or data that disagrees with it: names the field."""


def _names(values: Sequence[str], what: str) -> tuple[str, ...]:
    names = tuple(str(name) for name in values)
    if any(not name for name in names):
        raise TaskError(f"{what}: names must be non-empty strings")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise TaskError(f"{what}: {repeated} named more than once")
    return names


def _floats(values: Sequence[float] | None, size: int, fill: float, what: str) -> tuple:
    if values is None:
        return (fill,) * size
    result = tuple(float(value) for value in values)
    if len(result) != size:
        raise TaskError(f"{what}: expected {size} values, got {len(result)}")
    if any(math.isnan(value) for value in result):
        raise TaskError(f"{what}: NaN is not a bound")
    return result


@dataclasses.dataclass(frozen=True)
class Task:
    """One process, described once (see the module docstring). :meth:`create` builds one
    from lists, arrays and unset bounds; the fields hold tuples and plain dicts.

    Attributes:
        name: what the process is called (``boiler-3``, ``IB-v0``).
        observation_names: one name per observation feature.
        action_names: one name per action (one ``action`` for a discrete index).
        action_low, action_high: bounds of each continuous action, in plant units.
        observation_low, observation_high: physical bounds of each feature (``±inf``
            where unknown; :meth:`create` fills unset ones).
        observation_units, action_units: unit of each feature and action (None: none;
            :meth:`create` fills unset ones).
        cost_names: the cost channels of the data, in column order.
        cost_definitions: how each channel is computed per step (an expression, or a
            sentence), for people.
        cost_limits: default episode cost limit per channel name (a constraint spec's
            ``cost_limit`` or an explicit limit wins over it).
        episode_length: steps per episode, used to turn an episode cost limit into a
            per-step threshold; None: the data's mean episode length.
        sampling_period: seconds between steps (None: unknown).
        discrete: actions are indices ``0 .. num_actions - 1``.
        num_actions: how many discrete actions.
        env_id: the registered simulator of this process; None: no simulator.
        env_params: overrides of the simulator's configuration and parameters.
        constraints: the hard constraints and costs to start from (a ``ConstraintSpec``);
            None: the action bounds alone.
        data_low, data_high: the range of each feature in the data the policy learns
            from (a plant log's observed range; ``±inf`` where unknown); None: unknown.
            Outside it the shield flags an observation as out of distribution, nothing
            more.
        exogenous: the observation features the actions cannot move (a measured
            disturbance, a setpoint schedule, an ambient reading): where the log holds
            their future (a verdict's held-out episodes), a plant model takes them from
            it instead of predicting them.
    """

    name: str
    observation_names: tuple[str, ...]
    action_names: tuple[str, ...]
    action_low: tuple[float, ...]
    action_high: tuple[float, ...]
    observation_low: tuple[float, ...]
    observation_high: tuple[float, ...]
    observation_units: tuple[str | None, ...]
    action_units: tuple[str | None, ...]
    cost_names: tuple[str, ...] = ()
    cost_definitions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    cost_limits: Mapping[str, float] = dataclasses.field(default_factory=dict)
    episode_length: int | None = None
    sampling_period: float | None = None
    discrete: bool = False
    num_actions: int | None = None
    env_id: str | None = None
    env_params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    constraints: ConstraintSpec | None = None
    data_low: tuple[float, ...] | None = None
    data_high: tuple[float, ...] | None = None
    exogenous: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Validates; the fields must already hold their stored form (what
        :meth:`create` makes of its values)."""
        given = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        for name, value in _stored_fields(given).items():
            if type(given[name]) is not type(value) or given[name] != value:
                raise TaskError(
                    f"{name}: expected {reprlib.repr(value)}, got {reprlib.repr(given[name])}; "
                    "Task.create converts sequences and fills unset bounds and units"
                )

    @classmethod
    def create(cls, **values: Any) -> Task:
        """The task of ``values``: sequences become tuples of ``str``/``float``, unset
        observation bounds ``±inf`` and unset units None, mappings plain dicts.

        Raises:
            TaskError: naming the field that is missing or wrong.
        """
        for field in dataclasses.fields(cls):
            if field.name in values:
                continue
            if field.default is not dataclasses.MISSING:
                values[field.name] = field.default
            elif field.default_factory is not dataclasses.MISSING:
                values[field.name] = field.default_factory()
            elif field.name in _FILLED:
                values[field.name] = None
            else:
                raise TaskError(f"{field.name}: required")
        return cls(**{**values, **_stored_fields(values)})

    # ----- sizes ------------------------------------------------------------------------
    @property
    def observation_size(self) -> int:
        return len(self.observation_names)

    @property
    def action_size(self) -> int:
        """Length of a continuous action (1 for a discrete index)."""
        return len(self.action_names)

    @property
    def n_costs(self) -> int:
        return len(self.cost_names)

    @property
    def has_simulator(self) -> bool:
        return self.env_id is not None

    @property
    def kind(self) -> str:
        """``simulator`` or ``plant``: how the task can be evaluated."""
        return "simulator" if self.has_simulator else "plant"

    # ----- constraints ------------------------------------------------------------------
    def default_constraints(self) -> ConstraintSpec:
        """The task's own constraints, or the action bounds alone."""
        if self.constraints is not None:
            return self.constraints
        if self.discrete:
            return ConstraintSpec(name=f"{self.name}-default")
        bounds = {
            name: [low, high]
            for name, low, high in zip(
                self.action_names, self.action_low, self.action_high, strict=True
            )
        }
        return ConstraintSpec.from_dict({"name": f"{self.name}-default", "action_bounds": bounds})

    def compile_constraints(self, spec: ConstraintSpec | None = None) -> Any:
        """``spec`` (default: :meth:`default_constraints`) compiled against this task's
        feature and action names, with its physical observation bounds (the shield sends
        the fallback for an observation outside them).

        Raises:
            ConstraintSpecError: naming the field of a feature or action the task does not
                have (with the closest names it does have).
        """
        spec = self.default_constraints() if spec is None else spec
        return spec.compile(
            self.observation_size,
            self.action_size,
            self.observation_names,
            self.action_names,
            observation_bounds=(self.observation_low, self.observation_high),
            data_bounds=None if self.data_low is None else (self.data_low, self.data_high),
        )

    # ----- simulator ----------------------------------------------------------------------
    def make_simulator(self) -> tuple[Any, Any]:
        """``(env, params)`` of the task's simulator.

        Raises:
            TaskError: when the task has no simulator, or its parameters are invalid.
        """
        if self.env_id is None:
            raise TaskError(
                f"env_id: task {self.name!r} has no simulator; evaluate it off policy (FQE)"
            )
        try:
            return make(self.env_id, **self.env_params)
        except ValueError as error:
            raise TaskError(f"env.params: {error}") from None

    @classmethod
    def from_env(cls, env_id: str, env_params: Mapping[str, Any] | None = None) -> Task:
        """The task of a registered simulator, with its parameters overridden.

        Raises:
            TaskError: for an unknown id or an invalid parameter, naming it.
        """
        params_overrides = dict(env_params or {})
        try:
            env, params = make(env_id, **params_overrides)
        except ValueError as error:
            raise TaskError(f"env: {error}") from None
        horizon = getattr(params, "horizon", None)
        return cls.create(
            name=env_id,
            observation_names=env.observation_names,
            action_names=env.action_names,
            observation_units=env.observation_units,
            action_units=None if env.discrete else env.action_units,
            action_low=_decimal_bounds(env.action_low) if not env.discrete else (0.0,),
            action_high=_decimal_bounds(env.action_high)
            if not env.discrete
            else (float(env.num_actions - 1),),
            observation_low=_decimal_bounds(env.observation_low),
            observation_high=_decimal_bounds(env.observation_high),
            cost_names=env.cost_names,
            cost_definitions=_definitions(env.default_constraints(params)),
            cost_limits=env.default_cost_limits(params),
            episode_length=None if horizon is None else int(horizon),
            discrete=env.discrete,
            num_actions=env.num_actions,
            env_id=env_id,
            env_params=params_overrides,
            constraints=env.default_constraints(params),
            exogenous=env.exogenous_names,
        )

    # ----- data -----------------------------------------------------------------------
    def check_dataset(self, dataset: Any, *, source: str = "dataset", card: Any = None) -> None:
        """:meth:`check_data` of a dataset's shapes (anything with ``observation_size``,
        ``action_size``, ``discrete`` and ``n_costs``) and, given its card, of the card's
        column and cost names."""
        names: dict[str, Any] = {}
        if card is not None:
            columns = getattr(card, "observation_columns", None)
            actions = getattr(card, "action_columns", None)
            names = {
                "observation_names": [c.name for c in columns] if columns else None,
                "action_names": [c.name for c in actions] if actions else None,
                "cost_names": list(getattr(card, "cost_names", []) or []) or None,
            }
        self.check_data(
            observation_size=dataset.observation_size,
            action_size=dataset.action_size,
            discrete=dataset.discrete,
            n_costs=dataset.n_costs,
            source=source,
            **names,
        )

    def check_data(
        self,
        *,
        observation_size: int,
        action_size: int,
        discrete: bool,
        n_costs: int,
        source: str = "dataset",
        observation_names: Sequence[str] | None = None,
        action_names: Sequence[str] | None = None,
        cost_names: Sequence[str] | None = None,
    ) -> None:
        """Raises :class:`TaskError` naming the field where data of these shapes and
        names does not fit the task."""
        if observation_size != self.observation_size:
            raise TaskError(
                f"{source}: observations have {observation_size} features; {self.name} has "
                f"{self.observation_size} ({_preview(self.observation_names)})"
            )
        if discrete != self.discrete:
            kind = "discrete" if discrete else "continuous"
            raise TaskError(
                f"{source}: {kind} actions; {self.name} has "
                f"{'discrete' if self.discrete else 'continuous'} ones"
            )
        if not discrete and action_size != self.action_size:
            raise TaskError(
                f"{source}: actions have {action_size} dimensions; {self.name} has "
                f"{self.action_size} ({', '.join(self.action_names)})"
            )
        for what, names, expected in (
            ("observation names", observation_names, self.observation_names),
            ("action names", None if discrete else action_names, self.action_names),
            ("cost names", cost_names, self.cost_names),
        ):
            if names is not None and tuple(names) and tuple(names) != tuple(expected):
                differ = [
                    f"{a!r} vs {b!r}" for a, b in zip(names, expected, strict=False) if a != b
                ][:3]
                raise TaskError(
                    f"{source}: {what} differ from {self.name}'s: "
                    f"{', '.join(differ) or f'{len(names)} vs {len(expected)} names'}"
                )
        if n_costs != self.n_costs and self.n_costs:
            raise TaskError(
                f"{source}: {n_costs} cost channels; {self.name} has {self.n_costs} "
                f"({', '.join(self.cost_names)})"
            )

    # ----- files ------------------------------------------------------------------------
    def to_dict(self, *, limits: bool = True) -> dict[str, Any]:
        """Plain JSON data that :meth:`from_dict` turns back into this task (infinite
        bounds as null). ``limits=False`` leaves out the default cost limits: a run's
        record (a trained agent, a checkpoint's fingerprint) keeps the limits of its
        safety contract, their one holder once resolved, and not the task's defaults.
        """

        def bounds(values: tuple[float, ...] | None) -> list[float | None] | None:
            if values is None:
                return None
            return [value if math.isfinite(value) else None for value in values]

        return {
            "name": self.name,
            "observation_names": list(self.observation_names),
            "action_names": list(self.action_names),
            "action_low": list(self.action_low),
            "action_high": list(self.action_high),
            "observation_low": bounds(self.observation_low),
            "observation_high": bounds(self.observation_high),
            "observation_units": list(self.observation_units or ()),
            "action_units": list(self.action_units or ()),
            "cost_names": list(self.cost_names),
            "cost_definitions": dict(self.cost_definitions),
            **({"cost_limits": dict(self.cost_limits)} if limits else {}),
            "episode_length": self.episode_length,
            "sampling_period": self.sampling_period,
            "discrete": self.discrete,
            "num_actions": self.num_actions,
            "env_id": self.env_id,
            "env_params": dict(self.env_params),
            "constraints": None if self.constraints is None else self.constraints.to_dict(),
            "data_low": bounds(self.data_low),
            "data_high": bounds(self.data_high),
            # Only when declared: the record of a task without them stays as it was.
            **({"exogenous": list(self.exogenous)} if self.exogenous else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "task") -> Task:
        """The task :meth:`to_dict` wrote.

        Raises:
            TaskError: naming ``source`` and the field.
        """
        if not isinstance(data, Mapping):
            raise TaskError(f"{source}: expected a mapping, got {type(data).__name__}")
        values = dict(data)
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise TaskError(f"{source}: unknown fields {unknown}; known: {sorted(known)}")
        for key, fill in (
            ("observation_low", -math.inf),
            ("observation_high", math.inf),
            ("data_low", -math.inf),
            ("data_high", math.inf),
        ):
            if values.get(key) is not None:
                values[key] = [fill if value is None else value for value in values[key]]
        for key in ("observation_units", "action_units"):
            if not values.get(key):
                values[key] = None
        if values.get("constraints") is not None:
            try:
                values["constraints"] = ConstraintSpec.from_dict(
                    values["constraints"], f"{source}: constraints"
                )
            except ConstraintSpecError as error:
                raise TaskError(str(error)) from None
        try:
            return cls.create(**values)
        except TaskError as error:
            raise TaskError(f"{source}: {error}") from None
        except (TypeError, ValueError) as error:
            raise TaskError(f"{source}: {error}") from None


def _stored_fields(values: Mapping[str, Any]) -> dict[str, Any]:
    """The stored form of a task's sequence and mapping fields, validated.

    Raises:
        TaskError: naming the field that is wrong.
    """
    if not str(values["name"]):
        raise TaskError("name: a task needs a name")
    observation_names = _names(values["observation_names"], "observation_names")
    action_names = _names(values["action_names"], "action_names")
    if not observation_names:
        raise TaskError("observation_names: a task observes at least one feature")
    if not action_names:
        raise TaskError("action_names: a task has at least one action")
    n_obs, n_act = len(observation_names), len(action_names)
    stored: dict[str, Any] = {
        "observation_names": observation_names,
        "action_names": action_names,
        "action_low": _floats(values["action_low"], n_act, -1.0, "action_low"),
        "action_high": _floats(values["action_high"], n_act, 1.0, "action_high"),
        "observation_low": _floats(values["observation_low"], n_obs, -math.inf, "observation_low"),
        "observation_high": _floats(
            values["observation_high"], n_obs, math.inf, "observation_high"
        ),
        "data_low": values["data_low"],
        "data_high": values["data_high"],
    }
    if values["data_low"] is not None or values["data_high"] is not None:
        stored["data_low"] = _floats(values["data_low"], n_obs, -math.inf, "data_low")
        stored["data_high"] = _floats(values["data_high"], n_obs, math.inf, "data_high")
    for what, size in (("observation_units", n_obs), ("action_units", n_act)):
        units = values[what]
        units = (None,) * size if units is None else tuple(units)
        if len(units) != size:
            raise TaskError(f"{what}: expected {size} units, got {len(units)}")
        stored[what] = units
    if values["discrete"]:
        num_actions = values["num_actions"]
        if num_actions is None or int(num_actions) < 2:
            raise TaskError(f"num_actions: a discrete task needs >= 2, got {num_actions}")
    else:
        for name, low, high in zip(
            action_names, stored["action_low"], stored["action_high"], strict=True
        ):
            if not (math.isfinite(low) and math.isfinite(high)):
                raise TaskError(
                    f"action_low/action_high: action {name!r} needs finite bounds in plant "
                    f"units, got [{low}, {high}]"
                )
            if not high > low:
                raise TaskError(
                    f"action_low/action_high: action {name!r} has a zero-width or "
                    f"inverted range [{low}, {high}]; the policy cannot be scaled to it"
                )
    for name, low, high in zip(
        observation_names, stored["observation_low"], stored["observation_high"], strict=True
    ):
        if low > high:
            raise TaskError(f"observation bounds: {name!r} has low {low} above high {high}")
    cost_names = _names(values["cost_names"], "cost_names")
    limits = {str(k): float(v) for k, v in dict(values["cost_limits"]).items()}
    unknown = sorted(set(limits) - set(cost_names))
    if unknown:
        raise TaskError(f"cost_limits: {unknown} are not cost channels {list(cost_names)}")
    for key, value in limits.items():
        if not (math.isfinite(value) and value >= 0):
            raise TaskError(f"cost_limits.{key}: expected a finite number >= 0, got {value}")
    exogenous = _names(values["exogenous"], "exogenous")
    missing = [name for name in exogenous if name not in observation_names]
    if missing:
        raise TaskError(f"exogenous: {missing} are not observation features")
    stored["exogenous"] = exogenous
    stored["cost_names"] = cost_names
    stored["cost_limits"] = limits
    stored["cost_definitions"] = {str(k): str(v) for k, v in values["cost_definitions"].items()}
    stored["env_params"] = dict(values["env_params"])
    episode_length = values["episode_length"]
    if episode_length is not None and int(episode_length) < 1:
        raise TaskError(f"episode_length: expected a positive integer, got {episode_length}")
    sampling_period = values["sampling_period"]
    if sampling_period is not None and not float(sampling_period) > 0:
        raise TaskError(f"sampling_period: expected seconds > 0, got {sampling_period}")
    return stored


def _definitions(spec: ConstraintSpec) -> dict[str, str]:
    return {cost.name: cost.definition for cost in spec.costs}


def _preview(names: Sequence[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... {len(names) - limit} more" if len(names) > limit else "")


def _decimal_bounds(values: Any) -> tuple[float, ...]:
    """Bounds an environment declares in float32, as the decimals they were written as
    (0.1, not 0.10000000149): the shortest decimal that rounds to the same float32."""
    return tuple(
        float(np.format_float_positional(value, unique=True, trim="-"))
        for value in np.asarray(values, np.float32).reshape(-1)
    )
