"""Model-based off-policy evaluation: every candidate policy rolled out in every member of
a plant model from every held-out starting state, as one compiled program.

:func:`make_policy_rollouts` builds ``rollouts(policy_params, dynamics_params, starts,
lengths, key) -> RolloutSums`` with leading axes ``[policies, members, starts]``: the
policies' parameters are stacked on a leading axis and ``vmap``-ped, the members are the
plant model's elites (each rollout follows one member throughout), the starts are the
held-out episodes' first observations, and every rollout is a ``lax.scan`` over the
horizon with the safety shield between the policy and the model (plant units, the real
previous action carried, as the server applies it).

:func:`make_logged_replay` evaluates the logged operation by the same estimator: the
held-out episodes' own actions replayed open loop in every member from the same starts,
with the same keys (common random numbers), so a candidate's improvement over the
operators is a paired difference per member and start.

Each rollout accumulates, for ``t`` below its start's length (the episode's, capped at
the horizon) and until the model predicts a terminal state: the reward and every cost
channel, discounted (``γ^t``) and not; and the step's *uncertainty* ``u_t``, the members'
disagreement on the new frame in units of each feature's spread (mean over features)
plus how far the observation's newest frame and the action lie outside the data's range
(:func:`~neorl_industrial.core.models.dynamics.out_of_distribution`; an older frame was
charged when it was new). Measuring the
disagreement makes every member predict (``M`` times a member's work), so it is measured
every ``disagreement_every`` steps and held in between; the out-of-distribution excess
is measured at every step. The sums of ``u_t``
are linear in the penalty, so the host chooses the pessimism after the program ran:
a pessimistic return is ``return - λ σ_r Σ u_t`` and a pessimistic cost ``cost + λ σ_c
Σ u_t`` (``σ`` the signal's per-step spread in the data), MOPO's penalty with the
ensemble's disagreement as the uncertainty.

With ``close_after = k`` the sums of the first ``k`` steps and the observation reached
after them are kept too, for an estimate that closes the rollout with a learned value
(``Σ_{t<k} γ^t r_t + γ^k V(s_k)``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from neorl_industrial.core.models.dynamics import Dynamics, DynamicsParams, out_of_distribution
from neorl_industrial.core.safety import shield

__all__ = [
    "ModelRolloutOptions",
    "RolloutSums",
    "make_logged_replay",
    "make_policy_rollouts",
    "step_uncertainty",
]


class RolloutSums(NamedTuple):
    """What one rollout accumulated (any leading axes; ``C`` cost channels).

    Attributes:
        discounted_return: ``Σ γ^t r_t``.
        total_return: ``Σ r_t`` (undiscounted).
        discounted_costs: ``[C]`` ``Σ γ^t c_t``.
        total_costs: ``[C]`` ``Σ c_t``.
        discounted_uncertainty: ``Σ γ^t u_t`` (see the module docstring).
        total_uncertainty: ``Σ u_t``.
        steps: steps counted (the start's length, or fewer after a predicted terminal).
        outside_data_steps: steps whose observation or action lay outside the data's range.
        overridden_steps: steps whose action the shield changed (0 for logged actions).
        outside_physics_steps: steps whose predicted frame left its physical range (it
            was clipped onto it, and the step charged for it).
        far_weight: ``Σ γ^t`` over the steps whose observation or action lay further
            outside the data's range than ``far_outside`` spreads: steps the model cannot
            vouch for (0 when ``far_outside`` is None).
        far_return: ``Σ γ^t r_t`` over the same steps.
        head_return: ``Σ_{t<k} γ^t r_t`` of the first ``close_after`` steps.
        head_costs: ``[C]`` ``Σ_{t<k} γ^t c_t``.
        head_uncertainty: ``Σ_{t<k} γ^t u_t``.
        closing_observation: ``[obs_size]`` the observation after ``k`` steps (after the
            last counted step when the rollout ended before).
        closing_weight: ``γ^k`` when the rollout is still running after ``k`` steps, else 0.
    """

    discounted_return: jax.Array
    total_return: jax.Array
    discounted_costs: jax.Array
    total_costs: jax.Array
    discounted_uncertainty: jax.Array
    total_uncertainty: jax.Array
    steps: jax.Array
    outside_data_steps: jax.Array
    overridden_steps: jax.Array
    outside_physics_steps: jax.Array
    far_weight: jax.Array
    far_return: jax.Array
    head_return: jax.Array
    head_costs: jax.Array
    head_uncertainty: jax.Array
    closing_observation: jax.Array
    closing_weight: jax.Array


@dataclasses.dataclass(frozen=True)
class ModelRolloutOptions:
    """How the rollouts run and what they sum (static: part of the compiled program).

    Attributes:
        horizon: steps per rollout at most.
        discount: γ of the discounted sums.
        close_after: ``k`` of the head sums and closing observation (0: none kept).
        deterministic: follow each member's mean instead of sampling its noise.
        disagreement_every: measure the members' disagreement every this many steps
            (every member predicts on those steps, ``M`` times the work of one member;
            the measure holds until the next); 0: never (the uncertainty is then the
            out-of-distribution excess alone). The out-of-distribution excess is
            measured at every step.
        reward_cap: a step's reward is never counted above this (the highest reward in
            the data): a model extrapolating outside its data cannot promise rewards
            the plant was never seen to give. None: no cap.
        far_outside: steps further outside the data's range than this (in spreads) are
            summed apart (``far_weight``, ``far_return``); None: none.
    """

    horizon: int
    discount: float
    close_after: int = 0
    deterministic: bool = False
    disagreement_every: int = 1
    reward_cap: float | None = None
    far_outside: float | None = None


def step_uncertainty(
    params: DynamicsParams,
    member_std: jax.Array,
    ood: jax.Array,
    frame_size: int,
    predicted: Any = None,
) -> jax.Array:
    """``u_t``: the members' disagreement on the new frame in units of each feature's
    spread in the data (mean over the frame's features, or over the ``predicted`` ones:
    a feature the log gives is not uncertain, nor does it dilute the others), plus the
    out-of-distribution excess (already in spread units)."""
    relative = member_std / params.obs_std[:frame_size]
    if predicted is None:
        return jnp.mean(relative) + ood
    weights = jnp.asarray(predicted, relative.dtype)
    return jnp.sum(relative * weights) / jnp.maximum(jnp.sum(weights), 1.0) + ood


def _zeros(n_costs: int, obs_size: int) -> RolloutSums:
    scalar = jnp.zeros((), jnp.float32)
    costs = jnp.zeros((n_costs,), jnp.float32)
    return RolloutSums(
        discounted_return=scalar,
        total_return=scalar,
        discounted_costs=costs,
        total_costs=costs,
        discounted_uncertainty=scalar,
        total_uncertainty=scalar,
        steps=jnp.zeros((), jnp.int32),
        outside_data_steps=jnp.zeros((), jnp.int32),
        overridden_steps=jnp.zeros((), jnp.int32),
        outside_physics_steps=jnp.zeros((), jnp.int32),
        far_weight=scalar,
        far_return=scalar,
        head_return=scalar,
        head_costs=costs,
        head_uncertainty=scalar,
        closing_observation=jnp.zeros((obs_size,), jnp.float32),
        closing_weight=scalar,
    )


class _Outcome(NamedTuple):
    """What one counted step adds to the sums."""

    reward: jax.Array
    costs: jax.Array
    uncertainty: jax.Array
    outside: jax.Array  # outside the data
    overridden: jax.Array  # by the shield
    unphysical: jax.Array  # the prediction left its physical range
    far: jax.Array  # far outside the data
    next_observation: jax.Array
    alive_after: jax.Array


def _accumulate(
    sums: RolloutSums,
    t: jax.Array,
    counted: jax.Array,
    options: ModelRolloutOptions,
    outcome: _Outcome,
) -> RolloutSums:
    """``sums`` after step ``t`` (counted or not)."""
    discount, close_after = options.discount, options.close_after
    reward, costs, uncertainty = outcome.reward, outcome.costs, outcome.uncertainty
    weight = jnp.where(counted, discount ** t.astype(jnp.float32), 0.0)
    unit = counted.astype(jnp.float32)
    head = weight * (t < close_after)
    closing = counted & (t == close_after - 1)
    far = outcome.far

    def count(flag: jax.Array) -> jax.Array:
        return (counted & flag).astype(jnp.int32)

    return RolloutSums(
        discounted_return=sums.discounted_return + weight * reward,
        total_return=sums.total_return + unit * reward,
        discounted_costs=sums.discounted_costs + weight * costs,
        total_costs=sums.total_costs + unit * costs,
        discounted_uncertainty=sums.discounted_uncertainty + weight * uncertainty,
        total_uncertainty=sums.total_uncertainty + unit * uncertainty,
        steps=sums.steps + counted.astype(jnp.int32),
        outside_data_steps=sums.outside_data_steps + count(outcome.outside),
        overridden_steps=sums.overridden_steps + count(outcome.overridden),
        outside_physics_steps=sums.outside_physics_steps + count(outcome.unphysical),
        far_weight=sums.far_weight + jnp.where(far, weight, 0.0),
        far_return=sums.far_return + jnp.where(far, weight * reward, 0.0),
        head_return=sums.head_return + head * reward,
        head_costs=sums.head_costs + head * costs,
        head_uncertainty=sums.head_uncertainty + head * uncertainty,
        closing_observation=jnp.where(
            counted & (t < close_after), outcome.next_observation, sums.closing_observation
        ),
        closing_weight=jnp.where(
            closing,
            jnp.where(outcome.alive_after, discount ** float(close_after), 0.0),
            sums.closing_weight,
        ),
    )


def _padded(horizon: int, every: int) -> int:
    """The horizon rounded up to whole blocks of ``every`` steps."""
    return horizon if every <= 1 else -(-horizon // every) * every


def _scan_blocks(advance: Callable[..., Any], carry: Any, xs: Any, every: int) -> Any:
    """``carry`` after ``advance(carry, x, measure)`` over the leading axis of ``xs``:
    ``measure`` on the first step of every block of ``every`` steps (every step for 1,
    never for 0). Static structure: an outer scan over blocks, an inner one within."""
    if every <= 1:
        carry, _ = jax.lax.scan(lambda c, x: (advance(c, x, every == 1), None), carry, xs)
        return carry
    blocks = jax.tree.map(lambda a: a.reshape(a.shape[0] // every, every, *a.shape[1:]), xs)

    def block(carry, xb):
        carry = advance(carry, jax.tree.map(lambda a: a[0], xb), True)
        rest = jax.tree.map(lambda a: a[1:], xb)
        carry, _ = jax.lax.scan(lambda c, x: (advance(c, x, False), None), carry, rest)
        return carry, None

    carry, _ = jax.lax.scan(block, carry, blocks)
    return carry


class _Carry(NamedTuple):
    """A rollout's state between model steps."""

    observation: jax.Array
    alive: jax.Array
    held: jax.Array  # the last measured disagreement of the members
    sums: RolloutSums


