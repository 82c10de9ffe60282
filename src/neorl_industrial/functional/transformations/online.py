"""Online training of an off-policy agent on a functional environment, scan-fused.

One *chunk* is a single compiled ``lax.scan``: each iteration steps ``n_envs``
environments with the current stochastic policy, writes the transitions into a
device-resident circular replay buffer and applies a fixed number of gradient updates.
Between chunks the host evaluates the deterministic policy, records the result, keeps a
copy of the policy (so that policies of graded quality can be picked afterwards, as for
NeoRL-style behaviour datasets) and calls an optional progress callback.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from neorl_industrial.core.agents.sac import Algorithm, Batch, PolicyParams
from neorl_industrial.core.environments import (
    Environment,
    registered_id,
    rollout,
    uniform_random_policy,
)
from neorl_industrial.functional.state_management.train_state import donatable
from neorl_industrial.functional.transformations.action_scaling import normalized_actions

ProgressFn = Callable[[int, dict[str, float]], None]


# ----- replay buffer ---------------------------------------------------------------------
@struct.dataclass
class ReplayBuffer:
    """A circular buffer of transitions held on the device.

    Every leaf of ``data`` has the capacity as its leading axis; the capacity is therefore
    a static shape, never a traced number.

    Attributes:
        data: the stored items, e.g. a :class:`Batch` of ``[capacity, ...]`` leaves.
        position: int32 row the next item is written to.
        size: int32 number of rows holding data.
    """

    data: Any
    position: jax.Array
    size: jax.Array

    @property
    def capacity(self) -> int:
        return jax.tree.leaves(self.data)[0].shape[0]


def replay_buffer_init(example: Any, capacity: int) -> ReplayBuffer:
    """An empty buffer for items shaped like ``example`` (one item, no batch axis)."""
    if capacity < 1:
        raise ValueError(f"capacity: expected a positive integer, got {capacity}")
    data = jax.tree.map(
        lambda leaf: jnp.zeros((capacity, *jnp.shape(leaf)), jnp.result_type(leaf)), example
    )
    return ReplayBuffer(data=data, position=jnp.zeros((), jnp.int32), size=jnp.zeros((), jnp.int32))


def replay_buffer_add(buffer: ReplayBuffer, items: Any) -> ReplayBuffer:
    """Writes ``items`` (leaves ``[n, ...]``) at the write position, overwriting the oldest.

    The capacity must be a multiple of ``n``: writes then start at multiples of ``n`` and
    never straddle the end, so each leaf is updated by one ``dynamic_update_slice``.

    Raises:
        ValueError: at trace time, when ``n`` does not divide the capacity.
    """
    n_items = jax.tree.leaves(items)[0].shape[0]
    capacity = buffer.capacity
    if capacity % n_items:
        raise ValueError(
            f"capacity: a buffer of {capacity} rows cannot take batches of {n_items}; "
            f"use a multiple of {n_items}"
        )

    def write(stored: jax.Array, new: jax.Array) -> jax.Array:
        start = (buffer.position,) + (0,) * (stored.ndim - 1)
        return jax.lax.dynamic_update_slice(stored, new.astype(stored.dtype), start)

    return ReplayBuffer(
        data=jax.tree.map(write, buffer.data, items),
        position=(buffer.position + n_items) % capacity,
        size=jnp.minimum(buffer.size + n_items, capacity),
    )


def replay_buffer_sample(buffer: ReplayBuffer, key: jax.Array, batch_size: int) -> Any:
    """Draws ``batch_size`` stored items uniformly, with replacement.

    The buffer must hold at least one item.
    """
    indices = jax.random.randint(key, (batch_size,), 0, jnp.maximum(buffer.size, 1))
    return jax.tree.map(lambda stored: stored[indices], buffer.data)


# ----- statistics for normalization ------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RolloutStatistics:
    """Per-feature observation and per-step reward statistics of a rollout."""

    obs_mean: np.ndarray
    obs_std: np.ndarray
    reward_mean: float
    reward_std: float


def random_rollout_statistics(
    key: jax.Array, env: Environment, params: Any, n_envs: int = 16, n_steps: int = 1000
) -> RolloutStatistics:
    """Observation and reward statistics under the uniformly random policy.

    These fix the agent's observation normalization (``SACConfig.obs_mean``/``obs_std``)
    and suggest its reward scaling before any learning has happened.
    """
    result = jax.jit(
        functools.partial(
            rollout,
            env=env,
            policy=uniform_random_policy(env),
            n_envs=n_envs,
            n_steps=n_steps,
            record=True,
        )
    )(key, params=params)
    observations = np.asarray(result.transitions.observation).reshape(-1, env.observation_size)
    rewards = np.asarray(result.transitions.reward)
    return RolloutStatistics(
        obs_mean=observations.mean(0),
        obs_std=observations.std(0),
        reward_mean=float(rewards.mean()),
        reward_std=float(rewards.std()),
    )


# ----- the training loop -------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class OnlineConfig:
    """Budget and schedule of online training.

    Attributes:
        n_envs: environments stepped together.
        total_env_steps: environment steps over all environments, warm-up included;
            rounded down to whole chunks.
        updates_per_step: gradient updates per environment step; ``updates_per_step *
            n_envs`` updates follow each batched step and must be a whole number.
        warmup_steps: environment steps with uniformly random actions before learning.
        eval_every: environment steps per chunk; the policy is evaluated after each.
        eval_episodes: episodes of the deterministic policy per evaluation.
        eval_steps: length of an evaluation episode; ``None`` for ``params.horizon``.
        batch_size: transitions per gradient update.
        buffer_capacity: replay capacity, capped at ``total_env_steps`` and rounded up to
            a multiple of ``n_envs``.
        seed: seed of the run when no key is given to :func:`train_online`.
    """

    n_envs: int = 16
    total_env_steps: int = 200_000
    updates_per_step: float = 0.25
    warmup_steps: int = 4_800
    eval_every: int = 9_600
    eval_episodes: int = 16
    eval_steps: int | None = None
    batch_size: int = 256
    buffer_capacity: int = 1_000_000
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("n_envs", "total_env_steps", "eval_every", "eval_episodes", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        for name in ("warmup_steps", "eval_every"):
            if getattr(self, name) % self.n_envs:
                raise ValueError(
                    f"{name}: {getattr(self, name)} is not a multiple of n_envs={self.n_envs}"
                )
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps: must not be negative, got {self.warmup_steps}")
        if self.total_env_steps - self.warmup_steps < self.eval_every:
            raise ValueError(
                f"total_env_steps: {self.total_env_steps} leaves less than one chunk "
                f"(eval_every={self.eval_every}) after warmup_steps={self.warmup_steps}"
            )
        updates = self.updates_per_step * self.n_envs
        if updates < 1 or not math.isclose(updates, round(updates)):
            raise ValueError(
                f"updates_per_step: {self.updates_per_step} x n_envs={self.n_envs} must be "
                f"a whole number of updates per batched step (at least 1)"
            )
        if self.eval_steps is not None and self.eval_steps < 1:
            raise ValueError(f"eval_steps: expected a positive integer, got {self.eval_steps}")
        if self.buffer_capacity < 1:
            raise ValueError(
                f"buffer_capacity: expected a positive integer, got {self.buffer_capacity}"
            )

    @property
    def updates_per_iteration(self) -> int:
        return round(self.updates_per_step * self.n_envs)

    @property
    def n_chunks(self) -> int:
        return (self.total_env_steps - self.warmup_steps) // self.eval_every


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One evaluation of the deterministic policy during training.

    Attributes:
        env_steps: environment steps taken before it, warm-up included.
        updates: gradient updates applied before it.
        mean_return: mean return per episode.
        return_per_step: ``mean_return`` divided by the evaluation length ``eval_steps``;
            the mean reward per step for tasks that only truncate, such as the Industrial
            Benchmark.
        mean_cost: mean cost per episode, one value per cost channel.
        wall_time_s: seconds since training started.
        policy: a host copy of the evaluated policy's parameters.
    """

    env_steps: int
    updates: int
    mean_return: float
    return_per_step: float
    mean_cost: tuple[float, ...]
    wall_time_s: float
    policy: PolicyParams


