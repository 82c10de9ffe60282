"""The shadow report: how a policy run in shadow mode compares with what the operators
did, and how often (and why) the shield would have overridden it.

* **Agreement per action.** A decided tick's action (the shielded one the bridge would
  have written) is paired with what the operators applied for the same observation: the
  applied value read at the next tick (the actuators' state after the operators acted on
  the reading the policy saw). Only consecutive ticks pair; ticks the bridge wrote itself
  (closed loop) do not, nor faulty ones. The difference, policy minus operators, in the
  action's own unit: mean, median, 5th and 95th percentiles, mean absolute difference,
  and the share within a tolerance (default: 5 % of the action's range).
* **Overrides.** How often the shield changed the policy's proposal on decided ticks, and
  which constraints the proposals broke (a tick counts once per constraint); fallbacks
  and faulty ticks apart.
* **Effect of following the policy.** An estimate from a plant model
  (:class:`~neorl_industrial.wrappers.models.PlantModel`) of the same task, one step
  ahead: for every paired tick (the logged observation, the operators' applied action and
  the policy's shielded action), each elite member's deterministic mean prediction of the
  reward and cost channels of the next step under both actions. Per channel: the mean
  difference (policy minus operators, member mean), a 95 % bootstrap interval over ticks
  of the member-mean difference, the range of the members' own mean differences, and the
  share of ticks where the model flags an input outside its data (the estimate is called
  unreliable above :data:`OOD_UNRELIABLE`). Without a plant model the report says so
  (``not available: no plant model``) rather than estimating it.

:func:`shadow_report` writes ``report.json``, ``report.md``, ``pairs.csv`` and the plots
(``differences.png``, ``actions.png``, ``overrides.png``); :func:`log_to_mlflow` puts them
on the policy's registered version (artifacts on its run, the headline numbers as version
tags), so a promotion to closed loop can cite them.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from neorl_industrial.integration.plant_floor.effect import (
    BOOTSTRAP_RESAMPLES,  # noqa: F401  (re-exported with the report)
    CONFIDENCE,  # noqa: F401
    ESTIMATOR,
    OOD_UNRELIABLE,  # noqa: F401
    ChannelEffect,
    PlantEffect,
    estimate_effect,
    format_cell,
    format_interval,
    load_plant_model,
)
from neorl_industrial.integration.plant_floor.ticklog import TickLogError, read_tick_log

if TYPE_CHECKING:
    from neorl_industrial.wrappers.models import PlantModel

__all__ = [
    "ESTIMATOR",
    "NO_PLANT_MODEL",
    "ChannelEffect",
    "PlantEffect",
    "ShadowReport",
    "build_report",
    "estimate_effect",
    "load_plant_model",
    "log_to_mlflow",
    "shadow_report",
]

#: What the report says about the policy's effect while no plant model is given.
NO_PLANT_MODEL = "not available: no plant model (--plant-model DIR)"
#: The default agreement tolerance, as a share of an action's range.
TOLERANCE_SHARE = 0.05


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


@dataclasses.dataclass
class ActionAgreement:
    name: str
    unit: str | None
    pairs: int
    tolerance: float
    mean: float | None = None
    median: float | None = None
    p05: float | None = None
    p95: float | None = None
    mean_absolute: float | None = None
    within_tolerance: float | None = None


@dataclasses.dataclass
class ShadowReport:
    """The numbers of a shadow report (see the module docstring)."""

    log: str
    mode: str
    policy: dict[str, Any]
    ticks: int
    decided: int
    faulty: int
    missed: int
    disconnections: int
    actions: list[ActionAgreement]
    overridden: int
    override_rate: float | None
    by_constraint: dict[str, int]
    fallbacks: int
    incidents: int
    #: the effect's headline (or why there is none); the numbers in ``effect``.
    plant_effect: str = NO_PLANT_MODEL
    effect: PlantEffect | None = None
    #: per action: ``[pairs, 3]`` of tick, policy, operators (for the plots and CSV).
    series: dict[str, np.ndarray] = dataclasses.field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("series")
        return data

    def markdown(self) -> str:
        """The report as a Markdown document (tables of agreement and overrides)."""
        version = self.policy.get("version")
        lines = [
            f"# Shadow report: {self.policy.get('source')} ({version})",
            "",
            f"Log `{self.log}` ({self.mode}): {self.ticks} ticks, {self.decided} decided, "
            f"{self.faulty} faulty, {self.missed} missed, {self.disconnections} lost "
            "connection(s).",
            "",
            "## Agreement with the operators (policy minus operators, in the action's unit)",
            "",
            "| action | unit | pairs | mean | median | p5 | p95 | mean abs | within tolerance |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for a in self.actions:
            cells = [format_cell(v) for v in (a.mean, a.median, a.p05, a.p95, a.mean_absolute)]
            share = "-" if a.within_tolerance is None else f"{100 * a.within_tolerance:.1f} %"
            lines.append(
                f"| {a.name} | {a.unit or '-'} | {a.pairs} | {' | '.join(cells)} | "
                f"{share} (±{a.tolerance:g}) |"
            )
        rate = "-" if self.override_rate is None else f"{100 * self.override_rate:.1f} %"
        lines += [
            "",
            "## What the shield would have overridden",
            "",
            f"{self.overridden} of {self.decided} decided ticks ({rate}); "
            f"{self.fallbacks} fallback(s) on decided ticks, {self.faulty} faulty tick(s) "
            f"with the fallback, {self.incidents} incident(s) of the server's own check.",
            "",
            "| constraint the proposal broke | ticks | share of decided |",
            "|---|---:|---:|",
        ]
        for name, count in self.by_constraint.items():
            share = f"{100 * count / self.decided:.1f} %" if self.decided else "-"
            lines.append(f"| {name} | {count} | {share} |")
        lines += ["", "## Estimated effect of following the policy", ""]
        lines += self.effect.markdown() if self.effect is not None else [self.plant_effect]
        lines.append("")
        return "\n".join(lines)


def _agreement(name: str, unit: str | None, tolerance: float, pairs: np.ndarray) -> ActionAgreement:
    found = ActionAgreement(name, unit, len(pairs), tolerance)
    if len(pairs):
        difference = pairs[:, 1] - pairs[:, 2]
        found.mean = float(np.mean(difference))
        found.median = float(np.median(difference))
        found.p05, found.p95 = (float(x) for x in np.percentile(difference, [5, 95]))
        found.mean_absolute = float(np.mean(np.abs(difference)))
        found.within_tolerance = float(np.mean(np.abs(difference) <= tolerance))
    return found


def _read_log(
    path: str | Path, tolerances: dict[str, float]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The last header of the log at ``path`` and its records.

    Raises:
        TickLogError: for a log that cannot be read, or stretches for other tasks.
        ValueError: for a tolerance naming an action the task lacks.
    """
    headers, records = read_tick_log(path)
    header = headers[-1]
    names = list(header["task"]["action_names"])
    for other in headers[:-1]:
        if other["task"]["action_names"] != names:
            raise TickLogError(
                f"{path}: stretches for other tasks (actions {other['task']['action_names']} "
                f"and {names}); report one task's log at a time"
            )
    unknown = sorted(set(tolerances) - set(names))
    if unknown:
        raise ValueError(f"tolerance: {unknown} not among the task's actions {names}")
    return header, records


