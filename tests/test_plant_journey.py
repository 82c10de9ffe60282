"""The plant journey of docs/plants.md, its shell blocks run in order as printed on the
shipped example log (examples/mixing-tank), as one script: import, a plant model, training
with the verdict, serving through the pinned shield (two requests served, one of the
wrong length refused), and the answer for the manager. Then what it left: the verdict and
its consistency with its own bounds, the answer's page, the served actions, MLflow; and
bad input refused by name."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from neorl_industrial.cli import build_parser, main
from neorl_industrial.functional.transformations.dynamics_memory import REMEMBERED
from tests.processes import free_port
from tests.readme import ROOT, blocks, link_repository

PAGE = ROOT / "docs" / "plants.md"
DECISIONS = ("recommend", "keep the current operation")
#: Where a response of the policy server starts in the script's output.
RESPONSE = re.compile(r'\{"(action|detail)"')


def page_script() -> str:
    """Every bash block of the page, in order: the journey as a reader runs it."""
    return "\n".join(blocks("bash", PAGE))


@pytest.fixture(scope="module")
def journey(tmp_path_factory):
    root = tmp_path_factory.mktemp("plant")
    link_repository(root)
    # As printed, but on a free port (8000 may be taken on a test machine).
    script = page_script().replace("8000", str(free_port()))
    environment = {
        **os.environ,  # the suite's compile flags and cache (tests/conftest.py)
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    environment.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=root,
        env=environment,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    decoder, responses = json.JSONDecoder(), []
    start = RESPONSE.search(done.stdout)
    while start:
        response, end = decoder.raw_decode(done.stdout, start.start())
        responses.append(response)
        start = RESPONSE.search(done.stdout, end)
    run = root / "runs" / "mixing-tank-iql-lag"
    return {
        "root": root,
        "dataset": root / "datasets" / "mixing-tank",
        "model": root / "models" / "mixing-tank",
        "run": run,
        "report": json.loads((run / "report.json").read_text()),
        "uri": f"sqlite:///{root / 'mlflow.db'}",
        "responses": responses,
        "answer": done.stdout[done.stdout.index("# mixing-tank: is a learned policy") :],
    }


def test_training_on_a_plant_log_is_evaluated_off_policy_and_says_so(journey):
    report = journey["report"]
    assert report["task"]["kind"] == "plant" and report["env"] is None
    assert report["task"]["actions"] == ["valve_pct", "pump_pct"]
    assert report["task"]["action_units"] == ["%", "%"]
    assert report["evaluation"] == "fqe"
    assert report["cost_limits"] == [30.0] and report["cost_limit_sources"] == ["task"]
    best = report["best"][report["selected_run"]]["metrics"]
    assert best["estimate"] == "fqe" and best["heldout_episodes"] == 3
    assert best["return_ci"] is not None and best["normalized_cost"] >= 0
    assert report["outputs"]["policy"]
    # IQL-Lag trains on the IQL paper's reward scaling, fitted on the log's episodes
    assert report["training"]["reward_scale"]["kind"] == "return_range"


def test_the_model_judges_on_the_episodes_the_run_held_out_in_plant_units(journey):
    card = json.loads((journey["model"] / "model.json").read_text())
    verdict = journey["report"]["verdict"]
    assert len(card["dataset"]["holdout_episodes"]) == verdict["evidence"]["heldout_episodes"] == 3
    assert verdict["evidence"]["plant_model"]["fingerprint"] == card["dataset"]["fingerprint"]
    units = {row["name"]: row["unit"] for row in card["fidelity"]["rows"]}
    assert units["level_m"] == "m" and units["temperature_c"] == "degC"
    assert units["inflow_m3h"] == "m3/h"
    level = {r["step"]: r for r in card["fidelity"]["rows"] if r["name"] == "level_m"}
    assert sorted(level) == [1, 10, 100]
    assert 0 < level[1]["rmse"] < level[100]["rmse"] < 0.5  # metres: the tank is 3.2 m deep


def _lower(candidate: dict, estimator: str) -> float:
    (estimate,) = [e for e in candidate["estimates"] if e["estimator"] == estimator]
    return estimate["improvement"]["lower"]


def test_the_verdict_is_an_estimate_named_and_decided_by_its_bounds(journey):
    verdict = journey["report"]["verdict"]
    assert verdict["kind"] == "estimate" and verdict["decision"] in DECISIONS
    assert verdict["estimators"] == ["model", "fqe", "model+fqe"]
    assert set(verdict["deciding"]) <= set(verdict["estimators"]) and "model" in verdict["deciding"]
    assert [c["name"] for c in verdict["candidates"]] == [f"run {i} (seed {i})" for i in range(3)]
    for candidate in verdict["candidates"]:
        assert [e["estimator"] for e in candidate["estimates"]] == verdict["estimators"]
        for estimate in candidate["estimates"]:
            for interval in (estimate["discounted_return"], estimate["improvement"]):
                assert interval["lower"] <= interval["value"] <= interval["upper"]
        (model,) = [e for e in candidate["estimates"] if e["estimator"] == "model"]
        (alarm,) = model["costs"]
        assert alarm["channel"] == "high_level" and alarm["within_limit"] is not None
        bounds_clear = all(_lower(candidate, name) > 0 for name in verdict["deciding"])
        # a candidate qualifies exactly when its bounds and costs allow it, and says why not
        assert candidate["qualifies"] == (bounds_clear and alarm["within_limit"])
        assert candidate["qualifies"] or candidate["reasons"]
    qualified = [c["name"] for c in verdict["candidates"] if c["qualifies"]]
    if verdict["decision"] == "recommend":
        assert verdict["recommended"] in qualified
    else:
        assert not qualified and verdict["recommended"] is None
        assert verdict["statement"].startswith("Keep the current operation")


def test_the_answer_for_the_manager_is_the_verdict_in_plain_words(journey):
    answer, verdict = journey["answer"], journey["report"]["verdict"]
    if verdict["decision"] == "recommend":
        assert f"**Recommend {verdict['recommended']}**" in answer
    else:
        assert "**Keep the current operation.**" in answer
    assert "Estimators: model, fqe, model+fqe" in answer and "estimate" in answer
    # the fidelity in the plant's units, as the model's card has it
    card = json.loads((journey["model"] / "model.json").read_text())
    level = next(r for r in card["fidelity"]["rows"] if r["name"] == "level_m" and r["step"] == 10)
    assert "| level_m | " in answer and f"{level['rmse']:.2g} m (" in answer
    assert " degC (" in answer and " m3/h (" in answer
    # whether the plant answers to earlier steps the model does not see, as the card says
    shares = [r["explained"] for r in card["fidelity"]["memory"]["rows"]]
    remembered = any(share is not None and share >= REMEMBERED for share in shares)
    assert ("**The plant answers to earlier steps the model does not see**" in answer) is remembered
    assert ("earlier steps explain little of its one-step error" in answer) is not remembered
    # every candidate against the operators, with its interval, and why
    assert "| the operators (logged) |" in answer
    for candidate in verdict["candidates"]:
        (gain,) = [e["improvement"] for e in candidate["estimates"] if e["estimator"] == "model"]
        row = f"| {candidate['name']} | "
        assert row in answer
        assert f"{gain['value']:+.3g} [{gain['lower']:+.3g}, {gain['upper']:+.3g}]" in answer
        assert f"- **{candidate['name']}** " in answer.split("## Why")[1]
    # One candidate was selected on the training episodes before the held-out test.
    selected = [c for c in verdict["candidates"] if c["selection"]["selected"]]
    assert [c["name"] for c in selected] == [verdict["evidence"]["selection"]["chosen"]]
    assert "it was selected on the training episodes before the test" in answer
    assert "and only it was tested" in answer


def test_the_served_plant_policy_speaks_plant_units_through_the_plants_shield(journey):
    calm, held, wrong = journey["responses"]
    valve, pump = calm["action"]
    assert 30.0 <= valve <= 60.0 and 10.0 <= pump <= 100.0  # percent, not [-1, 1]
    assert set(calm["report"]["margin"]) == {
        "bounds/valve_pct",
        "bounds/pump_pct",
        "rate/valve_pct",
        "pump-hard-when-level-high",
        "valve-not-far-above-pump",
    }
    # The valve was at 95 %: it may close by 15 % per step at most, whatever the policy
    # proposes, and with the level high the pump must run at 60 % or more.
    report = held["report"]
    valve, pump = held["action"]
    assert report["overridden"] and "rate/valve_pct" in report["violated"]
    assert valve >= 80.0 - 1e-3 and pump >= 60.0 - 1e-3 and valve - pump <= 40.0 + 1e-3
    # A request of the wrong length: refused, naming what a plant observation holds.
    assert "expected 3 values" in json.dumps(wrong["detail"])


def test_the_plant_run_lands_in_mlflow_with_its_verdict_and_registered_model(journey):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(journey["uri"])
    runs = client.search_runs(
        [client.get_experiment_by_name("neorl-industrial").experiment_id],
        "tags.`task.kind` = 'plant'",
    )
    parents = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    assert len(parents) == 1 and len(runs) == 4, "a parent run and a run per seed"
    run = parents[0]
    assert {"ope/return", "best/ope_return_mean", "verdict/recommend"} <= set(run.data.metrics)
    assert run.data.tags["evaluation"] == "fqe"
    assert run.data.tags["verdict.decision"] == journey["report"]["verdict"]["decision"]
    selection = journey["report"]["verdict"]["evidence"]["selection"]
    assert run.data.tags["verdict.selected"] == selection["chosen"]
    assert run.data.metrics["verdict/selected_candidate"] >= 0
    # the plan a plant run uses: no simulator's fields; its log as the dataset input
    assert not {"data.quality", "data.trajectories"} & set(run.data.params)
    assert not any(name.startswith("env.") for name in run.data.params)
    assert [d.dataset.name for d in run.inputs.dataset_inputs] == ["mixing-tank"]
    artifacts = {item.path for item in client.list_artifacts(run.info.run_id)}
    assert {"plots", "agent", "config.yaml", "dataset.json"} <= artifacts
    versions = client.search_model_versions("name = 'mixing-tank-policy'")
    assert versions and versions[0].tags.get("env") == "mixing-tank"


def test_the_examples_journey_is_the_pages():
    """The example folder's README lists the journey the page runs, command for command."""
    (example,) = blocks("bash", ROOT / "examples" / "mixing-tank" / "README.md")
    listed = _command_lines(example)
    assert "answer.py" in listed[-1] and len(listed) == 4
    page = iter(_command_lines(page_script()))
    assert all(command in page for command in listed), "in the page's order"


