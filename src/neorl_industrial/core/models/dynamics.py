"""An ensemble of probabilistic dynamics models of a plant: networks, loss and a pure step.

Each member is a Gaussian MLP (PETS, MBPO, MOPO) on the normalized observation and the
action in the policy's [-1, 1]. It predicts, as a mean and a log standard deviation in
normalized units, the change of the newest observation frame (the whole observation
without stacking), the reward and every cost channel that is not known, and, where the
data ends episodes in terminal states, a termination logit. Stacked observations are
rolled forward by predicting the newest frame and shifting the history: the next
observation is ``[new frame, the current frames but the oldest]`` (newest first, as the
dataset stores them).

Channels the plant's schema defines as expressions (``signals.KnownSignals``) are computed
from the transition, not learned: the reward ``-abs(level - 2)`` of a predicted level is
exact.

:func:`make_dynamics` returns :class:`Dynamics`, pure functions over
:class:`DynamicsParams` (the chosen members' networks and every statistic the step needs,
a PyTree). ``Dynamics.step(params, observation, action, key)`` is one model step for one
observation: jit it, vmap it over starts, members and policies, scan it over a horizon.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from neorl_industrial.core.models.network import DynamicsConfig, GaussianDynamicsNetwork
from neorl_industrial.core.models.signals import KnownSignals

__all__ = [
    "Dynamics",
    "DynamicsLayout",
    "DynamicsParams",
    "MemberPrediction",
    "ModelBatch",
    "StepOutput",
    "gaussian_nll",
    "make_dynamics",
    "out_of_distribution",
]


@dataclasses.dataclass(frozen=True)
class DynamicsLayout:
    """What the networks predict, from the data's shapes and the known channels.

    Targets, in order: the change of the newest frame (``frame_size``), the reward unless
    known, the learned cost channels (``learned_costs``, by column); then a termination
    logit when ``terminals``.

    ``given``: the frame's features no action moves (a task's ``exogenous``: setpoint
    schedules, measured disturbances), by position in the frame. They are predicted like
    any other, and a step given their logged values (``given=`` of :attr:`Dynamics.step`)
    takes those instead: the reward, the costs and the next step see what the log holds.
    """

    observation_size: int
    frame_size: int
    action_size: int
    n_costs: int
    known: KnownSignals = dataclasses.field(default_factory=KnownSignals)
    terminals: bool = False
    given: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.frame_size < 1 or self.observation_size % self.frame_size:
            raise ValueError(
                f"frame_size {self.frame_size} does not divide observation_size "
                f"{self.observation_size}"
            )
        bad = [i for i in self.known.cost_indices if not 0 <= i < self.n_costs]
        if bad:
            raise ValueError(f"known cost columns {bad} outside the {self.n_costs} costs")
        given = self.given
        if (
            not isinstance(given, tuple)
            or any(type(i) is not int or not 0 <= i < self.frame_size for i in given)
            or list(given) != sorted(set(given))
        ):
            raise ValueError(
                f"given features {given!r}: expected a tuple of distinct positions in the "
                f"frame of {self.frame_size}, in order"
            )

    def given_mask(self) -> np.ndarray:
        """``[frame_size]`` True where a feature is :attr:`given`."""
        mask = np.zeros(self.frame_size, bool)
        mask[list(self.given)] = True
        return mask

    @property
    def frame_stack(self) -> int:
        return self.observation_size // self.frame_size

    @property
    def learned_reward(self) -> bool:
        return self.known.reward is None

    @property
    def learned_costs(self) -> tuple[int, ...]:
        known = set(self.known.cost_indices)
        return tuple(i for i in range(self.n_costs) if i not in known)

    @property
    def target_size(self) -> int:
        return self.frame_size + int(self.learned_reward) + len(self.learned_costs)

    @property
    def input_size(self) -> int:
        return self.observation_size + self.action_size


@struct.dataclass
class DynamicsParams:
    """Everything a model step needs, as arrays (a PyTree): the members' networks
    (leading member axis), the statistics of the data it was fitted on, and the action
    scaler's bounds (known channels take actions in plant units)."""

    networks: Any  # [members, ...] parameter leaves
    obs_mean: jax.Array  # [obs_size]
    obs_std: jax.Array  # [obs_size]
    target_mean: jax.Array  # [target_size]
    target_std: jax.Array  # [target_size]
    #: Targets constant over the data (a fixed setpoint's change, a reward that is always
    #: 0): predicted as their mean, not learned (a spread floor would turn rounding noise
    #: into drift of the plant's units).
    target_fixed: jax.Array  # [target_size] bool
    #: The smallest value of each cost channel in the data (0 for costs that are 0 when
    #: safe): a learned cost is never predicted below it.
    cost_low: jax.Array  # [n_costs]
    obs_low: jax.Array  # [obs_size]: the data's range of each feature
    obs_high: jax.Array  # [obs_size]
    policy_action_low: jax.Array  # [action_size]: the data's range in the policy's [-1, 1]
    policy_action_high: jax.Array  # [action_size]
    action_low: jax.Array  # [action_size]: the scaler's plant-unit bounds
    action_high: jax.Array  # [action_size]
    #: Where a predicted feature of the new frame is still plant behaviour: the schema's
    #: physical range, or the data's where the schema gives none. A prediction outside
    #: is clipped onto it and the step reports by how much it left (``outside_physics``).
    #: None: no bound (predictions pass as they are).
    frame_low: jax.Array | None = None  # [frame_size]
    frame_high: jax.Array | None = None  # [frame_size]
    #: The largest value of each cost channel in the data: a learned cost is never
    #: predicted above it (a 0/1 alarm is at most 1 a step). None: no bound.
    cost_high: jax.Array | None = None  # [n_costs]
    #: The data's range of the reward: a learned reward stays inside it. None: no bound.
    reward_low: jax.Array | None = None  # []
    reward_high: jax.Array | None = None  # []

    @property
    def n_members(self) -> int:
        return int(jax.tree.leaves(self.networks)[0].shape[0])

    def members(self, indices: Any) -> DynamicsParams:
        """These parameters with only the members ``indices`` (e.g. the elites)."""
        indices = jnp.asarray(indices)
        return self.replace(networks=jax.tree.map(lambda leaf: leaf[indices], self.networks))