def _pair(
    ticks: list[dict[str, Any]], decided: list[dict[str, Any]], names: list[str]
) -> tuple[dict[str, list[tuple[float, float, float]]], list[tuple[list[float], ...]]]:
    """Each decided tick the bridge did not write paired with the next tick: per action,
    ``(tick, policy, operators)`` where both are finite; and the ``(observation,
    operators' action, policy's action)`` of the ticks where all of them are."""
    pairs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
    by_tick = {(r["header"], r["tick"]): r for r in ticks}
    states: list[tuple[list[float], ...]] = []
    for record in decided:
        if record.get("written"):
            continue
        following = by_tick.get((record["header"], record["tick"] + 1))
        if following is None:
            continue
        state = [
            [_float(v) for v in record.get(key) or []] for key in ("observation", "action")
        ] + [[_float(v) for v in following.get("applied") or []]]
        if all(len(part) and all(map(math.isfinite, part)) for part in state):
            states.append((state[0], state[2], state[1]))
        for i, name in enumerate(names):
            policy, operators = _float(record["action"][i]), _float(following["applied"][i])
            if math.isfinite(policy) and math.isfinite(operators):
                pairs[name].append((float(record["tick"]), policy, operators))
    return pairs, states


def _agreements(
    task: dict[str, Any],
    tolerances: dict[str, float],
    pairs: dict[str, list[tuple[float, float, float]]],
) -> tuple[list[ActionAgreement], dict[str, np.ndarray]]:
    """Per action, its agreement with the operators and its pairs as an array.

    Raises:
        ValueError: for a tolerance outside the action's range.
    """
    low = np.asarray(task["action_low"], np.float64)
    high = np.asarray(task["action_high"], np.float64)
    actions = []
    series = {}
    for i, name in enumerate(task["action_names"]):
        span = high[i] - low[i]
        default = TOLERANCE_SHARE * span if math.isfinite(span) else math.nan
        tolerance = float(tolerances.get(name, default))
        limit = span if math.isfinite(span) else math.inf
        if name in tolerances and not (math.isfinite(tolerance) and 0.0 <= tolerance <= limit):
            raise ValueError(
                f"tolerance {name}={tolerance!r}: outside the allowed range [0, {limit:g}] "
                "(the action's range)"
            )
        array = np.asarray(pairs[name], np.float64).reshape(-1, 3)
        series[name] = array
        actions.append(_agreement(name, task["action_units"][i], tolerance, array))
    return actions, series


