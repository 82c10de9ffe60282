"""The safety shield: a pure function between a policy and the plant.

``shield(constraints, observation, action, prev_action)`` returns the action to apply and
a :class:`SafetyReport`:

1. an action that is finite and keeps every hard constraint passes untouched, bit for bit;
2. otherwise the nearest action that keeps every hard constraint is applied: the exact
   projection (:mod:`neorl_industrial.core.safety.projection`, a dual active-set solve)
   of the proposal onto the box that the bounds, rate limits and active state limits
   leave, intersected with the linear half-spaces, distances measured in each action's
   range (the span of its bounds) and each rule normalised, so a rule written 100 times
   larger gives the same action; a NaN or infinite proposal has the fallback (previous
   action, a constant or a named safe controller) projected in its place. The projection
   aims inside each linear constraint by its margin's rounding allowance (see
   :mod:`neorl_industrial.core.safety.constraints`), so the point it returns passes the
   conservative check in plant units as in unit ones;
3. the projection fails only when no action keeps every constraint (or for a broken
   sensor): then the fallback is projected, priority level by priority level, onto the
   highest-priority constraints that can be kept together (:func:`_prioritized`); the
   action bounds always hold;
4. if the applied action still breaks a constraint it can check (the constraints
   contradict each other for this observation) the report says ``infeasible``, and
   ``violated_after`` names what it breaks.

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

The choice is a ``lax.cond``; under ``vmap`` it becomes a select, so both branches run.
A projection is a ``lax.while_loop`` of a few steps (one per rule it meets, plus one per
bound it lets go); a batch runs until its slowest row is done.
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
    _row_rounding,
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
from neorl_industrial.core.safety.projection import nearest

__all__ = [
    "FALLBACK",
    "INFEASIBLE",
    "INVALID",
    "INVALID_OBSERVATION",
    "OUT_OF_DISTRIBUTION",
    "OVERRIDDEN",
    "PROJECTED",
    "SafetyReport",
    "fallback_action",
    "project",
    "shield",
]

# The smallest batch of an exported artifact's second serving function (the layout
# keeps two; both branch on whether any row needs a repair).
BRANCH_MIN_BATCH = 64


# Bits of ``SafetyReport.status``.
OVERRIDDEN, PROJECTED, FALLBACK, INVALID, INFEASIBLE = 1, 2, 4, 8, 16
INVALID_OBSERVATION = 32
OUT_OF_DISTRIBUTION = 64


def _flag(bit: int) -> property:
    """A :class:`SafetyReport` property: ``[...]`` whether ``bit`` is set in ``status``."""

    def read(report: SafetyReport) -> jax.Array:
        return (report.status & bit) != 0

    return property(read)


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

    overridden = _flag(OVERRIDDEN)
    projected = _flag(PROJECTED)
    fallback = _flag(FALLBACK)
    invalid = _flag(INVALID)
    infeasible = _flag(INFEASIBLE)
    invalid_observation = _flag(INVALID_OBSERVATION)
    out_of_distribution = _flag(OUT_OF_DISTRIBUTION)

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


def _widths(constraints: CompiledConstraints) -> jax.Array:
    """``[action_size]``: each action's range (the span of its bounds; 1 without two
    finite bounds): the scale in which the shield measures distances."""
    low, high = bounds_box(constraints)
    widths = []
    for lo, hi in zip(low, high, strict=True):
        span = jnp.asarray(hi - lo, jnp.float32)
        widths.append(jnp.where(jnp.isfinite(span) & (span > 0.0), span, 1.0))
    return jnp.stack(widths)


def _nearest(
    constraints: CompiledConstraints,
    start: Components,
    low: Components,
    high: Components,
    limits: Components,
    shape: tuple[int, ...],
    active: jax.Array | None = None,
) -> tuple[Components, jax.Array]:
    """The action in the box ``[low, high]`` that keeps every linear constraint with a
    finite right-hand side in ``limits`` (``+inf``: left out) and is nearest to ``start``
    (finite), measured in the actions' ranges; and whether there is one.

    Exact (:func:`neorl_industrial.core.safety.projection.nearest`), aimed inside each
    constraint by its margin's rounding allowance, so the margin of the point returned
    is not negative however large the constraint's numbers. Rows not ``active`` (default:
    all are) take no step of the solver and their result means nothing.
    """
    n, m = constraints.action_size, constraints.n_linear
    if m == 0:
        clipped = [jnp.clip(x, lo, hi) for x, lo, hi in zip(start, low, high, strict=True)]
        found = _all([lo <= hi for lo, hi in zip(low, high, strict=True)])
        return broadcast_parts(clipped, shape), jnp.broadcast_to(found, shape)
    rows = math.prod(shape)

    def flat(parts: Components) -> jax.Array:
        return jnp.reshape(join(broadcast_parts(parts, shape), shape), (rows, len(parts)))

    x0, lo, hi, rhs = flat(start), flat(low), flat(high), flat(limits)
    # The most any action's term can weigh in the margin's rounding allowance: the box's
    # farthest bound (the start where a side is open).
    closed = jnp.isfinite(lo) & jnp.isfinite(hi)
    reach = jnp.maximum(
        jnp.where(jnp.isfinite(lo), jnp.abs(lo), 0.0), jnp.where(jnp.isfinite(hi), jnp.abs(hi), 0.0)
    )
    reach = jnp.where(closed, reach, jnp.maximum(reach, jnp.abs(x0)))
    rounding = jnp.asarray([_row_rounding(constraints, row) for row in range(m)], jnp.float32)
    allowance = rounding[None, :] * (reach @ jnp.abs(constraints.linear_act).T)
    x, found, _ = nearest(x0, lo, hi, constraints.linear_act, rhs, _widths(constraints), allowance)
    x = jnp.reshape(x, (*shape, n))
    return split(x), jnp.reshape(found, shape)


def broadcast_parts(parts: Components, shape: tuple[int, ...]) -> Components:
    """Every component broadcast to the batch ``shape``."""
    return [jnp.broadcast_to(x, shape) for x in parts]


def project(
    constraints: CompiledConstraints,
    observation: jax.Array,
    action: jax.Array,
    low: jax.Array,
    high: jax.Array,
) -> jax.Array:
    """The action in ``[low, high]`` that keeps every linear constraint and is nearest to
    ``action`` (finite), measured in the actions' ranges: exact, and aimed inside each
    constraint by its margin's rounding allowance. Where nothing keeps them, the
    method's last point in the box (the shield checks every result)."""
    observation, action = jnp.asarray(observation, jnp.float32), jnp.asarray(action, jnp.float32)
    low, high = jnp.asarray(low, jnp.float32), jnp.asarray(high, jnp.float32)
    shape = jnp.broadcast_shapes(observation.shape[:-1], action.shape[:-1], low.shape[:-1])
    shape = jnp.broadcast_shapes(shape, high.shape[:-1])
    limits = _rhs(constraints, observation)
    limits = [jnp.where(jnp.isfinite(r), r, jnp.inf) for r in limits]
    parts, _ = _nearest(constraints, split(action), split(low), split(high), limits, shape)
    return join(parts, shape)


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


