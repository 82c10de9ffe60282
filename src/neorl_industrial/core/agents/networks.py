"""Neural networks shared by the online and offline agents (flax.linen).

Every network takes observations that are already normalized; the normalization
statistics travel with the policy as :class:`ObservationNormalizer` so that an exported
policy carries everything it needs to act on raw plant observations.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pydantic
from flax import struct

Params = Any
Activation = Callable[[jax.Array], jax.Array]

_HALF_LOG_TWO_PI = 0.5 * math.log(2.0 * math.pi)
# Spread of observation features below which a feature counts as constant (e.g. a fixed
# setpoint); dividing by it would blow up rounding noise, so such features get a scale of 1.
_MIN_STD = 1e-6


#: Weight initializations a network can be built with: flax's default (LeCun normal,
#: variance 1 / fan_in, zero biases) and PyTorch's ``nn.Linear`` default (weights and
#: biases uniform in ``±1 / sqrt(fan_in)``, a third of that variance), which CORL's and
#: d3rlpy's agents use.
KERNEL_INITS = ("lecun", "uniform")


def kernel_initializer(name: str = "lecun", batch_axis: Sequence[int] = ()) -> Any:
    """The weight initializer called ``name`` (see :data:`KERNEL_INITS`); ``batch_axis``
    marks leading ensemble axes that do not count in the fan-in.

    Raises:
        ValueError: for an unknown name.
    """
    check_weight_init(name)
    if name == "lecun":
        return nn.initializers.lecun_normal(batch_axis=tuple(batch_axis))
    return nn.initializers.variance_scaling(
        1.0 / 3.0, "fan_in", "uniform", batch_axis=tuple(batch_axis)
    )


def bias_initializer(name: str, fan_in: int) -> Any:
    """The bias initializer of weight initialization ``name`` for a layer of ``fan_in``
    inputs: zeros (flax's) or uniform in ``±1 / sqrt(fan_in)`` (PyTorch's).

    Raises:
        ValueError: for an unknown name.
    """
    check_weight_init(name)
    if name == "lecun":
        return nn.initializers.zeros
    bound = 1.0 / math.sqrt(fan_in)

    def init(key: jax.Array, shape: Sequence[int], dtype: Any = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


def check_weight_init(name: str) -> None:
    """Raises ``ValueError`` naming ``weight_init`` when ``name`` is not one of
    :data:`KERNEL_INITS` (the check an agent's config runs on its field)."""
    if name not in KERNEL_INITS:
        raise ValueError(f"weight_init: expected one of {list(KERNEL_INITS)}, got {name!r}")


class MLP(nn.Module):
    """A multilayer perceptron.

    Attributes:
        hidden: widths of the hidden layers.
        output_size: width of the last (linear) layer; ``None`` ends at the last hidden layer.
        activation: nonlinearity after every hidden layer.
        weight_init: initialization of every layer (:data:`KERNEL_INITS`).
    """

    hidden: Sequence[int] = (256, 256)
    output_size: int | None = None
    activation: Activation = nn.relu
    weight_init: str = "lecun"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for width in self.hidden:
            x = self.activation(dense(width, x.shape[-1], self.weight_init)(x))
        if self.output_size is not None:
            x = dense(self.output_size, x.shape[-1], self.weight_init)(x)
        return x


def dense(width: int, fan_in: int, weight_init: str, name: str | None = None) -> nn.Dense:
    """A ``Dense`` layer of ``width`` units over ``fan_in`` inputs initialized as
    ``weight_init`` says (:data:`KERNEL_INITS`)."""
    return nn.Dense(
        width,
        kernel_init=kernel_initializer(weight_init),
        bias_init=bias_initializer(weight_init, fan_in),
        name=name,
    )


def tanh_gaussian_sample(
    mean: jax.Array, log_std: jax.Array, key: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Draws ``tanh(u)`` with ``u ~ N(mean, exp(log_std)^2)`` and its log-density.

    The log-density is that of the squashed action: the Gaussian's, minus the log of the
    Jacobian ``1 - tanh(u)^2`` summed over the action's last axis. The Jacobian is computed
    from ``u`` as ``2 (log 2 - u - softplus(-2u))``, which stays finite where ``tanh(u)``
    rounds to ±1.

    Returns:
        ``(action, log_prob)``: action of the shape of ``mean`` in [-1, 1] (in float32,
        ``tanh`` of a large ``u`` rounds to ±1), and log_prob with the last axis summed out.
    """
    std = jnp.exp(log_std)
    noise = jax.random.normal(key, mean.shape, mean.dtype)
    pre_tanh = mean + std * noise
    gaussian_log_prob = -0.5 * jnp.square(noise) - log_std - _HALF_LOG_TWO_PI
    log_jacobian = 2.0 * (math.log(2.0) - pre_tanh - jax.nn.softplus(-2.0 * pre_tanh))
    return jnp.tanh(pre_tanh), jnp.sum(gaussian_log_prob - log_jacobian, axis=-1)


def tanh_gaussian_log_prob(mean: jax.Array, log_std: jax.Array, action: jax.Array) -> jax.Array:
    """Log-density of a given squashed ``action`` (e.g. from a dataset) under the policy.

    Actions are clipped just inside (-1, 1) first: logged actions at the bounds would
    otherwise have an infinite pre-image.
    """
    limit = 1.0 - 1e-6 if action.dtype == jnp.float64 else 1.0 - 1e-5
    pre_tanh = jnp.arctanh(jnp.clip(action, -limit, limit))
    noise = (pre_tanh - mean) * jnp.exp(-log_std)
    gaussian_log_prob = -0.5 * jnp.square(noise) - log_std - _HALF_LOG_TWO_PI
    log_jacobian = 2.0 * (math.log(2.0) - pre_tanh - jax.nn.softplus(-2.0 * pre_tanh))
    return jnp.sum(gaussian_log_prob - log_jacobian, axis=-1)


class TanhGaussianActor(nn.Module):
    """A Gaussian policy squashed by ``tanh`` into actions in (-1, 1).

    Calling the module returns ``(mean, log_std)`` of the Gaussian before squashing;
    ``log_std`` is bounded smoothly to ``[log_std_min, log_std_max]`` so that neither a
    collapsing nor an exploding spread can produce non-finite log-probabilities.

    Attributes:
        action_size: length of an action.
        hidden: widths of the hidden layers.
        activation: nonlinearity of the hidden layers.
        log_std_min: smallest log standard deviation.
        log_std_max: largest log standard deviation.
        weight_init: weight initialization (:data:`KERNEL_INITS`).
    """

    action_size: int
    hidden: Sequence[int] = (256, 256)
    activation: Activation = nn.relu
    log_std_min: float = -5.0
    log_std_max: float = 2.0
    weight_init: str = "lecun"

    @nn.compact
    def __call__(self, observation: jax.Array) -> tuple[jax.Array, jax.Array]:
        features = MLP(
            self.hidden, activation=self.activation, weight_init=self.weight_init, name="torso"
        )(observation)
        width = features.shape[-1]
        mean = dense(self.action_size, width, self.weight_init, name="mean")(features)
        raw_log_std = dense(self.action_size, width, self.weight_init, name="log_std")(features)
        # A smooth bound keeps a gradient at the limits, unlike a hard clip.
        span = self.log_std_max - self.log_std_min
        log_std = self.log_std_min + 0.5 * span * (jnp.tanh(raw_log_std) + 1.0)
        return mean, log_std

    def sample(
        self, params: Params, observation: jax.Array, key: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """A squashed action drawn from the policy and its log-probability.

        Works for one observation or a batch (leading axes are kept).
        """
        mean, log_std = self.apply(params, observation)
        return tanh_gaussian_sample(mean, log_std, key)

    def sample_n(
        self, params: Params, observation: jax.Array, key: jax.Array, n: int
    ) -> tuple[jax.Array, jax.Array]:
        """``n`` actions per observation from one pass of the network: actions
        ``[n, *leading, action_size]`` and log-probabilities ``[n, *leading]``."""
        mean, log_std = self.apply(params, observation)
        shape = (n, *mean.shape)
        return tanh_gaussian_sample(
            jnp.broadcast_to(mean, shape), jnp.broadcast_to(log_std, shape), key
        )

    def log_prob(self, params: Params, observation: jax.Array, action: jax.Array) -> jax.Array:
        """Log-probability of given actions in (-1, 1), e.g. for behaviour cloning."""
        mean, log_std = self.apply(params, observation)
        return tanh_gaussian_log_prob(mean, log_std, action)

    def mean_action(self, params: Params, observation: jax.Array) -> jax.Array:
        """The deterministic action ``tanh(mean)``."""
        mean, _ = self.apply(params, observation)
        return jnp.tanh(mean)

    def act(
        self,
        policy: PolicyParams,
        observation: jax.Array,
        key: jax.Array | None,
        deterministic: bool,
    ) -> jax.Array:
        """The policy's action on a raw observation (normalized here): ``tanh(mean)``, or a
        sample drawn with ``key``."""
        normalized = policy.normalizer(observation)
        if deterministic:
            return self.mean_action(policy.actor, normalized)
        action, _ = self.sample(policy.actor, normalized, stochastic_key(key))
        return action


def stochastic_key(key: jax.Array | None) -> jax.Array:
    """``key``, which a stochastic action needs; a clear error without one."""
    if key is None:
        raise ValueError("key: a stochastic action needs a PRNG key")
    return key


def _critic_forward(
    layers: Sequence[tuple[jax.Array, jax.Array]],
    observation: jax.Array,
    action: jax.Array,
    activation: Activation,
) -> jax.Array:
    """One critic on ``(observation, action)`` with broadcasting leading axes.

    The first layer acts on ``[observation, action]`` as two products, ``obs @ W_obs +
    action @ W_act``: the same value as one product on the concatenation, but an
    observation shared by several actions (``action`` with extra leading axes) is
    projected once, not once per action.
    """
    kernel, bias = layers[0]
    obs_size = observation.shape[-1]
    x = observation @ kernel[:obs_size] + action @ kernel[obs_size:] + bias
    for kernel, bias in layers[1:]:
        x = activation(x) @ kernel + bias
    return jnp.squeeze(x, axis=-1)


def critic_layers(
    module: nn.Module,
    hidden: Sequence[int],
    in_size: int,
    ensemble: int | None,
    output: bool = True,
) -> list[tuple[jax.Array, jax.Array]]:
    """Declares a critic's parameters ``layer_i/{kernel, bias}`` (with a leading ensemble
    axis when ``ensemble`` is set), initialized as ``module.weight_init`` says (flax's ``Dense``
    by default, :func:`kernel_initializer`): the hidden layers and, with ``output``, the
    one-unit output layer."""
    lead = () if ensemble is None else (ensemble,)
    weight_init = getattr(module, "weight_init", "lecun")
    kernel_init = kernel_initializer(weight_init, (0,) if lead else ())
    layers = []
    for i, width in enumerate((*hidden, 1) if output else tuple(hidden)):
        kernel = module.param(f"layer_{i}_kernel", kernel_init, (*lead, in_size, width))
        bias_init = bias_initializer(weight_init, in_size)
        bias = module.param(f"layer_{i}_bias", bias_init, (*lead, width))
        layers.append((kernel, bias))
        in_size = width
    return layers


def over_members(
    forward: Callable[[Any], jax.Array],
    params: Any,
    n_critics: int,
    members: int | None,
    batched: bool | None,
) -> jax.Array:
    """``forward`` of each of the first ``members`` (all by default) of an ensemble whose
    parameter leaves have a leading member axis, stacked on a new leading axis.

    On a CPU the members run one after the other, each as plain matrix products (XLA's
    CPU backend runs separate products faster than one batched product); elsewhere
    (``batched=None`` decides by backend) as one ``vmap``.
    """
    count = n_critics if members is None else members
    if not 1 <= count <= n_critics:
        raise ValueError(f"members: expected 1..{n_critics}, got {members}")
    params = jax.tree.map(lambda leaf: leaf[:count], params)
    batched = jax.default_backend() != "cpu" if batched is None else batched
    if batched:
        return jax.vmap(forward)(params)
    return jnp.stack(
        [forward(jax.tree.map(functools.partial(_member, i), params)) for i in range(count)]
    )


def _member(index: int, leaf: jax.Array) -> jax.Array:
    return leaf[index]


class Critic(nn.Module):
    """A state-action value ``Q(s, a)``.

    Leading axes of observation and action broadcast against each other: an observation
    ``[B, obs]`` with actions ``[n, B, act]`` gives ``[n, B]`` values, the observation
    projected once.
    """

    hidden: Sequence[int] = (256, 256)
    activation: Activation = nn.relu

    @nn.compact
    def __call__(self, observation: jax.Array, action: jax.Array) -> jax.Array:
        in_size = observation.shape[-1] + action.shape[-1]
        layers = critic_layers(self, self.hidden, in_size, None)
        return _critic_forward(layers, observation, action, self.activation)


class EnsembleSettings(nn.Module):
    """The settings every critic ensemble has (:class:`CriticEnsemble`, the quantile
    critics' ``QuantileCriticEnsemble``), as :func:`critic_layers` and
    :func:`over_members` read them.

    Attributes:
        hidden: widths of the hidden layers (a quantile critic's torso).
        n_critics: members of the ensemble.
        activation: nonlinearity of the hidden layers.
        batched: ``True`` for one batched product per layer, ``False`` for one product per
            critic, ``None`` to choose by the default backend.
        weight_init: weight initialization (:data:`KERNEL_INITS`).
    """

    hidden: Sequence[int] = (256, 256)
    n_critics: int = 2
    activation: Activation = nn.relu
    batched: bool | None = None
    weight_init: str = "lecun"


class CriticEnsemble(EnsembleSettings):
    """``n_critics`` independent critics with parameters stacked on a leading axis.

    The output has shape ``[n_critics, *leading]`` (leading axes broadcast as in
    :class:`Critic`); the members run as :func:`over_members` says. Its settings are
    :class:`EnsembleSettings`'.
    """

    @nn.compact
    def __call__(
        self, observation: jax.Array, action: jax.Array, members: int | None = None
    ) -> jax.Array:
        """Values of the first ``members`` critics (all by default)."""
        in_size = observation.shape[-1] + action.shape[-1]
        layers = critic_layers(self, self.hidden, in_size, self.n_critics)
        return over_members(
            lambda member: _critic_forward(member, observation, action, self.activation),
            layers,
            self.n_critics,
            members,
            self.batched,
        )


@struct.dataclass
class ObservationNormalizer:
    """Fixed per-feature statistics that map raw observations to roughly unit scale."""

    mean: jax.Array
    std: jax.Array

    @classmethod
    def create(cls, mean: Any, std: Any) -> ObservationNormalizer:
        """Builds a normalizer from host data (arrays, lists, tuples); features with (near)
        zero spread are left unscaled."""
        mean = np.asarray(mean, np.float32)
        std = np.asarray(std, np.float32)
        if mean.shape != std.shape or mean.ndim != 1:
            raise ValueError(
                f"obs_mean and obs_std: expected two vectors of one length, got shapes "
                f"{mean.shape} and {std.shape}"
            )
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(std))):
            raise ValueError("obs_mean and obs_std: expected finite numbers")
        return cls(mean=jnp.asarray(mean), std=jnp.asarray(np.where(std > _MIN_STD, std, 1.0)))

    @classmethod
    def identity(cls, size: int) -> ObservationNormalizer:
        """A normalizer that leaves observations unchanged."""
        return cls(mean=jnp.zeros((size,), jnp.float32), std=jnp.ones((size,), jnp.float32))

    @classmethod
    def from_config(cls, config: Any, size: int) -> ObservationNormalizer:
        """From a config's ``obs_mean`` / ``obs_std`` (identity when they are None)."""
        if config.obs_mean is None:
            return cls.identity(size)
        return cls.create(config.obs_mean, config.obs_std)

    def __call__(self, observation: jax.Array) -> jax.Array:
        return (observation - self.mean) / self.std


class FrozenConfig:
    """Base of the frozen config dataclasses: their fields hold values in their final form
    (tuples of ``int`` and ``float``, never lists or arrays), so equal configs hash equal
    and a config can be a static argument of ``jax.jit`` without recompiling.
    ``__post_init__`` only validates; :meth:`create` converts.
    """

    @classmethod
    def create(cls: type[_Config], **values: Any) -> _Config:
        """The config with ``values`` converted to the fields' annotated types (lists and
        arrays to tuples, numpy numbers to ``int``/``float``) by pydantic, then validated.

        Raises:
            ValueError: naming each field whose value does not fit.
        """
        try:
            return _config_adapter(cls).validate_python(values, strict=False)
        except pydantic.ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in problem['loc']) or cls.__name__}: "
                f"{problem['msg'].removeprefix('Value error, ')}"
                for problem in error.errors()
            )
            raise ValueError(problems) from None

    def replace(self: _Config, **changes: Any) -> _Config:
        """A copy with the fields in ``changes`` set, converted as :meth:`create` converts
        its values."""
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        return type(self).create(**{**fields, **changes})