class _Rollout(NamedTuple):
    """What a policy's rollout and the logged replay share: the options, the padded
    horizon, the first carry from a start, and ``stepper(params, member, length)``, whose
    ``step(carry, action, overridden, key, t, measure) -> carry`` is one model step and
    what it adds to the sums."""

    options: ModelRolloutOptions
    padded: int
    first: Callable[[jax.Array], _Carry]
    stepper: Callable[..., Callable[..., _Carry]]

    def scan(self, advance: Callable[..., Any], carry: Any, xs: Any) -> Any:
        return _scan_blocks(advance, carry, xs, self.options.disagreement_every)


def _rollout(dynamics: Dynamics, options: ModelRolloutOptions) -> _Rollout:
    n_costs, obs_size = dynamics.layout.n_costs, dynamics.layout.observation_size

    def first(start: jax.Array) -> _Carry:
        return _Carry(start, jnp.ones((), bool), jnp.zeros((), jnp.float32),
                      _zeros(n_costs, obs_size))  # fmt: skip

    layout = dynamics.layout

    def stepper(params: DynamicsParams, member: jax.Array, length: jax.Array):
        def predict(observation, action, key, measure, held, given):
            """``(next_observation, reward, costs, done, disagreement, ood, physics)``
            (``physics``: how far the prediction left its physical range before it was
            clipped, in spreads). With ``measure`` every member predicts and their
            disagreement is measured; otherwise only ``member`` predicts and ``held`` is
            passed on. ``given``: the logged new frame (None: everything predicted)."""
            # The newest frame only: an older one was charged when it was new.
            ood = out_of_distribution(params, observation, action, layout.frame_size)
            if measure:
                out = dynamics.step(params, observation, action, key, member,
                                    options.deterministic, given)  # fmt: skip
                predicted = None if given is None or not layout.given else ~layout.given_mask()
                disagreement = step_uncertainty(
                    params, out.member_std, 0.0, layout.frame_size, predicted
                )
                return (
                    out.next_observation, out.reward, out.costs, out.done, disagreement, ood,
                    out.outside_physics,
                )  # fmt: skip
            next_observation, reward, costs, done, physics = dynamics.checked_transition(
                params, observation, action, key, member, options.deterministic, given
            )
            return next_observation, reward, costs, done, held, ood, physics

        def step(carry: _Carry, action, overridden, key, t, measure, given=None) -> _Carry:
            next_observation, reward, costs, done, held, ood, physics = predict(
                carry.observation, action, key, measure, carry.held, given
            )
            if options.reward_cap is not None:
                reward = jnp.minimum(reward, options.reward_cap)
            counted = carry.alive & (t < length)
            alive_after = carry.alive & ~done
            # A prediction that left physics was clipped onto it and is charged for how
            # far it left, as uncertainty: the plant never behaves so, the model only
            # predicted it.
            far = jnp.zeros((), bool) if options.far_outside is None else ood > options.far_outside
            outcome = _Outcome(
                reward, costs, held + ood + physics, ood > 0.0, overridden, physics > 0.0, far,
                next_observation, alive_after,
            )  # fmt: skip
            sums = _accumulate(carry.sums, t, counted, options, outcome)
            observation = jnp.where(counted, next_observation, carry.observation)
            return _Carry(observation, alive_after, held, sums)

        return step

    return _Rollout(options, _padded(options.horizon, options.disagreement_every), first,
                    stepper)  # fmt: skip