class MemberPrediction(NamedTuple):
    """One member's Gaussian over the targets, in normalized units."""

    mean: jax.Array  # [..., target_size]
    log_std: jax.Array  # [..., target_size]
    logit: jax.Array  # [...]: termination logit (0 when the layout has no terminals)


class StepOutput(NamedTuple):
    """One model step of one observation.

    Attributes:
        next_observation: ``[obs_size]`` in plant units (the new frame, then the shifted
            history).
        reward: scalar: computed from its expression when known, else predicted.
        costs: ``[n_costs]``, known ones computed, the others predicted.
        done: whether the model predicts a terminal state (False when the data has none).
        member_std: ``[frame_size]`` disagreement: the standard deviation over members
            of their mean predictions of the new frame, in plant units.
        out_of_distribution: how far observation and action lie outside the data's
            range, in units of each feature's spread (0 inside; see
            :func:`out_of_distribution`).
        outside_physics: how far the followed member's prediction of the new frame left
            its physical range (``DynamicsParams.frame_low``/``frame_high``) before it
            was clipped onto it, in units of each feature's spread (0 inside).
    """

    next_observation: jax.Array
    reward: jax.Array
    costs: jax.Array
    done: jax.Array
    member_std: jax.Array
    out_of_distribution: jax.Array
    outside_physics: jax.Array


