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

from neorl_industrial.core.units import same_unit
from neorl_industrial.integration.plant_floor.ticklog import TickLogError, read_tick_log

if TYPE_CHECKING:
    from neorl_industrial.core.models.dynamics import Dynamics
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
#: How the effect is estimated.
ESTIMATOR = "plant model, one step ahead"
#: Above this share of ticks outside the model's data, the estimate is called unreliable.
OOD_UNRELIABLE = 0.2
#: Bootstrap resamples of the ticks, and the interval's confidence level.
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95
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
class ChannelEffect:
    """The estimated effect on one channel (reward or a cost) of the next step."""

    name: str
    #: mean over ticks of the members' mean prediction, under each action.
    policy: float
    operators: float
    #: policy minus operators: the mean over ticks of the member-mean difference.
    difference: float
    #: a bootstrap interval over ticks of that mean (None for fewer than two ticks).
    interval: list[float] | None
    #: the lowest and highest of the members' own mean differences.
    member_range: list[float]
    reading: str


@dataclasses.dataclass
class PlantEffect:
    """What a plant model estimates following the policy would have changed."""

    estimator: str
    model: str
    task: str
    members: int
    ticks: int
    channels: list[ChannelEffect]
    #: share of ticks whose observation or either action lies outside the model's data.
    out_of_distribution: float
    reliable: bool
    confidence: float
    #: the model card's held-out fidelity of the channels one step ahead.
    fidelity: list[dict[str, Any]]

    def headline(self) -> str:
        """One line: the first channel's difference and interval, and the reliability."""
        if not self.channels:
            return f"{ESTIMATOR}: no tick with an observation and both actions"
        first = self.channels[0]
        text = (
            f"{first.name} {first.difference:+.4g} (policy - operators; "
            f"{_interval(first.interval)}, members {_interval(first.member_range)}) "
            f"[{self.estimator}, {self.ticks} ticks]"
        )
        if not self.reliable:
            text += f"; unreliable: {100 * self.out_of_distribution:.0f} % of ticks out of data"
        return text

    def markdown(self) -> list[str]:
        level = f"{100 * self.confidence:g} %"
        lines = [
            f"An estimate, not a measurement. Estimator: {self.estimator}, with the plant model "
            f"`{self.model}` (task {self.task}, {self.members} members) on {self.ticks} "
            "paired ticks (the logged observation; the operators' applied action and the "
            "policy's shielded action).",
            "",
            f"| channel | operators | policy | policy - operators | {level} interval (ticks) "
            "| member range | reading |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for c in self.channels:
            lines.append(
                f"| {c.name} | {c.operators:.4g} | {c.policy:.4g} | {c.difference:+.4g} | "
                f"{_interval(c.interval)} | {_interval(c.member_range)} | {c.reading} |"
            )
        share = f"{100 * self.out_of_distribution:.1f} %"
        lines += [
            "",
            f"Out of the model's data: {share} of the ticks"
            + (
                "."
                if self.reliable
                else f" (more than {100 * OOD_UNRELIABLE:g} %): the estimate is unreliable."
            ),
        ]
        if self.fidelity:
            lines += [
                "",
                "The model's held-out fidelity one step ahead (its card):",
                "",
                "| channel | RMSE | relative RMSE | 90 % interval coverage |",
                "|---|---:|---:|---:|",
            ]
            for row in self.fidelity:
                cells = [_cell(row.get(k)) for k in ("rmse", "relative_rmse", "coverage")]
                lines.append(f"| {row['name']} | {' | '.join(cells)} |")
        return lines


def _interval(pair: list[float] | None) -> str:
    return "-" if pair is None else f"[{pair[0]:+.4g}, {pair[1]:+.4g}]"


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
        lines += ["", "## Estimated effect of following the policy", ""]
        lines += self.effect.markdown() if self.effect is not None else [self.plant_effect]
        lines.append("")
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


def _fidelity(card: dict[str, Any]) -> list[dict[str, Any]]:
    rows = (card.get("fidelity") or {}).get("rows") or []
    return [row for row in rows if row.get("kind") == "signal" and row.get("step") == 1]


def load_plant_model(path: str | Path, task: dict[str, Any], log: str | Path) -> PlantModel:
    """The plant model saved at ``path``, refused unless it is of the log's task: the
    same observation and action names (and units, where the log states them).

    Raises:
        PlantModelError: naming the model's and the log's task where they differ, or the
            model's file that is missing or unreadable.
    """
    from neorl_industrial.wrappers.models import PlantModel, PlantModelError

    missing = [key for key in ("observation_names", "action_names") if not task.get(key)]
    if missing:
        raise PlantModelError(
            f"{log}: its header's task names no {' and no '.join(missing)}; the plant model "
            f"{path} cannot be matched to it"
        )
    model = PlantModel.load(path)
    mine = model.task
    differences = []
    for field in ("observation_names", "action_names", "observation_units", "action_units"):
        theirs = task.get(field)
        if theirs is None:
            continue
        ours = list(getattr(mine, field))
        if field.endswith("units"):
            # Units are compared as units (degC is °C), not as written.
            same = len(ours) == len(theirs) and all(
                same_unit(a, b) for a, b in zip(ours, theirs, strict=True)
            )
        else:
            same = ours == list(theirs)
        if not same:
            differences.append(f"{field} {ours} vs {list(theirs)}")
    if differences:
        raise PlantModelError(
            f"plant model {path}: task {mine.name!r} is not the task of the log {log} "
            f"({'; '.join(differences)}); fit a plant model on this plant's data"
        )
    return model


def _effect_program(dynamics: Dynamics) -> Any:
    """Compiled: the reward, costs and out-of-distribution measure of every member's
    deterministic one-step prediction, ``[actions, members, ticks, ...]`` for observations
    ``[ticks, obs]`` and actions ``[actions, ticks, act]`` in [-1, 1]. Each member's is
    ``transition`` of that member alone: the numbers of ``step`` with ``member`` and
    ``deterministic``, one network evaluated instead of all."""
    import jax
    import jax.numpy as jnp

    from neorl_industrial.core.models.dynamics import out_of_distribution

    def one(params, member, observation, action):
        _, reward, costs, _ = dynamics.transition(
            params, observation, action, jax.random.PRNGKey(0), member, True
        )
        return reward, costs

    @jax.jit
    def program(params, observations, actions):
        over_ticks = jax.vmap(one, in_axes=(None, None, 0, 0))
        over_members = jax.vmap(over_ticks, in_axes=(None, 0, None, None))
        over_actions = jax.vmap(over_members, in_axes=(None, None, None, 0))
        rewards, costs = over_actions(params, jnp.arange(params.n_members), observations, actions)
        ood = jax.vmap(
            jax.vmap(out_of_distribution, in_axes=(None, 0, 0)), in_axes=(None, None, 0)
        )(params, observations, actions)
        return rewards, costs, ood

    return program


def _reading(interval: list[float] | None, member_range: list[float]) -> str:
    """One line: whether the intervals (over ticks and over members) contain 0."""
    low = min(member_range[0], interval[0] if interval else member_range[0])
    high = max(member_range[1], interval[1] if interval else member_range[1])
    if low <= 0.0 <= high:
        return "an interval contains 0: the model cannot tell them apart"
    side = "higher" if low > 0 else "lower"
    return f"{side} under the policy (both intervals {'above' if low > 0 else 'below'} 0)"


def estimate_effect(
    model: PlantModel,
    model_dir: str | Path,
    observations: np.ndarray,
    operators: np.ndarray,
    policy: np.ndarray,
    *,
    seed: int = 0,
) -> PlantEffect:
    """The plant model's one-step estimate of following ``policy`` instead of
    ``operators`` (both ``[ticks, act]`` in plant units) from ``observations``
    ``[ticks, obs]`` (see the module docstring)."""
    from scipy.stats import bootstrap

    task = model.task
    low = np.asarray(task.action_low, np.float64)
    high = np.asarray(task.action_high, np.float64)
    actions = np.stack([operators, policy]).astype(np.float64)
    if model.scaler is not None:
        # As the model maps plant units: not clipped, so the out-of-distribution measure
        # sees an action outside its bounds.
        actions = 2.0 * (actions - low) / (high - low) - 1.0
    params = model.params(seed)
    members = params.n_members
    ticks = len(observations)
    channels: list[ChannelEffect] = []
    share = 0.0
    if ticks:
        rewards, costs, ood = (
            np.asarray(x, np.float64)
            for x in _effect_program(model.dynamics)(
                params, np.asarray(observations, np.float32), np.asarray(actions, np.float32)
            )
        )
        share = float(np.mean(np.max(ood, axis=0) > 0.0))
        values = {"reward": rewards} | {
            name: costs[..., i] for i, name in enumerate(task.cost_names)
        }
        for name, value in values.items():  # [2 (operators, policy), members, ticks]
            difference = value[1] - value[0]
            per_tick = difference.mean(axis=0)
            per_member = difference.mean(axis=1)
            interval = None
            if ticks > 1:
                found = bootstrap(
                    (per_tick,),
                    np.mean,
                    n_resamples=BOOTSTRAP_RESAMPLES,
                    confidence_level=CONFIDENCE,
                    method="percentile",
                    rng=np.random.default_rng(seed),
                ).confidence_interval
                interval = [float(found.low), float(found.high)]
            member_range = [float(per_member.min()), float(per_member.max())]
            channels.append(
                ChannelEffect(
                    name=name,
                    policy=float(value[1].mean()),
                    operators=float(value[0].mean()),
                    difference=float(per_tick.mean()),
                    interval=interval,
                    member_range=member_range,
                    reading=_reading(interval, member_range),
                )
            )
    return PlantEffect(
        estimator=ESTIMATOR,
        model=str(model_dir),
        task=task.name,
        members=members,
        ticks=ticks,
        channels=channels,
        out_of_distribution=share,
        reliable=share <= OOD_UNRELIABLE,
        confidence=CONFIDENCE,
        fidelity=_fidelity(model.card),
    )


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
    model = None if plant_model is None else load_plant_model(plant_model, task, path)
    low = np.asarray(task["action_low"], np.float64)
    high = np.asarray(task["action_high"], np.float64)
    ticks = [r for r in records if r["kind"] == "tick"]
    events = [r for r in records if r["kind"] == "event"]
    decided = [r for r in ticks if not r.get("faults")]
    pairs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
    by_tick = {(r["header"], r["tick"]): r for r in ticks}
    states: list[tuple[list[float], list[float], list[float]]] = []
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
    actions = []
    series = {}
    for i, name in enumerate(names):
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
    counts: Counter[str] = Counter()
    for record in decided:
        if record.get("overridden"):
            counts.update(record.get("violated") or [])
    overridden = sum(bool(r.get("overridden")) for r in decided)
    order = [name for name in header.get("constraints", []) if counts[name]]
    order += sorted(name for name in counts if name not in order)
    effect = None
    if model is not None:
        sizes = (len(task["observation_names"]), len(names), len(names))
        observations, operators, policy = (
            np.asarray([s[i] for s in states], np.float64).reshape(len(states), size)
            for i, size in enumerate(sizes)
        )
        effect = estimate_effect(model, plant_model, observations, operators, policy)
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
        "shadow_report.override_rate": _cell(report.override_rate),
        "shadow_report.plant_effect": report.plant_effect,
    }
    if uri:
        tags["shadow_report.artifacts"] = uri
    if report.effect is not None:
        effect = report.effect
        tags["shadow_report.effect.estimator"] = effect.estimator
        tags["shadow_report.effect.out_of_distribution"] = _cell(effect.out_of_distribution)
        for channel in effect.channels:
            tags[f"shadow_report.effect.{channel.name}"] = (
                f"{channel.difference:+.4g} {_interval(channel.interval)}"
            )
    for agreement in report.actions:
        tags[f"shadow_report.within_tolerance.{agreement.name}"] = _cell(agreement.within_tolerance)
        tags[f"shadow_report.mean_absolute.{agreement.name}"] = _cell(agreement.mean_absolute)
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    return {"name": name, "version": version, "run_id": run_id, "artifacts": uri}
