"""The run plan: a run's configuration resolved once into the objects every later step
reads.

A :class:`RunPlan` holds the task, the safety contract (the one holder of the cost
limits once resolved: the agent, the Trainer's fingerprint, evaluation, OPE, the export
and MLflow read them from ``plan.safety``), the data, its card and its held-out split,
and the training, evaluation (with its off-policy ``ope`` settings), checkpoint, export
and tracking sections of the configuration themselves. It is frozen: a step that needs
other settings makes another plan (``dataclasses.replace``).

Two ways make one::

    plan = resolve_run(config, dataset, card)            # a RunConfig and its data
    plan = RunPlan.create(dataset, task=task, algorithm="iql-lag",
                          training=TrainingSection(updates=2000, chunk=500))

Reading files and generating data is the integration layer's (``integration.datasets``):
the caller hands the data in, so the plan itself stays inside the wrappers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pydantic

from neorl_industrial.core.agents.registry import HyperparameterError, algorithm_entry
from neorl_industrial.core.environments import Task, TaskError
from neorl_industrial.core.safety import (
    ConstraintSpec,
    ConstraintSpecError,
    SafetyContract,
    resolve_safety,
)
from neorl_industrial.core.safety.contract import check_cost_limits
from neorl_industrial.functional.state_management import Dataset, split_episodes
from neorl_industrial.wrappers.constraint_files import load_constraint_spec
from neorl_industrial.wrappers.training.config import (
    AlgorithmSection,
    CheckpointSection,
    EvaluationSection,
    ExportSection,
    OPESection,
    RunConfig,
    SweepSection,
    TrackingSection,
    TrainingSection,
)

__all__ = [
    "CONTRACT_FIELDS",
    "DEFAULT_ENV",
    "DataSplit",
    "PlanError",
    "RunPlan",
    "contract_of",
    "contract_record",
    "data_facts",
    "plan_settings",
    "resolve_contract",
    "resolve_run",
    "resolve_task",
    "saved_contract",
]

#: A saved agent's fields of its safety contract (``contract_record``'s values).
CONTRACT_FIELDS = ("cost_limits", "cost_names", "cost_relabel", "limit_sources")
#: The task of a run (or agent) given neither a task nor an environment.
DEFAULT_ENV = "IB-v0"
#: A plan's evaluation when none is given: the configuration's defaults.
DEFAULT_EVALUATION = EvaluationSection()
#: The largest batch an update may draw: offline RL trains on a few hundred transitions
#: at a time, and a batch of billions is a typo that would exhaust memory mid-run.
MAX_BATCH_SIZE = 65_536


class PlanError(ValueError):
    """A run that cannot be planned: names the field or argument that is wrong."""


@dataclasses.dataclass(frozen=True)
class DataSplit:
    """The run's data as training and off-policy evaluation divide it.

    Attributes:
        train: the episodes the agent trains on.
        heldout: whole episodes held out of training for off-policy evaluation (FQE), or
            None when the run is not evaluated off policy.
    """

    train: Dataset
    heldout: Dataset | None = None

    @classmethod
    def of(
        cls,
        dataset: Dataset,
        task: Task,
        evaluation: EvaluationSection | None,
        *,
        name: str = "dataset",
    ) -> DataSplit:
        """The split a run of ``task`` evaluated by ``evaluation`` needs: whole episodes
        held out (``evaluation.ope.holdout``, seeded by ``evaluation.ope.split_seed``)
        when the task has no simulator, or with ``evaluation.ope.always``; none for a
        discrete task (FQE scores continuous actions) or without evaluation.

        Raises:
            PlanError: naming the data, for too few episodes to hold any out.
        """
        if evaluation is None or task.discrete:
            return cls(dataset)
        ope = evaluation.ope
        if task.has_simulator and not ope.always:
            return cls(dataset)
        if dataset.n_episodes < 2:
            raise PlanError(
                f"{name}: off-policy evaluation holds out whole episodes and needs at least "
                "two; give more data or evaluate=False"
            )
        try:
            train, heldout = split_episodes(dataset, ope.holdout, ope.split_seed)
        except ValueError as error:
            raise PlanError(
                f"{name}: {dataset.n_transitions} transitions in {dataset.n_episodes} "
                f"episodes are too few for a held-out split ({error})"
            ) from None
        return cls(train, heldout)


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """A run resolved once. Every later step reads its settings from here.

    Attributes:
        name: the run's name (its directory under the output, its MLflow run).
        algorithm: the algorithm and the hyperparameters given for it.
        task: the process (the simulator's, or the dataset card's for a plant log).
        constraint_spec: the hard constraints and cost definitions (the task's defaults
            unless a spec was given).
        safety: the resolved safety contract: compiled constraints, cost channels and
            the episode cost limits (with where each came from).
        dataset: the run's data, as read or generated.
        card: the dataset's card (None for data built in Python).
        facts: what the report says about the data.
        split: the data as training and off-policy evaluation divide it.
        training: the training section.
        evaluation: the evaluation section (its ``ope`` the off-policy settings); None:
            the runs are not evaluated and their final policies are kept.
        checkpoints: the checkpoint section.
        export: the export section.
        tracking: the tracking section.
        sweep: the grid ``sweep`` trains.
        run_dir: where the run writes; None for a fit from Python.
        checkpoint_dir: where the Trainer writes checkpoints (None: it writes none).
        config: the configuration this plan was resolved from (None when built in
            Python): written as the run's ``config.yaml``, and read by the MLflow record
            for what the plan does not hold (the data section, the safety section as
            given beside the resolved contract).
    """

    name: str
    algorithm: AlgorithmSection
    task: Task
    constraint_spec: ConstraintSpec
    safety: SafetyContract
    dataset: Dataset
    card: Any
    facts: Mapping[str, Any]
    split: DataSplit
    training: TrainingSection = dataclasses.field(default_factory=TrainingSection)
    evaluation: EvaluationSection | None = dataclasses.field(default_factory=EvaluationSection)
    checkpoints: CheckpointSection = dataclasses.field(default_factory=CheckpointSection)
    export: ExportSection = dataclasses.field(default_factory=ExportSection)
    tracking: TrackingSection = dataclasses.field(default_factory=TrackingSection)
    sweep: SweepSection = dataclasses.field(default_factory=SweepSection)
    run_dir: Path | None = None
    checkpoint_dir: Path | None = None
    config: RunConfig | None = None

    def __post_init__(self) -> None:
        batch_size = self.training.batch_size
        if not 1 <= batch_size <= MAX_BATCH_SIZE:
            raise PlanError(
                f"training.batch_size: expected 1 to {MAX_BATCH_SIZE:,} transitions per "
                f"update, got {batch_size:,}"
            )

    @classmethod
    def create(
        cls,
        dataset: Dataset,
        *,
        algorithm: str | AlgorithmSection = "td3bc-lag",
        task: Task | None = None,
        constraints: ConstraintSpec | str | Path | None = None,
        cost_limits: Sequence[float] | None = None,
        safety: SafetyContract | None = None,
        card: Any = None,
        training: TrainingSection | None = None,
        evaluation: EvaluationSection | None = DEFAULT_EVALUATION,
        checkpoints: CheckpointSection | None = None,
        sweep: SweepSection | None = None,
        checkpoint_dir: str | Path | None = None,
        name: str = "run",
    ) -> RunPlan:
        """A plan built in Python (no configuration file): the task is ``task``, else
        the card's, else ``IB-v0``'s; the contract is ``safety`` when given (an agent's,
        resolved already), else resolved here from ``constraints`` and ``cost_limits``.

        Raises:
            PlanError: naming the argument: an unknown algorithm, a spec or limits that
                do not fit the task, too few episodes for a held-out split.
        """
        if isinstance(algorithm, str):
            algorithm = AlgorithmSection.model_construct(name=algorithm, hyperparameters={})
        entry = _entry(algorithm.name)
        if task is None:
            task = _card_task(card, dataset) if card is not None else _env_task(DEFAULT_ENV, {})
        if safety is None:
            spec, safety = resolve_contract(task, constraints, cost_limits, safe=entry.safe)
        else:
            spec = _spec(constraints) or task.default_constraints()
        data_name = "dataset" if card is None else f"dataset {card.name!r}"
        return cls(
            name=name,
            algorithm=algorithm,
            task=task,
            constraint_spec=spec,
            safety=safety,
            dataset=dataset,
            card=card,
            facts=data_facts(dataset, card),
            split=DataSplit.of(dataset, task, evaluation, name=data_name),
            training=training or TrainingSection(),
            evaluation=evaluation,
            checkpoints=checkpoints or CheckpointSection(),
            sweep=sweep or SweepSection(),
            checkpoint_dir=None if checkpoint_dir is None else Path(checkpoint_dir),
        )

    # ----- what the steps read ----------------------------------------------------------
    @property
    def ope(self) -> OPESection:
        """The off-policy evaluation settings (the defaults when the run is not
        evaluated)."""
        return OPESection() if self.evaluation is None else self.evaluation.ope

    @property
    def sweep_seeds(self) -> list[int]:
        """The seeds a sweep trains: the grid's ``training.seeds``, else the training's."""
        return self.sweep.seeds(self.training.seeds)

    @property
    def label(self) -> str:
        """The task's name for titles and registry names (the simulator's id, or the
        plant's dataset name)."""
        return self.task.env_id or self.task.name

    @property
    def data_name(self) -> str:
        return "dataset" if self.card is None else f"dataset {self.card.name!r}"


