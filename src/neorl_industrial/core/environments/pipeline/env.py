"""NeoRL-2's Pipeline: a water channel with a transport delay, as a functional environment.

A gate sets the flow into a channel; the flow reaches the outlet (the downstream flow) 19
steps later, and the outlet should follow a target flow that switches now and then among a
few levels. The mechanics are those of NeoRL-2's ``PipelineEnv``
(``neorl2/envs/pipline.py``; the reward of ``neorl2/envs/reward/pipeline_reward.py``):

* the action is a change of the gate flow, saturated at [-1, 1]; the gate flow
  ``g_k = clip(g_{k-1} + a_k, 0, 200)`` is accumulated in float32, as the reference does;
* a 20-slot shift register carries it to the outlet: ``d_k = g_{k-19}``, with every slot
  holding the initial flow ``x0 ~ U(80, 120)`` at reset;
* before the flow moves, with probability 0.003 a new target is drawn uniformly from
  {50, 80, 110, 140} (the same value may come again);
* the observation (52 values, float32) is ``[d_k, T_k, d_{k-1} .. d_{k-25},
  a_k .. a_{k-24}]``: the actions applied, newest first, including the current one;
* the reward ``(0.01 (200 - |d_k - T_k|))^2 - 3`` of the float32 observation returned,
  in [-2.75, 1]; 1000 steps, no terminal states.

What differs, on purpose. The reference keeps the previous episode's last target at reset
(its ``reset`` does not clear it), so an episode's first target depends on the episodes
before it; here the first target is drawn uniformly from the levels (a fresh reference
env's marginal), or set by the traced ``initial_target``. The reward's 200 is the
channel's capacity ``max_flow``, equal at the defaults. A NaN or infinite action is
flagged (``info.action_invalid``) and leaves the gate unchanged (recorded as 0 in the
action history). The reference has no costs; here a step whose outlet is more than
``cost_band`` (30) from the target costs 1 (``flow_off_target``). The reference names no
unit for its flows.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from neorl_industrial.core.environments.base import Environment, StepInfo, TimeStep
from neorl_industrial.core.environments.pipeline.params import (
    DEFAULT_EPISODE_COST_LIMIT,
    DEFAULT_MAX_FLOW,
    SAMPLE_INITIAL_TARGET,
    PipelineParams,
    pipeline_params,
)
from neorl_industrial.core.safety import ConstraintSpec
from neorl_industrial.core.utils import random as fast_random

COST_NAMES = ("flow_off_target",)
ACTION_NAMES = ("gate_change",)
#: steps from the gate to the outlet (the reference: 100 // 5 - 1, a 20-slot channel)
DEFAULT_DELAY = 19
#: past downstream flows and actions in an observation (the reference's 25 and 25)
DEFAULT_HISTORY = 25
#: uniforms a step draws: whether a new target is drawn, and which level
N_UNIFORMS = 2
#: the largest change of the gate flow per step
MAX_GATE_CHANGE = 1.0
#: NeoRL-2's normalization of episode returns (``neorl2/envs/info.py``): a score is
#: ``100 (return - min) / (max - min)``.
REFERENCE_SCORES = {"min": -296.0, "max": 751.0}


def normalized_score(episode_return: float) -> float:
    """NeoRL-2's normalized score of a Pipeline episode return."""
    low, high = REFERENCE_SCORES["min"], REFERENCE_SCORES["max"]
    return 100.0 * (episode_return - low) / (high - low)


@struct.dataclass
class PipelineState:
    """The channel, the observed histories, the target and the step count."""

    channel: jax.Array  # [delay + 1] flows in the channel, the gate's first, the outlet's last
    downstream_history: jax.Array  # [history] past downstream flows, newest first
    action_history: jax.Array  # [history] gate changes applied, newest (current) first
    target: jax.Array  # the current target flow
    time: jax.Array  # int32 steps since reset