_Config = TypeVar("_Config", bound=FrozenConfig)


@dataclasses.dataclass(frozen=True)
class WeightInitConfig(FrozenConfig):
    """The networks' weight initialization, the one field every agent's config shares
    (a mixin of each agent's config; an agent whose evidence favours the other choice
    redeclares the field with its own default and says why).

    Attributes:
        weight_init: ``"lecun"`` (flax's LeCun normal, zero biases) or ``"uniform"``
            (PyTorch's ``nn.Linear`` default, weights and biases uniform in
            ``±1 / sqrt(fan_in)``); see :data:`KERNEL_INITS`.
    """

    weight_init: str = "lecun"

    def __post_init__(self) -> None:
        check_weight_init(self.weight_init)


@functools.cache
def _config_adapter(config_type: type) -> pydantic.TypeAdapter:
    return pydantic.TypeAdapter(config_type)


def check_tuple(name: str, value: Any, element: type) -> None:
    """Raises ``TypeError`` unless ``value`` is a tuple of ``element`` values (``bool`` is
    not an ``int`` here): the stored form of a config's sequence field."""
    if isinstance(value, tuple) and all(
        isinstance(item, element) and not isinstance(item, bool) for item in value
    ):
        return
    raise TypeError(
        f"{name}: expected a tuple of {element.__name__} values, got {value!r}; "
        "build the config with its create(...) to convert lists and arrays"
    )


