"""Conservative Q-Learning (Kumar et al., 2020) with a SAC-style actor.

The critic's TD loss gains a penalty that pushes Q down on actions sampled uniformly and
from the current policy (a soft maximum over them, with importance weights) and up on the
dataset's actions. The Lagrangian variant (CQL-alpha) tunes the penalty's weight so the
gap between the two meets ``target_action_gap``. Defaults follow CORL: policy lr 3e-5,
critic lr 3e-4, 10 sampled actions, penalty weight 10, temperature 1, tau 5e-3, automatic
entropy tuning towards ``-action_size``, no entropy in the backup.

With ``critic.kind="iqn"`` the critics are implicit quantile networks and the agent is
CODAC's (Ma et al., 2021): quantile TD towards the pessimistic member's target
distribution, the conservative penalty applied at every sampled fraction, and the actor
maximizing the critics' risk measure (``critic.risk``: CVaR, Wang) of the return.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax
from flax import struct

from neorl_industrial.core.agents import sac
from neorl_industrial.core.agents.distributional import (
    CriticConfig,
    Critics,
    make_critics,
    pessimistic,
)
from neorl_industrial.core.agents.networks import (
    TanhGaussianActor,
    WeightInitConfig,
    check_network,
    check_non_negative,
    check_positive,
    check_positive_int,
    check_tau,
    fresh_actor_critic,
    make_act,
)
from neorl_industrial.core.agents.types import Algorithm, Metrics
from neorl_industrial.core.optimizers import apply_gradients, make_optimizer


@dataclasses.dataclass(frozen=True)
class CQLConfig(WeightInitConfig):
    """Hyperparameters of CQL. Static: changing one builds a new algorithm.

    Attributes:
        lagrange: tune the penalty weight so that the gap meets ``target_action_gap``.
        target_action_gap: the gap the Lagrangian variant aims for.
        bc_steps: for the first ``bc_steps`` updates the actor maximizes the
            log-likelihood of the dataset's actions instead of Q (CORL's warm start, which
            keeps the critics' bootstrap targets on the data while they settle).
        weight_init: the networks' weight initialization (``networks.KERNEL_INITS``). CQL's is
            PyTorch's ``uniform`` (CORL's and d3rlpy's): with flax's ``lecun`` (three
            times the weight variance) one seed in five collapsed on IB-v0-low (5 seeds,
            10 000 updates: 21.7 ± 88.9), with ``uniform`` none did (29.6 ± 1.0, d3rlpy
            28-30); see docs/algorithms.md.
    """

    actor_lr: float = 3e-5
    critic_lr: float = 3e-4
    alpha_lr: float = 3e-5
    hidden: tuple[int, ...] = (256, 256)
    tau: float = 5e-3
    n_actions: int = 10
    cql_alpha: float = 10.0
    temperature: float = 1.0
    lagrange: bool = False
    target_action_gap: float = 5.0
    alpha_prime_lr: float = 3e-4
    bc_steps: int = 0
    weight_init: str = "uniform"
    critic: CriticConfig = dataclasses.field(default_factory=CriticConfig)
    obs_mean: tuple[float, ...] | None = None
    obs_std: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        check_network(self)
        check_positive(self, "actor_lr", "critic_lr", "alpha_lr", "alpha_prime_lr", "temperature")
        check_non_negative(self, "cql_alpha", "bc_steps")
        check_positive_int(self, "n_actions")
        check_tau(self.tau)


@struct.dataclass
class CQLState(sac.SACState):
    """SAC's state (actor, critics, targets, temperature) and the penalty's weight: its log
    and the optimizer's state of the Lagrangian variant."""

    log_alpha_prime: jax.Array
    alpha_prime_opt_state: optax.OptState


def cql_gap(q_data_t: jax.Array, q_sampled_t: jax.Array, temperature: float) -> jax.Array:
    """Soft maximum of Q over sampled actions minus Q of the data's action, per critic.

    Args:
        q_data_t: ``[n_critics]`` Q of the dataset's action.
        q_sampled_t: ``[n_critics, n_samples]`` importance-weighted Q of sampled actions.
        temperature: of the soft maximum.
    """
    chex.assert_rank([q_data_t, q_sampled_t], [1, 2])
    chex.assert_type([q_data_t, q_sampled_t], float)
    soft_max = temperature * jax.scipy.special.logsumexp(q_sampled_t / temperature, axis=1)
    return soft_max - q_data_t