def _overrides(decided: list[dict[str, Any]], constraints: list[str]) -> tuple[int, dict[str, int]]:
    """The decided ticks the shield overrode, and per constraint the overridden ticks
    whose proposal broke it (the task's constraints first, in their order)."""
    counts: Counter[str] = Counter()
    for record in decided:
        if record.get("overridden"):
            counts.update(record.get("violated") or [])
    overridden = sum(bool(r.get("overridden")) for r in decided)
    order = [name for name in constraints if counts[name]]
    order += sorted(name for name in counts if name not in order)
    return overridden, {name: counts[name] for name in order}


def _effect(
    model: PlantModel,
    plant_model: str | Path,
    task: dict[str, Any],
    states: list[tuple[list[float], ...]],
) -> PlantEffect:
    """The plant model's estimate over the paired ticks' ``states``."""
    names = task["action_names"]
    sizes = (len(task["observation_names"]), len(names), len(names))
    observations, operators, policy = (
        np.asarray([s[i] for s in states], np.float64).reshape(len(states), size)
        for i, size in enumerate(sizes)
    )
    return estimate_effect(model, plant_model, observations, operators, policy)


def build_report(
    path: str | Path,
    tolerances: dict[str, float] | None = None,
    plant_model: str | Path | None = None,
) -> ShadowReport:
    """The report of the tick log at ``path`` (the last header's policy and task; records
    of earlier stretches with the same task count too).

    With ``plant_model`` (a saved plant model's directory), the effect of following the
    policy is estimated with it.

    Raises:
        TickLogError: for a log that cannot be read, or stretches for other tasks.
        ValueError: for a tolerance naming an action the task lacks.
        PlantModelError: for a plant model of another task (named), or one that cannot be
            read.
    """
    tolerances = dict(tolerances or {})
    header, records = _read_log(path, tolerances)
    task = header["task"]
    model = None if plant_model is None else load_plant_model(plant_model, task, path)
    ticks = [r for r in records if r["kind"] == "tick"]
    events = [r for r in records if r["kind"] == "event"]
    decided = [r for r in ticks if not r.get("faults")]
    pairs, states = _pair(ticks, decided, list(task["action_names"]))
    actions, series = _agreements(task, tolerances, pairs)
    overridden, by_constraint = _overrides(decided, header.get("constraints", []))
    effect = None if model is None else _effect(model, plant_model, task, states)
    return ShadowReport(
        log=str(path),
        mode=str(header.get("mode")),
        policy=dict(header.get("policy") or {}),
        ticks=len(ticks),
        decided=len(decided),
        faulty=len(ticks) - len(decided),
        missed=sum(int(e.get("count", 0)) for e in events if e.get("event") == "missed_ticks"),
        disconnections=sum(e.get("event") == "disconnected" for e in events),
        actions=actions,
        overridden=overridden,
        override_rate=overridden / len(decided) if decided else None,
        by_constraint=by_constraint,
        fallbacks=sum(bool((r.get("flags") or {}).get("fallback")) for r in decided),
        incidents=sum(bool((r.get("flags") or {}).get("incident")) for r in decided),
        series=series,
        plant_effect=NO_PLANT_MODEL if effect is None else effect.headline(),
        effect=effect,
    )