# ----- from a configuration --------------------------------------------------------------
def resolve_run(
    config: RunConfig,
    dataset: Dataset,
    card: Any,
    facts: Mapping[str, Any] | None = None,
) -> RunPlan:
    """Resolves ``config`` with its data (read or generated by the caller) into a
    :class:`RunPlan`: the task, checked against the data; the constraint spec and the
    safety contract; the held-out split.

    Raises:
        PlanError: naming the field: a dataset whose card disagrees with the run's
            environment or parameters (unless ``data.allow_mismatch``), a constraint spec
            or cost limits that do not fit the task.
    """
    task = resolve_task(config, dataset, card)
    spec, safety = contract_of(config, task)
    return RunPlan(
        name=config.name,
        algorithm=config.algorithm,
        task=task,
        constraint_spec=spec,
        safety=safety,
        dataset=dataset,
        card=card,
        facts=dict(facts) if facts is not None else data_facts(dataset, card),
        split=DataSplit.of(
            dataset, task, config.evaluation, name=f"dataset {getattr(card, 'name', '')!r}"
        ),
        training=config.training,
        evaluation=config.evaluation,
        checkpoints=config.checkpoints,
        export=config.export,
        tracking=config.tracking,
        sweep=config.sweep,
        run_dir=config.run_dir,
        checkpoint_dir=config.run_dir / "checkpoints" if config.checkpoints.every else None,
        config=config,
    )