def check_layer_widths(hidden: Any, name: str = "hidden") -> None:
    """Validates hidden layer widths: a non-empty tuple of positive ints."""
    check_tuple(name, hidden, int)
    if not hidden or min(hidden) < 1:
        raise ValueError(f"{name}: expected positive layer widths, got {hidden}")


def check_observation_stats(config: Any) -> None:
    """Validates a frozen config's ``obs_mean`` / ``obs_std``: both None, or two tuples of
    finite floats of one length."""
    if (config.obs_mean is None) != (config.obs_std is None):
        raise ValueError("obs_mean and obs_std: give both or neither")
    if config.obs_mean is None:
        return
    for name in ("obs_mean", "obs_std"):
        value = getattr(config, name)
        check_tuple(name, value, float)
        if not all(math.isfinite(x) for x in value):
            raise ValueError(f"{name}: expected finite numbers")
    if len(config.obs_mean) != len(config.obs_std):
        raise ValueError(
            f"obs_std: expected {len(config.obs_mean)} values like obs_mean, "
            f"got {len(config.obs_std)}"
        )


def check_network(config: Any) -> None:
    """Validates the fields every agent's config has: ``hidden`` (positive layer widths),
    ``weight_init`` and ``obs_mean`` / ``obs_std``."""
    check_layer_widths(config.hidden)
    check_weight_init(config.weight_init)
    check_observation_stats(config)


