"""A ``gymnasium.Env`` over a functional environment.

The shell holds the PRNG key, the environment state and the parameters; every reset and
step is one call of a jitted pure function followed by one transfer of its outputs to the
host.
"""

from __future__ import annotations

from functools import partial
from typing import Any, ClassVar

import gymnasium
import jax
import numpy as np
from gymnasium import spaces

from neorl_industrial.core.environments import Environment, make


@partial(jax.jit, static_argnums=0)
def _reset(env: Environment, key: jax.Array, params: Any):
    key, reset_key = jax.random.split(key)
    state, timestep = env.reset_env(reset_key, params)
    return key, state, timestep


@partial(jax.jit, static_argnums=0)
def _step(env: Environment, key: jax.Array, state: Any, action: jax.Array, params: Any):
    key, step_key = jax.random.split(key)
    state, timestep = env.step_env(step_key, state, action, params)
    return key, state, timestep


def observation_space(env: Environment) -> spaces.Box:
    return spaces.Box(
        low=env.observation_low,
        high=env.observation_high,
        shape=(env.observation_size,),
        dtype=np.float32,
    )


def action_space(env: Environment) -> spaces.Space:
    if env.discrete:
        return spaces.Discrete(env.num_actions)
    return spaces.Box(low=env.action_low, high=env.action_high, dtype=np.float32)


def validate_action(env: Environment, action: Any, batch_shape: tuple[int, ...] = ()) -> np.ndarray:
    """Converts a user's action to an array of the right shape, or raises ``ValueError``.

    Values are not checked: out-of-range actions are clipped and NaN/inf actions are
    replaced and flagged by the environment itself.
    """
    try:
        array = np.asarray(action, dtype=np.int32 if env.discrete else np.float32)
    except (TypeError, ValueError):
        raise ValueError(f"action: expected numbers, got {action!r}") from None
    expected = batch_shape if env.discrete else (*batch_shape, env.action_size)
    if env.discrete and array.shape == (*batch_shape, 1):
        array = array.reshape(expected)
    if array.shape != expected:
        raise ValueError(f"action: expected shape {expected}, got {array.shape}")
    return array


class GymnasiumEnv(gymnasium.Env):
    """Gymnasium interface to a registered functional environment.

    Args:
        env_id: a name from :func:`neorl_industrial.core.environments.registered_envs`.
        render_mode: only ``None`` is supported.
        **overrides: static configuration and parameters, as for ``make``.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, env_id: str = "IB-v0", render_mode: str | None = None, **overrides: Any):
        if render_mode is not None:
            raise ValueError(f"render_mode: {env_id} cannot render, got {render_mode!r}")
        self.env, self.params = make(env_id, **overrides)
        self.observation_space = observation_space(self.env)
        self.action_space = action_space(self.env)
        self.render_mode = None
        self._key: jax.Array | None = None
        self._state: Any = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if seed is not None or self._key is None:
            self._key = jax.random.PRNGKey(int(self.np_random.integers(0, 2**31 - 1)))
        self._key, self._state, timestep = _reset(self.env, self._key, self.params)
        observation, info = jax.device_get((timestep.observation, self._info(timestep)))
        return np.asarray(observation, np.float32), info

    def step(self, action: Any):
        if self._state is None:
            raise RuntimeError("step() called before reset()")
        action = validate_action(self.env, action)
        self._key, self._state, timestep = _step(
            self.env, self._key, self._state, action, self.params
        )
        observation, reward, terminated, truncated, info = jax.device_get(
            (
                timestep.observation,
                timestep.reward,
                timestep.terminated,
                timestep.truncated,
                self._info(timestep),
            )
        )
        return (
            np.asarray(observation, np.float32),
            float(reward),
            bool(terminated),
            bool(truncated),
            info,
        )

    def _info(self, timestep) -> dict[str, Any]:
        return {"cost": timestep.cost, "action_invalid": timestep.info.action_invalid}

    @property
    def state(self) -> Any:
        """The functional environment state (a PyTree), for inspection."""
        return self._state
