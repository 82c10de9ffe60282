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
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from neorl_industrial.functional.state_management import RewardScaling, select_safe_episodes
from neorl_industrial.wrappers.hostio import to_json_data
from neorl_industrial.wrappers.training.callbacks import Callback
from neorl_industrial.wrappers.training.context import PolicyContext, RunError, algorithm_of
from neorl_industrial.wrappers.training.evaluation import selection_key
from neorl_industrial.wrappers.training.plan import CONTRACT_FIELDS, RunPlan, contract_record
from neorl_industrial.wrappers.training.record import dataset_record
from neorl_industrial.wrappers.training.selection import (
    PolicyHealth,
    best_evaluated_run,
    verdict_ranking,
)
from neorl_industrial.wrappers.training.sweep_table import (
    candidate_id,
    configuration_name,
    sweep_table,
    with_values,
)
from neorl_industrial.wrappers.training.trainer import Trainer, TrainResult
from neorl_industrial.wrappers.training.verdict import (
    Verdict,
    VerdictSettings,
    episode_digests,
    merge_verdicts,
)

__all__ = [
    "CANDIDATE_FILE",
    "Prepared",
    "RunError",
    "RunResult",
    "SweepCandidates",
    "SweepProgram",
    "SweepResult",
    "check_plan_matches",
    "prepare",
    "sweep",
    "train",
]

#: A saved sweep's policies of every configuration × seed, one file per program.
CANDIDATE_FILE = "candidates-{}.msgpack"
#: The recorded fields a run has only sometimes (left out of the record when None).
_OPTIONAL = ("best", "summary", "health", "stopped_early", "ope", "verdict", "sweep")


@dataclasses.dataclass(frozen=True)
class SweepProgram:
    """One program of a sweep: its configurations (positions in the grid) and their
    policies, stacked configuration-major with the seeds inner."""

    configurations: tuple[int, ...]
    policies: Any


@dataclasses.dataclass
class SweepCandidates:
    """Every policy a sweep trained (each configuration × seed), kept so that any of
    them can be judged and exported later (``Agent.candidate``).

    Attributes:
        fields, points: the swept hyperparameters and each configuration's values.
        seeds: every configuration's seeds.
        hyperparameters: what every configuration starts from (observation statistics
            included); a configuration's own are these with its values set.
        programs: the policies, one stack per program (None until read from disk).
        files: where a saved agent keeps each program's stack.
    """

    fields: list[str]
    points: list[dict[str, Any]]
    seeds: list[int]
    hyperparameters: dict[str, Any]
    programs: list[SweepProgram | None]
    files: list[Path] = dataclasses.field(default_factory=list)
    configurations: list[tuple[int, ...]] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.configurations:
            self.configurations = [p.configurations for p in self.programs if p is not None]

    def names(self) -> list[str]:
        """Every candidate's name, configuration-major: ``config<c>-seed<s>``."""
        return [
            candidate_id(seed, index) for index in range(len(self.points)) for seed in self.seeds
        ]

    def configuration(self, index: int, context: PolicyContext) -> tuple[dict[str, Any], Any]:
        """``(hyperparameters, algorithm)`` of configuration ``index``.

        Raises:
            RunError: for values the algorithm refuses (naming the configuration).
        """
        hyperparameters = with_values(self.hyperparameters, self.points[index])
        algorithm, _ = context.build(hyperparameters, what=f"configuration {index} of the sweep: ")
        return hyperparameters, algorithm

    def program(self, number: int, context: PolicyContext) -> Any:
        """The stacked policies of program ``number`` (read from the saved agent's file
        the first time).

        Raises:
            RunError: naming a file that is missing or does not match.
        """
        from flax import serialization

        from neorl_industrial.functional.state_management import init_train_states

        program = self.programs[number]
        if program is not None:
            return program.policies
        configurations = self.configurations[number]
        _, algorithm = self.configuration(configurations[0], context)
        runs = list(range(len(configurations) * len(self.seeds)))
        template = jax.eval_shape(lambda: init_train_states(algorithm, runs).agent.policy)
        path = self.files[number]
        try:
            policies = serialization.from_bytes(template, path.read_bytes())
        except FileNotFoundError:
            raise RunError(f"{path}: missing") from None
        except (ValueError, KeyError, TypeError) as error:
            raise RunError(f"{path}: does not match the saved sweep ({error})") from None
        self.programs[number] = SweepProgram(configurations, policies)
        return policies

    def seeds_of(self, configuration: int, context: PolicyContext) -> Any:
        """The policies of ``configuration``'s seeds, stacked."""
        number = next(n for n, inside in enumerate(self.configurations) if configuration in inside)
        start = self.configurations[number].index(configuration) * len(self.seeds)
        policies = self.program(number, context)
        return jax.tree.map(
            lambda leaf: jnp.asarray(leaf[start : start + len(self.seeds)]), policies
        )

    def record(self) -> dict[str, Any]:
        """What the saved agent's manifest holds of it (the policies go to their files)."""
        return {
            "fields": self.fields,
            "points": to_json_data(self.points),
            "seeds": self.seeds,
            "hyperparameters": to_json_data(self.hyperparameters),
            "programs": [
                {"file": CANDIDATE_FILE.format(number), "configurations": list(configurations)}
                for number, configurations in enumerate(self.configurations)
            ],
        }


