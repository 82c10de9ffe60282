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
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np

from neorl_industrial.core.environments import Task, TaskError
from neorl_industrial.core.safety import ConstraintSpec, ConstraintSpecError
from neorl_industrial.extras import MissingExtraError, require
from neorl_industrial.wrappers.agents.agent import DEFAULT_ENV, Agent, AgentError, OPESettings
from neorl_industrial.wrappers.constraint_files import load_constraint_spec
from neorl_industrial.wrappers.hostio import json_default, write_text_atomic
from neorl_industrial.wrappers.training import Callback, RunConfig

__all__ = [
    "MAIN_JOB",
    "RunOutcome",
    "RunPlan",
    "load_data",
    "main_job_config",
    "resolve_run",
    "run_sweep",
    "run_training",
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


@dataclasses.dataclass
class RunPlan:
    """A run configuration resolved once: the task, the data (and its card), the
    constraint spec and cost limits, and the evaluation settings. The same objects go to
    the Agent, the Trainer, evaluation, export and tracking.

    Attributes:
        config: the configuration as given.
        task: the process (the simulator's, or the dataset card's for a plant log).
        dataset: the training data (read or generated).
        card: the dataset's card.
        facts: what the report says about the data.
        spec: the constraint spec of ``safety.constraints`` (None: the task's defaults).
        ope: the off-policy evaluation settings.
    """

    config: RunConfig
    task: Task
    dataset: Any
    card: Any
    facts: dict[str, Any]
    spec: ConstraintSpec | None
    ope: OPESettings

    def agent(self) -> Agent:
        """The run's agent (not yet trained)."""
        config = self.config
        return Agent(
            config.algorithm.name,
            task=self.task,
            constraints=self.spec,
            cost_limits=config.safety.cost_limits,
            **config.algorithm.hyperparameters,
        )

    @property
    def label(self) -> str:
        """The task's name for titles and registry names (the simulator's id, or the
        plant's dataset name)."""
        return self.task.env_id or self.task.name


def resolve_run(config: RunConfig) -> RunPlan:
    """Resolves ``config`` into a :class:`RunPlan`: reads or generates the data, builds
    the task, checks that data and run agree, and reads the constraint spec.

    Raises:
        AgentError: naming the field: a dataset whose card disagrees with the run's
            environment or parameters (unless ``data.allow_mismatch``), a constraint spec
            that does not fit the task, an unreadable dataset.
    """
    from neorl_industrial.integration.datasets import DatasetFormatError

    try:
        spec = (
            None
            if config.safety.constraints is None
            else load_constraint_spec(config.safety.constraints)
        )
    except ConstraintSpecError as error:
        raise AgentError(f"safety.constraints: {error}") from None
    try:
        dataset, facts, card = load_data(config)
    except (DatasetFormatError, FileNotFoundError) as error:
        raise AgentError(f"data.path: {error}") from None
    except ValueError as error:
        raise AgentError(str(error)) from None
    task = _task(config, dataset, card)
    ope_section = config.evaluation.ope
    ope = OPESettings(
        holdout=ope_section.holdout,
        updates=ope_section.updates,
        seeds=tuple(ope_section.seeds),
        hidden=tuple(ope_section.hidden),
        discount=ope_section.discount,
        always=ope_section.always,
        split_seed=ope_section.split_seed,
    )
    return RunPlan(config, task, dataset, card, facts, spec, ope)


def _task(config: RunConfig, dataset: Any, card: Any) -> Task:
    env = config.env
    if config.data.path is None:
        try:
            return Task.from_env(env.id or DEFAULT_ENV, env.params)
        except TaskError as error:
            raise AgentError(str(error)) from None
    try:
        task = card.task(dataset)
    except ValueError as error:
        raise AgentError(f"data.path: {error}") from None
    if env.id is None:
        if env.params and task.has_simulator:
            _check_params(config, card)
            task = dataclasses.replace(task, env_params={**task.env_params, **env.params})
        elif env.params:
            raise AgentError(
                f"env.params: dataset {card.name!r} has no simulator to apply {sorted(env.params)} "
                "to; set env.id as well, or drop them"
            )
        return task
    if card.env_id is not None and card.env_id != env.id and not config.data.allow_mismatch:
        raise AgentError(
            f"env.id: the run names {env.id!r}, dataset {card.name!r} comes from "
            f"{card.env_id!r}; use data of {env.id!r}, or set data.allow_mismatch=true if "
            "this is intended"
        )
    _check_params(config, card)
    try:
        simulated = Task.from_env(env.id, {**card.env_params, **env.params})
    except TaskError as error:
        raise AgentError(str(error)) from None
    if (
        task.observation_names != simulated.observation_names
        and card.observation_columns
        and not config.data.allow_mismatch
    ):
        try:
            simulated.check_data(
                observation_size=dataset.observation_size,
                action_size=dataset.action_size,
                discrete=dataset.discrete,
                n_costs=dataset.n_costs,
                source=f"dataset {card.name!r}",
                observation_names=task.observation_names,
                action_names=task.action_names,
            )
        except TaskError as error:
            raise AgentError(f"data.path: {error}") from None
    return simulated


def _check_params(config: RunConfig, card: Any) -> None:
    """A dataset generated with other environment parameters than the run asks for is
    refused, naming the parameter (unless ``data.allow_mismatch``)."""
    if config.data.allow_mismatch:
        return
    recorded = card.env_params or {}
    for name, value in config.env.params.items():
        if name in recorded and recorded[name] != value:
            raise AgentError(
                f"env.params.{name}: the run asks for {value!r}, dataset {card.name!r} was "
                f"generated with {recorded[name]!r}; generate data with the same value, or "
                "set data.allow_mismatch=true if this is intended"
            )


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
    facts: dict[str, Any] = {
        "source": source,
        "name": card.name,
        "transitions": dataset.n_transitions,
        "episodes": dataset.n_episodes,
        "seconds": time.perf_counter() - started,
        "mean_episode_return": float(np.asarray(dataset.episode_returns()).mean()),
        "mean_episode_cost": np.asarray(dataset.episode_costs()).mean(0).tolist(),
    }
    if card.random_return is not None and card.expert_return is not None:
        facts["references"] = {"random": card.random_return, "expert": card.expert_return}
    return dataset, facts, card


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
        if not _checkpoint_steps(run_dir):
            why = "it stopped before its first checkpoint" if run_dir.exists() else "no such run"
            raise AgentError(
                f"{run_dir}: nothing to resume: no checkpoint in {run_dir / 'checkpoints'} "
                f"({why}); train it again without --resume under another name "
                "(--set name=...), or remove the directory first (nothing was changed)"
            )
    started = time.perf_counter()
    plan = resolve_run(config)
    agent = plan.agent()
    dataset, data_facts, card = plan.dataset, plan.facts, plan.card
    agent.check_dataset(dataset, card)
    model = _plant_model(plant_model, plan, agent)
    leader = jax.process_index() == 0
    if leader:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(config.to_yaml())
        (run_dir / "dataset.json").write_text(card.to_json())
    training, evaluation, checkpoints = config.training, config.evaluation, config.checkpoints
    tracker = None
    if config.tracking.enabled and leader:
        tracker = _tracker(plan, agent, console)
    fit_started = time.perf_counter()
    every = [*(callbacks or []), *([tracker] if tracker is not None else [])]
    with _failures_marked(tracker):
        result = agent.fit(
            dataset,
            seeds=training.seeds,
            eval_every=evaluation.every,
            patience=evaluation.patience,
            checkpoint_dir=run_dir / "checkpoints" if checkpoints.every else None,
            checkpoint_every=checkpoints.every,
            keep_checkpoints=checkpoints.keep,
            resume=resume,
            callbacks=every,
            mesh=mesh,
            plant_model=model,
            **_training_settings(plan),
        )
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
        "env": agent.task.env_id,
        "task": {
            "name": agent.task.name,
            "kind": agent.task.kind,
            "observations": agent.task.observation_size,
            "actions": list(agent.task.action_names),
            "action_units": list(agent.task.action_units or ()),
            "cost_channels": list(agent.cost_names),
        },
        "evaluation": agent.training.get("evaluation"),
        "backend": jax.default_backend(),
        "devices": 1 if mesh is None else int(mesh.devices.size),
        "processes": jax.process_count(),
        "data": data_facts,
        "training": {
            "updates": int(result.state.updates[0]),
            "seeds": list(training.seeds),
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
        "cost_limits": agent.cost_limits,
        "cost_limit_sources": list(agent.safety.limit_sources),
        "constraints": list(agent.constraints.names),
        "outputs": {
            "run": str(run_dir),
            "agent": str(agent_dir),
            "policy": None if exported is None else str(policy_dir),
            "checkpoints": str(run_dir / "checkpoints") if checkpoints.every else None,
        },
        "seconds": time.perf_counter() - started,
    }
    if tracker is not None:
        report["tracking"] = _log_outputs(
            tracker, plan, agent, result, report, run_dir, agent_dir, exported
        )
    _write_report(run_dir, report)
    return RunOutcome(config, agent, report, run_dir, agent_dir, exported)


def _plant_model(path: str | Path | None, plan: RunPlan, agent: Agent) -> Any:
    """The plant model at ``path`` checked against the run's task and data (by name
    and fingerprint), or None.

    Raises:
        AgentError: for a model that is missing, unreadable, of another task or dataset,
            or a run that does not evaluate off policy (nothing to judge on).
    """
    if path is None:
        return None
    from neorl_industrial.wrappers.models import PlantModel, PlantModelError

    config = plan.config
    if agent.task.has_simulator and not config.evaluation.ope.always:
        raise AgentError(
            f"plant_model: {plan.label} is evaluated in its simulator; a verdict needs "
            "held-out episodes (--set evaluation.ope.always=true)"
        )
    try:
        return PlantModel.load(
            path, dataset=plan.dataset, task=agent.task, dataset_name=plan.card.name
        )
    except PlantModelError as error:
        raise AgentError(f"plant_model: {error}") from None


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
        tags=_verdict_tags(verdict),
    )


