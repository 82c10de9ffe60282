"""The ``train``, ``sweep`` and ``run`` commands' glue around the run functions: read the
data, resolve the plan, open the run's folder and its MLflow run, call
:func:`~neorl_industrial.wrappers.training.run.train` (or ``sweep``), save, export,
report.

A run writes everything under ``<output>/<name>/`` (:class:`RunFolder`)::

    config.yaml        the configuration, as run
    dataset.json       the data's card
    checkpoints/       orbax checkpoints (resume with ``resume=True``)
    agent/             the saved agent (``Agent.load``)
    policy/            the exported, self-contained policy (the server loads it)
    report.json        what happened: data, training speed, evaluations, best runs
    sweep.json, .md    a sweep's table
    plots/             learning curves and safety plots (PNG)
    mlflow.json        the MLflow runs of this run (a resumed run continues them)

With ``tracking.enabled`` (the default) the run is also logged to MLflow (see
:mod:`neorl_industrial.integration.mlflow`): params, metrics per chunk and evaluation, a
nested run per seed, the artifacts above, and the shielded policy as a registered model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np

from neorl_industrial.cli.keys import signing_key
from neorl_industrial.cli.run_folder import RunFolder
from neorl_industrial.integration.mlflow.run_logging import write_report
from neorl_industrial.wrappers.agents.agent import Agent, AgentError
from neorl_industrial.wrappers.training import Callback, RunConfig
from neorl_industrial.wrappers.training.plan import (
    DEFAULT_ENV,
    RunPlan,
    data_facts,
    resolve_run,
)
from neorl_industrial.wrappers.training.run import (
    Prepared,
    RunResult,
    prepare_config,
    sweep,
    train,
)

__all__ = [
    "MAIN_JOB",
    "RunFolder",
    "RunOutcome",
    "load_data",
    "main_job_config",
    "plan_run",
    "prepare_run",
    "run_sweep",
    "run_training",
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
    result: RunResult | None = None
    plan: RunPlan | None = None


def plan_run(config: RunConfig) -> RunPlan:
    """The run's plan: reads or generates the run's data and resolves ``config`` with it.

    Raises:
        AgentError: as :func:`prepare_run`.
    """
    try:
        return resolve_run(config, *_data(config))
    except ValueError as error:
        raise AgentError(str(error)) from None


def prepare_run(config: RunConfig) -> Prepared:
    """The run's plan with its data prepared for training (checked against the task,
    before anything is written).

    Raises:
        AgentError: naming the field: an unreadable dataset (``data.path``), a dataset
            whose card disagrees with the run, a constraint spec or cost limits that do
            not fit the task, data the algorithm cannot train on.
    """
    try:
        return prepare_config(config, *_data(config))
    except ValueError as error:
        raise AgentError(str(error)) from None


def _data(config: RunConfig) -> tuple[Any, Any, dict[str, Any]]:
    """``(dataset, card, facts)`` of the run (:func:`load_data`), read errors named."""
    from neorl_industrial.integration.datasets import DatasetFormatError

    try:
        dataset, facts, card = load_data(config)
    except (DatasetFormatError, FileNotFoundError) as error:
        raise AgentError(f"data.path: {error}") from None
    except ValueError as error:
        raise AgentError(str(error)) from None
    return dataset, card, facts


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


# ----- one start and one end, shared by train and sweep ---------------------------------
@dataclasses.dataclass
class _Run:
    """A command's run between its start and its end."""

    config: RunConfig
    plan: RunPlan
    prepared: Prepared
    folder: RunFolder
    plant_model: Any
    tracker: Any
    console: Any
    started: float
    leader: bool

    @contextlib.contextmanager
    def failures_marked(self) -> Iterator[None]:
        """Ends the tracked MLflow run FAILED (KILLED when interrupted) if the body
        raises."""
        try:
            yield
        except BaseException as error:
            if self.tracker is not None:
                killed = isinstance(error, KeyboardInterrupt)
                self.tracker.close(status="KILLED" if killed else "FAILED")
            raise

    def save(self, agent: Agent, *, export: bool, overwrite: bool = False) -> Path | None:
        """Saves the agent and, unless asked not to (or it acts on discrete actions),
        exports its policy; returns the policy's directory, or None."""
        agent.save(self.folder.agent, overwrite=overwrite)
        if not export or agent.entry.discrete:
            return None
        key = signing_key(self.config, self.console)
        return agent.export(self.folder.policy, overwrite=overwrite, signing_key=key)

    def end(
        self,
        agent: Agent,
        result: RunResult,
        report: dict[str, Any],
        exported: Path | None,
        log: Callable[[], dict[str, Any]],
    ) -> RunOutcome:
        """Writes the report (with its ``tracking`` section from ``log`` when tracked)."""
        report["seconds"] = time.perf_counter() - self.started
        if self.tracker is not None:
            report["tracking"] = log()
        write_report(self.folder.root, report)
        return self.outcome(agent, result, report, exported)

    def outcome(
        self, agent: Agent, result: RunResult, report: dict[str, Any], exported: Path | None
    ) -> RunOutcome:
        folder = self.folder
        return RunOutcome(
            self.config,
            agent,
            report,
            folder.root,
            folder.agent,
            exported,
            result=result,
            plan=self.plan,
        )


