"""A run is one function of its plan: :func:`train` and :func:`sweep`.

    result = train(plan)              # one run per seed, evaluated, judged, the best kept
    result.best, result.summary, result.selected_run, result.policies
    table = sweep(plan).sweep         # every configuration x seed in one program

Each takes a frozen :class:`~neorl_industrial.wrappers.training.plan.RunPlan` (the task,
the resolved safety contract, the data and its split, the training, evaluation and
checkpoint sections), builds the algorithm once from it, trains, evaluates (in the task's
simulator with the shield, or off policy on held-out episodes), checks every policy's
health, judges the runs against the logged operation when given a plant model, selects
the policy to keep, and returns a frozen :class:`RunResult` (:class:`SweepResult`).

The command line, ``report.json``, the MLflow record and the ``Agent`` read a result by
attribute; :meth:`RunResult.record` is the part a saved agent and an exported policy keep
(their ``training`` entry), and :meth:`RunResult.from_record` reads it back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from neorl_industrial.functional.state_management import RewardScaling, select_safe_episodes
from neorl_industrial.wrappers.hostio import to_json_data
from neorl_industrial.wrappers.training.callbacks import Callback
from neorl_industrial.wrappers.training.config import RunConfig
from neorl_industrial.wrappers.training.context import CandidateStack, PolicyContext, RunError
from neorl_industrial.wrappers.training.evaluation import ope_beside_simulator
from neorl_industrial.wrappers.training.plan import (
    CONTRACT_FIELDS,
    RunPlan,
    contract_record,
    resolve_run,
)
from neorl_industrial.wrappers.training.record import dataset_record
from neorl_industrial.wrappers.training.results import (
    CANDIDATE_FILE,
    RunResult,
    SweepCandidates,
    SweepProgram,
    SweepResult,
    failed_runs,
)
from neorl_industrial.wrappers.training.selection import (
    best_evaluated_run,
    verdict_ranking,
)
from neorl_industrial.wrappers.training.sweep_runs import SweepRuns
from neorl_industrial.wrappers.training.sweep_table import (
    candidate_id,
)
from neorl_industrial.wrappers.training.trainer import Trainer
from neorl_industrial.wrappers.training.verdict import (
    VerdictSettings,
)

__all__ = [
    "CANDIDATE_FILE",
    "Prepared",
    "RunError",
    "RunResult",
    "SweepCandidates",
    "SweepProgram",
    "SweepResult",
    "prepare",
    "prepare_config",
    "sweep",
    "train",
]


@dataclasses.dataclass(frozen=True)
class Prepared:
    """The training data and settings, as :func:`prepare` makes them from a plan."""

    plan: RunPlan
    context: PolicyContext
    data: Any
    heldout: Any
    hyperparameters: dict[str, Any]
    reward_scale: RewardScaling
    reward_scaling: str

    @property
    def checked(self) -> tuple[Any, str]:
        """The observations every policy's health is checked on, and what they are."""
        if self.heldout is not None:
            return self.heldout, "held-out observations"
        return self.context.training_data(self.plan.split.train), "logged observations"

    def record(self) -> dict[str, Any]:
        """The recorded fields every run of these data and settings shares."""
        plan = self.plan
        return {
            "batch_size": plan.training.batch_size,
            "reward_scaling": self.reward_scaling,
            "reward_scale": self.reward_scale.to_dict(),
            "dataset": dataset_record(plan.dataset, plan.card, self.data, self.heldout)
            | {"fingerprint": _fingerprint(plan.dataset)},
        }


def prepare(plan: RunPlan, context: PolicyContext | None = None) -> Prepared:
    """The training data as :func:`train` and :func:`sweep` train on it: checked against
    the task, costs relabelled, the plan's held-out episodes apart for off-policy
    evaluation, safe episodes selected, observation statistics added to the
    hyperparameters, rewards scaled and actions scaled to [-1, 1].

    Raises:
        RunError: for data that does not fit the task or the contract.
    """
    context = PolicyContext.of_plan(plan) if context is None else context
    entry = context.entry
    context.check_dataset(plan.dataset, plan.card)
    # The section checked a given scaling; the algorithm's own is one of them.
    reward_scaling = plan.training.reward_scaling or entry.reward_scaling
    data = context.training_data(plan.split.train)
    split = plan.split.heldout
    heldout = None if split is None else context.training_data(split)
    if entry.select_safe_data:
        try:
            data = select_safe_episodes(data, context.cost_limits or [])
        except ValueError as error:
            raise RunError(f"{entry.name}: {error}") from None
    hyperparameters = context.hyperparameters(plan.algorithm.hyperparameters)
    if entry.safe and "episode_length" in entry.fields and "episode_length" not in hyperparameters:
        lengths = np.asarray(jax.device_get(data.episode_lengths))
        hyperparameters["episode_length"] = max(1, round(float(lengths.mean())))
    if plan.training.normalize_observations:
        obs_mean, obs_std = data.observation_moments()
        hyperparameters["obs_mean"] = obs_mean.tolist()
        hyperparameters["obs_std"] = obs_std.tolist()
    try:
        reward_scale = RewardScaling.fit(data, reward_scaling)
    except ValueError as error:
        raise RunError(str(error)) from None
    data = reward_scale.apply(data)
    if context.scaler is not None:
        data = data.replace(actions=context.scaler.scale(data.actions))
    return Prepared(plan, context, data, heldout, hyperparameters, reward_scale, reward_scaling)