class Dynamics(NamedTuple):
    """The model as pure functions (bound to config and layout).

    Attributes:
        init: ``init(key) -> networks`` of one member (vmap over keys for an ensemble).
        predict: ``predict(networks, params, observations, actions) -> MemberPrediction``
            of one member (``networks`` without member axis) on raw observations and
            actions in [-1, 1], with any leading axes.
        loss: ``loss(networks, params, batch) -> (loss, metrics)`` of one member on a batch.
        step: ``step(params, observation, action, key, member=None, deterministic=False,
            given=None) -> StepOutput`` for one observation; ``member`` picks the member
            whose prediction is followed (an int, traced or not), None draws one per step;
            ``deterministic`` follows its mean instead of a sample; ``given`` (``[frame_size]``,
            the logged new frame) supplies the layout's given features.
        transition: ``transition(params, observation, action, key, member,
            deterministic=False, given=None) -> (next_observation, reward, costs, done)``:
            the step of one member alone (no disagreement; one network evaluated, not all).
        checked_transition: the same, with a fifth value: how far the prediction left
            the physical range before it was clipped (``StepOutput.outside_physics``).
        targets: ``targets(observations, actions_plant, next_observations, rewards, costs)
            -> [..., target_size]`` raw targets of transitions (host or device arrays).
        window_loss: ``window_loss(networks, params, batch, valid) -> (loss, metrics)`` of
            one member over windows of consecutive steps (``batch`` with ``[B, K]``
            leading axes), each step after the first from its own mean prediction.
    """

    config: DynamicsConfig
    layout: DynamicsLayout
    init: Callable[[jax.Array], Any]
    predict: Callable[..., MemberPrediction]
    loss: Callable[..., tuple[jax.Array, dict[str, jax.Array]]]
    step: Callable[..., StepOutput]
    transition: Callable[..., tuple[jax.Array, jax.Array, jax.Array, jax.Array]]
    targets: Callable[..., jax.Array]
    checked_transition: Callable[..., tuple[jax.Array, ...]] | None = None
    window_loss: Callable[..., tuple[jax.Array, dict[str, jax.Array]]] | None = None


class ModelBatch(NamedTuple):
    """Transitions a model learns from: raw observations, actions in [-1, 1], raw
    targets (:attr:`Dynamics.targets`) and terminal flags."""

    observations: jax.Array  # [B, obs_size]
    actions: jax.Array  # [B, action_size]
    targets: jax.Array  # [B, target_size]
    terminals: jax.Array  # [B] bool


def gaussian_nll(mean: jax.Array, log_std: jax.Array, target: jax.Array) -> jax.Array:
    """Negative log-likelihood of ``target`` under ``N(mean, exp(log_std)^2)``, per
    element (the constant included)."""
    z = (target - mean) * jnp.exp(-log_std)
    return 0.5 * jnp.square(z) + log_std + 0.5 * math.log(2.0 * math.pi)


def out_of_distribution(
    params: DynamicsParams,
    observation: jax.Array,
    action: jax.Array,
    features: int | None = None,
) -> jax.Array:
    """How far ``observation`` (raw) and ``action`` (in [-1, 1]) lie outside the range
    of the data the model was fitted on: the largest excess over any feature or action,
    in units of that feature's spread (the observation's standard deviation; for actions
    half the width of [-1, 1]). 0 inside the data's box; leading axes are kept.
    ``features``: only the observation's first ones count (its newest frame, in a rollout
    that charges each predicted frame once, when it is new, not again as it ages)."""
    size = observation.shape[-1] if features is None else features
    observation = observation[..., :size]
    below = (params.obs_low[:size] - observation) / params.obs_std[:size]
    above = (observation - params.obs_high[:size]) / params.obs_std[:size]
    obs_excess = jnp.max(jnp.maximum(jnp.maximum(below, above), 0.0), axis=-1)
    action_below = params.policy_action_low - action
    action_above = action - params.policy_action_high
    action_excess = jnp.max(jnp.maximum(jnp.maximum(action_below, action_above), 0.0), axis=-1)
    return jnp.maximum(obs_excess, action_excess)


@dataclasses.dataclass(frozen=True)
class _Model:
    """The static part of a :class:`Dynamics`: one member's network and the layout. The
    module's pure functions take it first; :func:`make_dynamics` binds it."""

    network: GaussianDynamicsNetwork
    layout: DynamicsLayout