def _verdict_tags(verdict: dict[str, Any] | None) -> dict[str, str]:
    if verdict is None:
        return {}
    return {
        "verdict.decision": verdict["decision"],
        "verdict.recommended": str(verdict["recommended"]),
        "verdict.estimators": ",".join(verdict["estimators"]),
        "verdict.statement": verdict["statement"][:5000],
    }


def _training_settings(plan: RunPlan) -> dict[str, Any]:
    """What ``Agent.fit`` and ``Agent.sweep`` take alike from a run's configuration."""
    training, evaluation = plan.config.training, plan.config.evaluation
    return {
        "updates": training.updates,
        "batch_size": training.batch_size,
        "chunk": training.chunk,
        "eval_episodes": evaluation.episodes,
        "eval_horizon": evaluation.horizon,
        "eval_shield": evaluation.shield,
        "eval_seed": evaluation.seed,
        "normalize_observations": training.normalize_observations,
        "reward_scaling": training.reward_scaling,
        "ope": plan.ope,
        "card": plan.card,
    }


def _checkpoint_steps(run_dir: Path) -> list[int]:
    """The updates of the run's complete checkpoints, oldest first (orbax names a finished
    checkpoint by its step; one still being written has a temporary suffix)."""
    checkpoints = run_dir / "checkpoints"
    if not checkpoints.is_dir():
        return []
    return sorted(int(entry.name) for entry in checkpoints.iterdir() if entry.name.isdigit())


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


