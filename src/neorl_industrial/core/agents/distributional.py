"""Critics behind one interface: the mean critic every agent had, and the implicit quantile
network (IQN, Dabney et al., 2018) that learns the whole distribution of the return (or of
a cost), with risk measures over it.

An agent holds a :class:`Critics` built by :func:`make_critics` from its config's
:class:`CriticConfig` and never branches on the kind itself:

* ``target_distribution`` gives ``[m, *lead, N]`` samples of the bootstrap value at the
  next state (the mean critic's is its value, ``N = 1``), :func:`pessimistic` picks per
  transition the member with the lowest (for costs: highest) mean, and the agent adds its
  reward (or cost) and discount to make the targets;
* ``td_loss`` is the squared TD error of the mean critic, or the quantile Huber loss of
  the IQN at fractions drawn inside the compiled update;
* ``values`` is the expectation (the IQN's mean over fixed fractions), ``risk_values``
  the risk measure the actor improves or the Lagrangian holds under a limit: the
  expectation, CVaR at level ``cvar_level`` or Wang's distortion with ``wang_eta``, of
  the lower tail for returns and of the upper tail for costs (``upper=True``).

The quantile network follows d3rlpy's continuous IQN Q-function: a torso on
``[observation, action]``, a cosine embedding of each fraction ``τ``
(``relu(W cos(π i τ) + b)``, ``i = 0 .. embedding_size - 1``) multiplied into the torso's
last hidden layer, and a linear output per fraction.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from scipy.special import ndtr, ndtri

from neorl_industrial.core.agents.losses import critic_loss
from neorl_industrial.core.agents.networks import (
    CriticEnsemble,
    EnsembleSettings,
    bias_initializer,
    critic_layers,
    kernel_initializer,
    over_members,
)

__all__ = [
    "CRITIC_KINDS",
    "RISK_MEASURES",
    "CriticConfig",
    "Critics",
    "QuantileCriticEnsemble",
    "make_critics",
    "pessimistic",
    "quantile_huber_loss",
    "risk_fractions",
]

CRITIC_KINDS = ("mean", "iqn")
RISK_MEASURES = ("neutral", "cvar", "wang")


@dataclasses.dataclass(frozen=True)
class CriticConfig:
    """What a critic learns, and the risk measure an agent reads from it.

    Attributes:
        kind: ``"mean"`` (the expected value, by squared TD error) or ``"iqn"`` (the
            return distribution by an implicit quantile network).
        n_quantiles: fractions drawn per transition for the IQN's TD loss, for the online
            quantiles and for the target's alike.
        n_policy_quantiles: fixed fractions (midpoints of equal slices, distorted by the
            risk measure) over which the IQN's expectation and risk measure are averaged.
        embedding_size: cosine features of a fraction.
        kappa: threshold of the quantile Huber loss.
        risk: ``"neutral"`` (the expectation), ``"cvar"`` (the mean of the worst
            ``cvar_level`` of outcomes) or ``"wang"`` (Wang's distortion with ``wang_eta``;
            negative is risk-averse). Anything but neutral needs ``kind="iqn"``.
        cvar_level: the tail's probability mass, in (0, 1].
        wang_eta: Wang's distortion parameter.
    """

    kind: Literal["mean", "iqn"] = "mean"
    n_quantiles: int = 32
    n_policy_quantiles: int = 32
    embedding_size: int = 64
    kappa: float = 1.0
    risk: Literal["neutral", "cvar", "wang"] = "neutral"
    cvar_level: float = 0.1
    wang_eta: float = -0.75

    def __post_init__(self) -> None:
        if self.kind not in CRITIC_KINDS:
            raise ValueError(f"critic.kind: expected one of {CRITIC_KINDS}, got {self.kind!r}")
        if self.risk not in RISK_MEASURES:
            raise ValueError(f"critic.risk: expected one of {RISK_MEASURES}, got {self.risk!r}")
        for name in ("n_quantiles", "n_policy_quantiles", "embedding_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"critic.{name}: expected a positive integer")
        if not self.kappa > 0.0:
            raise ValueError(f"critic.kappa: must be positive, got {self.kappa}")
        if not 0.0 < self.cvar_level <= 1.0:
            raise ValueError(f"critic.cvar_level: must lie in (0, 1], got {self.cvar_level}")
        if not math.isfinite(self.wang_eta):
            raise ValueError(f"critic.wang_eta: must be finite, got {self.wang_eta}")
        if self.risk != "neutral" and self.kind != "iqn":
            raise ValueError(
                f"critic.risk {self.risk!r} reads the return distribution: it needs "
                "critic.kind 'iqn' (a mean critic knows only the expectation)"
            )

    @property
    def distributional(self) -> bool:
        return self.kind == "iqn"


def risk_fractions(config: CriticConfig, upper: bool = False) -> np.ndarray:
    """The ``n_policy_quantiles`` fractions whose quantiles average to the risk measure.

    Midpoints ``u_i = (i + 1/2) / n`` of equal slices, distorted (IQN's ``β(u)``):
    CVaR keeps the tail ``α u`` (``1 - α u`` for the upper tail of a cost), Wang's
    measure ``Φ(Φ⁻¹(u) + η)`` (``Φ(Φ⁻¹(u) - η)`` for a cost). Computed on the host from the
    static config: constants of the compiled update.
    """
    u = (np.arange(config.n_policy_quantiles, dtype=np.float64) + 0.5) / config.n_policy_quantiles
    if config.risk == "cvar":
        fractions = 1.0 - config.cvar_level * u if upper else config.cvar_level * u
    elif config.risk == "wang":
        shift = -config.wang_eta if upper else config.wang_eta
        fractions = ndtr(ndtri(u) + shift)
    else:
        fractions = u
    return np.asarray(fractions, np.float32)


def quantile_huber_loss(
    quantiles_t: jax.Array, fractions_t: jax.Array, targets_t: jax.Array, kappa: float = 1.0
) -> jax.Array:
    """Quantile Huber loss of one transition (QR-DQN, IQN).

    Args:
        quantiles_t: ``[N]`` the critic's quantiles at ``fractions_t``.
        fractions_t: ``[N]`` their fractions in (0, 1).
        targets_t: ``[M]`` samples of the target distribution.
        kappa: the Huber threshold.

    Returns:
        ``sum_i mean_j |τ_i - 1{δ_ij < 0}| huber_κ(δ_ij) / κ`` with ``δ_ij = target_j -
        quantile_i``.
    """
    chex.assert_rank([quantiles_t, fractions_t, targets_t], 1)
    chex.assert_equal_shape([quantiles_t, fractions_t])
    chex.assert_type([quantiles_t, fractions_t, targets_t], float)
    errors = targets_t[None, :] - quantiles_t[:, None]
    magnitude = jnp.abs(errors)
    huber = jnp.where(magnitude <= kappa, 0.5 * errors**2, kappa * (magnitude - 0.5 * kappa))
    weight = jnp.abs(fractions_t[:, None] - (errors < 0.0))
    return jnp.sum(jnp.mean(weight * huber, axis=1)) / kappa


def pessimistic(distribution: jax.Array, highest: bool = False) -> jax.Array:
    """Per transition, the member of ``[m, *lead, N]`` samples with the lowest mean (the
    highest with ``highest``: a cost's pessimism), as ``[*lead, N]``; for the mean critic
    (``N = 1``) this is the members' minimum (maximum)."""
    means = jnp.mean(distribution, axis=-1)
    chosen = jnp.argmax(means, axis=0) if highest else jnp.argmin(means, axis=0)
    return jnp.take_along_axis(distribution, chosen[None, ..., None], axis=0)[0]


class QuantileCriticEnsemble(EnsembleSettings):
    """``n_critics`` implicit quantile networks with parameters stacked on a leading axis.

    ``__call__(observation, action, fractions)`` gives ``[n_critics, *lead, N]``
    quantiles: leading axes of observation and action broadcast as in
    :class:`~neorl_industrial.core.agents.networks.CriticEnsemble`, and ``fractions`` is
    ``[N]`` (shared by every transition; the embedding is computed once) or
    ``[*lead, N]`` (per transition).

    Its settings are :class:`~neorl_industrial.core.agents.networks.EnsembleSettings`'
    (``hidden``: the torso's hidden layers; ``weight_init``: every layer's) and
    ``embedding_size``, the cosine features of a fraction.
    """

    embedding_size: int = 64

    @nn.compact
    def __call__(
        self,
        observation: jax.Array,
        action: jax.Array,
        fractions: jax.Array,
        members: int | None = None,
    ) -> jax.Array:
        in_size = observation.shape[-1] + action.shape[-1]
        width = self.hidden[-1]
        torso = critic_layers(self, self.hidden, in_size, self.n_critics, output=False)
        ensemble = (self.n_critics,)
        kernel_init = kernel_initializer(self.weight_init, (0,))
        embed_bias = bias_initializer(self.weight_init, self.embedding_size)
        embed = (
            self.param("embed_kernel", kernel_init, (*ensemble, self.embedding_size, width)),
            self.param("embed_bias", embed_bias, (*ensemble, width)),
        )
        out = (
            self.param("out_kernel", kernel_init, (*ensemble, width, 1)),
            self.param("out_bias", bias_initializer(self.weight_init, width), (*ensemble, 1)),
        )
        # cos(π i τ), i = 0 .. embedding_size - 1: [..., N, embedding_size]
        cosines = jnp.cos(jnp.pi * jnp.arange(self.embedding_size) * fractions[..., None])
        activation = self.activation
        obs_size = observation.shape[-1]

        def forward(member: Any) -> jax.Array:
            layers, (embed_kernel, embed_bias), (out_kernel, out_bias) = member
            kernel, bias = layers[0]
            x = observation @ kernel[:obs_size] + action @ kernel[obs_size:] + bias
            for kernel, bias in layers[1:]:
                x = activation(x) @ kernel + bias
            features = activation(x)  # [*lead, width]
            embedding = jax.nn.relu(cosines @ embed_kernel + embed_bias)  # [..., N, width]
            mixed = features[..., None, :] * embedding  # [*lead, N, width]
            return jnp.squeeze(mixed @ out_kernel + out_bias, axis=-1)

        return over_members(forward, (torso, embed, out), self.n_critics, members, self.batched)


class Critics(NamedTuple):
    """An ensemble of ``n_critics`` critics of one kind, and what agents ask of it."""

    network: CriticEnsemble | QuantileCriticEnsemble
    config: CriticConfig
    n_critics: int

    @property
    def distributional(self) -> bool:
        return self.config.distributional

    def init(self, key: jax.Array, obs_size: int, action_size: int) -> Any:
        observation = jnp.zeros((obs_size,), jnp.float32)
        action = jnp.zeros((action_size,), jnp.float32)
        if self.distributional:
            fractions = jnp.full((self.config.n_quantiles,), 0.5, jnp.float32)
            return self.network.init(key, observation, action, fractions)
        return self.network.init(key, observation, action)

    def _at(self, params: Any, observations, actions, fractions, members=None) -> jax.Array:
        return self.network.apply(params, observations, actions, fractions, members=members)

    def values(
        self, params: Any, observations: jax.Array, actions: jax.Array, members: int | None = None
    ) -> jax.Array:
        """``[m, *lead]`` expected values (the IQN's mean over midpoint fractions)."""
        if not self.distributional:
            return self.network.apply(params, observations, actions, members=members)
        fractions = risk_fractions(dataclasses.replace(self.config, risk="neutral"))
        return jnp.mean(self._at(params, observations, actions, fractions, members), axis=-1)

    def risk_values(
        self,
        params: Any,
        observations: jax.Array,
        actions: jax.Array,
        members: int | None = None,
        upper: bool = False,
    ) -> jax.Array:
        """``[m, *lead]`` the risk measure of the config (of the upper tail, a cost's bad
        side, with ``upper``); the expectation when the measure is neutral."""
        if not self.distributional:
            return self.network.apply(params, observations, actions, members=members)
        fractions = risk_fractions(self.config, upper=upper)
        return jnp.mean(self._at(params, observations, actions, fractions, members), axis=-1)

    def target_distribution(
        self, params: Any, observations: jax.Array, actions: jax.Array, key: jax.Array | None
    ) -> jax.Array:
        """``[m, *lead, N]`` samples of the value at ``(observations, actions)``: the mean
        critic's value (``N = 1``), or the IQN's quantiles at ``n_quantiles`` fractions drawn
        per transition with ``key``."""
        if not self.distributional:
            return self.network.apply(params, observations, actions)[..., None]
        lead = jnp.broadcast_shapes(observations.shape[:-1], actions.shape[:-1])
        fractions = jax.random.uniform(key, (*lead, self.config.n_quantiles))
        return self._at(params, observations, actions, fractions)

    def td_loss(
        self,
        params: Any,
        observations: jax.Array,
        actions: jax.Array,
        targets: jax.Array,
        key: jax.Array | None,
        groups: int | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        """The TD loss of every member, summed over members and averaged over the batch.

        Args:
            targets: ``[B]`` or ``[B, N']`` samples of every member's target, or with
                ``groups``, ``[groups, B, N']``: one target per group of consecutive
                members (a cost channel's pair).
            key: the fractions a quantile critic draws (unused by mean critics).

        Returns:
            ``(loss, values)`` with ``values`` the ``[m, B]`` estimates at the data (the
            IQN's mean over its sampled quantiles).
        """
        if groups is None:
            targets = (targets if targets.ndim == 2 else targets[:, None])[None]
        count = targets.shape[0]
        if not self.distributional:
            q = self.network.apply(params, observations, actions)  # [m, B]
            grouped = q.reshape(count, -1, *q.shape[1:])
            per_group = jax.vmap(jax.vmap(critic_loss, in_axes=(1, 0)))(
                grouped, jnp.mean(targets, axis=-1)
            )  # [groups, B]
            return jnp.mean(jnp.sum(per_group, axis=0)), q
        fractions = jax.random.uniform(key, (observations.shape[0], self.config.n_quantiles))
        quantiles = self._at(params, observations, actions, fractions)  # [m, B, N]
        grouped = quantiles.reshape(count, -1, *quantiles.shape[1:])
        losses = jax.vmap(self.quantile_loss, in_axes=(0, None, 0))(grouped, fractions, targets)
        return jnp.sum(losses), jnp.mean(quantiles, axis=-1)

    def quantile_loss(
        self, quantiles: jax.Array, fractions: jax.Array, targets: jax.Array
    ) -> jax.Array:
        """Quantile Huber loss of ``[m, B, N]`` quantiles at ``[B, N]`` fractions towards
        ``[B, N']`` targets, summed over members and averaged over the batch."""
        per_member = jax.vmap(
            jax.vmap(quantile_huber_loss, in_axes=(0, 0, 0, None)), in_axes=(0, None, None, None)
        )(quantiles, fractions, targets, self.config.kappa)
        return jnp.mean(jnp.sum(per_member, axis=0))


def make_critics(
    config: CriticConfig,
    hidden: Sequence[int],
    n_critics: int,
    activation: Callable[[jax.Array], jax.Array] = nn.relu,
    weight_init: str = "lecun",
) -> Critics:
    """``n_critics`` critics of ``config.kind`` with the given torso and weight
    initialization (``networks.KERNEL_INITS``; the mean critics' and the quantile critics'
    torso)."""
    if config.distributional:
        network: Any = QuantileCriticEnsemble(
            hidden=tuple(hidden),
            n_critics=n_critics,
            embedding_size=config.embedding_size,
            activation=activation,
            weight_init=weight_init,
        )
    else:
        network = CriticEnsemble(
            hidden=tuple(hidden),
            n_critics=n_critics,
            activation=activation,
            weight_init=weight_init,
        )
    return Critics(network=network, config=config, n_critics=n_critics)
