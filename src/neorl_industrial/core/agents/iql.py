"""Implicit Q-Learning (Kostrikov et al., 2021): expectile value regression, a critic
bootstrapped from the value, and advantage-weighted policy extraction.

Defaults are CORL's: (256, 256) networks, Adam at 3e-4, expectile 0.7, inverse
temperature 3.0, exponentiated advantages clipped at 100, tau 0.005, a Gaussian policy
with a tanh mean and a state-independent standard deviation.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from neorl_industrial.core.agents.networks import (
    MLP,
    CriticEnsemble,
    ObservationNormalizer,
    PolicyParams,
    check_observation_stats,
    polyak_average,
)
from neorl_industrial.core.agents.types import Algorithm, Metrics

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


@dataclasses.dataclass(frozen=True)
class IQLConfig:
    """Hyperparameters of IQL. Static: changing one builds a new algorithm."""

    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    value_lr: float = 3e-4
    hidden: tuple[int, ...] = (256, 256)
    expectile: float = 0.7
    beta: float = 3.0
    max_exp_advantage: float = 100.0
    tau: float = 0.005
    obs_mean: tuple[float, ...] | None = None
    obs_std: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(int(width) for width in self.hidden))
        for name in ("actor_lr", "critic_lr", "value_lr", "beta", "max_exp_advantage"):
            if getattr(self, name) <= 0.0:
                raise ValueError(f"{name}: must be positive, got {getattr(self, name)}")
        if not 0.0 < self.expectile < 1.0:
            raise ValueError(f"expectile: must lie in (0, 1), got {self.expectile}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau: must lie in (0, 1], got {self.tau}")
        check_observation_stats(self)


class GaussianActor(nn.Module):
    """``Normal(tanh(f(s)), exp(log_std))`` with a learned, state-independent log_std."""

    action_size: int
    hidden: tuple[int, ...] = (256, 256)

    @nn.compact
    def __call__(self, observation: jax.Array) -> tuple[jax.Array, jax.Array]:
        mean = jnp.tanh(MLP(self.hidden, output_size=self.action_size)(observation))
        log_std = self.param("log_std", nn.initializers.zeros, (self.action_size,))
        return mean, jnp.clip(log_std, LOG_STD_MIN, LOG_STD_MAX)


@struct.dataclass
class IQLState:
    """Training state of IQL."""

    policy: PolicyParams
    value: Any
    critic: Any
    target_critic: Any
    actor_opt_state: optax.OptState
    value_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    step: jax.Array


def expectile_loss(difference_t: jax.Array, expectile: float) -> jax.Array:
    """Asymmetric squared loss of ``Q - V`` for one transition."""
    chex.assert_rank(difference_t, 0)
    weight = jnp.where(difference_t > 0, expectile, 1.0 - expectile)
    return weight * jnp.square(difference_t)


def critic_loss(q_t: jax.Array, target_t: jax.Array) -> jax.Array:
    """Squared TD error of every critic for one transition: ``q_t`` is ``[n_critics]``."""
    chex.assert_rank([q_t, target_t], [1, 0])
    return jnp.sum(jnp.square(q_t - target_t))


def awr_loss(log_prob_t: jax.Array, advantage_t: jax.Array, beta: float, clip: float):
    """Advantage-weighted regression: ``-min(exp(beta * A), clip) * log pi(a|s)``."""
    chex.assert_rank([log_prob_t, advantage_t], [0, 0])
    weight = jnp.minimum(jnp.exp(beta * advantage_t), clip)
    return -jax.lax.stop_gradient(weight) * log_prob_t


def make_iql(config: IQLConfig, obs_size: int, action_size: int) -> Algorithm:
    """IQL as ``Algorithm(init, update, act)``."""
    actor_network = GaussianActor(action_size, config.hidden)
    value_network = MLP(config.hidden, output_size=1)
    critic_network = CriticEnsemble(hidden=config.hidden, n_critics=2)
    actor_optimizer = optax.adam(config.actor_lr)
    value_optimizer = optax.adam(config.value_lr)
    critic_optimizer = optax.adam(config.critic_lr)

    def value_apply(value: Any, normalized: jax.Array) -> jax.Array:
        return value_network.apply(value, normalized)[..., 0]

    def init(key: jax.Array) -> IQLState:
        actor_key, value_key, critic_key = jax.random.split(key, 3)
        observation = jnp.zeros((obs_size,), jnp.float32)
        actor = actor_network.init(actor_key, observation)
        value = value_network.init(value_key, observation)
        critic = critic_network.init(critic_key, observation, jnp.zeros((action_size,)))
        normalizer = ObservationNormalizer.from_config(config, obs_size)
        return IQLState(
            policy=PolicyParams(actor=actor, normalizer=normalizer),
            value=value,
            critic=critic,
            target_critic=critic,
            actor_opt_state=actor_optimizer.init(actor),
            value_opt_state=value_optimizer.init(value),
            critic_opt_state=critic_optimizer.init(critic),
            step=jnp.zeros((), jnp.int32),
        )

    def update(state: IQLState, batch: Any, key: jax.Array) -> tuple[IQLState, Metrics]:
        del key  # IQL's update is deterministic given the batch
        chex.assert_rank([batch.observations, batch.actions, batch.rewards], [2, 2, 1])
        normalize = state.policy.normalizer
        observations = normalize(batch.observations)
        next_observations = normalize(batch.next_observations)
        target_q = jnp.min(
            critic_network.apply(state.target_critic, observations, batch.actions), axis=0
        )

        def value_objective(value: Any) -> tuple[jax.Array, jax.Array]:
            v = value_apply(value, observations)
            losses = jax.vmap(expectile_loss, in_axes=(0, None))(target_q - v, config.expectile)
            return jnp.mean(losses), v

        (v_loss, v), grads = jax.value_and_grad(value_objective, has_aux=True)(state.value)
        updates, value_opt_state = value_optimizer.update(grads, state.value_opt_state)
        value = optax.apply_updates(state.value, updates)

        targets = batch.rewards + batch.discounts * value_apply(value, next_observations)
        targets = jax.lax.stop_gradient(targets)

        def critic_objective(critic: Any) -> jax.Array:
            q = critic_network.apply(critic, observations, batch.actions)  # [2, B]
            return jnp.mean(jax.vmap(critic_loss, in_axes=(1, 0))(q, targets))

        c_loss, grads = jax.value_and_grad(critic_objective)(state.critic)
        updates, critic_opt_state = critic_optimizer.update(grads, state.critic_opt_state)
        critic = optax.apply_updates(state.critic, updates)

        advantages = target_q - v

        def actor_objective(actor: Any) -> jax.Array:
            mean, log_std = actor_network.apply(actor, observations)
            log_probs = jnp.sum(
                jax.scipy.stats.norm.logpdf(batch.actions, mean, jnp.exp(log_std)), axis=-1
            )
            losses = jax.vmap(awr_loss, in_axes=(0, 0, None, None))(
                log_probs, advantages, config.beta, config.max_exp_advantage
            )
            return jnp.mean(losses)

        a_loss, grads = jax.value_and_grad(actor_objective)(state.policy.actor)
        updates, actor_opt_state = actor_optimizer.update(grads, state.actor_opt_state)
        actor = optax.apply_updates(state.policy.actor, updates)

        new_state = IQLState(
            policy=state.policy.replace(actor=actor),
            value=value,
            critic=critic,
            target_critic=polyak_average(critic, state.target_critic, config.tau),
            actor_opt_state=actor_opt_state,
            value_opt_state=value_opt_state,
            critic_opt_state=critic_opt_state,
            step=state.step + 1,
        )
        metrics = {
            "value_loss": v_loss,
            "critic_loss": c_loss,
            "actor_loss": a_loss,
            "advantage_mean": jnp.mean(advantages),
        }
        return new_state, metrics

    def act(
        policy_params: PolicyParams,
        observation: jax.Array,
        key: jax.Array | None = None,
        deterministic: bool = True,
    ) -> jax.Array:
        mean, log_std = actor_network.apply(
            policy_params.actor, policy_params.normalizer(observation)
        )
        if deterministic:
            return mean
        if key is None:
            raise ValueError("key: a stochastic action needs a PRNG key")
        noise = jax.random.normal(key, mean.shape)
        return jnp.clip(mean + jnp.exp(log_std) * noise, -1.0, 1.0)

    return Algorithm(init=init, update=update, act=act)