def _write_report(run_dir: Path, report: dict[str, Any]) -> None:
    # Replaced atomically: a background upload of the previous version reads it whole.
    write_text_atomic(run_dir / "report.json", json.dumps(report, indent=2, default=json_default))


def _plan_params(plan: RunPlan, agent: Agent, grid: dict[str, list[Any]] | None) -> dict[str, Any]:
    """The settings the run uses, as MLflow params (before flattening): the data it
    generated or read, the simulator and its evaluation only when there is one, the
    off-policy evaluation only when it runs, the registered model's name as resolved;
    not the defaults of what the run does not do (a plant run has no ``data.quality``,
    ``env.*`` or ``evaluation.episodes``), nor where its files and store are. A sweep's
    swept fields are its ``sweep.*`` params (each configuration's run has its values)."""
    from neorl_industrial.integration.mlflow import registered_model_name

    config, task, facts = plan.config, agent.task, plan.facts
    values = config.to_dict()
    data = values["data"]
    if config.data.path is None:
        used = {key: data[key] for key in ("quality", "trajectories", "seed")}
    else:
        used = {key: data[key] for key in ("path", "schema")}
        if config.data.allow_mismatch:
            used["allow_mismatch"] = True
    params: dict[str, Any] = {
        "data": {**used, "transitions": facts["transitions"], "episodes": facts["episodes"]},
        "algorithm": values["algorithm"],
        "training": values["training"],
    }
    if task.has_simulator:
        params["env"] = {"id": task.env_id, "params": dict(task.env_params)}
    evaluation = dict(values["evaluation"])
    ope = evaluation.pop("ope")
    if task.has_simulator:
        evaluation["horizon"] = config.evaluation.horizon or task.episode_length
    else:
        for key in ("episodes", "horizon", "shield", "seed"):
            evaluation.pop(key)
    if not task.has_simulator or config.evaluation.ope.always:
        evaluation["ope"] = ope
    params["evaluation"] = evaluation
    params["safety"] = {
        **values["safety"],
        "cost_limits.resolved": agent.cost_limits,
        "constraints.names": list(agent.constraints.names),
    }
    checkpoints = config.checkpoints
    params["checkpoints"] = (
        {"every": checkpoints.every, "keep": checkpoints.keep}
        if checkpoints.every
        else {"every": 0}
    )
    params["export"] = {"signing_keys": config.export.signing_keys}
    tracking = config.tracking
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


