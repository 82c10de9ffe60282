"""The exact shield: the nearest action that keeps every rule that can be kept.

The cases a field test found (a projection refused in plant units, a keepable rule given
up for the held previous action), scale invariance, and a randomized check against an
independent solver (scipy's HiGHS LP for what can be kept, SLSQP for the nearest point)
over random specs; its large form (``-m slow``) decides over 100,000 times.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

from neorl_industrial.core.safety import ConstraintSpec, satisfies, shield
from neorl_industrial.wrappers.constraint_files import load_constraint_spec

from .random_shield import Structure, Verdict, decide, judge, nearest_excess, random_structure

MIXING_TANK = Path(__file__).resolve().parents[3] / "examples" / "mixing-tank"
fast_shield = jax.jit(shield)


def _heater_cooler(factor: float):
    """Actions in [0, 100], one rule heater + cooler <= 120 written ``factor`` times."""
    return ConstraintSpec.from_dict(
        {
            "action_bounds": {"heater": [0.0, 100.0], "cooler": [0.0, 100.0]},
            "linear": [
                {
                    "name": "budget",
                    "action": {"heater": factor, "cooler": factor},
                    "bound": 120.0 * factor,
                }
            ],
            "fallback": {"kind": "hold_previous"},
        }
    ).compile(1, 2, ("x",), ("heater", "cooler"))


def _decide(constraints, obs, action, prev):
    f32 = lambda v: np.asarray(v, np.float32)  # noqa: E731
    safe, report = fast_shield(constraints, f32(obs), f32(action), f32(prev))
    return np.asarray(safe), report


def test_an_over_budget_proposal_is_projected_in_plant_units_not_held():
    constraints = _heater_cooler(1.0)
    safe, report = _decide(constraints, [0.0], [60.0, 90.0], [40.82, 100.0])
    assert bool(report.projected) and not bool(report.fallback) and not bool(report.infeasible)
    assert bool(satisfies(constraints, np.zeros(1), safe, np.asarray([40.82, 100.0])))
    # The nearest point of heater + cooler <= 120 to (60, 90): 15 off each.
    np.testing.assert_allclose(safe, [45.0, 75.0], atol=5e-3)
    assert safe.sum() <= 120.0


def test_a_nan_proposal_gets_the_held_previous_action_projected():
    constraints = _heater_cooler(1.0)
    safe, report = _decide(constraints, [0.0], [np.nan, 90.0], [40.82, 100.0])
    assert bool(report.fallback) and bool(report.invalid) and not bool(report.infeasible)
    # (40.82, 100) moved to the rule: 10.41 off each.
    np.testing.assert_allclose(safe, [30.41, 89.59], atol=5e-3)
    assert not np.any(np.asarray(report.violated_after))


@pytest.mark.parametrize("factor", [0.01, 100.0])
def test_multiplying_a_rule_changes_nothing(factor):
    reference, _ = _decide(_heater_cooler(1.0), [0.0], [60.0, 90.0], [40.82, 100.0])
    scaled, report = _decide(_heater_cooler(factor), [0.0], [60.0, 90.0], [40.82, 100.0])
    assert bool(report.projected)
    np.testing.assert_allclose(scaled, reference, rtol=1e-5)


def test_the_mixing_tank_keeps_every_rule_by_raising_the_pump():
    # The tank's spec against its dataset card's names and physical ranges.
    spec = load_constraint_spec(MIXING_TANK / "constraints.yaml")
    constraints = spec.compile(
        3,
        2,
        ("level_m", "temperature_c", "inflow_m3h"),
        ("valve_pct", "pump_pct"),
        observation_bounds=([0.0, 0.0, 0.0], [3.2, 100.0, 80.0]),
    )
    obs, prev = [2.163, 85.822, 70.904], [94.68, 27.14]
    safe, report = _decide(constraints, obs, [93.47, 40.77], prev)
    assert not bool(report.infeasible) and not bool(report.fallback)
    assert bool(report.projected)
    assert not np.any(np.asarray(report.violated_after))
    # valve - pump <= 40 within the valve's rate limit: the nearest point in the actions'
    # ranges (100 for the valve, 90 for the pump) moves each by its range squared.
    assert safe[0] - safe[1] <= 40.0 and abs(safe[0] - prev[0]) <= 15.0
    step = (93.47 - 40.77 - 40.0) / (100.0**2 + 90.0**2)
    np.testing.assert_allclose(safe, [93.47 - step * 100.0**2, 40.77 + step * 90.0**2], atol=1e-2)


# One structure with every kind of rule on three priority levels (its numbers drawn per
# variant): one compiled program for the whole check.
RICH = Structure(
    n_actions=3,
    rated=(0, 2),
    rate_priority=(100, 300),
    states=((0, 1, True, True, 300), (1, 0, False, False, 200)),
    linear_priority=(200, 100, 300),
    linear_reads=(True, False, True),
    fallback="hold_previous",
)


@pytest.fixture(scope="module")
def rich_batch():
    return decide(RICH, np.random.default_rng(7), variants=16, per=20)


def test_no_decision_breaks_a_rule_that_can_be_kept(rich_batch):
    verdict = judge(rich_batch, Verdict())
    assert verdict.decisions == 320
    assert verdict.breaks == 0, verdict.examples
    assert verdict.false_infeasible == 0
    # The check saw every path: projections, fallbacks (NaN proposals among them), and
    # rules that contradict each other.
    status = rich_batch.status
    assert np.any(status & 2) and np.any(status & 8) and np.any(status & 16)


def test_a_projection_is_the_nearest_point(rich_batch):
    checked, worst = nearest_excess(rich_batch, limit=25)
    assert checked >= 10
    assert worst <= 1e-4


@pytest.mark.slow
def test_a_hundred_thousand_random_decisions_break_no_keepable_rule():
    rng = np.random.default_rng(2026)
    verdict = Verdict()
    while verdict.decisions < 100_000:
        judge(decide(random_structure(rng), rng, variants=64, per=256), verdict)
        print(f"{verdict.decisions} decisions, {verdict.breaks} breaks", flush=True)
    print(
        f"{verdict.decisions} decisions, {verdict.breaks} broke a keepable rule, "
        f"{verdict.thin} broke a rule keepable only by less than 1e-4 of the ranges, "
        f"{verdict.false_infeasible} flagged infeasible while keepable"
    )
    assert verdict.breaks == 0, verdict.examples
    assert verdict.false_infeasible == 0


@pytest.mark.slow  # (its compilation alone takes seconds)
def test_the_projection_alone_agrees_with_highs_at_sixteen_actions_and_six_rules():
    from scipy.optimize import linprog

    from neorl_industrial.core.safety.projection import iteration_cap, nearest

    rng = np.random.default_rng(3)
    rows, n, m = 2_000, 16, 6
    normals = (rng.normal(size=(m, n)) * rng.choice([0.01, 1.0, 100.0], (m, 1))).astype(np.float32)
    start = rng.uniform(-150.0, 150.0, (rows, n)).astype(np.float32)
    low = rng.uniform(-100.0, 0.0, (rows, n)).astype(np.float32)
    high = low + rng.uniform(5.0, 150.0, (rows, n)).astype(np.float32)
    rhs = (rng.uniform(-1, 1, (rows, m)) * 50 * np.abs(normals).sum(1)).astype(np.float32)
    width = np.full(n, 100.0, np.float32)
    x, found, steps = (
        np.asarray(v) for v in jax.jit(nearest)(start, low, high, normals, rhs, width)
    )
    cap = iteration_cap(n, m)
    assert 0.1 < found.mean() < 0.9
    # Solvable rows end far below the cap.
    assert steps[found].max() <= cap // 2
    for i in range(150):
        lp = linprog(
            np.zeros(n), A_ub=normals, b_ub=rhs[i], bounds=list(zip(low[i], high[i], strict=True))
        )
        assert (lp.status == 0) == bool(found[i]), i
        if found[i]:
            assert np.all(normals.astype(np.float64) @ x[i] <= rhs[i] + 1e-6 * np.abs(rhs[i]))
            assert np.all(x[i] >= low[i]) and np.all(x[i] <= high[i])
