"""TD3BC-Lag: TD3+BC + cost critics + a Lagrange multiplier per cost channel.

The reward critics, the target actions and the delayed policy step are TD3+BC's
(``td3bc.py``). The cost critics (``cost_critics.py``) learn each channel's discounted cost
by TD at the target policy's next action, pessimistic about cost, and with a floor at the
policy's actions. The policy step subtracts ``sum_c λ_c Q_c(s, π(s))`` from ``Q_r`` (TD3+BC's
normalization then covers both terms), and on the same delayed schedule the multipliers
(PID by default, ``cost.py``) step on the policy's estimated cost value against the
threshold that each episode cost limit implies (OSRL's semantics). The limits are traced
leaves of the state (:func:`~neorl_industrial.core.agents.cost.with_cost_limits`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from neorl_industrial.core.agents import cost, cost_critics, td3bc
from neorl_industrial.core.agents.networks import check_positive
from neorl_industrial.core.agents.types import Algorithm, Batch, Metrics
from neorl_industrial.core.optimizers import PIDConfig

__all__ = ["TD3BCLagConfig", "TD3BCLagState", "make_td3bc_lag"]


@dataclasses.dataclass(frozen=True)
class TD3BCLagConfig(td3bc.TD3BCConfig, cost.SafetyConfig):
    """Hyperparameters of TD3BC-Lag: TD3+BC's, the safety ones (:class:`SafetyConfig`:
    ``cost_limits``, ``discount``, ``episode_length``, ``multiplier``, ``pid``,
    ``gradient``), and:

    Attributes:
        cost_critic_lr: Adam's learning rate of the cost critics.
        cost_floor: weight of a penalty that keeps the cost critics' estimate at the
            policy's actions no lower than at the data's action (0: off). Without it the
            actor finds actions off the data that the cost critics rate as cheap, the
            multiplier sees no excess cost and stays near zero (measured in the safety
            study: multipliers 0.02-0.24, normalized cost 1.50). Unset, it is 1 for mean
            cost critics and 0 for quantile ones, on which a floor diverges: the quantile
            loss's bounded gradient cannot hold the data's estimates against the floor's
            push through shared weights (CSTR-stochastic-v0, CVaR 0.1: the estimated
            discounted cost, at most 100, passed 800 within 1 000 updates and 1e6 by
            6 000, at the tail or the mean alike); a positive floor on quantile cost
            critics is refused.
        pid: gains of the PID multiplier: OSRL's with a larger integral gain (0.01 instead
            of 0.003), so that the multiplier reaches its level within ~10 k updates.
    """

    cost_critic_lr: float = 3e-4
    cost_floor: float | None = None
    pid: PIDConfig = dataclasses.field(default_factory=lambda: PIDConfig(ki=0.01))

    def __post_init__(self) -> None:
        td3bc.TD3BCConfig.__post_init__(self)
        cost.SafetyConfig.__post_init__(self)
        check_positive(self, "cost_critic_lr")
        if self.cost_floor is None:
            return
        if not (self.cost_floor >= 0.0):
            raise ValueError(f"cost_floor: must be >= 0, got {self.cost_floor}")
        if self.cost_critic.distributional and self.cost_floor > 0.0:
            raise ValueError(
                f"cost_floor: {self.cost_floor} with quantile cost critics "
                f"(cost_critic.kind {self.cost_critic.kind!r}) diverges; leave it unset or 0 "
                "(a floor needs mean cost critics)"
            )

    @property
    def floor(self) -> float:
        """The cost floor's weight in force: ``cost_floor``, or when unset 1 for mean cost
        critics and 0 for quantile ones."""
        if self.cost_floor is not None:
            return float(self.cost_floor)
        return 0.0 if self.cost_critic.distributional else 1.0


@struct.dataclass
class TD3BCLagState(td3bc.TD3BCState):
    """TD3+BC's state, the cost critics' and the Lagrangian's (limits and multipliers)."""

    cost_critics: cost_critics.CostCriticState
    lagrangian: cost.LagrangianState


def make_networks(config: TD3BCLagConfig, action_size: int) -> cost.SafeNetworks:
    """The networks, cost critics and Lagrangian of ``config``."""
    return cost.SafeNetworks(
        networks=td3bc.make_networks(config, action_size),
        costs=cost_critics.make_cost_critics(
            config.hidden,
            len(config.cost_limits),
            config.cost_critic_lr,
            config.cost_critic,
            config.weight_init,
        ),
        lagrangian=cost.make_lagrangian(config),
    )


