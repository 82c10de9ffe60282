"""One member of the plant model's ensemble: its hyperparameters (:class:`DynamicsConfig`)
and its network (:class:`GaussianDynamicsNetwork`), a Gaussian MLP (PETS, MBPO, MOPO)
from the normalized observation and the action to the mean and log standard deviation
of its targets and a termination logit."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from neorl_industrial.core.agents.networks import (
    FrozenConfig,
    check_layer_widths,
    check_positive,
    check_positive_int,
    dense,
)

__all__ = ["ACTIVATIONS", "DynamicsConfig", "GaussianDynamicsNetwork"]

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "swish": nn.swish,
    "relu": nn.relu,
    "tanh": jnp.tanh,
    "elu": nn.elu,
}


@dataclasses.dataclass(frozen=True)
class DynamicsConfig(FrozenConfig):
    """Hyperparameters of the ensemble. Static: changing one builds a new model.

    Defaults follow MBPO / MOPO in shape (7 members, the 5 best on held-out data kept,
    swish, Adam with a small weight decay), with two layers of 128 instead of four of 200:
    an update of the ensemble costs a sixth, so that a model fits on a 2-core CPU in a
    minute or two.
    """

    hidden: tuple[int, ...] = (128, 128)
    n_members: int = 7
    n_elites: int = 5
    learning_rate: float = 1e-3
    weight_decay: float = 2.5e-5
    activation: str = "swish"
    weight_init: str = "lecun"
    #: Soft bounds of the predicted log standard deviation (normalized units).
    min_log_std: float = -10.0
    max_log_std: float = 0.5

    def __post_init__(self) -> None:
        check_layer_widths(self.hidden)
        check_positive_int(self, "n_members")
        if not 1 <= self.n_elites <= self.n_members:
            raise ValueError(
                f"n_elites: expected 1..n_members ({self.n_members}), got {self.n_elites}"
            )
        check_positive(self, "learning_rate")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay: must be >= 0, got {self.weight_decay}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"activation: expected one of {sorted(ACTIVATIONS)}, got {self.activation!r}"
            )
        if not self.min_log_std < self.max_log_std:
            raise ValueError(
                f"min_log_std {self.min_log_std} must lie below max_log_std {self.max_log_std}"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"hidden": list(self.hidden)}


class GaussianDynamicsNetwork(nn.Module):
    """One member: ``(mean, log_std, termination logit)`` of the normalized targets, its
    layers, activation, initialization and log-std bounds as ``config`` says."""

    config: DynamicsConfig
    target_size: int

    @nn.compact
    def __call__(self, inputs: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        config = self.config
        activation = ACTIVATIONS[config.activation]
        x = inputs
        for width in config.hidden:
            x = activation(dense(width, x.shape[-1], config.weight_init)(x))
        out = dense(2 * self.target_size + 1, x.shape[-1], config.weight_init, name="head")(x)
        mean = out[..., : self.target_size]
        raw = out[..., self.target_size : 2 * self.target_size]
        # Soft bounds keep a gradient at the limits (PETS, MBPO).
        log_std = config.max_log_std - jax.nn.softplus(config.max_log_std - raw)
        log_std = config.min_log_std + jax.nn.softplus(log_std - config.min_log_std)
        return mean, log_std, out[..., -1]