def make_policy_rollouts(
    dynamics: Dynamics,
    act: Callable[..., jax.Array],
    options: ModelRolloutOptions | None = None,
    *,
    constraints: Any = None,
    scaler: Any = None,
    stochastic_policy: bool = False,
    **fields: Any,
) -> Callable[..., RolloutSums]:
    """The compiled-ready program ``rollouts(policy_params, dynamics_params, starts,
    lengths, key) -> RolloutSums`` with leading axes ``[P, M, N]``.

    Args:
        dynamics: the plant model's pure functions.
        act: ``act(policy_params, observation, key, deterministic=True) -> action`` of one
            raw observation, in the policy's [-1, 1] (an ``Algorithm.act``).
        options: see :class:`ModelRolloutOptions` (or its fields as keywords).
        constraints: the shield's compiled constraints (plant units); None: no shield.
        scaler: the task's ``ActionScaler`` (None: actions are in plant units already).
        stochastic_policy: ``act`` receives a key of its own every step (drawn apart
            from the model's noise, so the model's noise stays common to every policy)
            and ``deterministic=False``; otherwise ``None`` and ``deterministic=True``.

    The program's inputs: ``policy_params`` stacked on a leading axis ``P``;
    ``dynamics_params`` with ``M`` members; ``starts [N, obs_size]``; ``lengths [N]``
    steps counted per start (at most ``horizon``); ``key``: the noise of member ``m``
    and start ``n`` is the same for every policy (and for :func:`make_logged_replay`);
    ``given [N, horizon, frame_size]`` (optional): each start's logged next frames, whose
    features the layout marks ``given`` replace the predicted ones step by step (steps
    past a start's length are not counted, so their values do not matter);
    ``offsets [N, horizon, action_size]`` (optional): added to the policy's action step by
    step (in [-1, 1], clipped onto it) before the shield: a logged sequence replayed on top
    of a feedback policy.
    """
    rollout = _rollout(dynamics, options or ModelRolloutOptions(**fields))

    def one(policy_params, params, member, start, length, key, given, offsets):
        step = rollout.stepper(params, member, length)

        def advance(carry, inputs, measure):
            carry, previous = carry
            t, step_key, given_t, offset_t = inputs
            if stochastic_policy:
                act_key = jax.random.fold_in(step_key, 1)
                proposed = act(policy_params, carry.observation, act_key, deterministic=False)
            else:
                proposed = act(policy_params, carry.observation, None, deterministic=True)
            if offset_t is not None:
                proposed = jnp.clip(proposed + offset_t, -1.0, 1.0)
            action, overridden = proposed, jnp.zeros((), bool)
            if constraints is not None:
                plant = proposed if scaler is None else scaler.unscale(proposed)
                safe, report = shield(constraints, carry.observation, plant, previous)
                previous = safe
                action = safe if scaler is None else scaler.scale(safe)
                overridden = report.overridden
            return step(carry, action, overridden, step_key, t, measure, given_t), previous

        previous = jnp.full((dynamics.layout.action_size,), jnp.nan, jnp.float32)
        steps = (
            jnp.arange(rollout.padded),
            jax.random.split(key, rollout.padded),
            None if given is None else _padded_steps(given, rollout.padded),
            None if offsets is None else _padded_steps(offsets, rollout.padded),
        )
        carry, _ = rollout.scan(advance, (rollout.first(start), previous), steps)
        return carry.sums

    def rollouts(policy_params, params, starts, lengths, key, given=None, offsets=None):
        members = jnp.arange(params.n_members)
        keys = _member_start_keys(key, params.n_members, starts.shape[0])
        per_start_axes = tuple(None if x is None else 0 for x in (given, offsets))
        per_start = jax.vmap(one, in_axes=(None, None, None, 0, 0, 0, *per_start_axes))
        per_member = jax.vmap(per_start, in_axes=(None, None, 0, None, None, 0, None, None))
        per_policy = jax.vmap(per_member, in_axes=(0, None, None, None, None, None, None, None))
        return per_policy(policy_params, params, members, starts, lengths, keys, given, offsets)

    return rollouts