def shield_check(
    constraints: CompiledConstraints,
    observation: jax.Array,
    action: jax.Array,
    prev_action: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """What :func:`shield` returns when every row keeps every constraint, without its
    repair: ``(kept, status, margins)``, ``kept`` one boolean for the whole batch.

    Where ``kept`` is true, :func:`shield` applies ``action`` untouched with exactly this
    ``status`` and these ``margins`` (its report's, the proposal's twice); where it is
    false they say nothing and the shield itself must decide. The same computation as
    the shield's before its branch (one function serves both), for a caller that serves
    the common case from a program without the repair (XLA:CPU pays for a branch's
    reductions on every call, taken or not).
    """
    assessment = _assess(constraints, observation, action, prev_action)
    false = jnp.zeros(assessment.shape, bool)
    status = assessment.status(false, false, false)
    return jnp.all(assessment.keep), status, assessment.both_margins(assessment.margins)


@struct.dataclass
class _Assessment:
    """The shield's reading of a batch before it decides (see :func:`_assess`)."""

    shape: tuple[int, ...] = struct.field(pytree_node=False)
    proposed: Components
    previous: Components
    margins: jax.Array  # [..., n_hard] the proposal's
    finite: jax.Array
    sensible: jax.Array
    familiar: jax.Array
    keep: jax.Array  # the row keeps every constraint as it is

    def both_margins(self, applied: jax.Array) -> jax.Array:
        """``[..., 2, n_hard]``: the proposal's margins, then ``applied``, in one array."""
        return jnp.stack([self.margins, applied], axis=-2)

    def status(
        self, projected: jax.Array, used_fallback: jax.Array, infeasible: jax.Array
    ) -> jax.Array:
        """The status bits of the decision, given what the repair did."""
        return jnp.broadcast_to(
            _status(
                ~self.keep,
                projected,
                used_fallback,
                ~self.finite,
                infeasible,
                ~self.sensible,
                ~self.familiar,
            ),
            self.shape,
        )


def _assess(
    constraints: CompiledConstraints,
    observation: jax.Array,
    action: jax.Array,
    prev_action: jax.Array,
) -> _Assessment:
    shape = action.shape[:-1]
    proposed, previous = split(action), split(prev_action)
    margin = margin_list(constraints, observation, proposed, previous)
    margins = join([jnp.broadcast_to(m, shape) for m in margin], shape)
    finite = _all([jnp.isfinite(part) for part in proposed])
    sensible = observation_valid(constraints, observation)
    # Read from the joined margins (one pass), not recomputed per constraint.
    keep = sensible & finite & jnp.all(margins >= -TOLERANCE, axis=-1)
    return _Assessment(
        shape=shape,
        proposed=proposed,
        previous=previous,
        margins=margins,
        finite=finite,
        sensible=sensible,
        familiar=in_data_range(constraints, observation),
        keep=keep,
    )


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
    shape: tuple[int, ...],
    active: jax.Array,
) -> Components:
    """``start`` (the fallback) moved to keep the highest-priority constraints that can
    be kept, level by level (the levels are static; this loop is unrolled at trace time).

    The action bounds always hold. A level's rate and state limits narrow the box left by
    the levels above; where they leave nothing in an action's component, the component
    goes to the point of that box nearest to them (the rate limit's full step towards the
    safe side, say), so a higher level is never given up for a lower one. A level's
    linear constraints (those ``usable``: readable and finite) are added when the exact
    projection of ``start`` onto everything kept so far and them exists (some action
    keeps them all); otherwise the level's linear constraints are given up (and its box
    too, if its box alone leaves nothing with the linear constraints kept so far). The
    result is the projection of ``start`` onto every constraint kept.
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
        limits = [jnp.where(on[r], rhs[r], inf) if r in rows else inf for r in range(n_linear)]
        trial, found = _nearest(constraints, start, box_low, box_high, limits, shape, active)
        ok = found & _all(
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
    assessment = _assess(constraints, observation, action, prev_action)
    shape, proposed, previous = assessment.shape, assessment.proposed, assessment.previous
    finite, sensible, keep = assessment.finite, assessment.sensible, assessment.keep
    # One item or a batch: one branch, so the repair (an exact projection per priority
    # level tried) runs only when some row needs it; branch boundaries also keep XLA from
    # recomputing the repair in every consumer. (Under vmap the branch is a select: every
    # row's repair is computed. A served batch of one row kept 260 us per call that way
    # against 140 us with the branch.)

    def broadcast(parts: Components) -> Components:
        return [jnp.broadcast_to(x, shape) for x in parts]

    def override(_):
        low, high = box(constraints, observation, previous)
        fallback = split(fallback_action(constraints, observation, prev_action))
        readable = linear_readable(constraints, observation)
        rhs = _rhs(constraints, observation)
        usable = [ok & jnp.isfinite(r) for ok, r in zip(readable, rhs, strict=True)]
        # The nearest action that keeps every rule: of the proposal, or of the fallback in
        # place of a NaN or infinite one. The projection is exact, so it fails only when
        # no action keeps the rules, and then the fallback cannot either.
        start = [jnp.where(finite, p, f) for p, f in zip(proposed, fallback, strict=True)]
        limits = [jnp.where(ok, r, jnp.inf) for ok, r in zip(usable, rhs, strict=True)]
        projected, found = _nearest(constraints, start, low, high, limits, shape, ~keep)
        # A broken sensor: whatever the proposal, the fallback.
        projected_ok = found & sensible & keeps_all(constraints, observation, projected, previous)
        needs_fallback = ~keep & ~projected_ok

        def with_fallback(_):
            return broadcast(
                _prioritized(
                    constraints, observation, fallback, previous, usable, shape, needs_fallback
                )
            )

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

    both_margins = assessment.both_margins

    def untouched(_):
        false = jnp.zeros(shape, bool)
        return action, (false, false, false), both_margins(assessment.margins)

    safe, (projected, used_fallback, infeasible), applied = jax.lax.cond(
        jnp.all(keep), untouched, override, None
    )
    report = SafetyReport(
        status=assessment.status(projected, used_fallback, infeasible), margins=applied
    )
    return safe, report
