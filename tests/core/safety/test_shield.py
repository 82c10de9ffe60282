"""The shield: property tests over any observation and action (hypothesis)."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from neorl_industrial.core.safety import (
    ConstraintSpec,
    action_box,
    margins,
    project,
    register_safe_controller,
    satisfies,
    shield,
    violations,
)
from neorl_industrial.wrappers.constraint_files import load_constraint_spec

EXAMPLE = Path(__file__).resolve().parents[3] / "configs" / "constraints" / "ib-example.yaml"
OBS = ("setpoint", "velocity", "gain", "shift", "fatigue", "consumption")
ACT = ("velocity", "gain", "shift")
IB = load_constraint_spec(EXAMPLE).compile(6, 3, OBS, ACT)

fast_shield = jax.jit(shield)
fast_satisfies = jax.jit(satisfies)
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

wild = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.floats(-2.0, 2.0, width=32),
    st.sampled_from([0.0, 1.0, -1.0, 1e30, -1e30, float("nan"), float("inf")]),
)
actions = st.lists(wild, min_size=3, max_size=3).map(lambda v: np.asarray(v, np.float32))
previous = st.lists(st.floats(-1.0, 1.0, width=32), min_size=3, max_size=3).map(
    lambda v: np.asarray(v, np.float32)
)
plant = st.tuples(
    st.floats(0, 100, width=32),  # setpoint
    st.floats(0, 100, width=32),  # velocity
    st.floats(0, 100, width=32),  # gain
    st.floats(0, 100, width=32),  # shift
    st.floats(0, 300, width=32),  # fatigue
    st.floats(-10, 5200, width=32),  # consumption
).map(lambda v: np.asarray(v, np.float32))


@SETTINGS
@given(obs=plant, action=actions, prev=previous)
# Far outside the box, where float32 merges the exact projection's kinks.
@example(
    obs=np.asarray([0.0, 1.0, 100.0, 0.0, 51.0, 0.0], np.float32),
    action=np.asarray([0.0, 16777220.0, 0.0], np.float32),
    prev=np.zeros(3, np.float32),
)
@example(
    obs=np.asarray([0.0, 1.0, 100.0, 0.0, 51.0, 0.0], np.float32),
    action=np.asarray([-3e38, 3e38, 1e30], np.float32),
    prev=np.asarray([0.5, -0.5, 0.0], np.float32),
)
def test_shielded_action_keeps_every_hard_constraint(obs, action, prev):
    safe, report = fast_shield(IB, obs, action, prev)
    assert not bool(report.infeasible)
    assert bool(fast_satisfies(IB, obs, safe, prev)), (safe, report)
    assert bool(report.overridden) == (not bool(fast_satisfies(IB, obs, action, prev)))
    assert bool(report.invalid) == (not np.all(np.isfinite(action)))
    if report.invalid:
        assert bool(report.fallback)


@SETTINGS
@given(obs=plant, action=actions, prev=previous)
def test_a_safe_action_passes_bit_for_bit(obs, action, prev):
    safe, _ = fast_shield(IB, obs, action, prev)
    again, report = fast_shield(IB, obs, safe, prev)
    assert not bool(report.overridden)
    assert np.asarray(again).tobytes() == np.asarray(safe).tobytes()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obs=plant, action=actions, prev=previous)
def test_jit_and_no_jit_agree(obs, action, prev):
    jitted, jitted_report = fast_shield(IB, obs, action, prev)
    with jax.disable_jit():
        eager, eager_report = shield(IB, obs, action, prev)
    np.testing.assert_allclose(jitted, eager, atol=1e-6)
    for field in ("overridden", "projected", "fallback", "invalid", "infeasible", "violated"):
        np.testing.assert_array_equal(getattr(jitted_report, field), getattr(eager_report, field))


@st.composite
def feasible_specs(draw):
    """Specs whose constant-zero fallback is always feasible: bounds around 0, two state
    limits that allow 0 on any actions (the same one or two), action-only linear
    constraints with a non-negative bound.

    Which action a state limit bounds is static in the compiled constraints, so a spec
    names every action in a slot of each state limit and the slots of the actions not
    drawn never hold (``observation_0 > 3`` while observations stay within [-2, 2]):
    every spec has the same static structure and shapes, and one compiled shield serves
    all of them, with the same enforced constraints as a spec of the two drawn limits."""
    size = 3
    names = [f"action_{i}" for i in range(size)]
    bounds = {name: [draw(st.floats(-3, 0)), draw(st.floats(0, 3))] for name in names}
    state = []
    for i in range(2):
        limit = (
            {"max": draw(st.floats(0, 2))}
            if draw(st.booleans())
            else {"min": draw(st.floats(-2, 0))}
        )
        threshold = draw(st.floats(-1, 1))
        bounded = draw(st.sampled_from(names))
        for name in names:
            drawn = name == bounded
            state.append(
                {
                    "name": f"state{i}-{name}",
                    "when": {"feature": "observation_0", "above": threshold if drawn else 3.0},
                    "action": name,
                    **(limit if drawn else {"max": 3.0}),
                }
            )
    linear = []
    for i in range(3):
        coefficients = draw(st.lists(st.floats(-2, 2), min_size=size, max_size=size))
        # A spec keeps coefficients of 0 or at least 1e-12 in magnitude (float32's range).
        coefficients = [c if abs(c) >= 1e-12 else 0.0 for c in coefficients]
        if not any(abs(c) > 1e-3 for c in coefficients):
            coefficients[0] = 1.0
        linear.append(
            {
                "name": f"linear{i}",
                "action": dict(zip(names, coefficients, strict=True)),
                "bound": draw(st.floats(0, 2)),
            }
        )
    spec = {
        "action_bounds": bounds,
        "state_limits": state,
        "linear": linear,
        "fallback": {"kind": "constant", "value": 0.0},
    }
    return ConstraintSpec.from_dict(spec).compile(2, size)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    constraints=feasible_specs(),
    obs=st.lists(st.floats(-2, 2, width=32), min_size=2, max_size=2).map(np.float32),
    action=actions,
)
def test_any_feasible_spec_is_enforced(constraints, obs, action):
    prev = np.zeros(3, np.float32)
    safe, report = fast_shield(constraints, obs, action, prev)
    assert not bool(report.infeasible)
    assert bool(fast_satisfies(constraints, obs, safe, prev))
    if not bool(report.overridden):
        assert np.asarray(safe).tobytes() == np.asarray(action).tobytes()


ONE_PLANE = ConstraintSpec.from_dict(
    {
        "action_bounds": {f"action_{i}": [-1.0, 1.0] for i in range(3)},
        "linear": [
            {"name": "plane", "action": {f"action_{i}": 1.0 for i in range(3)}, "bound": 0.0}
        ],
    }
).compile(1, 3)
fast_project = jax.jit(project)


@settings(max_examples=60, deadline=None)
@given(
    action=st.lists(st.floats(-5, 5), min_size=3, max_size=3).map(np.float32),
    normal=st.lists(st.floats(-2, 2), min_size=3, max_size=3).map(np.float32),
    rhs=st.floats(-1, 1),
)
def test_halfspace_projection_is_the_nearest_feasible_point(action, normal, rhs):
    if np.all(np.abs(normal) < 1e-2):
        normal = np.asarray([1.0, 0.0, 0.0], np.float32)
    constraints = ONE_PLANE.replace(
        linear_act=jnp.asarray(normal[None]), linear_bound=jnp.asarray([rhs], jnp.float32)
    )
    low, high = -np.ones(3, np.float32), np.ones(3, np.float32)
    projected = np.asarray(fast_project(constraints, np.zeros(1, np.float32), action, low, high))
    if -np.sum(np.abs(normal)) > rhs:
        return  # the half-space misses the box: the shield falls back instead
    assert normal @ projected <= rhs + 1e-5
    assert np.all(projected >= low) and np.all(projected <= high)
    candidates = np.random.default_rng(0).uniform(-1, 1, (4000, 3)).astype(np.float32)
    feasible = candidates[candidates @ normal <= rhs]
    if feasible.size:
        nearest = np.min(np.linalg.norm(feasible - action, axis=1))
        assert np.linalg.norm(projected - action) <= nearest + 1e-4


def test_untouched_projected_and_fallback_paths():
    names = list(OBS)
    obs = np.zeros(6, np.float32)
    obs[names.index("fatigue")] = 55.0  # velocity may not decrease
    prev = np.zeros(3, np.float32)
    safe, report = fast_shield(IB, obs, np.asarray([0.5, 0.2, 0.1], np.float32), prev)
    assert not bool(report.overridden)
    safe, report = fast_shield(IB, obs, np.asarray([-0.7, 0.2, 0.1], np.float32), prev)
    np.testing.assert_allclose(safe, [0.0, 0.2, 0.1])
    assert bool(report.projected) and not bool(report.fallback)
    assert list(np.asarray(report.violated)) == [
        name == "no-velocity-decrease-when-fatigued" for name in IB.names
    ]
    assert float(
        report.margin[IB.names.index("no-velocity-decrease-when-fatigued")]
    ) == pytest.approx(-0.7)
    safe, report = fast_shield(IB, obs, np.asarray([np.nan, 0.2, 0.1], np.float32), prev)
    np.testing.assert_array_equal(safe, [0.0, 0.0, 0.0])
    assert bool(report.fallback) and bool(report.invalid)


def test_rate_limits_follow_the_previous_action():
    obs = np.zeros(6, np.float32)
    prev = np.asarray([-1.0, 0.9, 0.0], np.float32)
    low, high = action_box(IB, obs, prev)
    np.testing.assert_allclose(low, [-1.0, -0.1, -1.0], atol=1e-6)
    np.testing.assert_allclose(high, [0.0, 1.0, 1.0], atol=1e-6)
    safe, report = fast_shield(IB, obs, np.asarray([1.0, -1.0, 0.0], np.float32), prev)
    np.testing.assert_allclose(safe, [0.0, -0.1, 0.0], atol=1e-6)
    assert bool(report.projected)


def test_infeasible_constraints_are_reported_and_bounds_still_hold():
    spec = ConstraintSpec.from_dict(
        {
            "action_bounds": {"action_0": [-1, 1]},
            "linear": [{"name": "impossible", "action": {"action_0": 1.0}, "bound": -5.0}],
            "fallback": {"kind": "constant", "value": 3.0},
        }
    ).compile(1, 1)
    safe, report = shield(spec, np.zeros(1), np.asarray([0.5]), np.zeros(1))
    assert bool(report.infeasible) and bool(report.fallback)
    np.testing.assert_array_equal(safe, [1.0])
    assert bool(violations(spec, np.zeros(1), safe, np.zeros(1))[1])


def test_a_named_safe_controller_is_the_fallback():
    register_safe_controller(
        "test-brake", lambda obs, prev, constraints: -jnp.ones(3), overwrite=True
    )
    spec = ConstraintSpec.from_dict(
        {
            "action_bounds": {"velocity": [-0.5, 1]},
            "fallback": {"kind": "controller", "controller": "test-brake"},
        }
    ).compile(6, 3, OBS, ACT)
    safe, report = shield(spec, np.zeros(6), np.asarray([np.inf, 0, 0]), np.zeros(3))
    np.testing.assert_array_equal(safe, [-0.5, -1.0, -1.0])
    assert bool(report.fallback)


def test_vmapped_shield_matches_one_by_one():
    rng = np.random.default_rng(1)
    obs = rng.uniform(0, 100, (64, 6)).astype(np.float32)
    proposed = rng.uniform(-2, 2, (64, 3)).astype(np.float32)
    proposed[::7] = np.nan
    prev = rng.uniform(-1, 1, (64, 3)).astype(np.float32)
    batch, reports = jax.jit(jax.vmap(shield, in_axes=(None, 0, 0, 0)))(IB, obs, proposed, prev)
    for i in range(0, 64, 9):
        single, report = fast_shield(IB, obs[i], proposed[i], prev[i])
        np.testing.assert_allclose(batch[i], single, atol=1e-6)
        assert bool(reports.overridden[i]) == bool(report.overridden)
    assert np.all(jax.vmap(satisfies, in_axes=(None, 0, 0, 0))(IB, obs, batch, prev))


def test_thresholds_are_traced_so_a_sweep_does_not_recompile():
    traces = []

    def count(constraints, obs, action, prev):
        traces.append(1)
        return shield(constraints, obs, action, prev)

    jitted = jax.jit(count)
    obs, action, prev = (
        np.zeros(6, np.float32),
        np.full(3, 0.5, np.float32),
        np.zeros(3, np.float32),
    )
    for limit in (0.1, 0.2, 0.3):
        swept = IB.replace(rate_limit=jnp.full_like(IB.rate_limit, limit))
        safe, _ = jitted(swept, obs, action, prev)
        assert float(safe[0]) == pytest.approx(min(limit, 0.5))
    assert len(traces) == 1


def test_margins_of_nan_observations_are_conservative():
    obs = np.full(6, np.nan, np.float32)
    margin = margins(IB, obs, np.zeros(3, np.float32), np.zeros(3, np.float32))
    # The fatigue condition counts as met; the linear constraint cannot be evaluated.
    assert float(margin[IB.names.index("no-velocity-decrease-when-fatigued")]) == 0.0
    assert np.isnan(float(margin[IB.names.index("limit-joint-velocity-gain-push")]))
    safe, report = shield(IB, obs, np.zeros(3, np.float32), np.zeros(3, np.float32))
    assert bool(report.infeasible)
    assert np.all(np.abs(np.asarray(safe)) <= 1.0)


@pytest.mark.parametrize("batch", [8, 256])
def test_small_and_large_batches_decide_alike(batch):
    # Small batches select every row's repair; large ones branch on the whole batch.
    rng = np.random.default_rng(batch)
    obs = rng.uniform(0, 100, (batch, 6)).astype(np.float32)
    prev = rng.uniform(-1, 1, (batch, 3)).astype(np.float32)
    safe_rows = np.zeros((batch, 3), np.float32)
    safe, report = jax.jit(shield)(IB, obs, safe_rows, np.zeros_like(prev))
    assert np.asarray(safe).tobytes() == safe_rows.tobytes()
    assert not np.any(np.asarray(report.overridden))
    proposed = rng.uniform(-2, 2, (batch, 3)).astype(np.float32)
    proposed[::5] = np.inf
    safe, report = jax.jit(shield)(IB, obs, proposed, prev)
    assert np.all(np.asarray(satisfies(IB, obs, safe, prev)))
    for i in range(0, batch, max(batch // 8, 1)):
        single, single_report = fast_shield(IB, obs[i], proposed[i], prev[i])
        np.testing.assert_allclose(safe[i], single, atol=1e-6)
        assert int(report.status[i]) == int(single_report.status)