@dataclasses.dataclass
class OnlineHistory:
    """What :func:`train_online` recorded: evaluations with policy snapshots, and the
    metrics of every chunk."""

    evaluations: list[Evaluation] = dataclasses.field(default_factory=list)
    chunk_metrics: list[dict[str, float]] = dataclasses.field(default_factory=list)

    def best(self) -> Evaluation:
        """The evaluation with the highest mean return."""
        return max(self.evaluations, key=lambda evaluation: evaluation.mean_return)

    def closest(self, return_per_step: float) -> Evaluation:
        """The evaluation whose return per step is closest to ``return_per_step``; picks a
        behaviour policy of a given quality."""
        return min(
            self.evaluations,
            key=lambda evaluation: abs(evaluation.return_per_step - return_per_step),
        )


@struct.dataclass
class OnlineCarry:
    """Everything a chunk advances: the agent, its replay buffer and the environments.

    Attributes:
        agent: the agent's training state.
        buffer: replay buffer of :class:`Batch` items.
        env_states: states of the ``n_envs`` environments.
        observations: ``[n_envs, obs_size]`` their current observations.
    """

    agent: Any
    buffer: ReplayBuffer
    env_states: Any
    observations: jax.Array


def init_carry(
    key: jax.Array, env: Environment, params: Any, sac: Algorithm, config: OnlineConfig
) -> OnlineCarry:
    """A fresh agent, an empty replay buffer and ``n_envs`` freshly reset environments.

    The buffer holds ``buffer_capacity`` transitions, capped at ``total_env_steps`` and
    rounded up to a multiple of ``n_envs``.
    """
    init_key, reset_key = jax.random.split(key)
    n_envs = config.n_envs
    capacity = n_envs * math.ceil(min(config.buffer_capacity, config.total_env_steps) / n_envs)
    env_states, timestep = env.reset_batch(reset_key, n_envs, params)
    example = Batch(
        observations=timestep.observation[0],
        actions=jnp.zeros((env.action_size,), jnp.float32),
        rewards=timestep.reward[0],
        next_observations=timestep.observation[0],
        discounts=jnp.zeros((), jnp.float32),
    )
    carry = OnlineCarry(
        agent=sac.init(init_key),
        buffer=replay_buffer_init(example, capacity),
        env_states=env_states,
        observations=timestep.observation,
    )
    # The carry is donated to every chunk, and donation fails on leaves that share one
    # device buffer (an agent may alias arrays in its state), so each leaf gets its own.
    return donatable(carry)


