"""The shield's output against the constraints recomputed exactly, independently of the
shield (hypothesis): extreme observations and actions, NaN and infinities, observation
bounds, and float32 cancellation in the linear constraint."""

from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from neorl_industrial.core.environments.task import Task
from neorl_industrial.core.safety import ConstraintSpecError, shield
from neorl_industrial.wrappers.constraint_files import load_constraint_spec

EXAMPLE = Path(__file__).resolve().parents[3] / "configs" / "constraints" / "ib-example.yaml"
OBS = ("setpoint", "velocity", "gain", "shift", "fatigue", "consumption")
ACT = ("velocity", "gain", "shift")
SPEC = load_constraint_spec(EXAMPLE)
INF = np.float32(np.inf)
PLANT_LOW = np.asarray([0, 0, 0, 0, 0, -10], np.float32)
PLANT_HIGH = np.asarray([100, 100, 100, 100, 1000, 5200], np.float32)
# Compiled once, with observation bounds; every example only replaces numbers (traced
# leaves), so one compiled shield serves the whole test.
BASE = SPEC.compile(6, 3, OBS, ACT, observation_bounds=(PLANT_LOW, PLANT_HIGH))
fast_shield = jax.jit(shield)
TOL = 1e-5  # the shield's documented absolute slack
FLOAT32_MAX = float(np.finfo(np.float32).max)
TINY = float(np.finfo(np.float32).smallest_subnormal)

extreme = st.sampled_from(
    [0.0, 1e20, -1e20, 1e25, -1e25, 1e30, -1e30, FLOAT32_MAX, -FLOAT32_MAX, TINY, -TINY]
)
special = st.sampled_from([math.nan, math.inf, -math.inf])
feature = st.one_of(
    st.floats(-20, 300, width=32), extreme, special, st.floats(width=32, allow_nan=False)
)
action_value = st.one_of(st.floats(-2, 2, width=32), extreme, special)


@st.composite
def situations(draw):
    """Observation, proposal, previous action and the numbers of the IB's constraints."""
    coefficient = st.one_of(st.just(0.005), st.floats(-1, 1, width=32))
    obs_coefficients = [draw(coefficient), draw(coefficient)]
    obs = np.asarray([draw(feature) for _ in OBS], np.float32)
    cancel = draw(st.sampled_from(["no", "same", "near"]))
    if cancel != "no":
        # Velocity and gain (nearly) cancelling in the observation term: the same
        # magnitude, or the one that balances the other coefficient, rounded to float32.
        magnitude = draw(
            st.one_of(extreme, st.floats(1e15, 1e35).map(lambda v: float(np.float32(v))))
        )
        obs[1] = -magnitude
        if cancel == "same" or obs_coefficients[1] == 0.0:
            obs[2] = magnitude
        else:
            with np.errstate(over="ignore", invalid="ignore"):
                balance = np.float32(magnitude * obs_coefficients[0] / obs_coefficients[1])
            obs[2] = balance if np.isfinite(balance) else magnitude
    action = np.asarray([draw(action_value) for _ in ACT], np.float32)
    prev = np.asarray(
        [draw(st.one_of(st.floats(-1, 1, width=32), st.just(math.nan))) for _ in ACT],
        np.float32,
    )
    bounds = draw(st.sampled_from(["none", "plant", "velocity-gain"]))
    low, high = np.full(6, -INF), np.full(6, INF)
    if bounds == "plant":
        low, high = PLANT_LOW, PLANT_HIGH
    elif bounds == "velocity-gain":
        low[1:3], high[1:3] = 0.0, 100.0
    numbers = {
        "obs_coefficients": obs_coefficients,
        "act_coefficients": [draw(st.floats(0.25, 2, width=32)) for _ in range(2)],
        "bound": draw(st.one_of(st.just(1.5), st.floats(-1, 3, width=32))),
        "observation_low": low,
        "observation_high": high,
    }
    return obs, action, prev, numbers


def _constraints(numbers):
    linear_obs = np.zeros((1, 6), np.float32)
    linear_obs[0, 1:3] = numbers["obs_coefficients"]
    linear_act = np.zeros((1, 3), np.float32)
    linear_act[0, :2] = numbers["act_coefficients"]
    return BASE.replace(
        linear_obs=jnp.asarray(linear_obs),
        linear_act=jnp.asarray(linear_act),
        linear_bound=jnp.asarray([numbers["bound"]], jnp.float32),
        observation_low=jnp.asarray(numbers["observation_low"], jnp.float32),
        observation_high=jnp.asarray(numbers["observation_high"], jnp.float32),
    )


def _exact_sum(terms: list[float]) -> float:
    """The correctly rounded sum (NaN when a term is not finite): products of two float32
    numbers are exact in float64, and ``math.fsum`` rounds only once."""
    if not all(math.isfinite(term) for term in terms):
        return math.nan
    return math.fsum(terms)


