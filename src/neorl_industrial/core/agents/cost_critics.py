"""Cost critics of the safe agents: for each cost channel a pair of critics of the
discounted cost, pessimistic (the pair's larger value) wherever they bootstrap.

All pairs are one ensemble of ``2 * n_costs`` members (``distributional.Critics``: mean
critics, or implicit quantile networks of the cost's distribution), read as
``[n_costs, 2, B]``. Where the policy is judged (the actor's penalty, the multiplier's
cost value) a quantile critic gives its risk measure of the upper tail: with
``cost_critic.risk="cvar"`` the Lagrangian holds the CVaR of the cost under the limit, not
its mean. Two ways to learn them:

* TD (TD3BC-Lag), :func:`td_targets` + :func:`critic_step`: towards
  ``c + γ max_pair Q_c^target(s', a')`` at the target policy's next action, with an
  optional floor that holds the estimate at the policy's actions no lower than at the
  data's;
* in-sample (IQL-Lag), :func:`in_sample_step`: a cost value ``V_c`` fit by expectile
  regression to ``max_pair Q_c^target(s, a)`` at the data's action, and the critics towards
  ``c + γ V_c(s')``; no action outside the data is queried.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from neorl_industrial.core.agents.distributional import (
    CriticConfig,
    Critics,
    make_critics,
    pessimistic,
)
from neorl_industrial.core.agents.losses import expectile_loss
from neorl_industrial.core.agents.networks import MLP, polyak_average
from neorl_industrial.core.optimizers import apply_gradients, make_optimizer

#: The cost critics every safe agent had: pairs of mean critics.
MEAN_CRITIC = CriticConfig()

__all__ = [
    "CostCriticState",
    "CostCritics",
    "InSampleCostCritics",
    "InSampleCostState",
    "InSampleCostStep",
    "critic_step",
    "in_sample_step",
    "init_cost_critics",
    "init_in_sample",
    "make_cost_critics",
    "make_in_sample_cost_critics",
    "soft_update",
    "td_targets",
]


class CostCritics(NamedTuple):
    """The ensemble of cost-critic pairs and its optimizer."""

    critics: Critics
    optimizer: optax.GradientTransformation
    n_costs: int

    def _pairs(self, values: jax.Array) -> jax.Array:
        return values.reshape(self.n_costs, 2, *values.shape[1:])

    def q_values(self, params: Any, observations: jax.Array, actions: jax.Array) -> jax.Array:
        """``[n_costs, 2, B]`` expected discounted costs."""
        return self._pairs(self.critics.values(params, observations, actions))

    def risk_values(self, params: Any, observations: jax.Array, actions: jax.Array) -> jax.Array:
        """``[n_costs, 2, B]`` the cost critics' risk measure of the upper tail (the
        expectation for mean critics and a neutral measure)."""
        return self._pairs(self.critics.risk_values(params, observations, actions, upper=True))


@struct.dataclass
class CostCriticState:
    """Online and target parameters of the cost critics, and the optimizer's state."""

    critic: Any
    target_critic: Any
    critic_opt_state: optax.OptState


def make_cost_critics(
    hidden: Sequence[int],
    n_costs: int,
    learning_rate: float,
    critic: CriticConfig = MEAN_CRITIC,
    weight_init: str = "lecun",
) -> CostCritics:
    return CostCritics(
        critics=make_critics(critic, hidden, 2 * n_costs, weight_init=weight_init),
        optimizer=make_optimizer(learning_rate),
        n_costs=n_costs,
    )


def init_cost_critics(
    critics: CostCritics, key: jax.Array, obs_size: int, action_size: int
) -> CostCriticState:
    critic = critics.critics.init(key, obs_size, action_size)
    return CostCriticState(
        critic=critic, target_critic=critic, critic_opt_state=critics.optimizer.init(critic)
    )


def td_targets(
    critics: CostCritics,
    state: CostCriticState,
    costs: jax.Array,
    discounts: jax.Array,
    next_observations: jax.Array,
    next_actions: jax.Array,
    key: jax.Array | None = None,
) -> jax.Array:
    """``c + γ max_pair Q_c^target(s', a')``, ``[n_costs, B, N']``; ``costs`` is
    ``[B, n_costs]``. For quantile critics the pair's member with the higher mean gives its
    ``N'`` quantiles at fractions drawn with ``key``; mean critics give ``N' = 1``."""
    next_qc = critics.critics.target_distribution(
        state.target_critic, next_observations, next_actions, key
    )  # [2 n_costs, B, N']
    worst = jax.vmap(lambda pair: pessimistic(pair, highest=True))(critics._pairs(next_qc))
    return jax.lax.stop_gradient(costs.T[..., None] + discounts[:, None] * worst)