def make_chunk(
    env: Environment, sac: Algorithm, config: OnlineConfig, n_iterations: int, learn: bool
) -> Callable[[OnlineCarry, jax.Array, Any], tuple[OnlineCarry, dict[str, jax.Array]]]:
    """A pure function running ``n_iterations`` of collect-and-update as one ``lax.scan``.

    With ``learn`` False the actions are uniformly random and no update is made (warm-up).
    Returned metrics are averaged over the chunk, so they leave the device as one small
    PyTree.
    """
    random_policy = jax.vmap(uniform_random_policy(env), in_axes=(None, 0, 0))
    n_envs = config.n_envs

    def chunk(
        carry: OnlineCarry, key: jax.Array, params: Any
    ) -> tuple[OnlineCarry, dict[str, jax.Array]]:
        def iteration(
            carry: OnlineCarry, key: jax.Array
        ) -> tuple[OnlineCarry, dict[str, jax.Array]]:
            act_key, env_key, update_key = jax.random.split(key, 3)
            if learn:
                actions = sac.act(carry.agent.policy, carry.observations, act_key)
            else:
                act_keys = jax.random.split(act_key, n_envs)
                actions = random_policy(None, carry.observations, act_keys)
            env_states, timestep = env.step_batch(env_key, carry.env_states, actions, params)
            # Truncation by a time limit is not a terminal state, so it keeps bootstrapping;
            # on auto-reset the true next observation is the final one, not the new episode's.
            transitions = Batch(
                observations=carry.observations,
                actions=actions,
                rewards=timestep.reward,
                next_observations=timestep.info.final_observation,
                discounts=1.0 - timestep.terminated.astype(jnp.float32),
            )
            buffer = replay_buffer_add(carry.buffer, transitions)
            metrics = {"train_reward_mean": jnp.mean(timestep.reward)}
            agent = carry.agent
            if learn:

                def update(agent: Any, key: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
                    sample_key, step_key = jax.random.split(key)
                    batch = replay_buffer_sample(buffer, sample_key, config.batch_size)
                    return sac.update(agent, batch, step_key)

                update_keys = jax.random.split(update_key, config.updates_per_iteration)
                agent, update_metrics = jax.lax.scan(update, agent, update_keys)
                metrics.update(jax.tree.map(jnp.mean, update_metrics))
            carry = OnlineCarry(
                agent=agent,
                buffer=buffer,
                env_states=env_states,
                observations=timestep.observation,
            )
            return carry, metrics

        carry, metrics = jax.lax.scan(iteration, carry, jax.random.split(key, n_iterations))
        return carry, jax.tree.map(jnp.mean, metrics)

    return chunk


def train_online(
    key: jax.Array | None,
    env: Environment,
    params: Any,
    sac: Algorithm,
    config: OnlineConfig,
    *,
    progress: ProgressFn | None = None,
) -> tuple[Any, OnlineHistory]:
    """Trains ``sac`` online on ``env`` and records evaluations with policy snapshots.

    The run is ``warm-up chunk, evaluation, (learning chunk, evaluation) x n_chunks``.
    Each chunk is one jitted ``lax.scan``; the learning chunk compiles once and its input
    state is donated, so the replay buffer is updated in place between chunks.

    Args:
        key: PRNG key of the run; ``None`` uses ``config.seed``.
        env: a continuous-action environment. The agent acts in [-1, 1]; an environment
            with other bounds (plant units) is driven through its action scaler
            (:func:`normalized_actions`), so the returned policy acts in [-1, 1] and
            ``with_action_scaling`` maps it to plant units.
        params: environment parameters.
        sac: the agent (``make_sac``); any ``Algorithm`` whose state has ``policy`` and
            whose ``act`` takes ``deterministic`` works.
        config: budget and schedule.
        progress: called on the host after every chunk with its index and metrics.

    Returns:
        ``(agent_state, history)``.
    """
    env = _agent_action_space(env)
    eval_steps = _evaluation_length(config, params)
    if key is None:
        key = jax.random.key(config.seed)
    carry_key, warmup_key, loop_key = jax.random.split(key, 3)
    n_envs = config.n_envs
    carry = init_carry(carry_key, env, params, sac, config)

    iterations = config.eval_every // n_envs
    learning_chunk = jax.jit(
        make_chunk(env, sac, config, iterations, learn=True), donate_argnums=(0,)
    )
    evaluate = jax.jit(
        functools.partial(
            rollout,
            env=env,
            policy=functools.partial(sac.act, deterministic=True),
            n_envs=config.eval_episodes,
            n_steps=eval_steps,
        )
    )

    history = OnlineHistory()
    record = _Recorder(history, evaluate, env, params, eval_steps, progress)
    env_steps = 0
    updates = 0

    warmup_key, eval_key = jax.random.split(warmup_key)
    if config.warmup_steps:
        warmup_chunk = jax.jit(
            make_chunk(env, sac, config, config.warmup_steps // n_envs, learn=False),
            donate_argnums=(0,),
        )
        carry, metrics = warmup_chunk(carry, warmup_key, params)
        env_steps += config.warmup_steps
    else:
        metrics = {}
    record(0, _to_host(metrics), carry.agent.policy, eval_key, env_steps, updates)

    for chunk_index in range(1, config.n_chunks + 1):
        chunk_key, eval_key = jax.random.split(jax.random.fold_in(loop_key, chunk_index))
        chunk_start = time.perf_counter()
        carry, metrics = learning_chunk(carry, chunk_key, params)
        metrics = _to_host(metrics)
        chunk_seconds = time.perf_counter() - chunk_start
        env_steps += config.eval_every
        updates += iterations * config.updates_per_iteration
        metrics["chunk_s"] = chunk_seconds
        metrics["env_steps_per_s"] = config.eval_every / chunk_seconds
        metrics["updates_per_s"] = iterations * config.updates_per_iteration / chunk_seconds
        record(chunk_index, metrics, carry.agent.policy, eval_key, env_steps, updates)

    return carry.agent, history


@dataclasses.dataclass
class _Recorder:
    """Evaluates a policy snapshot after a chunk and records it with the chunk's metrics
    in ``history`` (and hands them to ``progress``)."""

    history: OnlineHistory
    evaluate: Callable[..., Any]
    env: Environment
    params: Any
    eval_steps: int
    progress: ProgressFn | None
    start: float = dataclasses.field(default_factory=time.perf_counter)

    def __call__(
        self,
        chunk_index: int,
        metrics: dict[str, float],
        policy: PolicyParams,
        eval_key: jax.Array,
        env_steps: int,
        updates: int,
    ) -> None:
        result = self.evaluate(eval_key, params=self.params, policy_params=policy)
        mean_return = float(result.mean_episode_return())
        evaluation = Evaluation(
            env_steps=env_steps,
            updates=updates,
            mean_return=mean_return,
            return_per_step=mean_return / self.eval_steps,
            mean_cost=tuple(float(c) for c in np.asarray(result.mean_episode_cost())),
            wall_time_s=time.perf_counter() - self.start,
            policy=jax.device_get(policy),
        )
        self.history.evaluations.append(evaluation)
        metrics = {
            **metrics,
            "env_steps": float(env_steps),
            "updates": float(updates),
            "eval_return": evaluation.mean_return,
            "eval_return_per_step": evaluation.return_per_step,
            **{
                f"eval_cost_{name}": cost
                for name, cost in zip(self.env.cost_names, evaluation.mean_cost, strict=True)
            },
            "wall_time_s": evaluation.wall_time_s,
        }
        self.history.chunk_metrics.append(metrics)
        if self.progress is not None:
            self.progress(chunk_index, metrics)


def _to_host(metrics: dict[str, jax.Array]) -> dict[str, float]:
    return {name: float(value) for name, value in jax.device_get(metrics).items()}


def _agent_action_space(env: Environment) -> Environment:
    if env.discrete:
        raise ValueError(
            f"env: {registered_id(env)} has discrete actions; online SAC needs continuous ones"
        )
    return normalized_actions(env)


def _evaluation_length(config: OnlineConfig, params: Any) -> int:
    if config.eval_steps is not None:
        return config.eval_steps
    horizon = getattr(params, "horizon", None)
    if horizon is None:
        raise ValueError("eval_steps: the environment parameters have no horizon; set eval_steps")
    return int(horizon)
