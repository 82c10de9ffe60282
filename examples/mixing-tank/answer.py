"""The answer to take to the manager, in plain words, from the files a run leaves:

    python examples/mixing-tank/answer.py models/mixing-tank runs/mixing-tank-iql-lag/report.json

The first argument is a plant model's directory (``model fit``: its card holds the
fidelity on held-out episodes, in the plant's units); the second is the report of ``train
--plant-model`` (``report.json``) or the ``--json`` file of ``evaluate --ope ...
--plant-model ...``: both hold the verdict. It prints a page of Markdown: how well the
model knows the plant, every candidate against the current operation with its interval,
the recommendation, and why. Every number is an estimate and is labelled as one. Any
plant's files work; nothing here is particular to the mixing tank.

What is compared with what: every candidate, run closed loop in the plant model, against
today's operation, the operators' behaviour cloned and run closed loop in the same model
from the same starting states. Before that comparison counts, the model must reproduce
the operators' own logged returns on the held-out episodes (the calibration check); when
it does not, the page says so and the answer is to keep the current operation.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _interval(estimate: dict, digits: str = ".3g") -> str:
    """``value [lower, upper]``; a side no data bounds (null in the report) reads "no
    bound"."""

    def side(bound: float | None) -> str:
        return "no bound" if bound is None else f"{bound:{digits}}"

    return f"{estimate['value']:{digits}} [{side(estimate['lower'])}, {side(estimate['upper'])}]"


def _by_estimator(estimates: list[dict]) -> dict[str, dict]:
    return {result["estimator"]: result for result in estimates}


def _duration(steps: int, period: float | None) -> str:
    if not period:
        return f"{steps} step{'s' if steps != 1 else ''}"
    seconds = steps * period
    if seconds < 120:
        return f"{seconds:g} s"
    return f"{seconds / 60:.3g} min"


