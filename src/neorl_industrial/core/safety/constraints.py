"""Compiled constraints: a PyTree of arrays and the pure functions that evaluate it.

Every function here takes one observation and one action (``[obs_size]``,
``[action_size]``) and is batched with ``vmap`` at the call site. Thresholds are traced
leaves (a sweep over limits does not recompile); names and the fallback's kind are static.

The hard constraints, in the order of :attr:`CompiledConstraints.names`: action bounds,
rate limits, state-conditional limits, linear constraints. A margin is the slack of a
constraint (``>= 0`` when it holds, ``+inf`` for a state limit whose condition is off);
a constraint is violated when its margin is below ``-TOLERANCE`` or not a number.

Every constraint but the action bounds has a priority (static: the shield unrolls its
levels at trace time); the action bounds always hold. A feature has two ranges: its
physical range (``observation_low``/``high``: outside it, or not a number, the reading is
invalid) and the range of the data the policy learnt from (``data_low``/``high``: outside
it the observation is flagged as out of distribution, nothing more).

Linear constraints and float32 (the numerics guarantee). ``bound - c_obs · obs`` is
computed in float32 (x64 is off by default, and the shield must stay cheap), and with
observations far above the bound's scale it cancels: velocity ``-1e20`` and gain ``+1e20``
at ``0.005`` each leave an exact ``0`` but a float32 sum (summed in any order, with or
without the fused multiply-adds XLA may choose) off by ~1e11 either way, which let a
violating action through. Compensated (error-free) summation would need the compiler to
keep every rounding as written, which XLA does not promise. So the shield instead
computes, next to each linear margin, a bound on everything float32 can have got wrong
in it and subtracts it: for ``k`` rounded operations the computed sum of terms ``t_i``
is off by at most ``k u Σ|t_i|`` (``u = 2^-24``, the standard bound whatever the order
or contraction), and the compiled coefficients and bound are the spec's numbers rounded
once more. With ``_ROUNDING = 2^-23`` (twice ``u``, which also covers the rounding of the
error bound itself) and ``k`` = the row's terms plus four, the margin reported and
checked is ``computed slack - _ROUNDING k (|bound| + Σ|c_i obs_i| + Σ|d_j a_j|)``, a
lower bound on the exact slack of the spec's constraint for these inputs. Accepting an
action only when that lower bound is ``>= -TOLERANCE`` means no finite input can pass an
action whose exact slack is below ``-TOLERANCE``. Where the terms dwarf the bound (all
precision lost) the margin is very negative: the proposal is repaired against a
right-hand side that is the smallest it can be, and when that leaves nothing the fallback
is flagged ``infeasible``. An overflow makes the error bound infinite and the margin
``-inf`` or NaN: violated. The correction is relative: ~1e-6 on a rule of unit scale,
~2e-4 on ``heater + cooler <= 120`` with actions near 100, above ``TOLERANCE``; so the
shield's projection aims inside each rule by it (:func:`row_margin` of the action it
returns is not negative at any scale). Underflow and flushed subnormals err by less than
1e-37 per term.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

__all__ = [
    "DEFAULT_PRIORITY",
    "TOLERANCE",
    "CompiledConstraints",
    "action_box",
    "cost_limits",
    "costs",
    "describe",
    "in_data_range",
    "linear_lhs",
    "linear_rhs",
    "margins",
    "observation_valid",
    "satisfies",
    "violations",
]

# Absolute slack allowed in every check: the projections are exact in real arithmetic and
# off by a few float32 roundings in practice.
TOLERANCE = 1e-5
# Twice float32's unit roundoff: the per-operation relative error the linear margins
# allow for (see the module docstring).
_ROUNDING = 2.0**-23
# The priority of each kind of constraint unless the spec gives one (larger wins):
# interlocks (state-conditional limits) over linear process limits over equipment rate
# limits. The action bounds are the actuator's range and always hold.
DEFAULT_PRIORITY = {"state_limits": 300, "linear": 200, "rate_limits": 100}


@struct.dataclass
class CompiledConstraints:
    """Hard constraints, the fallback and the per-step costs of one plant, as arrays.

    Which action or feature each constraint refers to is static (tuples of indices): the
    shield then reads them with constant slices. Every number is a traced leaf.
    """

    bound_low: jax.Array  # [n_bounds]
    bound_high: jax.Array  # [n_bounds]
    rate_limit: jax.Array  # [n_rates] largest |a_t - a_{t-1}|
    state_threshold: jax.Array  # [n_state]
    state_above: jax.Array  # [n_state] bool: condition is feature > threshold (else <)
    state_low: jax.Array  # [n_state] (-inf when only a maximum is given)
    state_high: jax.Array  # [n_state] (+inf when only a minimum is given)
    linear_obs: jax.Array  # [n_linear, obs_size]
    linear_act: jax.Array  # [n_linear, action_size]
    linear_bound: jax.Array  # [n_linear]
    # Physical bounds of each feature (±inf where unknown): a finite bound is checked.
    observation_low: jax.Array  # [obs_size]
    observation_high: jax.Array  # [obs_size]
    # Range of the data the policy learnt from (±inf where unknown): outside it the
    # observation is flagged out of distribution; the decision does not change.
    data_low: jax.Array  # [obs_size]
    data_high: jax.Array  # [obs_size]
    fallback_value: jax.Array  # [action_size] the constant fallback
    cost_threshold: jax.Array  # [n_costs]
    cost_above: jax.Array  # [n_costs] bool
    cost_limit: jax.Array  # [n_costs] episode cost limits
    bound_index: tuple[int, ...] = struct.field(pytree_node=False, default=())
    rate_index: tuple[int, ...] = struct.field(pytree_node=False, default=())
    state_feature: tuple[int, ...] = struct.field(pytree_node=False, default=())
    state_action: tuple[int, ...] = struct.field(pytree_node=False, default=())
    cost_feature: tuple[int, ...] = struct.field(pytree_node=False, default=())
    # Per linear constraint, the features with a non-zero coefficient.
    linear_support: tuple[tuple[int, ...], ...] = struct.field(pytree_node=False, default=())
    names: tuple[str, ...] = struct.field(pytree_node=False, default=())
    cost_names: tuple[str, ...] = struct.field(pytree_node=False, default=())
    fallback_kind: str = struct.field(pytree_node=False, default="hold_previous")
    controller: str | None = struct.field(pytree_node=False, default=None)
    action_size: int = struct.field(pytree_node=False, default=0)
    # Priority of each rate limit, state limit and linear constraint (larger wins).
    rate_priority: tuple[int, ...] = struct.field(pytree_node=False, default=())
    state_priority: tuple[int, ...] = struct.field(pytree_node=False, default=())
    linear_priority: tuple[int, ...] = struct.field(pytree_node=False, default=())
    # Whether any feature has a data range (skips the check otherwise).
    checks_data_range: bool = struct.field(pytree_node=False, default=False)

    @property
    def n_hard(self) -> int:
        return len(self.names)

    @property
    def priorities(self) -> tuple[int | None, ...]:
        """Per hard constraint (``names`` order), its priority; None for the action
        bounds, which always hold."""
        return (
            *(None for _ in self.bound_index),
            *self.rate_priority,
            *self.state_priority,
            *self.linear_priority,
        )

    @property
    def levels(self) -> tuple[int, ...]:
        """The distinct priorities, highest first."""
        every = {*self.rate_priority, *self.state_priority, *self.linear_priority}
        return tuple(sorted(every, reverse=True))

    @property
    def n_costs(self) -> int:
        return len(self.cost_names)

    @property
    def n_linear(self) -> int:
        return int(self.linear_act.shape[0])

    def to_device(self) -> CompiledConstraints:
        """The same constraints with every leaf a JAX array."""
        return jax.tree_util.tree_map(jnp.asarray, self)

    def to_numpy(self) -> CompiledConstraints:
        """The same constraints with every leaf a NumPy array (for saving)."""
        return jax.tree_util.tree_map(np.asarray, self)


# Every function below accepts one item (``observation [obs_size]``, ``action
# [action_size]``) or a batch with any leading axes, and broadcasts. Internally an action
# is a list of its components (each of the batch's shape) and every constraint a list of
# per-row arrays: a plant has a handful of actions and constraints, so unrolling them in
# Python leaves XLA purely elementwise work over the batch, which it fuses into a few
# vectorized loops (no reductions over tiny axes, no gathers).

Components = list[jax.Array]


def _as_float(value: jax.Array) -> jax.Array:
    return jnp.asarray(value, jnp.float32)


def split(values: jax.Array) -> Components:
    """``[..., n]`` as a list of ``n`` arrays of shape ``[...]``."""
    return [values[..., i] for i in range(values.shape[-1])]


def join(parts: Components, shape: tuple[int, ...] = ()) -> jax.Array:
    """The inverse of :func:`split` (``shape``: the batch shape when ``parts`` is empty)."""
    if not parts:
        return jnp.zeros((*shape, 0), jnp.float32)
    return jnp.stack(jnp.broadcast_arrays(*parts), axis=-1)


def _columns(values: jax.Array, index: tuple[int, ...]) -> jax.Array:
    """``values[..., index]`` with a static index (constant slices, no gather)."""
    return join([values[..., i] for i in index], values.shape[:-1])


def _all(parts: Components) -> jax.Array:
    result = jnp.ones((), bool)
    for part in parts:
        result = result & part
    return result


def _feature_valid(
    constraints: CompiledConstraints, observation: jax.Array, feature: int
) -> jax.Array:
    """``[...]`` bool: the reading of one feature is a finite number within its physical
    bounds (``±inf`` bounds: any finite number)."""
    value = observation[..., feature]
    low, high = constraints.observation_low[feature], constraints.observation_high[feature]
    return jnp.isfinite(value) & (value >= low) & (value <= high)


def _state_active(constraints: CompiledConstraints, observation: jax.Array) -> Components:
    """Which state-conditional limits are on. A reading that is not a finite number, or
    outside its feature's physical bounds, turns its limit on: an unreadable sensor is
    treated as the unsafe case."""
    active = []
    for k, feature in enumerate(constraints.state_feature):
        value = observation[..., feature]
        threshold = constraints.state_threshold[k]
        passed = jnp.where(constraints.state_above[k], value > threshold, value < threshold)
        active.append(passed | ~_feature_valid(constraints, observation, feature))
    return active


def linear_readable(constraints: CompiledConstraints, observation: jax.Array) -> Components:
    """Per linear constraint, ``[...]`` bool: no feature it reads has a finite physical
    bound that the reading is outside of (or not a number within). A constraint that
    reads an invalid sensor cannot be checked."""
    readable = []
    for support in constraints.linear_support:
        ok = jnp.ones((), bool)
        for feature in support:
            low = constraints.observation_low[feature]
            high = constraints.observation_high[feature]
            bounded = jnp.isfinite(low) | jnp.isfinite(high)
            ok = ok & ~(bounded & ~_feature_valid(constraints, observation, feature))
        readable.append(ok)
    return readable


def observation_valid(constraints: CompiledConstraints, observation: jax.Array) -> jax.Array:
    """``[...]`` bool: every feature with a finite physical bound is a finite number
    within its bounds (features without one are not checked)."""
    low, high = constraints.observation_low, constraints.observation_high
    checked = jnp.isfinite(low) | jnp.isfinite(high)
    inside = jnp.isfinite(observation) & (observation >= low) & (observation <= high)
    return ~jnp.any(checked & ~inside, axis=-1)


def in_data_range(constraints: CompiledConstraints, observation: jax.Array) -> jax.Array:
    """``[...]`` bool: every feature with a data range is within it (a reading that is
    not a number is not). Always true without data ranges."""
    observation = _as_float(observation)
    if not constraints.checks_data_range:
        return jnp.ones(observation.shape[:-1], bool)
    low, high = constraints.data_low, constraints.data_high
    checked = jnp.isfinite(low) | jnp.isfinite(high)
    inside = (observation >= low) & (observation <= high)
    return ~jnp.any(checked & ~inside, axis=-1)


def _row_rounding(constraints: CompiledConstraints, row: int) -> float:
    """The relative error allowance of linear constraint ``row`` (module docstring)."""
    terms = len(constraints.linear_support[row]) + constraints.action_size
    return (terms + 4) * _ROUNDING


def _rhs(constraints: CompiledConstraints, observation: jax.Array) -> Components:
    """Per linear constraint, a lower bound on the exact ``bound - c_obs · obs``: the
    float32 result less what its roundings can have got wrong."""
    rows = []
    for row, support in enumerate(constraints.linear_support):
        bound = constraints.linear_bound[row]
        total = jnp.zeros((), jnp.float32)
        size = jnp.abs(bound)
        for feature in support:
            term = constraints.linear_obs[row, feature] * observation[..., feature]
            total = total + term
            size = size + jnp.abs(term)
        rows.append((bound - total) - _row_rounding(constraints, row) * size)
    return rows


def _lhs(constraints: CompiledConstraints, action: Components) -> Components:
    rows = []
    for row in range(constraints.n_linear):
        total = jnp.zeros((), jnp.float32)
        for j in range(constraints.action_size):
            total = total + constraints.linear_act[row, j] * action[j]
        rows.append(total)
    return rows


def row_margin(
    constraints: CompiledConstraints, row: int, rhs: jax.Array, action: Components
) -> jax.Array:
    """The margin of linear constraint ``row`` for ``action`` given its right-hand side
    (from :func:`_rhs`): a lower bound on the exact slack."""
    total = jnp.zeros((), jnp.float32)
    size = jnp.zeros((), jnp.float32)
    for j in range(constraints.action_size):
        term = constraints.linear_act[row, j] * action[j]
        total = total + term
        size = size + jnp.abs(term)
    return rhs - total - _row_rounding(constraints, row) * size


def _lhs_error(constraints: CompiledConstraints, action: Components) -> Components:
    """Per linear constraint, the most float32 can have got ``c_act · action`` wrong."""
    rows = []
    for row in range(constraints.n_linear):
        size = jnp.zeros((), jnp.float32)
        for j in range(constraints.action_size):
            size = size + jnp.abs(constraints.linear_act[row, j] * action[j])
        rows.append(_row_rounding(constraints, row) * size)
    return rows


def bounds_box(constraints: CompiledConstraints) -> tuple[Components, Components]:
    """Per action ``(low, high)`` of the action bounds alone (``±inf`` where none)."""
    low = [jnp.float32(-jnp.inf)] * constraints.action_size
    high = [jnp.float32(jnp.inf)] * constraints.action_size
    for k, j in enumerate(constraints.bound_index):
        low[j] = jnp.maximum(low[j], constraints.bound_low[k])
        high[j] = jnp.minimum(high[j], constraints.bound_high[k])
    return low, high


def rate_box(
    constraints: CompiledConstraints, prev_action: Components
) -> tuple[Components, Components]:
    """Per action ``(low, high)`` of the action bounds and rate limits: the part of the
    box that does not depend on the observation."""
    low, high = bounds_box(constraints)
    for k, j in enumerate(constraints.rate_index):
        prev = prev_action[j]
        known = jnp.isfinite(prev)
        limit = constraints.rate_limit[k]
        low[j] = jnp.maximum(low[j], jnp.where(known, prev - limit, -jnp.inf))
        high[j] = jnp.minimum(high[j], jnp.where(known, prev + limit, jnp.inf))
    return low, high


def box(
    constraints: CompiledConstraints, observation: jax.Array, prev_action: Components
) -> tuple[Components, Components]:
    """:func:`action_box` on components."""
    low, high = rate_box(constraints, prev_action)
    active = _state_active(constraints, observation)
    for k, j in enumerate(constraints.state_action):
        low[j] = jnp.maximum(low[j], jnp.where(active[k], constraints.state_low[k], -jnp.inf))
        high[j] = jnp.minimum(high[j], jnp.where(active[k], constraints.state_high[k], jnp.inf))
    return low, high


def margin_list(
    constraints: CompiledConstraints,
    observation: jax.Array,
    action: Components,
    prev_action: Components,
) -> Components:
    """:func:`margins` on components: one array per hard constraint."""
    result = []
    for k, j in enumerate(constraints.bound_index):
        result.append(
            jnp.minimum(action[j] - constraints.bound_low[k], constraints.bound_high[k] - action[j])
        )
    for k, j in enumerate(constraints.rate_index):
        prev = prev_action[j]
        slack = constraints.rate_limit[k] - jnp.abs(action[j] - prev)
        result.append(jnp.where(jnp.isfinite(prev), slack, jnp.inf))
    active = _state_active(constraints, observation)
    for k, j in enumerate(constraints.state_action):
        slack = jnp.minimum(
            action[j] - constraints.state_low[k], constraints.state_high[k] - action[j]
        )
        result.append(jnp.where(active[k], slack, jnp.inf))
    rows = zip(
        _rhs(constraints, observation),
        _lhs(constraints, action),
        _lhs_error(constraints, action),
        strict=True,
    )
    for rhs, lhs, error in rows:
        result.append(rhs - lhs - error)
    return result


def keeps_all(
    constraints: CompiledConstraints,
    observation: jax.Array,
    action: Components,
    prev_action: Components,
) -> jax.Array:
    """:func:`satisfies` on components."""
    finite = _all([jnp.isfinite(part) for part in action])
    margins_ = margin_list(constraints, observation, action, prev_action)
    return finite & _all([margin >= -TOLERANCE for margin in margins_])


def _batch_shape(*arrays: jax.Array) -> tuple[int, ...]:
    return jnp.broadcast_shapes(*(array.shape[:-1] for array in arrays))


def linear_rhs(constraints: CompiledConstraints, observation: jax.Array) -> jax.Array:
    """``[..., n_linear]``: ``bound - c_obs · observation`` per linear constraint, the
    right-hand side of ``c_act · action <= rhs`` for this observation, less the most its
    float32 evaluation can be off (a lower bound on the exact value)."""
    observation = _as_float(observation)
    return join(_rhs(constraints, observation), observation.shape[:-1])


def linear_lhs(constraints: CompiledConstraints, action: jax.Array) -> jax.Array:
    """``[..., n_linear]``: ``c_act · action`` per linear constraint."""
    action = _as_float(action)
    return join(_lhs(constraints, split(action)), action.shape[:-1])


def action_box(
    constraints: CompiledConstraints, observation: jax.Array, prev_action: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Per-action ``(low, high)`` that the bounds, rate limits and active state limits
    leave. Empty (``low > high``) when they contradict each other. A previous action that
    is not finite leaves its rate limit out."""
    observation, prev_action = _as_float(observation), _as_float(prev_action)
    shape = _batch_shape(observation, prev_action)
    low, high = box(constraints, observation, split(prev_action))
    return join([jnp.broadcast_to(x, shape) for x in low]), join(
        [jnp.broadcast_to(x, shape) for x in high]
    )


