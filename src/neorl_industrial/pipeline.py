"""A training run from a :class:`RunConfig`, end to end: data, agent, training with
evaluation and checkpoints, the saved agent, the exported policy and a report.

A run writes everything under ``<output>/<name>/``::

    config.yaml        the configuration, as run
    checkpoints/       orbax checkpoints (resume with ``resume=True``)
    agent/             the saved agent (``Agent.load``)
    policy/            the exported, self-contained policy (the server loads it)
    report.json        what happened: data, training speed, evaluations, best runs
    plots/             learning curves and safety plots (PNG)
    mlflow.json        the MLflow runs of this run (a resumed run continues them)

With ``tracking.enabled`` (the default) the run is also logged to MLflow (see
:mod:`neorl_industrial.integration.mlflow`): params, metrics per chunk and evaluation, a
nested run per seed, the artifacts above, and the shielded policy as a registered model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import jax
import numpy as np

from neorl_industrial.extras import MissingExtraError, require
from neorl_industrial.integration.mlflow.run_logging import write_report
from neorl_industrial.wrappers.agents.agent import Agent, AgentError
from neorl_industrial.wrappers.hostio import json_default, write_text_atomic
from neorl_industrial.wrappers.training import Callback, RunConfig
from neorl_industrial.wrappers.training.plan import (
    DEFAULT_ENV,
    RunPlan,
    data_facts,
)
from neorl_industrial.wrappers.training.trainer import checkpoint_steps

__all__ = [
    "MAIN_JOB",
    "RunOutcome",
    "VerdictOutcome",
    "agent_of",
    "load_data",
    "main_job_config",
    "plan_run",
    "run_sweep",
    "run_training",
    "run_verdict",
    "sweep_markdown",
]

#: The main job (``neorl-industrial run``, ``make run``): TD3BC-Lag on a small generated
#: IB dataset, three seeds at once, evaluated with the shield, tracked in MLflow and its
#: policy registered (and promoted when it is safe and better); a few minutes on 2 cores.
MAIN_JOB: dict[str, Any] = {
    "name": "main",
    "env": {"id": "IB-v0"},
    "data": {"quality": "medium", "trajectories": 20, "seed": 0},
    "algorithm": {"name": "td3bc-lag", "hyperparameters": {"hidden": [64, 64]}},
    "training": {"updates": 3000, "chunk": 500, "batch_size": 256, "seeds": [0, 1, 2]},
    "evaluation": {"every": 1000, "episodes": 10},
    "checkpoints": {"every": 1000, "keep": 2},
    "tracking": {"promote": True},
    # Signed with a key pair made on the first run: the registry promotes signed policies
    # only, and a server given keys/policy-signing.pub trusts exactly these.
    "export": {"signing_keys": "keys", "create_keys": True},
    "output": "runs",
}


def main_job_config(overrides: list[str] | None = None) -> RunConfig:
    return RunConfig.from_dict(MAIN_JOB, source="main job").with_overrides(overrides or [])


@dataclasses.dataclass
class RunOutcome:
    """What a run produced and where."""

    config: RunConfig
    agent: Agent
    report: dict[str, Any]
    run_dir: Path
    agent_dir: Path
    policy_dir: Path | None


def agent_of(config: RunConfig) -> Agent:
    """The run's agent: reads or generates the run's data and resolves ``config`` with it
    (``Agent.from_config``); ``agent.plan`` is the run's
    :class:`~neorl_industrial.wrappers.training.plan.RunPlan`.

    Raises:
        AgentError: naming the field: an unreadable dataset (``data.path``), a dataset
            whose card disagrees with the run, a constraint spec or cost limits that do
            not fit the task.
    """
    from neorl_industrial.integration.datasets import DatasetFormatError

    try:
        dataset, facts, card = load_data(config)
    except (DatasetFormatError, FileNotFoundError) as error:
        raise AgentError(f"data.path: {error}") from None
    except ValueError as error:
        raise AgentError(str(error)) from None
    return Agent.from_config(config, dataset=dataset, card=card, facts=facts)


def plan_run(config: RunConfig) -> RunPlan:
    """The run's plan (see :func:`agent_of`)."""
    return cast(RunPlan, agent_of(config).plan)  # made with its data, it holds its plan