def _plots(report: ShadowReport, out: Path) -> list[Path]:
    from neorl_industrial.integration.mlflow.plots import figure_panels, save_figure

    written = []
    names = [a.name for a in report.actions]
    figure, axes = figure_panels(len(names))
    for axis, agreement in zip(axes, report.actions, strict=True):
        pairs = report.series[agreement.name]
        if len(pairs):
            difference = pairs[:, 1] - pairs[:, 2]
            # Differences equal but for rounding (a constant offset) get one bin's width.
            spread = np.ptp(difference) > 1e-9 * max(1.0, float(np.max(np.abs(difference))))
            middle = float(np.median(difference))
            axis.hist(
                difference,
                bins=min(40, max(5, len(pairs) // 5)),
                range=None if spread else (middle - 0.5, middle + 0.5),
            )
        axis.axvline(0.0, color="black", lw=1)
        axis.set_title(f"{agreement.name}: policy - operators")
        axis.set_xlabel(agreement.unit or "")
        axis.set_ylabel("ticks")
    written.append(save_figure(figure, out / "differences.png"))
    figure, axes = figure_panels(len(names))
    for axis, agreement in zip(axes, report.actions, strict=True):
        pairs = report.series[agreement.name]
        axis.plot(pairs[:, 0], pairs[:, 2], lw=1, label="operators")
        axis.plot(pairs[:, 0], pairs[:, 1], lw=1, label="policy (shielded)")
        axis.set_title(agreement.name)
        axis.set_xlabel("tick")
        axis.set_ylabel(agreement.unit or "")
        axis.legend(fontsize=7)
        axis.grid(alpha=0.3)
    written.append(save_figure(figure, out / "actions.png"))
    figure, (axis,) = figure_panels(1)
    labels = list(report.by_constraint) or ["(none)"]
    axis.barh(labels, [report.by_constraint.get(name, 0) for name in labels])
    axis.set_xlabel(f"decided ticks whose proposal broke it (of {report.decided})")
    axis.set_title("what the shield would have overridden")
    written.append(save_figure(figure, out / "overrides.png"))
    return written


def shadow_report(
    path: str | Path,
    out: str | Path,
    tolerances: dict[str, float] | None = None,
    plant_model: str | Path | None = None,
) -> ShadowReport:
    """Builds the report of the log at ``path`` (with the plant model saved at
    ``plant_model``, when given) and writes it to the directory ``out``."""
    report = build_report(path, tolerances, plant_model)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report.to_dict(), indent=2, allow_nan=False) + "\n")
    (out / "report.md").write_text(report.markdown())
    with (out / "pairs.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["action", "tick", "policy", "operators", "difference"])
        for name, pairs in report.series.items():
            for tick, policy, operators in pairs.tolist():
                writer.writerow([name, int(tick), policy, operators, policy - operators])
    _plots(report, out)
    return report


def log_to_mlflow(
    report: ShadowReport,
    out: str | Path,
    model_uri: str | None = None,
    tracking_uri: str | None = None,
) -> dict[str, Any]:
    """Logs the report in ``out`` on the policy's registered version: the files as
    artifacts of the version's run (``shadow_report/<log name>/``), the headline numbers
    as version tags (``shadow_report.*``).

    Args:
        model_uri: ``models:/name/version`` or ``models:/name@alias``; default: the
            registered version the log's header names (a bridge started from a URI).

    Returns:
        The version's name, number, run id and the artifacts' URI.

    Raises:
        ValueError: when neither the URI nor the log names a registered version.
    """
    from mlflow import MlflowClient

    from neorl_industrial.integration.mlflow.registry import describe_model_uri
    from neorl_industrial.integration.mlflow.sender import resolve_tracking_uri

    registry = report.policy.get("registry") or {}
    if model_uri is not None:
        registry = describe_model_uri(model_uri, tracking_uri)
    if not registry.get("version"):
        raise ValueError(
            f"{report.log}: the policy ({report.policy.get('source')}) is not a registered "
            "version; name it with --model models:/<name>/<version> to log the report on it"
        )
    store = resolve_tracking_uri(tracking_uri)
    client = MlflowClient(tracking_uri=store, registry_uri=store)
    name, version, run_id = registry["name"], str(registry["version"]), registry.get("run_id")
    artifact_path = f"shadow_report/{Path(report.log).stem}"
    uri = None
    if run_id:
        client.log_artifacts(run_id, str(out), artifact_path)
        uri = f"runs:/{run_id}/{artifact_path}"
    tags = {
        "shadow_report.log": Path(report.log).name,
        "shadow_report.ticks": str(report.ticks),
        "shadow_report.decided": str(report.decided),
        "shadow_report.override_rate": format_cell(report.override_rate),
        "shadow_report.plant_effect": report.plant_effect,
    }
    if uri:
        tags["shadow_report.artifacts"] = uri
    if report.effect is not None:
        effect = report.effect
        tags["shadow_report.effect.estimator"] = effect.estimator
        tags["shadow_report.effect.out_of_distribution"] = format_cell(effect.out_of_distribution)
        for channel in effect.channels:
            tags[f"shadow_report.effect.{channel.name}"] = (
                f"{channel.difference:+.4g} {format_interval(channel.interval)}"
            )
    for agreement in report.actions:
        tags[f"shadow_report.within_tolerance.{agreement.name}"] = format_cell(
            agreement.within_tolerance
        )
        tags[f"shadow_report.mean_absolute.{agreement.name}"] = format_cell(agreement.mean_absolute)
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    return {"name": name, "version": version, "run_id": run_id, "artifacts": uri}
