"""TD3+BC (Fujimoto & Gu, 2021): TD3 with a behaviour-cloning term in the actor loss.

Defaults are CORL's: (256, 256) networks, Adam at 3e-4, tau 0.005, target policy noise
0.2 clipped at 0.5, a policy update every 2 critic updates, alpha 2.5. The discount comes
with the batch (``discounts`` is gamma^k, or 0 after a terminal state).
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
    CriticEnsemble,
    ObservationNormalizer,
    PolicyParams,
    check_observation_stats,
    polyak_average,
)
from neorl_industrial.core.agents.types import Algorithm, Metrics


@dataclasses.dataclass(frozen=True)
class TD3BCConfig:
    """Hyperparameters of TD3+BC. Static: changing one builds a new algorithm."""

    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    hidden: tuple[int, ...] = (256, 256)
    tau: float = 0.005
    policy_noise: float = 0.2
    noise_clip: float = 0.5
    policy_freq: int = 2
    alpha: float = 2.5
    obs_mean: tuple[float, ...] | None = None
    obs_std: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(int(width) for width in self.hidden))
        for name in ("actor_lr", "critic_lr", "alpha"):
            if getattr(self, name) <= 0.0:
                raise ValueError(f"{name}: must be positive, got {getattr(self, name)}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau: must lie in (0, 1], got {self.tau}")
        if self.policy_freq < 1:
            raise ValueError(f"policy_freq: expected a positive integer, got {self.policy_freq}")
        check_observation_stats(self)


@struct.dataclass
class TD3BCState:
    """Training state of TD3+BC."""

    policy: PolicyParams
    target_actor: Any
    critic: Any
    target_critic: Any
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    step: jax.Array


def critic_loss(q_t: jax.Array, target_t: jax.Array) -> jax.Array:
    """Squared TD error of every critic for one transition: ``q_t`` is ``[n_critics]``."""
    chex.assert_rank([q_t, target_t], [1, 0])
    return jnp.sum(jnp.square(q_t - target_t))


def actor_loss(
    q_t: jax.Array, policy_action_t: jax.Array, action_t: jax.Array, lmbda: jax.Array
) -> jax.Array:
    """``-lambda * Q(s, pi(s)) + ||pi(s) - a||^2`` for one transition."""
    chex.assert_rank(q_t, 0)
    chex.assert_equal_shape([policy_action_t, action_t])
    return -lmbda * q_t + jnp.sum(jnp.square(policy_action_t - action_t))


def make_td3bc(config: TD3BCConfig, obs_size: int, action_size: int) -> Algorithm:
    """TD3+BC as ``Algorithm(init, update, act)``."""
    actor_network = MLP(hidden=config.hidden, output_size=action_size)
    critic_network = CriticEnsemble(hidden=config.hidden, n_critics=2)
    actor_optimizer = optax.adam(config.actor_lr)
    critic_optimizer = optax.adam(config.critic_lr)

    def actor_apply(actor: Any, normalized: jax.Array) -> jax.Array:
        return jnp.tanh(actor_network.apply(actor, normalized))

    def init(key: jax.Array) -> TD3BCState:
        actor_key, critic_key = jax.random.split(key)
        observation = jnp.zeros((obs_size,), jnp.float32)
        actor = actor_network.init(actor_key, observation)
        critic = critic_network.init(critic_key, observation, jnp.zeros((action_size,)))
        normalizer = ObservationNormalizer.from_config(config, obs_size)
        return TD3BCState(
            policy=PolicyParams(actor=actor, normalizer=normalizer),
            target_actor=actor,
            critic=critic,
            target_critic=critic,
            actor_opt_state=actor_optimizer.init(actor),
            critic_opt_state=critic_optimizer.init(critic),
            step=jnp.zeros((), jnp.int32),
        )

    def update(state: TD3BCState, batch: Any, key: jax.Array) -> tuple[TD3BCState, Metrics]:
        chex.assert_rank([batch.observations, batch.actions, batch.rewards], [2, 2, 1])
        normalize = state.policy.normalizer
        observations = normalize(batch.observations)
        next_observations = normalize(batch.next_observations)

        noise = jnp.clip(
            config.policy_noise * jax.random.normal(key, batch.actions.shape),
            -config.noise_clip,
            config.noise_clip,
        )
        next_actions = jnp.clip(actor_apply(state.target_actor, next_observations) + noise, -1, 1)
        next_q = critic_network.apply(state.target_critic, next_observations, next_actions)
        targets = batch.rewards + batch.discounts * jnp.min(next_q, axis=0)
        targets = jax.lax.stop_gradient(targets)

        def critic_objective(critic: Any) -> tuple[jax.Array, jax.Array]:
            q = critic_network.apply(critic, observations, batch.actions)  # [2, B]
            return jnp.mean(jax.vmap(critic_loss, in_axes=(1, 0))(q, targets)), q

        (c_loss, q), grads = jax.value_and_grad(critic_objective, has_aux=True)(state.critic)
        updates, critic_opt_state = critic_optimizer.update(grads, state.critic_opt_state)
        critic = optax.apply_updates(state.critic, updates)

        def actor_objective(actor: Any) -> jax.Array:
            policy_actions = actor_apply(actor, observations)
            q_first = critic_network.apply(critic, observations, policy_actions, members=1)[0]
            lmbda = jax.lax.stop_gradient(config.alpha / jnp.mean(jnp.abs(q_first)))
            losses = jax.vmap(actor_loss, in_axes=(0, 0, 0, None))(
                q_first, policy_actions, batch.actions, lmbda
            )
            return jnp.mean(losses)

        def improve_policy(_):
            a_loss, grads = jax.value_and_grad(actor_objective)(state.policy.actor)
            updates, actor_opt_state = actor_optimizer.update(grads, state.actor_opt_state)
            actor = optax.apply_updates(state.policy.actor, updates)
            return (
                actor,
                actor_opt_state,
                polyak_average(actor, state.target_actor, config.tau),
                polyak_average(critic, state.target_critic, config.tau),
                a_loss,
            )

        def keep_policy(_):
            return (
                state.policy.actor,
                state.actor_opt_state,
                state.target_actor,
                state.target_critic,
                jnp.zeros((), jnp.float32),
            )

        actor, actor_opt_state, target_actor, target_critic, a_loss = jax.lax.cond(
            state.step % config.policy_freq == 0, improve_policy, keep_policy, None
        )
        new_state = TD3BCState(
            policy=state.policy.replace(actor=actor),
            target_actor=target_actor,
            critic=critic,
            target_critic=target_critic,
            actor_opt_state=actor_opt_state,
            critic_opt_state=critic_opt_state,
            step=state.step + 1,
        )
        return new_state, {"critic_loss": c_loss, "actor_loss": a_loss, "q_mean": jnp.mean(q)}

    def act(
        policy_params: PolicyParams,
        observation: jax.Array,
        key: jax.Array | None = None,
        deterministic: bool = True,
    ) -> jax.Array:
        del key, deterministic  # the policy is deterministic
        return actor_apply(policy_params.actor, policy_params.normalizer(observation))

    return Algorithm(init=init, update=update, act=act)
