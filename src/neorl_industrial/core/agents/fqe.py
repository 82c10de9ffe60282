"""Fitted Q Evaluation (Le, Voloshin & Yue, 2019): the discounted return *and* the
discounted costs of a fixed policy, learned from logged transitions alone.

FQE regresses ``Q(s, a)`` onto ``r + γ' Q_target(s', π(s'))``, where ``π`` is the
evaluated (deterministic) policy and ``γ'`` is the batch's ``discounts`` (``γ^k``, 0 after
a terminal state; a timed-out episode keeps ``γ``, so truncation is bootstrapped through).
``Q(s0, π(s0))`` at the episodes' first observations estimates the policy's value. Le et
al. introduced FQE to evaluate the constraint costs of a policy as well as its return, and
so does this one: one column per signal, the return first, then one per cost channel.

Defaults are d3rlpy's ``FQEConfig`` (which cites Le et al.): Adam at 1e-4, a *hard* copy
of the online network into the target every 100 updates, one critic, squared TD error.
DeepMind's FQE learner, used by Paine et al. (2020, "Hyperparameter selection for offline
RL"), also copies the target hard at a fixed period with Adam at 1e-4, and clips the
gradient's global norm at 40, which is taken from it (its default distributional critic is
not: the squared error is its other option and d3rlpy's).

One network with ``1 + n_costs`` output heads, not one network per signal: every signal
bootstraps from the same next state and the same policy action, and in a plant the same
features (fatigue, consumption, operating point) drive both the reward and the costs, so
the heads share one torso at the price of one forward pass instead of ``1 + n_costs``
(the update is bound by the critic's matrix products on a CPU). The heads' losses are
summed, so the signals should be on comparable scales: scale them in the batch (see
below). With ``n_critics > 1`` the members are independent networks whose targets use the
*mean* of the target members: an evaluation wants no pessimism (a minimum would bias the
return down and, worse, the costs down too).

Scaling: FQE learns in the units of the batch. A caller that trains on rewards multiplied
by ``k_r`` and costs multiplied by ``k_c`` (per channel) gets estimates ``k_r V_r`` and
``k_c V_c``: divide column 0 by ``k_r`` and column ``1 + c`` by ``k_c[c]``.
``functional.transformations.ope.fitted_q_evaluation`` chooses the scales and undoes them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from neorl_industrial.core.agents.networks import (
    MLP,
    FrozenConfig,
    ObservationNormalizer,
    check_layer_widths,
    check_observation_stats,
    check_positive,
)
from neorl_industrial.core.agents.types import Metrics
from neorl_industrial.core.optimizers import apply_gradients, make_optimizer

#: ``policy(observations[B, obs_size]) -> actions[B, action_size]``, deterministic and pure.
DeterministicPolicy = Callable[[jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class FQEConfig(FrozenConfig):
    """Hyperparameters of FQE. Static: changing one builds a new evaluator.

    Attributes:
        learning_rate: Adam's step size.
        hidden: widths of the critic's hidden layers.
        discount: the γ of the evaluation. The update bootstraps with ``batch.discounts``;
            sample batches with this ``gamma`` (``fitted_q_evaluation`` does).
        target_update_period: updates between hard copies of the online network into the
            target network.
        n_critics: independent critics; the estimate is their mean.
        max_grad_norm: clip the gradient's global norm to this (None: no clipping).
        obs_mean: per-feature observation mean of the critic's normalizer (None: identity).
        obs_std: per-feature observation spread of the critic's normalizer.
    """

    learning_rate: float = 1e-4
    hidden: tuple[int, ...] = (256, 256)
    discount: float = 0.99
    target_update_period: int = 100
    n_critics: int = 1
    max_grad_norm: float | None = 40.0
    obs_mean: tuple[float, ...] | None = None
    obs_std: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        check_layer_widths(self.hidden)
        check_positive(self, "learning_rate")
        if not 0.0 < self.discount < 1.0:
            raise ValueError(f"discount: must lie in (0, 1), got {self.discount}")
        for name in ("target_update_period", "n_critics"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0.0:
            raise ValueError(f"max_grad_norm: must be positive or None, got {self.max_grad_norm}")
        check_observation_stats(self)


@struct.dataclass
class FQEState:
    """Training state of FQE."""

    critic: Any
    target_critic: Any
    opt_state: optax.OptState
    normalizer: ObservationNormalizer
    step: jax.Array


class FQE(NamedTuple):
    """Fitted Q Evaluation as pure functions (trains with ``train_offline``).

    Attributes:
        init: ``init(key) -> FQEState``.
        update: ``update(state, batch, key) -> (state, metrics)``.
        estimate: ``estimate(state, observations[..., obs_size]) -> [..., 1 + n_costs]``:
            ``Q(s, π(s))``, the discounted return then the discounted cost of each channel
            (in the batch's units).
    """

    init: Callable[[jax.Array], FQEState]
    update: Callable[[FQEState, Any, jax.Array], tuple[FQEState, Metrics]]
    estimate: Callable[[FQEState, jax.Array], jax.Array]


class MultiHeadCritic(nn.Module):
    """An MLP on ``[observation, action]`` with ``n_heads`` linear outputs that start at
    zero.

    Zero output weights make a signal that is zero everywhere in the data (a cost channel
    the behaviour never incurred) estimate exactly zero: its head gets no gradient. The
    other heads start from "the value is the shift's" (see ``ope``), a sensible prior.
    """

    hidden: tuple[int, ...]
    n_heads: int

    @nn.compact
    def __call__(self, inputs: jax.Array) -> jax.Array:
        features = MLP(hidden=self.hidden, name="torso")(inputs)
        return nn.Dense(self.n_heads, kernel_init=nn.initializers.zeros, name="heads")(features)


class MultiHeadCritics(nn.Module):
    """``n_critics`` independent :class:`MultiHeadCritic` with parameters stacked on a
    leading axis; returns ``[n_critics, *leading, n_heads]``."""

    hidden: tuple[int, ...]
    n_heads: int
    n_critics: int = 1

    @nn.compact
    def __call__(self, observation: jax.Array, action: jax.Array) -> jax.Array:
        ensemble = nn.vmap(
            MultiHeadCritic,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            in_axes=None,
            axis_size=self.n_critics,
        )
        inputs = jnp.concatenate([observation, action], axis=-1)
        return ensemble(hidden=self.hidden, n_heads=self.n_heads, name="critics")(inputs)


def fqe_target(
    reward_t: jax.Array, cost_t: jax.Array, discount_t: jax.Array, q_t: jax.Array
) -> jax.Array:
    """The regression target of every signal for one transition.

    Args:
        reward_t: scalar reward.
        cost_t: ``[n_costs]`` costs.
        discount_t: scalar bootstrap factor (``γ^k``, or 0 after a terminal state).
        q_t: ``[n_critics, 1 + n_costs]`` target values at ``(s', π(s'))``.

    Returns:
        ``[1 + n_costs]``: ``[r, c...] + discount * mean over critics of q_t``.
    """
    chex.assert_rank([reward_t, cost_t, discount_t, q_t], [0, 1, 0, 2])
    chex.assert_axis_dimension(q_t, 1, cost_t.shape[0] + 1)
    chex.assert_type([reward_t, cost_t, discount_t, q_t], float)
    signals = jnp.concatenate([reward_t[None], cost_t])
    return signals + discount_t * jnp.mean(q_t, axis=0)


def fqe_loss(q_tm1: jax.Array, target_tm1: jax.Array) -> jax.Array:
    """Half the squared TD error of every critic and signal for one transition, summed:
    ``q_tm1`` is ``[n_critics, n_heads]``, ``target_tm1`` ``[n_heads]``."""
    chex.assert_rank([q_tm1, target_tm1], [2, 1])
    chex.assert_axis_dimension(q_tm1, 1, target_tm1.shape[0])
    chex.assert_type([q_tm1, target_tm1], float)
    return 0.5 * jnp.sum(jnp.square(q_tm1 - target_tm1))


def _check_sizes(obs_size: Any, action_size: Any, n_costs: Any) -> None:
    for name, value, smallest in (
        ("obs_size", obs_size, 1),
        ("action_size", action_size, 1),
        ("n_costs", n_costs, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < smallest:
            raise ValueError(f"{name}: expected an integer >= {smallest}, got {value!r}")


def check_policy(policy: DeterministicPolicy, obs_size: int, action_size: int) -> None:
    """Traces ``policy`` on a batch of observations (nothing runs) and checks that it
    returns one action of ``action_size`` per observation.

    Raises:
        ValueError: naming ``policy`` and the shapes, when it is not callable, fails on
            observations of ``obs_size`` or returns another shape.
    """
    if not callable(policy):
        raise ValueError(f"policy: expected a function of observations, got {policy!r}")
    probe = jax.ShapeDtypeStruct((2, obs_size), jnp.float32)
    try:
        actions = jax.eval_shape(policy, probe)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"policy: fails on observations of shape [B, {obs_size}] "
            f"(the dataset's observation size): {error}"
        ) from error
    shape = getattr(actions, "shape", None)
    if shape != (2, action_size):
        raise ValueError(
            f"policy: expected actions of shape [B, {action_size}] for observations "
            f"[B, {obs_size}], got {shape} for B = 2"
        )


class FQEParts(NamedTuple):
    """What an FQE closes over: the critics, their optimizer, the evaluated policy and the
    sizes it was built for."""

    network: MultiHeadCritics
    optimizer: optax.GradientTransformation
    policy: DeterministicPolicy
    obs_size: int
    action_size: int
    n_costs: int


def check_batch(parts: FQEParts, batch: Any) -> None:
    """Asserts (at trace time) the shapes of a batch of ``B`` transitions."""
    batch_size = batch.rewards.shape[0]
    chex.assert_shape([batch.observations, batch.next_observations], (batch_size, parts.obs_size))
    chex.assert_shape(batch.actions, (batch_size, parts.action_size))
    chex.assert_shape(batch.costs, (batch_size, parts.n_costs))
    chex.assert_shape([batch.rewards, batch.discounts], (batch_size,))


def fqe_targets(parts: FQEParts, state: FQEState, batch: Any) -> jax.Array:
    """``[B, 1 + n_costs]``: every signal's :func:`fqe_target`, bootstrapped from the
    target critics at the policy's next action (no gradient)."""
    next_actions = parts.policy(batch.next_observations)
    chex.assert_shape(next_actions, (batch.rewards.shape[0], parts.action_size))
    next_q = parts.network.apply(
        state.target_critic, state.normalizer(batch.next_observations), next_actions
    )  # [n_critics, B, n_heads]
    targets = jax.vmap(fqe_target, in_axes=(0, 0, 0, 1))(
        batch.rewards, batch.costs, batch.discounts, next_q
    )
    return jax.lax.stop_gradient(targets)


