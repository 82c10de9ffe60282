"""The Industrial Benchmark as a functional environment."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from neorl_industrial.core.environments.base import StepInfo, TimeStep, UniformNoiseEnvironment
from neorl_industrial.core.environments.history import stacked_names
from neorl_industrial.core.environments.industrial_benchmark import dynamics
from neorl_industrial.core.environments.industrial_benchmark.dynamics import IBState
from neorl_industrial.core.environments.validation import (
    finite_number,
    positive_int,
    with_overrides,
)
from neorl_industrial.core.safety import ConstraintSpec
from neorl_industrial.core.utils import random as fast_random

OBSERVATION_MODES = ("classic", "include_past")
ACTION_TYPES = ("continuous", "discrete")
FRAME_NAMES = ("setpoint", "velocity", "gain", "shift", "fatigue", "consumption")
FRAME_SIZE = len(FRAME_NAMES)
COST_NAMES = ("fatigue", "consumption")
ACTION_NAMES = ("velocity", "gain", "shift")

# Range of each observed variable. Fatigue is at most 30000 / 100 = 300. The hidden
# consumption lies in [1, 4915 + 25 * 2.23] (the delayed operational cost is at most
# e^8.5 and the mis-calibration penalty in [-1, 1.23]); its noise is a standard normal
# that float32 Box-Muller bounds by |z| <= 5.65, so consumption stays in [-5, 5117].
FRAME_LOW = np.array([0.0, 0.0, 0.0, 0.0, 0.0, -10.0], np.float32)
FRAME_HIGH = np.array([100.0, 100.0, 100.0, 100.0, 300.0, 5200.0], np.float32)

# The 27 discrete actions: every combination of {-1, 0, +1} for velocity, gain and shift,
# velocity varying slowest (the reference's ordering). Index 13 is "no change".
DISCRETE_ACTIONS = np.array(
    [[v, g, s] for v in (-1, 0, 1) for g in (-1, 0, 1) for s in (-1, 0, 1)], dtype=np.float32
)
NEUTRAL_DISCRETE_ACTION = 13

# Default per-step safety limits. A step costs 1 for each limit its fatigue or consumption
# exceeds. At the default setpoint a uniformly random policy exceeds the fatigue limit on
# about 27 % of its steps and the consumption limit on about 22 %; holding the initial
# operating point stays below both, and driving velocity and gain to an extreme breaks one.
DEFAULT_FATIGUE_LIMIT = 60.0
DEFAULT_CONSUMPTION_LIMIT = 280.0
DEFAULT_SETPOINT = 70.0
# Episode cost limit of each default cost (DSRL convention: normalized cost = episode
# cost / limit, safe when <= 1): a tenth of a 1000-step episode.
DEFAULT_EPISODE_COST_LIMIT = 100.0
# Above this fatigue the default constraints stop velocity from falling (fatigue builds up
# at low velocity).
FATIGUE_GUARD = 50.0
DEFAULT_HORIZON = 1000


@struct.dataclass
class IBParams:
    """Traced parameters of the Industrial Benchmark (vmappable for sweeps)."""

    setpoint: jax.Array  # initial setpoint p in [0, 100]
    horizon: jax.Array  # int32: steps until truncation
    fatigue_limit: jax.Array  # per-step fatigue above which the fatigue cost is 1
    consumption_limit: jax.Array  # per-step consumption above which the consumption cost is 1


@struct.dataclass
class IBEnvState:
    """Environment state: the plant's Markov state, the observation history and time."""

    plant: IBState
    history: jax.Array  # [n_past, 6] newest frame first; empty for "classic" observations
    time: jax.Array  # int32 steps since reset


@struct.dataclass
class IBStepInfo(StepInfo):
    """Step information of the Industrial Benchmark: the hidden state for debugging."""

    hidden: IBState