def load_data(config: RunConfig) -> tuple[Any, dict[str, Any], Any]:
    """The run's dataset (read or generated with the run's environment parameters),
    facts about it (including the normalized-score references when the dataset card has
    them) and its card."""
    from neorl_industrial.integration.datasets import generate_dataset, load_any

    data = config.data
    started = time.perf_counter()
    if data.path is not None:
        dataset, card = load_any(data.path, schema=data.schema_path)
        source = data.path
    else:
        env_id = config.env.id or DEFAULT_ENV
        dataset, card = generate_dataset(
            env_id, data.quality, data.trajectories, seed=data.seed, env_params=config.env.params
        )
        source = f"generated: {env_id} {data.quality}, {data.trajectories} episodes"
    seconds = time.perf_counter() - started
    return dataset, data_facts(dataset, card, source=source, seconds=seconds), card


def run_training(
    config: RunConfig,
    *,
    resume: bool = False,
    callbacks: list[Callback] | None = None,
    export: bool = True,
    console: Any = None,
    mesh: Any = None,
    plant_model: str | Path | None = None,
) -> RunOutcome:
    """Runs ``config`` end to end and writes its outputs under ``config.run_dir``.

    ``plant_model``: the directory of a plant model fitted on the run's data (``model
    fit``): with off-policy evaluation, every run is judged against the logged operation
    on the held-out episodes, and the verdict goes to ``report.json`` (``verdict``) and
    MLflow (``verdict/*`` metrics, its settings as ``verdict.*`` params, the decision as
    tags of the run and the registered version).

    ``mesh`` trains data-parallel over its devices (``data_mesh()``); in a distributed run
    every process trains (each holding its shards of the data) and process 0 alone writes
    the outputs and logs to MLflow (the others return a report without outputs).

    Raises:
        AgentError: for an output directory of an earlier run (without ``resume``), data
            that does not fit, or bad settings; nothing of the earlier run is overwritten.
    """
    run_dir = config.run_dir
    agent_dir, policy_dir = run_dir / "agent", run_dir / "policy"
    if run_dir.exists() and any(run_dir.iterdir()) and not resume:
        raise AgentError(
            f"{run_dir}: holds an earlier run; continue it with --resume (resume=True from "
            "Python), or give another name (--set name=...) or output directory "
            "(nothing was overwritten)"
        )
    if resume:
        # Resuming from nothing would train afresh over the run's files and MLflow runs.
        if not config.checkpoints.every:
            raise AgentError(
                f"{run_dir}: --resume needs checkpoints (checkpoints.every is 0 in this "
                "configuration); resume with the run's own config.yaml (nothing was changed)"
            )
        if not checkpoint_steps(run_dir / "checkpoints"):
            why = "it stopped before its first checkpoint" if run_dir.exists() else "no such run"
            raise AgentError(
                f"{run_dir}: nothing to resume: no checkpoint in {run_dir / 'checkpoints'} "
                f"({why}); train it again without --resume under another name "
                "(--set name=...), or remove the directory first (nothing was changed)"
            )
    started = time.perf_counter()
    agent = agent_of(config)
    plan = agent.plan
    model = _plant_model(plant_model, plan)
    leader = jax.process_index() == 0
    if leader:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(config.to_yaml())
        (run_dir / "dataset.json").write_text(plan.card.to_json())
    tracker = None
    if plan.tracking.enabled and leader:
        from neorl_industrial.integration.mlflow.run_logging import open_tracker

        tracker = open_tracker(plan, agent, console)
    fit_started = time.perf_counter()
    every = [*(callbacks or []), *([tracker] if tracker is not None else [])]
    with _failures_marked(tracker):
        result = agent.fit(resume=resume, callbacks=every, mesh=mesh, plant_model=model)
    fit_seconds = time.perf_counter() - fit_started
    if not leader:
        report = {
            "name": config.name,
            "process": jax.process_index(),
            "training": {"updates": int(result.state.updates[0]), "seconds": fit_seconds},
        }
        return RunOutcome(config, agent, report, run_dir, agent_dir, None)
    agent.save(agent_dir, overwrite=resume)
    exported = None
    if export and not agent.entry.discrete:
        exported = agent.export(
            policy_dir, overwrite=resume, signing_key=_signing_key(config, console)
        )
    chunks = [entry for entry in result.history if entry["updates"] > (result.resumed_from or 0)]
    # The first chunk of a process includes compilation.
    steady = chunks[1:] or chunks
    report = {
        "name": config.name,
        "algorithm": agent.name,
        "env": plan.task.env_id,
        "task": {
            "name": plan.task.name,
            "kind": plan.task.kind,
            "observations": plan.task.observation_size,
            "actions": list(plan.task.action_names),
            "action_units": list(plan.task.action_units or ()),
            "cost_channels": list(plan.safety.cost_names),
        },
        "evaluation": agent.training.get("evaluation"),
        "backend": jax.default_backend(),
        "devices": 1 if mesh is None else int(mesh.devices.size),
        "processes": jax.process_count(),
        "data": plan.facts,
        "training": {
            "updates": int(result.state.updates[0]),
            "seeds": list(plan.training.seeds),
            "seconds": fit_seconds,
            "first_chunk_seconds": chunks[0]["seconds"] if chunks else None,
            "updates_per_s": float(np.mean([entry["updates_per_s"] for entry in steady]))
            if steady
            else None,
            "resumed_from": result.resumed_from,
            "stopped_early": result.stopped_early,
            "reward_scale": agent.training.get("reward_scale"),
        },
        "evaluations": result.evaluations,
        "ope_beside_simulator": agent.training.get("ope"),
        "verdict": agent.training.get("verdict"),
        "best": result.best,
        "summary": result.summary,
        "selected_run": agent.selected,
        "selection": {**agent.training.get("selection", {}), "exported": agent.selected_candidate},
        "failed_runs": agent.training.get("failed_runs") or [],
        "candidates": agent.candidates,
        "cost_limits": plan.safety.limits() or None,
        "cost_limit_sources": list(plan.safety.limit_sources),
        "constraints": list(plan.safety.constraints.names),
        "outputs": {
            "run": str(run_dir),
            "agent": str(agent_dir),
            "policy": None if exported is None else str(policy_dir),
            "checkpoints": None if plan.checkpoint_dir is None else str(plan.checkpoint_dir),
        },
        "seconds": time.perf_counter() - started,
    }
    if tracker is not None:
        from neorl_industrial.integration.mlflow.run_logging import log_run

        report["tracking"] = log_run(
            tracker, plan, agent, result, report, run_dir, agent_dir, exported
        )
    write_report(run_dir, report)
    return RunOutcome(config, agent, report, run_dir, agent_dir, exported)