def _start(
    config: RunConfig,
    *,
    resume: bool,
    plant_model: str | Path | None,
    console: Any,
    grid: dict[str, list[Any]] | None = None,
) -> _Run:
    """Checks the run's folder, resolves the plan, loads the plant model, writes the
    configuration and the data's card, and opens the MLflow run (on process 0 only)."""
    folder = RunFolder.of(config.run_dir)
    folder.check_fresh(config, resume=resume, sweep=grid is not None)
    started = time.perf_counter()
    prepared = prepare_run(config)
    plan = prepared.plan
    model = _plant_model(plant_model, plan)
    leader = jax.process_index() == 0
    tracker = None
    if leader:
        folder.root.mkdir(parents=True, exist_ok=True)
        (folder.root / "config.yaml").write_text(config.to_yaml())
        (folder.root / "dataset.json").write_text(plan.card.to_json())
        if plan.tracking.enabled:
            from neorl_industrial.integration.mlflow.run_logging import (
                open_sweep_runs,
                open_tracker,
            )

            tracker = open_tracker(plan, console, grid)
            if grid is not None:
                open_sweep_runs(tracker, plan, grid)
    return _Run(config, plan, prepared, folder, model, tracker, console, started, leader)


# ----- train ------------------------------------------------------------------------------
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
    run = _start(config, resume=resume, plant_model=plant_model, console=console)
    plan = run.plan
    fit_started = time.perf_counter()
    every = [*(callbacks or []), *([run.tracker] if run.tracker is not None else [])]
    with run.failures_marked():
        result = train(
            run.prepared, callbacks=every, resume=resume, mesh=mesh, plant_model=run.plant_model
        )
    fit_seconds = time.perf_counter() - fit_started
    agent = Agent.from_result(result)
    if not run.leader:
        report = {
            "name": config.name,
            "process": jax.process_index(),
            "training": {"updates": result.updates, "seconds": fit_seconds},
        }
        return run.outcome(agent, result, report, None)
    exported = run.save(agent, export=export, overwrite=resume)
    report = _training_report(run, agent, result, mesh, fit_seconds, exported)

    def log() -> dict[str, Any]:
        from neorl_industrial.integration.mlflow.run_logging import log_run

        return log_run(run.tracker, plan, result, report, run.folder.agent, exported)

    return run.end(agent, result, report, exported, log)


