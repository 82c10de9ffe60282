"""The verdict on a plant log with no simulator, where the truth is known (the log's
heater follows ``T' = 0.8 T + 0.2 (300 + valve) + noise``): a clearly better controller
is recommended, a policy no better than the operators is not, the model reproduces the
operators' logged return (calibration) and its improvement intervals hold the true
improvements, pessimism lowers a policy that leaves the data, a model that does not
reproduce today's operation carries no recommendation, and a learned cost the operators
never tripped gets an exact bound."""

from __future__ import annotations

import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from neorl_industrial.wrappers.training.selection import verdict_ranking
from neorl_industrial.wrappers.training.verdict import (
    KEEP,
    PlantRules,
    VerdictCandidates,
    VerdictError,
    VerdictSettings,
    evaluation_starts,
    merge_verdicts,
    model_verdict,
)
from neorl_industrial.wrappers.training.verdict_results import interval_text
from tests.wrappers.training.heater_plant import act, fitted_plant, write_csv

SCHEMA = """\
name: heater-verdict
timestamp: time
sampling_period: 60
observations:
  - {column: temperature, unit: degC, bounds: [0, 500]}
actions:
  - {column: valve, unit: "%", bounds: [0, 100]}
reward: -abs(temperature - 350) - 0.01 * valve
costs:
  - {name: overheating, expression: "max(temperature - 365, 0)", limit: 5.0}
  - {name: alarm}
"""
OPERATOR_NOISE = 8.0


def heater_step(t, v, rng):
    return 0.8 * t + 0.2 * (300 + v) + rng.normal(0, 0.5)


def write_log(path, episodes: int, steps: int, seed: int = 0):
    """The operators: ``valve = 50 + 0.8 (350 - T) + N(0, 8)``; an alarm column (learned,
    it never fires in this log's range)."""
    rng = np.random.default_rng(seed)
    seconds, temperature, valve = [], [], []
    stamp = 0
    for _ in range(episodes):
        t = rng.uniform(335, 365)
        for _ in range(steps + 1):
            v = float(np.clip(50 + 0.8 * (350 - t) + rng.normal(0, OPERATOR_NOISE), 0, 100))
            seconds.append(stamp)
            temperature.append(t)
            valve.append(v)
            t = heater_step(t, v, rng)
            stamp += 60
        stamp += 3600
    columns = {"temperature": temperature, "valve": valve, "alarm": np.zeros(len(seconds))}
    write_csv(path, seconds, columns)


NAMES = ["controller", "biased", "full-open"]
CANDIDATES = {"gain": jnp.asarray([0.8, 0.8, 0.0]), "bias": jnp.asarray([0.0, 8.0, 50.0])}


def true_discounted_return(valve, starts, steps, noise, seed=0, discount=0.99):
    """The heater's true discounted return from ``starts`` when the valve is set to
    ``valve(T) + N(0, noise)``, by simulation (the truth the log came from)."""
    rng = np.random.default_rng(seed)
    total = 0.0
    for start in starts:
        t, value = float(start), 0.0
        for step in range(steps):
            v = float(np.clip(valve(t) + rng.normal(0, noise), 0, 100))
            value += discount**step * (-abs(t - 350) - 0.01 * v)
            t = heater_step(t, v, rng)
        total += value
    return total / len(starts)


def linear(gain, bias):
    return lambda t: 50 + gain * (350 - t) + bias


@pytest.fixture(scope="module")
def plant(tmp_path_factory):
    return fitted_plant(
        tmp_path_factory.mktemp("heater"),
        SCHEMA,
        lambda path: write_log(path, episodes=30, steps=40),
    )


def verdict_of(
    plant, params=CANDIDATES, names=NAMES, limits=(5.0, np.inf), selection=None, **settings
):
    settings = {"fqe": False, "horizon": 40, "bootstrap": 500, "bc_updates": 500} | settings
    return model_verdict(
        VerdictCandidates(names, act, params),
        plant["heldout"],
        plant["model"],
        PlantRules(plant["scaler"], cost_limits=limits, cost_names=plant["task"].cost_names),
        VerdictSettings(**settings),
        selection=selection,
    )