def check_positive(config: Any, *names: str) -> None:
    """Raises ``ValueError`` naming the first of ``names`` whose value in ``config`` is not a
    positive number (learning rates, weights, temperatures)."""
    for name in names:
        value = getattr(config, name)
        if not value > 0.0:
            raise ValueError(f"{name}: must be positive, got {value}")


def check_positive_int(config: Any, *names: str) -> None:
    """Raises ``ValueError`` naming the first of ``names`` whose value in ``config`` is below
    1 (counts, sizes, periods)."""
    for name in names:
        value = getattr(config, name)
        if value < 1:
            raise ValueError(f"{name}: expected a positive integer, got {value}")


def check_non_negative(config: Any, *names: str) -> None:
    """Raises ``ValueError`` naming the first of ``names`` whose value in ``config`` is
    negative (penalty weights, warm-start lengths)."""
    for name in names:
        value = getattr(config, name)
        if value < 0.0:
            raise ValueError(f"{name}: must not be negative, got {value}")


def check_tau(tau: float) -> None:
    """Raises ``ValueError`` naming ``tau`` unless the Polyak rate lies in (0, 1]."""
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"tau: must lie in (0, 1], got {tau}")


@struct.dataclass
class PolicyParams:
    """Everything a policy needs to act on raw observations; what gets saved and exported."""

    actor: Params
    normalizer: ObservationNormalizer

    @classmethod
    def create(cls, actor: nn.Module, key: jax.Array, config: Any, obs_size: int) -> PolicyParams:
        """``actor`` initialized with ``key`` for observations of ``obs_size`` features, and
        the normalizer of ``config``'s ``obs_mean`` / ``obs_std``."""
        params = actor.init(key, jnp.zeros((obs_size,), jnp.float32))
        return cls(actor=params, normalizer=ObservationNormalizer.from_config(config, obs_size))

    def normalize_batch(self, batch: Any) -> tuple[jax.Array, jax.Array]:
        """A batch's ``observations`` and ``next_observations``, normalized."""
        return self.normalizer(batch.observations), self.normalizer(batch.next_observations)


