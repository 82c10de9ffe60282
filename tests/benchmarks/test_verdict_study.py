"""The verdict study: its summary against the targets, its page, one act over the
candidates of several algorithms, bad options refused by name; and (slow) a tiny run in
which every estimator is ranked against the simulator's truth and the verdict's
recommendation is held against the behaviour's true return."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import verdict_study

TINY = [
    "--datasets",
    "CSTR-v0:medium",
    "--algorithms",
    "bc",
    "iql",
    "--trajectories",
    "10",
    "--seeds",
    "2",
    "--updates",
    "30",
    "--chunk",
    "30",
    "--hidden",
    "8",
    "--model-updates",
    "40",
    "--model-hidden",
    "8",
    "--fidelity-episodes",
    "2",
    "--horizon",
    "10",
    "--starts",
    "4",
    "--fqe-updates",
    "20",
    "--bootstrap",
    "50",
    "--episodes",
    "2",
    "--no-save",
]


@pytest.mark.slow
def test_every_candidate_is_estimated_and_held_against_the_truth():
    config, results = verdict_study.run_study(verdict_study.parse_args(TINY))
    (row,) = results["datasets"]
    # BC and IQL, two seeds each, judged in one program (each with its own act).
    assert len(row["candidates"]) == 4 and config["seeds"] == 2
    assert [c["configuration"] for c in row["candidates"]] == ["BC", "BC", "IQL", "IQL"]
    truth = np.asarray([c["true_return"] for c in row["candidates"]])
    for name in verdict_study.ESTIMATORS:
        ranking = row["ranking"][name]
        estimates = [c["estimates"][name]["value"] for c in row["candidates"]]
        assert ranking["chosen"] == int(np.argmax(estimates))
        assert ranking["regret"] == pytest.approx(truth.max() - truth[ranking["chosen"]])
        assert 0.0 <= ranking["regret_share"] <= 1.0
        assert ranking["rank_correlation"] is None or -1 <= ranking["rank_correlation"] <= 1
    outcome = row["verdict"]
    if outcome["decision"] == "recommend":
        chosen = next(c for c in row["candidates"] if c["name"] == outcome["recommended"])
        assert outcome["worse_than_behaviour"] == (
            chosen["true_return"] < row["behaviour"]["true_return"]
        )
    else:
        assert outcome["recommended"] is None and not outcome["bad"]
    fidelity = row["fidelity"]["simulator"]
    assert 0.0 <= fidelity["outside_data_share"] <= 1.0 and fidelity["steps"]
    assert set(results["summary"]["estimators"]) == set(verdict_study.ESTIMATORS)
    text = verdict_study.page(config, results)
    assert "| model |" in text and "CSTR-v0:medium" in text and "Model fidelity" in text


def _candidate(name, truth, model, cost=0.5, reasons=()):
    estimates = {
        estimator: {
            "value": model + shift,
            "improvement": {"value": 1.0, "lower": -1.0, "upper": 3.0},
        }
        for estimator, shift in zip(verdict_study.ESTIMATORS, (0.0, 1.0, 2.0), strict=True)
    }
    return {
        "name": name,
        "configuration": name.split(",")[0],
        "true_return": truth,
        "true_normalized_cost": cost,
        "estimates": estimates,
        "qualifies": not reasons,
        "reasons": list(reasons),
    }


def test_the_page_says_which_targets_were_met_and_what_the_verdict_did():
    kept = [
        "model+fqe: the lower 95% bound of the improvement over the logged operation is "
        "-0.5, not above 0",
        "model: cost 'T_high': insufficient evidence (0 cost events held out, 10 needed)",
    ]
    candidates = [
        _candidate("BC, seed 0", -30.0, -50.0),
        _candidate("IQL, seed 0", -10.0, -20.0),
        _candidate("IQL, seed 1", -12.0, -22.0, reasons=kept[:1]),
        _candidate("CQL, seed 0", -11.0, -21.0, reasons=kept),
        _candidate("CQL, seed 1", -31.0, -51.0, reasons=kept),  # truly worse: not counted
    ]
    fidelity = {"horizon": 10, "steps": {"1": {"relative_rmse": 0.1, "coverage": 0.9}}}
    row = {
        "dataset": "CSTR-v0:medium",
        "candidates": candidates,
        "ranking": {
            name: verdict_study._ranking(
                np.asarray([c["estimates"][name]["value"] for c in candidates]),
                np.asarray([c["true_return"] for c in candidates]),
            )
            for name in verdict_study.ESTIMATORS
        },
        "verdict": {
            "decision": "recommend",
            "recommended": "IQL, seed 0",
            "true_return": -10.0,
            "worse_than_behaviour": False,
            "over_cost_limit": False,
            "bad": False,
        },
        "behaviour": {"true_return": -29.0},
        "statement": "Recommend IQL, seed 0.",
        "truly_better_and_safe": 1,
        "fidelity": {
            "heldout": fidelity,
            "simulator": fidelity | {"outside_data_share": 0.4},
            "model_updates": 100,
        },
    }
    config = verdict_study.parse_args(["--quick"])
    config = {key: getattr(config, key) for key in verdict_study.CONFIG_KEYS}
    results = {"datasets": [row], "summary": verdict_study.summary([row]), "seconds": 60.0}
    text = verdict_study.page(config, results)
    assert "| model | 0.00 (met) | 0.00 (met) | 1.00 (met) |" in text
    assert "on **0** of 1 datasets (target 0: met)" in text
    assert "IQL, seed 0: -10 (-29)" in text and "1 of 5 (within limits)" in text
    assert (
        "Power: of the 1 datasets with a clearly better candidate (a true gain of at least "
        "25 % of the behaviour's |return|, cost within half of every limit), a truly better "
        "candidate was recommended on 1 (target 80 %: met)." in " ".join(text.split())
    )
    # Two truly better candidates kept: both by model+fqe's bound, one also by too few cost
    # events; the model alone would have let one of them through.
    assert "| CSTR-v0:medium | 2 | 0 | 2 | 0 | 1 | 0 | 0 | 0 | 0 | 1 |" in text
    reason = "calibration: the plant model does not reproduce today's operation"
    assert verdict_study._reason_kind(reason) == "calibration"
    reason = "selection: not the candidate selected on the training episodes (IQL, seed 0)"
    assert verdict_study._reason_kind(reason) == "not selected"
    far = (
        "model: 84% of this candidate's discounted steps lie more than 0.5 spreads outside "
        "the data the plant model was fitted on (at most 25%): the data cannot answer for it"
    )
    assert verdict_study._reason_kind(far) == "far outside"
    with pytest.raises(ValueError, match="does not know"):
        verdict_study._reason_kind("fqe: something the verdict never said")


def test_the_summary_counts_a_recommendation_worse_than_the_operators():
    def row(correlation, regret, bad, dataset):
        ranking = {"regret_share": regret, "rank_correlation": correlation}
        return {
            "dataset": dataset,
            "ranking": {"model": ranking},
            "verdict": {"decision": "recommend", "bad": bad},
            "behaviour": {"true_return": -2.0},
            "candidates": [
                {"true_return": 1.0, "true_normalized_cost": 0.5},
                {"true_return": 3.0, "true_normalized_cost": 0.9},
            ],
        }

    total = verdict_study.summary([row(0.9, 0.0, False, "a"), row(0.5, 0.3, True, "b")])
    model = total["estimators"]["model"]
    assert model["mean_regret"] == pytest.approx(0.15) and model["worst_regret"] == 0.3
    assert model["mean_correlation"] == pytest.approx(0.7)
    assert model["targets_met"] == {
        "mean_regret": False,
        "worst_regret": False,
        "mean_correlation": True,
    }
    assert total["bad_recommendations"] == 1 and not total["bad_target_met"]
    assert total["random_regret"] == pytest.approx(0.5)
    # Both have a clearly better candidate (+3 against -2, half the limit); the power
    # counts only the recommendation that is not worse or over a limit.
    assert total["power"] == {"datasets": ["a", "b"], "found": ["a"], "met": False}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--datasets", "CSTR-v0"], "--datasets: 'CSTR-v0' is neither ENV:QUALITY"),
        (["--plant-episodes", "3"], "--plant-episodes: expected at least 4, got 3"),
        (["--algorithms", "sac"], "--algorithms: unknown"),
        (["--seeds", "0"], "--seeds: expected a positive integer"),
        (["--history", "check:3"], "--history: expected rows such as 3, or check:1,3,10"),
        (["--history", "0"], "--history: expected rows such as 3, or check:1,3,10"),
    ],
)
def test_bad_options_are_refused_by_name(argv, message, capsys):
    with pytest.raises(SystemExit):
        verdict_study.parse_args(argv)
    assert message in capsys.readouterr().err


def test_the_history_option_fixes_the_rows_or_lets_the_check_choose_and_the_page_says_so():
    assert verdict_study.parse_args(["--history", "3"]).history == 3
    assert verdict_study.parse_args(["--history", "check:1,3,10"]).history == (1, 3, 10)
    check = {
        "horizon": 100,
        "margin": 0.1,
        "choice": 3,
        "rows": [
            {"history": 1, "long_horizon_error": 0.18},
            {"history": 3, "long_horizon_error": 0.08},
        ],
    }
    rows = [{"dataset": "fired-heater", "history_check": check}, {"dataset": "other"}]
    text = "\n".join(verdict_study._history_lines(rows))
    assert "open-loop error at 100 steps on the held-out episodes is within 10 % of" in text
    assert "- fired-heater: 1 row 0.18, 3 rows 0.08; chosen: **3**" in text
    assert "other" not in text
    assert verdict_study._history_lines([{"dataset": "other"}]) == []


def test_a_plant_log_is_imported_with_the_fixed_history_or_the_one_the_check_chose(
    tmp_path, monkeypatch
):
    """The plumbing around the fits (the fits themselves are the slow study's): a fixed
    history imports the log with it; ``check:`` imports it with the check's choice and
    reuses that history's model, after checking it was fitted on the same data."""
    from neorl_industrial.wrappers.models import history_check

    monkeypatch.setattr(
        verdict_study, "_fitted_model", lambda name, task, data, card, args: ("fitted", data)
    )
    args = verdict_study.parse_args(["--plant-episodes", "4", "--history", "3"])
    dataset, card, model, check = verdict_study._plant_model_with_history(
        "fired-heater", tmp_path / "fixed", args
    )
    assert dataset.frame_stack == 3 and model == ("fitted", dataset) and check is None
    assert card.task(dataset).observation_names[-1].endswith("@t-2")

    class Fitted:
        def __init__(self, history):
            self.history, self.checked = history, None

        def check_same_data(self, data):
            self.checked = data.frame_stack

    seen = []

    def compare(load, histories, settings, config, **options):
        seen.extend(load(history)[0].frame_stack for history in histories)
        assert options["keep_models"] and settings.max_updates == args.model_updates
        return {"choice": 10, "models": {h: Fitted(h) for h in histories}, "rows": []}

    monkeypatch.setattr(history_check, "compare_histories", compare)
    args = verdict_study.parse_args(["--plant-episodes", "4", "--history", "check:1,10"])
    dataset, _, model, check = verdict_study._plant_model_with_history(
        "fired-heater", tmp_path / "checked", args
    )
    assert seen == [1, 10] and dataset.frame_stack == 10
    assert model.history == 10 and model.checked == 10
    assert check["choice"] == 10 and "models" not in check


def test_the_truth_s_own_noise_bounds_the_rank_correlation_and_the_page_says_how_much():
    means = np.arange(10.0)
    clear = verdict_study._truth_ceiling(means, np.full(10, 0.01))
    assert clear["median"] == pytest.approx(1.0) and clear["low"] == pytest.approx(1.0)
    noisy = verdict_study._truth_ceiling(means, np.full(10, 5.0))
    assert noisy["low"] < noisy["median"] < 0.7 and noisy["high"] <= 1.0
    assert verdict_study._truth_ceiling(means, np.full(10, np.nan)) is None
    assert verdict_study._truth_ceiling(means[:2], np.ones(2)) is None
    rows = [
        {"dataset": "a", "truth_ceiling": noisy, "ranking": {"model": {"rank_correlation": 0.4}}},
        {"dataset": "b", "ranking": {}},
        {
            "dataset": "c",
            "truth_ceiling": clear | {"first_steps": {"100": 0.5, "300": 0.8}},
            "ranking": {"model": {"rank_correlation": 0.6}},
        },
    ]
    text = "\n".join(verdict_study._ceiling_lines(rows))
    assert f"a {noisy['median']:.2f} [" in text and "(model 0.40)" in text
    assert "c 1.00 [1.00, 1.00] (first 100 steps 0.50, first 300 steps 0.80, model 0.60)" in text
    assert "b " not in text
    assert verdict_study._ceiling_lines([{"dataset": "b", "ranking": {}}]) == []


def test_each_candidate_acts_with_its_own_algorithm():
    import jax
    import jax.numpy as jnp

    def linear(params, observation, key=None, deterministic=True):
        return jnp.tanh(params["w"] @ observation)

    def constant(params, observation, key=None, deterministic=True):
        return params["level"] + 0.0 * observation[:1]

    stacks = [
        {"w": jnp.asarray([[[1.0, 0.0]], [[0.0, 1.0]]])},  # two linear candidates
        {"level": jnp.asarray([[0.5], [-0.25], [0.75]])},  # three constant ones
    ]
    params = verdict_study.mixture_params(stacks)
    observation = jnp.asarray([0.3, -0.6])
    act = verdict_study.mixture_act([linear, constant])
    actions = jax.jit(jax.vmap(act, in_axes=(0, None)))(params, observation)
    expected = [np.tanh(0.3), np.tanh(-0.6), 0.5, -0.25, 0.75]
    np.testing.assert_allclose(np.asarray(actions)[:, 0], expected, rtol=1e-6)


def _plant_candidate(name, gain, lower, cost, covers, cost_at_starts=None, read_upper=None):
    """``cost_at_starts``: the true cost rate at the starts (default ``cost``);
    ``read_upper``: the model's upper bound of it (default: the truth)."""
    candidate = _candidate(name, -100.0 + gain, -50.0 + gain, cost=cost)
    for own, holds in zip(candidate["estimates"].values(), covers, strict=True):
        own["covers"] = holds
    rate = cost if cost_at_starts is None else cost_at_starts
    upper = rate if read_upper is None else read_upper
    candidate["estimates"]["model"]["costs"] = [
        {"channel": "c", "value": rate, "upper": upper, "within": upper <= 1.0}
    ]
    interval = {"value": gain, "lower": lower, "upper": 2 * gain - lower}
    return candidate | {
        "true_return_interval": {"value": -100.0 + gain, "lower": -101.0 + gain, "upper": -99.0},
        "true_improvement": interval,
        "true_improvement_at_starts": interval,
        "true_cost_rate_at_starts": [rate],
    }


def _plant_row(name, candidates, recommended=None, bad=False):
    truth = np.asarray([c["true_return"] for c in candidates])
    return {
        "dataset": name,
        "plant": True,
        "operators_kind": "beatable",
        "candidates": candidates,
        "ranking": {
            estimator: verdict_study._ranking(
                np.asarray([c["estimates"][estimator]["value"] for c in candidates]), truth
            )
            for estimator in verdict_study.ESTIMATORS
        },
        "verdict": {
            "decision": "recommend" if recommended else "keep the current operation",
            "recommended": recommended,
            "true_return": -98.0,
            "worse_than_behaviour": False,
            "not_truly_better": bad,
            "over_cost_limit": False,
            "bad": bad,
        },
        "behaviour": {
            "true_return": -100.0,
            "true_return_interval": {"value": -100.0, "lower": -104.0, "upper": -96.0},
            "logged_return": -101.5,
            "true_value_at_starts": {"value": -40.0, "lower": -41.0, "upper": -39.0},
            "logged_value_at_starts": -40.5,
        },
        "starts": {"count": 50, "horizon": 240, "discount": 0.99, "replicates": 10},
        "statement": "Keep the current operation.",
        "clearly_better": sum(verdict_study._clearly_better(c, -100.0) for c in candidates),
        "truly_better_and_safe": 0,
    }


def test_the_plants_are_scored_against_the_issues_targets():
    # Plant A: a clearly better candidate (+40 of 100, cost 0.3) kept: power missed.
    # Plant B: a candidate recommended whose true improvement's interval reaches below 0.
    a = _plant_row(
        "fired-heater",
        [
            _plant_candidate("TD3BC-Lag, seed 0", 40.0, 30.0, 0.3, (True, False, True)),
            _plant_candidate(
                "BC-Safe, seed 0", 5.0, 1.0, 0.2, (False, False, True), 1.3, read_upper=0.8
            ),
        ],
    )
    b = _plant_row(
        "ph-neutraliser",
        [
            _plant_candidate("IQL-Lag b=1, seed 0", 2.0, -1.0, 0.1, (True, True, True)),
            _plant_candidate(
                "IQL-Lag b=3, seed 0", -3.0, -6.0, 0.1, (True, True, False), read_upper=1.2
            ),
        ],
        recommended="IQL-Lag b=1, seed 0",
        bad=True,
    )
    assert a["clearly_better"] == 1 and b["clearly_better"] == 0
    total = verdict_study.summary([a, b])["plants"]
    assert total["bad_recommendations"] == 1 and total["power"] == {"datasets": 1, "found": 0}
    assert total["coverage"]["model"] == pytest.approx(0.75)
    assert total["coverage"]["model+fqe"] == pytest.approx(0.75)
    assert total["targets_met"] == {
        "bad": False,
        "power": False,
        "coverage": False,
        "correlation": True,
    }
    # The model's cost reading at the starts: one candidate truly over read as within
    # (the side a wrong recommendation gets through), one truly within read as over.
    assert total["cost_check"] == {
        "truly_over": 1,
        "missed": ["fired-heater: BC-Safe, seed 0"],
        "truly_within": 3,
        "refused": ["ph-neutraliser: IQL-Lag b=3, seed 0"],
    }
    config = verdict_study.parse_args(["--quick"])
    config = {key: getattr(config, key) for key in verdict_study.CONFIG_KEYS}
    for row in (a, b):
        row["fidelity"] = {
            "heldout": {"horizon": 10, "steps": {"1": {"relative_rmse": 0.1, "coverage": 0.9}}},
            "simulator": None,
            "model_updates": 100,
        }
    results = {"datasets": [a, b], "summary": verdict_study.summary([a, b]), "seconds": 60.0}
    text = verdict_study.page(config, results)
    assert "## The study plants against their truth" in text
    assert "**1** (target 0: missed)" in text and "on 0 of the 1 plants" in text
    assert "| fired-heater | beatable | -100 [-104, -96] (-101.5) | 1 of 2 |" in text
    assert "TD3BC-Lag, seed 0: 40 [30, 50], 0.30" in text
    assert "IQL-Lag b=1, seed 0: 2 [-1, 5]" in text and "1 of 2 / 2 of 2" in text
    assert "| fired-heater | 100 | 0.10 | - |" in text  # no simulator fidelity for a plant
    assert "IQL-Lag b=1, seed 0: -98 (-100; not truly better)" in text
    assert (
        "of 1 candidates truly over a limit there, 1 read as within (fired-heater: BC-Safe, "
        "seed 0); of 3 truly within, 1 read as over." in text
    )


def test_study_plants_of_their_own_settings_go_beside_a_suite_result(tmp_path):
    from benchmarks.harness import BenchmarkResult

    def saved(rows, config, name):
        results = {"datasets": rows, "summary": verdict_study.summary(rows), "seconds": 120.0}
        return BenchmarkResult(
            name=name,
            description="",
            tag="t",
            timestamp="20260101T000000Z",
            system={},
            config=config,
            results=results,
        ).save(tmp_path)

    args = verdict_study.parse_args(["--quick"])
    config = {key: getattr(args, key) for key in verdict_study.CONFIG_KEYS}
    suite_row = _plant_row(
        "CSTR-v0:medium", [_plant_candidate("BC, seed 0", 1.0, 0.5, 0.1, (1, 1, 1))]
    )
    suite_row["plant"] = False
    plant_row = _plant_row(
        "gas-compressor", [_plant_candidate("BC-Safe, seed 0", 1.0, 0.5, 0.1, (1, 1, 1))]
    )
    suite = saved([suite_row], config, "suite")
    plants = saved([plant_row], config | {"updates": 1234, "datasets": ["gas-compressor"]}, "p")
    merged_config, results = verdict_study.beside([str(suite), str(plants)])
    assert [row["dataset"] for row in results["datasets"]] == ["CSTR-v0:medium", "gas-compressor"]
    assert results["summary"]["plants"]["datasets"] == ["gas-compressor"]
    assert merged_config["updates"] == config["updates"]
    assert results["plant_parts"][0]["config"]["updates"] == 1234
    with pytest.raises(ValueError, match="are not study plants"):
        verdict_study.beside([str(plants), str(suite)])


def test_the_rank_correlation_is_also_given_over_the_candidates_answered_for():
    def candidate(value, lower):
        return {"estimates": {"model": {"value": value, "improvement": {"lower": lower}}}}

    # The fourth has no lower bound (far outside the data) and the highest estimate.
    candidates = [candidate(1.0, 0.1), candidate(2.0, 0.2), candidate(3.0, 0.3)]
    candidates.append(candidate(9.0, None))
    truth = np.array([10.0, 20.0, 30.0, 0.0])
    (model,) = verdict_study._rankings(candidates, truth).values()
    assert model["rank_correlation"] == pytest.approx(-0.2)
    assert model["answered"] == 3 and model["answered_rank_correlation"] == pytest.approx(1.0)
    assert verdict_study._correlation_text(model, 4) == "-0.20 (1.00 of the 3 answered)"
    assert verdict_study._correlation_text(model, 3) == "-0.20"
