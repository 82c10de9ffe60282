"""Which rule wins: priorities, the fallback that keeps the highest-priority rules that can
be kept, invalid sensors, and what the applied action still breaks (``violated_after``).

The property test checks the shield's output against an independent float64 oracle of
the same rules: for every priority level whose rules (with every rule above it) some
action keeps, the applied action keeps them.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neorl_industrial.core.safety import ConstraintSpec, shield

TOL = 1e-5
fast_shield = jax.jit(shield)


def _steam(rate_priority: int | None = None) -> ConstraintSpec:
    """A boiler: above 110 °C the steam valve stays at or below 20 %; the valve moves at
    most 10 % per step."""
    rate = 10.0 if rate_priority is None else {"max_change": 10.0, "priority": rate_priority}
    return ConstraintSpec.from_dict(
        {
            "action_bounds": {"steam": [0.0, 100.0]},
            "rate_limits": {"steam": rate},
            "state_limits": [
                {
                    "name": "steam-interlock",
                    "when": {"feature": "temperature", "above": 110.0},
                    "action": "steam",
                    "max": 20.0,
                }
            ],
            "fallback": {"kind": "hold_previous"},
        }
    )


def _run(spec, obs, action, prev, names=(("temperature",), ("steam",)), bounds=None):
    compiled = spec.compile(len(names[0]), len(names[1]), *names, observation_bounds=bounds)
    safe, report = fast_shield(
        compiled,
        np.asarray(obs, np.float32),
        np.asarray(action, np.float32),
        np.asarray(prev, np.float32),
    )
    broken = [
        n for n, v in zip(compiled.names, np.asarray(report.violated_after), strict=True) if v
    ]
    return np.asarray(safe), report, broken


def test_the_interlock_wins_over_the_rate_limit_by_default():
    # 112 °C with the valve at 50 %: no action keeps both rules.
    safe, report, broken = _run(_steam(), [112.0], [50.0], [50.0])
    np.testing.assert_allclose(safe, [20.0])
    assert bool(report.fallback) and bool(report.infeasible)
    assert broken == ["rate/steam"]
    # The proposal broke the interlock; the applied action breaks only the rate limit.
    assert list(np.asarray(report.violated)) == [False, False, True]
    assert float(report.applied_margin[1]) == pytest.approx(-20.0)


def test_a_rate_limit_written_above_the_interlock_moves_at_full_rate_to_the_safe_side():
    safe, report, broken = _run(_steam(rate_priority=400), [112.0], [50.0], [50.0])
    np.testing.assert_allclose(safe, [40.0])
    assert bool(report.infeasible)
    assert broken == ["steam-interlock"]


def test_a_nan_proposal_gets_the_same_prioritized_fallback():
    safe, report, broken = _run(_steam(), [112.0], [math.nan], [50.0])
    np.testing.assert_allclose(safe, [20.0])
    assert bool(report.invalid) and bool(report.fallback) and bool(report.infeasible)
    assert broken == ["rate/steam"]


def test_feasible_rules_keep_their_plain_behaviour():
    # 105 °C: the interlock is off; the proposal's 30 % jump is cut to the rate limit.
    safe, report, broken = _run(_steam(), [105.0], [80.0], [50.0])
    np.testing.assert_allclose(safe, [60.0])
    assert bool(report.projected) and not bool(report.infeasible)
    assert broken == []


TWO_SENSORS = ConstraintSpec.from_dict(
    {
        "action_bounds": {"steam": [0.0, 100.0], "feed": [0.0, 100.0]},
        "rate_limits": {"steam": 10.0},
        "state_limits": [
            {
                "name": "steam-interlock",
                "when": {"feature": "temperature", "above": 110.0},
                "action": "steam",
                "max": 20.0,
            }
        ],
        "linear": [
            {
                "name": "feed-by-pressure",
                "observation": {"pressure": 10.0},
                "action": {"feed": 1.0},
                "bound": 100.0,
            },
            {
                "name": "steam-by-temperature",
                "observation": {"temperature": 1.0},
                "action": {"steam": 1.0},
                "bound": 200.0,
            },
        ],
        "fallback": {"kind": "constant", "value": {"steam": 50.0, "feed": 90.0}},
    }
)
SENSORS = (("temperature", "pressure"), ("steam", "feed"))
PHYSICAL = ([0.0, 0.0], [500.0, 20.0])


@pytest.mark.parametrize("temperature", [math.nan, 900.0, -5.0])
def test_an_invalid_sensor_drops_only_the_rules_that_read_it(temperature):
    # The temperature sensor is broken; pressure reads 5 bar, so feed <= 50.
    safe, report, broken = _run(
        TWO_SENSORS, [temperature, 5.0], [30.0, 30.0], [25.0, 30.0], SENSORS, PHYSICAL
    )
    assert bool(report.invalid_observation) and bool(report.fallback)
    assert not bool(report.infeasible)
    # The interlock counts as on (the unsafe reading); the linear rule on pressure holds;
    # the rule on temperature cannot be checked and is reported.
    np.testing.assert_allclose(safe, [20.0, 50.0], atol=1e-3)
    assert broken == ["steam-by-temperature"]
    assert np.isnan(float(report.applied_margin[-1]))


def test_an_observation_outside_the_data_range_is_flagged_not_overridden():
    compiled = _steam().compile(1, 1, ("temperature",), ("steam",), data_bounds=([20.0], [105.0]))
    for temperature, flagged in ((80.0, False), (107.0, True), (math.nan, True)):
        safe, report = fast_shield(
            compiled,
            np.asarray([temperature], np.float32),
            np.asarray([55.0], np.float32),
            np.asarray([50.0], np.float32),
        )
        assert bool(report.out_of_distribution) == flagged
    # 107 °C: outside the data, inside physics: the proposal passes as it is.
    safe, report = fast_shield(
        compiled,
        np.asarray([107.0], np.float32),
        np.asarray([55.0], np.float32),
        np.asarray([50.0], np.float32),
    )
    assert float(safe[0]) == 55.0 and not bool(report.overridden)


# ----- the property ----------------------------------------------------------------------
# Two features (the first with a physical range [0, 100]) and two actions; every rule's
# numbers are traced leaves, so one compiled shield per priority assignment serves every
# example. The assignments put interlocks, linear and rate limits above each other in turn,
# and rules of different kinds on one level.
STRUCTURES = {
    "defaults": {},
    "rates-first": {"rate/action_0": 400, "rate/action_1": 400, "linear": 50},
    "shared-level": {
        "rate/action_0": 300,
        "state0": 300,
        "linear": 300,
        "state1": 100,
        "rate/action_1": 200,
    },
    "linear-first": {"linear": 500, "state0": 100, "state1": 100, "rate/action_0": 200},
}


def _structure(priorities: dict[str, int]) -> ConstraintSpec:
    def rate(action):
        key = f"rate/{action}"
        return {"max_change": 1.0, "priority": priorities[key]} if key in priorities else 1.0

    def extra(name):
        return {"priority": priorities[name]} if name in priorities else {}

    return ConstraintSpec.from_dict(
        {
            "action_bounds": {"action_0": [-1, 1], "action_1": [-1, 1]},
            "rate_limits": {"action_0": rate("action_0"), "action_1": rate("action_1")},
            "state_limits": [
                {
                    "name": "state0",
                    "when": {"feature": "observation_0", "above": 50.0},
                    "action": "action_0",
                    "min": -1.0,
                    "max": 1.0,
                    **extra("state0"),
                },
                {
                    "name": "state1",
                    "when": {"feature": "observation_1", "below": 0.0},
                    "action": "action_1",
                    "min": -1.0,
                    "max": 1.0,
                    **extra("state1"),
                },
            ],
            "linear": [
                {
                    "name": "linear",
                    "observation": {"observation_0": 0.01, "observation_1": 0.1},
                    "action": {"action_0": 1.0, "action_1": 1.0},
                    "bound": 1.0,
                    **extra("linear"),
                }
            ],
            "fallback": {"kind": "constant", "value": 0.0},
        }
    )


COMPILED = {
    name: _structure(priorities).compile(
        2, 2, observation_bounds=([0.0, -math.inf], [100.0, math.inf])
    )
    for name, priorities in STRUCTURES.items()
}


def _interval(draw, width):
    low = draw(st.floats(-3, 3, width=32, allow_subnormal=False))
    return low, low + draw(st.floats(0.0625, width, width=32, allow_subnormal=False))


@st.composite
def situations(draw):
    # No subnormal numbers: XLA:CPU computes with them flushed to zero and the float64
    # oracle does not, so a reading of -1e-40 at a bound of 0 is inside the bound for
    # the shield and outside for the oracle (a sensor reads no such value).
    name = draw(st.sampled_from(sorted(COMPILED)))
    base = COMPILED[name]
    bounds = [_interval(draw, 4) for _ in range(2)]
    states = [_interval(draw, 3) for _ in range(2)]
    one_sided = draw(st.sampled_from(["both", "min", "max"]))
    state_low = [s[0] if one_sided != "max" else -np.inf for s in states]
    state_high = [s[1] if one_sided != "min" else np.inf for s in states]
    constraints = base.replace(
        bound_low=jnp.asarray([b[0] for b in bounds], jnp.float32),
        bound_high=jnp.asarray([b[1] for b in bounds], jnp.float32),
        rate_limit=jnp.asarray(
            [draw(st.floats(0.0625, 2, width=32, allow_subnormal=False)) for _ in range(2)],
            jnp.float32,
        ),
        state_low=jnp.asarray(state_low, jnp.float32),
        state_high=jnp.asarray(state_high, jnp.float32),
        linear_obs=jnp.asarray(
            [
                [
                    draw(st.floats(-0.0625, 0.0625, width=32, allow_subnormal=False)),
                    draw(st.floats(-1, 1, width=32, allow_subnormal=False)),
                ]
            ],
            jnp.float32,
        ),
        linear_act=jnp.asarray(
            [
                [
                    draw(st.floats(-2, 2, width=32, allow_subnormal=False)),
                    draw(st.floats(-2, 2, width=32, allow_subnormal=False)),
                ]
            ],
            jnp.float32,
        ),
        linear_bound=jnp.asarray(
            [draw(st.floats(-3, 3, width=32, allow_subnormal=False))], jnp.float32
        ),
        fallback_value=jnp.asarray(
            [draw(st.floats(-4, 4, width=32, allow_subnormal=False)) for _ in range(2)], jnp.float32
        ),
    )
    obs = np.asarray(
        [
            draw(
                st.one_of(st.floats(-20, 120, width=32, allow_subnormal=False), st.just(math.nan))
            ),
            draw(st.floats(-5, 5, width=32, allow_subnormal=False)),
        ],
        np.float32,
    )
    action = np.asarray(
        [
            draw(st.one_of(st.floats(-4, 4, width=32, allow_subnormal=False), st.just(math.nan)))
            for _ in range(2)
        ],
        np.float32,
    )
    prev = np.asarray(
        [
            draw(st.one_of(st.floats(-3, 3, width=32, allow_subnormal=False), st.just(math.nan)))
            for _ in range(2)
        ],
        np.float32,
    )
    return constraints, obs, action, prev


def _rules(c, obs, prev):
    """Every hard rule in float64, in ``c.names`` order: ``(priority, kind, data)`` with
    kind ``box`` (action, low, high) or ``linear`` (coefficients, rhs; None when it reads
    an invalid sensor)."""
    supports = c.linear_support  # the features each constraint reads (static)
    c = jax.tree_util.tree_map(lambda leaf: np.asarray(leaf, np.float64), c)
    obs, prev = np.asarray(obs, np.float64), np.asarray(prev, np.float64)
    valid = np.isfinite(obs) & (obs >= c.observation_low) & (obs <= c.observation_high)
    rules = []
    for k, j in enumerate(c.bound_index):
        rules.append((math.inf, "box", (j, c.bound_low[k], c.bound_high[k])))
    for k, j in enumerate(c.rate_index):
        known = np.isfinite(prev[j])
        low = prev[j] - c.rate_limit[k] if known else -np.inf
        high = prev[j] + c.rate_limit[k] if known else np.inf
        rules.append((c.rate_priority[k], "box", (j, low, high)))
    for k, j in enumerate(c.state_action):
        f = c.state_feature[k]
        value = obs[f]
        passed = value > c.state_threshold[k] if c.state_above[k] else value < c.state_threshold[k]
        on = passed or not valid[f]
        low, high = (c.state_low[k], c.state_high[k]) if on else (-np.inf, np.inf)
        rules.append((c.state_priority[k], "box", (j, low, high)))
    for row in range(c.n_linear):
        support = list(supports[row])
        if not valid[support].all():
            rules.append((c.linear_priority[row], "linear", None))
            continue
        rhs = c.linear_bound[row] - math.fsum(c.linear_obs[row, i] * obs[i] for i in support)
        rules.append((c.linear_priority[row], "linear", (c.linear_act[row], rhs)))
    return rules


def _slack(rule, action) -> float:
    _, kind, data = rule
    if data is None:
        return math.nan
    if kind == "box":
        j, low, high = data
        return min(action[j] - low, high - action[j])
    coefficients, rhs = data
    return rhs - math.fsum(coefficients * action)


def _feasibility(rules, size) -> str:
    """``yes`` (with room to spare), ``no``, or ``edge`` (too close to tell in float32)."""
    low, high = np.full(size, -np.inf), np.full(size, np.inf)
    for _, kind, data in rules:
        if kind == "box":
            j, lo, hi = data
            low[j], high[j] = max(low[j], lo), min(high[j], hi)
    width = np.min(high - low)
    if width < -1e-3:
        return "no"
    if width < 1e-3:
        return "edge"
    verdict = "yes"
    for _, kind, data in rules:
        if kind == "linear":
            if data is None:
                continue  # left out: it reads an invalid sensor
            coefficients, rhs = data
            lowest = math.fsum(np.minimum(coefficients * low, coefficients * high))
            if lowest > rhs + 1e-3:
                return "no"
            if lowest > rhs - 1e-3:
                verdict = "edge"
    return verdict


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(situation=situations())
def test_no_higher_priority_rule_is_broken_when_an_action_keeps_it(situation):
    constraints, obs, action, prev = situation
    safe, report = fast_shield(constraints, obs, action, prev)
    safe = np.asarray(safe, np.float64)
    assert np.all(np.isfinite(safe))
    rules = _rules(constraints, obs, prev)
    slack = [_slack(rule, safe) for rule in rules]
    levels = sorted({priority for priority, _, _ in rules}, reverse=True)
    for level in levels:
        kept = [rule for rule in rules if rule[0] >= level]
        verdict = _feasibility(kept, constraints.action_size)
        if verdict != "yes":
            break
        for rule, value in zip(rules, slack, strict=True):
            if rule[0] >= level and rule[2] is not None:
                assert value >= -TOL, (constraints.names, level, slack, safe)
    # What the report says the applied action breaks is what it breaks.
    violated_after = np.asarray(report.violated_after)
    for name, value, flagged in zip(constraints.names, slack, violated_after, strict=True):
        if math.isnan(value):
            assert flagged, name  # reads an invalid sensor: cannot be checked
        elif abs(value + TOL) > 1e-5:
            assert bool(flagged) == (value < -TOL), (name, value)
    checkable_broken = any(value < -TOL - 1e-5 for value in slack if not math.isnan(value))
    if bool(report.infeasible):
        assert bool(report.fallback)
    if bool(report.fallback) and checkable_broken:
        assert bool(report.infeasible)
    if not bool(report.overridden):
        assert np.asarray(safe, np.float32).tobytes() == action.tobytes()


def test_describe_lists_each_constraint_s_priority():
    from neorl_industrial.core.safety import describe

    summary = describe(_steam(rate_priority=400).compile(1, 1, ("temperature",), ("steam",)))
    assert summary["priorities"] == {
        "bounds/steam": None,  # always holds
        "rate/steam": 400,
        "steam-interlock": 300,
    }
