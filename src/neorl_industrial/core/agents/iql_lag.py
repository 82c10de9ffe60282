"""IQL-Lag: IQL + in-sample cost critics and values + a Lagrange multiplier per channel.

Reward value and critics are IQL's (``iql.py``). For each cost channel a cost value
``V_c`` (expectile regression, 0.5, the mean, by default) and a pair of cost critics
``Q_c`` (towards ``c + γ V_c(s')``) are learned in-sample (``cost_critics.py``). The actor
is IQL's advantage-weighted regression on the Lagrangian advantage
``(Q_r - V_r) - sum_c λ_c (Q_c - V_c)``; the multipliers (PID by default, ``cost.py``)
step on the policy's estimated cost value ``Q_c(s, π(s))`` (with quantile cost critics,
``cost_critic.kind="iqn"``, its risk measure of the upper tail, e.g. CVaR) against the
threshold that each episode cost limit implies (OSRL's semantics). The limits are traced
leaves of the state (:func:`~neorl_industrial.core.agents.cost.with_cost_limits`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from neorl_industrial.core.agents import cost, cost_critics, iql
from neorl_industrial.core.agents.types import Algorithm, Batch, Metrics

__all__ = ["IQLLagConfig", "IQLLagState", "make_iql_lag"]


@dataclasses.dataclass(frozen=True)
class IQLLagConfig(iql.IQLConfig, cost.SafetyConfig):
    """Hyperparameters of IQL-Lag: IQL's (CORL defaults), the safety ones
    (:class:`SafetyConfig`, with OSRL's PID gains), and ``cost_expectile``, the expectile
    of the cost value (the cost critics and values learn at IQL's ``critic_lr`` and
    ``value_lr``)."""

    cost_expectile: float = 0.5

    def __post_init__(self) -> None:
        iql.IQLConfig.__post_init__(self)
        cost.SafetyConfig.__post_init__(self)
        if not 0.0 < self.cost_expectile < 1.0:
            raise ValueError(f"cost_expectile: must lie in (0, 1), got {self.cost_expectile}")


@struct.dataclass
class IQLLagState(iql.IQLState):
    """IQL's state, the in-sample cost critics' and the Lagrangian's (limits and
    multipliers)."""

    cost_critics: cost_critics.InSampleCostState
    lagrangian: cost.LagrangianState


def make_networks(config: IQLLagConfig, action_size: int) -> cost.SafeNetworks:
    """The networks, in-sample cost critics and Lagrangian of ``config``."""
    return cost.SafeNetworks(
        networks=iql.make_networks(config, action_size),
        costs=cost_critics.make_in_sample_cost_critics(
            config.hidden,
            len(config.cost_limits),
            config.value_lr,
            config.critic_lr,
            config.cost_expectile,
            config.cost_critic,
            config.weight_init,
        ),
        lagrangian=cost.make_lagrangian(config),
    )


def iql_lag_update(
    parts: cost.SafeNetworks,
    config: IQLLagConfig,
    state: IQLLagState,
    batch: Batch,
    key: jax.Array,
) -> tuple[IQLLagState, Metrics]:
    """One update of IQL-Lag: IQL's value and critics, the cost values and critics, the
    actor on the Lagrangian advantage, then the targets and the multipliers' step on the
    policy's estimated cost value."""
    networks, costs = parts.networks, parts.costs
    # Deterministic given the batch, but for the fractions quantile critics draw.
    critic_key, cost_key = jax.random.split(key)
    critic_key = critic_key if config.critic.distributional else None
    cost_key = cost_key if config.cost_critic.distributional else None
    cost.check_safe_batch(batch, costs.critics.n_costs)
    observations, next_observations = state.policy.normalize_batch(batch)

    state, values = iql.value_and_critic_step(
        networks, config, state, batch, observations, next_observations, critic_key
    )
    cost_state, cost_values = cost_critics.in_sample_step(
        costs,
        state.cost_critics,
        observations,
        batch.actions,
        batch.costs,
        batch.discounts,
        next_observations,
        cost_key,
    )
    multiplier = state.lagrangian.multiplier
    advantages = (values.target_q - values.value) - multiplier @ (
        cost_values.target_q - cost_values.value
    )
    state, a_loss, policy_mean = iql.actor_step(
        networks, config, state, observations, batch.actions, advantages
    )

    policy_actions = jax.lax.stop_gradient(jnp.clip(policy_mean, -1.0, 1.0))
    policy_cost = jnp.mean(
        costs.critics.risk_values(cost_state.critic, observations, policy_actions), axis=(1, 2)
    )
    new_state = iql.finish_update(config, state).replace(
        cost_critics=cost_critics.soft_update(cost_state, config.tau),
        lagrangian=parts.lagrangian.update(state.lagrangian, policy_cost),
    )
    metrics = {
        "value_loss": values.value_loss,
        "critic_loss": values.critic_loss,
        "cost_value_loss": cost_values.value_loss,
        "cost_critic_loss": cost_values.critic_loss,
        "actor_loss": a_loss,
        "advantage_mean": jnp.mean(advantages),
    }
    return new_state, cost.with_channel_metrics(
        metrics, new_state.lagrangian.multiplier, policy_cost
    )


def make_iql_lag(config: IQLLagConfig, obs_size: int, action_size: int) -> Algorithm:
    """IQL-Lag as ``Algorithm(init, update, act)``."""
    parts = make_networks(config, action_size)
    base = iql.make_iql(config, obs_size, action_size)  # acting is IQL's

    def init(key: jax.Array) -> IQLLagState:
        keys = jax.random.split(key, 5)
        return iql.init_state(
            parts.networks,
            config,
            obs_size,
            action_size,
            *keys[:3],
            state_type=IQLLagState,
            cost_critics=cost_critics.init_in_sample(
                parts.costs, keys[3], keys[4], obs_size, action_size
            ),
            lagrangian=parts.lagrangian.init(),
        )

    def update(state: IQLLagState, batch: Batch, key: jax.Array) -> tuple[IQLLagState, Metrics]:
        return iql_lag_update(parts, config, state, batch, key)

    return Algorithm(init=init, update=update, act=base.act)
