"""Online training: the replay buffer, scan-fused chunks and learning on a toy task."""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from neorl_industrial.core.agents.sac import SACConfig, make_sac
from neorl_industrial.core.environments import Environment, StepInfo, TimeStep
from neorl_industrial.functional.transformations import (
    OnlineConfig,
    init_carry,
    make_chunk,
    replay_buffer_add,
    replay_buffer_init,
    replay_buffer_sample,
    train_online,
)

STEP_SIZE = 0.2
TARGET = 0.5
FALL_OFF = 1.5


@struct.dataclass
class PointParams:
    horizon: jax.Array


@struct.dataclass
class PointState:
    position: jax.Array
    time: jax.Array


class PointEnv(Environment[PointState, PointParams]):
    """A point on a line: each step moves it by ``0.2 * action`` and earns
    ``1 - |position - 0.5|``; leaving [-1.5, 1.5] terminates the episode."""

    name = "Point"

    @property
    def observation_size(self) -> int:
        return 1

    @property
    def action_size(self) -> int:
        return 1

    @property
    def action_low(self) -> np.ndarray:
        return -np.ones(1, np.float32)

    @property
    def action_high(self) -> np.ndarray:
        return np.ones(1, np.float32)

    @property
    def observation_low(self) -> np.ndarray:
        return np.full(1, -2.0, np.float32)

    @property
    def observation_high(self) -> np.ndarray:
        return np.full(1, 2.0, np.float32)

    @property
    def cost_names(self) -> tuple[str, ...]:
        return ("off_target",)

    def default_params(self, horizon: int = 20) -> PointParams:
        return PointParams(horizon=jnp.asarray(horizon, jnp.int32))

    def _timestep(self, state: PointState, reward, terminated, truncated) -> TimeStep:
        observation = state.position[None]
        return TimeStep(
            observation=observation,
            reward=jnp.asarray(reward, jnp.float32),
            cost=(jnp.abs(state.position - TARGET) > 0.25).astype(jnp.float32)[None],
            terminated=terminated,
            truncated=truncated,
            info=StepInfo(final_observation=observation, action_invalid=jnp.zeros((), bool)),
        )

    def reset_env(self, key: jax.Array, params: PointParams) -> tuple[PointState, TimeStep]:
        state = PointState(
            position=jax.random.uniform(key, (), minval=-1.0, maxval=1.0),
            time=jnp.zeros((), jnp.int32),
        )
        false = jnp.zeros((), bool)
        return state, self._timestep(state, 0.0, false, false)

    def step_env(
        self, key: jax.Array, state: PointState, action: jax.Array, params: PointParams
    ) -> tuple[PointState, TimeStep]:
        del key
        position = state.position + STEP_SIZE * jnp.clip(action[0], -1.0, 1.0)
        state = PointState(position=position, time=state.time + 1)
        reward = 1.0 - jnp.abs(position - TARGET)
        terminated = jnp.abs(position) > FALL_OFF
        return state, self._timestep(state, reward, terminated, state.time >= params.horizon)


SMALL_SAC = SACConfig(hidden=(32, 32), gamma=0.9, actor_lr=1e-3, critic_lr=1e-3)


# ----- replay buffer ----------------------------------------------------------------------
def test_replay_buffer_wraps_around_and_overwrites_the_oldest_rows():
    buffer = replay_buffer_init({"x": jnp.zeros(()), "y": jnp.zeros((2,), jnp.int32)}, 8)
    add = jax.jit(replay_buffer_add)
    for start in range(0, 12, 4):
        values = jnp.arange(start, start + 4)
        buffer = add(buffer, {"x": values.astype(jnp.float32), "y": jnp.stack([values] * 2, 1)})
    np.testing.assert_array_equal(buffer.data["x"], [8, 9, 10, 11, 4, 5, 6, 7])
    np.testing.assert_array_equal(buffer.data["y"][:, 1], [8, 9, 10, 11, 4, 5, 6, 7])
    assert int(buffer.position) == 4 and int(buffer.size) == 8
    buffer = add(buffer, {"x": jnp.full(4, 12.0), "y": jnp.full((4, 2), 12, jnp.int32)})
    np.testing.assert_array_equal(buffer.data["x"], [8, 9, 10, 11, 12, 12, 12, 12])
    assert int(buffer.position) == 0 and int(buffer.size) == 8
    with pytest.raises(ValueError, match="multiple of 3"):
        replay_buffer_add(buffer, {"x": jnp.zeros(3), "y": jnp.zeros((3, 2), jnp.int32)})


def test_replay_buffer_samples_only_filled_rows_and_all_of_them():
    buffer = replay_buffer_init(jnp.zeros(()), 16)
    buffer = replay_buffer_add(buffer, jnp.arange(1.0, 5.0))
    samples = jax.jit(replay_buffer_sample, static_argnums=2)(buffer, jax.random.key(0), 4000)
    assert samples.shape == (4000,)
    values, counts = np.unique(np.asarray(samples), return_counts=True)
    np.testing.assert_array_equal(values, [1, 2, 3, 4])
    assert counts.min() > 850  # uniform: about 1000 each