def fqe_update(
    parts: FQEParts, config: FQEConfig, state: FQEState, batch: Any
) -> tuple[FQEState, Metrics]:
    """One regression step of the critics towards :func:`fqe_targets`; every
    ``config.target_update_period`` updates the target critics become a copy of them."""
    check_batch(parts, batch)
    targets = fqe_targets(parts, state, batch)
    observations = state.normalizer(batch.observations)

    def objective(critic: Any) -> tuple[jax.Array, jax.Array]:
        q = parts.network.apply(critic, observations, batch.actions)  # [n_critics, B, n_heads]
        return jnp.mean(jax.vmap(fqe_loss, in_axes=(1, 0))(q, targets)), q

    critic, opt_state, loss, q = apply_gradients(
        objective, state.critic, parts.optimizer, state.opt_state
    )
    step = state.step + 1
    copy = step % config.target_update_period == 0
    target_critic = jax.tree.map(
        lambda online, target: jnp.where(copy, online, target), critic, state.target_critic
    )
    metrics = {
        "loss": loss,
        "q_return": jnp.mean(q[..., 0]),
        "target_return": jnp.mean(targets[:, 0]),
    }
    if parts.n_costs:
        metrics["q_cost"] = jnp.mean(q[..., 1:])
    new_state = FQEState(
        critic=critic,
        target_critic=target_critic,
        opt_state=opt_state,
        normalizer=state.normalizer,
        step=step,
    )
    return new_state, metrics