def _without_none(values: Any) -> Any:
    """``values`` without the entries that are None (settings left to a default that
    the params show resolved elsewhere, or not used)."""
    if isinstance(values, dict):
        return {key: _without_none(value) for key, value in values.items() if value is not None}
    return values


def _dataset_input(plan: RunPlan, agent: Agent, fingerprint: str) -> dict[str, Any]:
    """The training data as the arguments of the ``log_dataset`` operation: named after
    its card, the data's fingerprint as digest, its directory (or how it was generated) as
    source, the task's columns as schema, its sizes as profile."""
    config, task, facts = plan.config, agent.task, plan.facts
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
        *([f"cost.{name}", "float"] for name in agent.cost_names),
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


def _tracker(
    plan: RunPlan, agent: Agent, console: Any, grid: dict[str, list[Any]] | None = None
) -> Any:
    from neorl_industrial.integration.mlflow import (
        MlflowTracker,
        flatten,
        resolve_tracking_uri,
        system_tags,
    )
    from neorl_industrial.wrappers.training.trainer import dataset_fingerprint

    config, dataset, card, facts = plan.config, plan.dataset, plan.card, plan.facts
    tracking = config.tracking
    params = flatten(_plan_params(plan, agent, grid))
    fingerprint = dataset_fingerprint(dataset)
    tags = {
        **system_tags(),
        "env": plan.label,
        "task.kind": agent.task.kind,
        "evaluation": "simulator" if agent.task.has_simulator else "fqe",
        "algorithm": agent.name,
        "dataset": card.name,
        "dataset.fingerprint": fingerprint,
        "dataset.source": facts["source"],
        "run_dir": str(config.run_dir),
    }
    if card.checksums:
        digest = hashlib.sha256(json.dumps(card.checksums, sort_keys=True).encode())
        tags["dataset.checksum"] = digest.hexdigest()[:16]
    return MlflowTracker(
        resolve_tracking_uri(tracking.uri),
        experiment=tracking.experiment,
        run_name=config.name,
        run_dir=config.run_dir,
        params=params,
        tags=tags,
        flush_timeout=tracking.flush_timeout,
        console=console,
        references=(card.random_return, card.expert_return)
        if card.random_return is not None and card.expert_return is not None
        else None,
        dataset=_dataset_input(plan, agent, fingerprint),
    )


