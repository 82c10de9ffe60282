"""The safety shield: a pure function between a policy and the plant.

``shield(constraints, observation, action, prev_action)`` returns the action to apply and
a :class:`SafetyReport`:

1. an action that is finite and keeps every hard constraint passes untouched, bit for bit;
2. otherwise it is projected onto the box that the bounds, rate limits and active state
   limits leave, intersected with the linear half-spaces: the nearest such point, in
   closed form, for one half-space (several are visited in turn a fixed number of times;
   a proposal so far outside the box that float32 cannot place the projection's kinks
   has its box-clipped self projected instead), and used if it keeps every constraint;
3. otherwise (a NaN or infinite action, or a projection that fails) the fallback (previous
   action, a constant or a named safe controller) is projected the same way and used;
4. if even that breaks a constraint, the constraints contradict each other for this
   observation: the report says ``infeasible`` and the fallback, clipped into the action
   bounds alone, is returned.

Before any of this, the observation is checked against the plant's physical bounds
(``CompiledConstraints.observation_low``/``high``, from the task): a feature with a finite
bound that is outside it or not a number means a broken sensor, and every constraint
that reads the observation means nothing. Whatever the proposal, the fallback is then
applied, clipped into what does not depend on the observation (the action bounds and
rate limits), and the report says ``invalid_observation`` (its margins, computed from
the bad reading, may be NaN or infinite).

Linear margins are lower bounds on the exact slack (see
:mod:`neorl_industrial.core.safety.constraints`): no finite input can make a float32
cancellation pass an action that breaks a linear constraint.

The choice is a ``lax.cond``; under ``vmap`` it becomes a select, so both branches run —
they are a few dozen flops for plant-sized actions.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct

from neorl_industrial.core.safety.constraints import (
    TOLERANCE,
    CompiledConstraints,
    Components,
    _all,
    _rhs,
    bounds_box,
    box,
    join,
    keeps_all,
    margin_list,
    observation_valid,
    rate_box,
    split,
)
from neorl_industrial.core.safety.controllers import get_safe_controller

__all__ = [
    "FALLBACK",
    "INFEASIBLE",
    "INVALID",
    "INVALID_OBSERVATION",
    "OVERRIDDEN",
    "PROJECTED",
    "PROJECTION_PASSES",
    "SafetyReport",
    "fallback_action",
    "project",
    "shield",
]

# Visits of every linear half-space in the projection (one is exact for one half-space).
PROJECTION_PASSES = 3
# From this many rows on, a batch branches on whether any row needs a repair.
BRANCH_MIN_BATCH = 64


# Bits of ``SafetyReport.status``.
OVERRIDDEN, PROJECTED, FALLBACK, INVALID, INFEASIBLE = 1, 2, 4, 8, 16
INVALID_OBSERVATION = 32


@struct.dataclass
class SafetyReport:
    """What the shield saw and did for one action (leading axes for a batch).

    Two arrays travel: ``status``, the decision's flags as bits, and ``margin``, the
    proposed action's slack per hard constraint (in ``constraints.names`` order; negative
    or NaN: violated). The flags and ``violated`` are read from them:

    * ``overridden``: the applied action differs from the proposed one;
    * ``projected``: the override is the projection of the proposed action;
    * ``fallback``: the override is the fallback;
    * ``invalid``: the proposed action was NaN or infinite;
    * ``infeasible``: no action kept every constraint (the fallback was clipped into the
      action bounds);
    * ``invalid_observation``: the observation was outside the plant's physical bounds or
      not a number where bounded; the fallback was applied, whatever the proposal;
    * ``violated``: ``[..., n_hard]`` the hard constraints the proposed action broke.
    """

    status: jax.Array  # [...] int32 bit flags (OVERRIDDEN, PROJECTED, ...)
    margin: jax.Array  # [..., n_hard] slack of the proposed action

    def _flag(self, bit: int) -> jax.Array:
        return (self.status & bit) != 0

    @property
    def overridden(self) -> jax.Array:
        return self._flag(OVERRIDDEN)

    @property
    def projected(self) -> jax.Array:
        return self._flag(PROJECTED)

    @property
    def fallback(self) -> jax.Array:
        return self._flag(FALLBACK)

    @property
    def invalid(self) -> jax.Array:
        return self._flag(INVALID)

    @property
    def infeasible(self) -> jax.Array:
        return self._flag(INFEASIBLE)

    @property
    def invalid_observation(self) -> jax.Array:
        return self._flag(INVALID_OBSERVATION)

    @property
    def violated(self) -> jax.Array:
        return ~(self.margin >= -TOLERANCE)


def _status(
    overridden: jax.Array,
    projected: jax.Array,
    fallback: jax.Array,
    invalid: jax.Array,
    infeasible: jax.Array,
    invalid_observation: jax.Array,
) -> jax.Array:
    status = jnp.zeros(jnp.shape(overridden), jnp.int32)
    for flag, bit in (
        (overridden, OVERRIDDEN),
        (projected, PROJECTED),
        (fallback, FALLBACK),
        (invalid, INVALID),
        (infeasible, INFEASIBLE),
        (invalid_observation, INVALID_OBSERVATION),
    ):
        status = status | jnp.where(flag, bit, 0)
    return status


def _halfspace_in_box(
    action: Components, normal: Components, rhs: jax.Array, low: Components, high: Components
) -> Components:
    """Euclidean projection of ``action`` onto ``{a in [low, high] : normal · a <= rhs}``,
    on components.

    The projection is ``clip(action - λ normal, low, high)`` for the smallest ``λ >= 0``
    that meets the half-space. ``g(λ) = normal · clip(...)`` is piecewise linear and
    non-increasing, with a kink wherever a component reaches a bound, so ``λ`` is found
    exactly: ``g`` at every kink, the last kink outside and the first inside the
    half-space, and linear interpolation between them (no sort, no loop). Without a
    crossing (the half-space misses the box) the box's point nearest to it is returned
    and the caller's check decides.
    """
    n = len(action)
    a, c, lo, hi = action, normal, low, high

    def point(lam: jax.Array) -> Components:
        return [jnp.clip(a[i] - lam * c[i], lo[i], hi[i]) for i in range(n)]

    def value(components: Components) -> jax.Array:
        total = jnp.zeros((), jnp.float32)
        for i in range(n):
            total = total + c[i] * components[i]
        return total

    # A component reaches a bound where ``action - λ normal`` crosses it: two kinks per
    # component (one when the action starts inside the box), plus λ = 0. Multiplying by
    # the reciprocal of the (per-constraint) coefficient keeps the per-row work free of
    # divisions, which XLA would not fuse into the rest.
    lams = [jnp.zeros((), jnp.float32)]
    for i in range(n):
        moves = c[i] != 0.0
        inverse = 1.0 / jnp.where(moves, c[i], 1.0)
        for bound in (lo[i], hi[i]):
            kink = (a[i] - bound) * inverse
            lams.append(jnp.where(moves & jnp.isfinite(kink) & (kink > 0.0), kink, 0.0))
    values = [value(point(lam)) for lam in lams]

    inf = jnp.float32(jnp.inf)
    lam_in, g_in, lam_out, g_out = inf, -inf, -inf, inf
    last, g_last = lams[0], values[0]
    any_inside, all_inside = jnp.zeros((), bool), jnp.ones((), bool)
    for lam, g in zip(lams, values, strict=True):
        inside = g <= rhs
        lam_in = jnp.where(inside, jnp.minimum(lam_in, lam), lam_in)
        g_in = jnp.where(inside, jnp.maximum(g_in, g), g_in)
        lam_out = jnp.where(inside, lam_out, jnp.maximum(lam_out, lam))
        g_out = jnp.where(inside, g_out, jnp.minimum(g_out, g))
        last, g_last = jnp.maximum(last, lam), jnp.minimum(g_last, g)
        any_inside, all_inside = any_inside | inside, all_inside & inside
    # Past the last kink only components with an open side keep moving: g falls with
    # slope -sum(normal_i^2) over them.
    slope = jnp.zeros((), jnp.float32)
    for i in range(n):
        moved = a[i] - last * c[i]
        free = (moved > lo[i]) & (moved < hi[i]) & (c[i] != 0.0)
        slope = slope + jnp.where(free, jnp.square(c[i]), 0.0)

    # One division per row: interpolation on the crossing segment, or extrapolation past
    # the last kink.
    crossing = any_inside & ~all_inside
    extend = ~any_inside & (slope > 0.0)
    start = jnp.where(crossing, lam_out, last)
    numerator = jnp.where(crossing, (g_out - rhs) * (lam_in - lam_out), g_last - rhs)
    denominator = jnp.where(crossing, g_out - g_in, slope)
    step = numerator / jnp.where(denominator > 0.0, denominator, 1.0)
    step = jnp.where(crossing, jnp.clip(step, 0.0, lam_in - lam_out), step)
    # A half-space that misses the box: its nearest corner, which the check accepts when
    # the miss is within the tolerance (a plane through a face of the box, once the
    # margin's rounding allowance has moved it outwards by a hair).
    lam = jnp.where(crossing | extend, start + step, jnp.where(any_inside, 0.0, last))
    # A relative nudge keeps the rounding of the interpolation on the inner side of the
    # plane; the shield's check catches anything else.
    lam = jnp.where(lam > 0.0, lam * (1.0 + 1e-6) + 1e-7, lam)
    return point(lam)


def _project(
    constraints: CompiledConstraints,
    observation: jax.Array,
    action: Components,
    low: Components,
    high: Components,
) -> Components:
    n_linear = constraints.n_linear
    if n_linear == 0:
        return [jnp.clip(a, lo, hi) for a, lo, hi in zip(action, low, high, strict=True)]
    rhs = _rhs(constraints, observation)
    # The first visit starts from the proposal itself: exact for a single half-space.
    projected = action
    passes = 1 if n_linear == 1 else PROJECTION_PASSES
    for _ in range(passes):
        for row in range(n_linear):
            normal = [constraints.linear_act[row, j] for j in range(constraints.action_size)]
            projected = _halfspace_in_box(projected, normal, rhs[row], low, high)
    return projected


def project(
    constraints: CompiledConstraints,
    observation: jax.Array,
    action: jax.Array,
    low: jax.Array,
    high: jax.Array,
) -> jax.Array:
    """``action`` clipped into ``[low, high]`` and projected onto the linear constraints
    (exactly for one; visiting each in turn ``PROJECTION_PASSES`` times for several)."""
    observation, action = jnp.asarray(observation, jnp.float32), jnp.asarray(action, jnp.float32)
    shape = jnp.broadcast_shapes(observation.shape[:-1], action.shape[:-1], low.shape[:-1])
    parts = _project(constraints, observation, split(action), split(low), split(high))
    return join([jnp.broadcast_to(part, shape) for part in parts])


def fallback_action(
    constraints: CompiledConstraints, observation: jax.Array, prev_action: jax.Array
) -> jax.Array:
    """The fallback before projection: previous action, constant or safe controller."""
    prev_action = jnp.asarray(prev_action, jnp.float32)
    if constraints.fallback_kind == "constant":
        return jnp.broadcast_to(constraints.fallback_value, prev_action.shape)
    if constraints.fallback_kind == "controller":
        controller = get_safe_controller(constraints.controller)
        if prev_action.ndim == 1:
            action = controller(observation, prev_action, constraints)
        else:
            flat_obs = jnp.reshape(observation, (-1, observation.shape[-1]))
            flat_prev = jnp.reshape(prev_action, (-1, prev_action.shape[-1]))
            action = jax.vmap(controller, in_axes=(0, 0, None))(flat_obs, flat_prev, constraints)
        action = jnp.reshape(jnp.asarray(action, jnp.float32), prev_action.shape)
        return jnp.where(jnp.isfinite(action), action, 0.0)
    return jnp.where(jnp.isfinite(prev_action), prev_action, 0.0)


def shield(
    constraints: CompiledConstraints,
    observation: jax.Array,
    action: jax.Array,
    prev_action: jax.Array,
) -> tuple[jax.Array, SafetyReport]:
    """The action to apply, and what the shield did.

    Works on one item or a batch (any leading axes, the same on all three inputs). For
    one item the repair is a ``lax.cond`` branch that runs only when the action needs
    it; for a batch it is what ``vmap`` makes of that ``cond``, a select: every row's
    repair is computed in one fused elementwise pass (cheaper on a batch than a branch),
    and rows that keep every constraint are returned untouched, bit for bit.

    Args:
        constraints: compiled by :meth:`ConstraintSpec.compile`.
        observation: ``[..., obs_size]`` the observation the action responds to.
        action: ``[..., action_size]`` the policy's proposal (may be NaN or infinite).
        prev_action: ``[..., action_size]`` the action applied at the previous step (for
            rate limits and the hold-previous fallback; zeros at the start of an episode).

    Returns:
        ``(safe_action, report)``.
    """
    observation = jnp.asarray(observation, jnp.float32)
    action = jnp.asarray(action, jnp.float32)
    prev_action = jnp.asarray(prev_action, jnp.float32)
    if action.shape[-1:] != (constraints.action_size,) or prev_action.shape != action.shape:
        raise ValueError(
            f"action and prev_action: expected [..., {constraints.action_size}] of the same "
            f"shape, got {action.shape} and {prev_action.shape}"
        )
    if observation.shape[:-1] != action.shape[:-1]:
        raise ValueError(
            f"observation: expected the batch shape {action.shape[:-1]} of the actions, "
            f"got {observation.shape[:-1]}"
        )
    return _decide(constraints, observation, action, prev_action)


def _decide(
    constraints: CompiledConstraints,
    observation: jax.Array,
    action: jax.Array,
    prev_action: jax.Array,
) -> tuple[jax.Array, SafetyReport]:
    """The shield on components: every operation is elementwise over the batch."""
    shape = action.shape[:-1]
    proposed, previous = split(action), split(prev_action)
    margin = margin_list(constraints, observation, proposed, previous)
    margins_ = join([jnp.broadcast_to(m, shape) for m in margin], shape)
    finite = _all([jnp.isfinite(part) for part in proposed])
    sensible = observation_valid(constraints, observation)
    # Read from the joined margins (one pass), not recomputed per constraint.
    keep = sensible & finite & jnp.all(margins_ >= -TOLERANCE, axis=-1)

    def override(_):
        safe, (projected, used_fallback, infeasible) = repair()
        # A broken sensor: the fallback within what does not depend on the observation.
        low, high = box_without_observation()
        fallback = split(fallback_action(constraints, observation, prev_action))
        sensor_safe = [jnp.clip(x, lo, hi) for x, lo, hi in zip(fallback, low, high, strict=True)]
        safe = join(
            [
                jnp.broadcast_to(jnp.where(sensible, part, alternative), shape)
                for part, alternative in zip(split(safe), sensor_safe, strict=True)
            ]
        )
        return safe, (projected & sensible, used_fallback | ~sensible, infeasible & sensible)

    def box_without_observation() -> tuple[Components, Components]:
        # Rate limits that leave the action bounds give way to them (physical limits).
        low, high = rate_box(constraints, previous)
        bound_low, bound_high = bounds_box(constraints)
        return [
            [jnp.clip(x, lo, hi) for x, lo, hi in zip(side, bound_low, bound_high, strict=True)]
            for side in (low, high)
        ]

    def repair():
        low, high = box(constraints, observation, previous)
        if constraints.n_linear <= 1:
            return exact_override(low, high)
        start = [jnp.where(jnp.isfinite(part), part, 0.0) for part in proposed]
        projected = _project(constraints, observation, start, low, high)
        projected_ok = finite & keeps_all(constraints, observation, projected, previous)

        def with_fallback(_):
            fallback = split(fallback_action(constraints, observation, prev_action))
            repaired = _project(constraints, observation, fallback, low, high)
            fallback_ok = keeps_all(constraints, observation, repaired, previous)
            # With contradicting constraints only the action bounds are kept.
            bound_low, bound_high = bounds_box(constraints)
            chosen = [
                jnp.where(
                    fallback_ok, repaired[j], jnp.clip(fallback[j], bound_low[j], bound_high[j])
                )
                for j in range(constraints.action_size)
            ]
            return [jnp.broadcast_to(x, shape) for x in chosen], jnp.broadcast_to(
                fallback_ok, shape
            )

        def without_fallback(_):
            return [jnp.broadcast_to(x, shape) for x in projected], jnp.ones(shape, bool)

        needs_fallback = ~keep & ~projected_ok
        if large:
            # The fallback only when some row of the batch needs it.
            chosen, fallback_ok = jax.lax.cond(
                jnp.any(needs_fallback), with_fallback, without_fallback, None
            )
        else:
            chosen, fallback_ok = with_fallback(None)
        safe = [
            jnp.broadcast_to(
                jnp.where(keep, proposed[j], jnp.where(projected_ok, projected[j], chosen[j])),
                shape,
            )
            for j in range(constraints.action_size)
        ]
        flags = (~keep & projected_ok, needs_fallback, needs_fallback & ~fallback_ok)
        return join(safe), tuple(jnp.broadcast_to(flag, shape) for flag in flags)

    def exact_override(low: Components, high: Components):
        # With at most one linear constraint the projection is exact: it fails only when
        # no action keeps the constraints, and then the fallback cannot either. So one
        # projection serves both: of the proposal, or of the fallback in place of a NaN
        # or infinite proposal.
        fallback = split(fallback_action(constraints, observation, prev_action))
        start = [jnp.where(finite, p, f) for p, f in zip(proposed, fallback, strict=True)]
        projected = _project(constraints, observation, start, low, high)
        projected_ok = keeps_all(constraints, observation, projected, previous)
        # Far outside the box (|a| ~ 1e7 against a box of width 2) float32 cannot place
        # the kinks of the exact projection; the box-clipped proposal is well conditioned
        # and is projected instead, only when some row needs it.
        retry = ~keep & ~projected_ok

        def clipped_again(_):
            clipped = [jnp.clip(x, lo, hi) for x, lo, hi in zip(start, low, high, strict=True)]
            again = _project(constraints, observation, clipped, low, high)
            again_ok = retry & keeps_all(constraints, observation, again, previous)
            return (
                [jnp.where(again_ok, x, y) for x, y in zip(again, projected, strict=True)],
                projected_ok | again_ok,
            )

        def as_is(_):
            return projected, projected_ok

        projected, projected_ok = jax.lax.cond(jnp.any(retry), clipped_again, as_is, None)
        bound_low, bound_high = bounds_box(constraints)
        safe = [
            jnp.broadcast_to(
                jnp.where(
                    keep,
                    proposed[j],
                    jnp.where(
                        projected_ok,
                        projected[j],
                        jnp.clip(fallback[j], bound_low[j], bound_high[j]),
                    ),
                ),
                shape,
            )
            for j in range(constraints.action_size)
        ]
        flags = (
            ~keep & finite & projected_ok,
            ~keep & ~(finite & projected_ok),
            ~keep & ~projected_ok,
        )
        return join(safe), tuple(jnp.broadcast_to(flag, shape) for flag in flags)

    def untouched(_):
        false = jnp.zeros(shape, bool)
        return action, (false, false, false)

    # One item: a branch that runs only when the action needs it. A large batch: one
    # branch for the whole batch (the repair runs only when some row needs it; branch
    # boundaries also keep XLA from recomputing the repair in every consumer). A small
    # batch: every row's repair in one pass, selected (what vmap makes of a cond), which
    # costs less than a branch there.
    large = math.prod(shape) >= BRANCH_MIN_BATCH
    if not shape or large:
        safe, (projected, used_fallback, infeasible) = jax.lax.cond(
            jnp.all(keep), untouched, override, None
        )
    else:
        safe, (projected, used_fallback, infeasible) = override(None)
    report = SafetyReport(
        status=jnp.broadcast_to(
            _status(~keep, projected, used_fallback, ~finite, infeasible, ~sensible), shape
        ),
        margin=margins_,
    )
    return safe, report