def fqe_estimate(parts: FQEParts, state: FQEState, observations: jax.Array) -> jax.Array:
    """``Q(s, π(s))`` of ``observations[..., obs_size]``, ``[..., 1 + n_costs]``: the
    critics' mean."""
    observations = jnp.asarray(observations, jnp.float32)
    chex.assert_axis_dimension(observations, -1, parts.obs_size)
    leading = observations.shape[:-1]
    flat = observations.reshape(-1, parts.obs_size)
    actions = parts.policy(flat)
    q = parts.network.apply(state.critic, state.normalizer(flat), actions)
    return jnp.mean(q, axis=0).reshape(*leading, 1 + parts.n_costs)


def make_fqe(
    config: FQEConfig,
    obs_size: int,
    action_size: int,
    n_costs: int,
    policy: DeterministicPolicy,
) -> FQE:
    """FQE of ``policy`` as ``FQE(init, update, estimate)``.

    Args:
        config: hyperparameters.
        obs_size: length of an observation.
        action_size: length of an action (continuous actions).
        n_costs: cost channels (``batch.costs`` columns); 0 estimates the return only.
        policy: the evaluated policy, ``policy(observations[B, obs_size]) ->
            actions[B, action_size]``: deterministic, pure and jit-able, closing over its
            own parameters (and its own observation normalizer: it gets raw observations).

    Raises:
        ValueError: for sizes that are not positive integers or a policy whose output
            does not fit them.
    """
    _check_sizes(obs_size, action_size, n_costs)
    check_policy(policy, obs_size, action_size)
    network = MultiHeadCritics(
        hidden=config.hidden, n_heads=1 + n_costs, n_critics=config.n_critics
    )
    optimizer = make_optimizer(config.learning_rate, config.max_grad_norm)
    parts = FQEParts(network, optimizer, policy, obs_size, action_size, n_costs)

    def init(key: jax.Array) -> FQEState:
        critic = network.init(
            key, jnp.zeros((obs_size,), jnp.float32), jnp.zeros((action_size,), jnp.float32)
        )
        return FQEState(
            critic=critic,
            target_critic=critic,
            opt_state=optimizer.init(critic),
            normalizer=ObservationNormalizer.from_config(config, obs_size),
            step=jnp.zeros((), jnp.int32),
        )

    def update(state: FQEState, batch: Any, key: jax.Array) -> tuple[FQEState, Metrics]:
        del key  # the policy is deterministic and the targets have no noise
        return fqe_update(parts, config, state, batch)

    def estimate(state: FQEState, observations: jax.Array) -> jax.Array:
        return fqe_estimate(parts, state, observations)

    return FQE(init=init, update=update, estimate=estimate)
