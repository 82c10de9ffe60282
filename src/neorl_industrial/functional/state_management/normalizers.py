"""Normalizers that travel with the data and, later, with the exported policy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

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