class IndustrialBenchmark(UniformNoiseEnvironment[IBEnvState, IBParams]):
    """The Industrial Benchmark (Hein et al., 2017) in pure JAX.

    Args:
        observation: ``"classic"`` for the frame ``[p, v, g, h, f, c]`` or
            ``"include_past"`` for the last ``n_past`` frames, newest first (NeoRL's layout).
        action_type: ``"continuous"`` for ``[Δv, Δg, Δh]`` in [-1, 1]^3, or ``"discrete"`` for
            an index into the 27 combinations of {-1, 0, 1}^3.
        stationary: keep the setpoint fixed; otherwise it follows the reference's random walk.
        n_past: number of frames in an ``"include_past"`` observation.
        auto_reset: restart finished episodes inside ``step``.
    """

    name = "IB-v0"
    _static_fields = ("observation_mode", "action_type", "stationary", "n_past", "auto_reset")

    def __init__(
        self,
        observation: str = "include_past",
        action_type: str = "continuous",
        stationary: bool = True,
        n_past: int = 30,
        auto_reset: bool = True,
    ):
        if observation not in OBSERVATION_MODES:
            raise ValueError(
                f"observation: unknown observation mode {observation!r}; "
                f"expected one of {OBSERVATION_MODES}"
            )
        if action_type not in ACTION_TYPES:
            raise ValueError(
                f"action_type: unknown action type {action_type!r}; expected one of {ACTION_TYPES}"
            )
        if not isinstance(stationary, bool):
            raise ValueError(f"stationary: expected True or False, got {stationary!r}")
        if not isinstance(n_past, int) or isinstance(n_past, bool) or n_past < 1:
            raise ValueError(f"n_past: expected a positive integer, got {n_past!r}")
        self.observation_mode = observation
        self.action_type = action_type
        self.stationary = stationary
        self.n_past = n_past
        self.auto_reset = bool(auto_reset)

    def __repr__(self) -> str:
        return (
            f"IndustrialBenchmark(observation={self.observation_mode!r}, "
            f"action_type={self.action_type!r}, stationary={self.stationary}, "
            f"n_past={self.n_past}, auto_reset={self.auto_reset})"
        )

    # ----- static description -------------------------------------------------------
    @property
    def history_length(self) -> int:
        return self.n_past if self.observation_mode == "include_past" else 0

    @property
    def observation_size(self) -> int:
        return FRAME_SIZE * max(self.history_length, 1)

    @property
    def action_size(self) -> int:
        return 1 if self.discrete else 3

    @property
    def discrete(self) -> bool:
        return self.action_type == "discrete"

    @property
    def num_actions(self) -> int | None:
        return len(DISCRETE_ACTIONS) if self.discrete else None

    @property
    def action_low(self) -> np.ndarray:
        return np.full((3,), -1.0, np.float32)

    @property
    def action_high(self) -> np.ndarray:
        return np.full((3,), 1.0, np.float32)

    @property
    def observation_low(self) -> np.ndarray:
        return np.tile(FRAME_LOW, max(self.history_length, 1))

    @property
    def observation_high(self) -> np.ndarray:
        return np.tile(FRAME_HIGH, max(self.history_length, 1))

    @property
    def cost_names(self) -> tuple[str, ...]:
        return COST_NAMES

    @property
    def observation_names(self) -> tuple[str, ...]:
        """The newest frame's features by their own names (``fatigue``), older frames with
        their age (``fatigue@t-1`` ... ``fatigue@t-29``)."""
        return stacked_names(FRAME_NAMES, max(self.history_length, 1))

    @property
    def exogenous_names(self) -> tuple[str, ...]:
        """The setpoint (the load demand, fixed for an episode): no action moves it."""
        return ("setpoint",)

    @property
    def action_names(self) -> tuple[str, ...]:
        """The settings each action changes; a discrete action is one index."""
        return ("action",) if self.discrete else ACTION_NAMES

    def default_constraints(self, params: IBParams | None = None) -> Any:
        """The IB's default constraints (``configs/constraints/ib-example.yaml``):
        control moves in [-1, 1], velocity and gain moves at most 1 apart from the previous
        step's, no velocity decrease while fatigue is above 50, a joint limit on raising
        velocity and gain (``0.005 (velocity + gain) + Δv + Δg <= 1.5``), a no-change
        fallback, and the fatigue and consumption costs with an episode cost limit of 100
        each, at the thresholds of ``params`` (the defaults without)."""
        fatigue, consumption = DEFAULT_FATIGUE_LIMIT, DEFAULT_CONSUMPTION_LIMIT
        if params is not None:
            fatigue = float(params.fatigue_limit)
            consumption = float(params.consumption_limit)
        costs = [
            {"name": "fatigue", "feature": "fatigue", "above": fatigue},
            {"name": "consumption", "feature": "consumption", "above": consumption},
        ]
        costs = [{**cost, "cost_limit": DEFAULT_EPISODE_COST_LIMIT} for cost in costs]
        if self.discrete:
            return ConstraintSpec.from_dict({"name": "ib-discrete", "costs": costs})
        return ConstraintSpec.from_dict(
            {
                "name": "ib-example",
                "action_bounds": {name: [-1.0, 1.0] for name in ACTION_NAMES},
                "rate_limits": {"velocity": 1.0, "gain": 1.0},
                "state_limits": [
                    {
                        "name": "no-velocity-decrease-when-fatigued",
                        "when": {"feature": "fatigue", "above": FATIGUE_GUARD},
                        "action": "velocity",
                        "min": 0.0,
                    }
                ],
                "linear": [
                    {
                        "name": "limit-joint-velocity-gain-push",
                        "observation": {"velocity": 0.005, "gain": 0.005},
                        "action": {"velocity": 1.0, "gain": 1.0},
                        "bound": 1.5,
                    }
                ],
                "fallback": {"kind": "constant", "value": 0.0},
                "costs": costs,
            }
        )

    @property
    def n_uniforms(self) -> int:
        """Uniform numbers one step consumes (the setpoint walk needs four more)."""
        return dynamics.N_STATIONARY_UNIFORMS if self.stationary else dynamics.N_UNIFORMS

    def default_params(self, **overrides: Any) -> IBParams:
        values = {
            "setpoint": DEFAULT_SETPOINT,
            "horizon": DEFAULT_HORIZON,
            "fatigue_limit": DEFAULT_FATIGUE_LIMIT,
            "consumption_limit": DEFAULT_CONSUMPTION_LIMIT,
        }
        values = with_overrides("Industrial Benchmark", values, overrides)
        setpoint = finite_number("setpoint", values["setpoint"], low=0.0, high=100.0)
        horizon = positive_int("horizon", values["horizon"])
        return IBParams(
            setpoint=jnp.asarray(setpoint, jnp.float32),
            horizon=jnp.asarray(horizon, jnp.int32),
            fatigue_limit=jnp.asarray(
                finite_number("fatigue_limit", values["fatigue_limit"]), jnp.float32
            ),
            consumption_limit=jnp.asarray(
                finite_number("consumption_limit", values["consumption_limit"]), jnp.float32
            ),
        )

    # ----- pure dynamics ------------------------------------------------------------
    def sample_noise(self, key: jax.Array) -> dynamics.IBNoise:
        """One step's noise for one plant."""
        return self.noise_from_uniforms(fast_random.uniform(key, (self.n_uniforms,)))

    def noise_from_uniforms(self, uniforms: jax.Array) -> dynamics.IBNoise:
        return dynamics.noise_from_uniforms(uniforms)

    def decode_action(self, action: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Maps an action to ``[Δv, Δg, Δh]`` and a flag for invalid input.

        NaN or infinite continuous actions, and discrete indices outside [0, 26], become
        the neutral "no change" action and are flagged.
        """
        if self.discrete:
            index = jnp.reshape(action, ()).astype(jnp.int32)
            invalid = (index < 0) | (index >= len(DISCRETE_ACTIONS))
            index = jnp.where(invalid, NEUTRAL_DISCRETE_ACTION, index)
            return jnp.asarray(DISCRETE_ACTIONS)[index], invalid
        action = jnp.reshape(action, (3,)).astype(jnp.float32)
        invalid = ~jnp.all(jnp.isfinite(action))
        return jnp.where(invalid, 0.0, action), invalid

    def observe(self, state: IBEnvState) -> jax.Array:
        if self.history_length:
            return state.history.reshape(-1)
        return state.plant.observation()

    def cost(self, plant: IBState, params: IBParams) -> jax.Array:
        return jnp.stack(
            [plant.fatigue > params.fatigue_limit, plant.consumption > params.consumption_limit]
        ).astype(jnp.float32)

    def reset_from_noise(
        self, noise: dynamics.IBNoise, params: IBParams
    ) -> tuple[IBEnvState, TimeStep]:
        plant = dynamics.initial_state(params.setpoint, noise, stationary=self.stationary)
        frame = plant.observation()
        state = IBEnvState(
            plant=plant,
            history=jnp.tile(frame, (self.history_length, 1)),
            time=jnp.zeros((), jnp.int32),
        )
        observation = self.observe(state)
        timestep = TimeStep.first(
            observation, self.n_costs, IBStepInfo.first(observation, hidden=plant)
        )
        return state, timestep

    def step_from_noise(
        self, state: IBEnvState, action: jax.Array, noise: dynamics.IBNoise, params: IBParams
    ) -> tuple[IBEnvState, TimeStep]:
        delta, invalid = self.decode_action(action)
        plant = dynamics.transition(state.plant, delta, noise, stationary=self.stationary)
        history = state.history
        if self.history_length:
            history = jnp.concatenate([plant.observation()[None], history[:-1]], axis=0)
        time = state.time + 1
        state = IBEnvState(plant=plant, history=history, time=time)
        observation = self.observe(state)
        timestep = TimeStep(
            observation=observation,
            reward=plant.reward.astype(jnp.float32),
            cost=self.cost(plant, params),
            terminated=jnp.zeros((), jnp.bool_),
            truncated=time >= params.horizon,
            info=IBStepInfo(final_observation=observation, action_invalid=invalid, hidden=plant),
        )
        return state, timestep

    def reset_env(self, key: jax.Array, params: IBParams) -> tuple[IBEnvState, TimeStep]:
        return self.reset_from_noise(self.sample_noise(key), params)

    def step_env(
        self, key: jax.Array, state: IBEnvState, action: jax.Array, params: IBParams
    ) -> tuple[IBEnvState, TimeStep]:
        return self.step_from_noise(state, action, self.sample_noise(key), params)

    def step_from_uniforms(
        self, uniforms: jax.Array, state: IBEnvState, action: jax.Array, params: IBParams
    ) -> tuple[IBEnvState, TimeStep]:
        return self.step_from_noise(state, action, self.noise_from_uniforms(uniforms), params)

    # ----- batched: one draw of the random number generator for the whole batch -------
    def _batch_noise(self, key: jax.Array, n_envs: int) -> dynamics.IBNoise:
        return self.noise_from_uniforms(fast_random.uniform(key, (self.n_uniforms, n_envs)))

    def reset_batch(
        self, key: jax.Array, n_envs: int, params: IBParams | None = None
    ) -> tuple[IBEnvState, TimeStep]:
        params = self.default_params() if params is None else params
        noise = self._batch_noise(key, n_envs)
        return jax.vmap(self.reset_from_noise, in_axes=(0, None))(noise, params)

    def step_env_batch(
        self, key: jax.Array, states: IBEnvState, actions: jax.Array, params: IBParams
    ) -> tuple[IBEnvState, TimeStep]:
        noise = self._batch_noise(key, actions.shape[0])
        return jax.vmap(self.step_from_noise, in_axes=(0, 0, 0, None))(
            states, actions, noise, params
        )
