"""IQL-Lag: IQL with in-sample cost critics and a PID Lagrange multiplier per channel.

Reward value and critics are IQL's. For each cost channel a cost value ``V_c`` (fit to
the cost critics by expectile regression; 0.5, the mean, by default) and a pair of cost
critics ``Q_c`` (towards ``c + γ V_c(s')``, all in-sample) are learned. The actor is
advantage-weighted regression on the Lagrangian advantage
``(Q_r - V_r) - sum_c λ_c (Q_c - V_c)``; the multipliers follow a PID controller on the
policy's estimated cost value ``Q_c(s, π(s))`` against the per-step threshold that each
episode cost limit implies (OSRL's semantics, see ``cost.py``).
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
from neorl_industrial.core.agents.iql import GaussianActor, awr_loss, critic_loss, expectile_loss
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
class IQLLagConfig:
    """Hyperparameters of IQL-Lag: IQL's (CORL defaults), plus the safety ones."""

    cost_limits: tuple[float, ...] = (100.0,)
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    value_lr: float = 3e-4
    hidden: tuple[int, ...] = (256, 256)
    expectile: float = 0.7
    cost_expectile: float = 0.5
    beta: float = 3.0
    max_exp_advantage: float = 100.0
    tau: float = 0.005
    discount: float = 0.99
    episode_length: int = 1000
    pid: PIDConfig = dataclasses.field(default_factory=PIDConfig)
    obs_mean: tuple[float, ...] | None = None
    obs_std: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(int(width) for width in self.hidden))
        object.__setattr__(self, "cost_limits", tuple(float(x) for x in self.cost_limits))
        for name in ("actor_lr", "critic_lr", "value_lr", "beta", "max_exp_advantage"):
            if getattr(self, name) <= 0.0:
                raise ValueError(f"{name}: must be positive, got {getattr(self, name)}")
        for name in ("expectile", "cost_expectile"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ValueError(f"{name}: must lie in (0, 1), got {getattr(self, name)}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau: must lie in (0, 1], got {self.tau}")
        check_safe_config(self)
        check_observation_stats(self)


@struct.dataclass
class IQLLagState:
    """Training state of IQL-Lag."""

    policy: PolicyParams
    value: Any
    critic: Any
    target_critic: Any
    cost_value: Any
    cost_critic: Any
    target_cost_critic: Any
    pid: PIDState
    actor_opt_state: optax.OptState
    value_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    cost_value_opt_state: optax.OptState
    cost_critic_opt_state: optax.OptState
    step: jax.Array


def make_iql_lag(config: IQLLagConfig, obs_size: int, action_size: int) -> Algorithm:
    """IQL-Lag as ``Algorithm(init, update, act)``."""
    n_costs = len(config.cost_limits)
    actor_network = GaussianActor(action_size, config.hidden)
    value_network = MLP(config.hidden, output_size=1)
    critic_network = CriticEnsemble(hidden=config.hidden, n_critics=2)
    cost_value_network = MLP(config.hidden, output_size=n_costs)
    cost_network = CriticEnsemble(hidden=config.hidden, n_critics=2 * n_costs)
    actor_optimizer = optax.adam(config.actor_lr)
    value_optimizer = optax.adam(config.value_lr)
    critic_optimizer = optax.adam(config.critic_lr)
    cost_value_optimizer = optax.adam(config.value_lr)
    cost_optimizer = optax.adam(config.critic_lr)
    threshold = jnp.asarray(
        thresholds(config.cost_limits, config.discount, config.episode_length), jnp.float32
    )

    def value_apply(value: Any, normalized: jax.Array) -> jax.Array:
        return value_network.apply(value, normalized)[..., 0]

    def cost_value_apply(value: Any, normalized: jax.Array) -> jax.Array:
        """``[n_costs, B]``."""
        return jnp.moveaxis(cost_value_network.apply(value, normalized), -1, 0)

    def cost_values(cost_critic: Any, observations: jax.Array, actions: jax.Array) -> jax.Array:
        """``[n_costs, 2, B]``."""
        values = cost_network.apply(cost_critic, observations, actions)
        return values.reshape(n_costs, 2, *values.shape[1:])

    def init(key: jax.Array) -> IQLLagState:
        keys = jax.random.split(key, 5)
        observation = jnp.zeros((obs_size,), jnp.float32)
        action = jnp.zeros((action_size,))
        actor = actor_network.init(keys[0], observation)
        value = value_network.init(keys[1], observation)
        critic = critic_network.init(keys[2], observation, action)
        cost_value = cost_value_network.init(keys[3], observation)
        cost_critic = cost_network.init(keys[4], observation, action)
        normalizer = ObservationNormalizer.from_config(config, obs_size)
        return IQLLagState(
            policy=PolicyParams(actor=actor, normalizer=normalizer),
            value=value,
            critic=critic,
            target_critic=critic,
            cost_value=cost_value,
            cost_critic=cost_critic,
            target_cost_critic=cost_critic,
            pid=pid_init(n_costs),
            actor_opt_state=actor_optimizer.init(actor),
            value_opt_state=value_optimizer.init(value),
            critic_opt_state=critic_optimizer.init(critic),
            cost_value_opt_state=cost_value_optimizer.init(cost_value),
            cost_critic_opt_state=cost_optimizer.init(cost_critic),
            step=jnp.zeros((), jnp.int32),
        )

    def update(state: IQLLagState, batch: Any, key: jax.Array) -> tuple[IQLLagState, Metrics]:
        del key  # deterministic given the batch
        chex.assert_rank([batch.observations, batch.actions, batch.rewards], [2, 2, 1])
        chex.assert_shape(batch.costs, (batch.rewards.shape[0], n_costs))
        normalize = state.policy.normalizer
        observations = normalize(batch.observations)
        next_observations = normalize(batch.next_observations)
        expectile = jax.vmap(expectile_loss, in_axes=(0, None))
        pairs = jax.vmap(critic_loss, in_axes=(1, 0))

        # Reward value and critics (IQL).
        target_q = jnp.min(
            critic_network.apply(state.target_critic, observations, batch.actions), axis=0
        )

        def value_objective(value: Any) -> tuple[jax.Array, jax.Array]:
            v = value_apply(value, observations)
            return jnp.mean(expectile(target_q - v, config.expectile)), v

        (v_loss, v), grads = jax.value_and_grad(value_objective, has_aux=True)(state.value)
        updates, value_opt_state = value_optimizer.update(grads, state.value_opt_state)
        value = optax.apply_updates(state.value, updates)
        targets = jax.lax.stop_gradient(
            batch.rewards + batch.discounts * value_apply(value, next_observations)
        )

        def critic_objective(critic: Any) -> jax.Array:
            return jnp.mean(
                pairs(critic_network.apply(critic, observations, batch.actions), targets)
            )

        c_loss, grads = jax.value_and_grad(critic_objective)(state.critic)
        updates, critic_opt_state = critic_optimizer.update(grads, state.critic_opt_state)
        critic = optax.apply_updates(state.critic, updates)

        # Cost value and critics, in-sample; the pair's larger value is the target.
        target_qc = jnp.max(cost_values(state.target_cost_critic, observations, batch.actions), 1)

        def cost_value_objective(cost_value: Any) -> tuple[jax.Array, jax.Array]:
            vc = cost_value_apply(cost_value, observations)  # [n_costs, B]
            losses = jax.vmap(lambda d: expectile(d, config.cost_expectile))(target_qc - vc)
            return jnp.mean(jnp.sum(losses, axis=0)), vc

        (vc_loss, vc), grads = jax.value_and_grad(cost_value_objective, has_aux=True)(
            state.cost_value
        )
        updates, cost_value_opt_state = cost_value_optimizer.update(
            grads, state.cost_value_opt_state
        )
        cost_value = optax.apply_updates(state.cost_value, updates)
        cost_targets = jax.lax.stop_gradient(
            batch.costs.T + batch.discounts * cost_value_apply(cost_value, next_observations)
        )

        def cost_objective(cost_critic: Any) -> jax.Array:
            qc = cost_values(cost_critic, observations, batch.actions)
            return jnp.mean(jnp.sum(jax.vmap(pairs)(qc, cost_targets), axis=0))

        qc_loss, grads = jax.value_and_grad(cost_objective)(state.cost_critic)
        updates, cost_opt_state = cost_optimizer.update(grads, state.cost_critic_opt_state)
        cost_critic = optax.apply_updates(state.cost_critic, updates)

        # Actor: AWR on the Lagrangian advantage.
        multiplier = state.pid.multiplier
        advantages = (target_q - v) - multiplier @ (target_qc - vc)

        def actor_objective(actor: Any) -> tuple[jax.Array, jax.Array]:
            mean, log_std = actor_network.apply(actor, observations)
            log_probs = jnp.sum(
                jax.scipy.stats.norm.logpdf(batch.actions, mean, jnp.exp(log_std)), axis=-1
            )
            losses = jax.vmap(awr_loss, in_axes=(0, 0, None, None))(
                log_probs, advantages, config.beta, config.max_exp_advantage
            )
            return jnp.mean(losses), mean

        (a_loss, policy_mean), grads = jax.value_and_grad(actor_objective, has_aux=True)(
            state.policy.actor
        )
        updates, actor_opt_state = actor_optimizer.update(grads, state.actor_opt_state)
        actor = optax.apply_updates(state.policy.actor, updates)

        policy_actions = jax.lax.stop_gradient(jnp.clip(policy_mean, -1.0, 1.0))
        policy_cost = jnp.mean(cost_values(cost_critic, observations, policy_actions), axis=(1, 2))
        pid = pid_update(config.pid, state.pid, policy_cost, threshold)

        new_state = IQLLagState(
            policy=state.policy.replace(actor=actor),
            value=value,
            critic=critic,
            target_critic=polyak_average(critic, state.target_critic, config.tau),
            cost_value=cost_value,
            cost_critic=cost_critic,
            target_cost_critic=polyak_average(cost_critic, state.target_cost_critic, config.tau),
            pid=pid,
            actor_opt_state=actor_opt_state,
            value_opt_state=value_opt_state,
            critic_opt_state=critic_opt_state,
            cost_value_opt_state=cost_value_opt_state,
            cost_critic_opt_state=cost_opt_state,
            step=state.step + 1,
        )
        metrics = {
            "value_loss": v_loss,
            "critic_loss": c_loss,
            "cost_value_loss": vc_loss,
            "cost_critic_loss": qc_loss,
            "actor_loss": a_loss,
            "advantage_mean": jnp.mean(advantages),
        }
        for i in range(n_costs):
            metrics[f"multiplier_{i}"] = pid.multiplier[i]
            metrics[f"cost_value_{i}"] = policy_cost[i]
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