def make_logged_replay(
    dynamics: Dynamics, options: ModelRolloutOptions | None = None, **fields: Any
) -> Callable[..., RolloutSums]:
    """The logged operation by the same estimator: ``replay(dynamics_params, starts,
    actions, lengths, key) -> RolloutSums`` with leading axes ``[M, N]``, the logged
    actions ``[N, horizon, action_size]`` (in [-1, 1]) of each start's episode replayed
    open loop in every member (no shield: they were applied). Same keys and options
    (:class:`ModelRolloutOptions`, or its fields as keywords) as :func:`make_policy_rollouts`."""
    rollout = _rollout(dynamics, options or ModelRolloutOptions(**fields))
    no_override = jnp.zeros((), bool)

    def one(params, member, start, actions, length, key):
        step = rollout.stepper(params, member, length)

        def advance(carry, inputs, measure):
            t, action, step_key = inputs
            return step(carry, action, no_override, step_key, t, measure)

        padded = rollout.padded
        steps = (jnp.arange(padded), _padded_steps(actions, padded), jax.random.split(key, padded))
        return rollout.scan(advance, rollout.first(start), steps).sums

    def replay(params, starts, actions, lengths, key):
        members = jnp.arange(params.n_members)
        keys = _member_start_keys(key, params.n_members, starts.shape[0])
        per_start = jax.vmap(one, in_axes=(None, None, 0, 0, 0, 0))
        per_member = jax.vmap(per_start, in_axes=(None, 0, None, None, None, 0))
        return per_member(params, members, starts, actions, lengths, keys)

    return replay


def _padded_steps(values: jax.Array, padded: int) -> jax.Array:
    """``values [T, ...]`` cut or edge-padded to ``padded`` steps."""
    values = values[:padded]
    pad = padded - values.shape[0]
    if pad <= 0:
        return values
    return jnp.pad(values, ((0, pad),) + ((0, 0),) * (values.ndim - 1), mode="edge")


def _member_start_keys(key: jax.Array, n_members: int, n_starts: int) -> jax.Array:
    """``[M, N, 2]`` one key per member and start."""
    return jax.random.split(key, n_members * n_starts).reshape(n_members, n_starts, -1)