def _init(model: _Model, key: jax.Array) -> Any:
    return model.network.init(key, jnp.zeros((model.layout.input_size,), jnp.float32))


def _predict(
    model: _Model,
    networks: Any,
    params: DynamicsParams,
    observations: jax.Array,
    actions: jax.Array,
) -> MemberPrediction:
    normalized = (observations - params.obs_mean) / params.obs_std
    inputs = jnp.concatenate([normalized, actions], axis=-1)
    mean, log_std, logit = model.network.apply(networks, inputs)
    if not model.layout.terminals:
        logit = jnp.zeros_like(logit)
    return MemberPrediction(mean=mean, log_std=log_std, logit=logit)


def _targets(
    layout: DynamicsLayout,
    observations: Any,
    actions: Any,
    next_observations: Any,
    rewards: Any,
    costs: Any,
) -> Any:
    del actions  # the targets are changes and signals; actions are inputs only
    xp = jnp if isinstance(observations, jax.Array) else np
    frame = layout.frame_size
    parts = [next_observations[..., :frame] - observations[..., :frame]]
    if layout.learned_reward:
        parts.append(rewards[..., None])
    if layout.learned_costs:
        parts.append(costs[..., list(layout.learned_costs)])
    return xp.concatenate([xp.asarray(part, xp.float32) for part in parts], axis=-1)


def _errors(
    model: _Model,
    networks: Any,
    params: DynamicsParams,
    observations: jax.Array,
    batch: ModelBatch,
    alive: jax.Array,
) -> tuple[MemberPrediction, jax.Array, jax.Array, jax.Array]:
    """One member's prediction from ``observations`` ``[B, obs]`` and its errors against
    ``batch``'s raw targets, summed over the rows ``alive`` ``[B]`` (learned targets
    only): ``(prediction, NLL, squared error of the normalized targets, termination
    BCE)``."""
    prediction = _predict(model, networks, params, observations, batch.actions)
    normalized = (batch.targets - params.target_mean) / params.target_std
    mask = alive.astype(jnp.float32)[:, None] * (1.0 - params.target_fixed.astype(jnp.float32))
    nll = jnp.sum(gaussian_nll(prediction.mean, prediction.log_std, normalized) * mask)
    mse = jnp.sum(jnp.square(prediction.mean - normalized) * mask)
    bce = jnp.zeros(())
    if model.layout.terminals:
        terminals = batch.terminals.astype(jnp.float32)
        bce = jnp.sum(optax.sigmoid_binary_cross_entropy(prediction.logit, terminals) * alive)
    return prediction, nll, mse, bce


def _averaged(
    model: _Model, params: DynamicsParams, nll: jax.Array, mse: jax.Array, bce: jax.Array,
    rows: jax.Array,
) -> tuple[jax.Array, dict[str, jax.Array]]:  # fmt: skip
    """``(loss, metrics)`` of summed errors over ``rows`` rows: NLL and MSE per learned
    target and row, the termination BCE per row (added to the loss)."""
    count = jnp.maximum(jnp.sum(1.0 - params.target_fixed.astype(jnp.float32)), 1.0) * rows
    metrics = {"nll": nll / count, "mse": mse / count}
    total = metrics["nll"]
    if model.layout.terminals:
        metrics["termination_bce"] = bce / rows
        total = total + metrics["termination_bce"]
    return total, metrics


def _loss(
    model: _Model, networks: Any, params: DynamicsParams, batch: ModelBatch
) -> tuple[jax.Array, dict[str, jax.Array]]:
    rows = batch.observations.shape[0]
    alive = jnp.ones((rows,), jnp.float32)
    _, nll, mse, bce = _errors(model, networks, params, batch.observations, batch, alive)
    return _averaged(model, params, nll, mse, bce, jnp.asarray(rows, jnp.float32))