# ----- chunks -----------------------------------------------------------------------------
def test_collected_transitions_keep_the_final_observation_and_bootstrap_through_truncation():
    env, params = PointEnv(), PointEnv().default_params(horizon=5)
    config = OnlineConfig(n_envs=4, total_env_steps=80, warmup_steps=40, eval_every=40)
    sac = make_sac(SMALL_SAC, 1, 1)
    carry = init_carry(jax.random.key(0), env, params, sac, config)
    chunk = jax.jit(make_chunk(env, sac, config, n_iterations=10, learn=False))
    carry, _ = chunk(carry, jax.random.key(1), params)
    assert int(carry.buffer.size) == 40
    data = jax.tree.map(
        lambda leaf: np.asarray(leaf[:40]).reshape(10, 4, *leaf.shape[1:]), carry.buffer.data
    )
    # Every stored next observation follows from its observation and action, also on the
    # steps that ended an episode (where the environment already restarted).
    expected = data.observations + STEP_SIZE * np.clip(data.actions, -1, 1)
    np.testing.assert_allclose(data.next_observations, expected, atol=1e-6)
    terminated = np.abs(data.next_observations[..., 0]) > FALL_OFF
    np.testing.assert_array_equal(data.discounts, 1.0 - terminated)
    # Truncated steps (every 5th step of an episode that did not fall off) keep
    # bootstrapping, and the next row starts a new episode elsewhere.
    assert data.discounts[4].sum() > 0
    restarted = data.observations[5] != data.next_observations[4]
    assert restarted.all()


def test_the_learning_chunk_compiles_once():
    env, params = PointEnv(), PointEnv().default_params()
    sac = make_sac(SMALL_SAC, 1, 1)
    traces = []

    def counting_update(state, batch, key):
        traces.append(1)
        return sac.update(state, batch, key)

    traces_after_chunk = []
    config = OnlineConfig(
        n_envs=4, total_env_steps=200, warmup_steps=40, eval_every=40, eval_episodes=4
    )
    _, history = train_online(
        jax.random.key(0),
        env,
        params,
        sac._replace(update=counting_update),
        config,
        progress=lambda index, metrics: traces_after_chunk.append(len(traces)),
    )
    # Warm-up makes no update; the first learning chunk traces the update once and the
    # next three reuse the compiled chunk.
    assert traces_after_chunk == [0, 1, 1, 1, 1]
    assert [evaluation.env_steps for evaluation in history.evaluations] == [40, 80, 120, 160, 200]
    assert [evaluation.updates for evaluation in history.evaluations] == [0, 10, 20, 30, 40]


def test_same_seed_gives_identical_training():
    env, params = PointEnv(), PointEnv().default_params()
    sac = make_sac(SMALL_SAC, 1, 1)
    config = OnlineConfig(
        n_envs=4, total_env_steps=120, warmup_steps=40, eval_every=40, eval_episodes=4, seed=7
    )
    first_state, first_history = train_online(None, env, params, sac, config)
    second_state, second_history = train_online(None, env, params, sac, config)
    chex.assert_trees_all_equal(first_state, second_state)
    assert [e.mean_return for e in first_history.evaluations] == [
        e.mean_return for e in second_history.evaluations
    ]
    chex.assert_trees_all_equal(
        first_history.evaluations[-1].policy, second_history.evaluations[-1].policy
    )


def test_online_config_names_the_bad_field():
    with pytest.raises(ValueError, match="updates_per_step"):
        OnlineConfig(n_envs=16, updates_per_step=0.03)
    with pytest.raises(ValueError, match="eval_every"):
        OnlineConfig(n_envs=16, eval_every=1000)
    with pytest.raises(ValueError, match="total_env_steps"):
        OnlineConfig(n_envs=16, total_env_steps=8000, warmup_steps=4000, eval_every=8000)


# ----- learning ---------------------------------------------------------------------------
def _return_per_step(history: Any) -> list[float]:
    return [evaluation.return_per_step for evaluation in history.evaluations]


def test_sac_learns_to_hold_the_point_at_its_target():
    env, params = PointEnv(), PointEnv().default_params()
    sac = make_sac(SMALL_SAC, 1, 1)
    config = OnlineConfig(
        n_envs=8,
        total_env_steps=6_400,
        updates_per_step=0.5,
        warmup_steps=800,
        eval_every=800,
        eval_episodes=16,
        batch_size=128,
    )
    metrics = []
    _, history = train_online(
        jax.random.key(0), env, params, sac, config, progress=lambda i, m: metrics.append(m)
    )
    # A random walk from a uniform start earns about 0.3 per step; reaching the target
    # within a few steps and holding it earns about 0.9.
    returns = _return_per_step(history)
    assert returns[-1] > 0.8, returns
    assert history.best().return_per_step >= returns[-1]
    assert history.closest(returns[0]).env_steps == history.evaluations[0].env_steps
    # Snapshots are host copies that differ between evaluations.
    first, last = history.evaluations[0].policy, history.evaluations[-1].policy
    assert isinstance(jax.tree.leaves(last)[0], np.ndarray)
    assert not np.allclose(jax.tree.leaves(first.actor)[0], jax.tree.leaves(last.actor)[0])
    assert {"critic_loss", "alpha", "env_steps_per_s", "updates_per_s"} <= set(metrics[-1])
