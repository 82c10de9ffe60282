"""Implicit Q-Learning (Kostrikov et al., 2021): expectile value regression, a critic
bootstrapped from the value, and advantage-weighted policy extraction.

Defaults are CORL's: (256, 256) networks, Adam at 3e-4, expectile 0.7, inverse
temperature 3.0, exponentiated advantages clipped at 100, tau 0.005, a Gaussian policy
with a tanh mean and a state-independent standard deviation.

The critics are mean critics, or with ``critic.kind="iqn"`` implicit quantile networks
(``distributional.py``) of the one-step target ``r + γ V(s')``. Their risk measure
(``critic.risk``) is what the value regresses on, so with CVaR the value is an iterated,
time-consistent CVaR of the return and the advantages favour actions with a better tail.

The update is written as building blocks that a variant reuses (``iql_lag.py``):
:func:`value_and_critic_step` (IQL's in-sample value learning) and :func:`actor_step`,
advantage-weighted regression on whatever advantage the caller gives it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from neorl_industrial.core.agents.distributional import CriticConfig, Critics, make_critics
from neorl_industrial.core.agents.losses import critic_loss, expectile_loss
from neorl_industrial.core.agents.networks import (
    MLP,
    PolicyParams,
    WeightInitConfig,
    check_network,
    check_positive,
    check_tau,
    fresh_actor_critic,
    make_act,
    polyak_average,
    stochastic_key,
)
from neorl_industrial.core.agents.types import Algorithm, Batch, Metrics
from neorl_industrial.core.optimizers import apply_gradients, make_optimizer

__all__ = [
    "GaussianActor",
    "IQLConfig",
    "IQLNetworks",
    "IQLState",
    "ValueStep",
    "actor_step",
    "awr_loss",
    "critic_loss",
    "expectile_loss",
    "finish_update",
    "init_state",
    "make_iql",
    "make_networks",
    "value_and_critic_step",
]

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


@dataclasses.dataclass(frozen=True)
class IQLConfig(WeightInitConfig):
    """Hyperparameters of IQL. Static: changing one builds a new algorithm.

    ``weight_init`` (:class:`WeightInitConfig`) initializes the actor, the value and the
    critics (the actor's state-independent log-std starts at 0 either way): PyTorch's
    ``uniform`` (CORL's and d3rlpy's) by default. On Pipeline-v0-medium (5 seeds, 10 000
    updates, (64, 64) networks, data seeds 29 and 41) it scored 44.8 ± 13.2 and
    57.4 ± 4.2 against 36.0 ± 17.6 and 34.3 ± 20.8 with flax's ``lecun``, whose seeds
    scattered from 5 to 53 (d3rlpy 33.6 ± 27.7 and 54.0 ± 7.4); level on IB-v0,
    DMSD-v0 and CSTR-stochastic-v0 medium, and earlier on CSTR-v0 and FourTank-v0
    (docs/peer_parity.md, docs/algorithms.md).
    """

    weight_init: str = "uniform"
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    value_lr: float = 3e-4
    hidden: tuple[int, ...] = (256, 256)
    expectile: float = 0.7
    beta: float = 3.0
    max_exp_advantage: float = 100.0
    tau: float = 0.005
    critic: CriticConfig = dataclasses.field(default_factory=CriticConfig)
    obs_mean: tuple[float, ...] | None = None
    obs_std: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        check_network(self)
        check_positive(self, "actor_lr", "critic_lr", "value_lr", "beta", "max_exp_advantage")
        if not 0.0 < self.expectile < 1.0:
            raise ValueError(f"expectile: must lie in (0, 1), got {self.expectile}")
        check_tau(self.tau)


class GaussianActor(nn.Module):
    """``Normal(tanh(f(s)), exp(log_std))`` with a learned, state-independent log_std."""

    action_size: int
    hidden: tuple[int, ...] = (256, 256)
    weight_init: str = "lecun"

    @nn.compact
    def __call__(self, observation: jax.Array) -> tuple[jax.Array, jax.Array]:
        network = MLP(self.hidden, output_size=self.action_size, weight_init=self.weight_init)
        mean = jnp.tanh(network(observation))
        log_std = self.param("log_std", nn.initializers.zeros, (self.action_size,))
        return mean, jnp.clip(log_std, LOG_STD_MIN, LOG_STD_MAX)


@struct.dataclass
class IQLState:
    """Training state of IQL (a variant's state subclasses it with more fields)."""

    policy: PolicyParams
    value: Any
    critic: Any
    target_critic: Any
    actor_opt_state: optax.OptState
    value_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    step: jax.Array


class IQLNetworks(NamedTuple):
    """The Gaussian actor, the value, the twin critics and their optimizers."""

    actor: GaussianActor
    value: MLP
    critic: Critics
    actor_optimizer: optax.GradientTransformation
    value_optimizer: optax.GradientTransformation
    critic_optimizer: optax.GradientTransformation

    def value_apply(self, value: Any, normalized: jax.Array) -> jax.Array:
        return self.value.apply(value, normalized)[..., 0]


class ValueStep(NamedTuple):
    """Losses of the value and critic steps, and the advantage's terms."""

    value_loss: jax.Array
    critic_loss: jax.Array
    target_q: jax.Array  # [B]: min Q_target(s, a)
    value: jax.Array  # [B]: V(s) before the step


def awr_loss(log_prob_t: jax.Array, advantage_t: jax.Array, beta: float, clip: float):
    """Advantage-weighted regression: ``-min(exp(beta * A), clip) * log pi(a|s)``."""
    chex.assert_rank([log_prob_t, advantage_t], [0, 0])
    chex.assert_type([log_prob_t, advantage_t], float)
    weight = jnp.minimum(jnp.exp(beta * advantage_t), clip)
    return -jax.lax.stop_gradient(weight) * log_prob_t


def make_networks(config: IQLConfig, action_size: int) -> IQLNetworks:
    return IQLNetworks(
        actor=GaussianActor(action_size, config.hidden, config.weight_init),
        value=MLP(config.hidden, output_size=1, weight_init=config.weight_init),
        critic=make_critics(config.critic, config.hidden, 2, weight_init=config.weight_init),
        actor_optimizer=make_optimizer(config.actor_lr),
        value_optimizer=make_optimizer(config.value_lr),
        critic_optimizer=make_optimizer(config.critic_lr),
    )


def init_state(
    networks: IQLNetworks,
    config: IQLConfig,
    obs_size: int,
    action_size: int,
    actor_key: jax.Array,
    value_key: jax.Array,
    critic_key: jax.Array,
    state_type: type[IQLState] = IQLState,
    **extra: Any,
) -> IQLState:
    """A fresh state; ``state_type`` (a subclass) is built with the ``extra`` fields."""
    actor_critic = fresh_actor_critic(
        networks, networks.critic, config, obs_size, action_size, actor_key, critic_key
    )
    value = networks.value.init(value_key, jnp.zeros((obs_size,), jnp.float32))
    return state_type(
        **actor_critic,
        value=value,
        value_opt_state=networks.value_optimizer.init(value),
        **extra,
    )


def value_and_critic_step(
    networks: IQLNetworks,
    config: IQLConfig,
    state: IQLState,
    batch: Batch,
    observations: jax.Array,
    next_observations: jax.Array,
    key: jax.Array | None = None,
) -> tuple[IQLState, ValueStep]:
    """The value by expectile regression on ``min Q_target(s, a)`` (the critics' risk
    measure), then the critics towards ``r + γ V(s')`` with the new value (quantile
    critics draw their fractions with ``key``); the target critics are left to the
    caller."""
    target_q = jnp.min(
        networks.critic.risk_values(state.target_critic, observations, batch.actions), axis=0
    )

    def value_objective(value: Any) -> tuple[jax.Array, jax.Array]:
        v = networks.value_apply(value, observations)
        losses = jax.vmap(expectile_loss, in_axes=(0, None))(target_q - v, config.expectile)
        return jnp.mean(losses), v

    value, value_opt_state, v_loss, v = apply_gradients(
        value_objective, state.value, networks.value_optimizer, state.value_opt_state
    )
    targets = batch.rewards + batch.discounts * networks.value_apply(value, next_observations)
    targets = jax.lax.stop_gradient(targets)

    def critic_objective(critic: Any) -> tuple[jax.Array, jax.Array]:
        return networks.critic.td_loss(critic, observations, batch.actions, targets, key)

    critic, critic_opt_state, c_loss, _ = apply_gradients(
        critic_objective, state.critic, networks.critic_optimizer, state.critic_opt_state
    )
    state = state.replace(
        value=value,
        value_opt_state=value_opt_state,
        critic=critic,
        critic_opt_state=critic_opt_state,
    )
    return state, ValueStep(v_loss, c_loss, target_q, v)


def actor_step(
    networks: IQLNetworks,
    config: IQLConfig,
    state: IQLState,
    observations: jax.Array,
    actions: jax.Array,
    advantages: jax.Array,
) -> tuple[IQLState, jax.Array, jax.Array]:
    """Advantage-weighted regression of the actor on the data's ``actions``.

    Returns:
        ``(state, loss, mean)``: the actor stepped, and the policy's mean actions at
        ``observations`` before the step.
    """

    def objective(actor: Any) -> tuple[jax.Array, jax.Array]:
        mean, log_std = networks.actor.apply(actor, observations)
        log_probs = jnp.sum(jax.scipy.stats.norm.logpdf(actions, mean, jnp.exp(log_std)), axis=-1)
        losses = jax.vmap(awr_loss, in_axes=(0, 0, None, None))(
            log_probs, advantages, config.beta, config.max_exp_advantage
        )
        return jnp.mean(losses), mean

    actor, opt_state, loss, mean = apply_gradients(
        objective, state.policy.actor, networks.actor_optimizer, state.actor_opt_state
    )
    state = state.replace(policy=state.policy.replace(actor=actor), actor_opt_state=opt_state)
    return state, loss, mean


def finish_update(config: IQLConfig, state: IQLState) -> IQLState:
    """``state`` with the target critics moved towards the new critics, one update further."""
    return state.replace(
        target_critic=polyak_average(state.critic, state.target_critic, config.tau),
        step=state.step + 1,
    )


def make_iql(config: IQLConfig, obs_size: int, action_size: int) -> Algorithm:
    """IQL as ``Algorithm(init, update, act)``."""
    networks = make_networks(config, action_size)

    def init(key: jax.Array) -> IQLState:
        actor_key, value_key, critic_key = jax.random.split(key, 3)
        return init_state(networks, config, obs_size, action_size, actor_key, value_key, critic_key)

    def update(state: IQLState, batch: Batch, key: jax.Array) -> tuple[IQLState, Metrics]:
        # Mean critics make the update deterministic given the batch; quantile critics
        # draw their fractions.
        key = key if config.critic.distributional else None
        chex.assert_rank([batch.observations, batch.actions, batch.rewards], [2, 2, 1])
        observations, next_observations = state.policy.normalize_batch(batch)
        state, values = value_and_critic_step(
            networks, config, state, batch, observations, next_observations, key
        )
        advantages = values.target_q - values.value
        state, a_loss, _ = actor_step(
            networks, config, state, observations, batch.actions, advantages
        )
        metrics = {
            "value_loss": values.value_loss,
            "critic_loss": values.critic_loss,
            "actor_loss": a_loss,
            "advantage_mean": jnp.mean(advantages),
        }
        return finish_update(config, state), metrics

    def action(policy: PolicyParams, observation: jax.Array, key, deterministic) -> jax.Array:
        mean, log_std = networks.actor.apply(policy.actor, policy.normalizer(observation))
        if deterministic:
            return mean
        noise = jax.random.normal(stochastic_key(key), mean.shape)
        return jnp.clip(mean + jnp.exp(log_std) * noise, -1.0, 1.0)

    return Algorithm(init=init, update=update, act=make_act(action))
