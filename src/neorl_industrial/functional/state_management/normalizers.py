"""Normalizers that travel with the data and, later, with the exported policy: observation
statistics, reward scales, and the action scaler between a plant's units and the
policy's [-1, 1]."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from neorl_industrial.core.agents.types import Algorithm
from neorl_industrial.functional.state_management.dataset import Dataset

#: Standard deviations below this are treated as constant features (kept unscaled).
MIN_STD = 1e-6


@struct.dataclass
class Normalizer:
    """Observation standardization and reward scaling."""

    observation_mean: jax.Array  # [obs_size]
    observation_std: jax.Array  # [obs_size]
    reward_scale: jax.Array  # scalar: rewards are multiplied by it

    @classmethod
    def identity(cls, observation_size: int) -> Normalizer:
        return cls(
            observation_mean=jnp.zeros((observation_size,), jnp.float32),
            observation_std=jnp.ones((observation_size,), jnp.float32),
            reward_scale=jnp.ones((), jnp.float32),
        )

    @classmethod
    def fit(cls, dataset: Dataset, reward: str = "std") -> Normalizer:
        """Fits observation statistics over the stored observations and a reward scale.

        Args:
            dataset: the data.
            reward: ``"std"`` scales rewards to unit standard deviation, ``"return"``
                scales the range of episode returns to 1000 (the IQL convention),
                ``"none"`` keeps them.
        """
        observations = dataset.observations
        mean = observations.mean(axis=0)
        std = observations.std(axis=0)
        std = jnp.where(std < MIN_STD, 1.0, std)
        if reward == "std":
            scale = 1.0 / jnp.maximum(dataset.rewards.std(), MIN_STD)
        elif reward == "return":
            returns = dataset.episode_returns()
            scale = 1000.0 / jnp.maximum(returns.max() - returns.min(), MIN_STD)
        elif reward == "none":
            scale = jnp.ones(())
        else:
            raise ValueError(f"reward: expected 'std', 'return' or 'none', got {reward!r}")
        return cls(
            observation_mean=mean.astype(jnp.float32),
            observation_std=std.astype(jnp.float32),
            reward_scale=jnp.asarray(scale, jnp.float32),
        )

    def normalize_observation(self, observation: jax.Array) -> jax.Array:
        return (observation - self.observation_mean) / self.observation_std

    def denormalize_observation(self, observation: jax.Array) -> jax.Array:
        return observation * self.observation_std + self.observation_mean

    def scale_reward(self, reward: jax.Array) -> jax.Array:
        return reward * self.reward_scale


@struct.dataclass
class ActionScaler:
    """Min-max scaling between a plant's action units ``[low, high]`` and the policy's
    ``[-1, 1]`` (d3rlpy's ``MinMaxActionScaler``): data is scaled for training, and the
    policy's actions are scaled back inside the policy, so it acts in plant units."""

    low: jax.Array  # [action_size]
    high: jax.Array  # [action_size]

    @classmethod
    def create(
        cls, low: Sequence[float], high: Sequence[float], names: Sequence[str] | None = None
    ) -> ActionScaler:
        """Raises ValueError naming the action whose range is not finite or has no width."""
        low_ = np.asarray(low, np.float64).reshape(-1)
        high_ = np.asarray(high, np.float64).reshape(-1)
        if low_.shape != high_.shape:
            raise ValueError(f"action bounds: {low_.size} lows for {high_.size} highs")
        names = list(names) if names is not None else [f"action_{i}" for i in range(low_.size)]
        for name, a, b in zip(names, low_, high_, strict=True):
            if not (np.isfinite(a) and np.isfinite(b)):
                raise ValueError(f"action bounds: {name!r} needs a finite range, got [{a}, {b}]")
            if not b > a:
                raise ValueError(
                    f"action bounds: {name!r} has a zero-width range [{a}, {b}]; an action "
                    "scaler needs high > low"
                )
        return cls(low=jnp.asarray(low_, jnp.float32), high=jnp.asarray(high_, jnp.float32))

    @staticmethod
    def is_identity(low: Sequence[float], high: Sequence[float]) -> bool:
        """Whether ``[low, high]`` is ``[-1, 1]`` for every action (no scaling needed)."""
        return bool(np.all(np.asarray(low) == -1.0) and np.all(np.asarray(high) == 1.0))

    def scale(self, action: jax.Array) -> jax.Array:
        """Plant units to [-1, 1] (clipped: float rounding at the bounds stays inside)."""
        scaled = 2.0 * (action - self.low) / (self.high - self.low) - 1.0
        return jnp.clip(scaled, -1.0, 1.0)

    def unscale(self, action: jax.Array) -> jax.Array:
        """[-1, 1] to plant units."""
        return self.low + (action + 1.0) * (0.5 * (self.high - self.low))


def with_action_scaling(algorithm: Algorithm, scaler: ActionScaler | None) -> Algorithm:
    """``algorithm`` whose ``act`` returns actions in plant units (``scaler.unscale`` of
    the policy's [-1, 1]); ``init`` and ``update`` are unchanged and train on actions
    scaled with ``scaler.scale``. None: ``algorithm`` itself."""
    if scaler is None:
        return algorithm
    act = algorithm.act

    def act_in_plant_units(
        policy_params: Any,
        observation: jax.Array,
        key: jax.Array | None = None,
        deterministic: bool = True,
    ) -> jax.Array:
        return scaler.unscale(act(policy_params, observation, key, deterministic=deterministic))

    return algorithm._replace(act=act_in_plant_units)