def _plant_model(path: str | Path | None, plan: RunPlan) -> Any:
    """The plant model at ``path`` checked against the run's task and data (by name
    and fingerprint), or None.

    Raises:
        AgentError: for a model that is missing, unreadable, of another task or dataset,
            or a run that does not evaluate off policy (nothing to judge on).
    """
    if path is None:
        return None
    from neorl_industrial.wrappers.models import PlantModel, PlantModelError

    if plan.split.heldout is None:
        how = "in its simulator" if plan.task.has_simulator else "without held-out episodes"
        raise AgentError(
            f"plant_model: {plan.label} is evaluated {how}; a verdict needs held-out "
            "episodes (--set evaluation.ope.always=true)"
        )
    try:
        return PlantModel.load(
            path, dataset=plan.dataset, task=plan.task, dataset_name=plan.card.name
        )
    except PlantModelError as error:
        raise AgentError(f"plant_model: {error}") from None


@contextlib.contextmanager
def _failures_marked(tracker: Any) -> Iterator[None]:
    """Ends the tracked MLflow run FAILED (KILLED when interrupted) if the body raises."""
    try:
        yield
    except BaseException as error:
        if tracker is not None:
            tracker.close(status="KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED")
        raise


def _signing_key(config: RunConfig, console: Any) -> Path | None:
    """The private key that signs the run's policy (made first when asked), or None."""
    from neorl_industrial.wrappers.agents.signing import PRIVATE_KEY, generate_key_pair

    section = config.export
    if section.signing_keys is None:
        if console is not None:
            console.print(
                "[yellow]warning:[/yellow] export.signing_keys is null: the policy is exported "
                "unsigned; servers that require signatures refuse it and the registry never "
                "promotes it"
            )
        return None
    key = Path(section.signing_keys) / PRIVATE_KEY
    if not key.exists():
        if not section.create_keys:
            raise AgentError(
                f"export.signing_keys: no {PRIVATE_KEY} in {section.signing_keys}; make one "
                f"with `neorl-industrial keys generate --out {section.signing_keys}`"
            )
        try:
            generate_key_pair(section.signing_keys)
        except FileExistsError:
            return key  # another run made the pair meanwhile; it signs with that one
        if console is not None:
            console.print(
                f"Made a policy-signing key pair in {section.signing_keys}/ (the private key "
                "is readable by you only; servers trust the .pub)"
            )
    return key