#: The metadata of a result's fields that are products, not part of its record.
_PRODUCT = {"product": True}


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What a training run produced.

    Recorded (the saved agent's and the exported policy's ``training`` entry):

    Attributes:
        updates: updates every run made.
        seeds: one run per seed.
        batch_size: transitions per update.
        reward_scaling, reward_scale: how rewards were scaled for training (the kind, and
            its fitted shift and scale).
        evaluation: ``"simulator"``, ``"fqe"`` (off policy, held-out episodes) or None.
        dataset: the data's name and sizes and the digests of the episodes trained on
            (:func:`~neorl_industrial.wrappers.training.record.dataset_record`).
        selected_run: the run whose policy is kept for predicting and exporting.
        selection: how it was chosen: ``{"by": "evaluation" | "verdict" | "candidate" |
            "none", ...}``.
        failed_runs: the runs whose policy cannot act, and why.
        finished: when the run ended (UTC, ISO 8601).
        best: per run, the updates and metrics of its best evaluation (a training run).
        summary: mean and 95 % interval over runs of the best evaluations' metrics.
        health: per run, whether its policy acts (finite actions, within bounds).
        stopped_early: patience ran out before the last update (a training run).
        ope: FQE's estimates beside the simulator's truth (``ope.always`` with a
            simulator).
        verdict: the verdict on the runs against the logged operation (with a plant
            model).
        sweep: a sweep's table (:func:`~neorl_industrial.wrappers.training.sweep_table
            .sweep_table`).

    Not recorded (the run's products; None for a result read back from a record):

    Attributes:
        policies: every run's kept policy, stacked on a leading run axis.
        hyperparameters: what the algorithm was built with (observation statistics
            included).
        algorithm, config: the algorithm (acting in the policy's [-1, 1]) and its config.
        trained: the Trainer's result (its state, history and evaluations).
        candidates: a sweep's every configuration × seed policy.
    """

    updates: int = 0
    seeds: list[int] = dataclasses.field(default_factory=list)
    batch_size: int | None = None
    reward_scaling: str | None = None
    reward_scale: dict[str, Any] | None = None
    evaluation: str | None = None
    dataset: dict[str, Any] = dataclasses.field(default_factory=dict)
    selected_run: int = 0
    selection: dict[str, Any] = dataclasses.field(default_factory=dict)
    failed_runs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    finished: str | None = None
    best: list[dict[str, Any] | None] | None = None
    summary: dict[str, Any] | None = None
    health: list[dict[str, Any]] | None = None
    stopped_early: bool | None = None
    ope: list[dict[str, Any]] | None = None
    verdict: dict[str, Any] | None = None
    sweep: dict[str, Any] | None = None
    policies: Any = dataclasses.field(default=None, repr=False, compare=False, metadata=_PRODUCT)
    hyperparameters: dict[str, Any] | None = dataclasses.field(
        default=None, repr=False, compare=False, metadata=_PRODUCT
    )
    algorithm: Any = dataclasses.field(default=None, repr=False, compare=False, metadata=_PRODUCT)
    config: Any = dataclasses.field(default=None, repr=False, compare=False, metadata=_PRODUCT)
    trained: TrainResult | None = dataclasses.field(
        default=None, repr=False, compare=False, metadata=_PRODUCT
    )
    candidates: SweepCandidates | None = dataclasses.field(
        default=None, repr=False, compare=False, metadata=_PRODUCT
    )

    # ----- the record -------------------------------------------------------------------
    def record(self) -> dict[str, Any]:
        """The recorded fields as a dictionary (JSON data): what a saved agent keeps."""
        record = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.metadata.get("product") or (field.name in _OPTIONAL and value is None):
                continue
            record[field.name] = value
        return to_json_data(record)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> RunResult:
        """The result a saved agent recorded (its products are not in it)."""
        names = {
            field.name for field in dataclasses.fields(cls) if not field.metadata.get("product")
        }
        kind = SweepResult if record.get("sweep") is not None else RunResult
        return kind(**{key: value for key, value in record.items() if key in names})

    # ----- the Trainer's, for a training run --------------------------------------------
    @property
    def state(self) -> Any:
        """The runs' final train state (None unless trained in this process)."""
        return None if self.trained is None else self.trained.state

    @property
    def history(self) -> list[dict[str, Any]]:
        """Per chunk: updates, seconds, updates per second, mean metrics per run."""
        return [] if self.trained is None else self.trained.history

    @property
    def evaluations(self) -> list[dict[str, Any]]:
        """Per evaluation: updates and the metrics of every run."""
        return [] if self.trained is None else self.trained.evaluations

    @property
    def resumed_from(self) -> int | None:
        """Updates of the checkpoint the training resumed from, or None."""
        return None if self.trained is None else self.trained.resumed_from

    @property
    def best_policies(self) -> Any:
        return self.policies

    @property
    def best_run(self) -> int:
        """Index of the run whose best evaluation ranks first (0 without evaluations)."""
        scored = [(selection_key(b["metrics"]), i) for i, b in enumerate(self.best or ()) if b]
        return max(scored)[1] if scored else 0

    @property
    def trained_episodes(self) -> set[str]:
        """Digests of the episodes the runs were trained on."""
        return set(self.dataset.get("trained_episodes") or ())

    def unseen_episodes(self, dataset: Any) -> tuple[Any, int]:
        """``dataset`` without the episodes the runs were trained on (recognised by their
        content), and how many those were; all of ``dataset`` when every episode trained
        them (the count then equals its episodes)."""
        trained = self.trained_episodes
        if not trained:
            return dataset, 0
        digests = episode_digests(dataset)
        unseen = np.asarray([i for i, d in enumerate(digests) if d not in trained], np.int64)
        left_out = len(digests) - len(unseen)
        if left_out == 0 or not len(unseen):
            return dataset, left_out
        return dataset.select_episodes(unseen), left_out

    @property
    def failed(self) -> dict[str, str]:
        """``{candidate: why}`` of the runs whose policy cannot act."""
        return {row["candidate"]: row["reason"] for row in self.failed_runs}


@dataclasses.dataclass(frozen=True)
class SweepResult(RunResult):
    """What a sweep produced: a :class:`RunResult` of the chosen configuration (its
    seeds' policies, its hyperparameters), with the sweep's table (``sweep``) and every
    configuration × seed policy (``candidates``)."""

    @property
    def table(self) -> dict[str, Any]:
        """The sweep's table: ``{"fields", "configurations", "selected", "reason", ...}``."""
        assert self.sweep is not None
        return self.sweep


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
    plan, context, heldout = prepared.plan, prepared.context, prepared.heldout
    entry, evaluation = context.entry, plan.evaluation
    if entry.model_based and plant_model is None:
        raise RunError(
            f"algorithm {entry.name!r} trains on a plant model of this log: pass "
            "plant_model=PlantModel.load(...) (fit one with `neorl-industrial model fit`)"
        )
    judge = plant_model is not None and context.check_plant_model(
        plant_model, plan.dataset, heldout, plan.card, verdict=not entry.model_based
    )
    hyperparameters = prepared.hyperparameters
    # The one build of the run's algorithm.
    algorithm, config = context.build(hyperparameters, plant_model, prepared.reward_scale)
    ope_evaluator = None
    if heldout is not None:
        ope_evaluator = context.ope_evaluator(algorithm, heldout, plan.ope, hyperparameters)
    evaluator: Any = ope_evaluator
    if evaluation is not None and context.task.has_simulator:
        evaluator = context.simulator_evaluator(
            context.in_plant_units(algorithm),
            evaluation.episodes,
            evaluation.horizon,
            evaluation.shield,
            evaluation.seed,
        )
    elif evaluation is None:
        evaluator = None
    if evaluation is not None and evaluator is ope_evaluator:
        evaluation = evaluation.model_copy(update={"every": 0})  # FQE scores at the end
    trainer = Trainer(
        algorithm,
        prepared.data,
        plan.training,
        evaluation,
        plan.checkpoints,
        evaluator=evaluator,
        checkpoint_dir=plan.checkpoint_dir,
        callbacks=_with_progress(callbacks) if progress else callbacks,
        fingerprint={
            "algorithm": entry.name,
            "config": to_json_data(dataclasses.asdict(config)),
            "task": context.task.to_dict(limits=False),
            "reward_scaling": prepared.reward_scaling,
            "constraints": context.constraint_spec.to_dict(),
            "safety": dict(zip(CONTRACT_FIELDS, contract_record(context.safety), strict=True)),
        },
        mesh=mesh,
    )
    try:
        trained = trainer.fit(plan.training.updates, resume=resume)
    except ValueError as error:
        if type(error) is ValueError:
            raise RunError(str(error)) from None
        raise
    seeds = list(trainer.seeds)
    names = [f"seed {seed}" for seed in seeds]
    health = context.health(algorithm, trained.best_policies, *prepared.checked)
    failed = _failures(health, names)
    healthy = [run for run in range(len(seeds)) if run not in failed]
    result = RunResult(
        updates=int(trained.state.updates[0]),
        seeds=seeds,
        evaluation=None
        if evaluator is None
        else ("fqe" if evaluator is ope_evaluator else "simulator"),
        best=trained.best,
        summary=trained.summary,
        selected_run=best_evaluated_run(trained.best, healthy),
        selection={"by": "evaluation" if evaluator is not None else "none"},
        health=[row.to_dict() for row in health],
        failed_runs=[
            {"candidate": candidate_id(seeds[run]), "reason": why}
            for run, why in sorted(failed.items())
        ],
        stopped_early=trained.stopped_early,
        finished=datetime.now(UTC).isoformat(timespec="seconds"),
        policies=trained.best_policies,
        hyperparameters=hyperparameters,
        algorithm=algorithm,
        config=config,
        trained=trained,
        **prepared.record(),
    )
    if ope_evaluator is not None and evaluation is not None and evaluator is not ope_evaluator:
        # Beside the simulator: how far the estimates are from the truth.
        result = dataclasses.replace(
            result, ope=_side_by_side(result, context, ope_evaluator, evaluation)
        )
    if judge and heldout is not None:
        policies = trained.best_policies
        if len(healthy) != len(seeds):
            rows = jnp.asarray(healthy)
            policies = jax.tree.map(lambda leaf: leaf[rows], policies)
        judged = context.verdict(
            algorithm,
            heldout,
            plant_model,
            policies,
            [f"run {run} (seed {seeds[run]})" for run in healthy],
            plan.ope,
            verdict,
            hyperparameters,
            scored=ope_evaluator if len(healthy) == len(seeds) else None,
        ).to_dict()
        # The verdict's first, not the evaluation's: what is exported is what it judged.
        first = verdict_ranking(judged)[0]
        selected = healthy[[f"run {run} (seed {seeds[run]})" for run in healthy].index(first)]
        result = dataclasses.replace(
            result,
            verdict=judged,
            selected_run=selected,
            selection={"by": "verdict", "candidate": first},
        )
    return result


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


def _side_by_side(
    result: RunResult, context: PolicyContext, ope_evaluator: Any, evaluation: Any
) -> list[dict[str, Any]]:
    """FQE's estimates of every run's final choice next to the simulator's discounted
    return and costs of the same (shielded) policy from the reset distribution."""
    from neorl_industrial.functional.transformations.evaluation import discounted_values

    rows = ope_evaluator(result.policies, 0)
    env, params = context.simulator
    horizon = int(params.horizon)
    scaler = context.scaler
    for run, row in enumerate(rows):
        policy_params = jax.tree.map(lambda leaf, run=run: leaf[run], result.policies)
        act = ope_evaluator.policy_function(policy_params)

        def policy(observations: jax.Array, act: Any = act) -> jax.Array:
            actions = act(observations)
            return actions if scaler is None else scaler.unscale(actions)

        returns, costs = jax.jit(
            lambda key, policy=policy: discounted_values(
                key, env, params, policy, evaluation.episodes, horizon, ope_evaluator.discount
            )
        )(jax.random.PRNGKey(evaluation.seed))
        simulated = float(np.mean(np.asarray(returns)))
        row["simulated_return"] = simulated
        row["relative_error"] = (row["return"] - simulated) / max(abs(simulated), 1e-9)
        row["simulated_cost_value"] = dict(
            zip(env.cost_names, np.asarray(costs).mean(0).tolist(), strict=True)
        )
    return rows


def _failures(health: Sequence[PolicyHealth], names: Sequence[str]) -> dict[int, str]:
    """``{run: why}`` of the runs whose policy cannot act.

    Raises:
        RunError: when no run's policy can act, naming the first and how many.
    """
    failed = {run: row.failure for run, row in enumerate(health) if row.failure is not None}
    if failed and len(failed) == len(health):
        first = min(failed)
        others = len(failed) - 1
        raise RunError(
            f"training: no policy can act, none is kept: {names[first]}: {failed[first]}"
            + (f" (and the other {others} runs likewise)" if others else "")
        )
    return {run: str(why) for run, why in failed.items()}


def _fingerprint(dataset: Any) -> str:
    """The log's digest (a plant model records the same of the data it was fitted on)."""
    from neorl_industrial.wrappers.models.plant_model import dataset_fingerprint

    return dataset_fingerprint(dataset)


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
    runs = _SweepRuns(prepared, points, list(groups[0].plan.seeds), plant_model, verdict)
    for group in groups:
        runs.train_group(group, mesh)
    return runs.result(list(grid), len(groups))


class _SweepRuns:
    """A sweep's runs as its programs train and evaluate them, in the grid's order."""

    def __init__(
        self,
        prepared: Prepared,
        points: list[dict[str, Any]],
        seeds: list[int],
        plant_model: Any,
        verdict: VerdictSettings | None,
    ) -> None:
        self.prepared, self.points, self.seeds = prepared, points, seeds
        self.plant_model, self.verdict_settings = plant_model, verdict
        size = len(points) * len(seeds)
        self.metrics: list[Any] = [None] * size
        self.truth: list[Any] = [None] * size
        self.health: list[Any] = [None] * size
        self.programs: list[SweepProgram] = []
        self.verdicts: list[Verdict] = []
        self.updates = 0

    def train_group(self, group: Any, mesh: Any) -> None:
        """Trains and evaluates one program's configurations × seeds."""
        from neorl_industrial.functional.transformations.sweep import SweepError, train_sweep

        prepared, context = self.prepared, self.prepared.context
        plan, heldout, seeds = prepared.plan, prepared.heldout, self.seeds
        training, evaluation = plan.training, plan.evaluation
        assert evaluation is not None
        # Each group is one program: the values no program can trace are fixed in it.
        try:
            trained = train_sweep(
                group.plan,
                prepared.data,
                n_updates=training.updates,
                chunk_updates=training.chunk,
                batch_size=training.batch_size,
                mesh=mesh,
            )
        except SweepError as error:
            raise RunError(str(error)) from None
        except ValueError as error:
            if type(error) is ValueError:
                raise RunError(str(error)) from None
            raise
        self.updates = int(trained.state.updates[0])
        hyperparameters = with_values(prepared.hyperparameters, group.fixed)
        algorithm, _ = context.build(hyperparameters)
        simulator = None
        if context.task.has_simulator:
            simulator = context.simulator_evaluator(
                context.in_plant_units(algorithm),
                evaluation.episodes,
                evaluation.horizon,
                evaluation.shield,
                evaluation.seed,
            )
        policies = trained.state.agent.policy
        names = [configuration_name(index, seed) for index in group.indices for seed in seeds]
        evaluator = None
        if heldout is not None:
            # Off policy, as on a plant: with a simulator too when ope.always, which
            # then says how good the offline choice was.
            evaluator = context.ope_evaluator(algorithm, heldout, plan.ope, hyperparameters)
            own = evaluator(policies, training.updates)
            simulated = None if simulator is None else simulator(policies, training.updates)
        else:
            assert simulator is not None
            own, simulated = simulator(policies, training.updates), None
        health = context.health(algorithm, policies, *prepared.checked)
        able = [run for run, row in enumerate(health) if row.failure is None]
        if self.plant_model is not None and heldout is not None and able:
            judged = policies
            if len(able) != len(names):
                rows = jnp.asarray(able)
                judged = jax.tree.map(lambda leaf, rows=rows: leaf[rows], policies)
            self.verdicts.append(
                context.verdict(
                    algorithm,
                    heldout,
                    self.plant_model,
                    judged,
                    [names[run] for run in able],
                    plan.ope,
                    self.verdict_settings,
                    hyperparameters,
                    scored=evaluator if len(able) == len(names) else None,
                )
            )
        n_seeds = len(seeds)
        for position, index in enumerate(group.indices):
            runs = slice(position * n_seeds, (position + 1) * n_seeds)
            target = slice(index * n_seeds, (index + 1) * n_seeds)
            self.metrics[target] = own[runs]
            self.health[target] = health[runs]
            if simulated is not None:
                self.truth[target] = simulated[runs]
        self.programs.append(
            SweepProgram(configurations=tuple(group.indices), policies=jax.device_get(policies))
        )

    def result(self, fields: list[str], n_programs: int) -> SweepResult:
        """The table, the choice and the chosen configuration's result."""
        prepared, context, seeds = self.prepared, self.prepared.context, self.seeds
        n_seeds, metrics = len(seeds), self.metrics
        estimate = "fqe" if prepared.heldout is not None else "simulator"
        all_names = [
            configuration_name(index, seed) for index in range(len(self.points)) for seed in seeds
        ]
        failed = _failures(self.health, all_names)
        merged = merge_verdicts(self.verdicts).to_dict() if self.verdicts else None
        table = sweep_table(
            self.points,
            metrics,
            seeds,
            truth=self.truth if estimate == "fqe" and context.task.has_simulator else None,
            verdict=merged,
            programs=n_programs,
            estimate=estimate,
            failed=failed,
        )
        chosen = table["selected"]
        able_seeds = [
            number for number in range(n_seeds) if chosen * n_seeds + number not in failed
        ]
        selected = max(
            able_seeds, key=lambda number: selection_key(metrics[chosen * n_seeds + number])
        )
        selection: dict[str, Any] = {"by": "evaluation"}
        if merged is not None:
            # The verdict's first, not the table's: what is exported is what it judged.
            first = verdict_ranking(merged)[0]
            chosen, selected = divmod(all_names.index(first), n_seeds)
            table["selected"] = chosen
            table["reason"] = (
                f"the verdict ranks {first} first"
                + (" and recommends it" if merged["recommended"] == first else "")
                + f" (the evaluation's choice: {table['reason']})"
            )
            selection = {"by": "verdict", "candidate": first}
        # The result is the chosen configuration's, as if fitted with it.
        hyperparameters = with_values(prepared.hyperparameters, self.points[chosen])
        algorithm, config = context.build(hyperparameters)
        program = next(p for p in self.programs if chosen in p.configurations)
        start = program.configurations.index(chosen) * n_seeds
        policies = jax.tree.map(
            lambda leaf: jnp.asarray(leaf[start : start + n_seeds]), program.policies
        )
        record = prepared.record()
        return SweepResult(
            updates=self.updates,
            seeds=seeds,
            batch_size=record["batch_size"],
            reward_scaling=record["reward_scaling"],
            reward_scale=record["reward_scale"],
            evaluation=estimate,
            dataset=record["dataset"],
            selected_run=selected,
            selection=selection,
            failed_runs=[
                {"candidate": candidate_id(seeds[run % n_seeds], run // n_seeds), "reason": why}
                for run, why in sorted(failed.items())
            ],
            sweep=table,
            finished=datetime.now(UTC).isoformat(timespec="seconds"),
            policies=policies,
            hyperparameters=hyperparameters,
            algorithm=algorithm,
            config=config,
            candidates=SweepCandidates(
                fields=fields,
                points=[dict(point) for point in self.points],
                seeds=seeds,
                hyperparameters=prepared.hyperparameters,
                programs=list(self.programs),
            ),
        )


def check_plan_matches(plan: RunPlan, context: PolicyContext) -> None:
    """Raises :class:`RunError` when ``plan`` is not of ``context``'s algorithm, task and
    contract (an agent asked to train another agent's plan)."""
    ours = (context.entry.name, context.task, *contract_record(context.safety)[:2])
    theirs = (algorithm_of(plan.algorithm.name).name, plan.task, *contract_record(plan.safety)[:2])
    if ours != theirs:
        raise RunError(
            f"plan: made for {theirs[0]} on {plan.label} with cost limits {theirs[2]}, "
            f"not this agent ({ours[0]} on {context.task.name}, {ours[2]}); make the plan's "
            "agent with Agent.from_plan(plan)"
        )
