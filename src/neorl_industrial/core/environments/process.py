"""Process-control tasks: a plant's ODE, setpoints, disturbances and constraint costs.

A :class:`ProcessEnv` is the shape shared by the reactor, tank, pipeline and servo tasks:
the plant's physical state in its own units, a control held over each interval, traced
setpoint and disturbance schedules, a reward for tracking and a cost per constraint
channel. Subclasses declare names, units and bounds and implement the physics; this
class owns what every task must do the same way:

* **Invalid actions.** A NaN or infinite control element is flagged
  (``info.action_invalid``) and the actuator holds the previous interval's value; finite
  controls are saturated at the actuator's bounds.
* **Divergence.** An interval whose solution is non-finite or leaves the physical envelope
  (``state_low``/``state_high``) ends the episode (``terminated``, ``info.diverged``), costs
  1 in every channel, and reports the last valid state: no NaN ever reaches a dataset.
* **Observations** are the plant's measured state, the current setpoints and the measured
  disturbances, in plant units (the policy normalizes inside).
* **Random disturbances** (``disturbance_noise`` > 0): each disturbance wanders around its
  schedule as a stationary AR(1) process, ``e[t+1] = rho e[t] + sqrt(1 - rho^2) sigma xi``
  with ``sigma = disturbance_noise * (disturbance_high - disturbance_low)`` and ``rho =
  disturbance_correlation`` per interval, drawn from the step's key; the value applied over
  an interval (clipped to the declared bounds) is the one observed before it. At 0 (the
  default) the task is deterministic given its reset, and its programs are unchanged.
"""

from __future__ import annotations

import abc
import math
from typing import Any, Generic, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from neorl_industrial.core.environments.base import Environment, StepInfo, TimeStep
from neorl_industrial.core.environments.ode import integrate_interval, solver_named

ParamsT = TypeVar("ParamsT")


@struct.dataclass
class ProcessState:
    """A process task's state: the plant, the control last applied, the step count."""

    plant: jax.Array  # [n_states] in the task's units
    last_control: jax.Array  # [n_controls] applied over the previous interval
    time: jax.Array  # int32 steps since reset
    episode: jax.Array  # what a task draws per episode at reset (e.g. targets); may be empty
    deviation: jax.Array  # [n_disturbances] random deviation from the schedule (0 if none)


@struct.dataclass
class ProcessStepInfo(StepInfo):
    """Step information of a process task.

    Attributes:
        diverged: the interval's solution was non-finite or left the physical envelope;
            the episode ended and the state reported is the last valid one.
        plant: the plant's full state (observed or not), for debugging and parity tests.
    """

    diverged: jax.Array
    plant: jax.Array