@pytest.fixture(scope="module")
def full(plant):
    """All three estimators (FQE and the behaviour clone briefly trained)."""
    return verdict_of(plant, fqe=True, fqe_updates=400, bc_updates=400)


def estimate(verdict, name, estimator):
    candidate = next(c for c in verdict.candidates if c["name"] == name)
    return next(e for e in candidate["estimates"] if e["estimator"] == estimator)


def test_the_truth_says_the_controller_beats_the_operators(plant):
    starts = np.asarray(plant["heldout"].initial_observations())[:, 0]
    operators = true_discounted_return(linear(0.8, 0.0), starts, 40, OPERATOR_NOISE)
    assert true_discounted_return(linear(0.8, 0.0), starts, 40, 0.0) > operators + 5
    assert true_discounted_return(linear(0.8, 8.0), starts, 40, 0.0) < operators - 5
    assert true_discounted_return(linear(0.0, 50.0), starts, 40, 0.0) < operators - 100


def test_a_clearly_better_controller_is_recommended_by_every_deciding_estimator(full):
    assert full.decision == "recommend" and full.recommended == "controller"
    assert full.estimators == ("model", "fqe", "model+fqe")
    # model+fqe decides only where it reproduces the operators' logged return itself:
    # briefly trained FQE of a 40-step log does not (it values the infinite horizon).
    closing = full.calibration.closing_error
    assert full.calibration.closing_passed is False and closing.upper < -full.calibration.tolerance
    assert full.deciding == ("model",)
    assert "model+fqe does not reproduce it" in full.statement
    for estimator in full.deciding:
        assert estimate(full, "controller", estimator)["improvement"]["lower"] > 0
    assert full.statement.startswith("Recommend controller")
    # One form everywhere: labelled estimates, estimators named, JSON as it is.
    data = json.loads(json.dumps(full.to_dict()))
    assert data["kind"] == "estimate" and data["recommended"] == "controller"
    metrics = full.metrics()
    assert metrics["verdict/recommend"] == 1.0
    assert metrics["verdict/recommended_candidate"] == 0.0
    assert metrics["verdict/candidate_0/model/improvement_lower"] > 0
    assert 0.0 <= metrics["verdict/candidate_0/model/far_outside_share"] <= 0.25
    assert "verdict/candidate_2/model_fqe/improvement_upper" in metrics


def test_one_candidate_is_selected_on_the_training_episodes_and_only_it_is_tested(plant):
    """Given the episodes the candidates were trained on, the verdict selects one on them
    alone by the test's predicted result (the Seldonian way), and only it can be
    recommended; the others say so, and their held-out estimates are unchanged."""
    train = np.asarray(plant["model"].card["dataset"]["train_episodes"])
    training = plant["dataset"].select_episodes(train)
    selected, plain = verdict_of(plant, selection=training), verdict_of(plant)
    evidence = selected.evidence["selection"]
    assert evidence["chosen"] == "controller" and evidence["by"] == "model"
    assert evidence["episodes"] >= evidence["test_episodes"] > 0
    assert plain.evidence["selection"] is None
    assert selected.decision == "recommend" and selected.recommended == "controller"
    assert "controller was selected on the training episodes before the test" in (
        selected.statement
    )
    rows = {row["name"]: row for row in selected.candidates}
    best = rows["controller"]["selection"]
    assert best["selected"] is True and best["within_limits"] is True
    for name in ("biased", "full-open"):
        assert rows[name]["selection"]["selected"] is False
        assert rows[name]["selection"]["predicted_lower"] < best["predicted_lower"]
        assert any(reason.startswith("selection:") for reason in rows[name]["reasons"])
    # Opening the valve fully overheats the heater: predicted over its limit on the
    # training episodes too.
    assert rows["full-open"]["selection"]["within_limits"] is False
    # Every candidate's held-out estimates are still there, and tell the same story
    # (the model noise is drawn over more starts, so the numbers differ a little).
    for ours, theirs in zip(selected.candidates, plain.candidates, strict=True):
        mine = next(e for e in ours["estimates"] if e["estimator"] == "model")
        other = next(e for e in theirs["estimates"] if e["estimator"] == "model")
        assert np.sign(mine["improvement"]["value"]) == np.sign(other["improvement"]["value"])
    # The test is made for the selected candidate alone: had the training episodes
    # predicted "biased" best, nothing would be recommended, although the controller
    # passes the test (a merged table selects again).
    swapped = [
        row | {"selection": row["selection"] | {"predicted_lower": 1e9}}
        if row["name"] == "biased"
        else row
        for row in selected.candidates
    ]
    again = merge_verdicts([dataclasses.replace(selected, candidates=tuple(swapped))])
    assert again.decision == KEEP and again.evidence["selection"]["chosen"] == "biased"
    assert again.statement.startswith(
        "Keep the current operation: biased, the candidate selected on the training episodes"
    )
    controller = next(row for row in again.candidates if row["name"] == "controller")
    assert not controller["qualifies"]
    assert [r for r in controller["reasons"] if not r.startswith("selection:")] == []
    assert verdict_ranking(again.to_dict())[0] == "biased"