def _training_report(
    run: _Run,
    agent: Agent,
    result: RunResult,
    mesh: Any,
    fit_seconds: float,
    exported: Path | None,
) -> dict[str, Any]:
    """A training run's ``report.json`` (before its ``seconds`` and ``tracking``)."""
    plan = run.plan
    task, safety = plan.task, plan.safety
    chunks = [entry for entry in result.history if entry["updates"] > (result.resumed_from or 0)]
    # The first chunk of a process includes compilation.
    steady = chunks[1:] or chunks
    return {
        "name": plan.name,
        "algorithm": agent.name,
        "env": task.env_id,
        "task": {
            "name": task.name,
            "kind": task.kind,
            "observations": task.observation_size,
            "actions": list(task.action_names),
            "action_units": list(task.action_units or ()),
            "cost_channels": list(safety.cost_names),
        },
        "evaluation": result.evaluation,
        "backend": jax.default_backend(),
        "devices": 1 if mesh is None else int(mesh.devices.size),
        "processes": jax.process_count(),
        "data": plan.facts,
        "training": {
            "updates": result.updates,
            "seeds": list(result.seeds),
            "seconds": fit_seconds,
            "first_chunk_seconds": chunks[0]["seconds"] if chunks else None,
            "updates_per_s": float(np.mean([entry["updates_per_s"] for entry in steady]))
            if steady
            else None,
            "resumed_from": result.resumed_from,
            "stopped_early": result.stopped_early,
            "reward_scale": result.reward_scale,
        },
        "evaluations": result.evaluations,
        "ope_beside_simulator": result.ope,
        "verdict": result.verdict,
        "best": result.best,
        "summary": result.summary,
        **_selection(agent, result),
        "cost_limits": safety.limit_record(),
        "cost_limit_sources": list(safety.limit_sources),
        "constraints": list(safety.constraints.names),
        "outputs": run.folder.outputs(
            exported,
            checkpoints=None if plan.checkpoint_dir is None else str(plan.checkpoint_dir),
        ),
    }


def _selection(agent: Agent, result: RunResult) -> dict[str, Any]:
    """The report's account of the kept policy and the candidates."""
    return {
        "selected_run": result.selected_run,
        "selection": {**result.selection, "exported": agent.selected_candidate},
        "failed_runs": result.failed_runs,
        "candidates": agent.candidates,
    }


# ----- sweep ------------------------------------------------------------------------------
def run_sweep(
    config: RunConfig,
    *,
    export: bool = True,
    console: Any = None,
    mesh: Any = None,
    plant_model: str | Path | None = None,
) -> RunOutcome:
    """Runs the grid of ``config.sweep`` (:func:`~neorl_industrial.wrappers.training.run
    .sweep`) and writes its outputs under ``config.run_dir``: ``sweep.json`` and
    ``sweep.md`` (every configuration, its runs and the choice), the chosen
    configuration's agent and policy, ``report.json``.

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
    run = _start(config, resume=False, plant_model=plant_model, console=console, grid=grid)
    plan = run.plan
    with run.failures_marked():
        result = sweep(run.prepared, grid, mesh=mesh, plant_model=run.plant_model)
    fit_seconds = time.perf_counter() - run.started
    table = result.table
    chosen = table["configurations"][table["selected"]]
    sweep_report = {
        "selected": table["selected"],
        "selected_values": chosen["values"],
        "reason": table["reason"],
        "seconds": fit_seconds,
    }
    agent = Agent.from_result(result)
    if not run.leader:
        report = {"name": config.name, "process": jax.process_index(), "sweep": sweep_report}
        return run.outcome(agent, result, report, None)
    folder = run.folder
    folder.write_sweep(table, f"Sweep of {agent.name} on {plan.label} ({config.name})", console)
    exported = run.save(agent, export=export)
    report = _sweep_report(run, agent, result, sweep_report, exported)

    def log() -> dict[str, Any]:
        from neorl_industrial.integration.mlflow.run_logging import log_sweep

        return log_sweep(run.tracker, plan, result, report, exported)

    return run.end(agent, result, report, exported, log)


def _sweep_report(
    run: _Run,
    agent: Agent,
    result: RunResult,
    sweep_report: dict[str, Any],
    exported: Path | None,
) -> dict[str, Any]:
    """A sweep's ``report.json`` (before its ``seconds`` and ``tracking``)."""
    plan, folder, table = run.plan, run.folder, result.sweep or {}
    return {
        "name": plan.name,
        "algorithm": agent.name,
        "env": plan.task.env_id,
        "evaluation": table["estimate"],
        "backend": jax.default_backend(),
        "data": plan.facts,
        "sweep": {
            "fields": table["fields"],
            "configurations": len(table["configurations"]),
            "seeds": plan.sweep_seeds,
            "runs": len(table["configurations"]) * len(plan.sweep_seeds),
            "updates": plan.training.updates,
            **sweep_report,
        },
        "verdict": table.get("verdict"),
        **_selection(agent, result),
        "cost_limits": plan.safety.limit_record(),
        "outputs": folder.outputs(exported, sweep=str(folder.sweep_table)),
    }


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