# ----- sweeps ---------------------------------------------------------------------------
def sweep_markdown(table: dict[str, Any], title: str) -> str:
    """The sweep's table as a markdown page (an MLflow artifact and ``sweep.md``)."""
    fields, chosen = table["fields"], table["selected"]
    has_cost = any("normalized_cost" in c["summary"] for c in table["configurations"])
    head = [*fields, "return (mean ± 95 %)"] + (["normalized cost", "within limits"] * has_cost)
    lines = [
        f"# {title}",
        "",
        f"{len(table['configurations'])} configurations × seeds {table['seeds']}, trained as "
        + (
            "one program"
            if table.get("programs", 1) == 1
            else f"{table['programs']} programs (one per value of the fields no program traces)"
        )
        + f"; each run evaluated by {table['estimate']}. Chosen: configuration "
        f"{chosen} ({table['reason']}).",
        "",
        "| # | " + " | ".join(head) + " |",
        "|" + "---|" * (len(head) + 1),
    ]
    for index, configuration in enumerate(table["configurations"]):
        summary = configuration["summary"]
        ret = summary["return"]
        cells = [str(configuration["values"][field]) for field in fields]
        cells.append(f"{ret['mean']:.4g} ± {ret['ci'] or 0.0:.3g}")
        if has_cost:
            cost = summary.get("normalized_cost")
            cells.append("—" if cost is None else f"{cost['mean']:.3g}")
            cells.append("yes" if configuration["within_limits"] else "no")
        mark = f"**{index}**" if index == chosen else str(index)
        lines.append(f"| {mark} | " + " | ".join(cells) + " |")
    hindsight = table.get("hindsight")
    if hindsight:
        correlation = hindsight["rank_correlation"]
        lines += [
            "",
            "In hindsight (the simulator's returns of the same policies): the best "
            f"configuration is {hindsight['best_in_hindsight']}, the offline choice's regret "
            f"{hindsight['regret']:.4g}, the rank correlation of estimated and true returns "
            + ("undefined (a constant side)" if correlation is None else f"{correlation:.2f}")
            + ".",
        ]
    return "\n".join(lines) + "\n"