def resolve_task(config: RunConfig, dataset: Dataset | None = None, card: Any = None) -> Task:
    """The run's task: the simulator's (``env``) for generated data, else the dataset
    card's, checked against the run's environment and parameters.

    Raises:
        PlanError: naming the field (``env.id``, ``env.params.<name>``, ``data.path``).
    """
    env = config.env
    if config.data.path is None:
        return _env_task(env.id or DEFAULT_ENV, env.params)
    if card is None or dataset is None:
        raise PlanError(
            f"data.path: the task of {config.data.path} comes from its card; read the data "
            "first (neorl_industrial.integration.datasets.load_any) and pass it with its card"
        )
    task = _card_task(card, dataset)
    if env.id is None:
        if env.params and task.has_simulator:
            _check_params(config, card)
            return dataclasses.replace(task, env_params={**task.env_params, **env.params})
        if env.params:
            raise PlanError(
                f"env.params: dataset {card.name!r} has no simulator to apply {sorted(env.params)} "
                "to; set env.id as well, or drop them"
            )
        return task
    if card.env_id is not None and card.env_id != env.id and not config.data.allow_mismatch:
        raise PlanError(
            f"env.id: the run names {env.id!r}, dataset {card.name!r} comes from "
            f"{card.env_id!r}; use data of {env.id!r}, or set data.allow_mismatch=true if "
            "this is intended"
        )
    _check_params(config, card)
    simulated = _env_task(env.id, {**card.env_params, **env.params})
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
            raise PlanError(f"data.path: {error}") from None
    return simulated


def contract_of(config: RunConfig, task: Task) -> tuple[ConstraintSpec, SafetyContract]:
    """The constraint spec and safety contract of ``config``'s algorithm on ``task``: the
    one place a configuration's ``safety`` section is resolved into a contract (by
    :func:`resolve_contract`, which makes every contract, from a configuration, an
    ``Agent``'s arguments or ``RunPlan.create``'s). The MLflow record logs the section as
    given beside the resolved limits; every other reader takes the contract.

    Raises:
        PlanError: as :func:`resolve_contract`, or for an unknown algorithm.
    """
    safety = config.safety
    safe = _entry(config.algorithm.name).safe
    return resolve_contract(task, safety.constraints, safety.cost_limits, safe=safe)