def margins(
    constraints: CompiledConstraints,
    observation: jax.Array,
    action: jax.Array,
    prev_action: jax.Array,
) -> jax.Array:
    """``[..., n_hard]`` slack of each hard constraint for ``action`` (negative:
    violated)."""
    observation = _as_float(observation)
    action, prev_action = _as_float(action), _as_float(prev_action)
    shape = _batch_shape(observation, action, prev_action)
    parts = margin_list(constraints, observation, split(action), split(prev_action))
    return join([jnp.broadcast_to(part, shape) for part in parts], shape)


def violations(
    constraints: CompiledConstraints,
    observation: jax.Array,
    action: jax.Array,
    prev_action: jax.Array,
) -> jax.Array:
    """``[..., n_hard]`` bool: which hard constraints ``action`` breaks (NaN breaks all
    it touches)."""
    return ~(margins(constraints, observation, action, prev_action) >= -TOLERANCE)


def satisfies(
    constraints: CompiledConstraints,
    observation: jax.Array,
    action: jax.Array,
    prev_action: jax.Array,
) -> jax.Array:
    """``[...]`` bool: ``action`` is finite and keeps every hard constraint."""
    observation = _as_float(observation)
    action, prev_action = _as_float(action), _as_float(prev_action)
    shape = _batch_shape(observation, action, prev_action)
    ok = keeps_all(constraints, observation, split(action), split(prev_action))
    return jnp.broadcast_to(ok, shape)


def costs(constraints: CompiledConstraints, observation: jax.Array) -> jax.Array:
    """``[..., n_costs]`` float32: 1 for each cost whose feature passes its threshold in
    ``observation`` (the observation reached after the step), else 0."""
    value = _columns(_as_float(observation), constraints.cost_feature)
    passed = jnp.where(
        constraints.cost_above,
        value > constraints.cost_threshold,
        value < constraints.cost_threshold,
    )
    return passed.astype(jnp.float32)


def cost_limits(constraints: CompiledConstraints) -> dict[str, float]:
    """``{cost name: episode cost limit}`` on the host."""
    limits = np.asarray(constraints.cost_limit, np.float64)
    return {name: float(limit) for name, limit in zip(constraints.cost_names, limits, strict=True)}


def describe(constraints: CompiledConstraints) -> dict[str, Any]:
    """A JSON-ready summary of the compiled constraints (names, priorities, fallback)."""
    return {
        "hard_constraints": list(constraints.names),
        "priorities": dict(zip(constraints.names, constraints.priorities, strict=True)),
        "costs": cost_limits(constraints),
        "fallback": constraints.fallback_kind,
        "controller": constraints.controller,
        "action_size": constraints.action_size,
    }
