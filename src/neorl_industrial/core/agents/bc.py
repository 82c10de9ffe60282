"""Behaviour cloning: a deterministic tanh policy regressed onto the dataset's actions.

The CORL defaults: a (256, 256) ReLU network, Adam at 3e-4, batch 256 (the batch size is
the training loop's choice).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import chex
import jax
import jax.numpy as jnp
import optax
from flax import struct

from neorl_industrial.core.agents.networks import (
    MLP,
    PolicyParams,
    WeightInitConfig,
    check_network,
    check_positive,
    deterministic_act,
)
from neorl_industrial.core.agents.types import Algorithm, Metrics
from neorl_industrial.core.optimizers import apply_gradients, make_optimizer


@dataclasses.dataclass(frozen=True)
class BCConfig(WeightInitConfig):
    """Hyperparameters of behaviour cloning. Static: changing one builds a new algorithm.

    Attributes:
        learning_rate: Adam learning rate.
        hidden: hidden layer widths.
        obs_mean: per-feature observation mean (e.g. the dataset's), or ``None``.
        obs_std: per-feature observation standard deviation, with ``obs_mean``.
        weight_init: the network's initialization (:class:`WeightInitConfig`).
    """

    learning_rate: float = 3e-4
    hidden: tuple[int, ...] = (256, 256)
    obs_mean: tuple[float, ...] | None = None
    obs_std: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        check_network(self)
        check_positive(self, "learning_rate")


@struct.dataclass
class BCState:
    """Training state of behaviour cloning."""

    policy: PolicyParams
    opt_state: optax.OptState
    step: jax.Array


def bc_loss(predicted_t: jax.Array, action_t: jax.Array) -> jax.Array:
    """Mean squared error between the policy's and the dataset's action of one
    transition (over action dimensions, as CORL and d3rlpy)."""
    chex.assert_equal_shape([predicted_t, action_t])
    chex.assert_rank(predicted_t, 1)
    chex.assert_type([predicted_t, action_t], float)
    return jnp.mean(jnp.square(predicted_t - action_t))


def make_bc(config: BCConfig, obs_size: int, action_size: int) -> Algorithm:
    """Behaviour cloning as ``Algorithm(init, update, act)``."""
    network = MLP(hidden=config.hidden, output_size=action_size, weight_init=config.weight_init)
    optimizer = make_optimizer(config.learning_rate)

    def policy_action(actor: Any, normalized: jax.Array) -> jax.Array:
        return jnp.tanh(network.apply(actor, normalized))

    def init(key: jax.Array) -> BCState:
        policy = PolicyParams.create(network, key, config, obs_size)
        return BCState(
            policy=policy, opt_state=optimizer.init(policy.actor), step=jnp.zeros((), jnp.int32)
        )

    def update(state: BCState, batch: Any, key: jax.Array) -> tuple[BCState, Metrics]:
        del key  # behaviour cloning is deterministic given the batch
        chex.assert_rank(batch.observations, 2)
        observations = state.policy.normalizer(batch.observations)

        def loss_fn(actor: Any) -> tuple[jax.Array, None]:
            predicted = policy_action(actor, observations)
            return jnp.mean(jax.vmap(bc_loss)(predicted, batch.actions)), None

        actor, opt_state, loss, _ = apply_gradients(
            loss_fn, state.policy.actor, optimizer, state.opt_state
        )
        state = BCState(
            policy=state.policy.replace(actor=actor), opt_state=opt_state, step=state.step + 1
        )
        return state, {"bc_loss": loss}

    return Algorithm(init=init, update=update, act=deterministic_act(policy_action))