def _broken(constraints, obs, safe, prev) -> list[str]:
    """The hard constraints ``safe`` breaks by more than ``TOL``, recomputed in float64
    from the compiled numbers (not from the shield's margins or report)."""
    c = jax.tree_util.tree_map(lambda leaf: np.asarray(leaf, np.float64), constraints)
    obs, safe, prev = (np.asarray(x, np.float64) for x in (obs, safe, prev))
    broken = []
    for k, j in enumerate(constraints.bound_index):
        if not (c.bound_low[k] - TOL <= safe[j] <= c.bound_high[k] + TOL):
            broken.append(f"bounds/{j}")
    for k, j in enumerate(constraints.rate_index):
        if np.isfinite(prev[j]) and not abs(safe[j] - prev[j]) <= c.rate_limit[k] + TOL:
            broken.append(f"rate/{j}")
    for k, j in enumerate(constraints.state_action):
        value = obs[constraints.state_feature[k]]
        above = bool(c.state_above[k])
        passed = value > c.state_threshold[k] if above else value < c.state_threshold[k]
        if (passed or not np.isfinite(value)) and not (
            c.state_low[k] - TOL <= safe[j] <= c.state_high[k] + TOL
        ):
            broken.append(f"state/{k}")
    for row in range(constraints.n_linear):
        # A feature with a zero coefficient is not part of the constraint.
        terms = [float(c.linear_obs[row, i] * obs[i]) for i in np.flatnonzero(c.linear_obs[row])]
        terms += [float(c.linear_act[row, j] * safe[j]) for j in range(safe.size)]
        terms.append(-float(c.linear_bound[row]))
        if not _exact_sum(terms) <= TOL:  # NaN: unknown, counts as broken
            broken.append(f"linear/{row}")
    return broken


def _hard_name(constraints, broken: str) -> str:
    """The constraint's name in ``constraints.names`` of a ``_broken`` entry."""
    kind, index = broken.split("/")
    index = int(index)
    n_bounds, n_rates = len(constraints.bound_index), len(constraints.rate_index)
    position = {
        "bounds": constraints.bound_index.index(index) if kind == "bounds" else 0,
        "rate": n_bounds + (constraints.rate_index.index(index) if kind == "rate" else 0),
        "state": n_bounds + n_rates + index,
        "linear": n_bounds + n_rates + len(constraints.state_action) + index,
    }[kind]
    return constraints.names[position]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(situation=situations())
# The cancellation that used to pass (0.9, 0.9) with status 0: exact slack -0.3.
@example(
    situation=(
        np.asarray([0, -1e20, 1e20, 0, 0, 0], np.float32),
        np.asarray([0.9, 0.9, 0.0], np.float32),
        np.zeros(3, np.float32),
        {
            "obs_coefficients": [0.005, 0.005],
            "act_coefficients": [1.0, 1.0],
            "bound": 1.5,
            "observation_low": np.full(6, -INF),
            "observation_high": np.full(6, INF),
        },
    )
)
def test_shielded_actions_keep_the_exact_constraints_or_are_the_flagged_fallback(situation):
    """Every returned action keeps every hard constraint, recomputed exactly, or it is
    the fallback and the report says why (infeasible or invalid observation) and which
    constraints it breaks (``violated_after``)."""
    obs, action, prev, numbers = situation
    constraints = _constraints(numbers)
    safe, report = fast_shield(constraints, obs, action, prev)
    safe = np.asarray(safe, np.float64)
    assert np.all(np.isfinite(safe))
    low, high = numbers["observation_low"], numbers["observation_high"]
    checked = np.isfinite(low) | np.isfinite(high)
    # XLA on CPU flushes subnormal numbers to zero: -1e-45 is a reading of 0.
    reading = np.where(np.abs(obs) < np.finfo(np.float32).tiny, 0.0, obs)
    inside = np.isfinite(reading) & (reading >= low) & (reading <= high)
    sensible = not np.any(checked & ~inside)
    assert bool(report.invalid_observation) == (not sensible)
    broken = _broken(constraints, obs, safe, prev)
    # The action bounds hold whatever happens, and so does the interlock (the state
    # limit, the highest priority), which the constant fallback 0 always keeps.
    assert not [name for name in broken if name.startswith(("bounds/", "state/"))], (
        safe,
        broken,
    )
    # The report names every constraint the applied action breaks.
    flagged = dict(zip(constraints.names, np.asarray(report.violated_after), strict=True))
    for name in broken:
        assert flagged[_hard_name(constraints, name)], (name, report)
    linear_reads_invalid = bool(np.any(checked[1:3] & ~inside[1:3]))
    if not sensible:
        # A broken sensor: the fallback, whatever the proposal (which the observation says
        # nothing trustworthy about), keeping every rule that does not read it.
        assert bool(report.fallback) and bool(report.overridden)
        checkable = [n for n in broken if not (n.startswith("linear/") and linear_reads_invalid)]
        if checkable:
            assert bool(report.infeasible), (safe, broken)
        if linear_reads_invalid:
            assert flagged["limit-joint-velocity-gain-push"]
    elif broken:
        assert bool(report.fallback) and bool(report.infeasible), (safe, broken)
    if not bool(report.overridden):
        assert safe.astype(np.float32).tobytes() == action.tobytes()