class Proposals(NamedTuple):
    """The actions the penalty's soft maximum runs over, ``3n`` per observation: ``n``
    uniform, ``n`` of the policy at ``s`` and ``n`` at ``s'``, and their log-densities."""

    actions: jax.Array  # [3n, B, action_size]
    log_densities: jax.Array  # [3n, B]


class CriticInputs(NamedTuple):
    """What the critics' loss reads of one update's batch: the normalized observations,
    the data's actions, their bootstrap targets and the penalty's proposals."""

    observations: jax.Array  # [B, obs_size]
    actions: jax.Array  # [B, action_size]
    targets: jax.Array  # [B, N']
    proposals: Proposals


def critic_loss(
    critics: Critics,
    config: CQLConfig,
    critic: Any,
    inputs: CriticInputs,
    alpha_prime: jax.Array,
    fraction_key: jax.Array | None = None,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
    """The critics' TD loss towards ``inputs.targets`` plus the conservative penalty, what
    CQL adds to an actor-critic.

    Args:
        alpha_prime: the penalty's Lagrangian weight (used when ``config.lagrange``).
        fraction_key: the fractions quantile critics draw.

    Returns:
        ``(loss, (td, gap, q_mean))``: ``gap`` per critic, ``q_mean`` the mean value of the
        data's actions.
    """
    observations, actions, targets, proposals = inputs
    batch_size = observations.shape[0]
    # The dataset's action and the 3n proposals in one pass.
    every_action = jnp.concatenate([actions[None], proposals.actions], axis=0)
    if critics.distributional:
        # CODAC: quantiles at fractions drawn per transition, the penalty's soft maximum
        # taken at every fraction: [2, 1 + 3n, B, N].
        fractions = jax.random.uniform(fraction_key, (batch_size, config.critic.n_quantiles))
        q_all = critics.network.apply(critic, observations, every_action, fractions)
        td = critics.quantile_loss(q_all[:, 0], fractions, targets)
        q_sampled = q_all[:, 1:] - proposals.log_densities[None, ..., None]
        gaps = jax.vmap(jax.vmap(cql_gap, in_axes=(1, 2, None)), in_axes=(2, 3, None))(
            q_all[:, 0], q_sampled, config.temperature
        )  # [N, B, 2]
        gap = jnp.mean(gaps, axis=(0, 1))
        q_data = jnp.mean(q_all[:, 0], axis=-1)
    else:
        q_all = critics.network.apply(critic, observations, every_action)  # [2, 1+3n, B]
        q_data = q_all[:, 0]  # [2, B]
        td = jnp.mean(jnp.sum(jnp.square(q_data - targets[None, :, 0]), axis=0))
        q_sampled = q_all[:, 1:] - proposals.log_densities[None]  # [2, 3n, B]
        gaps = jax.vmap(cql_gap, in_axes=(1, 2, None))(
            q_data, q_sampled, config.temperature
        )  # [B, 2]
        gap = jnp.mean(gaps, axis=0)  # per critic
    if config.lagrange:
        penalty = alpha_prime * config.cql_alpha * (gap - config.target_action_gap)
    else:
        penalty = config.cql_alpha * gap
    return td + jnp.sum(penalty), (td, gap, jnp.mean(q_data))


class CQLNetworks(NamedTuple):
    """The actor, the critics, the optimizers of both, of the temperature and of the
    penalty's weight, and the entropy the temperature is tuned towards."""

    actor: TanhGaussianActor
    critics: Critics
    actor_optimizer: optax.GradientTransformation
    critic_optimizer: optax.GradientTransformation
    alpha_optimizer: optax.GradientTransformation
    alpha_prime_optimizer: optax.GradientTransformation
    target_entropy: float


def make_networks(config: CQLConfig, action_size: int) -> CQLNetworks:
    """The networks and optimizers of ``config`` for actions of ``action_size``."""
    return CQLNetworks(
        actor=TanhGaussianActor(action_size, config.hidden, weight_init=config.weight_init),
        critics=make_critics(config.critic, config.hidden, 2, weight_init=config.weight_init),
        actor_optimizer=make_optimizer(config.actor_lr),
        critic_optimizer=make_optimizer(config.critic_lr),
        alpha_optimizer=make_optimizer(config.alpha_lr),
        alpha_prime_optimizer=make_optimizer(config.alpha_prime_lr),
        target_entropy=-float(action_size),
    )


def init_state(
    networks: CQLNetworks, config: CQLConfig, obs_size: int, action_size: int, key: jax.Array
) -> CQLState:
    """A fresh state: new actor and critics (the targets the same), temperature and
    penalty weight at 1 (their logs at 0)."""
    actor_key, critic_key = jax.random.split(key)
    actor_critic = fresh_actor_critic(
        networks, networks.critics, config, obs_size, action_size, actor_key, critic_key
    )
    zero = jnp.zeros((), jnp.float32)
    return CQLState(
        **actor_critic,
        log_alpha=zero,
        log_alpha_prime=zero,
        alpha_opt_state=networks.alpha_optimizer.init(zero),
        alpha_prime_opt_state=networks.alpha_prime_optimizer.init(zero),
    )


def actor_values(
    networks: CQLNetworks,
    config: CQLConfig,
    state: CQLState,
    observations: jax.Array,
    data_actions: jax.Array,
    actor_params: Any,
    actions: jax.Array,
) -> jax.Array:
    """What the actor maximizes (``sac.actor_step``'s ``values``, with the first five
    arguments bound): the current critics' risk values of ``actions``; during the warm
    start (``state.step < config.bc_steps``) the log-likelihood of ``data_actions``."""
    q = networks.critics.risk_values(state.critic, observations, actions)
    if config.bc_steps == 0:
        return q
    data_log_prob = networks.actor.log_prob(actor_params, observations, data_actions)
    return jnp.where(state.step < config.bc_steps, data_log_prob[None], q)


def bootstrap_targets(
    networks: CQLNetworks,
    state: CQLState,
    actor_params: Any,
    batch: Any,
    next_observations: jax.Array,
    keys: tuple[jax.Array, jax.Array | None],
) -> jax.Array:
    """``r + γ`` times the pessimistic target value at the stepped actor's next action
    (drawn with ``keys[0]``; ``keys[1]`` the fractions quantile critics draw), ``[B, N']``."""
    next_key, target_key = keys
    next_actions, _ = networks.actor.sample(actor_params, next_observations, next_key)
    next_values = networks.critics.target_distribution(
        state.target_critic, next_observations, next_actions, target_key
    )  # [2, B, N']
    return jax.lax.stop_gradient(
        batch.rewards[:, None] + batch.discounts[:, None] * pessimistic(next_values)
    )


def sample_proposals(
    actor: TanhGaussianActor,
    n_actions: int,
    actor_params: Any,
    observations: jax.Array,
    next_observations: jax.Array,
    keys: tuple[jax.Array, jax.Array, jax.Array],
) -> Proposals:
    """The penalty's :class:`Proposals`: ``n_actions`` uniform actions per observation and
    ``n_actions`` of the policy at ``s`` and at ``s'`` (drawn with the three ``keys``).

    The actor runs once per observation and the critics later project each observation
    once for all its actions (actions ``[n, B, action_size]``).
    """
    random_key, current_key, next_sample_key = keys
    batch_size, action_size = observations.shape[0], actor.action_size
    # Log-density of the uniform proposal on [-1, 1]^action_size.
    uniform_log_density = -action_size * math.log(2.0)
    random_actions = jax.random.uniform(
        random_key, (n_actions, batch_size, action_size), minval=-1.0, maxval=1.0
    )
    current_actions, current_log_pi = actor.sample_n(
        actor_params, observations, current_key, n_actions
    )
    next_sampled, next_log_pi = actor.sample_n(
        actor_params, next_observations, next_sample_key, n_actions
    )
    return jax.lax.stop_gradient(
        Proposals(
            actions=jnp.concatenate([random_actions, current_actions, next_sampled], axis=0),
            log_densities=jnp.concatenate(
                [
                    jnp.full((n_actions, batch_size), uniform_log_density),
                    current_log_pi,
                    next_log_pi,
                ],
                axis=0,
            ),
        )
    )


def penalty_weight(log_alpha_prime: jax.Array) -> jax.Array:
    """The penalty's Lagrangian weight of its log, bounded to [0, 1e6]."""
    return jnp.clip(jnp.exp(log_alpha_prime), 0.0, 1e6)


def alpha_prime_step(
    networks: CQLNetworks, config: CQLConfig, state: CQLState, gap: jax.Array
) -> tuple[jax.Array, optax.OptState]:
    """The Lagrangian variant's step of the penalty's log weight, raising it while the
    ``gap`` (per critic) exceeds ``config.target_action_gap``; without ``config.lagrange``
    the state's weight and optimizer state unchanged."""
    if not config.lagrange:
        return state.log_alpha_prime, state.alpha_prime_opt_state

    def objective(log_alpha_prime: jax.Array) -> tuple[jax.Array, None]:
        weight = penalty_weight(log_alpha_prime)
        gaps = jax.lax.stop_gradient(gap - config.target_action_gap)
        return -jnp.sum(weight * config.cql_alpha * gaps), None

    log_alpha_prime, opt_state, _, _ = apply_gradients(
        objective,
        state.log_alpha_prime,
        networks.alpha_prime_optimizer,
        state.alpha_prime_opt_state,
    )
    return log_alpha_prime, opt_state


def cql_update(
    networks: CQLNetworks, config: CQLConfig, state: CQLState, batch: Any, key: jax.Array
) -> tuple[CQLState, Metrics]:
    """One update of CQL: SAC's actor and temperature steps against the current critics,
    the critics' step on the TD loss plus the penalty, the penalty weight's step, and
    SAC's target update."""
    chex.assert_rank([batch.observations, batch.actions, batch.rewards], [2, 2, 1])
    policy_key, next_key, random_key, current_key, next_sample_key = jax.random.split(key, 5)
    observations, next_observations = state.policy.normalize_batch(batch)

    # Actor and temperature (SAC's steps), against the current critics; in the warm
    # start the actor maximizes the data's log-likelihood instead of Q.
    values = functools.partial(actor_values, networks, config, state, observations, batch.actions)
    actor_params, actor_opt_state, a_loss, log_pi = sac.actor_step(
        networks.actor, networks.actor_optimizer, state, observations, policy_key, values
    )
    log_alpha, alpha_opt_state, alpha_loss = sac.temperature_step(
        networks.alpha_optimizer, state, log_pi, networks.target_entropy
    )

    # Critic: TD towards the target critics, plus the conservative penalty.
    target_key, fraction_key = (
        jax.random.split(jax.random.fold_in(key, 1))
        if networks.critics.distributional
        else (None, None)
    )
    targets = bootstrap_targets(
        networks, state, actor_params, batch, next_observations, (next_key, target_key)
    )
    proposals = sample_proposals(
        networks.actor,
        config.n_actions,
        actor_params,
        observations,
        next_observations,
        (random_key, current_key, next_sample_key),
    )
    alpha_prime = penalty_weight(state.log_alpha_prime)
    critic_objective = functools.partial(
        critic_loss,
        networks.critics,
        config,
        inputs=CriticInputs(observations, batch.actions, targets, proposals),
        alpha_prime=alpha_prime,
        fraction_key=fraction_key,
    )
    critic, critic_opt_state, c_loss, (td_loss, gap, q_mean) = apply_gradients(
        critic_objective, state.critic, networks.critic_optimizer, state.critic_opt_state
    )
    log_alpha_prime, alpha_prime_opt_state = alpha_prime_step(networks, config, state, gap)

    new_state = sac.finish_update(
        state,
        config.tau,
        actor=(actor_params, actor_opt_state),
        critic=(critic, critic_opt_state),
        temperature=(log_alpha, alpha_opt_state),
    ).replace(log_alpha_prime=log_alpha_prime, alpha_prime_opt_state=alpha_prime_opt_state)
    metrics = {
        "actor_loss": a_loss,
        "alpha": jnp.exp(log_alpha),
        "alpha_loss": alpha_loss,
        "critic_loss": c_loss,
        "td_loss": td_loss,
        "cql_gap": jnp.mean(gap),
        "alpha_prime": penalty_weight(log_alpha_prime),
        "q_mean": q_mean,
    }
    return new_state, metrics


def make_cql(config: CQLConfig, obs_size: int, action_size: int) -> Algorithm:
    """CQL as ``Algorithm(init, update, act)``: SAC's actor and temperature steps
    (``sac.py``), and a critic step on the TD loss plus the conservative penalty."""
    networks = make_networks(config, action_size)

    def init(key: jax.Array) -> CQLState:
        return init_state(networks, config, obs_size, action_size, key)

    def update(state: CQLState, batch: Any, key: jax.Array) -> tuple[CQLState, Metrics]:
        return cql_update(networks, config, state, batch, key)

    return Algorithm(init=init, update=update, act=make_act(networks.actor.act))
