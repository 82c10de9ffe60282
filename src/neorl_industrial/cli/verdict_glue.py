"""The ``verdict`` command's glue: one verdict over every candidate of several runs and
sweeps (their saved agents), judged together against the logged operation with a plant
model, written as a report and, when the runs are tracked, an MLflow run."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np

from neorl_industrial.cli.run_glue import load_data
from neorl_industrial.integration.mlflow.run_logging import verdict_tags, write_report
from neorl_industrial.wrappers.agents.agent import Agent, AgentError
from neorl_industrial.wrappers.training import RunConfig

__all__ = ["LoggedData", "VerdictOutcome", "run_verdict"]


@dataclasses.dataclass(frozen=True)
class LoggedData:
    """A logged dataset to judge runs on: its path and, for a CSV/Parquet plant log, its
    YAML schema (ignored for the other formats)."""

    path: str | Path
    schema: str | Path | None = None


@dataclasses.dataclass
class VerdictOutcome:
    """What ``run_verdict`` judged and wrote."""

    joint: Any  # a JointVerdict
    report: dict[str, Any]
    out_dir: Path
    run_dirs: dict[str, Path]


def _saved_run(path: str | Path) -> tuple[Path, Path]:
    """``(run directory, saved agent directory)`` of a run's or sweep's directory, or of
    its saved agent.

    Raises:
        AgentError: for a path that is neither.
    """
    from neorl_industrial.wrappers.agents.agent import MANIFEST

    path = Path(path)
    if (path / "agent" / MANIFEST).is_file():
        return path, path / "agent"
    if (path / MANIFEST).is_file():
        return path.parent, path
    raise AgentError(
        f"{path}: neither a run's directory (no agent/{MANIFEST}) nor a saved agent (no "
        f"{MANIFEST}); give the directory train or sweep wrote"
    )


def _located(runs: list[str | Path]) -> dict[str, tuple[Path, Path]]:
    """``{run name: (run directory, saved agent)}`` of ``runs``.

    Raises:
        AgentError: for a path that is not a run, or two runs of one name.
    """
    located: dict[str, tuple[Path, Path]] = {}
    for path in runs:
        run_dir, saved = _saved_run(path)
        label = run_dir.absolute().name
        if label in located:
            raise AgentError(
                f"{path}: a second run named {label!r} (the other is {located[label][0]}); "
                "one verdict names candidates by their run's name: give runs of distinct names"
            )
        located[label] = (run_dir, saved)
    return located


def _log(data: LoggedData | None, config: RunConfig | None, run_dir: Path) -> tuple[Any, Any, str]:
    """``(dataset, card, source)`` of the log the runs are judged on: ``data``, else the
    first run's own (``config``, its ``config.yaml``).

    Raises:
        AgentError: naming the file that cannot be read, or the missing ``config.yaml``.
    """
    from neorl_industrial.integration.datasets import DatasetFormatError, load_any

    if data is not None:
        try:
            dataset, card = load_any(data.path, schema=data.schema)
        except (DatasetFormatError, FileNotFoundError) as error:
            raise AgentError(f"--data: {error}") from None
        return dataset, card, str(data.path)
    if config is None:
        raise AgentError(
            f"{run_dir}: no config.yaml to read the runs' log from; give it "
            "(--data DATASET [--schema S])"
        )
    try:
        dataset, facts, card = load_data(config)
    except (DatasetFormatError, FileNotFoundError) as error:
        raise AgentError(f"{run_dir}/config.yaml: data.path: {error}") from None
    return dataset, card, facts["source"]


def _out_dir(out: str | Path | None) -> Path:
    """Where the verdict is written (default ``verdicts/verdict-<time>``).

    Raises:
        AgentError: for a directory that holds files already.
    """
    out_dir = (
        Path(out)
        if out is not None
        else Path("verdicts") / time.strftime("verdict-%Y%m%dT%H%M%SZ", time.gmtime())
    )
    if out_dir.exists() and any(out_dir.iterdir()):
        raise AgentError(f"{out_dir}: holds files already; give another --out (nothing written)")
    return out_dir


def run_verdict(
    runs: list[str | Path],
    plant_model: str | Path,
    *,
    data: LoggedData | None = None,
    out: str | Path | None = None,
    ope_updates: int | None = None,
    settings: Any = None,
    track: bool = True,
    console: Any = None,
) -> VerdictOutcome:
    """One verdict over every candidate of ``runs`` (directories ``train`` and ``sweep``
    wrote, or their ``agent/``): every saved seed and every configuration of a sweep,
    judged together against the logged operation with ``plant_model`` (``judge_together``
    of :mod:`~neorl_industrial.wrappers.agents.joint_verdict`). The log is ``data``, else
    the first run's own (its ``config.yaml``); the FQE settings are the first run's.
    Writes ``report.json`` (the verdict, its ranking, the candidate to export and the
    command that exports it) under ``out`` (default ``verdicts/verdict-<time>``) and,
    when the first run is tracked and ``track``, an MLflow run.

    Raises:
        AgentError: naming the run or path: a directory that is not a run, two runs of one
            name, runs of another task, contract or log, a plant model of another log, an
            output directory that holds files.
    """
    from neorl_industrial.wrappers.agents.joint_verdict import judge_together
    from neorl_industrial.wrappers.training.config import OPESettings

    started = time.perf_counter()
    if not runs:
        raise AgentError("runs: give at least one run's directory")
    located = _located(runs)
    configs = {
        label: RunConfig.from_yaml(run_dir / "config.yaml")
        for label, (run_dir, _) in located.items()
        if (run_dir / "config.yaml").is_file()
    }
    first = next(iter(located))
    dataset, card, source = _log(data, configs.get(first), located[first][0])
    agents = {label: Agent.load(saved) for label, (_, saved) in located.items()}
    out_dir = _out_dir(out)
    from neorl_industrial.wrappers.models import PlantModel, PlantModelError

    try:
        model = PlantModel.load(
            plant_model, dataset=dataset, task=agents[first].task, dataset_name=card.name
        )
    except PlantModelError as error:
        raise AgentError(f"plant_model: {error}") from None
    ope = configs[first].evaluation.ope if first in configs and configs[first].evaluation else None
    ope = ope or OPESettings()
    if ope_updates is not None:
        ope = ope.model_copy(update={"updates": ope_updates})
    joint = judge_together(agents, dataset, model, card=card, ope=ope, settings=settings)
    best_run, best_candidate = joint.first
    best_dir = located[best_run][0]
    report = {
        "name": out_dir.name,
        "kind": "verdict",
        **joint.to_dict(),
        "runs": {label: {"dir": str(located[label][0]), **joint.runs[label]} for label in located},
        "data": {"name": card.name, "source": source},
        "plant_model": str(plant_model),
        "export": f"neorl-industrial export {best_dir} --candidate {best_candidate} --out DIR",
        "seconds": time.perf_counter() - started,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    write_report(out_dir, report)
    tracking = configs[first].tracking if first in configs else None
    if track and tracking is not None and tracking.enabled:
        report["tracking"] = _track_verdict(tracking, out_dir, report, console)
        write_report(out_dir, report)
    run_dirs = {label: run_dir for label, (run_dir, _) in located.items()}
    return VerdictOutcome(joint=joint, report=report, out_dir=out_dir, run_dirs=run_dirs)


def _track_verdict(
    tracking: Any, out_dir: Path, report: dict[str, Any], console: Any
) -> dict[str, Any]:
    """The verdict as one MLflow run: its settings and runs as params, its numbers as
    metrics (``verdict/*``), its decision and first-ranked candidate as tags, the report
    as an artifact. Returns the report's ``tracking`` section."""
    from neorl_industrial.integration.mlflow import (
        MlflowTracker,
        flatten,
        resolve_tracking_uri,
        ui_command,
    )
    from neorl_industrial.integration.mlflow.tracking import PARENT
    from neorl_industrial.wrappers.training.verdict import verdict_metrics

    uri = resolve_tracking_uri(tracking.uri)
    verdict = report["verdict"]
    tracker = MlflowTracker(
        uri,
        experiment=tracking.experiment,
        run_name=out_dir.name,
        run_dir=out_dir,
        flush_timeout=tracking.flush_timeout,
        console=console,
    )
    now = int(time.time() * 1000)
    tags = {
        "kind": "verdict",
        **verdict_tags(verdict),
        "verdict.first": report["ranking"][0],
        "dataset": str(report["data"]["name"]),
    }
    tracker.sender.submit(
        "create_run", PARENT, name=out_dir.name, tags=tags, experiment=tracking.experiment, time=now
    )
    metrics = [
        (name, float(value), 0, now)
        for name, value in verdict_metrics(verdict).items()
        if np.isfinite(value)
    ]
    params = flatten(
        {
            "verdict": verdict["settings"],
            "runs": {label: run["dir"] for label, run in report["runs"].items()},
            "plant_model": report["plant_model"],
        }
    )
    tracker.sender.submit("log_batch", PARENT, params=params, metrics=metrics)
    tracker.log_artifact(out_dir / "report.json")
    summary = tracker.close()
    return {
        "uri": uri,
        "experiment": tracking.experiment,
        "run_id": tracker.parent_run_id,
        "ui": ui_command(uri),
        "spooled": summary.spooled,
        "spool": None if summary.spool_path is None else str(summary.spool_path),
    }