def test_policies_no_better_than_the_operators_are_not_recommended(full, plant):
    for name in ("biased", "full-open"):
        candidate = next(c for c in full.candidates if c["name"] == name)
        assert not candidate["qualifies"] and candidate["reasons"]
        assert estimate(full, name, "model")["improvement"]["upper"] < 0
    full_open = next(c for c in full.candidates if c["name"] == "full-open")
    assert any("overheating" in reason for reason in full_open["reasons"])
    # Asked to predict outside its data (the heater at 400 degC), the model says so; most
    # of its steps lie far outside, where the data cannot answer for it.
    assert "outside the range of its data" in full_open["warnings"][0]
    assert estimate(full, "full-open", "model")["far_outside_share"] > 0.25
    assert any(reason.endswith("the data cannot answer for it") for reason in full_open["reasons"])
    # Nothing logged bounds how bad it is there: no lower bound, null in the report, no
    # metric for it, and no second reason about a bound it does not have.
    far = estimate(full, "full-open", "model")
    assert far["improvement"]["lower"] == -np.inf and far["discounted_return"]["lower"] == -np.inf
    assert np.isfinite(far["improvement"]["upper"]) and far["improvement"]["upper"] < 0
    assert not any("model: the lower" in reason for reason in full_open["reasons"])
    report = json.loads(json.dumps(full.to_dict(), allow_nan=False))
    row = next(c for c in report["candidates"] if c["name"] == "full-open")
    assert row["estimates"][0]["improvement"]["lower"] is None
    index = [c["name"] for c in report["candidates"]].index("full-open")
    metrics = full.metrics()
    assert f"verdict/candidate_{index}/model/improvement_lower" not in metrics
    assert f"verdict/candidate_{index}/model/improvement_upper" in metrics
    ranking = verdict_ranking(report)
    assert ranking.index("full-open") > ranking.index("controller")
    assert interval_text(row["estimates"][0]["improvement"]).split("[")[1].startswith("no bound")
    controller = next(c for c in full.candidates if c["name"] == "controller")
    assert estimate(full, "controller", "model")["far_outside_share"] <= 0.25
    assert not any("cannot answer" in reason for reason in controller["reasons"])
    # Without the controller the answer is the current operation, said plainly.
    worse = verdict_of(plant, {k: v[1:] for k, v in CANDIDATES.items()}, NAMES[1:])
    assert worse.decision == KEEP and worse.recommended is None
    assert worse.statement.startswith("Keep the current operation")


def test_the_logged_operation_is_estimated_near_its_logged_return(full):
    model = full.behaviour["estimates"][0]
    assert model["estimator"] == "model"
    logged = full.behaviour["logged_discounted_return"]
    assert abs(model["discounted_return"]["value"] - logged) < 0.25 * abs(logged)


def test_pessimism_lowers_a_policy_that_leaves_the_data(plant):
    pessimistic = verdict_of(plant)
    trusting = verdict_of(plant, penalty=0.0)
    lowered = {
        name: estimate(trusting, name, "model")["discounted_return"]["value"]
        - estimate(pessimistic, name, "model")["discounted_return"]["value"]
        for name in NAMES
    }
    assert estimate(pessimistic, "full-open", "model")["outside_data_share"] > 0.5
    assert estimate(pessimistic, "controller", "model")["outside_data_share"] < 0.1
    assert lowered["full-open"] > 10 * max(lowered["controller"], 1e-6)
    assert lowered["controller"] >= 0