def critic_step(
    critics: CostCritics,
    state: CostCriticState,
    observations: jax.Array,
    actions: jax.Array,
    targets: jax.Array,
    floor: float = 0.0,
    policy_actions: jax.Array | None = None,
    key: jax.Array | None = None,
) -> tuple[CostCriticState, jax.Array, jax.Array]:
    """One step of every pair towards its channel's ``targets`` (``[n_costs, B]`` or
    ``[n_costs, B, N']``).

    Args:
        floor: weight of a penalty on the expected cost at ``policy_actions`` falling
            below that at the data's ``actions`` (0: off; a Python number, static). For
            mean critics only: on quantile critics it diverges (see
            ``TD3BCLagConfig.cost_floor``), and the agents refuse it.
        policy_actions: the policy's actions, needed when ``floor`` is positive.
        key: the fractions quantile critics draw.

    Returns:
        ``(state, loss, qc)`` with the online critics stepped (the target is left to
        :func:`soft_update`); ``qc`` is ``[n_costs, 2, B]`` before the step.
    """
    targets = targets if targets.ndim == 3 else targets[..., None]

    def objective(params: Any) -> tuple[jax.Array, jax.Array]:
        loss, qc = critics.critics.td_loss(
            params, observations, actions, targets, key, groups=critics.n_costs
        )
        if floor > 0.0:
            # The policy's actions are off the data, where a critic trained on the data
            # can be arbitrarily optimistic about cost and the actor would exploit it:
            # their estimate is held no lower than that of the data's action.
            at_data = critics.q_values(params, observations, actions)
            qc_policy = critics.q_values(params, observations, policy_actions)
            shortfall = jax.nn.relu(jax.lax.stop_gradient(at_data) - qc_policy)
            loss = loss + floor * jnp.mean(jnp.sum(shortfall, axis=(0, 1)))
        return loss, critics._pairs(qc)

    critic, opt_state, loss, qc = apply_gradients(
        objective, state.critic, critics.optimizer, state.critic_opt_state
    )
    return state.replace(critic=critic, critic_opt_state=opt_state), loss, qc


def soft_update(state: CostCriticState, tau: float) -> CostCriticState:
    """The target critics moved a fraction ``tau`` towards the online ones."""
    return state.replace(target_critic=polyak_average(state.critic, state.target_critic, tau))


# ----- in-sample ---------------------------------------------------------------------------


class InSampleCostCritics(NamedTuple):
    """Cost-critic pairs with a cost value per channel, both learned in-sample."""

    critics: CostCritics
    value_network: MLP
    value_optimizer: optax.GradientTransformation
    expectile: float

    def cost_values(self, params: Any, observations: jax.Array) -> jax.Array:
        """``V_c(s)``, ``[n_costs, B]``."""
        return jnp.moveaxis(self.value_network.apply(params, observations), -1, 0)


@struct.dataclass
class InSampleCostState(CostCriticState):
    """The cost critics' state plus the cost value's parameters and optimizer state."""

    value: Any
    value_opt_state: optax.OptState


class InSampleCostStep(NamedTuple):
    """Losses of an in-sample step, and the advantage's terms at the data's actions."""

    value_loss: jax.Array
    critic_loss: jax.Array
    target_q: jax.Array  # [n_costs, B]: max_pair Q_c^target(s, a)
    value: jax.Array  # [n_costs, B]: V_c(s) before the step


def make_in_sample_cost_critics(
    hidden: Sequence[int],
    n_costs: int,
    value_lr: float,
    critic_lr: float,
    expectile: float,
    critic: CriticConfig = MEAN_CRITIC,
    weight_init: str = "lecun",
) -> InSampleCostCritics:
    return InSampleCostCritics(
        critics=make_cost_critics(hidden, n_costs, critic_lr, critic, weight_init),
        value_network=MLP(tuple(hidden), output_size=n_costs, weight_init=weight_init),
        value_optimizer=make_optimizer(value_lr),
        expectile=expectile,
    )


def init_in_sample(
    model: InSampleCostCritics,
    value_key: jax.Array,
    critic_key: jax.Array,
    obs_size: int,
    action_size: int,
) -> InSampleCostState:
    critics = init_cost_critics(model.critics, critic_key, obs_size, action_size)
    value = model.value_network.init(value_key, jnp.zeros((obs_size,), jnp.float32))
    return InSampleCostState(
        critic=critics.critic,
        target_critic=critics.target_critic,
        critic_opt_state=critics.critic_opt_state,
        value=value,
        value_opt_state=model.value_optimizer.init(value),
    )


def in_sample_step(
    model: InSampleCostCritics,
    state: InSampleCostState,
    observations: jax.Array,
    actions: jax.Array,
    costs: jax.Array,
    discounts: jax.Array,
    next_observations: jax.Array,
    key: jax.Array | None = None,
) -> tuple[InSampleCostState, InSampleCostStep]:
    """The cost value by expectile regression on the pairs' larger target value, then the
    critics towards ``c + γ V_c(s')`` with the new value (IQL's order).

    Quantile critics learn the distribution of ``c + γ V_c(s')`` (fractions drawn with
    ``key``), and the value regresses on their risk measure of its upper tail: with CVaR
    the value is an iterated, time-consistent CVaR of the cost."""
    target_qc = jnp.max(model.critics.risk_values(state.target_critic, observations, actions), 1)
    expectile = jax.vmap(expectile_loss, in_axes=(0, None))

    def value_objective(value: Any) -> tuple[jax.Array, jax.Array]:
        vc = model.cost_values(value, observations)  # [n_costs, B]
        losses = jax.vmap(lambda d: expectile(d, model.expectile))(target_qc - vc)
        return jnp.mean(jnp.sum(losses, axis=0)), vc

    value, value_opt_state, value_loss, vc = apply_gradients(
        value_objective, state.value, model.value_optimizer, state.value_opt_state
    )
    targets = jax.lax.stop_gradient(
        costs.T + discounts * model.cost_values(value, next_observations)
    )
    state = state.replace(value=value, value_opt_state=value_opt_state)
    state, q_loss, _ = critic_step(model.critics, state, observations, actions, targets, key=key)
    return state, InSampleCostStep(value_loss, q_loss, target_qc, vc)
