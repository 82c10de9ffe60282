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
* **Effect of following the policy.** Needs a validated plant model; without one the
  report says so (``not available: no plant model``) rather than estimating it.

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
from typing import Any

import numpy as np

from neorl_industrial.integration.plant_floor.ticklog import TickLogError, read_tick_log

__all__ = ["NO_PLANT_MODEL", "ShadowReport", "log_to_mlflow", "shadow_report"]

#: What the report says about the policy's effect while no plant model is given.
NO_PLANT_MODEL = "not available: no plant model"
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
    plant_effect: str = NO_PLANT_MODEL
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
            cells = [_cell(v) for v in (a.mean, a.median, a.p05, a.p95, a.mean_absolute)]
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
        lines += ["", "## Estimated effect of following the policy", "", self.plant_effect, ""]
        return "\n".join(lines)


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


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


def build_report(path: str | Path, tolerances: dict[str, float] | None = None) -> ShadowReport:
    """The report of the tick log at ``path`` (the last header's policy and task; records
    of earlier stretches with the same task count too).

    Raises:
        TickLogError: for a log that cannot be read, or stretches for other tasks.
        ValueError: for a tolerance naming an action the task lacks.
    """
    headers, records = read_tick_log(path)
    header = headers[-1]
    task = header["task"]
    names = list(task["action_names"])
    for other in headers[:-1]:
        if other["task"]["action_names"] != names:
            raise TickLogError(
                f"{path}: stretches for other tasks (actions {other['task']['action_names']} "
                f"and {names}); report one task's log at a time"
            )
    tolerances = dict(tolerances or {})
    unknown = sorted(set(tolerances) - set(names))
    if unknown:
        raise ValueError(f"tolerance: {unknown} not among the task's actions {names}")
    low = np.asarray(task["action_low"], np.float64)
    high = np.asarray(task["action_high"], np.float64)
    ticks = [r for r in records if r["kind"] == "tick"]
    events = [r for r in records if r["kind"] == "event"]
    decided = [r for r in ticks if not r.get("faults")]
    pairs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
    by_tick = {(r["header"], r["tick"]): r for r in ticks}
    for record in decided:
        if record.get("written"):
            continue
        following = by_tick.get((record["header"], record["tick"] + 1))
        if following is None:
            continue
        for i, name in enumerate(names):
            policy, operators = _float(record["action"][i]), _float(following["applied"][i])
            if math.isfinite(policy) and math.isfinite(operators):
                pairs[name].append((float(record["tick"]), policy, operators))
    actions = []
    series = {}
    for i, name in enumerate(names):
        span = high[i] - low[i]
        default = TOLERANCE_SHARE * span if math.isfinite(span) else math.nan
        tolerance = float(tolerances.get(name, default))
        array = np.asarray(pairs[name], np.float64).reshape(-1, 3)
        series[name] = array
        actions.append(_agreement(name, task["action_units"][i], tolerance, array))
    counts: Counter[str] = Counter()
    for record in decided:
        if record.get("overridden"):
            counts.update(record.get("violated") or [])
    overridden = sum(bool(r.get("overridden")) for r in decided)
    order = [name for name in header.get("constraints", []) if counts[name]]
    order += sorted(name for name in counts if name not in order)
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
        by_constraint={name: counts[name] for name in order},
        fallbacks=sum(bool((r.get("flags") or {}).get("fallback")) for r in decided),
        incidents=sum(bool((r.get("flags") or {}).get("incident")) for r in decided),
        series=series,
    )


def _plots(report: ShadowReport, out: Path) -> list[Path]:
    from neorl_industrial.integration.mlflow.plots import figure_panels, save_figure

    written = []
    names = [a.name for a in report.actions]
    figure, axes = figure_panels(len(names))
    for axis, agreement in zip(axes, report.actions, strict=True):
        pairs = report.series[agreement.name]
        if len(pairs):
            axis.hist(pairs[:, 1] - pairs[:, 2], bins=min(40, max(5, len(pairs) // 5)))
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
    path: str | Path, out: str | Path, tolerances: dict[str, float] | None = None
) -> ShadowReport:
    """Builds the report of the log at ``path`` and writes it to the directory ``out``."""
    report = build_report(path, tolerances)
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
        "shadow_report.override_rate": _cell(report.override_rate),
        "shadow_report.plant_effect": report.plant_effect,
    }
    if uri:
        tags["shadow_report.artifacts"] = uri
    for agreement in report.actions:
        tags[f"shadow_report.within_tolerance.{agreement.name}"] = _cell(agreement.within_tolerance)
        tags[f"shadow_report.mean_absolute.{agreement.name}"] = _cell(agreement.mean_absolute)
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    return {"name": name, "version": version, "run_id": run_id, "artifacts": uri}