class Pipeline(Environment[PipelineState, PipelineParams]):
    """NeoRL-2's Pipeline task; see the module docstring.

    Args:
        delay: steps from the gate to the outlet (the channel has ``delay + 1`` slots).
        history: past downstream flows, and actions, in an observation.
        auto_reset: restart finished episodes inside ``step``.
    """

    name = "Pipeline-v0"

    def __init__(
        self, delay: int = DEFAULT_DELAY, history: int = DEFAULT_HISTORY, auto_reset: bool = True
    ):
        for field, value in (("delay", delay), ("history", history)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field}: expected a positive integer, got {value!r}")
        if not isinstance(auto_reset, bool):
            raise ValueError(f"auto_reset: expected True or False, got {auto_reset!r}")
        self.delay = delay
        self.history = history
        self.auto_reset = auto_reset

    def __repr__(self) -> str:
        return f"Pipeline(delay={self.delay}, history={self.history}, auto_reset={self.auto_reset})"

    def _static_config(self) -> tuple:
        return (type(self), self.delay, self.history, self.auto_reset)

    # ----- static description -------------------------------------------------------
    @property
    def observation_size(self) -> int:
        return 2 + 2 * self.history

    @property
    def action_size(self) -> int:
        return 1

    @property
    def action_low(self) -> np.ndarray:
        return np.full(1, -MAX_GATE_CHANGE, np.float32)

    @property
    def action_high(self) -> np.ndarray:
        return np.full(1, MAX_GATE_CHANGE, np.float32)

    @property
    def observation_low(self) -> np.ndarray:
        """The reference's declared bounds: flows from 0, gate changes from -1."""
        flows = np.zeros(2 + self.history, np.float32)
        return np.concatenate([flows, np.full(self.history, -MAX_GATE_CHANGE, np.float32)])

    @property
    def observation_high(self) -> np.ndarray:
        """The reference's declared bounds at its capacity of 200 (a larger traced
        ``max_flow`` lets flows exceed them)."""
        flows = np.full(2 + self.history, DEFAULT_MAX_FLOW, np.float32)
        return np.concatenate([flows, np.full(self.history, MAX_GATE_CHANGE, np.float32)])

    @property
    def observation_names(self) -> tuple[str, ...]:
        return (
            "downstream_flow",
            "target_flow",
            *(f"downstream_flow_lag{lag}" for lag in range(1, self.history + 1)),
            *(f"gate_change_lag{lag}" for lag in range(self.history)),
        )

    @property
    def action_names(self) -> tuple[str, ...]:
        return ACTION_NAMES

    @property
    def observation_units(self) -> tuple[str | None, ...]:
        """``None`` for every feature: the reference names no unit for its flows (a
        quantity per step) or its gate changes (the same quantity per step)."""
        return (None,) * self.observation_size

    @property
    def action_units(self) -> tuple[str | None, ...]:
        """``None``: the reference names no unit (a change of the gate flow per step)."""
        return (None,)

    @property
    def cost_names(self) -> tuple[str, ...]:
        return COST_NAMES

    def default_params(self, **overrides: Any) -> PipelineParams:
        return pipeline_params(**overrides)

    def default_constraints(self, params: PipelineParams | None = None) -> Any:
        """The gate change's range and a fallback that leaves the gate as it is (identical
        to ``configs/constraints/pipeline.yaml``).

        The cost ``flow_off_target`` compares two features (``|downstream - target| >
        cost_band``), which a spec's single-feature costs cannot express: it comes from
        the environment's cost vector, with the episode limit
        ``DEFAULT_EPISODE_COST_LIMIT`` (200 of 1000 steps) to pass as ``cost_limits``.
        """
        del params
        return ConstraintSpec.from_dict(
            {
                "name": "pipeline",
                "action_bounds": {"gate_change": [-MAX_GATE_CHANGE, MAX_GATE_CHANGE]},
                "fallback": {"kind": "constant", "value": 0.0},
            }
        )

    def default_cost_limits(self, params: PipelineParams | None = None) -> dict[str, float]:
        """``flow_off_target``'s episode limit, ``DEFAULT_EPISODE_COST_LIMIT`` (the cost
        a spec cannot express, see :meth:`default_constraints`)."""
        return {
            **super().default_cost_limits(params),
            "flow_off_target": float(DEFAULT_EPISODE_COST_LIMIT),
        }

    # ----- dynamics -----------------------------------------------------------------
    def decode_action(self, action: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(gate_change, invalid)``: NaN/inf is no change (flagged); finite changes
        saturate at [-1, 1]."""
        action = jnp.reshape(action, ()).astype(jnp.float32)
        invalid = ~jnp.isfinite(action)
        change = jnp.clip(jnp.where(invalid, 0.0, action), -MAX_GATE_CHANGE, MAX_GATE_CHANGE)
        return change, invalid

    def observe(self, state: PipelineState) -> jax.Array:
        return jnp.concatenate(
            [
                state.channel[-1:],
                state.target[None],
                state.downstream_history,
                state.action_history,
            ]
        ).astype(jnp.float32)

    def reward(self, observation: jax.Array, params: PipelineParams) -> jax.Array:
        """NeoRL-2's reward of an observation: 1 on target, -2.75 at the worst."""
        error = jnp.abs(observation[0] - observation[1])
        return jnp.square(0.01 * (params.max_flow - error)) - 3.0

    def cost(self, observation: jax.Array, params: PipelineParams) -> jax.Array:
        off = jnp.abs(observation[0] - observation[1]) > params.cost_band
        return off.astype(jnp.float32)[None]

    def draw_target(self, key: jax.Array, params: PipelineParams) -> jax.Array:
        """A target drawn uniformly from the levels."""
        index = jax.random.randint(key, (), 0, params.target_levels.shape[0])
        return params.target_levels[index]

    def reset_env(self, key: jax.Array, params: PipelineParams) -> tuple[PipelineState, TimeStep]:
        flow_key, target_key = jax.random.split(key)
        low, high = params.initial_flow_range[0], params.initial_flow_range[1]
        initial_flow = jax.random.uniform(flow_key, (), jnp.float32, low, high)
        target = jnp.where(
            params.initial_target == SAMPLE_INITIAL_TARGET,
            self.draw_target(target_key, params),
            params.initial_target,
        )
        state = PipelineState(
            channel=jnp.full(self.delay + 1, initial_flow, jnp.float32),
            downstream_history=jnp.full(self.history, initial_flow, jnp.float32),
            action_history=jnp.zeros(self.history, jnp.float32),
            target=target.astype(jnp.float32),
            time=jnp.zeros((), jnp.int32),
        )
        observation = self.observe(state)
        timestep = TimeStep.first(
            observation,
            self.n_costs,
            StepInfo(final_observation=observation, action_invalid=jnp.zeros((), jnp.bool_)),
        )
        return state, timestep

    def step_env(
        self, key: jax.Array, state: PipelineState, action: jax.Array, params: PipelineParams
    ) -> tuple[PipelineState, TimeStep]:
        return self.step_from_uniforms(
            fast_random.uniform(key, (N_UNIFORMS,)), state, action, params
        )

    def step_from_uniforms(
        self,
        uniforms: jax.Array,
        state: PipelineState,
        action: jax.Array,
        params: PipelineParams,
    ) -> tuple[PipelineState, TimeStep]:
        """One step with its randomness given: ``uniforms[0]`` decides whether a new target
        is drawn (below ``switch_probability``), ``uniforms[1]`` picks its level."""
        change, invalid = self.decode_action(action)
        # The reference updates the target before the flow: the reward of step k is
        # against the target observed with it.
        n_levels = params.target_levels.shape[0]
        level = jnp.minimum((uniforms[1] * n_levels).astype(jnp.int32), n_levels - 1)
        switch = uniforms[0] < params.switch_probability
        target = jnp.where(switch, params.target_levels[level], state.target)
        gate = jnp.clip(state.channel[0] + change, 0.0, params.max_flow)
        state = PipelineState(
            channel=jnp.concatenate([gate[None], state.channel[:-1]]),
            downstream_history=jnp.concatenate([state.channel[-1:], state.downstream_history[:-1]]),
            action_history=jnp.concatenate([change[None], state.action_history[:-1]]),
            target=target,
            time=state.time + 1,
        )
        observation = self.observe(state)
        timestep = TimeStep(
            observation=observation,
            reward=self.reward(observation, params).astype(jnp.float32),
            cost=self.cost(observation, params),
            terminated=jnp.zeros((), jnp.bool_),
            truncated=state.time >= params.horizon,
            info=StepInfo(final_observation=observation, action_invalid=invalid),
        )
        return state, timestep

    # ----- the randomness of many steps, or of a batch, drawn in one call ---------------
    def presample(self, key: jax.Array, n_steps: int) -> tuple[jax.Array, jax.Array]:
        uniform_key, reset_key = jax.random.split(key)
        uniforms = fast_random.uniform(uniform_key, (n_steps, N_UNIFORMS))
        return jax.random.split(reset_key, n_steps), uniforms

    def step_presampled(
        self,
        sample: tuple[jax.Array, jax.Array],
        state: PipelineState,
        action: jax.Array,
        params: PipelineParams,
    ) -> tuple[PipelineState, TimeStep]:
        reset_key, uniforms = sample
        state, timestep = self.step_from_uniforms(uniforms, state, action, params)
        return self.maybe_reset(reset_key, state, timestep, params)

    def step_env_batch(
        self, key: jax.Array, states: PipelineState, actions: jax.Array, params: PipelineParams
    ) -> tuple[PipelineState, TimeStep]:
        uniforms = fast_random.uniform(key, (actions.shape[0], N_UNIFORMS))
        return jax.vmap(self.step_from_uniforms, in_axes=(0, 0, 0, None))(
            uniforms, states, actions, params
        )