def cost_penalty(
    costs: cost_critics.CostCritics,
    cost_critic: Any,
    observations: jax.Array,
    multiplier: jax.Array,
    policy_actions: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The actor's :data:`~neorl_industrial.core.agents.td3bc.Penalty` (with the first four
    arguments bound): ``sum_c λ_c Q_c(s, π(s))`` (each pair's mean; for quantile critics
    their risk measure of the cost's upper tail), its magnitude, and the policy's estimated
    cost value per channel, which the multipliers step on."""
    qc_policy = jnp.mean(costs.risk_values(cost_critic, observations, policy_actions), 1)
    scale = multiplier @ jnp.mean(jnp.abs(qc_policy), 1)
    return multiplier @ qc_policy, scale, jnp.mean(qc_policy, axis=1)


def delayed_step(
    parts: cost.SafeNetworks,
    config: TD3BCLagConfig,
    state: TD3BCLagState,
    cost_state: cost_critics.CostCriticState,
    observations: jax.Array,
    actions: jax.Array,
) -> tuple[td3bc.PolicyStep, Any, cost.LagrangianState]:
    """On TD3+BC's delayed schedule: the policy step against the Lagrangian penalty, the
    cost critics' target update and the multipliers' step on the policy's cost value;
    otherwise nothing moves (the cost values reported as 0).

    Returns:
        ``(step, target_cost_critic, lagrangian_state)``; ``step.aux`` is the policy's
        estimated cost value per channel.
    """
    penalty = functools.partial(
        cost_penalty, parts.costs, cost_state.critic, observations, state.lagrangian.multiplier
    )

    def improve(_):
        step = td3bc.policy_step(parts.networks, config, state, observations, actions, penalty)
        cost_value = jax.lax.stop_gradient(step.aux)
        return (
            step,
            cost_critics.soft_update(cost_state, config.tau).target_critic,
            parts.lagrangian.update(state.lagrangian, cost_value),
        )

    def hold(_):
        aux = jnp.zeros((len(config.cost_limits),), jnp.float32)
        return td3bc.held_policy_step(state, aux), cost_state.target_critic, state.lagrangian

    return jax.lax.cond(td3bc.is_policy_update(config, state), improve, hold, None)


def td3bc_lag_update(
    parts: cost.SafeNetworks,
    config: TD3BCLagConfig,
    state: TD3BCLagState,
    batch: Batch,
    key: jax.Array,
) -> tuple[TD3BCLagState, Metrics]:
    """One update of TD3BC-Lag: TD3+BC's critic step, the cost critics' TD step at the
    target policy's next action, then the delayed policy, target and multiplier steps."""
    networks, costs = parts.networks, parts.costs
    cost.check_safe_batch(batch, costs.n_costs)
    observations, next_observations = state.policy.normalize_batch(batch)

    noise_key, critic_key = td3bc.split_for_critics(config, key)
    target_cost_key, cost_key = (
        jax.random.split(jax.random.fold_in(key, 1))
        if config.cost_critic.distributional
        else (None, None)
    )
    next_actions = td3bc.target_actions(networks, config, state, next_observations, noise_key)
    cost_targets = cost_critics.td_targets(
        costs,
        state.cost_critics,
        batch.costs,
        batch.discounts,
        next_observations,
        next_actions,
        target_cost_key,
    )
    state, c_loss, q = td3bc.critic_step(
        networks, state, batch, observations, next_observations, next_actions, critic_key
    )
    current_actions = jax.lax.stop_gradient(networks.act(state.policy.actor, observations))
    cost_state, qc_loss, qc = cost_critics.critic_step(
        costs,
        state.cost_critics,
        observations,
        batch.actions,
        cost_targets,
        floor=config.floor,
        policy_actions=current_actions,
        key=cost_key,
    )
    step, target_cost_critic, lagrangian_state = delayed_step(
        parts, config, state, cost_state, observations, batch.actions
    )
    new_state = td3bc.apply_policy_step(state, step).replace(
        cost_critics=cost_state.replace(target_critic=target_cost_critic),
        lagrangian=lagrangian_state,
    )
    metrics = {
        "critic_loss": c_loss,
        "cost_critic_loss": qc_loss,
        "actor_loss": step.loss,
        "q_mean": jnp.mean(q),
        "qc_mean": jnp.mean(qc),
    }
    return new_state, cost.with_channel_metrics(metrics, lagrangian_state.multiplier, step.aux)


def make_td3bc_lag(config: TD3BCLagConfig, obs_size: int, action_size: int) -> Algorithm:
    """TD3BC-Lag as ``Algorithm(init, update, act)``."""
    parts = make_networks(config, action_size)
    base = td3bc.make_td3bc(config, obs_size, action_size)  # acting is TD3+BC's

    def init(key: jax.Array) -> TD3BCLagState:
        actor_key, critic_key, cost_key = jax.random.split(key, 3)
        return td3bc.init_state(
            parts.networks,
            config,
            obs_size,
            action_size,
            actor_key,
            critic_key,
            state_type=TD3BCLagState,
            cost_critics=cost_critics.init_cost_critics(
                parts.costs, cost_key, obs_size, action_size
            ),
            lagrangian=parts.lagrangian.init(),
        )

    def update(state: TD3BCLagState, batch: Batch, key: jax.Array) -> tuple[TD3BCLagState, Metrics]:
        return td3bc_lag_update(parts, config, state, batch, key)

    return Algorithm(init=init, update=update, act=base.act)