def _window_loss(
    model: _Model,
    networks: Any,
    params: DynamicsParams,
    batch: ModelBatch,
    valid: jax.Array,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The loss of one member over windows of consecutive logged steps (``batch`` with
    ``[B, K]`` leading axes, ``valid [B, K]``: the step lies inside its episode): the first
    step from the logged observation, each later one from the member's own mean
    prediction of the step before (the older frames shifted in as the model would), each
    scored against the logged next frame, reward and costs. Gradients flow through the
    predicted observations, so the member learns what its errors become a few steps on,
    not only one step ahead."""
    layout, frame = model.layout, model.layout.frame_size
    advance = jax.vmap(
        lambda observation, target: _next_observation(layout, params, observation, target)[0]
    )
    steps = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), (batch, valid))

    def step(observation, inputs):
        part, alive = inputs
        # The logged next frame, as a change from where the member stands.
        logged_next = part.observations[:, :frame] + part.targets[:, :frame]
        targets = jnp.concatenate(
            [logged_next - observation[:, :frame], part.targets[:, frame:]], axis=-1
        )
        prediction, *errors = _errors(
            model, networks, params, observation, part._replace(targets=targets), alive
        )
        return advance(observation, _to_target(params, prediction.mean)), errors

    _, (nll, mse, bce) = jax.lax.scan(step, batch.observations[:, 0], steps)
    rows = jnp.maximum(jnp.sum(valid), 1.0)
    return _averaged(model, params, jnp.sum(nll), jnp.sum(mse), jnp.sum(bce), rows)


def _followed(
    mean: jax.Array, log_std: jax.Array, key: jax.Array, deterministic: bool
) -> jax.Array:
    """The normalized prediction a step follows: the member's mean, or a draw from its
    Gaussian."""
    if deterministic:
        return mean
    return mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape, mean.dtype)


def _to_target(params: DynamicsParams, normalized: jax.Array) -> jax.Array:
    """Raw targets of normalized predictions; constant targets at their mean."""
    raw = normalized * params.target_std + params.target_mean
    return jnp.where(params.target_fixed, params.target_mean, raw)


def _next_observation(
    layout: DynamicsLayout,
    params: DynamicsParams,
    observation: jax.Array,
    target: jax.Array,
    given: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The next observation from raw targets, the new frame clipped onto its physical
    range, and how far the frame left that range (in spreads); with ``given`` (the
    logged new frame), the layout's given features are the logged values (neither
    clipped nor charged: the log is the plant)."""
    frame = layout.frame_size
    new_frame = observation[:frame] + target[:frame]
    excess = jnp.zeros((), observation.dtype)
    taken = given is not None and bool(layout.given)
    if params.frame_low is not None:
        clipped = jnp.clip(new_frame, params.frame_low, params.frame_high)
        outside = jnp.abs(new_frame - clipped) / params.obs_std[:frame]
        if taken:
            outside = jnp.where(layout.given_mask(), 0.0, outside)
        excess = jnp.max(outside)
        new_frame = clipped
    if taken:
        new_frame = jnp.where(layout.given_mask(), given.astype(new_frame.dtype), new_frame)
    next_observation = jnp.concatenate([new_frame, observation[: layout.observation_size - frame]])
    return next_observation, excess


def _signals(
    layout: DynamicsLayout,
    params: DynamicsParams,
    observation: jax.Array,
    action: jax.Array,
    next_observation: jax.Array,
    target: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Reward and costs of one transition: known channels computed (on the action in
    plant units), a learned reward and learned costs from raw targets, kept inside the
    data's range."""
    plant_action = params.action_low + (action + 1.0) * 0.5 * (
        params.action_high - params.action_low
    )
    known = layout.known.evaluate(observation, plant_action, next_observation)
    if layout.learned_reward:
        reward = target[layout.frame_size]
        if params.reward_low is not None:
            reward = jnp.clip(reward, params.reward_low, params.reward_high)
    else:
        reward = known["reward"]
    cost_start = layout.frame_size + int(layout.learned_reward)
    costs = jnp.zeros((layout.n_costs,), observation.dtype)
    for slot, column in enumerate(layout.learned_costs):
        value = jnp.maximum(target[cost_start + slot], params.cost_low[column])
        if params.cost_high is not None:
            value = jnp.minimum(value, params.cost_high[column])
        costs = costs.at[column].set(value)
    for signal in layout.known.signals:
        if signal.index is not None:
            costs = costs.at[signal.index].set(known[signal.channel])
    return jnp.asarray(reward, observation.dtype), costs


def _outcome(
    layout: DynamicsLayout,
    params: DynamicsParams,
    observation: jax.Array,
    action: jax.Array,
    normalized: jax.Array,
    given: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Next observation, reward, costs and the physics excess of the followed normalized
    prediction (the given features logged, with ``given``)."""
    target = _to_target(params, normalized)
    next_observation, excess = _next_observation(layout, params, observation, target, given)
    reward, costs = _signals(layout, params, observation, action, next_observation, target)
    return next_observation, reward, costs, excess


def _checked_transition(
    model: _Model,
    params: DynamicsParams,
    observation: jax.Array,
    action: jax.Array,
    key: jax.Array,
    member: Any,
    deterministic: bool = False,
    given: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    networks = jax.tree.map(lambda leaf: leaf[member], params.networks)
    prediction = _predict(model, networks, params, observation, action)
    normalized = _followed(prediction.mean, prediction.log_std, key, deterministic)
    next_observation, reward, costs, excess = _outcome(
        model.layout, params, observation, action, normalized, given
    )
    done = (prediction.logit > 0.0) & model.layout.terminals
    return next_observation, reward, costs, done, excess


def _transition(
    model: _Model, params: DynamicsParams, *args: Any, **kwargs: Any
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """:func:`_checked_transition` without the physics excess (same arguments)."""
    return _checked_transition(model, params, *args, **kwargs)[:4]


def _step(
    model: _Model,
    params: DynamicsParams,
    observation: jax.Array,
    action: jax.Array,
    key: jax.Array,
    member: Any = None,
    deterministic: bool = False,
    given: jax.Array | None = None,
) -> StepOutput:
    predictions = jax.vmap(functools.partial(_predict, model), in_axes=(0, None, None, None))(
        params.networks, params, observation, action
    )  # [members, target_size]
    member_key, noise_key = jax.random.split(key)
    if member is None:
        member = jax.random.randint(member_key, (), 0, params.n_members)
    normalized = _followed(
        predictions.mean[member], predictions.log_std[member], noise_key, deterministic
    )
    next_observation, reward, costs, excess = _outcome(
        model.layout, params, observation, action, normalized, given
    )
    frame = model.layout.frame_size
    # Members cannot disagree on a constant target, nor on what the log gives.
    agreed = params.target_fixed[:frame]
    if given is not None and model.layout.given:
        agreed = agreed | model.layout.given_mask()
    member_means = jnp.where(agreed, 0.0, predictions.mean[:, :frame] * params.target_std[:frame])
    done = (predictions.logit[member] > 0.0) & model.layout.terminals
    return StepOutput(
        next_observation=next_observation,
        reward=reward,
        costs=costs,
        done=done,
        member_std=jnp.std(member_means, axis=0),
        out_of_distribution=out_of_distribution(params, observation, action),
        outside_physics=excess,
    )


def make_dynamics(config: DynamicsConfig, layout: DynamicsLayout) -> Dynamics:
    """The ensemble's pure functions for ``config`` and ``layout``."""
    network = GaussianDynamicsNetwork(config=config, target_size=layout.target_size)
    model = _Model(network=network, layout=layout)
    return Dynamics(
        config=config,
        layout=layout,
        init=functools.partial(_init, model),
        predict=functools.partial(_predict, model),
        loss=functools.partial(_loss, model),
        step=functools.partial(_step, model),
        transition=functools.partial(_transition, model),
        targets=functools.partial(_targets, layout),
        checked_transition=functools.partial(_checked_transition, model),
        window_loss=functools.partial(_window_loss, model),
    )
