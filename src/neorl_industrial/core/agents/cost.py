"""Cost limits of the safe (Lagrangian) agents: their validation, the threshold they imply,
and the Lagrangian part of a safe agent's state.

OSRL's semantics: an episode cost limit ``L`` over episodes of ``T`` steps becomes a
threshold on the discounted cost value, ``L (1 - γ^T) / ((1 - γ) T)`` (the discounted sum
of a cost spread evenly at ``L / T`` per step), and a dual ascent
(``core/optimizers/dual_ascent.py``: PID by default, or gradient ascent) turns the gap
between the policy's estimated cost value and that threshold into a non-negative weight per
cost channel, stepped by the same ``apply_gradients`` as every network.

The limits are data, not code: a safe agent's state carries them as a traced ``[n_costs]``
leaf (:class:`LagrangianState`), initialized from ``config.cost_limits`` and replaced by
:func:`with_cost_limits`, so agents with different limits train in one ``vmap``ped
program. ``discount`` and ``episode_length`` stay static.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, TypeVar

import chex
import jax
import jax.numpy as jnp
import optax
from flax import struct

from neorl_industrial.core.agents.distributional import CriticConfig
from neorl_industrial.core.agents.networks import FrozenConfig, check_tuple
from neorl_industrial.core.optimizers import (
    GradientAscentConfig,
    PIDConfig,
    ascend,
    gradient_ascent,
    pid_ascent,
)
from neorl_industrial.core.safety.contract import check_cost_limits

__all__ = [
    "MULTIPLIERS",
    "Lagrangian",
    "LagrangianState",
    "SafeNetworks",
    "SafetyConfig",
    "check_cost_limits",
    "check_safe_batch",
    "make_dual_ascent",
    "make_lagrangian",
    "per_step_cost_threshold",
    "with_channel_metrics",
    "with_cost_limits",
]

MULTIPLIERS = ("pid", "gradient")
State = TypeVar("State")


#: The cost limits of a safe algorithm's config built without any (one channel, an episode
#: limit of 100); an Agent always passes the limits of its safety contract instead.
DEFAULT_COST_LIMITS: tuple[float, ...] = (100.0,)


def _spread_factor(discount: float, episode_length: int) -> float:
    """``(1 - γ^T) / ((1 - γ) T)``: the threshold per unit of episode cost limit."""
    if not 0.0 < discount <= 1.0:
        raise ValueError(f"discount: must lie in (0, 1], got {discount}")
    if episode_length < 1:
        raise ValueError(f"episode_length: must be positive, got {episode_length}")
    if discount == 1.0:
        return 1.0
    return (1.0 - discount**episode_length) / (1.0 - discount) / episode_length


def per_step_cost_threshold(
    cost_limit: float | jax.Array, discount: float, episode_length: int
) -> float | jax.Array:
    """The threshold on a discounted cost value that an episode cost limit implies.

    Args:
        cost_limit: a number (checked; the threshold is a float), or an array of limits,
            possibly traced (the threshold is a float32 array of its shape).
        discount: the discount of the cost value, in (0, 1].
        episode_length: steps per episode.

    Raises:
        ValueError: for a negative limit, a discount outside (0, 1] or a non-positive length.
    """
    factor = _spread_factor(discount, episode_length)
    if isinstance(cost_limit, numbers.Real):
        check_cost_limits(cost_limit, field="cost_limit")
        return float(cost_limit * factor)
    return jnp.asarray(cost_limit, jnp.float32) * factor


@dataclasses.dataclass(frozen=True)
class SafetyConfig(FrozenConfig):
    """The safety fields every Lagrangian agent's config shares (a mixin of
    ``TD3BCLagConfig`` and ``IQLLagConfig``).

    Attributes:
        cost_limits: episode cost limit of each cost channel (one per ``batch.costs``
            column): the initial value of the state's traced limits.
        discount: the batch's discount (for the per-step threshold).
        episode_length: steps per episode (for the per-step threshold).
        multiplier: ``"pid"`` (the default) or ``"gradient"`` (gradient ascent).
        pid: gains of the PID multiplier.
        gradient: learning rate and initial value of the gradient-ascent multiplier.
        cost_critic: what the cost critics learn: the mean (the default) or, with
            ``kind="iqn"``, the cost's distribution; its ``risk`` (CVaR of the upper
            tail, Wang) is then what the actor's penalty and the multipliers see, so the
            limit holds on the tail instead of the mean.
    """

    cost_limits: tuple[float, ...] = DEFAULT_COST_LIMITS
    discount: float = 0.99
    episode_length: int = 1000
    multiplier: Literal["pid", "gradient"] = "pid"
    pid: PIDConfig = dataclasses.field(default_factory=PIDConfig)
    gradient: GradientAscentConfig = dataclasses.field(default_factory=GradientAscentConfig)
    cost_critic: CriticConfig = dataclasses.field(default_factory=CriticConfig)

    def __post_init__(self) -> None:
        check_cost_limits(self.cost_limits)
        check_tuple("cost_limits", self.cost_limits, float)
        _spread_factor(self.discount, self.episode_length)
        if self.multiplier not in MULTIPLIERS:
            raise ValueError(f"multiplier: expected one of {MULTIPLIERS}, got {self.multiplier!r}")


@struct.dataclass
class LagrangianState:
    """The safety part of a Lagrangian agent's state.

    Attributes:
        cost_limits: ``[n_costs]`` episode cost limits, a traced leaf.
        multiplier: ``[n_costs]`` Lagrange multipliers, ``>= 0``.
        opt_state: the dual ascent's state.
    """

    cost_limits: jax.Array
    multiplier: jax.Array
    opt_state: optax.OptState


class Lagrangian(NamedTuple):
    """Cost limits and their multipliers as pure functions.

    Attributes:
        init: ``init() -> LagrangianState`` with the config's limits.
        update: ``update(state, cost_value) -> state``: one multiplier step from the
            policy's estimated cost value (``[n_costs]``) against the thresholds.
        thresholds: ``thresholds(state) -> [n_costs]``, computed from the traced limits.
    """

    init: Callable[[], LagrangianState]
    update: Callable[[LagrangianState, jax.Array], LagrangianState]
    thresholds: Callable[[LagrangianState], jax.Array]


class SafeNetworks(NamedTuple):
    """What a Lagrangian agent's update closes over: its base agent's networks (TD3+BC's,
    IQL's), its cost critics and the :class:`Lagrangian` of its limits."""

    networks: Any
    costs: Any
    lagrangian: Lagrangian


def make_dual_ascent(config: SafetyConfig) -> tuple[optax.GradientTransformation, float]:
    """The dual ascent ``config.multiplier`` names, with its settings, and the multiplier
    it starts from."""
    if config.multiplier == "gradient":
        return gradient_ascent(config.gradient.lr), config.gradient.initial
    return pid_ascent(config.pid), 0.0


def make_lagrangian(config: SafetyConfig) -> Lagrangian:
    """The limits and multiplier of ``config`` as :class:`Lagrangian`."""
    n_costs = len(config.cost_limits)
    dual_ascent, initial = make_dual_ascent(config)

    def init() -> LagrangianState:
        multiplier = jnp.full((n_costs,), initial, jnp.float32)
        return LagrangianState(
            cost_limits=jnp.asarray(config.cost_limits, jnp.float32),
            multiplier=multiplier,
            opt_state=dual_ascent.init(multiplier),
        )

    def thresholds(state: LagrangianState) -> jax.Array:
        return per_step_cost_threshold(state.cost_limits, config.discount, config.episode_length)

    def update(state: LagrangianState, cost_value: jax.Array) -> LagrangianState:
        violation = jnp.asarray(cost_value, jnp.float32) - thresholds(state)
        multiplier, opt_state = ascend(dual_ascent, state.multiplier, state.opt_state, violation)
        return state.replace(multiplier=multiplier, opt_state=opt_state)

    return Lagrangian(init=init, update=update, thresholds=thresholds)


def check_safe_batch(batch: Any, n_costs: int) -> None:
    """Asserts (at trace time) a safe agent's batch: observations and actions ``[B, ·]``,
    rewards ``[B]`` and costs ``[B, n_costs]``."""
    chex.assert_rank([batch.observations, batch.actions, batch.rewards], [2, 2, 1])
    chex.assert_shape(batch.costs, (batch.rewards.shape[0], n_costs))


def with_channel_metrics(
    metrics: dict[str, jax.Array], multiplier: jax.Array, cost_value: jax.Array
) -> dict[str, jax.Array]:
    """``metrics`` with ``multiplier_{c}`` and ``cost_value_{c}`` of every cost channel
    ``c`` added (``multiplier`` and ``cost_value`` are ``[n_costs]``)."""
    for i in range(multiplier.shape[0]):
        metrics[f"multiplier_{i}"] = multiplier[i]
        metrics[f"cost_value_{i}"] = cost_value[i]
    return metrics


def with_cost_limits(state: State, cost_limits: Any) -> State:
    """``state`` with other episode cost limits; pure, and traceable.

    Args:
        state: a Lagrangian agent's state (with a ``lagrangian`` field), or its
            :class:`LagrangianState`; stacked states (leading axes) are fine.
        cost_limits: the new limits, ``[n_costs]`` or of the state's limits' shape. Concrete
            values are checked (:func:`check_cost_limits`); traced ones only by shape.

    Raises:
        ValueError: for limits of the wrong shape, or concrete ones that are negative or
            not finite.
    """
    lagrangian = state if isinstance(state, LagrangianState) else state.lagrangian
    current = lagrangian.cost_limits
    if not isinstance(cost_limits, jax.core.Tracer):
        check_cost_limits(cost_limits, n_costs=current.shape[-1])
    limits = jnp.asarray(cost_limits, jnp.float32)
    try:
        limits = jnp.broadcast_to(limits, current.shape)
    except ValueError:
        raise ValueError(
            f"cost_limits: expected shape {tuple(current.shape)} (or [{current.shape[-1]}]), "
            f"got {tuple(limits.shape)}"
        ) from None
    lagrangian = lagrangian.replace(cost_limits=limits)
    return (
        lagrangian if isinstance(state, LagrangianState) else state.replace(lagrangian=lagrangian)
    )