def resolve_contract(
    task: Task,
    constraints: ConstraintSpec | str | Path | None,
    cost_limits: Sequence[float] | None,
    *,
    safe: bool,
) -> tuple[ConstraintSpec, SafetyContract]:
    """The constraint spec (read when a path is given; the task's defaults when None) and
    the safety contract it makes with ``cost_limits`` (explicit limits win over the
    spec's, the spec's over the task's). ``safe``: every channel needs a limit (the
    safe algorithms').

    Raises:
        PlanError: naming the field: an unreadable spec, names the task does not have,
            limits of the wrong number or value.
    """
    spec = _spec(constraints)
    try:
        contract = resolve_safety(task, spec, cost_limits, require_limits=safe)
    except ValueError as error:
        raise PlanError(str(error)) from None
    return (spec if spec is not None else task.default_constraints()), contract


def data_facts(dataset: Dataset, card: Any = None, **extra: Any) -> dict[str, Any]:
    """What a report says about the data: its name and sizes, the mean episode return
    and cost, the normalized-score references when the card has them, and ``extra``
    (where it came from, how long reading took)."""
    facts: dict[str, Any] = {
        **extra,
        "name": getattr(card, "name", None),
        "transitions": dataset.n_transitions,
        "episodes": dataset.n_episodes,
        "mean_episode_return": float(np.asarray(dataset.episode_returns()).mean()),
        "mean_episode_cost": np.asarray(dataset.episode_costs()).mean(0).tolist(),
    }
    random_return = getattr(card, "random_return", None)
    expert_return = getattr(card, "expert_return", None)
    if random_return is not None and expert_return is not None:
        facts["references"] = {"random": random_return, "expert": expert_return}
    return facts


# ----- keyword conveniences --------------------------------------------------------------
#: ``Agent.fit``'s and ``Agent.sweep``'s keyword settings: the section and field of the
#: plan each one sets (``evaluate``, ``card`` and ``checkpoint_dir`` are the plan's own).
KEYWORDS: dict[str, tuple[str, str]] = {
    "updates": ("training", "updates"),
    "seeds": ("training", "seeds"),
    "batch_size": ("training", "batch_size"),
    "chunk": ("training", "chunk"),
    "normalize_observations": ("training", "normalize_observations"),
    "reward_scaling": ("training", "reward_scaling"),
    "eval_every": ("evaluation", "every"),
    "eval_episodes": ("evaluation", "episodes"),
    "eval_horizon": ("evaluation", "horizon"),
    "eval_shield": ("evaluation", "shield"),
    "eval_seed": ("evaluation", "seed"),
    "patience": ("evaluation", "patience"),
    "ope": ("evaluation", "ope"),
    "checkpoint_every": ("checkpoints", "every"),
    "keep_checkpoints": ("checkpoints", "keep"),
}
#: The keywords that set the plan itself rather than a section.
PLAN_KEYWORDS = ("evaluate", "card", "checkpoint_dir")


def plan_settings(keywords: Mapping[str, Any], *, allowed: Sequence[str]) -> dict[str, Any]:
    """The :meth:`RunPlan.create` arguments of ``fit``/``sweep`` keyword settings
    (``updates=2000, eval_every=500, ope=OPESettings(...)``): the training, evaluation
    and checkpoint sections, validated as the configuration's are, and the card and
    checkpoint directory.

    Raises:
        PlanError: naming the keyword: one that is not in ``allowed``, or a value its
            section refuses.
    """
    unknown = sorted(set(keywords) - set(allowed))
    if unknown:
        raise PlanError(
            f"{', '.join(unknown)}: unknown setting; known: {', '.join(sorted(allowed))}"
        )
    values: dict[str, dict[str, Any]] = {"training": {}, "evaluation": {}, "checkpoints": {}}
    for keyword, value in keywords.items():
        if keyword not in KEYWORDS or (keyword == "ope" and value is None):
            continue
        section, field = KEYWORDS[keyword]
        if keyword == "ope" and not isinstance(value, OPESection):
            raise PlanError(f"ope: expected OPESettings(...), got {type(value).__name__}")
        values[section][field] = list(value) if keyword == "seeds" else value
    sections: dict[str, Any] = {}
    for section, model in (
        ("training", TrainingSection),
        ("evaluation", EvaluationSection),
        ("checkpoints", CheckpointSection),
    ):
        try:
            sections[section] = model(**values[section])
        except pydantic.ValidationError as error:
            problem = error.errors()[0]
            where = (section, str(problem["loc"][0]) if problem["loc"] else "")
            keyword = next((k for k, at in KEYWORDS.items() if at == where), section)
            message = problem["msg"].removeprefix("Value error, ")
            raise PlanError(f"{keyword}: {message}") from None
    if not keywords.get("evaluate", True):
        sections["evaluation"] = None
    checkpoint_dir = keywords.get("checkpoint_dir")
    return {
        **sections,
        "card": keywords.get("card"),
        "checkpoint_dir": None if checkpoint_dir is None else Path(checkpoint_dir),
    }


