"""Tests of the risk study's variants, scores, pairs and page; a tiny end-to-end study runs
under the ``slow`` marker."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import risk_study


def _summary(mean: float, ci: float | None = 1.0) -> dict:
    return {"mean": mean, "ci": ci, "n": 5}


def _variant(ret: float, ret_cvar: float, cost: float, cost_cvar: float) -> dict:
    return {
        "normalized_return": _summary(ret),
        "normalized_return_cvar": _summary(ret_cvar),
        "normalized_cost": _summary(cost, 0.05),
        "normalized_cost_cvar": _summary(cost_cvar, 0.05),
    }


def test_every_variant_is_a_registered_algorithm_with_valid_critics():
    from neorl_industrial.core.agents.registry import algorithm_entry, build_algorithm

    for base, extra, label in risk_study.VARIANTS.values():
        entry = algorithm_entry(base)
        assert label
        hyperparameters = {"hidden": [8], **extra}
        if entry.safe:
            hyperparameters.update(cost_limits=[10.0], episode_length=100)
        _, config = build_algorithm(base, 4, 2, hyperparameters)
        for field in ("critic", "cost_critic"):
            if field in extra:
                assert getattr(config, field).kind == "iqn"
    for neutral, averse, target in risk_study.PAIRS:
        assert neutral in risk_study.VARIANTS and averse in risk_study.VARIANTS
        assert target in ("return", "cost")
        assert "risk" not in risk_study.VARIANTS[neutral][1].get("critic", {})


def test_scores_are_normalized_from_the_data_facts():
    facts = {"random_return": -300.0, "expert_return": -100.0}
    row = {
        "return": -150.0,
        "return_cvar": -250.0,
        "normalized_cost": 0.5,
        "normalized_cost_cvar": 2,
        "episode_cost": {"T_high": 3.0, "T_low": 1.0},
    }
    scored = risk_study.score(row, facts)
    assert scored["episode_cost"] == {"T_high": 3.0, "T_low": 1.0}
    assert scored["normalized_return"] == pytest.approx(75.0)
    assert scored["normalized_return_cvar"] == pytest.approx(25.0)
    assert scored["normalized_cost"] == 0.5 and scored["normalized_cost_cvar"] == 2.0


def test_pairs_say_whether_the_targeted_tail_improved_and_beyond_the_intervals():
    variants = {
        "td3bc": _variant(60.0, 20.0, 0.9, 1.5),
        "td3bc_cvar": _variant(58.0, 30.0, 0.9, 1.5),  # return tail +10, intervals apart
        "iql": _variant(60.0, 20.0, 0.9, 1.5),
        "iql_cvar": _variant(61.0, 19.0, 0.9, 1.5),  # return tail worse
        "td3bc_lag": _variant(50.0, 10.0, 1.0, 2.0),
        "td3bc_lag_cvar": _variant(48.0, 9.0, 0.8, 1.95),  # cost tail better, within the CIs
    }
    pairs = {(p["neutral"], p["averse"]): p for p in risk_study.pairs(variants)}
    assert set(pairs) == {
        ("td3bc", "td3bc_cvar"),
        ("iql", "iql_cvar"),
        ("td3bc_lag", "td3bc_lag_cvar"),
    }
    td3bc = pairs[("td3bc", "td3bc_cvar")]
    assert td3bc["target"] == "normalized_return_cvar"
    assert td3bc["change"]["normalized_return"] == pytest.approx(-2.0)
    assert td3bc["tail_better"] and td3bc["tail_better_significantly"]
    iql = pairs[("iql", "iql_cvar")]
    assert not iql["tail_better"] and not iql["tail_better_significantly"]
    lag = pairs[("td3bc_lag", "td3bc_lag_cvar")]
    assert lag["target"] == "normalized_cost_cvar"
    assert lag["tail_better"] and not lag["tail_better_significantly"]


def test_a_cvar_variant_runs_at_another_level_named_apart_and_paired_with_its_neutral():
    algorithm, extra, label = risk_study.variant("iql_cvar@0.25")
    assert algorithm == "iql" and label == "IQL, IQN, value on CVaR 0.25"
    assert extra["critic"] == {**risk_study.CVAR, "cvar_level": 0.25}
    assert risk_study.VARIANTS["iql_cvar"][1]["critic"]["cvar_level"] == 0.1  # untouched
    _, extra, label = risk_study.variant("td3bc_lag_cvar@0.5")
    assert extra["cost_critic"]["cvar_level"] == 0.5 and label == "TD3BC-Lag, cost CVaR 0.5"
    assert risk_study.variant_name("iql_cvar@.10") == "iql_cvar"
    assert risk_study.variant_name("iql_cvar@0.250") == "iql_cvar@0.25"
    args = risk_study.parse_args(["--variants", "iql", "iql_cvar@0.5", "iql_cvar@1"])
    assert args.variants == ["iql", "iql_cvar@0.5", "iql_cvar@1"]
    variants = {name: _variant(60.0, 20.0 + i, 0.9, 1.5) for i, name in enumerate(args.variants)}
    assert [(p["neutral"], p["averse"]) for p in risk_study.pairs(variants)] == [
        ("iql", "iql_cvar@0.5"),
        ("iql", "iql_cvar@1"),
    ]
    names = ["iql_cvar@0.5", "td3bc", "iql_cvar", "iql", "iql_cvar@0.25"]
    assert sorted(names, key=risk_study.variant_order) == [
        "td3bc",
        "iql",
        "iql_cvar",
        "iql_cvar@0.25",
        "iql_cvar@0.5",
    ]


def test_the_page_has_a_row_per_variant_and_a_verdict_per_pair():
    variants = {
        "td3bc": _variant(60.0, 20.0, 0.9, 1.5),
        "td3bc_cvar": _variant(58.0, 30.0, 0.9, 1.5),
    }
    config = {"n_seeds": 5, "n_updates": 10_000, "batch_size": 256, "hidden": [64, 64]}
    config["n_episodes"] = 100
    task = {
        "variants": variants,
        "timing": {name: {"train_s": 12.0, "eval_s": 3.0} for name in variants},
        "pairs": risk_study.pairs(variants),
    }
    page = risk_study.markdown(config, {"tasks": {"IB-v0": task}})
    assert "## IB-v0" in page
    assert "| TD3+BC | 60.0 ± 1.0 | 20.0 ± 1.0 | 0.90 ± 0.05 | 1.50 ± 0.05 | 12 |" in page
    assert "| TD3+BC, IQN, actor on CVaR 0.1 vs TD3+BC | -2.0 | +10.0 |" in page
    assert "yes, beyond the intervals" in page
    assert "Quantile critics: 8 fractions drawn per TD step" in page


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--variants", "sac"], "--variants: unknown variant 'sac'; expected one of td3bc,"),
        (["--variants", "iql@0.5"], "--variants: iql@0.5: iql reads no CVaR, so it takes no"),
        (["--variants", "iql_cvar@low"], "iql_cvar@low: the CVaR level must be a number, got"),
        (["--variants", "iql_cvar@1.5"], "iql_cvar@1.5: critic.cvar_level: must lie in (0, 1]"),
        (["--variants", "iql_cvar@nan"], "iql_cvar@nan: critic.cvar_level: must lie in (0, 1]"),
        (["--variants", "iql_cvar@.5", "iql_cvar@0.50"], "--variants: given twice: iql_cvar@0.5"),
        (["--seeds", "1"], "--seeds: at least 2"),
        (["--updates", "0"], "--updates: expected a positive integer"),
        (["--tasks", "Nope-v0"], "--tasks: unknown environment 'Nope-v0'"),
    ],
)
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        risk_study.parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_tiny_study_runs_end_to_end(tmp_path):
    doc = tmp_path / "risk.md"
    argv = ["--quick", "--variants", "td3bc", "td3bc_cvar", "--hidden", "8"]
    argv += ["--doc", str(doc), "--results-dir", str(tmp_path), "-t", "test"]
    assert risk_study.main(argv) == 0
    (saved,) = tmp_path.glob("risk_study-test-*.json")
    task = json.loads(saved.read_text())["results"]["tasks"]["IB-v0"]
    assert set(task["variants"]) == {"td3bc", "td3bc_cvar"}
    assert all(
        np.isfinite(seed["normalized_return_cvar"])
        for seed in task["variants"]["td3bc"]["per_seed"]
    )
    assert "vs TD3+BC" in doc.read_text()


def _saved_result(tmp_path, env_id="IB-v0", per_seed=None, **changes):
    from benchmarks.harness import BenchmarkResult

    args = risk_study.parse_args([])
    config = {**risk_study.settings_of(args), "variants": ["td3bc", "td3bc_cvar"], **changes}
    variants = {
        "td3bc": _variant(60.0, 20.0, 0.9, 1.5),
        "td3bc_cvar": _variant(58.0, 30.0, 0.9, 1.5),
    }
    if per_seed is not None:
        for entry in variants.values():
            entry["per_seed"] = per_seed
    task = {
        "variants": variants,
        "timing": {name: {"train_s": 1.0, "eval_s": 1.0} for name in variants},
        "pairs": [],
    }
    result = BenchmarkResult(
        name="risk_study", tag=env_id, config=config, results={"tasks": {env_id: task}}
    )
    return result.save(tmp_path)


def _seed(ret: float, ret_cvar: float, cost: float, cost_cvar: float) -> dict:
    return {
        "normalized_return": ret,
        "normalized_return_cvar": ret_cvar,
        "normalized_cost": cost,
        "normalized_cost_cvar": cost_cvar,
    }


def test_runs_on_different_tasks_merge_into_one_page(tmp_path):
    noisy = _saved_result(tmp_path / "a", per_seed=[_seed(60.0, 20.0, 0.9, 1.5)], device="cpu")
    same = [_seed(98.0, 98.0, 0.5, 0.5), _seed(97.0, 97.0, 0.4, 0.4)]
    deterministic = _saved_result(tmp_path / "b", "CSTR-v0", per_seed=same, device="H100")
    config, results = risk_study.merge([noisy, deterministic])
    assert config["tasks"] == ["IB-v0", "CSTR-v0"]
    assert [results["tasks"][t]["device"] for t in config["tasks"]] == ["cpu", "H100"]
    page = risk_study.markdown(config, results)
    ib, cstr = page.split("## CSTR-v0")
    assert "## IB-v0" in ib and "Trained and evaluated on cpu" in ib
    assert "Trained and evaluated on H100" in cstr
    note = "CVaR over episodes equals the mean"
    assert note in cstr and note not in ib


def test_a_merged_study_merges_again_keeping_where_each_task_came_from(tmp_path):
    from benchmarks.harness import BenchmarkResult

    first = _saved_result(tmp_path / "a", device="cpu")
    second = _saved_result(tmp_path / "b", "CSTR-v0", device="H100")
    config, results = risk_study.merge([first, second])
    merged = BenchmarkResult("risk_study", tag="merged", config=config, results=results)
    merged_path = merged.save(tmp_path / "m")
    third = _saved_result(tmp_path / "c", "CSTR-stochastic-v0", device="cpu")
    config, results = risk_study.merge([merged_path, third])
    assert config["tasks"] == ["IB-v0", "CSTR-v0", "CSTR-stochastic-v0"]
    tasks = results["tasks"]
    assert [tasks[t]["device"] for t in config["tasks"]] == ["cpu", "H100", "cpu"]
    assert [tasks[t]["result"] for t in config["tasks"]] == [
        first.name,
        second.name,
        third.name,
    ]


def test_a_merge_of_clashing_runs_is_refused_by_name(tmp_path, capsys):
    first = _saved_result(tmp_path / "a")
    with pytest.raises(ValueError, match="task IB-v0 already has td3bc, td3bc_cvar from an"):
        risk_study.merge([first, _saved_result(tmp_path / "b")])
    with pytest.raises(ValueError, match="n_seeds"):
        risk_study.merge([first, _saved_result(tmp_path / "c", "CSTR-v0", n_seeds=3)])
    assert risk_study.main(["--merge", str(tmp_path / "missing.json")]) == 2
    assert "--merge" in capsys.readouterr().err


def _other_variants(path, device, variants=("iql", "iql_cvar"), data=None, kept_from=None):
    """A saved result of the same task with other variants (``_saved_result``'s layout)."""
    from benchmarks.harness import BenchmarkResult

    saved = BenchmarkResult.load(path)
    settings = {name: {"algorithm": risk_study.VARIANTS[name][0]} for name in variants}
    saved.config.update(variants=list(variants), variant_settings=settings, device=device)
    if kept_from is not None:
        saved.config["kept_from"] = kept_from
    (task,) = saved.results["tasks"].values()
    task["variants"] = {name: _variant(70.0, 25.0 + i, 1.0, 1.6) for i, name in enumerate(variants)}
    task["timing"] = {name: {"train_s": 2.0, "eval_s": 1.0} for name in variants}
    task["data"] = data if data is not None else {"episodes": 90}
    return saved.save(path.parent / f"other_{device}")


def test_runs_of_one_task_with_other_variants_join_on_one_table(tmp_path):
    from benchmarks.harness import BenchmarkResult

    first = BenchmarkResult.load(_saved_result(tmp_path / "a", "CSTR-v0", device="cpu"))
    first.results["tasks"]["CSTR-v0"]["data"] = {"episodes": 90}
    first_path = first.save(tmp_path / "a1")
    gpu = _other_variants(first_path, "H200")
    config, results = risk_study.merge([first_path, gpu])
    assert config["tasks"] == ["CSTR-v0"]
    assert config["variants"] == ["td3bc", "td3bc_cvar", "iql", "iql_cvar"]
    assert config["variant_settings"]["iql_cvar"] == {"algorithm": "iql"}
    task = results["tasks"]["CSTR-v0"]
    assert list(task["variants"]) == config["variants"]
    assert [(p["neutral"], p["averse"]) for p in task["pairs"]] == [
        ("td3bc", "td3bc_cvar"),
        ("iql", "iql_cvar"),
    ]
    assert task["device"] == "cpu"
    assert task["joined"] == [{"from": gpu.name, "device": "H200", "variants": ["iql", "iql_cvar"]}]
    page = risk_study.markdown(config, results)
    assert f"Joined from `{gpu.name}` (the same settings and data; trained on H200" in page
    assert page.count("| IQL, IQN, value on CVaR 0.1 |") == 1
    assert "IQL, IQN, value on CVaR 0.1 vs IQL" in page
    # A merged page merges again with the same provenance; a third run's kept variants
    # are named with the run they were kept from.
    merged = BenchmarkResult("risk_study", tag="m", config=config, results=results)
    merged_path = merged.save(tmp_path / "m")
    source = _other_variants(first_path, "H100", variants=("cql",))
    rerun = _other_variants(source, "cpu2", variants=("cql", "codac_cvar"), kept_from=source.name)
    rerun_saved = BenchmarkResult.load(rerun)
    rerun_saved.results["tasks"]["CSTR-v0"]["kept"] = {
        "from": source.name,
        "device": "H100",
        "variants": ["cql"],
    }
    rerun = rerun_saved.save(tmp_path / "r")
    _, again = risk_study.merge([merged_path, rerun])
    assert again["tasks"]["CSTR-v0"]["joined"] == [
        {"from": gpu.name, "device": "H200", "variants": ["iql", "iql_cvar"]},
        {"from": source.name, "device": "H100", "variants": ["cql"]},
        {"from": rerun.name, "device": "cpu2", "variants": ["codac_cvar"]},
    ]


def test_runs_of_one_task_on_other_data_do_not_join(tmp_path):
    from benchmarks.harness import BenchmarkResult

    first = BenchmarkResult.load(_saved_result(tmp_path / "a", "CSTR-v0", device="cpu"))
    first.results["tasks"]["CSTR-v0"]["data"] = {"episodes": 90}
    first_path = first.save(tmp_path / "a1")
    other = _other_variants(first_path, "H200", data={"episodes": 60})
    with pytest.raises(ValueError, match="task CSTR-v0 is in an earlier file with other data"):
        risk_study.merge([first_path, other])


def test_kept_variants_are_carried_over_and_rerun_ones_replaced(tmp_path):
    args = risk_study.parse_args(
        ["--keep", str(_saved_result(tmp_path)), "--variants", "td3bc_cvar"]
    )
    rerun = _variant(57.0, 35.0, 0.8, 1.2)
    results = {
        "tasks": {"IB-v0": {"variants": {"td3bc_cvar": rerun}, "timing": {"td3bc_cvar": {}}}}
    }
    order = risk_study.keep_variants(results, args.keep_result, args.variants, "old.json")
    assert order == ["td3bc", "td3bc_cvar"]
    task = results["tasks"]["IB-v0"]
    assert task["kept"] == {"from": "old.json", "device": None, "variants": ["td3bc"]}
    [line, _] = risk_study.kept_lines(task["kept"])
    assert line.startswith("Carried over from `old.json`") and line.endswith(": TD3+BC.")
    assert task["variants"]["td3bc"]["normalized_return"]["mean"] == 60.0  # kept
    assert task["variants"]["td3bc_cvar"] is rerun  # trained again
    (pair,) = task["pairs"]
    assert pair["change"]["normalized_return_cvar"] == pytest.approx(15.0)


def test_a_kept_result_of_other_settings_is_refused_by_name(tmp_path, capsys):
    path = _saved_result(tmp_path, n_updates=500)
    with pytest.raises(SystemExit):
        risk_study.parse_args(["--keep", str(path)])
    assert "n_updates 10000 here, 500 there" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        risk_study.parse_args(["--keep", str(tmp_path / "missing.json")])
    assert "--keep" in capsys.readouterr().err


def test_the_page_gives_the_safe_variants_multipliers_and_their_cost_estimates():
    lag = _variant(70.0, 15.0, 1.5, 4.9)
    lag["final_multiplier"] = {"multiplier_0": [1.0, 3.0], "multiplier_1": [0.0, 0.5]}
    lag["final_cost_value"] = {"cost_value_0": [2.0, 4.0], "cost_value_1": [0.1, 0.3]}
    task = {
        "cost": {"channels": ["T_high", "T_low"], "limits": [6.0, 6.0]},
        "variants": {"td3bc": _variant(90.0, 50.0, 1.8, 5.2), "td3bc_lag": lag},
    }
    [_, line] = risk_study.multiplier_lines(task)
    assert "TD3BC-Lag: T_high λ 2, estimate 3; T_low λ 0.25, estimate 0.2." in line
    assert "TD3+BC:" not in line
    del lag["final_multiplier"]
    assert risk_study.multiplier_lines(task) == []


def test_a_merge_names_what_a_kept_run_carried_over_and_from_which_device(tmp_path):
    source = _saved_result(tmp_path, "CSTR-v0", device="H100")
    rerun = _saved_result(tmp_path, "CSTR-v0", device="cpu", kept_from=source.name)
    _, results = risk_study.merge([rerun])
    kept = results["tasks"]["CSTR-v0"]["kept"]
    assert kept == {"from": source.name, "device": "H100", "variants": None}
    [line, _] = risk_study.kept_lines(kept)
    assert "trained on H100" in line and line.endswith("not trained again in this run.")
    assert risk_study.kept_lines(None) == []


def test_trips_cost_their_penalty_only_in_the_region_and_as_often_as_drawn():
    trip = risk_study.Trip(channel=1, penalty=5.0, probability=0.25)
    costs = np.zeros((40_000, 2))
    costs[::2, 1] = 1.0  # every other step is in the region; channel 0 does not count
    costs[1::2, 0] = 1.0
    rewards = np.full(40_000, -1.0)
    relabelled = trip.relabel(rewards, costs, seed=0)
    lost = rewards - relabelled
    assert set(np.unique(lost)) == {0.0, 5.0}
    assert np.all(lost[1::2] == 0.0)  # outside the region: untouched
    assert np.mean(lost[::2] == 5.0) == pytest.approx(0.25, abs=0.01)
    assert np.array_equal(relabelled, trip.relabel(rewards, costs, seed=0))  # drawn once
    certain = risk_study.Trip(channel=1, penalty=5.0, probability=1.0)
    assert np.all(certain.relabel(rewards, costs, seed=3)[::2] == -6.0)
    # Per episode: a binomial draw over its steps in the region.
    assert np.array_equal(certain.episode_penalties(np.array([0, 3, 10]), 1), [0, 15, 50])
    draws = trip.episode_penalties(np.full(20_000, 8.0), seed=2) / 5.0
    assert draws.mean() == pytest.approx(8 * 0.25, abs=0.05)
    assert draws.var() == pytest.approx(8 * 0.25 * 0.75, abs=0.1)


def test_a_trip_is_priced_in_normalized_points_and_lowers_the_evaluated_returns():
    import argparse

    from neorl_industrial.functional.transformations.evaluation import EpisodeStats

    facts = {"random_return": -300.0, "expert_return": -100.0}
    args = argparse.Namespace(trip=["T_low", 10.0, 1.0])
    trip = risk_study.make_trip(args, ["T_high", "T_low"], facts)
    assert trip == risk_study.Trip(channel=1, penalty=20.0, probability=1.0)
    with pytest.raises(ValueError, match="channel 'fatigue' is not a cost channel"):
        risk_study.make_trip(
            argparse.Namespace(trip=["fatigue", 10.0, 0.1]), ["T_high", "T_low"], facts
        )
    steps = np.array([[[5.0, 0.0], [9.0, 2.0]], [[0.0, 1.0], [0.0, 0.0]]])  # [policy, ep, ch]
    stats = EpisodeStats(
        returns=np.full((2, 2), -150.0),
        costs=steps,
        steps=np.full((2, 2), 60),
        overrides=np.zeros((2, 2), int),
        fallbacks=np.zeros((2, 2), int),
        violations=np.zeros((2, 2, 0), int),
        applied_violations=np.zeros((2, 2, 0), int),
        invalid_actions=np.zeros((2, 2), int),
    )
    adjusted = risk_study.trip_adjustment(trip, seed=0)(stats)
    assert np.array_equal(adjusted.returns, [[-150.0, -190.0], [-170.0, -150.0]])
    assert np.array_equal(adjusted.costs, steps)  # the costs stay what they were


def test_the_page_says_what_the_trips_were():
    variants = {"td3bc": _variant(60.0, 20.0, 0.9, 1.5), "td3bc_cvar": _variant(58, 30, 1, 1)}
    variants["td3bc"]["per_seed"] = [
        {**_seed(60.0, 20.0, 0.9, 1.5), "episode_cost": {"T_high": t}} for t in (8.0, 9.0)
    ]
    # A run from before the channels were kept says nothing of them.
    variants["td3bc_cvar"]["per_seed"] = [_seed(58.0, 30.0, 1.0, 1.0)]
    trip = {"channel": "T_high", "probability": 0.1, "penalty_points": 10.0, "penalty": 9.3}
    task = {
        "data": {"trip": {**trip, "steps_inside": 1200, "trips": 118}},
        "variants": variants,
        "timing": {name: {"train_s": 1.0, "eval_s": 1.0} for name in variants},
        "pairs": [],
    }
    config = {"n_seeds": 5, "n_updates": 100, "batch_size": 8, "hidden": [8], "n_episodes": 4}
    page = risk_study.markdown(config, {"tasks": {"CSTR-stochastic-v0": task}})
    assert "each step with a `T_high` cost trips with probability 0.1 and loses 10" in page
    assert "The data's 1,200 steps in the region drew 118 trips" in page
    region = "Steps per episode with a `T_high` cost (where trips happen), mean over seeds: "
    assert region + "TD3+BC 8.5." in page


@pytest.mark.parametrize(
    ("trip", "message"),
    [
        (["T_high", "x", "0.1"], "POINTS and PROBABILITY must be numbers"),
        (["T_high", "-5", "0.1"], "POINTS must be positive"),
        (["T_high", "10", "0"], "PROBABILITY must lie in (0, 1]"),
        (["T_high", "nan", "0.5"], "POINTS must be positive"),
        (["T_high", "10", "0.1"], "channel 'T_high' is not a cost channel of the study on IB-v0"),
    ],
)
def test_bad_trips_are_named(trip, message, capsys):
    with pytest.raises(SystemExit):
        risk_study.parse_args(["--trip", *trip])  # the default task, IB-v0: fatigue only
    assert message in capsys.readouterr().err


def test_a_run_with_trips_merges_beside_the_same_task_without(tmp_path):
    from benchmarks.harness import BenchmarkResult

    plain = _saved_result(tmp_path / "a", "CSTR-stochastic-v0", device="cpu")
    trip = {"channel": "T_high", "penalty_points": 10.0, "probability": 0.1}
    risky = BenchmarkResult.load(_saved_result(tmp_path / "b", "CSTR-stochastic-v0", trip=trip))
    risky.results["tasks"]["CSTR-stochastic-v0"]["data"] = {
        "trip": {**trip, "penalty": 9.3, "steps_inside": 100, "trips": 9}
    }
    risky_path = risky.save(tmp_path / "c")
    config, results = risk_study.merge([plain, risky_path])
    risky_name = "CSTR-stochastic-v0, trips on T_high (10 points, p 0.1)"
    assert config["tasks"] == ["CSTR-stochastic-v0", risky_name]
    page = risk_study.markdown(config, results)
    assert f"## {risky_name}" in page
    # Merged again, the name stays; the same task with trips twice is refused.
    merged = BenchmarkResult("risk_study", tag="m", config=config, results=results)
    again, _ = risk_study.merge([merged.save(tmp_path / "m")])
    assert again["tasks"] == config["tasks"]
    with pytest.raises(ValueError, match=r"p 0.1\) already has td3bc, td3bc_cvar"):
        risk_study.merge([risky_path, risky_path])
    # --keep still needs the same trips.
    with pytest.raises(SystemExit):
        risk_study.parse_args(["--keep", str(risky_path)])


def test_a_run_with_trips_keeps_the_variants_of_a_run_that_named_its_task_bare(tmp_path):
    from benchmarks.harness import BenchmarkResult

    trip = {"channel": "T_high", "penalty_points": 10.0, "probability": 0.1}
    saved = BenchmarkResult.load(_saved_result(tmp_path, "CSTR-stochastic-v0", trip=trip))
    saved.results["tasks"]["CSTR-stochastic-v0"]["data"] = {"trip": {**trip, "trips": 3}}
    name = "CSTR-stochastic-v0, trips on T_high (10 points, p 0.1)"
    results = {"tasks": {name: {"variants": {"iql": _variant(1, 1, 1, 1)}, "timing": {}}}}
    order = risk_study.keep_variants(results, saved, ["iql"], "old.json")
    assert order == ["td3bc", "td3bc_cvar", "iql"]
    assert list(results["tasks"][name]["variants"]) == order


def test_a_task_is_named_from_its_trips_whatever_name_it_was_saved_under():
    trip = {"channel": "T_high", "penalty_points": 30.0, "probability": 0.1}
    full = "CSTR-stochastic-v0, trips on T_high (30 points, p 0.1)"
    for saved_as in ("CSTR-stochastic-v0", "CSTR-stochastic-v0, trips on T_high", full):
        assert risk_study.task_key(saved_as, trip) == full
    assert risk_study.task_key("CSTR-stochastic-v0", None) == "CSTR-stochastic-v0"