def _fingerprint(dataset: Any) -> str:
    """The log's digest (a plant model records the same of the data it was fitted on)."""
    from neorl_industrial.wrappers.models.model_data import dataset_fingerprint

    return dataset_fingerprint(dataset)


def prepare_config(
    config: RunConfig, dataset: Any, card: Any, facts: Mapping[str, Any] | None = None
) -> Prepared:
    """``config`` resolved with its data (:func:`~neorl_industrial.wrappers.training.plan
    .resolve_run`) and the data prepared (:func:`prepare`): what the command trains.

    Raises:
        PlanError: naming the field, as ``resolve_run`` and ``prepare``.
    """
    return prepare(resolve_run(config, dataset, card, facts))


# ----- one training run ------------------------------------------------------------------
def train(
    plan: RunPlan | Prepared,
    *,
    callbacks: Sequence[Callback] = (),
    resume: bool = False,
    progress: bool = False,
    mesh: Any = None,
    plant_model: Any = None,
    verdict: VerdictSettings | None = None,
) -> RunResult:
    """Trains one run per seed of ``plan`` (all at once), keeps each run's best policy,
    and selects the run to keep: the evaluation's best of the runs that can act, or the
    verdict's first with a ``plant_model``.

    Evaluation runs in the task's simulator with the shield, every ``evaluation.every``
    updates and at the end; a task without a simulator is evaluated off policy: FQE
    estimates on the plan's held-out episodes, at the end. Without evaluation the final
    policies are kept. ``callbacks`` are called between chunks; ``progress`` adds the
    command line's progress bar. ``mesh`` trains data-parallel over a ``"data"`` mesh.
    ``plant_model``: a fitted ``PlantModel`` of the plan's data and task; with off-policy
    evaluation every run is then judged against the logged operation on the held-out
    episodes (``verdict`` its settings); a model-based algorithm trains on it.

    ``plan`` may be :func:`prepare`'s of a plan (the data checked and prepared already).

    Raises:
        RunError: for data that does not fit, bad settings, a plant model of another
            task or dataset, or fitted on held-out episodes; no run that can act.
        CheckpointMismatchError: when resuming from another run's checkpoint.
    """
    prepared = plan if isinstance(plan, Prepared) else prepare(plan)
    context, evaluation = prepared.context, prepared.plan.evaluation
    judge = _judges(prepared, plant_model)
    # The one build of the run's algorithm.
    algorithm, config = context.build(prepared.hyperparameters, plant_model, prepared.reward_scale)
    evaluator, ope_evaluator = _evaluators(prepared, algorithm)
    callbacks = _with_progress(callbacks) if progress else callbacks
    trainer = _trainer(prepared, algorithm, config, evaluator, ope_evaluator, callbacks, mesh)
    try:
        trained = trainer.fit(resume=resume)  # the training section's updates
    except ValueError as error:
        if type(error) is ValueError:
            raise RunError(str(error)) from None
        raise
    seeds = list(trainer.seeds)
    health = context.health(algorithm, trained.best_policies, *prepared.checked)
    failed = failed_runs(health, [f"seed {seed}" for seed in seeds])
    healthy = [run for run in range(len(seeds)) if run not in failed]
    kind = None if evaluator is None else ("fqe" if evaluator is ope_evaluator else "simulator")
    result = _result(prepared, trained, seeds, (algorithm, config), health, failed, kind)
    if ope_evaluator is not None and evaluation is not None and evaluator is not ope_evaluator:
        # Beside the simulator: how far the estimates are from the truth.
        rows = ope_beside_simulator(
            ope_evaluator,
            result.policies,
            context.simulator,
            context.scaler,
            evaluation.episodes,
            evaluation.seed,
        )
        result = dataclasses.replace(result, ope=rows)
    if judge:
        result = _judged(result, prepared, plant_model, verdict, ope_evaluator, healthy)
    return result


