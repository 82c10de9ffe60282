"""The safety shield: a pure function between a policy and the plant.

``shield(constraints, observation, action, prev_action)`` returns the action to apply and
a :class:`SafetyReport`:

1. an action that is finite and keeps every hard constraint passes untouched, bit for bit;
2. otherwise it is projected onto the box that the bounds, rate limits and active state
   limits leave, intersected with the linear half-spaces: the nearest such point, in
   closed form, for one half-space (several are visited in turn a fixed number of times;
   a proposal so far outside the box that float32 cannot place the projection's kinks
   has its box-clipped self projected instead), and used if it keeps every constraint;
3. otherwise (a NaN or infinite action, a projection that fails, or an invalid
   observation) the fallback (previous action, a constant or a named safe controller) is
   moved, priority level by priority level, to keep the highest-priority constraints
   that can be kept (:func:`_prioritized`); the action bounds always hold;
4. if it still breaks a constraint (they contradict each other for this observation) the
   report says ``infeasible``, and ``violated_after`` names what the applied action
   breaks.

Before any of this, the observation is checked against the plant's physical bounds
(``CompiledConstraints.observation_low``/``high``, from the task): a feature with a finite
bound that is outside it or not a number means a broken sensor. Whatever the proposal,
the fallback is then applied (step 3) and the report says ``invalid_observation``: a
state limit whose condition reads the broken sensor counts as on (the unsafe reading), a
linear constraint that reads it cannot be checked and is left out (``violated_after``
reports it, its margin NaN), every other constraint is kept. An observation outside the
range of the data the policy learnt from (``data_low``/``high``) is only flagged
``out_of_distribution``.

Linear margins are lower bounds on the exact slack (see
:mod:`neorl_industrial.core.safety.constraints`): no finite input can make a float32
cancellation pass an action that breaks a linear constraint.

The choice is a ``lax.cond``; under ``vmap`` it becomes a select, so both branches run —
they are a few dozen flops per priority level for plant-sized actions.
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
    _state_active,
    bounds_box,
    box,
    in_data_range,
    join,
    keeps_all,
    linear_readable,
    margin_list,
    observation_valid,
    row_margin,
    split,
)
from neorl_industrial.core.safety.controllers import get_safe_controller

__all__ = [
    "FALLBACK",
    "INFEASIBLE",
    "INVALID",
    "INVALID_OBSERVATION",
    "OUT_OF_DISTRIBUTION",
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
OUT_OF_DISTRIBUTION = 64


@struct.dataclass
class SafetyReport:
    """What the shield saw and did for one action (leading axes for a batch).

    Two arrays travel: ``status``, the decision's flags as bits, and ``margins``, read as
    ``margin``, the proposed action's slack per hard constraint (in ``constraints.names``
    order; negative or NaN: violated), and ``applied_margin``, the same for the applied
    action (NaN for a constraint that reads an invalid sensor and cannot be checked). The
    flags, ``violated`` and ``violated_after`` are read from them:

    * ``overridden``: the applied action differs from the proposed one;
    * ``projected``: the override is the projection of the proposed action;
    * ``fallback``: the override is the fallback;
    * ``invalid``: the proposed action was NaN or infinite;
    * ``infeasible``: the fallback could not keep every constraint it could check; it
      keeps the highest-priority ones that can be kept (``violated_after``: the others);
    * ``invalid_observation``: the observation was outside the plant's physical bounds or
      not a number where bounded; the fallback was applied, whatever the proposal;
    * ``out_of_distribution``: the observation was outside the range of the data the
      policy learnt from (a flag only: the decision is the same);
    * ``violated``: ``[..., n_hard]`` the hard constraints the proposed action broke;
    * ``violated_after``: ``[..., n_hard]`` the hard constraints the applied action
      breaks, or cannot be shown to keep (it reads an invalid sensor).
    """

    status: jax.Array  # [...] int32 bit flags (OVERRIDDEN, PROJECTED, ...)
    # [..., 2, n_hard]: the slack of the proposed action, then of the applied one. One
    # array, not two: every output of a jitted call costs its caller a buffer.
    margins: jax.Array

    @property
    def margin(self) -> jax.Array:
        """``[..., n_hard]`` slack of the proposed action."""
        return self.margins[..., 0, :]

    @property
    def applied_margin(self) -> jax.Array:
        """``[..., n_hard]`` slack of the applied action (NaN: cannot be checked)."""
        return self.margins[..., 1, :]

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
    def out_of_distribution(self) -> jax.Array:
        return self._flag(OUT_OF_DISTRIBUTION)

    @property
    def violated(self) -> jax.Array:
        return ~(self.margin >= -TOLERANCE)

    @property
    def violated_after(self) -> jax.Array:
        return ~(self.applied_margin >= -TOLERANCE)


def _status(
    overridden: jax.Array,
    projected: jax.Array,
    fallback: jax.Array,
    invalid: jax.Array,
    infeasible: jax.Array,
    invalid_observation: jax.Array,
    out_of_distribution: jax.Array,
) -> jax.Array:
    status = jnp.zeros(jnp.shape(overridden), jnp.int32)
    for flag, bit in (
        (overridden, OVERRIDDEN),
        (projected, PROJECTED),
        (fallback, FALLBACK),
        (invalid, INVALID),
        (infeasible, INFEASIBLE),
        (invalid_observation, INVALID_OBSERVATION),
        (out_of_distribution, OUT_OF_DISTRIBUTION),
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
    rows: list[int] | None = None,
    limits: dict[int, jax.Array] | None = None,
) -> Components:
    """``action`` projected onto the box and the linear constraints ``rows`` (default:
    all), each with its right-hand side from ``limits`` (default: the observation's;
    ``+inf`` leaves a row out)."""
    rows = list(range(constraints.n_linear)) if rows is None else rows
    if not rows:
        return [jnp.clip(a, lo, hi) for a, lo, hi in zip(action, low, high, strict=True)]
    if limits is None:
        rhs = _rhs(constraints, observation)
        limits = {row: rhs[row] for row in rows}
    # The first visit starts from the proposal itself: exact for a single half-space.
    normals = {
        row: [constraints.linear_act[row, j] for j in range(constraints.action_size)]
        for row in rows
    }

    def visit(projected: Components) -> Components:
        for row in rows:
            projected = _halfspace_in_box(projected, normals[row], limits[row], low, high)
        return projected

    if len(rows) == 1:
        return visit(list(action))
    # The passes as a loop, not unrolled: the same arithmetic in a fraction of the
    # program, which is what the shield's compile time grows with.
    return jax.lax.fori_loop(0, PROJECTION_PASSES, lambda _, parts: visit(parts), list(action))


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


def _level_box(
    constraints: CompiledConstraints,
    level: int,
    previous: Components,
    active: Components,
) -> tuple[Components, Components] | None:
    """Per action ``(low, high)`` of the rate and state limits of priority ``level``
    (None when it has none). Limits of one level that contradict each other meet
    halfway: the midpoint breaks each by the least."""
    rates = [k for k, p in enumerate(constraints.rate_priority) if p == level]
    states = [k for k, p in enumerate(constraints.state_priority) if p == level]
    if not rates and not states:
        return None
    inf = jnp.float32(jnp.inf)
    low: Components = [-inf] * constraints.action_size
    high: Components = [inf] * constraints.action_size
    for k in rates:
        j = constraints.rate_index[k]
        prev, limit = previous[j], constraints.rate_limit[k]
        known = jnp.isfinite(prev)
        low[j] = jnp.maximum(low[j], jnp.where(known, prev - limit, -inf))
        high[j] = jnp.minimum(high[j], jnp.where(known, prev + limit, inf))
    for k in states:
        j = constraints.state_action[k]
        low[j] = jnp.maximum(low[j], jnp.where(active[k], constraints.state_low[k], -inf))
        high[j] = jnp.minimum(high[j], jnp.where(active[k], constraints.state_high[k], inf))
    touched = {constraints.rate_index[k] for k in rates} | {
        constraints.state_action[k] for k in states
    }
    for j in touched:
        # Empty only when both sides are finite, so the midpoint is a number.
        empty = low[j] > high[j]
        middle = 0.5 * low[j] + 0.5 * high[j]
        low[j], high[j] = jnp.where(empty, middle, low[j]), jnp.where(empty, middle, high[j])
    return low, high


def _prioritized(
    constraints: CompiledConstraints,
    observation: jax.Array,
    start: Components,
    previous: Components,
    usable: Components,
) -> Components:
    """``start`` (the fallback) moved to keep the highest-priority constraints that can
    be kept, level by level (the levels are static; this loop is unrolled at trace time).

    The action bounds always hold. A level's rate and state limits narrow the box left by
    the levels above; where they leave nothing in an action's component, the component
    goes to the point of that box nearest to them (the rate limit's full step towards the
    safe side, say), so a higher level is never given up for a lower one. A level's
    linear constraints (those ``usable``: readable and finite) are added when the
    projection of ``start`` onto everything kept so far keeps them; otherwise the level
    is given up (its box too, if its box alone breaks a kept linear constraint).
    """
    n_linear = constraints.n_linear
    low, high = bounds_box(constraints)
    candidate = [jnp.clip(x, lo, hi) for x, lo, hi in zip(start, low, high, strict=True)]
    active = _state_active(constraints, observation)
    rhs = _rhs(constraints, observation)
    inf = jnp.float32(jnp.inf)
    enabled: Components = [jnp.zeros((), bool)] * n_linear

    def attempt(
        box_low: Components, box_high: Components, on: Components, rows: list[int]
    ) -> tuple[Components, jax.Array]:
        limits = {r: jnp.where(on[r], rhs[r], inf) for r in rows}
        trial = _project(constraints, observation, start, box_low, box_high, rows, limits)
        ok = _all(
            [~on[r] | (row_margin(constraints, r, rhs[r], trial) >= -TOLERANCE) for r in rows]
        )
        return trial, ok

    for level in constraints.levels:
        box = _level_box(constraints, level, previous, active)
        if box is None:
            box_low, box_high = low, high
        else:
            box_low = [jnp.clip(x, lo, hi) for x, lo, hi in zip(box[0], low, high, strict=True)]
            box_high = [jnp.clip(x, lo, hi) for x, lo, hi in zip(box[1], low, high, strict=True)]
        here = [r for r, p in enumerate(constraints.linear_priority) if p == level]
        # Rows that may be kept from this level on (static).
        rows = [r for r, p in enumerate(constraints.linear_priority) if p >= level]
        if not rows:
            low, high = box_low, box_high
            candidate = [jnp.clip(x, lo, hi) for x, lo, hi in zip(start, low, high, strict=True)]
            continue
        on = list(enabled)
        for r in here:
            on[r] = usable[r]
        trial, ok = attempt(box_low, box_high, on, rows)
        keep_box, keep_rows = ok, ok
        if box is not None and here:
            # The level's rows cannot be kept: its box alone, with the rows kept so far.
            alone, alone_ok = attempt(box_low, box_high, enabled, rows)
            trial = [jnp.where(ok, x, y) for x, y in zip(trial, alone, strict=True)]
            keep_box = ok | alone_ok
        low = [jnp.where(keep_box, x, y) for x, y in zip(box_low, low, strict=True)]
        high = [jnp.where(keep_box, x, y) for x, y in zip(box_high, high, strict=True)]
        candidate = [jnp.where(keep_box, x, y) for x, y in zip(trial, candidate, strict=True)]
        enabled = [jnp.where(keep_rows, x, y) for x, y in zip(on, enabled, strict=True)]
    return candidate


@jax.jit
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
    familiar = in_data_range(constraints, observation)
    # Read from the joined margins (one pass), not recomputed per constraint.
    keep = sensible & finite & jnp.all(margins_ >= -TOLERANCE, axis=-1)
    # One item: a branch that runs only when the action needs it. A large batch: one
    # branch for the whole batch (the repair runs only when some row needs it; branch
    # boundaries also keep XLA from recomputing the repair in every consumer). A small
    # batch: every row's repair in one pass, selected (what vmap makes of a cond), which
    # costs less than a branch there.
    large = math.prod(shape) >= BRANCH_MIN_BATCH
    branches = not shape or large

    def broadcast(parts: Components) -> Components:
        return [jnp.broadcast_to(x, shape) for x in parts]

    def override(_):
        low, high = box(constraints, observation, previous)
        fallback = split(fallback_action(constraints, observation, prev_action))
        if constraints.n_linear <= 1:
            projected, projected_ok = exact_projection(fallback, low, high)
        else:
            start = [jnp.where(jnp.isfinite(part), part, 0.0) for part in proposed]
            projected = _project(constraints, observation, start, low, high)
            projected_ok = finite & keeps_all(constraints, observation, projected, previous)
        # A broken sensor: whatever the proposal, the fallback.
        projected_ok = projected_ok & sensible
        needs_fallback = ~keep & ~projected_ok
        readable = linear_readable(constraints, observation)
        rhs = _rhs(constraints, observation)
        usable = [ok & jnp.isfinite(r) for ok, r in zip(readable, rhs, strict=True)]

        def with_fallback(_):
            return broadcast(_prioritized(constraints, observation, fallback, previous, usable))

        def without_fallback(_):
            return broadcast(projected)

        # The prioritized fallback only when some row needs it, whatever the batch: it is
        # rarely needed and costs a projection per priority level.
        chosen = jax.lax.cond(jnp.any(needs_fallback), with_fallback, without_fallback, None)
        safe = broadcast(
            [
                jnp.where(keep, p, jnp.where(projected_ok, r, c))
                for p, r, c in zip(proposed, projected, chosen, strict=True)
            ]
        )
        # The applied action's margins (elementwise, fused with the choice above; margins
        # carried out of the branches would be copied); a constraint that reads an invalid
        # sensor cannot be checked (NaN: reported as broken, but not as infeasible).
        applied = margin_list(constraints, observation, safe, previous)
        offset = constraints.n_hard - constraints.n_linear
        for row, ok in enumerate(readable):
            applied[offset + row] = jnp.where(ok, applied[offset + row], jnp.nan)
        checkable = [jnp.ones((), bool)] * offset + readable
        broken = ~_all([(m >= -TOLERANCE) | ~ok for m, ok in zip(applied, checkable, strict=True)])
        flags = (~keep & finite & projected_ok, ~keep & ~(finite & projected_ok))
        flags += (needs_fallback & broken,)
        return (
            join(safe),
            tuple(jnp.broadcast_to(flag, shape) for flag in flags),
            both_margins(join(broadcast(applied), shape)),
        )

    def both_margins(applied: jax.Array) -> jax.Array:
        """``[..., 2, n_hard]``: the proposal's margins, then ``applied``, in one array."""
        return jnp.stack([margins_, applied], axis=-2)

    def exact_projection(fallback: Components, low: Components, high: Components):
        # With at most one linear constraint the projection is exact: it fails only when
        # no action keeps the constraints, and then the fallback cannot either. So one
        # projection serves both: of the proposal, or of the fallback in place of a NaN
        # or infinite proposal.
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

        return jax.lax.cond(jnp.any(retry), clipped_again, as_is, None)

    def untouched(_):
        false = jnp.zeros(shape, bool)
        return action, (false, false, false), both_margins(margins_)

    if branches:
        safe, (projected, used_fallback, infeasible), applied = jax.lax.cond(
            jnp.all(keep), untouched, override, None
        )
    else:
        safe, (projected, used_fallback, infeasible), applied = override(None)
    report = SafetyReport(
        status=jnp.broadcast_to(
            _status(~keep, projected, used_fallback, ~finite, infeasible, ~sensible, ~familiar),
            shape,
        ),
        margins=applied,
    )
    return safe, report
