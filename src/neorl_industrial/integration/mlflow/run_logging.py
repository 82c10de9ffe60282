"""A training run's MLflow record: the tracker of a resolved run plan, the params of the
plan (what the run uses, not the configuration's defaults), the dataset input, the
outputs, the registered policy, and a sweep's nested runs per configuration.

The command's glue (:mod:`neorl_industrial.cli.run_glue`) calls these around the run
function; everything here reads the :class:`~neorl_industrial.wrappers.training.plan.RunPlan`
(its cost limits from its safety contract, the configuration it was resolved from) and the
run's :class:`~neorl_industrial.wrappers.training.run.RunResult`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from neorl_industrial.wrappers.hostio import json_default, write_text_atomic
from neorl_industrial.wrappers.training.context import algorithm_of
from neorl_industrial.wrappers.training.plan import RunPlan
from neorl_industrial.wrappers.training.run import RunResult
from neorl_industrial.wrappers.training.trainer import checkpoint_steps

__all__ = [
    "log_run",
    "log_sweep",
    "open_sweep_runs",
    "open_tracker",
    "plan_params",
    "write_report",
]


def write_report(run_dir: Path, report: dict[str, Any]) -> None:
    """Writes ``report.json``, replaced atomically: a background upload of the previous
    version reads it whole."""
    write_text_atomic(run_dir / "report.json", json.dumps(report, indent=2, default=json_default))


def _log_verdict(tracker: Any, verdict: dict[str, Any] | None, key: str, step: int) -> None:
    """The verdict's numbers as metrics, its settings as params and its decision as tags
    of the MLflow run ``key``."""
    if verdict is None:
        return
    from neorl_industrial.integration.mlflow import flatten
    from neorl_industrial.wrappers.training.verdict import verdict_metrics

    now = int(time.time() * 1000)
    tracker.sender.submit(
        "log_batch",
        key,
        params=flatten({"verdict": verdict["settings"]}),
        metrics=[
            (name, float(value), step, now)
            for name, value in verdict_metrics(verdict).items()
            if np.isfinite(value)
        ],
        tags=verdict_tags(verdict),
    )


def verdict_tags(verdict: dict[str, Any] | None) -> dict[str, str]:
    """A verdict's (``Verdict.to_dict()``) decision, recommended and selected candidate,
    estimators, statement and calibration status as MLflow tags."""
    if verdict is None:
        return {}
    tags = {
        "verdict.decision": verdict["decision"],
        "verdict.recommended": str(verdict["recommended"]),
        "verdict.estimators": ",".join(verdict["estimators"]),
        "verdict.statement": verdict["statement"][:5000],
    }
    calibration = verdict.get("calibration")
    if calibration:  # does the plant model reproduce today's operation?
        tags["verdict.calibration"] = calibration["status"]
    selection = (verdict.get("evidence") or {}).get("selection")
    if selection:  # the one candidate selected on the training episodes and tested
        tags["verdict.selected"] = str(selection["chosen"])
    return tags


def plan_params(plan: RunPlan, grid: dict[str, list[Any]] | None = None) -> dict[str, Any]:
    """The settings the run uses, as MLflow params (before flattening): the data it
    generated or read, the simulator and its evaluation only when there is one, the
    off-policy evaluation only when it runs, the registered model's name as resolved;
    not the defaults of what the run does not do (a plant run has no ``data.quality``,
    ``env.*`` or ``evaluation.episodes``), nor where its files and store are. A sweep's
    swept fields are its ``sweep.*`` params (each configuration's run has its values)."""
    from neorl_industrial.integration.mlflow import registered_model_name

    task, facts, config = plan.task, plan.facts, _source(plan)
    data = config.data.model_dump(mode="json", by_alias=True)
    if config.data.path is None:
        used = {key: data[key] for key in ("quality", "trajectories", "seed")}
    else:
        used = {key: data[key] for key in ("path", "schema")}
        if config.data.allow_mismatch:
            used["allow_mismatch"] = True
    params: dict[str, Any] = {
        "data": {**used, "transitions": facts["transitions"], "episodes": facts["episodes"]},
        "algorithm": plan.algorithm.model_dump(mode="json"),
        "training": plan.training.model_dump(mode="json"),
    }
    if task.has_simulator:
        params["env"] = {"id": task.env_id, "params": dict(task.env_params)}
    if plan.evaluation is not None:
        evaluation = plan.evaluation.model_dump(mode="json")
        ope = evaluation.pop("ope")
        if task.has_simulator:
            evaluation["horizon"] = plan.evaluation.horizon or task.episode_length
        else:
            for key in ("episodes", "horizon", "shield", "seed"):
                evaluation.pop(key)
        if plan.split.heldout is not None:
            evaluation["ope"] = ope
        params["evaluation"] = evaluation
    params["safety"] = {
        **config.safety.model_dump(mode="json"),
        "cost_limits.resolved": plan.safety.limit_record(),
        "constraints.names": list(plan.safety.constraints.names),
    }
    checkpoints = plan.checkpoints
    params["checkpoints"] = (
        {"every": checkpoints.every, "keep": checkpoints.keep}
        if checkpoints.every
        else {"every": 0}
    )
    params["export"] = {"signing_keys": plan.export.signing_keys}
    tracking = plan.tracking
    params["tracking"] = {"log_model": tracking.log_model, "promote": tracking.promote}
    if tracking.log_model:
        name = registered_model_name(plan.label, tracking.registered_model)
        params["tracking"]["registered_model"] = name
    if grid is not None:
        hyperparameters = dict(params["algorithm"]["hyperparameters"])
        for key in grid:
            hyperparameters.pop(key, None)  # each configuration's run has its value
        params["algorithm"] = {**params["algorithm"], "hyperparameters": hyperparameters}
    return _without_none(params)


def _source(plan: RunPlan) -> Any:
    """The configuration a tracked run was resolved from (its data section and the
    safety settings as given are logged beside the resolved contract)."""
    if plan.config is None:
        raise ValueError(
            f"run {plan.name!r}: tracking logs a plan resolved from a RunConfig "
            "(resolve_run); this one was built in Python"
        )
    return plan.config


def _without_none(values: Any) -> Any:
    """``values`` without the entries that are None (settings left to a default that
    the params show resolved elsewhere, or not used)."""
    if isinstance(values, dict):
        return {key: _without_none(value) for key, value in values.items() if value is not None}
    return values


def _dataset_input(plan: RunPlan, fingerprint: str) -> dict[str, Any]:
    """The training data as the arguments of the ``log_dataset`` operation: named after
    its card, the data's fingerprint as digest, its directory (or how it was generated) as
    source, the task's columns as schema, its sizes as profile."""
    config, task, facts = _source(plan), plan.task, plan.facts
    if config.data.path is not None:
        source, source_type = str(Path(config.data.path).absolute()), "local"
    else:
        data = config.data
        source_type = "code"
        source = (
            f"neorl_industrial generate_dataset({task.env_id!r}, {data.quality!r}, "
            f"{data.trajectories}, seed={data.seed}, env_params={dict(task.env_params)!r})"
        )
    action = "long" if task.discrete else "float"
    columns = [
        *([f"observation.{name}", "float"] for name in task.observation_names),
        *([f"action.{name}", action] for name in task.action_names),
        ["reward", "float"],
        *([f"cost.{name}", "float"] for name in plan.safety.cost_names),
    ]
    return {
        "name": plan.card.name,
        "digest": fingerprint,
        "source": source,
        "source_type": source_type,
        "columns": columns,
        "profile": {"transitions": facts["transitions"], "episodes": facts["episodes"]},
        "context": "training",
    }


def open_tracker(plan: RunPlan, console: Any, grid: dict[str, list[Any]] | None = None) -> Any:
    """The run's MLflow tracker: the plan's params and the run's tags; the dataset
    input."""
    from neorl_industrial.integration.mlflow import (
        MlflowTracker,
        RunMetadata,
        flatten,
        resolve_tracking_uri,
        system_tags,
    )
    from neorl_industrial.wrappers.training.trainer import dataset_fingerprint

    dataset, card, facts, run_dir = plan.dataset, plan.card, plan.facts, plan.run_dir
    tracking = plan.tracking
    params = flatten(plan_params(plan, grid))
    fingerprint = dataset_fingerprint(dataset)
    tags = {
        **system_tags(),
        "env": plan.label,
        "task.kind": plan.task.kind,
        "evaluation": "simulator" if plan.task.has_simulator else "fqe",
        "algorithm": algorithm_of(plan.algorithm.name).name,
        "dataset": card.name,
        "dataset.fingerprint": fingerprint,
        "dataset.source": facts["source"],
        "run_dir": str(run_dir),
    }
    if card.checksums:
        digest = hashlib.sha256(json.dumps(card.checksums, sort_keys=True).encode())
        tags["dataset.checksum"] = digest.hexdigest()[:16]
    metadata = RunMetadata(
        params=params,
        tags=tags,
        dataset=_dataset_input(plan, fingerprint),
        references=(card.random_return, card.expert_return)
        if card.random_return is not None and card.expert_return is not None
        else None,
    )
    return MlflowTracker(
        resolve_tracking_uri(tracking.uri),
        experiment=tracking.experiment,
        run_name=plan.name,
        run_dir=run_dir,
        metadata=metadata,
        flush_timeout=tracking.flush_timeout,
        console=console,
    )


def log_run(
    tracker: Any,
    plan: RunPlan,
    result: RunResult,
    report: dict[str, Any],
    agent_dir: Path,
    policy_dir: Path | None,
) -> dict[str, Any]:
    """Plots, artifacts, the policy model and its registration, then the flush; returns
    the report's ``tracking`` section."""
    from neorl_industrial.integration.mlflow import (
        flatten,
        learning_curves,
        safety_plot,
    )

    card, run_dir, entry = plan.card, plan.run_dir, algorithm_of(plan.algorithm.name)
    assert run_dir is not None
    title = f"{entry.name} on {plan.label} ({plan.name})"
    resolved = {
        key: value
        for key, value in (result.hyperparameters or {}).items()
        if key not in ("obs_mean", "obs_std")
    }
    if entry.safe:  # the algorithm's limits are the contract's
        resolved["cost_limits"] = plan.safety.limit_record()
    resolved["reward_scaling"] = result.reward_scale
    tracker.sender.submit("log_batch", "parent", params=flatten({"resolved": resolved}))
    plots = run_dir / "plots"
    learning_curves(
        result.history, result.evaluations, result.seeds, plots / "learning_curves.png", title=title
    )
    safety_plot(result.evaluations, result.seeds, plots / "safety.png", title=title)
    for name in ("config.yaml", "dataset.json"):
        tracker.log_artifact(run_dir / name)
    tracker.log_artifact(plots, "plots")
    steps = checkpoint_steps(run_dir / "checkpoints")
    if steps:
        tracker.log_artifact(run_dir / "checkpoints" / str(steps[-1]), f"checkpoint/{steps[-1]}")
    tracker.log_artifact(agent_dir, "agent")
    selected, runs_best = result.selected_run, result.best or []
    best = dict(runs_best[selected]["metrics"]) if runs_best[selected] else {}
    if "return" in best and card.random_return is not None and card.expert_return:
        span = card.expert_return - card.random_return
        best.setdefault("normalized_return", (best["return"] - card.random_return) / span)

    def runs() -> dict[str, Any]:
        # Read after the sender is idle: the seeds' runs are created by its thread.
        ids = tracker.sender.run_ids
        return {
            "seed_run_ids": {str(seed): ids.get(tracker.seed_key(seed)) for seed in result.seeds}
        }

    verdict = result.verdict
    _log_verdict(tracker, verdict, "parent", int(plan.training.updates))
    tags = {"evaluation": result.evaluation or "none", **verdict_tags(verdict)}
    return _register_and_close(tracker, plan, result, policy_dir, report, best, tags, runs)


def _register_and_close(
    tracker: Any,
    plan: RunPlan,
    result: RunResult,
    policy_dir: Path | None,
    report: dict[str, Any],
    best: dict[str, Any],
    version_tags: dict[str, Any],
    runs: Callable[[], dict[str, Any]],
) -> dict[str, Any]:
    """Logs the exported policy as a model and registers it (with ``best``'s metrics and
    ``version_tags`` beside the run's), waits for the calls, writes the report with its
    ``tracking`` section (``runs()`` gives the nested runs' ids once they exist), logs it
    and ends the run. Returns the section."""
    from neorl_industrial.integration.mlflow import registered_model_name, ui_command
    from neorl_industrial.integration.mlflow.registry import METRIC_TAGS

    card, run_dir, tracking = plan.card, plan.run_dir, plan.tracking
    model_name = None
    if tracking.log_model and policy_dir is not None:
        model_name = registered_model_name(plan.label, tracking.registered_model)
        example = np.asarray(
            jax.device_get(plan.dataset.initial_observations()[:2]), np.float64
        ).tolist()
        tracker.log_model(
            policy_dir,
            agent_dir=run_dir / "agent",
            dataset_card=json.loads(card.to_json()),
            input_example=example,
            registered_model=model_name,
            version_metrics={key: best.get(key) for key in METRIC_TAGS},
            version_tags={
                "env": plan.label,
                "algorithm": algorithm_of(plan.algorithm.name).name,
                "seed": result.seeds[result.selected_run],
                "dataset": card.name,
                "run_name": plan.name,
                **version_tags,
            },
            promote=tracking.promote,
        )
    tracker.sender.wait_idle(tracking.flush_timeout)
    section: dict[str, Any] = {
        "uri": tracker.tracking_uri,
        "experiment": tracking.experiment,
        "experiment_id": tracker.experiment_id,
        "run_id": tracker.parent_run_id,
        **runs(),
        "ui": ui_command(tracker.tracking_uri),
        # The UI's training-runs table and the run's page (MLflow 3 opens an
        # experiment on its GenAI pages otherwise).
        "links": tracker.links(),
    }
    registered = tracker.sender.results.get("register")
    if registered:
        section["model"] = {
            **registered,
            "uri": f"models:/{registered['name']}/{registered['version']}",
        }
    elif model_name is not None:
        section["model"] = {"name": model_name, "version": None}
    write_report(run_dir, {**report, "tracking": section})
    tracker.log_artifact(run_dir / "report.json")
    summary = tracker.close()
    section["spooled"] = summary.spooled
    section["spool"] = None if summary.spool_path is None else str(summary.spool_path)
    section["errors"] = summary.errors[:5]
    return section


def _configuration_key(index: int) -> str:
    return f"config-{index}"


def open_sweep_runs(tracker: Any, plan: RunPlan, grid: dict[str, list[Any]]) -> None:
    """The sweep's parent run, made before anything trains (so a failure marks it): the
    plan's params without the swept values (the grid instead) and the dataset input."""
    from neorl_industrial.integration.mlflow import flatten

    now, seeds = int(time.time() * 1000), plan.sweep_seeds
    tracker.sender.submit(
        "create_run",
        "parent",
        name=plan.name,
        tags={**tracker.tags, "sweep": "true", "seeds": json.dumps(seeds)},
        experiment=tracker.experiment,
        time=now,
    )
    params = {key: value for key, value in tracker.params.items() if key != "training.seeds"}
    tracker.sender.submit(
        "log_batch",
        "parent",
        params={**params, **flatten({"sweep": {"grid": grid, "seeds": seeds}})},
    )
    tracker.log_dataset("parent")


def _log_configuration(
    tracker: Any,
    plan: RunPlan,
    table: dict[str, Any],
    index: int,
    configuration: dict[str, Any],
    step: int,
    now: int,
) -> None:
    """A sweep configuration's nested run: the plan's params with its values, the
    evaluation's settings as params and its results as metrics, the dataset input."""
    from neorl_industrial.integration.mlflow.tracking import summary_entries

    estimated = table["estimate"] == "fqe"
    prefix = "ope/" if estimated else "eval/"
    key = _configuration_key(index)
    values = configuration["values"]
    tracker.sender.submit(
        "create_run",
        key,
        name=f"{plan.name}/" + ",".join(f"{k}={v}" for k, v in values.items()),
        tags={
            **tracker.tags,
            "configuration": str(index),
            "selected": str(index == table["selected"]).lower(),
            "within_limits": str(configuration["within_limits"]).lower(),
        },
        parent="parent",
        experiment=tracker.experiment,
        time=now,
    )
    results, settings = summary_entries(configuration["summary"], prefix, estimated=estimated)
    tracker.sender.submit(
        "log_batch",
        key,
        params={
            **tracker.params,
            **{f"algorithm.hyperparameters.{k}": str(v) for k, v in values.items()},
            "training.seeds": json.dumps(table["seeds"]),
            **settings,
        },
        metrics=[(name, value, step, now) for name, value in results.items()],
    )
    tracker.log_dataset(key)
    tracker.sender.submit("end_run", key, status="FINISHED", time=now)


def log_sweep(
    tracker: Any,
    plan: RunPlan,
    result: RunResult,
    report: dict[str, Any],
    policy_dir: Path | None,
) -> dict[str, Any]:
    """A nested run per configuration (the plan's params with its values, the
    evaluation's settings as params and its results as metrics, the dataset input), the
    table, the chosen policy registered with the reason; then the flush. Returns the
    report's ``tracking`` section."""
    table = result.sweep or {}
    now = int(time.time() * 1000)
    step = int(plan.training.updates)
    for index, configuration in enumerate(table["configurations"]):
        _log_configuration(tracker, plan, table, index, configuration, step, now)
    chosen = table["configurations"][table["selected"]]
    tracker.sender.submit(
        "log_batch",
        "parent",
        tags={
            "selected_configuration": str(table["selected"]),
            "selected_values": json.dumps(chosen["values"]),
            "selection_reason": table["reason"],
        },
        metrics=[
            (f"selected/{name}_mean", float(stats["mean"]), step, now)
            for name, stats in chosen["summary"].items()
            if stats.get("mean") is not None and np.isfinite(stats["mean"])
        ]
        + [
            (f"hindsight/{name}", float(value), step, now)
            for name, value in (table.get("hindsight") or {}).items()
            if name != "best_in_hindsight" and value is not None
        ],
    )
    run_dir = plan.run_dir
    for name in ("config.yaml", "dataset.json", "sweep.json", "sweep.md"):
        tracker.log_artifact(run_dir / name)
    tracker.log_artifact(run_dir / "plots", "plots")
    tracker.log_artifact(run_dir / "agent", "agent")
    _log_verdict(tracker, table.get("verdict"), "parent", step)
    tags = {
        "evaluation": table["estimate"],
        "sweep_values": json.dumps(chosen["values"]),
        "sweep_reason": table["reason"],
        **verdict_tags(table.get("verdict")),
    }

    def runs() -> dict[str, Any]:
        ids = tracker.sender.run_ids
        count = len(table["configurations"])
        return {
            "configuration_run_ids": {str(i): ids.get(_configuration_key(i)) for i in range(count)}
        }

    best = chosen["runs"][result.selected_run]
    return _register_and_close(tracker, plan, result, policy_dir, report, best, tags, runs)