def fidelity_section(card: dict) -> list[str]:
    """The model's open-loop error per observed feature, in its unit and as a share of
    its spread, and how often the logged value fell inside the model's interval."""
    fidelity = card["fidelity"]
    period = card["task"].get("sampling_period")
    steps = fidelity["steps"]
    level = f"{fidelity['level']:.0%}"
    horizon = steps[-1]
    lines = [
        "## How well the model knows the plant",
        "",
        f"Driven open loop by the operators' logged actions from {fidelity['windows']} points "
        f"of {len(fidelity['episodes'])} episodes it was not fitted on: the typical error "
        "(RMSE) of its prediction, in the plant's units and as a share of the feature's "
        f"usual spread, and how often the logged value lay inside its {level} interval.",
        "",
        "| feature | "
        + " | ".join(f"after {_duration(step, period)}" for step in steps)
        + f" | inside its {level} interval after {_duration(horizon, period)} |",
        "|---" * (len(steps) + 2) + "|",
    ]
    rows = [row for row in fidelity["rows"] if row["kind"] == "observation"]
    for name in dict.fromkeys(row["name"] for row in rows):
        mine = {row["step"]: row for row in rows if row["name"] == name}
        unit = mine[steps[0]]["unit"] or ""
        if mine[steps[0]].get("given"):  # no action moves it: taken from the log
            lines.append(
                f"| {name} | " + " | ".join(["taken from the log"] * len(steps)) + " | - |"
            )
            continue
        cells = [
            f"{mine[step]['rmse']:.2g} {unit} ({mine[step]['relative_rmse']:.0%})" for step in steps
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {mine[horizon]['coverage']:.0%} |")
    return lines + _memory_lines(fidelity.get("memory"))


def _memory_lines(memory: dict | None) -> list[str]:
    """Which features answer to earlier steps the model does not see (a transport delay,
    a hidden drift), by the share of its one-step error those steps explain."""
    from neorl_industrial.functional.transformations.dynamics_memory import REMEMBERED

    rows = [row for row in (memory or {}).get("rows", []) if row["explained"] is not None]
    if not rows:
        return []
    remembered = [row for row in rows if row["explained"] >= REMEMBERED]
    if not remembered:
        return [
            "",
            f"What the plant does next depends on what the model sees: the {memory['lags']} "
            "earlier steps explain little of its one-step error ("
            + ", ".join(f"{row['name']} {row['explained']:.0%}" for row in rows)
            + "). A slow drift shows little in one step: `neorl-industrial model history` "
            "compares the log's histories by the model's error over many steps.",
        ]
    return [
        "",
        "**The plant answers to earlier steps the model does not see**: they explain "
        + ", ".join(f"{row['explained']:.0%} of {row['name']}'s" for row in remembered)
        + f" one-step error (1 to {memory['lags']} steps back; a transport delay, a slow "
        "hidden drift or an unrecorded state). Even where the model reproduces today's "
        "operation (the check below), a policy that acts unlike the operators meets the "
        "part of the plant's response the model misses: its estimates may be off by more "
        "than their intervals say. Importing the log with the schema's `history` (the last "
        "rows in each observation) lets the model and the policies see those steps; "
        "`neorl-industrial model history` says how many.",
    ]


def candidates_section(verdict: dict) -> list[str]:
    """Every candidate's estimate beside the operators', and its improvement over them
    by each deciding estimator, with intervals."""
    level = f"{verdict['settings']['level']:.0%}"
    deciding = verdict["deciding"]
    operators = _by_estimator(verdict["behaviour"]["estimates"])["model"]
    limited = [c for c in operators["costs"] if c["value"] is not None]
    header = ["", "estimated return (model)"]
    header += [f"better than the operators by ({name})" for name in deciding]
    header += [f"{c['channel']}: share of its limit (upper bound)" for c in limited]
    header += ["steps outside the log's range"]
    lines = [
        "## The candidates against the operators (estimates)",
        "",
        f"Discounted return from {verdict['evidence']['starts']} starting states of the "
        f"held-out episodes (higher is better), with its {level} interval. Today's "
        "operation is the operators' behaviour cloned and run closed loop in the same model "
        "from the same states, so each difference is paired start by start; a candidate's "
        "estimate is lowered by the model's uncertainty, and every interval of improvement "
        "is widened by the model's error on the operators (the calibration check).",
        "",
        "| " + " | ".join(header) + " |",
        "|---" * len(header) + "|",
    ]
    calibration = verdict.get("calibration")
    if calibration:  # the data: what the operators achieved from the same states
        row = ["the operators (logged)", _interval(calibration["logged"])]
        row += ["-"] * (len(header) - 2)
        lines.append("| " + " | ".join(row) + " |")
    row = ["the operators (cloned, in the model)", _interval(operators["discounted_return"])]
    row += ["-"] * len(deciding)
    row += [f"{c['value']['upper']:.2f}" for c in limited]
    row += ["-"]
    lines.append("| " + " | ".join(row) + " |")
    for candidate in verdict["candidates"]:
        estimates = _by_estimator(candidate["estimates"])
        model = estimates["model"]
        row = [candidate["name"], _interval(model["discounted_return"])]
        row += [_interval(estimates[name]["improvement"], "+.3g") for name in deciding]
        costs = {c["channel"]: c for c in model["costs"]}
        row += [f"{costs[c['channel']]['value']['upper']:.2f}" for c in limited]
        share = model.get("outside_data_share")
        row += ["-" if share is None else f"{share:.1%}"]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _why_candidate(candidate: dict, verdict: dict) -> list[str]:
    """Plain words for what the evidence says of one candidate."""
    level = f"{verdict['settings']['level']:.0%}"
    estimates = _by_estimator(candidate["estimates"])
    said = []
    for name in verdict["deciding"]:
        gain = estimates[name]["improvement"]
        by = f"by the {name} estimate"
        if gain["lower"] is None:
            said.append(
                f"{by}, nothing bounds how much worse it may be: it leaves the data the "
                "plant model was fitted on, where the data cannot answer for it"
            )
        elif gain["upper"] < 0:
            said.append(
                f"{by}, it is worse than the operators: {-gain['value']:.3g} lower, and "
                f"at least {-gain['upper']:.3g} lower with {level} confidence"
            )
        elif gain["lower"] <= 0:
            said.append(
                f"{by}, it cannot be told apart from the operators: between "
                f"{-gain['lower']:.3g} lower and {gain['upper']:.3g} higher"
            )
        else:
            said.append(f"{by}, it is better: at least {gain['lower']:.3g} higher")
    limits = verdict["evidence"].get("cost_limits", {})
    for cost in estimates["model"]["costs"]:
        limit = limits.get(cost["channel"])
        if cost["within_limit"] is False:
            said.append(
                f"it may break the {cost['channel']} limit ({limit:g} per episode): up to "
                f"{cost['value']['upper']:.2f} times what the limit allows"
            )
        if cost.get("event_bound") is not None:
            said.append(
                f"the operators tripped {cost['channel']} on {cost['events']} held-out steps, "
                "too rarely for the model to learn it: its bound includes the exact "
                f"({level}) upper bound of that rate, {cost['event_bound']:.3g} per episode"
            )
    share = estimates["model"].get("outside_data_share")
    if share:
        said.append(
            f"on {share:.0%} of its steps it takes the plant where the log never went, "
            "where the model can only extrapolate (the estimate was charged for it)"
        )
    physics = estimates["model"].get("outside_physics_share")
    if physics:
        said.append(
            f"on {physics:.0%} of its steps the model predicted values outside the physical "
            "ranges: they were clipped onto them and charged, not trusted"
        )
    selection = candidate.get("selection")
    if selection and selection.get("selected"):
        said.append(
            "it was selected on the training episodes before the test (the lower bound of "
            f"its return predicted there: {selection['predicted_lower']:.4g}), so it is the "
            "one the held-out test is for"
        )
    elif selection:
        said.append(
            "it was not the candidate selected on the training episodes, so it cannot be "
            "recommended whatever its held-out estimates say"
        )
    return said


def why_section(verdict: dict) -> list[str]:
    """Why the answer is what it is, from the evidence."""
    settings, evidence = verdict["settings"], verdict["evidence"]
    lines = ["## Why", ""]
    calibration = verdict.get("calibration") or {}
    if calibration.get("status") == "too small":
        lines.append(
            f"- The log is too short to recommend anything: {calibration['reason']}. The "
            "model cannot be checked against today's operation, so no estimate can be trusted."
        )
    elif evidence["start_episodes"] < settings["min_episodes"]:
        lines.append(
            f"- The log is too short to recommend anything: the candidates could be checked "
            f"on {evidence['start_episodes']} held-out episode(s), and an interval over "
            f"whole episodes needs at least {settings['min_episodes']}. Log more episodes."
        )
    elif calibration.get("status") == "failed":
        lines.append(
            f"- Keep the current operation: {calibration['reason']}. A model that misses "
            "today's operation cannot say what another policy would do."
        )
    for candidate in verdict["candidates"]:
        said = _why_candidate(candidate, verdict)
        verdict_word = "qualifies" if candidate["qualifies"] else "does not qualify"
        lines.append(f"- **{candidate['name']}** {verdict_word}: " + "; ".join(said) + ".")
    operators = _by_estimator(verdict["behaviour"]["estimates"])["model"]
    episodes = evidence["heldout_episodes"]
    for cost in operators["costs"]:
        limit = evidence.get("cost_limits", {}).get(cost["channel"])
        events = evidence.get("cost_events", {}).get(cost["channel"], 0)
        if limit is None or cost["value"] is None or events <= limit * episodes:
            continue
        lines.append(
            f"- In the held-out log the operators had {cost['channel']} on {events} steps in "
            f"{episodes} episodes ({events / episodes:.3g} per episode, limit {limit:g}), "
            f"while the model, running their cloned behaviour, estimates "
            f"{cost['value']['value']:.2f} [{cost['value']['lower']:.2f}, "
            f"{cost['value']['upper']:.2f}] of the limit: it under-predicts this cost, so "
            "its estimates of it for the candidates are likely low as well."
        )
    lines += [
        "",
        f"A candidate is recommended only if the lower bound of its {settings['level']:.0%} "
        "interval of improvement over the operators is above zero by every deciding "
        f"estimator ({', '.join(verdict['deciding'])}) and its costs stay within their "
        "limits with their intervals; otherwise the answer is to keep the current "
        "operation."
        + (
            " One candidate was selected on the training episodes first, by what they "
            "predict of this test, and only it was tested: a test of many candidates on "
            "the same episodes would let one pass by chance."
            if evidence.get("selection")
            else ""
        ),
    ]
    return lines


def calibration_section(verdict: dict) -> list[str]:
    """Does the model reproduce today's operation? The operators' clone in the model
    against their logged returns (and costs) from the same starts."""
    calibration = verdict.get("calibration")
    if not calibration:
        return ["## Does the model reproduce today's operation?", "", "Not checked."]
    estimated, logged, error = calibration["estimated"], calibration["logged"], calibration["error"]
    status = {
        "passed": "**Yes**",
        "failed": "**No**",
        "too small": "**Cannot tell**: too few held-out episodes",
    }[calibration["status"]]
    lines = [
        "## Does the model reproduce today's operation?",
        "",
        f"{status}. The operators' behaviour, cloned and run in the model from the starting "
        f"states of {calibration['episodes']} held-out episodes ({calibration['transitions']:,} "
        "transitions), against what the log shows they achieved from the same states:",
        "",
        "| | discounted return |",
        "|---|---|",
        f"| estimated by the model | {_interval(estimated, '.4g')} |",
        f"| logged (data) | {logged['value']:.4g} |",
        f"| the model's error | {_interval(error, '+.3g')} (passes within "
        f"±{calibration['tolerance']:.3g}) |",
    ]
    for cost in calibration["costs"]:
        lines.append(
            f"| {cost['channel']} per episode, share of its limit | estimated "
            f"{cost['estimated']:.2f}, logged {cost['logged']:.2f} |"
        )
    lines += [
        "",
        "The check passes when the interval of the model's error holds 0 or stays within "
        "the tolerance; the error's size then widens every interval of improvement below.",
    ]
    if calibration.get("closing_passed") is False:
        lines.append(
            "The model+fqe estimate misses today's operation (its error "
            f"{_interval(calibration['closing_error'], '+.3g')}): it is shown, not deciding."
        )
    note = (verdict["evidence"].get("physics") or {}).get("note")
    if note:
        lines += ["", f"Physical ranges: {note}."]
    return lines


def trust_section() -> list[str]:
    """When this answer cannot be trusted."""
    return [
        "## When this answer cannot be trusted",
        "",
        "- The model does not reproduce today's operation (above): then nothing is recommended.",
        "- The plant has changed since the log (new equipment, other raw material, "
        "another season): the log, and the model of it, describe the old plant.",
        "- A candidate spends much of its time where the log never went (its share of "
        "steps outside the log's range): the model extrapolates there, and the estimate "
        "was charged for it but cannot be checked.",
        "- A cost the operators rarely or never tripped rests on an exact bound of how "
        "rarely they did, not on a model of what causes it.",
    ]


def answer(model_dir: Path, report_path: Path) -> str:
    """The page, from a plant model's directory and a report holding a verdict."""
    card = json.loads((model_dir / "model.json").read_text())
    report = json.loads(report_path.read_text())
    verdict = report.get("verdict") or (report.get("ope") or {}).get("verdict")
    if not verdict:
        raise SystemExit(
            f"{report_path}: no verdict in it; train or evaluate with --plant-model {model_dir}"
        )
    evidence = verdict["evidence"]
    if verdict["decision"] == "recommend":
        headline = f"**Recommend {verdict['recommended']}** (an estimate; see why below)."
    else:
        headline = "**Keep the current operation.**"
    lines = [
        f"# {card['task']['name']}: is a learned policy better than today's operation?",
        "",
        headline,
        "",
        f"Every number is an estimate from the plant's log, not a measurement: "
        f"{evidence['heldout_transitions']:,} transitions in {evidence['heldout_episodes']} "
        f"episodes that neither trained the candidates nor fitted the plant model, "
        f"{evidence['members']} model members. Estimators: {', '.join(verdict['estimators'])} "
        f"({', '.join(verdict['deciding'])} decide).",
        "",
        *calibration_section(verdict),
        "",
        *fidelity_section(card),
        "",
        *candidates_section(verdict),
        "",
        *why_section(verdict),
        "",
        *trust_section(),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(f"usage: python {sys.argv[0]} MODEL_DIR REPORT_JSON")
    sys.stdout.write(answer(Path(sys.argv[1]), Path(sys.argv[2])))
