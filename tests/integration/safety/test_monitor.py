"""SafetyMonitor on real shield reports."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from neorl_industrial.core.environments import make
from neorl_industrial.core.safety import shield
from neorl_industrial.integration.safety import SafetyMonitor, host_report

ENV, _ = make("IB-v0")
CONSTRAINTS = ENV.compile_constraints()
NAMES = CONSTRAINTS.names
# Row 0: too fast (projected); row 1: fine; row 2: NaN (fallback, invalid); row 3: on the
# bounds exactly (margin 0, kept).
PROPOSED = np.array([[2, 0, 0], [0, 0, 0], [np.nan, 0, 0], [-1, 1, 0]], np.float32)
OBSERVATIONS = np.zeros((4, ENV.observation_size), np.float32)


def _report(observations=OBSERVATIONS, proposed=PROPOSED):
    prev = np.zeros(proposed.shape, np.float32)
    return shield(CONSTRAINTS, observations, proposed, prev)[1]


def test_a_batch_is_counted_exactly():
    monitor = SafetyMonitor(NAMES)
    monitor.observe(_report())
    summary = monitor.summary()
    assert {k: summary[k] for k in ("decisions", "overrides", "projected", "fallback")} == {
        "decisions": 4,
        "overrides": 2,
        "projected": 1,
        "fallback": 1,
    }
    assert (summary["invalid"], summary["infeasible"]) == (1, 0)
    assert summary["override_rate"] == monitor.override_rate == 0.5
    per = monitor.per_constraint()
    assert per == summary["constraints"]
    assert [per[name]["violations"] for name in NAMES] == [2, 0, 0, 2, 0, 0, 2]
    velocity = per["bounds/velocity"]  # margins -1, 1, NaN, 0: NaN left out
    assert velocity["margin_count"] == 3
    assert velocity["margin_min"] == pytest.approx(-1.0)
    assert velocity["margin_mean"] == pytest.approx(0.0)
    assert per["bounds/gain"]["margin_count"] == 4
    assert per["bounds/gain"]["margin_mean"] == pytest.approx(0.75)
    # A state-conditional limit that never applied: +inf margins, no statistics.
    inactive = per["no-velocity-decrease-when-fatigued"]
    assert inactive == {
        "violations": 0,
        "violations_after": 0,
        "margin_min": None,
        "margin_mean": None,
        "margin_count": 0,
    }
    # The shield repaired every proposal: the applied actions break nothing.
    assert host_report(_report(), len(NAMES)).violated_after.any() == np.False_
    assert all(per[name]["violations_after"] == 0 for name in NAMES)


def test_single_reports_and_batches_add_up():
    monitor = SafetyMonitor(NAMES)
    for row in range(4):
        single = shield(CONSTRAINTS, OBSERVATIONS[row], PROPOSED[row], np.zeros(3, np.float32))[1]
        monitor.observe(single, policy_version="v1")
    monitor.observe(_report(), policy_version="v2")
    summary = monitor.summary()
    assert summary["decisions"] == 8 and summary["overrides"] == 4
    assert summary["overrides_by_policy_version"] == {"v1": 2, "v2": 2}
    assert summary["constraints"]["bounds/velocity"]["violations"] == 4


def test_several_leading_axes():
    report = _report(OBSERVATIONS.reshape(2, 2, -1), PROPOSED.reshape(2, 2, 3))
    assert host_report(report, len(NAMES)).batch_shape == (2, 2)
    monitor = SafetyMonitor(NAMES)
    monitor.observe(report)
    assert (monitor.decisions, monitor.overrides) == (4, 2)


def test_the_summary_is_strict_json_and_reset_forgets():
    monitor = SafetyMonitor(NAMES)
    nan_observations = np.full_like(OBSERVATIONS, np.nan)
    monitor.observe(_report(nan_observations))  # NaN margins wherever the state matters
    assert monitor.per_constraint()["limit-joint-velocity-gain-push"]["margin_min"] is None
    monitor.observe(_report())
    text = json.dumps(monitor.summary(), allow_nan=False)
    assert json.loads(text)["decisions"] == 8
    monitor.reset()
    empty = monitor.summary()
    assert empty["decisions"] == 0 and empty["override_rate"] == 0.0
    assert empty["constraints"]["bounds/velocity"]["margin_min"] is None
    json.dumps(empty, allow_nan=False)


def test_a_report_of_other_constraints_is_rejected():
    monitor = SafetyMonitor(NAMES[:3])
    with pytest.raises(ValueError, match=r"7 constraint columns, the monitor knows 3"):
        monitor.observe(_report())
    assert monitor.decisions == 0


def test_a_host_report_with_plain_fields_is_accepted():
    report = SimpleNamespace(
        overridden=np.array([True, False]),
        projected=np.array([True, False]),
        fallback=np.array([False, False]),
        invalid=np.array([False, False]),
        infeasible=np.array([False, False]),
        violated=np.array([[True], [False]]),
        margin=np.array([[-2.0], [np.inf]]),
        violated_after=np.array([[True], [False]]),
    )
    monitor = SafetyMonitor(["limit"])
    monitor.observe(report)
    assert monitor.per_constraint()["limit"] == {
        "violations": 1,
        "violations_after": 1,
        "margin_min": -2.0,
        "margin_mean": -2.0,
        "margin_count": 1,
    }
    report.fallback = np.array([False])  # flags of another batch than the margins
    with pytest.raises(ValueError, match="do not line up"):
        monitor.observe(report)


def test_totals_are_exact_under_threads():
    report = _report()
    monitor = SafetyMonitor(NAMES)
    start = threading.Barrier(8)

    def work() -> None:
        start.wait()
        for _ in range(100):
            monitor.observe(report, policy_version="v")

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    summary = monitor.summary()
    assert summary["decisions"] == 8 * 100 * 4
    assert summary["overrides"] == summary["overrides_by_policy_version"]["v"] == 8 * 100 * 2
    assert summary["constraints"]["bounds/velocity"]["margin_count"] == 8 * 100 * 3
    assert summary["constraints"]["bounds/velocity"]["violations"] == 8 * 100 * 2


def test_invalid_observations_are_counted():
    low = np.full(ENV.observation_size, -np.inf, np.float32)
    high = np.full(ENV.observation_size, np.inf, np.float32)
    low[0], high[0] = 0.0, 100.0
    bounded = CONSTRAINTS.replace(observation_low=low, observation_high=high)
    observations = np.zeros((4, ENV.observation_size), np.float32)
    observations[1, 0] = 150.0  # outside the feature's physical bounds
    observations[3, 0] = np.nan
    prev = np.zeros(PROPOSED.shape, np.float32)
    monitor = SafetyMonitor(NAMES)
    monitor.observe(shield(bounded, observations, PROPOSED, prev)[1])
    summary = monitor.summary()
    assert summary["invalid_observation"] == 2
    assert summary["fallback"] == 3  # rows 1 and 3, and the NaN proposal of row 2
    assert monitor.overrides == 4
    plain = SimpleNamespace(
        overridden=np.zeros(2, bool),
        projected=np.zeros(2, bool),
        fallback=np.zeros(2, bool),
        invalid=np.zeros(2, bool),
        infeasible=np.zeros(2, bool),
        violated=np.zeros((2, len(NAMES)), bool),
        margin=np.zeros((2, len(NAMES))),
    )
    # Reports from before the observation check have no such flag: counted as zero.
    assert host_report(plain, len(NAMES)).invalid_observation.tolist() == [False, False]
    assert host_report(plain, len(NAMES)).violated_after is None
    assert SafetyMonitor(NAMES).summary()["out_of_distribution"] == 0


def test_rows_observed_one_at_a_time_count_as_one_batch():
    """A server observes one row per request; the monitor holds rows and counts them in
    one pass (past PENDING_ROWS, when the version changes, and when read), which must
    give what observing them as one batch gives."""
    from neorl_industrial.integration.safety.monitor import PENDING_ROWS

    rng = np.random.default_rng(0)
    rows = PENDING_ROWS + 40  # past one flush of the buffer
    proposed = rng.uniform(-2.0, 2.0, (rows, 3)).astype(np.float32)
    proposed[::7, 0] = np.nan
    observations = np.zeros((rows, ENV.observation_size), np.float32)
    report = _report(observations, proposed)
    batched = SafetyMonitor(NAMES)
    batched.observe(report, policy_version="v1")
    batched.observe(_report(), policy_version="v2")
    single = SafetyMonitor(NAMES)
    for row in range(rows):
        single.observe(
            SimpleNamespace(
                status=np.asarray(report.status)[row : row + 1],
                margin=np.asarray(report.margin)[row : row + 1],
                applied_margin=np.asarray(report.applied_margin)[row : row + 1],
            ),
            policy_version="v1",
        )
        if row == 10:  # a read between observations counts what is held
            assert single.decisions == 11
    single.observe(_report(), policy_version="v2")  # another version: counted apart
    one, other = single.summary(), batched.summary()
    # Margin sums in another order: equal up to rounding.
    one_constraints, other_constraints = one.pop("constraints"), other.pop("constraints")
    assert one == other
    assert one["decisions"] == rows + 4 and one["overrides_by_policy_version"]["v2"] == 2
    for name in NAMES:
        for field, value in one_constraints[name].items():
            expected = other_constraints[name][field]
            assert value == (expected if expected is None else pytest.approx(expected)), field
