"""The exact projection: the nearest action in a box that keeps a few linear rules.

``nearest(start, low, high, normals, rhs, width)`` solves, for one row,

    minimise   Σ_j ((x_j - start_j) / width_j)^2
    subject to low <= x <= high,   normals · x <= rhs  (rows with rhs = +inf are off)

with the dual active-set method of Goldfarb and Idnani, written for this structure. The
distance is measured in each action's own range (``width``: the span of its bounds), so
a valve in % and a pump in m³/h weigh alike, and each rule's row is normalised to unit
length in that scale, so multiplying a rule by 100 changes nothing.

The method. It starts at the unconstrained minimum (``start``) with the bounds it breaks
in its working set (the box's nearest point: optimal and dual feasible for that set, as
the bounds' normals are orthogonal), and repeats: pick the most violated constraint
``p`` (a bound of one action, or a rule); move the point along the direction that
reduces ``p``'s violation while keeping every working constraint at equality, and raise
``p``'s multiplier, until either ``p`` holds (a *full step*: ``p`` joins the working
set) or the multiplier of a working constraint reaches zero (a *partial step*: that
constraint leaves, and ``p`` is pursued again). If ``p``'s normal lies in the span of
the working normals and no working multiplier can shrink, no point keeps them all: the
problem is *infeasible* (the dual is unbounded). A working set of bounds fixes those
actions at their bounds; the rest is a system as large as the working rules (a handful),
solved by elimination.

How many steps. Every full step strictly increases the dual objective, so no working set
recurs and the method ends (Goldfarb and Idnani, 1983); the working normals stay linearly
independent, so at most ``n`` partial steps separate two full steps. That bound is
finite but combinatorial, not a useful cap, so the ``lax.while_loop`` is capped at
:func:`iteration_cap` steps, four entries and exits per constraint: measured on random
problems (``docs/constraints.md``), every solvable row ends far below it; rows that
reach it were all unsolvable ones. A row that reaches the cap is reported as not solved
and the caller's check treats it as such: nothing unchecked is applied.

At the end the working rules' residuals (the rounding the steps accumulated) are removed
by the smallest move of the free actions, the working bounds are set to their values,
and the point is clipped into the box: the bounds hold exactly.

Everything is float32 elementwise work, small reductions and one while loop:
it runs under ``jit`` and ``vmap`` (a batch runs until its slowest row is done; finished
rows stay as they are) and is written out as an ONNX ``Loop``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

__all__ = ["iteration_cap", "nearest", "violation_tolerance"]

# A violation below this many units of the problem's scale (in the normalised coordinates)
# counts as kept: float32 rounding of a few operations on numbers of that scale.
_RELATIVE_TOLERANCE = 2.0**-21
# A direction shorter than this (squared, for unit normals) means the violated constraint
# depends on the working ones.
_DEPENDENT = 1e-6


def _first_of(values: jax.Array, best: jax.Array) -> jax.Array:
    """``[k]`` bool: true at the first entry of a vector equal to ``best`` (its maximum or
    minimum), where ``argmax`` (``argmin``) would point; at the first NaN if ``best`` is
    NaN (a NaN entry makes the maximum NaN).

    Not ``argmax``: it is a reduction over two operands, and each reduction of a program
    (taken or not: the repair is a branch a served row that meets every rule skips) costs
    the XLA:CPU runtime its reducer's buffers at every call. With the five per projection
    step written out, a served row that meets every rule took 36 us per call of the
    shield instead of 46 (the IB example spec, one row).
    """
    ties = (values == best) | jnp.isnan(values)
    entries = [ties[..., i] for i in range(values.shape[-1])]
    first, seen = [entries[0]], entries[0]
    for tie in entries[1:]:
        first.append(tie & ~seen)
        seen = seen | tie
    return jnp.stack(first, axis=-1)


def iteration_cap(n_actions: int, n_rules: int) -> int:
    """The most steps one projection takes: each constraint (two bounds per action, every
    rule) may enter once and leave once, four times over, and a few more."""
    return 4 * (2 * n_actions + n_rules) + 8


def violation_tolerance(scale: jax.Array) -> jax.Array:
    """The violation (in the normalised coordinates) below which a constraint counts as
    kept, for a problem of ``scale`` (the largest magnitude among its numbers)."""
    return _RELATIVE_TOLERANCE * scale


def _solve(matrix: list[list[jax.Array]], rhs: list[jax.Array]) -> list[jax.Array]:
    """``matrix⁻¹ rhs`` for a small symmetric positive definite matrix given entry by
    entry (elimination without pivoting, which is stable for such matrices; unrolled:
    the size is the number of rules)."""
    m = len(rhs)
    a = [list(row) for row in matrix]
    b = list(rhs)
    for k in range(m):
        inverse = 1.0 / a[k][k]
        for i in range(k + 1, m):
            factor = a[i][k] * inverse
            for j in range(k + 1, m):
                a[i][j] = a[i][j] - factor * a[k][j]
            b[i] = b[i] - factor * b[k]
    x = [jnp.zeros_like(b[0])] * m
    for k in range(m - 1, -1, -1):
        total = b[k]
        for j in range(k + 1, m):
            total = total - a[k][j] * x[j]
        x[k] = total / a[k][k]
    return x


def _working_solve(
    normals: jax.Array, free: jax.Array, working: jax.Array, rhs: jax.Array
) -> jax.Array:
    """``[m]``: ``(N_F N_Fᵀ)⁻¹ rhs`` over the working rules (zero elsewhere), where
    ``N_F`` are the working rules restricted to the free actions."""
    m = normals.shape[0]
    restricted = normals * free[None, :]
    gram = restricted @ normals.T
    on = working.astype(gram.dtype)
    # Rules outside the working set: identity rows, so the system stays definite.
    matrix = [
        [gram[i, j] * on[i] * on[j] + (1.0 - on[i] if i == j else 0.0) for j in range(m)]
        for i in range(m)
    ]
    rhs = rhs * on
    return jnp.stack(_solve(matrix, [rhs[i] for i in range(m)])) * on


# Jitted on its own: every program holding a shield calls it (a few times each, one per
# priority level tried), and a jitted function is traced once per process for each
# (actions, rules) shape and reused, where a plain one is traced again at every call (the
# test suite's tracing and lowering time: -30 % and -9 %; XLA inlines the call, so the
# compiled program is the same).
@functools.partial(jax.jit, static_argnames=("cap",))
def _project_row(
    start: jax.Array,
    low: jax.Array,
    high: jax.Array,
    normals: jax.Array,
    rhs: jax.Array,
    tolerance: jax.Array,
    active: jax.Array,
    cap: int,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The nearest point in normalised coordinates (unit-length ``normals``), whether it
    was found, and the steps taken. ``rhs`` is ``+inf`` for a rule that is off; a
    violation up to ``tolerance`` counts as kept. A row not ``active`` takes no step.

    One function of its length on purpose: the active-set loop's step, its working set and
    its stopping rule share the loop's state through closures, and read as one algorithm."""
    n, m = start.shape[0], normals.shape[0]
    inf = jnp.float32(jnp.inf)

    def violations(y, fixed, working):
        upper = jnp.where(fixed == 0, y - high, -inf)
        lower = jnp.where(fixed == 0, low - y, -inf)
        rules = jnp.where(working, -inf, normals @ y - rhs)
        return upper, lower, rules

    def body(state):
        y, fixed, working, u_box, u_rule, p_box, p_rule, u_p, status, steps = state
        # A new constraint to pursue when none is: the most violated one (unit normals:
        # violations are distances).
        upper, lower, rules = violations(y, fixed, working)
        best_upper, best_lower = jnp.max(upper), jnp.max(lower)
        best_rule = jnp.max(rules) if m else -inf
        worst = jnp.maximum(jnp.maximum(best_upper, best_lower), best_rule)
        pursuing = jnp.any(p_box != 0) | jnp.any(p_rule)
        done = ~pursuing & ~(worst > tolerance)
        pick_upper = best_upper >= jnp.maximum(best_lower, best_rule)
        pick_lower = ~pick_upper & (best_lower >= best_rule)
        pick_rule = ~pick_upper & ~pick_lower
        new_box = jnp.where(
            pick_upper,
            jnp.where(_first_of(upper, best_upper), 1, 0),
            jnp.where(pick_lower & _first_of(lower, best_lower), -1, 0),
        ).astype(jnp.int32)
        new_rule = pick_rule & _first_of(rules, best_rule) if m else p_rule
        p_box = jnp.where(pursuing, p_box, new_box)
        p_rule = jnp.where(pursuing, p_rule, new_rule)
        u_p = jnp.where(pursuing, u_p, 0.0)

        # The pursued constraint: normal, bound, violation.
        normal = p_box.astype(jnp.float32) + (p_rule.astype(jnp.float32) @ normals if m else 0.0)
        bound = jnp.sum(jnp.where(p_box > 0, high, 0.0) - jnp.where(p_box < 0, low, 0.0))
        if m:
            bound = bound + jnp.sum(jnp.where(p_rule, rhs, 0.0))
        violation = normal @ y - bound

        # Step direction and the rates of change of the working multipliers.
        free = (fixed == 0).astype(jnp.float32)
        if m:
            rates = _working_solve(normals, free, working, (normals * free[None, :]) @ normal)
        else:
            rates = jnp.zeros((0,), jnp.float32)
        residual = normal - (rates @ normals if m else 0.0)
        direction = -free * residual
        rate_box = fixed.astype(jnp.float32) * residual * (1.0 - free)
        length = jnp.sum(jnp.square(direction))
        moves = length > _DEPENDENT
        full = jnp.where(moves, violation / jnp.where(moves, length, 1.0), inf)
        ratio_box = jnp.where((fixed != 0) & (rate_box > 0.0), u_box / rate_box, inf)
        ratio_rule = jnp.where(working & (rates > 0.0), u_rule / rates, inf)
        drop_box, drop_rule = jnp.min(ratio_box), jnp.min(ratio_rule) if m else inf
        partial = jnp.minimum(drop_box, drop_rule)
        infeasible = ~moves & ~(partial < inf)
        step = jnp.minimum(full, partial)
        step = jnp.where(done | infeasible, 0.0, step)
        takes_full = full <= partial

        y = y + jnp.where(moves, step, 0.0) * direction
        u_box = jnp.maximum(u_box - step * rate_box, 0.0)
        u_rule = jnp.maximum(u_rule - step * rates, 0.0)
        u_p = u_p + step
        act = ~done & ~infeasible
        add = act & takes_full
        drop = act & ~takes_full
        # A full step: the pursued constraint joins the working set (a bound exactly).
        fixed = jnp.where(add & (p_box != 0), p_box, fixed)
        y = jnp.where(add & (p_box > 0), high, jnp.where(add & (p_box < 0), low, y))
        u_box = jnp.where(add & (p_box != 0), u_p, u_box)
        working = working | (add & p_rule)
        u_rule = jnp.where(add & p_rule, u_p, u_rule)
        # A partial step: the working constraint whose multiplier reached zero leaves.
        leave_box = drop & (drop_box <= drop_rule) & _first_of(ratio_box, drop_box)
        fixed = jnp.where(leave_box, 0, fixed)
        u_box = jnp.where(leave_box, 0.0, u_box)
        if m:
            leave_rule = drop & (drop_box > drop_rule) & _first_of(ratio_rule, drop_rule)
            working = working & ~leave_rule
            u_rule = jnp.where(leave_rule, 0.0, u_rule)
        p_box = jnp.where(add, 0, p_box)
        p_rule = p_rule & ~add
        status = jnp.where(done, 1, jnp.where(infeasible, 2, 0)).astype(jnp.int32)
        return y, fixed, working, u_box, u_rule, p_box, p_rule, u_p, status, steps + 1

    def running(state):
        return (state[8] == 0) & (state[9] < cap)

    # Every bound the start breaks joins the working set at once: the box's own nearest
    # point with the violations as multipliers, the optimum for that working set and
    # dual feasible (the bounds' normals are orthogonal), so the method may start there
    # instead of adding them one step at a time.
    fixed = jnp.where(start > high, 1, jnp.where(start < low, -1, 0)).astype(jnp.int32)
    y = jnp.where(fixed > 0, high, jnp.where(fixed < 0, low, start))
    u_box = jnp.where(fixed > 0, start - high, jnp.where(fixed < 0, low - start, 0.0))
    # A row that keeps every rule once in the box (or is not asked) takes no step, so a
    # batch none of whose rows needs a rule's repair costs no pass of the loop.
    worst = jnp.max(normals @ y - rhs) if m else -inf
    state = (
        y,
        fixed,
        jnp.zeros(m, bool),
        u_box.astype(jnp.float32),
        jnp.zeros(m, jnp.float32),
        jnp.zeros(n, jnp.int32),
        jnp.zeros(m, bool),
        jnp.zeros((), jnp.float32),
        jnp.where(active & (worst > tolerance), 0, 1).astype(jnp.int32),
        jnp.zeros((), jnp.int32),
    )
    y, fixed, working, *_, status, steps = jax.lax.while_loop(running, body, state)
    # The point of the final working set: the bounds exactly at their values, and the
    # working rules' residuals (the steps' accumulated rounding) removed by the smallest
    # move of the free actions.
    y = jnp.where(fixed > 0, high, jnp.where(fixed < 0, low, y))
    if m:
        free = (fixed == 0).astype(jnp.float32)
        gap = normals @ y - jnp.where(working, rhs, 0.0)
        y = y - free * (_working_solve(normals, free, working, gap) @ normals)
    y = jnp.clip(y, low, high)
    return y, (status == 1) & jnp.all(jnp.isfinite(y)), steps