class ProcessEnv(Environment[ProcessState, ParamsT], Generic[ParamsT]):
    """Base class of ODE process tasks; see the module docstring for the contract.

    Subclasses set the class attributes below and implement :meth:`vector_field`,
    :meth:`initial_plant`, :meth:`setpoint`, :meth:`disturbance`, :meth:`reward`,
    :meth:`costs` and :meth:`default_params` (params must carry ``dt`` and ``horizon``).
    """

    #: names, units and physical envelope of the plant's state
    state_names: tuple[str, ...] = ()
    state_units: tuple[str | None, ...] = ()
    state_low: np.ndarray = np.zeros(0, np.float32)
    state_high: np.ndarray = np.zeros(0, np.float32)
    #: which states are observed (default: all), by index into ``state_names``
    observed_states: tuple[int, ...] | None = None
    #: names, units and actuator bounds of the controls
    control_names: tuple[str, ...] = ()
    control_units: tuple[str | None, ...] = ()
    control_low: np.ndarray = np.zeros(0, np.float32)
    control_high: np.ndarray = np.zeros(0, np.float32)
    #: the states that have setpoints, by index into ``state_names``; observed as
    #: ``<state>_setpoint`` with the state's unit and bounds
    tracked_states: tuple[int, ...] = ()
    #: measured disturbances: names, units, bounds
    disturbance_names: tuple[str, ...] = ()
    disturbance_units: tuple[str | None, ...] = ()
    disturbance_low: np.ndarray = np.zeros(0, np.float32)
    disturbance_high: np.ndarray = np.zeros(0, np.float32)
    #: cost channel names, one per constraint
    process_cost_names: tuple[str, ...] = ()
    #: fixed solver steps per control interval, and the diffrax solver's name
    substeps: int = 10
    solver: str = "tsit5"
    #: the reward of a step compares the state reached with the setpoint observed with it
    #: (the next interval's; NeoRL-2's convention) instead of the one in force during it
    reward_against_next_setpoint: bool = False
    _static_fields = ("auto_reset", "disturbance_noise", "disturbance_correlation")

    def __init__(
        self,
        auto_reset: bool = True,
        disturbance_noise: float = 0.0,
        disturbance_correlation: float = 0.9,
    ):
        if not isinstance(auto_reset, bool):
            raise ValueError(f"auto_reset: expected True or False, got {auto_reset!r}")
        for field, value in (
            ("disturbance_noise", disturbance_noise),
            ("disturbance_correlation", disturbance_correlation),
        ):
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
            ):
                raise ValueError(f"{field}: expected a finite number, got {value!r}")
        if disturbance_noise < 0.0:
            raise ValueError(
                f"disturbance_noise: expected a fraction of each disturbance's range of at "
                f"least 0, got {disturbance_noise!r}"
            )
        if disturbance_noise > 0.0 and not self.disturbance_names:
            raise ValueError(
                f"disturbance_noise: {type(self).__name__} has no disturbances to vary; expected 0"
            )
        if not 0.0 <= disturbance_correlation < 1.0:
            raise ValueError(
                "disturbance_correlation: expected a per-interval correlation in [0, 1), "
                f"got {disturbance_correlation!r}"
            )
        self.auto_reset = auto_reset
        self.disturbance_noise = float(disturbance_noise)
        self.disturbance_correlation = float(disturbance_correlation)

    def __repr__(self) -> str:
        noise = (
            f", disturbance_noise={self.disturbance_noise}, "
            f"disturbance_correlation={self.disturbance_correlation}"
            if self.disturbance_noise
            else ""
        )
        return f"{type(self).__name__}(auto_reset={self.auto_reset}{noise})"

    # ----- static description -------------------------------------------------------
    @property
    def _observed(self) -> tuple[int, ...]:
        if self.observed_states is None:
            return tuple(range(len(self.state_names)))
        return self.observed_states

    @property
    def observation_size(self) -> int:
        return len(self._observed) + len(self.tracked_states) + len(self.disturbance_names)

    @property
    def action_size(self) -> int:
        return len(self.control_names)

    @property
    def action_low(self) -> np.ndarray:
        return np.asarray(self.control_low, np.float32)

    @property
    def action_high(self) -> np.ndarray:
        return np.asarray(self.control_high, np.float32)

    @property
    def observation_low(self) -> np.ndarray:
        return self._observation_bound(self.state_low, self.disturbance_low)

    @property
    def observation_high(self) -> np.ndarray:
        return self._observation_bound(self.state_high, self.disturbance_high)

    def _observation_bound(self, state_bound: Any, disturbance_bound: Any) -> np.ndarray:
        """A bound of the observation (the layout of :meth:`observe`: observed states, the
        tracked states' setpoints, disturbances) from the states' and disturbances'."""
        bound = np.asarray(state_bound, np.float32)
        return np.concatenate(
            [bound[list(self._observed)], bound[list(self.tracked_states)], disturbance_bound]
        ).astype(np.float32)

    @property
    def observation_names(self) -> tuple[str, ...]:
        return (
            *(self.state_names[i] for i in self._observed),
            *(f"{self.state_names[i]}_setpoint" for i in self.tracked_states),
            *self.disturbance_names,
        )

    @property
    def exogenous_names(self) -> tuple[str, ...]:
        """The setpoints of the tracked states and the disturbances: a schedule and the
        feed, which no control moves."""
        names = self.observation_names
        return names[len(self._observed) :]

    @property
    def observation_units(self) -> tuple[str | None, ...]:
        return (
            *(self.state_units[i] for i in self._observed),
            *(self.state_units[i] for i in self.tracked_states),
            *self.disturbance_units,
        )

    @property
    def action_names(self) -> tuple[str, ...]:
        return self.control_names

    @property
    def action_units(self) -> tuple[str | None, ...]:
        return self.control_units

    @property
    def cost_names(self) -> tuple[str, ...]:
        return self.process_cost_names

    # ----- the physics (subclasses) ---------------------------------------------------
    @abc.abstractmethod
    def vector_field(
        self, plant: jax.Array, control: jax.Array, disturbance: jax.Array, params: ParamsT
    ) -> jax.Array:
        """``d plant / dt`` of one plant (pure; no clipping of the state)."""

    @abc.abstractmethod
    def initial_plant(self, key: jax.Array, params: ParamsT) -> jax.Array:
        """The plant's state at reset."""

    def initial_control(self, params: ParamsT) -> jax.Array:
        """The control held before the first step (an invalid first action holds it):
        the middle of the actuator's range unless a task says otherwise."""
        del params
        return jnp.asarray((self.action_low + self.action_high) / 2.0)

    def draw_episode(self, key: jax.Array, params: ParamsT) -> jax.Array:
        """What varies per episode beyond the plant's initial state (e.g. a target
        schedule), drawn at reset and kept in ``ProcessState.episode``; none by default."""
        del key, params
        return jnp.zeros((0,), jnp.float32)

    @abc.abstractmethod
    def setpoint(self, params: ParamsT, time: jax.Array, episode: jax.Array) -> jax.Array:
        """``[len(tracked_states)]``: the setpoints in force during interval ``time``
        (``episode``: what :meth:`draw_episode` drew at reset)."""

    @abc.abstractmethod
    def disturbance(self, params: ParamsT, time: jax.Array) -> jax.Array:
        """``[len(disturbance_names)]``: the disturbances held over interval ``time``."""

    @abc.abstractmethod
    def reward(
        self, plant: jax.Array, control: jax.Array, setpoint: jax.Array, params: ParamsT
    ) -> jax.Array:
        """The reward of reaching ``plant`` after an interval with ``setpoint`` in force."""

    @abc.abstractmethod
    def costs(self, plant: jax.Array, control: jax.Array, params: ParamsT) -> jax.Array:
        """``[n_costs]`` per-step costs of the state reached (0 when every constraint holds)."""

    def after_interval(self, plant: jax.Array, params: ParamsT) -> jax.Array:
        """Physical limits applied after integration (e.g. a level cannot fall below 0)."""
        del params
        return plant

    # ----- the contract every task shares ----------------------------------------------
    def decode_control(self, action: jax.Array, last_control: jax.Array):
        """``(control, invalid)``: NaN/inf elements hold the previous control (flagged),
        finite ones saturate at the actuator's bounds."""
        action = jnp.reshape(action, (self.action_size,)).astype(jnp.float32)
        finite = jnp.isfinite(action)
        control = jnp.clip(
            jnp.where(finite, action, last_control), self.action_low, self.action_high
        )
        return control, ~jnp.all(finite)

    def observe(
        self,
        plant: jax.Array,
        params: ParamsT,
        time: jax.Array,
        episode: jax.Array,
        deviation: jax.Array,
    ) -> jax.Array:
        return jnp.concatenate(
            [
                plant[jnp.asarray(self._observed, jnp.int32)],
                self.setpoint(params, time, episode),
                self.disturbance_applied(params, time, deviation),
            ]
        ).astype(jnp.float32)

    # ----- random disturbances ------------------------------------------------------------
    @property
    def disturbance_spread(self) -> np.ndarray:
        """``[n_disturbances]`` stationary standard deviation of each random deviation, in
        the disturbance's units (zeros for a deterministic task)."""
        span = np.asarray(self.disturbance_high, np.float32) - np.asarray(
            self.disturbance_low, np.float32
        )
        return (self.disturbance_noise * span).astype(np.float32)

    def disturbance_applied(
        self, params: ParamsT, time: jax.Array, deviation: jax.Array
    ) -> jax.Array:
        """The disturbances held over interval ``time``: the schedule plus ``deviation``,
        within the declared bounds."""
        scheduled = self.disturbance(params, time)
        if not self.disturbance_noise:
            return scheduled
        return jnp.clip(scheduled + deviation, self.disturbance_low, self.disturbance_high)

    def initial_deviation(self, key: jax.Array) -> jax.Array:
        """A deviation from the AR(1) process's stationary distribution (zeros when the
        task is deterministic)."""
        size = len(self.disturbance_names)
        if not self.disturbance_noise:
            return jnp.zeros((size,), jnp.float32)
        return jnp.asarray(self.disturbance_spread) * jax.random.normal(key, (size,))

    def next_deviation(self, key: jax.Array, deviation: jax.Array) -> jax.Array:
        """One AR(1) step of the deviation (unchanged when the task is deterministic)."""
        if not self.disturbance_noise:
            return deviation
        rho = self.disturbance_correlation
        innovation = jax.random.normal(key, deviation.shape) * jnp.asarray(self.disturbance_spread)
        return rho * deviation + math.sqrt(1.0 - rho * rho) * innovation

    def integrate(
        self, plant: jax.Array, control: jax.Array, disturbance: jax.Array, params: ParamsT
    ) -> jax.Array:
        """The plant after one control interval (``params.dt``)."""
        return integrate_interval(
            self.vector_field,
            plant,
            control,
            disturbance,
            params,
            params.dt,
            substeps=self.substeps,
            solver=solver_named(self.solver),
        )

    def reset_env(self, key: jax.Array, params: ParamsT) -> tuple[ProcessState, TimeStep]:
        plant_key, episode_key = jax.random.split(key)
        plant = self.initial_plant(plant_key, params).astype(jnp.float32)
        state = ProcessState(
            plant=plant,
            last_control=self.initial_control(params).astype(jnp.float32),
            time=jnp.zeros((), jnp.int32),
            episode=self.draw_episode(episode_key, params).astype(jnp.float32),
            # Folded from the reset key so that the plant's and episode's draws stay those
            # of a deterministic task.
            deviation=self.initial_deviation(jax.random.fold_in(key, 1)).astype(jnp.float32),
        )
        observation = self.observe(plant, params, state.time, state.episode, state.deviation)
        timestep = TimeStep.first(
            observation,
            self.n_costs,
            ProcessStepInfo.first(observation, diverged=jnp.zeros((), jnp.bool_), plant=plant),
        )
        return state, timestep

    def step_env(
        self, key: jax.Array, state: ProcessState, action: jax.Array, params: ParamsT
    ) -> tuple[ProcessState, TimeStep]:
        control, invalid = self.decode_control(action, state.last_control)
        disturbance = self.disturbance_applied(params, state.time, state.deviation)
        reached = self.after_interval(
            self.integrate(state.plant, control, disturbance, params), params
        ).astype(jnp.float32)
        diverged = ~jnp.all(jnp.isfinite(reached)) | jnp.any(
            (reached < self.state_low) | (reached > self.state_high)
        )
        plant = jnp.where(diverged, state.plant, reached)
        time = state.time + 1
        setpoint_time = time if self.reward_against_next_setpoint else state.time
        setpoint = self.setpoint(params, setpoint_time, state.episode)
        reward = self.reward(plant, control, setpoint, params).astype(jnp.float32)
        costs = self.costs(plant, control, params).astype(jnp.float32)
        costs = jnp.where(diverged, jnp.ones_like(costs), costs)
        deviation = self.next_deviation(key, state.deviation).astype(jnp.float32)
        observation = self.observe(plant, params, time, state.episode, deviation)
        timestep = TimeStep(
            observation=observation,
            reward=reward,
            cost=costs,
            terminated=diverged,
            truncated=time >= params.horizon,
            info=ProcessStepInfo(
                final_observation=observation,
                action_invalid=invalid,
                diverged=diverged,
                plant=plant,
            ),
        )
        return (
            ProcessState(
                plant=plant,
                last_control=control,
                time=time,
                episode=state.episode,
                deviation=deviation,
            ),
            timestep,
        )


def schedule_value(schedule: jax.Array, time: jax.Array) -> jax.Array:
    """Row ``time`` of a ``[steps, k]`` schedule, holding the last row after its end."""
    return schedule[jnp.clip(time, 0, schedule.shape[0] - 1)]


def check_observation_bounds(env: ProcessEnv[Any]) -> None:
    """Raises ``ValueError`` when a task's declared names, units and bounds disagree in
    length (a programming error in a task, caught by its tests)."""
    for what, names, others in (
        ("state", env.state_names, (env.state_units, env.state_low, env.state_high)),
        ("control", env.control_names, (env.control_units, env.control_low, env.control_high)),
        (
            "disturbance",
            env.disturbance_names,
            (env.disturbance_units, env.disturbance_low, env.disturbance_high),
        ),
    ):
        if any(len(other) != len(names) for other in others):
            raise ValueError(
                f"{type(env).__name__}: {what} names, units and bounds differ in length"
            )
