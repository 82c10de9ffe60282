"""Soft Actor-Critic (Haarnoja et al., 2018) as a NamedTuple of pure functions.

``make_sac(config, obs_size, action_size)`` closes over the static configuration and
returns ``Algorithm(init, update, act)``; the caller decides where ``jit``, ``vmap`` and
``lax.scan`` go. Losses are written for one transition and ``vmap``ped over the batch.

The agent trains twin critics (a vmapped :class:`CriticEnsemble`) against Polyak-averaged
targets and tunes the entropy temperature towards a target entropy of ``-action_size``.
Actions lie in (-1, 1), the range of the Industrial Benchmark's actions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from neorl_industrial.core.agents.networks import (
    CriticEnsemble,
    ObservationNormalizer,
    Params,
    PolicyParams,
    TanhGaussianActor,
    WeightInitConfig,
    check_network,
    check_positive,
    check_positive_int,
    check_tau,
    make_act,
    polyak_average,
)
from neorl_industrial.core.agents.types import Algorithm, Metrics
from neorl_industrial.core.optimizers import apply_gradients, make_optimizer


@struct.dataclass
class Batch:
    """A batch of transitions, every leaf with a leading batch axis.

    Attributes:
        observations: ``[B, obs_size]`` raw (unnormalized) observations.
        actions: ``[B, action_size]`` actions in (-1, 1).
        rewards: ``[B]`` raw rewards; the algorithm applies its own reward scaling.
        next_observations: ``[B, obs_size]`` the observation after the action (the final
            one when the episode ended there).
        discounts: ``[B]`` 0 where the episode terminated (no bootstrapping), 1 otherwise;
            truncation by a time limit is not termination. The algorithm multiplies in
            its own ``gamma``.
    """

    observations: jax.Array
    actions: jax.Array
    rewards: jax.Array
    next_observations: jax.Array
    discounts: jax.Array


@struct.dataclass
class SACState:
    """Training state of SAC.

    Attributes:
        policy: actor parameters and observation normalization.
        critic: parameters of the critic ensemble (leading axis: critic).
        target_critic: Polyak-averaged copy of ``critic``.
        actor_opt_state: optimizer state of the actor.
        critic_opt_state: optimizer state of the critics.
        log_alpha: log of the entropy temperature.
        alpha_opt_state: optimizer state of the temperature.
        step: number of updates applied.
    """

    policy: PolicyParams
    critic: Params
    target_critic: Params
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    log_alpha: jax.Array
    alpha_opt_state: optax.OptState
    step: jax.Array


@dataclasses.dataclass(frozen=True)
class SACConfig(WeightInitConfig):
    """Hyperparameters of SAC. Static: changing one builds a new algorithm.

    Attributes:
        actor_lr: Adam learning rate of the actor.
        critic_lr: Adam learning rate of the critics.
        alpha_lr: Adam learning rate of the log temperature.
        gamma: discount factor.
        tau: Polyak averaging rate of the target critics.
        hidden: hidden layer widths of actor and critics.
        n_critics: critics in the ensemble; the minimum over them is bootstrapped.
        reward_scale: rewards enter the losses as ``reward_scale * (reward + reward_shift)``.
        reward_shift: see ``reward_scale``. A constant shift leaves the optimal policy
            unchanged only for tasks that never terminate (such as the Industrial
            Benchmark, which only truncates).
        initial_alpha: entropy temperature at initialization.
        target_entropy: entropy the temperature is tuned towards; ``None`` for
            ``-action_size``.
        max_grad_norm: clip every gradient to this global norm; ``None`` disables it.
        obs_mean: per-feature observation mean (e.g. of a random-policy rollout); ``None``
            leaves observations unnormalized. A tuple, so the config stays hashable and
            loggable (``create`` converts an array).
        obs_std: per-feature observation standard deviation, with ``obs_mean``.
        weight_init: the actor's and critics' initialization (:class:`WeightInitConfig`).
    """

    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    alpha_lr: float = 3e-4
    gamma: float = 0.99
    tau: float = 0.005
    hidden: tuple[int, ...] = (256, 256)
    n_critics: int = 2
    reward_scale: float = 1.0
    reward_shift: float = 0.0
    initial_alpha: float = 1.0
    target_entropy: float | None = None
    max_grad_norm: float | None = None
    obs_mean: tuple[float, ...] | None = None
    obs_std: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        check_network(self)
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma: must lie in [0, 1], got {self.gamma}")
        check_tau(self.tau)
        check_positive_int(self, "n_critics")
        check_positive(self, "initial_alpha", "actor_lr", "critic_lr", "alpha_lr")


# ----- losses of one transition ---------------------------------------------------------
def soft_td_loss(
    q_tm1: jax.Array,
    r_t: jax.Array,
    discount_t: jax.Array,
    q_t: jax.Array,
    log_prob_t: jax.Array,
    alpha: jax.Array,
) -> jax.Array:
    """Squared soft TD error of every critic for one transition.

    Args:
        q_tm1: ``[n_critics]`` values of the taken action.
        r_t: scaled reward.
        discount_t: ``gamma`` times the continuation flag.
        q_t: ``[n_critics]`` target-critic values of the next action.
        log_prob_t: log-probability of the next action under the current policy.
        alpha: entropy temperature.

    Returns:
        Half the squared error summed over critics.
    """
    chex.assert_rank(q_tm1, 1)
    chex.assert_shape(q_t, q_tm1.shape)
    chex.assert_rank([r_t, discount_t, log_prob_t, alpha], 0)
    chex.assert_type([q_tm1, q_t, r_t, discount_t, log_prob_t, alpha], float)
    soft_value_t = jnp.min(q_t) - alpha * log_prob_t
    target = jax.lax.stop_gradient(r_t + discount_t * soft_value_t)
    return 0.5 * jnp.sum(jnp.square(q_tm1 - target))


def actor_loss(q: jax.Array, log_prob: jax.Array, alpha: jax.Array) -> jax.Array:
    """Policy loss of one state: temperature-weighted log-probability minus the value.

    Args:
        q: ``[n_critics]`` values of the action the policy drew.
        log_prob: its log-probability.
        alpha: entropy temperature (not trained by this loss).
    """
    chex.assert_rank(q, 1)
    chex.assert_rank([log_prob, alpha], 0)
    return jax.lax.stop_gradient(alpha) * log_prob - jnp.min(q)


def temperature_loss(log_alpha: jax.Array, log_prob: jax.Array, target_entropy: float) -> jax.Array:
    """Loss of the log temperature for one state: raises it while the policy's entropy
    is below the target, lowers it while above."""
    chex.assert_rank([log_alpha, log_prob], 0)
    return -log_alpha * jax.lax.stop_gradient(log_prob + target_entropy)


# ----- the steps (CQL reuses them: cql.py) --------------------------------------------
def actor_step(
    actor: TanhGaussianActor,
    optimizer: optax.GradientTransformation,
    state: SACState,
    observations: jax.Array,
    key: jax.Array,
    values: Callable[[Params, jax.Array], jax.Array],
) -> tuple[Params, optax.OptState, jax.Array, jax.Array]:
    """One step of the actor on ``α log π(a|s) - min Q(s, a)`` for actions it draws with
    ``key`` at the (normalized) ``observations``, with ``α`` the state's temperature.

    Args:
        values: ``values(actor_params, actions) -> [n_critics, B]``: what the drawn actions
            are worth (the critics' values; the hook through which a variant changes what
            the actor maximizes).

    Returns:
        ``(actor_params, opt_state, loss, log_probs)``; ``log_probs`` (``[B]``) are those
        of the actions drawn before the step.
    """
    alpha = jnp.exp(state.log_alpha)

    def objective(actor_params: Params) -> tuple[jax.Array, jax.Array]:
        actions, log_probs = actor.sample(actor_params, observations, key)
        q_policy = values(actor_params, actions)
        losses = jax.vmap(actor_loss, in_axes=(1, 0, None))(q_policy, log_probs, alpha)
        return jnp.mean(losses), log_probs

    return apply_gradients(objective, state.policy.actor, optimizer, state.actor_opt_state)


def temperature_step(
    optimizer: optax.GradientTransformation,
    state: SACState,
    log_probs: jax.Array,
    target_entropy: float,
) -> tuple[jax.Array, optax.OptState, jax.Array]:
    """One step of the log temperature towards ``target_entropy`` from the ``log_probs``
    of the policy's actions.

    Returns:
        ``(log_alpha, opt_state, loss)``.
    """

    def objective(log_alpha: jax.Array) -> tuple[jax.Array, None]:
        losses = jax.vmap(temperature_loss, in_axes=(None, 0, None))(
            log_alpha, log_probs, target_entropy
        )
        return jnp.mean(losses), None

    log_alpha, opt_state, loss, _ = apply_gradients(
        objective, state.log_alpha, optimizer, state.alpha_opt_state
    )
    return log_alpha, opt_state, loss


def finish_update(
    state: SACState,
    tau: float,
    actor: tuple[Params, optax.OptState],
    critic: tuple[Params, optax.OptState],
    temperature: tuple[jax.Array, optax.OptState],
) -> SACState:
    """``state`` with the stepped ``(params, opt_state)`` of actor, critics and temperature,
    the target critics moved a fraction ``tau`` towards the new critics, one update
    further."""
    (actor_params, actor_opt_state), (critic_params, critic_opt_state) = actor, critic
    log_alpha, alpha_opt_state = temperature
    return state.replace(
        policy=state.policy.replace(actor=actor_params),
        critic=critic_params,
        target_critic=polyak_average(critic_params, state.target_critic, tau),
        actor_opt_state=actor_opt_state,
        critic_opt_state=critic_opt_state,
        log_alpha=log_alpha,
        alpha_opt_state=alpha_opt_state,
        step=state.step + 1,
    )


# ----- the algorithm -----------------------------------------------------------------
class SACNetworks(NamedTuple):
    """The actor, the critic ensemble, their optimizers and the temperature's, and the
    entropy the temperature is tuned towards."""

    actor: TanhGaussianActor
    critic: CriticEnsemble
    actor_optimizer: optax.GradientTransformation
    critic_optimizer: optax.GradientTransformation
    alpha_optimizer: optax.GradientTransformation
    target_entropy: float


def make_networks(config: SACConfig, action_size: int) -> SACNetworks:
    """The networks and optimizers of ``config`` for actions of ``action_size``."""
    target_entropy = (
        -float(action_size) if config.target_entropy is None else float(config.target_entropy)
    )
    return SACNetworks(
        actor=TanhGaussianActor(action_size, config.hidden, weight_init=config.weight_init),
        critic=CriticEnsemble(config.hidden, config.n_critics, weight_init=config.weight_init),
        actor_optimizer=make_optimizer(config.actor_lr, config.max_grad_norm),
        critic_optimizer=make_optimizer(config.critic_lr, config.max_grad_norm),
        alpha_optimizer=make_optimizer(config.alpha_lr),
        target_entropy=target_entropy,
    )


def init_state(
    networks: SACNetworks, config: SACConfig, obs_size: int, action_size: int, key: jax.Array
) -> SACState:
    """A fresh state: new actor and critics, the target critics a copy of the critics,
    the temperature at ``config.initial_alpha``."""
    actor_key, critic_key = jax.random.split(key)
    observation = jnp.zeros((1, obs_size), jnp.float32)
    action = jnp.zeros((1, action_size), jnp.float32)
    actor_params = networks.actor.init(actor_key, observation)
    critic_params = networks.critic.init(critic_key, observation, action)
    normalizer = ObservationNormalizer.from_config(config, obs_size)
    log_alpha = jnp.asarray(np.log(config.initial_alpha), jnp.float32)
    return SACState(
        policy=PolicyParams(actor=actor_params, normalizer=normalizer),
        critic=critic_params,
        # A copy, not an alias: callers may donate the state to a jitted update.
        target_critic=jax.tree.map(jnp.copy, critic_params),
        actor_opt_state=networks.actor_optimizer.init(actor_params),
        critic_opt_state=networks.critic_optimizer.init(critic_params),
        log_alpha=log_alpha,
        alpha_opt_state=networks.alpha_optimizer.init(log_alpha),
        step=jnp.zeros((), jnp.int32),
    )


def critic_step(
    networks: SACNetworks,
    state: SACState,
    transition: tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array],
    alpha: jax.Array,
    key: jax.Array,
) -> tuple[Params, optax.OptState, jax.Array, jax.Array]:
    """One step of the critics towards the soft value of the next state under the policy
    (its action drawn with ``key``).

    Args:
        transition: ``(observations, actions, rewards, discounts, next_observations)``,
            the observations normalized, rewards scaled and discounts times ``gamma``.
        alpha: the entropy temperature.

    Returns:
        ``(critic_params, opt_state, loss, q)``; ``q`` (``[n_critics, B]``) before the step.
    """
    observations, actions, rewards, discounts, next_observations = transition
    next_actions, next_log_probs = networks.actor.sample(state.policy.actor, next_observations, key)
    next_q = networks.critic.apply(state.target_critic, next_observations, next_actions)

    def objective(critic_params: Params) -> tuple[jax.Array, jax.Array]:
        q = networks.critic.apply(critic_params, observations, actions)
        losses = jax.vmap(soft_td_loss, in_axes=(1, 0, 0, 1, 0, None))(
            q, rewards, discounts, next_q, next_log_probs, alpha
        )
        return jnp.mean(losses), q

    return apply_gradients(
        objective, state.critic, networks.critic_optimizer, state.critic_opt_state
    )


def sac_update(
    networks: SACNetworks, config: SACConfig, state: SACState, batch: Batch, key: jax.Array
) -> tuple[SACState, Metrics]:
    """One update of SAC: the critics, then the actor against the updated critics, then
    the temperature, then the targets."""
    next_key, actor_key = jax.random.split(key)
    observations, next_observations = state.policy.normalize_batch(batch)
    rewards = config.reward_scale * (batch.rewards + config.reward_shift)
    discounts = config.gamma * batch.discounts
    alpha = jnp.exp(state.log_alpha)

    # Critics: regress towards the soft value of the next state under the policy.
    transition = (observations, batch.actions, rewards, discounts, next_observations)
    critic_params, critic_opt_state, critic_loss_value, q = critic_step(
        networks, state, transition, alpha, next_key
    )
    # Actor: maximize the (freshly updated) critics' value plus entropy.
    actor_params, actor_opt_state, actor_loss_value, log_probs = actor_step(
        networks.actor,
        networks.actor_optimizer,
        state,
        observations,
        actor_key,
        lambda _, actions: networks.critic.apply(critic_params, observations, actions),
    )
    # Temperature: keep the policy's entropy near the target.
    log_alpha, alpha_opt_state, alpha_loss_value = temperature_step(
        networks.alpha_optimizer, state, log_probs, networks.target_entropy
    )
    new_state = finish_update(
        state,
        config.tau,
        actor=(actor_params, actor_opt_state),
        critic=(critic_params, critic_opt_state),
        temperature=(log_alpha, alpha_opt_state),
    )
    metrics = {
        "critic_loss": critic_loss_value,
        "actor_loss": actor_loss_value,
        "alpha_loss": alpha_loss_value,
        "alpha": alpha,
        "entropy": -jnp.mean(log_probs),
        "q_mean": jnp.mean(q),
        "scaled_reward_mean": jnp.mean(rewards),
    }
    return new_state, metrics


def make_sac(config: SACConfig, obs_size: int, action_size: int) -> Algorithm:
    """Builds SAC for observations of ``obs_size`` and actions of ``action_size``.

    Raises:
        ValueError: when the sizes are not positive or disagree with the config's
            observation statistics.
    """
    if obs_size < 1 or action_size < 1:
        raise ValueError(
            f"obs_size and action_size: expected positive sizes, got {obs_size}, {action_size}"
        )
    if config.obs_mean is not None and len(config.obs_mean) != obs_size:
        raise ValueError(
            f"obs_mean: has {len(config.obs_mean)} values but observations have {obs_size}"
        )
    networks = make_networks(config, action_size)

    def init(key: jax.Array) -> SACState:
        return init_state(networks, config, obs_size, action_size, key)

    def update(state: SACState, batch: Batch, key: jax.Array) -> tuple[SACState, Metrics]:
        batch_size = batch.rewards.shape[0]
        chex.assert_shape(batch.observations, (batch_size, obs_size))
        chex.assert_shape(batch.next_observations, (batch_size, obs_size))
        chex.assert_shape(batch.actions, (batch_size, action_size))
        chex.assert_shape([batch.rewards, batch.discounts], (batch_size,))
        return sac_update(networks, config, state, batch, key)

    # SAC acts for data generation and online training: a draw unless told otherwise.
    return Algorithm(
        init=init, update=update, act=make_act(networks.actor.act, deterministic=False)
    )