@pytest.mark.parametrize("magnitude", [1e20, 1e25, 1e30])
def test_cancelling_observations_cannot_pass_a_violating_action(magnitude):
    constraints = SPEC.compile(6, 3, OBS, ACT)
    obs = np.asarray([0, -magnitude, magnitude, 0, 0, 0], np.float32)
    action = np.asarray([0.9, 0.9, 0.0], np.float32)
    safe, report = fast_shield(constraints, obs, action, np.zeros(3, np.float32))
    assert int(report.status) != 0
    linear = constraints.names.index("limit-joint-velocity-gain-push")
    assert float(report.margin[linear]) < 0.0
    assert _broken(constraints, obs, safe, np.zeros(3, np.float32)) == []


def test_plant_scale_margins_lose_less_than_the_tolerance():
    # The rounding allowance is far below TOLERANCE for a plant's own numbers.
    obs = np.asarray([50, 100, 100, 50, 40, 200], np.float32)
    prev = np.zeros(3, np.float32)
    on_the_plane = np.asarray([0.25, 0.25, 0.0], np.float32)  # 0.005*200 + 0.5 = 1.5
    safe, report = fast_shield(BASE, obs, on_the_plane, prev)
    assert int(report.status) == 0
    assert safe.tobytes() == on_the_plane.tobytes()
    assert -TOL < float(report.margin[-1]) <= 0.0


def test_an_invalid_observation_sends_the_fallback_whatever_the_proposal():
    prev = np.asarray([0.5, -0.5, 0.0], np.float32)
    ok = np.asarray([0.1, 0.1, 0.0], np.float32)
    for obs in ([0, 150, 50, 0, 0, 0], [0, 50, 50, 0, math.nan, 0], [math.inf] * 6):
        obs = np.asarray(obs, np.float32)
        safe, report = fast_shield(BASE, obs, ok, prev)
        assert bool(report.invalid_observation) and bool(report.fallback)
        assert not bool(report.invalid) and not bool(report.infeasible)
        np.testing.assert_array_equal(safe, np.zeros(3, np.float32))
        batch = np.stack([obs, np.full(6, 10, np.float32)])
        safe, report = fast_shield(BASE, batch, np.stack([ok, ok]), np.stack([prev, prev]))
        np.testing.assert_array_equal(report.invalid_observation, [True, False])
        np.testing.assert_array_equal(safe[1], ok)
    # Without bounds nothing is checked: the previous behaviour.
    unbounded = SPEC.compile(6, 3, OBS, ACT)
    _, report = fast_shield(unbounded, np.asarray([0, 150, 50, 0, 0, 0], np.float32), ok, prev)
    assert int(report.status) == 0


def test_observation_bounds_are_checked_at_compile_time():
    with pytest.raises(ConstraintSpecError, match="observation_bounds: low has shape"):
        SPEC.compile(6, 3, OBS, ACT, observation_bounds=([0.0] * 5, [1.0] * 6))
    with pytest.raises(ConstraintSpecError, match=r"low is above high at features \[2\]"):
        SPEC.compile(6, 3, OBS, ACT, observation_bounds=([0, 0, 2, 0, 0, 0], [1] * 6))
    with pytest.raises(ConstraintSpecError, match="NaN"):
        SPEC.compile(6, 3, OBS, ACT, observation_bounds=([math.nan] * 6, [1] * 6))
    # Rounded outwards to float32: a reading exactly at the declared bound passes.
    compiled = SPEC.compile(6, 3, OBS, ACT, observation_bounds=([0.1] * 6, [0.3] * 6))
    assert float(compiled.observation_low[0]) <= 0.1 <= 0.3 <= float(compiled.observation_high[0])


def test_a_task_compiles_its_physical_bounds():
    task = Task.from_env("IB-v0")
    compiled = task.compile_constraints()
    np.testing.assert_array_equal(
        compiled.observation_low, np.asarray(task.observation_low, np.float32)
    )
    np.testing.assert_array_equal(
        compiled.observation_high, np.asarray(task.observation_high, np.float32)
    )