def run_sweep(
    config: RunConfig,
    *,
    export: bool = True,
    console: Any = None,
    mesh: Any = None,
    plant_model: str | Path | None = None,
) -> RunOutcome:
    """Runs the grid of ``config.sweep`` as one program (``Agent.sweep``) and writes its
    outputs under ``config.run_dir``: ``sweep.json`` and ``sweep.md`` (every configuration,
    its runs and the choice), the chosen configuration's agent and policy, ``report.json``.

    With tracking, MLflow gets a parent run for the sweep and a nested run per
    configuration (its values as params, the mean and 95 % interval over seeds of every
    metric), the table as an artifact, and the chosen policy as a registered model whose
    version carries the reason it was chosen. A sweep that fails after its parent run was
    made ends that run FAILED (KILLED when interrupted).

    ``mesh`` lays the runs over its devices (``runs_mesh()``); in a distributed sweep
    every process trains its share and evaluates, and process 0 alone writes the outputs
    and logs to MLflow (the others return its report without outputs).

    ``plant_model`` (as for :func:`run_training`): every configuration's runs are judged
    against the logged operation; the verdict is the table's and the report's
    ``verdict``, and goes to the parent run in MLflow.

    Raises:
        AgentError: an earlier run's directory, data that does not fit, a grid that cannot
            be run as one program (naming the field).
    """
    grid = config.sweep.hyperparameter_grid()
    if not grid:
        raise AgentError(
            "sweep.grid: no hyperparameter to sweep; give --grid "
            "algorithm.hyperparameters.<name>=[...] (or a sweep: grid: section)"
        )
    run_dir = config.run_dir
    agent_dir, policy_dir = run_dir / "agent", run_dir / "policy"
    if run_dir.exists() and any(run_dir.iterdir()):
        raise AgentError(
            f"{run_dir}: holds an earlier run; give another name (--set name=...) or output "
            "directory (nothing was overwritten)"
        )
    started = time.perf_counter()
    agent = agent_of(config)
    plan = agent.plan
    model = _plant_model(plant_model, plan)
    leader = jax.process_index() == 0
    if leader:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(config.to_yaml())
        (run_dir / "dataset.json").write_text(plan.card.to_json())
    tracker = None
    if plan.tracking.enabled and leader:
        from neorl_industrial.integration.mlflow.run_logging import open_sweep_runs, open_tracker

        tracker = open_tracker(plan, agent, console, grid)
        open_sweep_runs(tracker, plan, grid)
    with _failures_marked(tracker):
        table = agent.sweep(grid=grid, mesh=mesh, plant_model=model)
    fit_seconds = time.perf_counter() - started
    if not leader:
        chosen = table["configurations"][table["selected"]]
        report = {
            "name": config.name,
            "process": jax.process_index(),
            "sweep": {
                "selected": table["selected"],
                "selected_values": chosen["values"],
                "reason": table["reason"],
                "seconds": fit_seconds,
            },
        }
        return RunOutcome(config, agent, report, run_dir, agent_dir, None)
    title = f"Sweep of {agent.name} on {plan.label} ({config.name})"
    write_text_atomic(run_dir / "sweep.json", json.dumps(table, indent=2, default=json_default))
    write_text_atomic(run_dir / "sweep.md", sweep_markdown(table, title))
    try:
        require("track")  # matplotlib, which draws the plot, comes with tracking
    except MissingExtraError as missing:
        if console is not None:
            console.print(f"[yellow]warning:[/yellow] plots/sweep.png not drawn: {missing}")
    else:
        from neorl_industrial.integration.mlflow.plots import sweep_plot

        sweep_plot(table, run_dir / "plots" / "sweep.png", title=title)
    agent.save(agent_dir)
    exported = None
    if export and not agent.entry.discrete:
        exported = agent.export(policy_dir, signing_key=_signing_key(config, console))
    chosen = table["configurations"][table["selected"]]
    report = {
        "name": config.name,
        "algorithm": agent.name,
        "env": agent.task.env_id,
        "evaluation": table["estimate"],
        "backend": jax.default_backend(),
        "data": plan.facts,
        "sweep": {
            "fields": table["fields"],
            "configurations": len(table["configurations"]),
            "seeds": plan.sweep_seeds,
            "runs": len(table["configurations"]) * len(plan.sweep_seeds),
            "updates": plan.training.updates,
            "seconds": fit_seconds,
            "selected": table["selected"],
            "selected_values": chosen["values"],
            "reason": table["reason"],
        },
        "verdict": table.get("verdict"),
        "selected_run": agent.selected,
        "selection": {**agent.training.get("selection", {}), "exported": agent.selected_candidate},
        "failed_runs": agent.training.get("failed_runs") or [],
        "candidates": agent.candidates,
        "cost_limits": plan.safety.limits() or None,
        "outputs": {
            "run": str(run_dir),
            "agent": str(agent_dir),
            "policy": None if exported is None else str(policy_dir),
            "sweep": str(run_dir / "sweep.json"),
        },
        "seconds": time.perf_counter() - started,
    }
    if tracker is not None:
        from neorl_industrial.integration.mlflow.run_logging import log_sweep

        report["tracking"] = log_sweep(tracker, plan, agent, table, report, exported)
    write_report(run_dir, report)
    return RunOutcome(config, agent, report, run_dir, agent_dir, exported)