def nearest(
    start: jax.Array,
    low: jax.Array,
    high: jax.Array,
    normals: jax.Array,
    rhs: jax.Array,
    width: jax.Array,
    allowance: jax.Array | None = None,
    active: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The point of ``{low <= x <= high, normals · x <= rhs - allowance}`` nearest to
    ``start`` in the metric ``Σ ((x_j - start_j) / width_j)²``, and whether there is one.

    The rules are aimed at from inside: each right-hand side is lowered by twice the
    solver's tolerance (:func:`violation_tolerance`, relative to the problem's largest
    number), so the point returned keeps ``normals · x <= rhs - allowance`` although the
    method stops within its tolerance.

    Args:
        start: ``[B, n]`` finite points.
        low, high: ``[B, n]`` the box (``±inf``: no bound; ``low > high``: empty).
        normals: ``[m, n]`` the rules' action coefficients (the same for every row).
        rhs: ``[B, m]`` each rule's right-hand side (``+inf``: the rule is off).
        width: ``[n]`` positive: the scale of each action.
        allowance: ``[B, m]`` non-negative, in the rules' units: how far inside each
            rule the point must stay (the caller's rounding allowance); default 0.
        active: ``[B]`` the rows to solve (default: all); the others take no step and
            their results mean nothing (a batch none of whose rows is active costs no
            pass of the loop).

    Returns:
        ``(x [B, n], found [B], steps [B])``: ``found`` is false when no point keeps every
        rule or the row reached the step cap (:func:`iteration_cap`); ``x`` is then the
        method's last point, clipped into the box.
    """
    n, m = start.shape[-1], normals.shape[0]
    scaled = normals * width[None, :]
    norms = jnp.sqrt(jnp.sum(jnp.square(scaled), axis=-1))
    # A rule with no action term cannot be moved by the action: left to the caller's
    # check.
    usable = norms > 0.0
    safe_norms = jnp.where(usable, norms, 1.0)
    unit = jnp.where(usable[:, None], scaled / safe_norms[:, None], 0.0)
    allowance = jnp.zeros_like(rhs) if allowance is None else allowance
    y_start, y_low, y_high = start / width, low / width, high / width
    y_rhs = jnp.where(usable, rhs / safe_norms, jnp.inf)

    def finite_size(values: jax.Array) -> jax.Array:
        return jnp.max(jnp.where(jnp.isfinite(values), jnp.abs(values), 0.0), axis=-1)

    scale = 1.0 + jnp.maximum(
        jnp.maximum(finite_size(jnp.clip(y_start, y_low, y_high)), finite_size(y_rhs)),
        jnp.maximum(finite_size(y_low), finite_size(y_high)),
    )
    tolerance = violation_tolerance(scale)
    target = y_rhs - allowance / safe_norms - 2.0 * tolerance[:, None]
    cap = iteration_cap(n, m)

    active = jnp.ones(start.shape[:1], bool) if active is None else active

    def one(x0, lo, hi, b, tol, on):
        return _project_row(x0, lo, hi, unit, b, tol, on, cap)

    y, found, steps = jax.vmap(one)(y_start, y_low, y_high, target, tolerance, active)
    # An empty box (a bound above the other) holds no point.
    found = found & jnp.all(low <= high, axis=-1)
    return jnp.clip(y * width, low, high), found, steps