def _command_lines(script: str) -> list[str]:
    """A script's commands, each on one line (continuations joined, spaces collapsed)."""
    return [" ".join(line.split()) for line in script.replace("\\\n", " ").splitlines()]


def test_every_command_the_page_names_in_its_text_parses():
    """The commands the page's prose names (its blocks ran in the journey)."""
    text = " ".join(PAGE.read_text().split())
    spans = re.findall(r"`(neorl-industrial [^`]+)`", text)
    commands = [shlex.split(span)[1:] for span in spans if len(span.split()) > 2]
    assert any(words[0] == "evaluate" for words in commands) and len(commands) >= 3
    parser = build_parser()
    for words in commands:
        parser.parse_args(words)


def test_bad_input_is_refused_by_name(journey, tmp_path, capsys):
    agent, dataset = str(journey["run"] / "agent"), str(journey["dataset"])
    # A plant has no simulator: evaluation needs logged data.
    assert main(["--no-cache", "evaluate", agent]) == 2
    assert "has no simulator" in capsys.readouterr().out
    # A plant model of another task (the same card under another plant's name).
    other = tmp_path / "other-task"
    shutil.copytree(journey["model"], other)
    card = json.loads((other / "model.json").read_text())
    card["task"]["name"] = "mixing-tank-2"
    (other / "model.json").write_text(json.dumps(card))
    argv = ["--no-cache", "evaluate", agent, "--ope", dataset, "--plant-model", str(other)]
    assert main(argv) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "task 'mixing-tank'" in error and "is not the model's task 'mixing-tank-2'" in error
    # Another log of the same plant (one value changed): refused by its fingerprint.
    rows = (ROOT / "examples" / "mixing-tank" / "mixing_tank.csv").read_text().splitlines()
    fields = rows[2].split(",")
    fields[1] = f"{float(fields[1]) + 0.001:.4f}"  # level_m, a millimetre higher
    changed = [*rows[:2], ",".join(fields), *rows[3:]]
    (tmp_path / "changed.csv").write_text("\n".join(changed) + "\n")
    schema = str(ROOT / "examples" / "mixing-tank" / "schema.yaml")
    argv = ["--no-cache", "model", "inspect", str(journey["model"])]
    assert main([*argv, "--data", str(tmp_path / "changed.csv"), "--schema", schema]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "is not that of 'mixing-tank'" in error and "fitted on" in error
    # A log too short for a held-out split: refused with its numbers.
    (tmp_path / "short.csv").write_text("\n".join(rows[:61]) + "\n")
    argv = ["--no-cache", "model", "fit", "--data", str(tmp_path / "short.csv")]
    argv += ["--schema", schema, "--out", str(tmp_path / "short-model")]
    assert main(argv) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "59 transitions in 1 episode(s)" in error and "held out" in error
    assert not (tmp_path / "short-model").exists()


def test_the_answer_says_recommend_or_too_little_evidence_when_the_verdict_does(journey):
    """The same page from the journey's verdict turned around: a qualifying candidate is
    recommended by name and called better; too few held-out episodes are said plainly."""
    spec = importlib.util.spec_from_file_location(
        "answer", ROOT / "examples" / "mixing-tank" / "answer.py"
    )
    page = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(page)
    verdict = copy.deepcopy(journey["report"]["verdict"])
    first = verdict["candidates"][0]
    for estimate in first["estimates"]:
        estimate["improvement"] = {"value": 2.0, "lower": 0.5, "upper": 3.5}
        for cost in estimate["costs"]:
            cost["within_limit"] = True
    first["qualifies"] = True
    for candidate in verdict["candidates"]:
        candidate["selection"] |= {"selected": candidate is first}
    verdict |= {"decision": "recommend", "recommended": first["name"]}
    report = journey["root"] / "turned.json"
    report.write_text(json.dumps({"ope": {"verdict": verdict}}))  # as `evaluate --json` writes
    text = page.answer(journey["model"], report)
    assert f"**Recommend {first['name']}**" in text
    assert f"- **{first['name']}** qualifies: by the model estimate, it is better" in text
    assert "so it is the one the held-out test is for" in text
    assert "too short" not in text

    short = copy.deepcopy(journey["report"]["verdict"])
    short["evidence"]["start_episodes"] = 2
    report.write_text(json.dumps({"verdict": short}))  # as report.json holds it
    text = page.answer(journey["model"], report)
    assert "**Keep the current operation.**" in text
    assert "The log is too short to recommend anything" in text and "at least 3" in text

    # A candidate the data cannot answer for has no lower bound (null): said, not a number.
    far = copy.deepcopy(journey["report"]["verdict"])
    last = far["candidates"][-1]
    for estimate in last["estimates"]:
        estimate["improvement"] = {"value": -20.0, "lower": None, "upper": 4.0}
        estimate["discounted_return"]["lower"] = None
    report.write_text(json.dumps({"verdict": far}, allow_nan=False))
    text = page.answer(journey["model"], report)
    assert "-20 [no bound, +4]" in text, text
    assert f"- **{last['name']}** does not qualify: by the model estimate, nothing bounds" in text
