"""TD3BC-Lag: TD3+BC with cost critics and a PID Lagrange multiplier per cost channel.

The reward critics and the behaviour-cloning term are TD3+BC's. For each cost channel a
pair of cost critics learns the discounted cost of the policy (the target takes the
larger of the pair: pessimistic about cost). The actor maximizes
``Q_r - sum_c λ_c Q_c`` (scaled as in TD3+BC by the mean magnitude of both terms) plus
the BC term, and the multipliers
follow a PID controller on the policy's estimated cost value against the per-step
threshold that each episode cost limit implies (OSRL's semantics, see ``cost.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import chex
import jax
import jax.numpy as jnp
import optax
from flax import struct

from neorl_industrial.core.agents.cost import (
    PIDConfig,
    PIDState,
    check_safe_config,
    pid_init,
    pid_update,
    thresholds,
)
from neorl_industrial.core.agents.networks import (
    MLP,
    CriticEnsemble,
    ObservationNormalizer,
    PolicyParams,
    check_observation_stats,
    polyak_average,
)
from neorl_industrial.core.agents.td3bc import actor_loss, critic_loss
from neorl_industrial.core.agents.types import Algorithm, Metrics


@dataclasses.dataclass(frozen=True)
class TD3BCLagConfig:
    """Hyperparameters of TD3BC-Lag: TD3+BC's, plus the safety ones.

    Attributes:
        cost_limits: episode cost limit of each cost channel (one per ``batch.costs``
            column).
        discount: the batch's discount (for the per-step threshold).
        episode_length: steps per episode (for the per-step threshold).
        cost_floor: weight of a penalty that keeps the cost critics' estimate at the
            policy's actions no lower than at the data's action (0: off). Without it the
            actor finds actions off the data that the cost critics rate as cheap, the
            multiplier sees no excess cost and stays near zero (measured in the safety
            study: multipliers 0.02-0.24, normalized cost 1.50).
        pid: gains of the multiplier: OSRL's with a larger integral gain (0.01 instead of
            0.003), so that the multiplier reaches its level within ~10 k updates.
    """

    cost_limits: tuple[float, ...] = (100.0,)
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    cost_critic_lr: float = 3e-4
    hidden: tuple[int, ...] = (256, 256)
    tau: float = 0.005
    policy_noise: float = 0.2
    noise_clip: float = 0.5
    policy_freq: int = 2
    alpha: float = 2.5
    discount: float = 0.99
    episode_length: int = 1000
    cost_floor: float = 1.0
    pid: PIDConfig = dataclasses.field(default_factory=lambda: PIDConfig(ki=0.01))
    obs_mean: tuple[float, ...] | None = None
    obs_std: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(int(width) for width in self.hidden))
        object.__setattr__(self, "cost_limits", tuple(float(x) for x in self.cost_limits))
        if not (self.cost_floor >= 0.0):
            raise ValueError(f"cost_floor: must be >= 0, got {self.cost_floor}")
        for name in ("actor_lr", "critic_lr", "cost_critic_lr", "alpha"):
            if getattr(self, name) <= 0.0:
                raise ValueError(f"{name}: must be positive, got {getattr(self, name)}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau: must lie in (0, 1], got {self.tau}")
        if self.policy_freq < 1:
            raise ValueError(f"policy_freq: expected a positive integer, got {self.policy_freq}")
        check_safe_config(self)
        check_observation_stats(self)


@struct.dataclass
class TD3BCLagState:
    """Training state of TD3BC-Lag."""

    policy: PolicyParams
    target_actor: Any
    critic: Any
    target_critic: Any
    cost_critic: Any
    target_cost_critic: Any
    pid: PIDState
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    cost_critic_opt_state: optax.OptState
    step: jax.Array


def make_td3bc_lag(config: TD3BCLagConfig, obs_size: int, action_size: int) -> Algorithm:
    """TD3BC-Lag as ``Algorithm(init, update, act)``."""
    n_costs = len(config.cost_limits)
    actor_network = MLP(hidden=config.hidden, output_size=action_size)
    critic_network = CriticEnsemble(hidden=config.hidden, n_critics=2)
    # Two cost critics per channel, as one ensemble: outputs [2 * n_costs, B].
    cost_network = CriticEnsemble(hidden=config.hidden, n_critics=2 * n_costs)
    actor_optimizer = optax.adam(config.actor_lr)
    critic_optimizer = optax.adam(config.critic_lr)
    cost_optimizer = optax.adam(config.cost_critic_lr)
    threshold = jnp.asarray(
        thresholds(config.cost_limits, config.discount, config.episode_length), jnp.float32
    )

    def actor_apply(actor: Any, normalized: jax.Array) -> jax.Array:
        return jnp.tanh(actor_network.apply(actor, normalized))

    def cost_values(cost_critic: Any, observations: jax.Array, actions: jax.Array) -> jax.Array:
        """``[n_costs, 2, B]``."""
        values = cost_network.apply(cost_critic, observations, actions)
        return values.reshape(n_costs, 2, *values.shape[1:])

    def init(key: jax.Array) -> TD3BCLagState:
        actor_key, critic_key, cost_key = jax.random.split(key, 3)
        observation = jnp.zeros((obs_size,), jnp.float32)
        action = jnp.zeros((action_size,))
        actor = actor_network.init(actor_key, observation)
        critic = critic_network.init(critic_key, observation, action)
        cost_critic = cost_network.init(cost_key, observation, action)
        normalizer = ObservationNormalizer.from_config(config, obs_size)
        return TD3BCLagState(
            policy=PolicyParams(actor=actor, normalizer=normalizer),
            target_actor=actor,
            critic=critic,
            target_critic=critic,
            cost_critic=cost_critic,
            target_cost_critic=cost_critic,
            pid=pid_init(n_costs),
            actor_opt_state=actor_optimizer.init(actor),
            critic_opt_state=critic_optimizer.init(critic),
            cost_critic_opt_state=cost_optimizer.init(cost_critic),
            step=jnp.zeros((), jnp.int32),
        )

    def update(state: TD3BCLagState, batch: Any, key: jax.Array) -> tuple[TD3BCLagState, Metrics]:
        chex.assert_rank([batch.observations, batch.actions, batch.rewards], [2, 2, 1])
        chex.assert_shape(batch.costs, (batch.rewards.shape[0], n_costs))
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
        targets = jax.lax.stop_gradient(batch.rewards + batch.discounts * jnp.min(next_q, axis=0))
        next_qc = cost_values(state.target_cost_critic, next_observations, next_actions)
        cost_targets = jax.lax.stop_gradient(
            batch.costs.T + batch.discounts * jnp.max(next_qc, axis=1)
        )  # [n_costs, B]

        def critic_objective(critic: Any) -> tuple[jax.Array, jax.Array]:
            q = critic_network.apply(critic, observations, batch.actions)  # [2, B]
            return jnp.mean(jax.vmap(critic_loss, in_axes=(1, 0))(q, targets)), q

        (c_loss, q), grads = jax.value_and_grad(critic_objective, has_aux=True)(state.critic)
        updates, critic_opt_state = critic_optimizer.update(grads, state.critic_opt_state)
        critic = optax.apply_updates(state.critic, updates)

        current_actions = jax.lax.stop_gradient(actor_apply(state.policy.actor, observations))

        def cost_objective(cost_critic: Any) -> tuple[jax.Array, jax.Array]:
            qc = cost_values(cost_critic, observations, batch.actions)  # [n_costs, 2, B]
            per_channel = jax.vmap(
                lambda qc_c, target_c: jax.vmap(critic_loss, in_axes=(1, 0))(qc_c, target_c)
            )(qc, cost_targets)  # [n_costs, B]
            loss = jnp.mean(jnp.sum(per_channel, axis=0))
            if config.cost_floor > 0.0:
                # The policy's actions are off the data, where a critic trained on the data
                # can be arbitrarily optimistic about cost and the actor would exploit it:
                # their estimate is held no lower than that of the data's action.
                qc_policy = cost_values(cost_critic, observations, current_actions)
                shortfall = jax.nn.relu(jax.lax.stop_gradient(qc) - qc_policy)
                loss = loss + config.cost_floor * jnp.mean(jnp.sum(shortfall, axis=(0, 1)))
            return loss, qc

        (qc_loss, qc), grads = jax.value_and_grad(cost_objective, has_aux=True)(state.cost_critic)
        updates, cost_opt_state = cost_optimizer.update(grads, state.cost_critic_opt_state)
        cost_critic = optax.apply_updates(state.cost_critic, updates)

        multiplier = state.pid.multiplier

        def actor_objective(actor: Any) -> tuple[jax.Array, jax.Array]:
            policy_actions = actor_apply(actor, observations)
            q_first = critic_network.apply(critic, observations, policy_actions, members=1)[0]
            qc_policy = jnp.mean(cost_values(cost_critic, observations, policy_actions), axis=1)
            objective = q_first - multiplier @ qc_policy  # [B]
            # TD3+BC's normalization over both terms' magnitudes (never near zero, unlike
            # |Q_r - λ Q_c| when the two balance).
            scale = jnp.mean(jnp.abs(q_first)) + multiplier @ jnp.mean(jnp.abs(qc_policy), 1)
            lmbda = jax.lax.stop_gradient(config.alpha / jnp.maximum(scale, 1e-6))
            losses = jax.vmap(actor_loss, in_axes=(0, 0, 0, None))(
                objective, policy_actions, batch.actions, lmbda
            )
            return jnp.mean(losses), jnp.mean(qc_policy, axis=1)

        def improve_policy(_):
            (a_loss, cost_value), grads = jax.value_and_grad(actor_objective, has_aux=True)(
                state.policy.actor
            )
            updates, actor_opt_state = actor_optimizer.update(grads, state.actor_opt_state)
            actor = optax.apply_updates(state.policy.actor, updates)
            return (
                actor,
                actor_opt_state,
                polyak_average(actor, state.target_actor, config.tau),
                polyak_average(critic, state.target_critic, config.tau),
                polyak_average(cost_critic, state.target_cost_critic, config.tau),
                pid_update(config.pid, state.pid, jax.lax.stop_gradient(cost_value), threshold),
                a_loss,
                cost_value,
            )

        def keep_policy(_):
            return (
                state.policy.actor,
                state.actor_opt_state,
                state.target_actor,
                state.target_critic,
                state.target_cost_critic,
                state.pid,
                jnp.zeros((), jnp.float32),
                jnp.zeros((n_costs,), jnp.float32),
            )

        (
            actor,
            actor_opt_state,
            target_actor,
            target_critic,
            target_cost_critic,
            pid,
            a_loss,
            cost_value,
        ) = jax.lax.cond(state.step % config.policy_freq == 0, improve_policy, keep_policy, None)
        new_state = TD3BCLagState(
            policy=state.policy.replace(actor=actor),
            target_actor=target_actor,
            critic=critic,
            target_critic=target_critic,
            cost_critic=cost_critic,
            target_cost_critic=target_cost_critic,
            pid=pid,
            actor_opt_state=actor_opt_state,
            critic_opt_state=critic_opt_state,
            cost_critic_opt_state=cost_opt_state,
            step=state.step + 1,
        )
        metrics = {
            "critic_loss": c_loss,
            "cost_critic_loss": qc_loss,
            "actor_loss": a_loss,
            "q_mean": jnp.mean(q),
            "qc_mean": jnp.mean(qc),
        }
        for i in range(n_costs):
            metrics[f"multiplier_{i}"] = pid.multiplier[i]
            metrics[f"cost_value_{i}"] = cost_value[i]
        return new_state, metrics

    def act(
        policy_params: PolicyParams,
        observation: jax.Array,
        key: jax.Array | None = None,
        deterministic: bool = True,
    ) -> jax.Array:
        del key, deterministic  # the policy is deterministic
        return actor_apply(policy_params.actor, policy_params.normalizer(observation))

    return Algorithm(init=init, update=update, act=act)
