"""A ``gymnasium.vector.VectorEnv`` that steps N functional environments in one jitted call."""

from __future__ import annotations

from functools import partial
from typing import Any, ClassVar

import gymnasium
import jax
import numpy as np

try:  # Gymnasium >= 1.1 names the autoreset modes; 1.0 has only next-step semantics.
    from gymnasium.vector import AutoresetMode

    _SAME_STEP: dict[str, Any] = {"autoreset_mode": AutoresetMode.SAME_STEP}
except ImportError:  # pragma: no cover - exercised only with Gymnasium 1.0
    _SAME_STEP = {}
from gymnasium.vector.utils import batch_space

from neorl_industrial.core.environments import Environment, make
from neorl_industrial.wrappers.environments.gymnasium_env import (
    action_space,
    observation_space,
    resolve_normalized_actions,
    to_plant_units,
    validate_action,
)


@partial(jax.jit, static_argnums=(0, 2))
def _reset_batch(env: Environment, key: jax.Array, n_envs: int, params: Any):
    key, reset_key = jax.random.split(key)
    states, timesteps = env.reset_batch(reset_key, n_envs, params)
    return key, states, timesteps


@partial(jax.jit, static_argnums=0, donate_argnums=2)
def _step_batch(env: Environment, key: jax.Array, states: Any, actions: jax.Array, params: Any):
    key, step_key = jax.random.split(key)
    states, timesteps = env.step_batch(step_key, states, actions, params)
    return key, states, timesteps


class VectorEnv(gymnasium.vector.VectorEnv):
    """``num_envs`` copies of a registered environment, auto-reset in the same step.

    Finished episodes restart inside ``step``; the observation that ended them is in
    ``info["final_obs"]`` where ``info["_final_obs"]`` is True (Gymnasium's SAME_STEP mode).

    Args:
        num_envs: number of environments.
        env_id: a registered environment name.
        normalize_actions: act in [-1, 1] (mapped to the task's bounds), as for
            :class:`GymnasiumEnv`; ``None``: only where the bounds are not [-1, 1].
        **overrides: static configuration and parameters, as for ``make``.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": [], **_SAME_STEP}

    def __init__(
        self,
        num_envs: int,
        env_id: str = "IB-v0",
        normalize_actions: bool | None = None,
        **overrides: Any,
    ):
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs: expected a positive integer, got {num_envs!r}")
        self.env, self.params = make(env_id, auto_reset=True, **overrides)
        self.num_envs = num_envs
        self.single_observation_space = observation_space(self.env)
        self.normalize_actions = resolve_normalized_actions(self.env, normalize_actions)
        self.single_action_space = action_space(self.env, self.normalize_actions)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.render_mode = None
        self._key: jax.Array | None = None
        self._states: Any = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if isinstance(seed, list | tuple):
            raise ValueError("seed: one integer seeds all environments of a VectorEnv")
        super().reset(seed=seed)
        if seed is not None or self._key is None:
            self._key = jax.random.PRNGKey(int(self.np_random.integers(0, 2**31 - 1)))
        self._key, self._states, timesteps = _reset_batch(
            self.env, self._key, self.num_envs, self.params
        )
        observation, cost = jax.device_get((timesteps.observation, timesteps.cost))
        return np.asarray(observation, np.float32), {"cost": cost}

    def step(self, actions: Any):
        if self._states is None:
            raise RuntimeError("step() called before reset()")
        actions = validate_action(self.env, actions, (self.num_envs,))
        if self.normalize_actions:
            actions = to_plant_units(self.env, actions)
        self._key, self._states, ts = _step_batch(
            self.env, self._key, self._states, actions, self.params
        )
        observation, reward, terminated, truncated, cost, invalid, final = jax.device_get(
            (
                ts.observation,
                ts.reward,
                ts.terminated,
                ts.truncated,
                ts.cost,
                ts.info.action_invalid,
                ts.info.final_observation,
            )
        )
        done = np.logical_or(terminated, truncated)
        info: dict[str, Any] = {"cost": cost, "action_invalid": invalid}
        if done.any():
            info["final_obs"] = np.asarray(final, np.float32)
            info["_final_obs"] = done
        return (
            np.asarray(observation, np.float32),
            np.asarray(reward, np.float32),
            np.asarray(terminated, np.bool_),
            np.asarray(truncated, np.bool_),
            info,
        )