def _result(
    prepared: Prepared,
    trained: Any,
    seeds: list[int],
    built: tuple[Any, Any],
    health: list[Any],
    failed: dict[int, str],
    evaluation: str | None,
) -> RunResult:
    """The result of a trained run, the evaluation's best run that can act selected."""
    healthy = [run for run in range(len(seeds)) if run not in failed]
    return RunResult(
        updates=int(trained.state.updates[0]),
        seeds=seeds,
        evaluation=evaluation,
        best=trained.best,
        summary=trained.summary,
        selected_run=best_evaluated_run(trained.best, healthy),
        selection={"by": "evaluation" if evaluation is not None else "none"},
        health=[row.to_dict() for row in health],
        failed_runs=[
            {"candidate": candidate_id(seeds[run]), "reason": why}
            for run, why in sorted(failed.items())
        ],
        stopped_early=trained.stopped_early,
        finished=datetime.now(UTC).isoformat(timespec="seconds"),
        policies=trained.best_policies,
        hyperparameters=prepared.hyperparameters,
        algorithm=built[0],
        config=built[1],
        trained=trained,
        context=prepared.context,
        **prepared.record(),
    )


def _judges(prepared: Prepared, plant_model: Any) -> bool:
    """Whether ``plant_model`` judges the runs (a model-based algorithm's own model does
    only when it never saw the held-out episodes).

    Raises:
        RunError: for a model-based algorithm without its model, or a model of another
            task or dataset, or fitted on held-out episodes.
    """
    plan, entry = prepared.plan, prepared.context.entry
    if entry.model_based and plant_model is None:
        raise RunError(
            f"algorithm {entry.name!r} trains on a plant model of this log: pass "
            "plant_model=PlantModel.load(...) (fit one with `neorl-industrial model fit`)"
        )
    if plant_model is None:
        return False
    judges = prepared.context.check_plant_model(
        plant_model, plan.dataset, prepared.heldout, plan.card, verdict=not entry.model_based
    )
    return judges and prepared.heldout is not None


def _evaluators(prepared: Prepared, algorithm: Any) -> tuple[Any, Any]:
    """``(evaluator, ope_evaluator)`` of a training run: the one that scores the runs
    while they train (the simulator's, else FQE's on the held-out episodes, else None),
    and FQE's when there are held-out episodes."""
    plan, context, heldout = prepared.plan, prepared.context, prepared.heldout
    evaluation = plan.evaluation
    ope_evaluator = None
    if heldout is not None:
        ope_evaluator = context.ope_evaluator(
            algorithm, heldout, plan.ope, prepared.hyperparameters
        )
    if evaluation is None:
        return None, ope_evaluator
    if not context.task.has_simulator:
        return ope_evaluator, ope_evaluator
    evaluator = context.simulator_evaluator(
        context.in_plant_units(algorithm),
        evaluation.episodes,
        evaluation.horizon,
        evaluation.shield,
        evaluation.seed,
    )
    return evaluator, ope_evaluator


def _trainer(
    prepared: Prepared,
    algorithm: Any,
    config: Any,
    evaluator: Any,
    ope_evaluator: Any,
    callbacks: Sequence[Callback],
    mesh: Any,
) -> Trainer:
    """The Trainer of the plan's sections; its fingerprint names what a checkpoint must
    have been written by."""
    plan, context = prepared.plan, prepared.context
    evaluation = plan.evaluation
    if evaluation is not None and evaluator is ope_evaluator:
        evaluation = evaluation.model_copy(update={"every": 0})  # FQE scores at the end
    return Trainer(
        algorithm,
        prepared.data,
        plan.training,
        evaluation,
        plan.checkpoints,
        evaluator=evaluator,
        checkpoint_dir=plan.checkpoint_dir,
        callbacks=callbacks,
        fingerprint={
            "algorithm": context.entry.name,
            "config": to_json_data(dataclasses.asdict(config)),
            "task": context.task.to_dict(limits=False),
            "reward_scaling": prepared.reward_scaling,
            "constraints": context.constraint_spec.to_dict(),
            "safety": dict(zip(CONTRACT_FIELDS, contract_record(context.safety), strict=True)),
        },
        mesh=mesh,
    )


