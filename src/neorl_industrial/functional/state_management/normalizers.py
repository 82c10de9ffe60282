"""What a training run does to its data's units: the reward scaling it trains with (recorded
with the run), and the action scaler between a plant's units and the policy's [-1, 1],
which travels with the exported policy."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from neorl_industrial.core.agents.networks import make_act
from neorl_industrial.core.agents.types import Algorithm
from neorl_industrial.functional.state_management.dataset import Dataset

#: Standard deviations below this are treated as constant features (kept unscaled).
MIN_STD = 1e-6


#: How rewards are scaled for training (the policy's own returns are never changed):
#:
#: * ``none``: as stored.
#: * ``std``: divided by their spread over the dataset's transitions.
#: * ``standardize``: ``(r - mean) / std`` (d3rlpy's ``StandardRewardScaler``). The shift
#:   changes the optimal policy where episodes end early (a terminal state stops paying the
#:   shifted reward), so it suits tasks that end by time limit only.
#: * ``return_range``: multiplied by ``1000 / (max - min)`` of the episodes' returns, the
#:   IQL paper's scaling for locomotion (d3rlpy's ``ReturnBasedRewardScaler(1000)``).
REWARD_SCALINGS = ("none", "std", "standardize", "return_range")


@dataclasses.dataclass(frozen=True)
class RewardScaling:
    """The affine map ``r -> (r + shift) * scale`` that a training run applies to rewards,
    fitted once on its data and recorded with the run (``to_dict``)."""

    kind: str
    shift: float
    scale: float

    @classmethod
    def fit(cls, dataset: Dataset, kind: str) -> RewardScaling:
        """The scaling ``kind`` (one of :data:`REWARD_SCALINGS`) fitted on ``dataset``.

        Raises:
            ValueError: for an unknown kind, or data whose rewards have no spread to scale
                by (all equal, or one episode for ``return_range``), naming what to use.
        """
        if kind not in REWARD_SCALINGS:
            raise ValueError(
                f"reward_scaling: expected one of {list(REWARD_SCALINGS)}, got {kind!r}"
            )
        if kind == "none":
            return cls(kind=kind, shift=0.0, scale=1.0)
        rewards = np.asarray(jax.device_get(dataset.rewards), np.float64)
        if kind in ("std", "standardize"):
            spread = float(rewards.std())
            if not spread > MIN_STD:
                raise ValueError(
                    f"reward_scaling {kind!r}: every reward in the data is {rewards[0]:.6g}, "
                    "there is no spread to scale by; use reward_scaling 'none'"
                )
            shift = -float(rewards.mean()) if kind == "standardize" else 0.0
            return cls(kind=kind, shift=shift, scale=1.0 / spread)
        returns = np.asarray(jax.device_get(dataset.episode_returns()), np.float64)
        span = float(returns.max() - returns.min()) if returns.size else 0.0
        if not span > MIN_STD:
            raise ValueError(
                f"reward_scaling 'return_range': the data's {returns.size} episode(s) have "
                "no spread of returns to scale by (it needs episodes with different "
                "returns); use reward_scaling 'std'"
            )
        return cls(kind=kind, shift=0.0, scale=1000.0 / span)

    def apply(self, dataset: Dataset) -> Dataset:
        """``dataset`` with its rewards scaled (costs are never scaled)."""
        if self.kind == "none":
            return dataset
        rewards = (dataset.rewards + self.shift) * self.scale
        return dataset.replace(rewards=rewards.astype(dataset.rewards.dtype))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "shift": self.shift, "scale": self.scale}


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

    def unscaled(params: Any, observation: jax.Array, key: Any, deterministic: bool) -> jax.Array:
        return scaler.unscale(act(params, observation, key, deterministic=deterministic))

    return algorithm._replace(act=make_act(unscaled))
