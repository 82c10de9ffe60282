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

Batches. ``reset_batch`` returns a :class:`PipelineBatchState`: the same quantities with
the flows and the gate changes in time-major rings, so that a step writes one row of each
instead of shifting 70 slots of every environment, and an observation is a block copy of
ring rows (``step_batch`` and ``step_env_batch`` give bit for bit what the shift registers
give, and still accept stacked :class:`PipelineState`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from neorl_industrial.core.environments.base import StepInfo, TimeStep, UniformNoiseEnvironment
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
#: uniforms a step draws: one decides whether a new target is drawn and, below the switch
#: probability, which level (``u / p`` is uniform in [0, 1) there)
N_UNIFORMS = 1
#: the largest change of the gate flow per step
MAX_GATE_CHANGE = 1.0
#: NeoRL-2's normalization of episode returns (``neorl2/envs/info.py``): a score is
#: ``100 (return - min) / (max - min)``.
REFERENCE_SCORES = {"min": -296.0, "max": 751.0}


def next_target(uniform: jax.Array, target: jax.Array, params: PipelineParams) -> jax.Array:
    """The target after a step's draw ``uniform``: below ``switch_probability`` ``p`` a
    new level, the ``floor(n_levels u / p)``-th (``u / p`` is uniform in [0, 1) given
    ``u < p``; float32's 2^-23 grid leaves the four levels' shares within 2e-4 of a
    quarter at ``p`` = 0.003), else ``target``. Elementwise; the level is selected by
    comparisons, not an indexed load, so a batch stays vectorized."""
    levels = params.target_levels
    n_levels = levels.shape[-1]
    probability = params.switch_probability
    level_uniform = uniform / jnp.maximum(probability, jnp.finfo(jnp.float32).tiny)
    index = jnp.minimum((level_uniform * n_levels).astype(jnp.int32), n_levels - 1)
    drawn = levels[..., 0]
    for level in range(1, n_levels):
        drawn = jnp.where(index == level, levels[..., level], drawn)
    return jnp.where(uniform < probability, drawn, target)


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


@struct.dataclass
class PipelineBatchState:
    """A batch of pipelines stepped together (what :meth:`Pipeline.reset_batch` returns).

    The same quantities as a :class:`PipelineState` per environment, laid out for a batch:
    the gate flows and the gate changes are rings, time-major (a row per age, a column per
    environment), each written twice (rows ``i`` and ``i + size``) so that any window of
    ages is a block of consecutive rows. A step writes one row of each ring and moves the
    shared cursors instead of shifting every slot of every environment, and a reset writes
    no ring: a value older than the episode (age >= ``time``) reads as the initial flow,
    or as no change. The properties give the per-environment arrays of
    :class:`PipelineState`, batch-major.
    """

    flows: jax.Array  # [2 (delay + history + 1), n_envs] gate flows, the newest at flow_cursor
    changes: jax.Array  # [2 history, n_envs] gate changes applied, the newest at change_cursor
    flow_cursor: jax.Array  # int32 row of the newest gate flow, in [0, delay + history + 1)
    change_cursor: jax.Array  # int32 row of the newest gate change, in [0, history)
    gate: jax.Array  # [n_envs] the gate flow (the newest valid flow)
    initial_flow: jax.Array  # [n_envs] the flow in the whole channel at reset
    target: jax.Array  # [n_envs] the current target flows
    time: jax.Array  # [n_envs] int32 steps since reset

    @property
    def history(self) -> int:
        return self.changes.shape[-2] // 2

    @property
    def delay(self) -> int:
        return self.flows.shape[-2] // 2 - self.history - 1

    def flow_rows(self, first: int, count: int, mask: bool = True) -> jax.Array:
        """``[count, n_envs]``: the flows of ages ``first .. first + count - 1`` (with
        ``mask=False`` as stored: right only where every such age is within the episode)."""
        rows = _rows(self.flows, self.flow_cursor + first, count)
        if not mask:
            return rows
        return jnp.where(self._valid(first, count), rows, self.initial_flow[..., None, :])

    def change_rows(self, count: int, mask: bool = True) -> jax.Array:
        """``[count, n_envs]``: the gate changes of ages ``0 .. count - 1`` (``mask`` as
        for :meth:`flow_rows`)."""
        rows = _rows(self.changes, self.change_cursor, count)
        if not mask:
            return rows
        return jnp.where(self._valid(0, count), rows, 0.0)

    def _valid(self, first: int, count: int) -> jax.Array:
        ages = jnp.arange(first, first + count, dtype=jnp.int32)[:, None]
        return ages < self.time[..., None, :]

    @property
    def channel(self) -> jax.Array:
        """``[n_envs, delay + 1]``: the flows in the channel, the gate's first."""
        return jnp.swapaxes(self.flow_rows(0, self.delay + 1), -1, -2)

    @property
    def downstream_history(self) -> jax.Array:
        """``[n_envs, history]``: past downstream flows, newest first."""
        return jnp.swapaxes(self.flow_rows(self.delay + 1, self.history), -1, -2)

    @property
    def action_history(self) -> jax.Array:
        """``[n_envs, history]``: gate changes applied, newest (current) first."""
        return jnp.swapaxes(self.change_rows(self.history), -1, -2)


def _rows(ring: jax.Array, first: jax.Array, count: int) -> jax.Array:
    """``ring[..., first : first + count, :]`` for a traced ``first`` (within bounds): a
    gather of whole rows, which XLA's CPU backend copies as blocks, where a dynamic slice
    fused into the observation is computed element by element (several times slower)."""
    indices = first[..., None] + jnp.arange(count, dtype=jnp.int32)
    if ring.ndim == 2:
        return jnp.take(
            ring, indices, axis=0, mode="clip", unique_indices=True, indices_are_sorted=True
        )
    return jax.vmap(_rows, in_axes=(0, 0, None))(ring, first, count)


class Pipeline(UniformNoiseEnvironment[PipelineState, PipelineParams]):
    """NeoRL-2's Pipeline task; see the module docstring.

    Args:
        delay: steps from the gate to the outlet (the channel has ``delay + 1`` slots).
        history: past downstream flows, and actions, in an observation.
        auto_reset: restart finished episodes inside ``step``.
    """

    name = "Pipeline-v0"
    _static_fields = ("delay", "history", "auto_reset")
    #: A rollout of 4,096 under a uniform batch policy on one core: 34.7M -> 67.0M steps/s.
    older_cpu_fusion = True

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
    def exogenous_names(self) -> tuple[str, ...]:
        """The target flow (a schedule): no gate moves it."""
        return ("target_flow",)

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
        timestep = TimeStep.first(observation, self.n_costs, StepInfo.first(observation))
        return state, timestep

    def step_env(
        self, key: jax.Array, state: PipelineState, action: jax.Array, params: PipelineParams
    ) -> tuple[PipelineState, TimeStep]:
        return self.step_from_uniforms(
            fast_random.uniform(key, (N_UNIFORMS,)), state, action, params
        )

    @property
    def n_uniforms(self) -> int:
        return N_UNIFORMS

    def step_from_uniforms(
        self,
        uniforms: jax.Array,
        state: PipelineState,
        action: jax.Array,
        params: PipelineParams,
    ) -> tuple[PipelineState, TimeStep]:
        """One step with its randomness given: ``uniforms[0]`` decides whether a new target
        is drawn and which (:func:`next_target`)."""
        change, invalid = self.decode_action(action)
        # The reference updates the target before the flow: the reward of step k is
        # against the target observed with it.
        target = next_target(uniforms[0], state.target, params)
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

    # ----- batches: time-major rings (PipelineBatchState) --------------------------------
    def reset_batch(
        self, key: jax.Array, n_envs: int, params: PipelineParams | None = None
    ) -> tuple[PipelineBatchState, TimeStep]:
        """Resets ``n_envs`` copies (the draws of ``reset_env`` with the keys
        ``split(key, n_envs)``) into a :class:`PipelineBatchState`."""
        states, timesteps = super().reset_batch(key, n_envs, params)
        n_flows, n_changes = self.delay + self.history + 1, self.history
        initial_flow = states.channel[:, 0]
        batch = PipelineBatchState(
            flows=jnp.broadcast_to(initial_flow, (2 * n_flows, n_envs)),
            changes=jnp.zeros((2 * n_changes, n_envs), jnp.float32),
            flow_cursor=jnp.zeros((), jnp.int32),
            change_cursor=jnp.zeros((), jnp.int32),
            gate=initial_flow,
            initial_flow=initial_flow,
            target=states.target,
            time=states.time,
        )
        return batch, timesteps

    def step_env_batch(
        self,
        key: jax.Array,
        states: PipelineBatchState | PipelineState,
        actions: jax.Array,
        params: PipelineParams,
    ) -> tuple[PipelineBatchState | PipelineState, TimeStep]:
        """Steps a batch without auto-reset: one threefry call draws every environment's
        uniforms; a :class:`PipelineBatchState` writes one row of each ring, stacked
        :class:`PipelineState` are stepped one by one (``vmap``)."""
        uniforms = fast_random.uniform(key, (actions.shape[0], N_UNIFORMS))
        if isinstance(states, PipelineState):
            return jax.vmap(self.step_from_uniforms, in_axes=(0, 0, 0, None))(
                uniforms, states, actions, params
            )
        states, timestep = self._advance(uniforms, states, actions, params)
        observation = self.observe_batch(states)
        info = timestep.info.replace(final_observation=observation)
        return states, timestep.replace(observation=observation, info=info)

    def _advance(
        self,
        uniforms: jax.Array,
        states: PipelineBatchState,
        actions: jax.Array,
        params: PipelineParams,
    ) -> tuple[PipelineBatchState, TimeStep]:
        """A batch's step without its observation (``observation`` and
        ``final_observation`` are left None): one row written in each ring, and the
        reward and cost from the outlet's row alone."""
        change, invalid = jax.vmap(self.decode_action)(actions)
        target = next_target(uniforms[:, 0], states.target, params)
        gate = jnp.clip(states.gate + change, 0.0, params.max_flow)
        n_flows, n_changes = self.delay + self.history + 1, self.history
        flow_cursor = jnp.where(states.flow_cursor == 0, n_flows, states.flow_cursor) - 1
        change_cursor = jnp.where(states.change_cursor == 0, n_changes, states.change_cursor) - 1
        flows, changes = states.flows, states.changes
        for offset in (0, n_flows):
            flows = jax.lax.dynamic_update_index_in_dim(flows, gate, flow_cursor + offset, 0)
        for offset in (0, n_changes):
            changes = jax.lax.dynamic_update_index_in_dim(
                changes, change, change_cursor + offset, 0
            )
        states = states.replace(
            flows=flows,
            changes=changes,
            flow_cursor=flow_cursor,
            change_cursor=change_cursor,
            gate=gate,
            target=target,
            time=states.time + 1,
        )
        error = jnp.abs(states.flow_rows(self.delay, 1)[0] - target)
        timestep = TimeStep(
            observation=None,
            reward=(jnp.square(0.01 * (params.max_flow - error)) - 3.0).astype(jnp.float32),
            cost=(error > params.cost_band).astype(jnp.float32)[:, None],
            terminated=jnp.zeros(states.time.shape, jnp.bool_),
            truncated=states.time >= params.horizon,
            info=StepInfo(final_observation=None, action_invalid=invalid),
        )
        return states, timestep

    def observe_batch(self, states: PipelineBatchState) -> jax.Array:
        """``[n_envs, observation_size]``: :meth:`observe` of every environment, built
        time-major from the rings' windows and transposed once. Ages before an episode's
        start are replaced only while some environment has them in its observation (the
        first ``delay + history + 1`` steps of an episode)."""

        def build(mask: bool) -> Callable[[PipelineBatchState], jax.Array]:
            def observation(states: PipelineBatchState) -> jax.Array:
                flows = states.flow_rows(self.delay, self.history + 1, mask)
                changes = states.change_rows(self.history, mask)
                rows = [flows[:1], states.target[None], flows[1:], changes]
                return jnp.concatenate(rows, axis=0).T

            return observation

        young = jnp.any(states.time <= self.delay + self.history)
        return jax.lax.cond(young, build(True), build(False), states)

    def step_batch(
        self,
        key: jax.Array,
        states: PipelineBatchState | PipelineState,
        actions: jax.Array,
        params: PipelineParams | None = None,
    ) -> tuple[PipelineBatchState | PipelineState, TimeStep]:
        """:meth:`Environment.step_batch` for either layout. A finished environment of a
        :class:`PipelineBatchState` restarts without touching the rings (its time, gate,
        initial flow and target are reset, and its observation, built after the reset,
        is the new episode's first); ``info.final_observation`` is built only where it is
        used."""
        if isinstance(states, PipelineState):
            stacked_reset = super().reset_batch
            return self._step_batch_restarting(stacked_reset, key, states, actions, params)
        if not self.auto_reset:
            return super().step_batch(key, states, actions, params)
        params = self.default_params() if params is None else params
        step_key, reset_key = jax.random.split(key)
        uniforms = fast_random.uniform(step_key, (actions.shape[0], N_UNIFORMS))
        stepped, timestep = self._advance(uniforms, states, actions, params)
        done = timestep.done

        def restart(small):
            gate, initial_flow, target, time = small
            fresh, _ = super(Pipeline, self).reset_batch(reset_key, done.shape[0], params)
            flow = fresh.channel[:, 0]
            return (
                jnp.where(done, flow, gate),
                jnp.where(done, flow, initial_flow),
                jnp.where(done, fresh.target, target),
                jnp.where(done, 0, time),
            )

        small = (stepped.gate, stepped.initial_flow, stepped.target, stepped.time)
        gate, initial_flow, target, time = jax.lax.cond(
            jnp.any(done), restart, lambda small: small, small
        )
        states = stepped.replace(gate=gate, initial_flow=initial_flow, target=target, time=time)
        observation = self.observe_batch(states)
        final = jax.lax.cond(
            jnp.any(done),
            lambda: jnp.where(done[:, None], self.observe_batch(stepped), observation),
            lambda: observation,
        )
        info = timestep.info.replace(final_observation=final)
        return states, timestep.replace(observation=observation, info=info)