# ----- one verdict over several runs --------------------------------------------------
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


def run_verdict(
    runs: list[str | Path],
    plant_model: str | Path,
    *,
    data: str | None = None,
    schema: str | None = None,
    out: str | Path | None = None,
    ope_updates: int | None = None,
    settings: Any = None,
    track: bool = True,
    console: Any = None,
) -> VerdictOutcome:
    """One verdict over every candidate of ``runs`` (directories ``train`` and ``sweep``
    wrote, or their ``agent/``): every saved seed and every configuration of a sweep,
    judged together against the logged operation with ``plant_model`` (``judge_together``
    of :mod:`~neorl_industrial.wrappers.agents.joint_verdict`). The log is ``data`` (with
    ``schema`` for a plant log), else the first run's own (its ``config.yaml``); the FQE
    settings are the first run's. Writes ``report.json`` (the verdict, its ranking, the
    candidate to export and the command that exports it) under ``out`` (default
    ``verdicts/verdict-<time>``) and, when the first run is tracked and ``track``, an
    MLflow run.

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
    configs = {
        label: RunConfig.from_yaml(run_dir / "config.yaml")
        for label, (run_dir, _) in located.items()
        if (run_dir / "config.yaml").is_file()
    }
    first = next(iter(located))
    if data is not None:
        from neorl_industrial.integration.datasets import DatasetFormatError, load_any

        try:
            dataset, card = load_any(data, schema=schema)
        except (DatasetFormatError, FileNotFoundError) as error:
            raise AgentError(f"--data: {error}") from None
        source = str(data)
    elif first in configs:
        from neorl_industrial.integration.datasets import DatasetFormatError

        try:
            dataset, facts, card = load_data(configs[first])
        except (DatasetFormatError, FileNotFoundError) as error:
            raise AgentError(f"{located[first][0]}/config.yaml: data.path: {error}") from None
        source = facts["source"]
    else:
        raise AgentError(
            f"{located[first][0]}: no config.yaml to read the runs' log from; give it "
            "(--data DATASET [--schema S])"
        )
    agents = {label: Agent.load(saved) for label, (_, saved) in located.items()}
    out_dir = (
        Path(out)
        if out is not None
        else Path("verdicts") / time.strftime("verdict-%Y%m%dT%H%M%SZ", time.gmtime())
    )
    if out_dir.exists() and any(out_dir.iterdir()):
        raise AgentError(f"{out_dir}: holds files already; give another --out (nothing written)")
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
        "verdict.decision": verdict["decision"],
        "verdict.recommended": str(verdict["recommended"]),
        "verdict.first": report["ranking"][0],
        "verdict.estimators": ",".join(verdict["estimators"]),
        "verdict.statement": verdict["statement"][:5000],
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