def test_a_learned_cost_the_operators_never_tripped_gets_an_exact_bound(plant):
    verdict = verdict_of(plant, limits=(5.0, 1.0))  # alarm: learned, no event held out
    steps = plant["heldout"].n_transitions
    # Clopper-Pearson for 0 alarms in the held-out steps (97.5 %: the 95 % interval's
    # upper end), an alarm being 1 a step, over the 40 steps an episode lasts.
    expected = float(scipy.stats.beta.ppf(0.975, 1, steps)) * 1.0 * 40
    cost = next(
        c for c in estimate(verdict, "controller", "model")["costs"] if c["channel"] == "alarm"
    )
    assert cost["evidence"] == "exact bound" and cost["events"] == 0
    assert cost["event_bound"] == pytest.approx(expected, rel=1e-6)
    assert 0.3 < expected < 1.0 and cost["within_limit"] is True
    assert cost["value"]["upper"] == pytest.approx(expected / 1.0, abs=1e-3)
    assert verdict.decision == "recommend" and verdict.recommended == "controller"
    # A limit below the bound: no recommendation, the bound named.
    strict = verdict_of(plant, limits=(5.0, 0.5 * expected))
    assert strict.decision == KEEP
    controller = next(c for c in strict.candidates if c["name"] == "controller")
    assert any(
        "'alarm' may exceed its limit" in r and f"0 events in {steps} held-out steps" in r
        for r in controller["reasons"]
    )
    # The computed channel needs no events: the model computes it from the temperature.
    overheating = estimate(verdict, "controller", "model")["costs"][0]
    assert overheating["evidence"] == "computed" and overheating["within_limit"] is True
    assert overheating["event_bound"] is None
    assert verdict.evidence["cost_events"] == {"overheating": 0, "alarm": 0}


def test_the_model_reproduces_the_operators_logged_return_and_says_so(full):
    calibration = full.calibration
    assert calibration.status == "passed" and calibration.reason is None
    assert calibration.logged.value == pytest.approx(full.behaviour["logged_discounted_return"])
    assert calibration.error.lower <= 0.0 <= calibration.error.upper
    assert abs(calibration.estimated.value - calibration.logged.value) < 0.1 * abs(
        calibration.logged.value
    )
    assert calibration.model_error == max(-calibration.error.lower, calibration.error.upper)
    assert "Calibration passed: the plant model estimates today's operation at" in full.statement
    data = full.to_dict()["calibration"]
    assert data["status"] == "passed" and data["episodes"] == full.evidence["start_episodes"]
    metrics = full.metrics()
    assert metrics["verdict/calibration/passed"] == 1.0
    assert metrics["verdict/calibration/logged"] == pytest.approx(calibration.logged.value)
    # The operators' model estimate is the one the calibration holds against the log: its
    # pessimism is the measured error (the allowance), not the members' disagreement.
    operators = full.behaviour["estimates"][0]
    assert operators["estimator"] == "model" and operators["penalty"] == 0.0
    assert operators["discounted_return"]["value"] == pytest.approx(
        calibration.estimated.value, rel=1e-5
    )
    for estimate in full.candidates[0]["estimates"]:
        if estimate["estimator"] == "model":
            assert estimate["allowance"] >= calibration.model_error
    assert "cloned" in full.behaviour["how"]


def test_the_improvement_intervals_hold_the_true_improvements(full, plant):
    heldout = plant["heldout"]
    rows, _ = evaluation_starts(heldout, 100)
    lengths = np.minimum(np.asarray(heldout.steps_to_end)[rows], 40)
    starts = np.asarray(heldout.observations_at(heldout.observation_index[jnp.asarray(rows)]))

    def truth(valve, noise, repeats):
        values = [
            true_discounted_return(valve, [start[0]], int(length), noise, seed=r)
            for start, length in zip(starts, lengths, strict=True)
            for r in range(repeats)
        ]
        return float(np.mean(values))

    operators = truth(linear(0.8, 0.0), OPERATOR_NOISE, 4)
    for name, (gain, bias) in zip(NAMES, [(0.8, 0.0), (0.8, 8.0), (0.0, 50.0)], strict=True):
        true = truth(linear(gain, bias), 0.0, 1) - operators
        for estimator in full.deciding:
            interval = estimate(full, name, estimator)["improvement"]
            assert interval["lower"] <= true <= interval["upper"], (name, estimator, true)