def _log_outputs(
    tracker: Any,
    plan: RunPlan,
    agent: Agent,
    result: Any,
    report: dict[str, Any],
    run_dir: Path,
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

    config, card = plan.config, plan.card
    title = f"{agent.name} on {plan.label} ({config.name})"
    resolved = {
        key: value
        for key, value in agent.hyperparameters.items()
        if key not in ("obs_mean", "obs_std")
    }
    resolved["reward_scaling"] = agent.training.get("reward_scale")
    tracker.sender.submit("log_batch", "parent", params=flatten({"resolved": resolved}))
    plots = run_dir / "plots"
    learning_curves(
        result.history, result.evaluations, agent.seeds, plots / "learning_curves.png", title=title
    )
    safety_plot(result.evaluations, agent.seeds, plots / "safety.png", title=title)
    for name in ("config.yaml", "dataset.json"):
        tracker.log_artifact(run_dir / name)
    tracker.log_artifact(plots, "plots")
    steps = _checkpoint_steps(run_dir)
    if steps:
        tracker.log_artifact(run_dir / "checkpoints" / str(steps[-1]), f"checkpoint/{steps[-1]}")
    tracker.log_artifact(agent_dir, "agent")
    selected = agent.selected
    best = dict(result.best[selected]["metrics"]) if result.best[selected] else {}
    if "return" in best and card.random_return is not None and card.expert_return:
        span = card.expert_return - card.random_return
        best.setdefault("normalized_return", (best["return"] - card.random_return) / span)

    def runs() -> dict[str, Any]:
        # Read after the sender is idle: the seeds' runs are created by its thread.
        ids = tracker.sender.run_ids
        return {
            "seed_run_ids": {str(seed): ids.get(tracker.seed_key(seed)) for seed in agent.seeds}
        }

    verdict = agent.training.get("verdict")
    _log_verdict(tracker, verdict, "parent", int(config.training.updates))
    tags = {"evaluation": agent.training.get("evaluation") or "none", **_verdict_tags(verdict)}
    return _register_and_close(tracker, plan, agent, policy_dir, report, best, tags, runs)


def _register_and_close(
    tracker: Any,
    plan: RunPlan,
    agent: Agent,
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

    config, card, run_dir = plan.config, plan.card, plan.config.run_dir
    tracking = config.tracking
    model_name = None
    if tracking.log_model and policy_dir is not None:
        model_name = registered_model_name(plan.label, tracking.registered_model)
        keys = (
            "return",
            "normalized_return",
            "normalized_cost",
            "violation_rate",
            "override_rate",
            "hard_violation_steps",
        )
        example = np.asarray(
            jax.device_get(plan.dataset.initial_observations()[:2]), np.float64
        ).tolist()
        tracker.log_model(
            policy_dir,
            agent_dir=run_dir / "agent",
            dataset_card=json.loads(card.to_json()),
            input_example=example,
            registered_model=model_name,
            version_metrics={key: best.get(key) for key in keys},
            version_tags={
                "env": plan.label,
                "algorithm": agent.name,
                "seed": agent.seeds[agent.selected],
                "dataset": card.name,
                "run_name": config.name,
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
    _write_report(run_dir, {**report, "tracking": section})
    tracker.log_artifact(run_dir / "report.json")
    summary = tracker.close()
    section["spooled"] = summary.spooled
    section["spool"] = None if summary.spool_path is None else str(summary.spool_path)
    section["errors"] = summary.errors[:5]
    return section


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
    seeds = list(config.sweep.grid.get("training.seeds") or config.training.seeds)
    run_dir = config.run_dir
    agent_dir, policy_dir = run_dir / "agent", run_dir / "policy"
    if run_dir.exists() and any(run_dir.iterdir()):
        raise AgentError(
            f"{run_dir}: holds an earlier run; give another name (--set name=...) or output "
            "directory (nothing was overwritten)"
        )
    started = time.perf_counter()
    plan = resolve_run(config)
    agent = plan.agent()
    agent.check_dataset(plan.dataset, plan.card)
    model = _plant_model(plant_model, plan, agent)
    leader = jax.process_index() == 0
    if leader:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(config.to_yaml())
        (run_dir / "dataset.json").write_text(plan.card.to_json())
    tracker = _tracker(plan, agent, console, grid) if config.tracking.enabled and leader else None
    if tracker is not None:
        _open_sweep_runs(tracker, config, grid, seeds)
    training = config.training
    with _failures_marked(tracker):
        table = agent.sweep(
            plan.dataset,
            grid,
            seeds=seeds,
            mesh=mesh,
            plant_model=model,
            **_training_settings(plan),
        )
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
            "seeds": seeds,
            "runs": len(table["configurations"]) * len(seeds),
            "updates": training.updates,
            "seconds": fit_seconds,
            "selected": table["selected"],
            "selected_values": chosen["values"],
            "reason": table["reason"],
        },
        "verdict": table.get("verdict"),
        "selected_run": agent.selected,
        "cost_limits": agent.cost_limits,
        "outputs": {
            "run": str(run_dir),
            "agent": str(agent_dir),
            "policy": None if exported is None else str(policy_dir),
            "sweep": str(run_dir / "sweep.json"),
        },
        "seconds": time.perf_counter() - started,
    }
    if tracker is not None:
        report["tracking"] = _log_sweep(tracker, plan, agent, table, report, exported)
    _write_report(run_dir, report)
    return RunOutcome(config, agent, report, run_dir, agent_dir, exported)


def _configuration_key(index: int) -> str:
    return f"config-{index}"


def _open_sweep_runs(
    tracker: Any, config: RunConfig, grid: dict[str, list[Any]], seeds: list[int]
) -> None:
    """The sweep's parent run, made before anything trains (so a failure marks it): the
    plan's params without the swept values (the grid instead) and the dataset input."""
    from neorl_industrial.integration.mlflow import flatten

    now = int(time.time() * 1000)
    tracker.sender.submit(
        "create_run",
        "parent",
        name=config.name,
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


def _log_sweep(
    tracker: Any,
    plan: RunPlan,
    agent: Agent,
    table: dict[str, Any],
    report: dict[str, Any],
    policy_dir: Path | None,
) -> dict[str, Any]:
    """A nested run per configuration (the plan's params with its values, the
    evaluation's settings as params and its results as metrics, the dataset input), the
    table, the chosen policy registered with the reason; then the flush. Returns the
    report's ``tracking`` section."""
    from neorl_industrial.integration.mlflow.tracking import summary_entries

    config = plan.config
    now = int(time.time() * 1000)
    step = int(config.training.updates)
    estimated = table["estimate"] == "fqe"
    prefix = "ope/" if estimated else "eval/"
    for index, configuration in enumerate(table["configurations"]):
        key = _configuration_key(index)
        values = configuration["values"]
        tracker.sender.submit(
            "create_run",
            key,
            name=f"{config.name}/" + ",".join(f"{k}={v}" for k, v in values.items()),
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
    run_dir = config.run_dir
    for name in ("config.yaml", "dataset.json", "sweep.json", "sweep.md"):
        tracker.log_artifact(run_dir / name)
    tracker.log_artifact(run_dir / "plots", "plots")
    tracker.log_artifact(run_dir / "agent", "agent")
    _log_verdict(tracker, table.get("verdict"), "parent", step)
    tags = {
        "evaluation": table["estimate"],
        "sweep_values": json.dumps(chosen["values"]),
        "sweep_reason": table["reason"],
        **_verdict_tags(table.get("verdict")),
    }

    def runs() -> dict[str, Any]:
        ids = tracker.sender.run_ids
        count = len(table["configurations"])
        return {
            "configuration_run_ids": {str(i): ids.get(_configuration_key(i)) for i in range(count)}
        }

    best = chosen["runs"][agent.selected]
    return _register_and_close(tracker, plan, agent, policy_dir, report, best, tags, runs)