# ----- helpers ---------------------------------------------------------------------------
def _entry(name: str) -> Any:
    try:
        return algorithm_entry(name)
    except HyperparameterError as error:
        raise PlanError(f"algorithm: {error}") from None


def _spec(constraints: ConstraintSpec | str | Path | None) -> ConstraintSpec | None:
    if constraints is None:
        return None
    try:
        return load_constraint_spec(constraints)
    except ConstraintSpecError as error:
        raise PlanError(f"safety.constraints: {error}") from None


def _env_task(env_id: str, params: Mapping[str, Any]) -> Task:
    try:
        return Task.from_env(env_id, params)
    except TaskError as error:
        raise PlanError(str(error)) from None


def _card_task(card: Any, dataset: Dataset) -> Task:
    try:
        return card.task(dataset)
    except ValueError as error:
        raise PlanError(f"data.path: {error}") from None


def _check_params(config: RunConfig, card: Any) -> None:
    """A dataset generated with other environment parameters than the run asks for is
    refused, naming the parameter (unless ``data.allow_mismatch``)."""
    if config.data.allow_mismatch:
        return
    recorded = card.env_params or {}
    for name, value in config.env.params.items():
        if name in recorded and recorded[name] != value:
            raise PlanError(
                f"env.params.{name}: the run asks for {value!r}, dataset {card.name!r} was "
                f"generated with {recorded[name]!r}; generate data with the same value, or "
                "set data.allow_mismatch=true if this is intended"
            )


def saved_contract(manifest: Mapping[str, Any], task: Task, spec: ConstraintSpec) -> SafetyContract:
    """The safety contract a saved agent was trained under, as its manifest holds it
    (:func:`contract_record` under ``CONTRACT_FIELDS``), not resolved again from the
    task's or spec's defaults.

    Raises:
        ValueError: naming the field that does not fit the spec or the task.
    """
    saved = {field: manifest.get(field) for field in CONTRACT_FIELDS}
    names = tuple(str(name) for name in saved["cost_names"] or ())
    limits = saved["cost_limits"] or []
    if len(limits) != len(names):
        raise ValueError(
            f"cost_limits: {len(limits)} limits for the {len(names)} cost channels {list(names)}"
        )
    if spec.costs and names != tuple(cost.name for cost in spec.costs):
        raise ValueError(
            f"cost_names: {list(names)} are not the constraint spec's cost channels "
            f"{[cost.name for cost in spec.costs]}"
        )
    given = [limit for limit in limits if limit is not None]  # null: no limit
    if given:
        check_cost_limits(given)
    values = [math.inf if limit is None else float(limit) for limit in limits]
    relabel = saved["cost_relabel"]
    if relabel is None:  # saved before the contract's own fields were
        relabel = names != tuple(task.cost_names)
    sources = tuple(saved["limit_sources"] or ("run",) * len(names))
    return SafetyContract(
        constraints=task.compile_constraints(spec),
        cost_limits=np.asarray(values, np.float32),
        cost_names=names,
        relabel=bool(relabel),
        limit_sources=sources,
    )


def contract_record(contract: SafetyContract) -> tuple[Any, ...]:
    """The safety contract as plain JSON values, in the order of ``CONTRACT_FIELDS``: what
    a saved agent, its export and its checkpoints keep of it. JSON has no infinity: a
    channel without a limit is null; a task without cost channels has limits None."""
    return (
        contract.limit_record(),
        list(contract.cost_names),
        contract.relabel,
        list(contract.limit_sources),
    )