def test_the_model_interval_says_what_widened_it(full):
    """The improvement interval is the plain paired difference widened by the pessimism
    and the calibration allowance; each part is reported, so a lower bound below 0 can
    be read back to what put it there."""
    for name in NAMES:
        model = estimate(full, name, "model")
        paired, improvement = model["paired"], model["improvement"]
        assert paired["lower"] <= model["improvement"]["value"] <= paired["upper"]
        assert paired["value"] == pytest.approx(improvement["value"])
        assert model["allowance"] >= full.calibration.model_error
        # Same bootstrap draws: the pessimistic reading lies below the plain difference.
        assert improvement["lower"] <= paired["lower"] - model["allowance"] + 1e-9
        assert improvement["upper"] >= paired["upper"] + model["allowance"] - 1e-9
        assert model["member_spread"] >= 0.0


def test_a_model_that_does_not_reproduce_todays_operation_carries_no_recommendation(plant):
    class Drifting:
        """The fitted model with the temperature's change shifted by 2 degC a step."""

        fitted, dynamics, card = True, plant["model"].dynamics, plant["model"].card

        def params(self, seed=0):
            params = plant["model"].params(seed)
            return params.replace(target_mean=params.target_mean.at[0].add(2.0))

    verdict = model_verdict(
        VerdictCandidates(NAMES, act, CANDIDATES),
        plant["heldout"],
        Drifting(),
        PlantRules(plant["scaler"], cost_limits=(5.0, np.inf), cost_names=plant["task"].cost_names),
        VerdictSettings(fqe=False, horizon=40, bootstrap=200, bc_updates=500),
    )
    calibration = verdict.calibration
    assert calibration.status == "failed" and verdict.decision == KEEP
    assert calibration.estimated.value < calibration.logged.value - calibration.tolerance
    assert verdict.statement.startswith(
        "Keep the current operation: the plant model does not reproduce today's operation "
        f"(estimated {calibration.estimated.value:.4g}, logged {calibration.logged.value:.4g})"
    )
    assert all(f"calibration: {calibration.reason}" in c["reasons"] for c in verdict.candidates)


def test_bad_settings_and_candidates_are_refused(plant):
    with pytest.raises(VerdictError, match="names: 2 names for 3 candidates"):
        verdict_of(plant, names=NAMES[:2])
    with pytest.raises(VerdictError, match="horizon: expected a positive integer"):
        VerdictSettings(horizon=0)
    with pytest.raises(VerdictError, match="far_outside: expected spreads >= 0"):
        VerdictSettings(far_outside=-1.0)
    with pytest.raises(VerdictError, match=r"max_far_share: expected a share in \[0, 1\]"):
        VerdictSettings(max_far_share=1.5)


def test_starts_from_too_few_episodes_carry_no_recommendation(plant):
    few = plant["heldout"].select_episodes(np.arange(2))
    verdict = model_verdict(
        VerdictCandidates(NAMES, act, CANDIDATES),
        few,
        plant["model"],
        PlantRules(plant["scaler"], cost_limits=(5.0, np.inf), cost_names=plant["task"].cost_names),
        VerdictSettings(fqe=False, horizon=40, bootstrap=200, bc_updates=500),
    )
    assert verdict.decision == KEEP and verdict.calibration.status == "too small"
    controller = next(c for c in verdict.candidates if c["name"] == "controller")
    said = (
        f"the held-out part is too small for the calibration check: {few.n_transitions} "
        "transitions in 2 episode(s), at least 3 episodes needed"
    )
    assert controller["reasons"][0] == f"calibration: {said} (hold out more episodes, or log more)"
    assert said in verdict.statement