def fresh_actor_critic(
    networks: Any,
    critics: Any,
    config: Any,
    obs_size: int,
    action_size: int,
    actor_key: jax.Array,
    critic_key: jax.Array,
) -> dict[str, Any]:
    """The fields every actor-critic's fresh state shares: the ``policy``
    (:meth:`PolicyParams.create` of ``networks.actor``), the ``critic`` (``critics``
    initialized) and its ``target_critic`` (the same arrays until the first update), the
    states of ``networks.actor_optimizer`` and ``networks.critic_optimizer``, and ``step``
    0."""
    policy = PolicyParams.create(networks.actor, actor_key, config, obs_size)
    critic = critics.init(critic_key, obs_size, action_size)
    return {
        "policy": policy,
        "critic": critic,
        "target_critic": critic,
        "actor_opt_state": networks.actor_optimizer.init(policy.actor),
        "critic_opt_state": networks.critic_optimizer.init(critic),
        "step": jnp.zeros((), jnp.int32),
    }


def make_act(
    action: Callable[[PolicyParams, jax.Array, jax.Array | None, bool], jax.Array],
    deterministic: bool = True,
) -> Callable[..., jax.Array]:
    """An algorithm's ``act(policy_params, observation, key=None, deterministic=...)``:
    ``action(policy_params, raw_observation, key, deterministic)``, with ``deterministic``
    as the default of ``act``'s own (False for a policy that draws unless asked not to)."""

    def act(
        policy_params: PolicyParams,
        observation: jax.Array,
        key: jax.Array | None = None,
        deterministic: bool = deterministic,
    ) -> jax.Array:
        return action(policy_params, observation, key, deterministic)

    return act


def deterministic_act(action: Callable[[Params, jax.Array], jax.Array]) -> Callable[..., jax.Array]:
    """The ``act`` of a deterministic policy ``action(actor_params, normalized_observations)``:
    the key and ``deterministic`` change nothing."""
    return make_act(
        lambda policy, observation, *_: action(policy.actor, policy.normalizer(observation))
    )


def polyak_average(online: Params, target: Params, tau: float) -> Params:
    """Moves ``target`` a fraction ``tau`` of the way towards ``online``."""
    return jax.tree.map(lambda o, t: t + tau * (o - t), online, target)