def _judged(
    result: RunResult,
    prepared: Prepared,
    plant_model: Any,
    settings: VerdictSettings | None,
    scored: Any,
    healthy: list[int],
) -> RunResult:
    """``result`` with the verdict on its runs that can act, and the verdict's first
    selected (what is exported is what it judged)."""
    seeds, policies = result.seeds, result.policies
    if len(healthy) != len(seeds):
        rows = jnp.asarray(healthy)
        policies = jax.tree.map(lambda leaf: leaf[rows], policies)
    names = [f"run {run} (seed {seeds[run]})" for run in healthy]
    judged = prepared.context.verdict(
        CandidateStack(names, policies, result.algorithm, prepared.hyperparameters),
        prepared.heldout,
        plant_model,
        prepared.plan.ope,
        settings,
        scored=scored if len(healthy) == len(seeds) else None,
        selection=prepared.plan.split.train,
    ).to_dict()
    first = verdict_ranking(judged)[0]
    return dataclasses.replace(
        result,
        verdict=judged,
        selected_run=healthy[names.index(first)],
        selection={"by": "verdict", "candidate": first},
    )


def _with_progress(callbacks: Sequence[Callback]) -> list[Callback]:
    """``callbacks`` after the command line's progress bar (which says whether the fit is
    tracked in MLflow: it is when ``callbacks`` holds an ``MlflowTracker``)."""
    from neorl_industrial.wrappers.training.callbacks import RichProgress

    bar = RichProgress(metrics=("critic_loss",))
    if not any(hasattr(callback, "tracking_uri") for callback in callbacks):
        bar.console.print(
            "MLflow: this fit is not tracked (pass callbacks=[MlflowTracker(...)] from "
            "neorl_industrial.integration.mlflow, or train with `neorl-industrial train`)"
        )
    return [bar, *callbacks]


# ----- a sweep ---------------------------------------------------------------------------
def sweep(
    plan: RunPlan | Prepared,
    grid: Mapping[str, Sequence[Any]] | None = None,
    *,
    mesh: Any = None,
    plant_model: Any = None,
    verdict: VerdictSettings | None = None,
) -> SweepResult:
    """Trains every configuration of ``grid`` (None: the plan's ``sweep.grid``) × the
    plan's sweep seeds in one program per group of configurations
    (:func:`~neorl_industrial.functional.transformations.train_sweep`), evaluates every
    run as :func:`train` would at its end (the task's simulator with the shield, or FQE on
    held-out episodes when there is none), and keeps the best configuration, chosen safety
    first on its mean over seeds; with ``plant_model`` and off-policy evaluation, the
    verdict on every configuration's runs chooses. The result is the chosen
    configuration's (its hyperparameters, its seeds' policies, its best seed selected),
    with the table (``sweep``) and every policy (``candidates``). ``plan`` may be
    :func:`prepare`'s of a plan.

    Raises:
        RunError: for data that does not fit, a bad grid (unknown or untraceable field,
            empty, a value the algorithm refuses) or bad settings.
    """
    from neorl_industrial.functional.transformations.sweep import (
        SweepError,
        expand_grid,
        plan_sweep_groups,
    )

    prepared = plan if isinstance(plan, Prepared) else None
    plan = plan.plan if isinstance(plan, Prepared) else plan
    context = PolicyContext.of_plan(plan) if prepared is None else prepared.context
    entry, task = context.entry, context.task
    if entry.model_based:
        raise RunError(
            f"algorithm {entry.name!r} trains on a plant model and is not swept in "
            "one program; fit each configuration with plant_model= instead"
        )
    grid = plan.sweep.hyperparameter_grid() if grid is None else grid
    if not grid:
        raise RunError(
            "grid: no hyperparameter to sweep; give {name: [values]} (or the config's "
            "sweep.grid algorithm.hyperparameters.<name>)"
        )
    if plan.evaluation is None:
        raise RunError("evaluate: a sweep chooses by evaluation; evaluate the runs")
    prepared = prepare(plan, context) if prepared is None else prepared
    if plant_model is not None:
        context.check_plant_model(plant_model, plan.dataset, prepared.heldout, plan.card)
    try:
        groups = plan_sweep_groups(
            entry.name,
            grid,
            seeds=plan.sweep_seeds,
            obs_size=task.observation_size,
            action_size=context.action_size,
            hyperparameters=prepared.hyperparameters,
            contract=context.safety,
        )
    except SweepError as error:
        raise RunError(str(error)) from None
    if prepared.heldout is None and not task.has_simulator:
        raise RunError(
            f"{entry.name}: a sweep chooses by evaluation, and {task.name} has "
            "neither a simulator nor held-out episodes for off-policy evaluation"
        )
    points = expand_grid(grid)
    runs = SweepRuns(prepared, points, list(groups[0].plan.seeds), plant_model, verdict)
    for group in groups:
        runs.train_group(group, mesh)
    return runs.result(list(grid), len(groups))
