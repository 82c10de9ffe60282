"""``Agent``: an offline agent for people, over the pure core.

    agent = Agent("td3bc-lag", env="IB-v0", hidden=(64, 64))     # a built-in simulator
    agent = Agent("iql-lag", task=card.task(), constraints="plant-constraints.yaml")
    result = agent.fit(dataset, updates=5000, eval_every=1000)
    action = agent.predict(observation, prev_action)      # plant units, through the shield
    agent.save("runs/td3bc-lag/agent"); Agent.load("runs/td3bc-lag/agent")
    agent.export("runs/td3bc-lag/policy")                  # served without training code

An agent knows its :class:`~neorl_industrial.core.environments.Task` (names, units and
bounds of observations and actions, cost channels, and a simulator when there is one),
its safety contract (the shield's hard constraints from a ``ConstraintSpec``, the task's
defaults unless given, and the cost limits; :func:`~neorl_industrial.core.safety.resolve_safety`)
and acts in the plant's units: actions are scaled to the policy's [-1, 1] for training
and back inside the policy. ``fit`` trains one run per seed at once and evaluates them in
the simulator, or off policy (FQE on held-out episodes) when the task has none, and keeps
the best by the safety-aware criterion; ``predict`` uses the best run's policy.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from neorl_industrial.core.agents.registry import (
    HyperparameterError,
    algorithm_entry,
    build_algorithm,
)
from neorl_industrial.core.environments import Task, TaskError
from neorl_industrial.core.safety import (
    ConstraintSpec,
    ConstraintSpecError,
    SafetyContract,
    shield,
)
from neorl_industrial.core.safety.shield import SafetyReport
from neorl_industrial.functional.state_management import (
    ActionScaler,
    Dataset,
    RewardScaling,
    init_train_states,
    relabel_costs,
    select_safe_episodes,
    with_action_scaling,
)
from neorl_industrial.version import __version__
from neorl_industrial.wrappers.agents.readings import decision_inputs
from neorl_industrial.wrappers.constraint_files import (
    constraint_spec_from_text,
    constraint_spec_yaml,
    load_constraint_spec,
)
from neorl_industrial.wrappers.hostio import (
    remove_stale_staging,
    to_json_data,
    write_directory_atomic,
)
from neorl_industrial.wrappers.training import (
    Callback,
    Evaluator,
    Trainer,
    TrainResult,
    summarize_runs,
)
from neorl_industrial.wrappers.training.config import AlgorithmSection, OPESettings, RunConfig
from neorl_industrial.wrappers.training.evaluation import selection_key
from neorl_industrial.wrappers.training.ope import OffPolicyEvaluator
from neorl_industrial.wrappers.training.plan import (
    CONTRACT_FIELDS,
    DEFAULT_ENV,
    KEYWORDS,
    PLAN_KEYWORDS,
    PlanError,
    RunPlan,
    contract_of,
    contract_record,
    plan_settings,
    resolve_contract,
    resolve_run,
    resolve_task,
    saved_contract,
)
from neorl_industrial.wrappers.training.record import dataset_record
from neorl_industrial.wrappers.training.selection import (
    PolicyHealth,
    best_evaluated_run,
    health_observations,
    policy_health,
    verdict_ranking,
)
from neorl_industrial.wrappers.training.sweep_table import (
    candidate_id,
    configuration_name,
    parse_candidate,
    sweep_table,
    with_values,
)
from neorl_industrial.wrappers.training.verdict import (
    FQE_BATCH_SIZE,
    Verdict,
    VerdictError,
    VerdictSettings,
    episode_digests,
    merge_verdicts,
    model_verdict,
)

__all__ = ["DEFAULT_ENV", "Agent", "AgentError", "OPESettings", "load_constraint_spec"]

FORMAT = "neorl-industrial-agent/1"
MANIFEST = "agent.json"
POLICIES = "policies.msgpack"
#: A saved sweep's policies of every configuration × seed, one file per program.
CANDIDATE_FILE = "candidates-{}.msgpack"
#: ``sweep``'s keyword settings (``fit`` takes all of ``KEYWORDS``): the ones a sweep's
#: end-of-training evaluation and its one program use.
SWEEP_KEYWORDS = (
    "updates",
    "seeds",
    "batch_size",
    "chunk",
    "eval_episodes",
    "eval_horizon",
    "eval_shield",
    "eval_seed",
    "normalize_observations",
    "reward_scaling",
    "ope",
    "card",
)
FIT_KEYWORDS = (*KEYWORDS, *PLAN_KEYWORDS)


class AgentError(PlanError):
    """An agent that cannot do what was asked: names the argument, file or field."""


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


class CandidateStack(NamedTuple):
    """Candidates of one algorithm, their policies stacked on a leading axis."""

    names: list[str]
    policies: Any
    algorithm: Any  # acts in the policy's [-1, 1]
    hyperparameters: dict[str, Any]


class _Prepared(NamedTuple):
    """Training data and settings, as ``Agent._prepare`` makes them."""

    data: Dataset
    heldout: Dataset | None
    ope: OPESettings
    hyperparameters: dict[str, Any]
    reward_scale: RewardScaling
    reward_scaling: str


class Agent:
    """An offline agent: fit, predict, evaluate, save, load, export.

    Args:
        algorithm: a registered algorithm (``bc``, ``bc-safe``, ``td3bc``, ``td3bc-lag``,
            ``iql``, ``iql-lag``, ``cql``, ``discrete-bc``, ``discrete-cql``).
        env: a registered simulator's id (its task); ignored when ``task`` is given.
            Neither: ``IB-v0``.
        task: the process (a plant's: ``card.task()`` of an imported log).
        env_params: overrides of the simulator's configuration and parameters.
        constraints: the hard constraints and costs: a ``ConstraintSpec``, a YAML file, or
            None for the task's defaults. Names resolve against the task's names.
        cost_limits: episode cost limit per cost channel; None: the spec's, else the
            task's.
        **hyperparameters: what differs from the algorithm's published defaults.
    """

    def __init__(
        self,
        algorithm: str = "td3bc-lag",
        env: str | None = None,
        *,
        task: Task | None = None,
        env_params: Mapping[str, Any] | None = None,
        constraints: ConstraintSpec | str | Path | None = None,
        cost_limits: Sequence[float] | None = None,
        **hyperparameters: Any,
    ) -> None:
        entry = _entry(algorithm)
        if task is None:
            try:
                task = Task.from_env(env or DEFAULT_ENV, env_params)
            except TaskError as error:
                raise AgentError(str(error)) from None
        elif env_params:
            raise AgentError("env_params: give them to the task (Task.from_env), not the agent")
        _check_kind(entry, task)
        try:
            spec, safety = resolve_contract(task, constraints, cost_limits, safe=entry.safe)
        except PlanError as error:
            raise AgentError(str(error)) from None
        self._setup(entry, task, spec, safety, hyperparameters)

    def _setup(
        self,
        entry: Any,
        task: Task,
        spec: ConstraintSpec,
        safety: SafetyContract,
        hyperparameters: Mapping[str, Any],
    ) -> None:
        """The agent of a resolved contract: every constructor ends here."""
        _check_kind(entry, task)
        self.entry = entry
        self.task = task
        self.safety: SafetyContract = safety
        self.constraint_spec: ConstraintSpec = spec
        # The cost limits are the contract's alone: the algorithm's config takes them from
        # it where it is built (``_build``), never from the hyperparameters.
        self.hyperparameters = dict(hyperparameters)
        if (
            self.entry.safe
            and "episode_length" in self.entry.fields
            and task.episode_length is not None
        ):
            self.hyperparameters = {"episode_length": int(task.episode_length)}
            self.hyperparameters.update(hyperparameters)
        self.scaler: ActionScaler | None = None
        if not task.discrete and not ActionScaler.is_identity(task.action_low, task.action_high):
            try:
                self.scaler = ActionScaler.create(
                    task.action_low, task.action_high, task.action_names
                )
            except ValueError as error:
                raise AgentError(str(error)) from None
        self.algorithm: Any = None  # acts in plant units
        self.policy_algorithm: Any = None  # acts in the policy's [-1, 1]
        self.config: Any = None
        self.policies: Any = None  # stacked PolicyParams, one per run
        self.seeds: list[int] = []
        self.selected = 0
        self.result: TrainResult | None = None
        self.training: dict[str, Any] = {}
        #: The plan ``fit()`` and ``sweep()`` train without data (``from_plan``).
        self.plan: RunPlan | None = None
        #: The configuration a dataset is resolved with (``from_config`` without data).
        self.run_config: RunConfig | None = None
        self._decide: Any = None
        self._simulator: tuple[Any, Any] | None = None
        #: A sweep's every configuration × seed policy (None for a training run's agent).
        self._sweep: SweepCandidates | None = None
        # Checked (and built, to act) at once: the one call into the core's registry.
        self._build(self.hyperparameters)

    @classmethod
    def from_plan(cls, plan: RunPlan) -> Agent:
        """The agent of a resolved :class:`~neorl_industrial.wrappers.training.plan.RunPlan`:
        its algorithm, task and safety contract (taken as resolved, not resolved again);
        ``fit()`` and ``sweep()`` without data train the plan.

        Raises:
            AgentError: for hyperparameters the algorithm refuses, or data that does not
                fit the task.
        """
        agent = cls.__new__(cls)
        agent._setup(
            _entry(plan.algorithm.name),
            plan.task,
            plan.constraint_spec,
            plan.safety,
            plan.algorithm.hyperparameters,
        )
        agent.check_dataset(plan.dataset, plan.card)
        agent.plan = plan
        return agent

    @classmethod
    def from_config(
        cls,
        config: RunConfig | Mapping[str, Any] | str | Path,
        *,
        dataset: Dataset | None = None,
        card: Any = None,
        facts: Mapping[str, Any] | None = None,
    ) -> Agent:
        """The agent a run configuration describes (a :class:`RunConfig`, its mapping or
        a YAML file): its algorithm, hyperparameters, task and safety contract. With
        ``dataset`` (and its ``card``), the run is resolved at once and ``agent.fit()``
        trains it; without, ``agent.fit(dataset, card=card)`` resolves it with the data
        then. The training settings are the configuration's either way. ``facts``: what
        the run's report says about the data (default: its sizes and mean return and
        cost).

        Raises:
            ConfigError: for a file or field the configuration refuses.
            AgentError: naming the field: a task, constraint spec or cost limits that do
                not fit, or ``data.path`` without its data (read it first, e.g. with
                ``neorl_industrial.integration.datasets.load_any``).
        """
        if isinstance(config, Mapping):
            config = RunConfig.from_dict(dict(config))
        elif not isinstance(config, RunConfig):
            config = RunConfig.from_yaml(config)
        try:
            if dataset is not None:
                return cls.from_plan(resolve_run(config, dataset, card, facts))
            if card is not None:
                raise AgentError("card: give the dataset with its card (dataset=...)")
            entry = _entry(config.algorithm.name)
            task = resolve_task(config)
            _check_kind(entry, task)
            spec, contract = contract_of(config, task)
        except PlanError as error:
            raise AgentError(str(error)) from None
        agent = cls.__new__(cls)
        agent._setup(entry, task, spec, contract, config.algorithm.hyperparameters)
        agent.run_config = config
        return agent

    # ----- construction -----------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def env_id(self) -> str | None:
        return self.task.env_id

    @property
    def env_params(self) -> dict[str, Any]:
        return dict(self.task.env_params)

    @property
    def constraints(self) -> Any:
        """The compiled hard constraints the shield enforces."""
        return self.safety.constraints

    @property
    def cost_limits(self) -> list[float] | None:
        """Episode cost limit per cost channel (None when the task has no channels)."""
        limits = self.safety.limits()
        return [float(x) for x in limits] or None

    @property
    def cost_names(self) -> tuple[str, ...]:
        return self.safety.cost_names

    @property
    def simulator(self) -> tuple[Any, Any]:
        """``(env, params)`` of the task's simulator.

        Raises:
            AgentError: when the task has none.
        """
        if self._simulator is None:
            try:
                self._simulator = self.task.make_simulator()
            except TaskError as error:
                raise AgentError(str(error)) from None
        return self._simulator

    @property
    def fitted(self) -> bool:
        return self.policies is not None

    def _build(
        self,
        hyperparameters: dict[str, Any],
        plant_model: Any = None,
        reward_scale: RewardScaling | None = None,
    ) -> None:
        """The algorithm of ``hyperparameters``; a model-based one steps ``plant_model``
        (without one it initialises and acts, as a loaded agent does, but cannot train)."""
        action_size = self.task.num_actions if self.entry.discrete else self.task.action_size
        try:
            if self.entry.model_based and plant_model is not None:
                from neorl_industrial.wrappers.training.model_based import (
                    build_model_based,
                    model_handle,
                )

                handle = model_handle(
                    plant_model, reward_scaling=reward_scale, constraints=self.constraints
                )
                self.policy_algorithm, self.config = build_model_based(
                    self.entry.name,
                    self.task.observation_size,
                    action_size,
                    hyperparameters,
                    handle,
                    contract=self.safety,
                )
            else:
                self.policy_algorithm, self.config = build_algorithm(
                    self.entry.name,
                    self.task.observation_size,
                    action_size,
                    hyperparameters,
                    contract=self.safety,
                )
        except (HyperparameterError, ValueError) as error:
            raise AgentError(str(error)) from None
        self.algorithm = with_action_scaling(self.policy_algorithm, self.scaler)
        self._decide = None

    # ----- training -------------------------------------------------------------------
    def check_dataset(self, dataset: Dataset, card: Any = None) -> None:
        """Raises :class:`AgentError` when ``dataset`` (and its card's names) does not fit
        the agent's task."""
        name = "dataset" if card is None else f"dataset {card.name!r}"
        names: dict[str, Any] = {}
        if card is not None:
            columns = getattr(card, "observation_columns", None)
            actions = getattr(card, "action_columns", None)
            names = {
                "observation_names": [c.name for c in columns] if columns else None,
                "action_names": [c.name for c in actions] if actions else None,
                "cost_names": list(getattr(card, "cost_names", []) or []) or None,
            }
        try:
            self.task.check_data(
                observation_size=dataset.observation_size,
                action_size=dataset.action_size,
                discrete=dataset.discrete,
                n_costs=dataset.n_costs,
                source=name,
                **names,
            )
        except TaskError as error:
            raise AgentError(str(error)) from None
        if self.entry.safe and not self.safety.relabel and dataset.n_costs != self.safety.n_costs:
            raise AgentError(
                f"{name}: {dataset.n_costs} cost channels; {self.entry.name} is held to "
                f"{self.safety.n_costs} ({', '.join(self.safety.cost_names)})"
            )

    def training_data(self, dataset: Dataset) -> Dataset:
        """``dataset`` as the contract sees it: costs relabelled from the spec's
        definitions when the spec defines other channels than the data has."""
        if self.safety.relabel and self.safety.constraints.n_costs:
            return relabel_costs(dataset, self.safety.constraints)
        return dataset

    def _plan(
        self,
        data: RunPlan | Dataset | None,
        settings: dict[str, Any],
        allowed: Sequence[str],
        what: str,
    ) -> RunPlan:
        """The plan ``fit``/``sweep`` train: ``data`` when it is one, the agent's own
        (``from_plan``) without data, else one built for ``data`` from the agent's
        configuration (``from_config``) or from the keyword ``settings``."""
        if data is None:
            if self.plan is None:
                raise AgentError(
                    f"{what}: no data; pass a dataset or a RunPlan (an agent of "
                    "Agent.from_config(config, dataset=...) trains its own)"
                )
            data = self.plan
        if isinstance(data, RunPlan):
            if settings:
                raise AgentError(
                    f"{', '.join(sorted(settings))}: a plan carries its settings; set them in "
                    "the plan (RunPlan.create, or the run's configuration) or pass a dataset"
                )
            plan = data
        else:
            try:
                if self.run_config is not None:
                    extra = sorted(set(settings) - {"card"})
                    if extra:
                        raise AgentError(
                            f"{', '.join(extra)}: this agent's settings come from its "
                            "configuration; change them there (RunConfig.with_overrides)"
                        )
                    plan = resolve_run(self.run_config, data, settings.get("card"))
                else:
                    plan = RunPlan.create(
                        data,
                        algorithm=AlgorithmSection.model_construct(
                            name=self.entry.name, hyperparameters=dict(self.hyperparameters)
                        ),
                        task=self.task,
                        constraints=self.constraint_spec,
                        safety=self.safety,
                        **plan_settings(settings, allowed=allowed),
                    )
            except PlanError as error:
                raise AgentError(str(error)) from None
        ours = (self.entry.name, self.task, *contract_record(self.safety)[:2])
        theirs = (_entry(plan.algorithm.name).name, plan.task, *contract_record(plan.safety)[:2])
        if ours != theirs:
            raise AgentError(
                f"plan: made for {theirs[0]} on {plan.label} with cost limits {theirs[2]}, "
                f"not this agent ({ours[0]} on {self.task.name}, {ours[2]}); make the plan's "
                "agent with Agent.from_plan(plan)"
            )
        return plan

    def _prepare(self, plan: RunPlan) -> _Prepared:
        """The training data as ``fit`` and ``sweep`` train on it: checked against the
        task, costs relabelled, the plan's held-out episodes apart for off-policy
        evaluation, safe episodes selected, observation statistics added to the
        hyperparameters, rewards scaled and actions scaled to [-1, 1]."""
        self.check_dataset(plan.dataset, plan.card)
        # The section checked a given scaling; the algorithm's own is one of them.
        reward_scaling = plan.training.reward_scaling or self.entry.reward_scaling
        data = self.training_data(plan.split.train)
        heldout = None if plan.split.heldout is None else self.training_data(plan.split.heldout)
        ope = plan.ope
        if self.entry.select_safe_data:
            try:
                data = select_safe_episodes(data, self.cost_limits or [])
            except ValueError as error:
                raise AgentError(f"{self.entry.name}: {error}") from None
        hyperparameters = dict(self.hyperparameters)
        if (
            self.entry.safe
            and "episode_length" in self.entry.fields
            and "episode_length" not in hyperparameters
        ):
            lengths = np.asarray(jax.device_get(data.episode_lengths))
            hyperparameters["episode_length"] = max(1, round(float(lengths.mean())))
        if plan.training.normalize_observations:
            obs_mean, obs_std = data.observation_moments()
            hyperparameters["obs_mean"] = obs_mean.tolist()
            hyperparameters["obs_std"] = obs_std.tolist()
        try:
            reward_scale = RewardScaling.fit(data, reward_scaling)
        except ValueError as error:
            raise AgentError(str(error)) from None
        data = reward_scale.apply(data)
        if self.scaler is not None:
            data = data.replace(actions=self.scaler.scale(data.actions))
        return _Prepared(
            data=data,
            heldout=heldout,
            ope=ope,
            hyperparameters=hyperparameters,
            reward_scale=reward_scale,
            reward_scaling=reward_scaling,
        )

    def fit(
        self,
        data: RunPlan | Dataset | None = None,
        *,
        callbacks: Sequence[Callback] = (),
        resume: bool = False,
        progress: bool = False,
        mesh: Any = None,
        plant_model: Any = None,
        verdict: VerdictSettings | None = None,
        **settings: Any,
    ) -> TrainResult:
        """Trains one run per seed on the data (all at once) and keeps each run's best
        policy.

        ``data``: a :class:`~neorl_industrial.wrappers.training.plan.RunPlan` (its data
        and settings), None (the agent's own plan: ``from_plan``, ``from_config``), or a
        dataset with keyword ``settings`` that build the plan: ``updates`` (5000),
        ``seeds`` ((0,)), ``batch_size`` (256), ``chunk`` (1000), ``eval_every`` (0),
        ``eval_episodes`` (10), ``eval_horizon``, ``eval_shield`` (True), ``eval_seed``
        (0), ``patience``, ``checkpoint_dir``, ``checkpoint_every`` (0),
        ``keep_checkpoints`` (2), ``normalize_observations`` (True), ``reward_scaling``,
        ``evaluate`` (True), ``ope`` (:class:`OPESettings`), ``card`` (the dataset's card),
        each the run configuration's field of that name (``training.*``,
        ``evaluation.*``, ``checkpoints.*``) and checked as it is.

        Evaluation runs in the task's simulator with the shield, every ``eval_every``
        updates and at the end; a task without a simulator is evaluated off policy: FQE
        estimates on held-out episodes (``ope``; those episodes are not trained on), at
        the end. ``evaluate=False``: never; the final policies are kept.

        ``reward_scaling``: how rewards are scaled for training, one of
        ``REWARD_SCALINGS`` (``none``, ``std``, ``standardize``, ``return_range``); None
        takes the algorithm's own (IQL's paper scaling, ``std`` for the others). The
        policy's returns are unchanged and costs are never scaled; the scaling used is
        recorded in ``training["reward_scale"]`` and the exported policy's metadata.
        ``progress``: show the rich progress bar the command line shows (and say whether
        the fit is tracked in MLflow: it is when ``callbacks`` holds an ``MlflowTracker``).
        ``mesh``: train data-parallel over a ``"data"`` mesh (``data_mesh()``), one shard
        of whole episodes per device and gradients averaged across them (see
        :class:`~neorl_industrial.wrappers.training.Trainer`).
        ``plant_model``: a fitted ``PlantModel`` of this dataset and task; with off-policy
        evaluation, every run's policy is then judged against the logged operation on the
        held-out episodes (``training["verdict"]``, see :meth:`judge`; ``verdict`` its
        settings).

        Raises:
            AgentError: for data that does not fit the agent, or bad settings; a plant
                model of another task or dataset, or fitted on held-out episodes.
            CheckpointMismatchError: when resuming from another run's checkpoint.
        """
        plan = self._plan(data, settings, FIT_KEYWORDS, "fit")
        training, evaluation, checkpoints = plan.training, plan.evaluation, plan.checkpoints
        dataset, card = plan.dataset, plan.card
        prepared = self._prepare(plan)
        data, heldout, ope = prepared.data, prepared.heldout, prepared.ope
        hyperparameters, reward_scale = prepared.hyperparameters, prepared.reward_scale
        reward_scaling = prepared.reward_scaling
        if self.entry.model_based and plant_model is None:
            raise AgentError(
                f"algorithm {self.entry.name!r} trains on a plant model of this log: pass "
                "plant_model=PlantModel.load(...) (fit one with `neorl-industrial model fit`)"
            )
        judge = plant_model is not None and self._check_plant_model(
            plant_model, dataset, heldout, card, verdict=not self.entry.model_based
        )
        self._build(hyperparameters, plant_model, reward_scale)
        evaluator: Any = None
        ope_evaluator = None
        if heldout is not None:
            ope_evaluator = self._ope_evaluator(heldout, ope, hyperparameters)
        if evaluation is not None and self.task.has_simulator:
            evaluator = self._evaluator(
                evaluation.episodes, evaluation.horizon, evaluation.shield, evaluation.seed
            )
        elif evaluation is not None:
            evaluator = ope_evaluator
        if progress:
            from neorl_industrial.wrappers.training import RichProgress

            bar = RichProgress(metrics=("critic_loss",))
            if not any(hasattr(callback, "tracking_uri") for callback in callbacks):
                bar.console.print(
                    "MLflow: this fit is not tracked (pass callbacks=[MlflowTracker(...)] from "
                    "neorl_industrial.integration.mlflow, or train with `neorl-industrial train`)"
                )
            callbacks = [bar, *callbacks]
        trainer = Trainer(
            self.policy_algorithm,
            data,
            seeds=training.seeds,
            batch_size=training.batch_size,
            chunk_updates=training.chunk,
            evaluator=evaluator,
            eval_every=evaluation.every
            if evaluation is not None and evaluator is not ope_evaluator
            else 0,
            patience=None if evaluation is None else evaluation.patience,
            checkpoint_dir=plan.checkpoint_dir,
            checkpoint_every=checkpoints.every,
            keep_checkpoints=checkpoints.keep,
            callbacks=callbacks,
            fingerprint={
                "algorithm": self.entry.name,
                "config": to_json_data(dataclasses.asdict(self.config)),
                "task": self.task.to_dict(limits=False),
                "reward_scaling": reward_scaling,
                "constraints": self.constraint_spec.to_dict(),
                "safety": dict(zip(CONTRACT_FIELDS, contract_record(self.safety), strict=True)),
            },
            mesh=mesh,
        )
        try:
            result = trainer.fit(training.updates, resume=resume)
        except ValueError as error:
            if type(error) is ValueError:
                raise AgentError(str(error)) from None
            raise
        self.result = result
        self._sweep = None
        self.policies = result.best_policies
        self.seeds = list(trainer.seeds)
        # The observation statistics are part of the trained agent's configuration.
        self.hyperparameters = hyperparameters
        names = [f"seed {seed}" for seed in self.seeds]
        health = self._health(
            self.policies,
            heldout if heldout is not None else self.training_data(plan.split.train),
            "held-out observations" if heldout is not None else "logged observations",
        )
        failed = _failures(health, names)
        healthy = [run for run in range(len(self.seeds)) if run not in failed]
        self.selected = best_evaluated_run(result.best, healthy)
        self.training = {
            "updates": int(result.state.updates[0]),
            "seeds": self.seeds,
            "batch_size": training.batch_size,
            "reward_scaling": reward_scaling,
            "reward_scale": reward_scale.to_dict(),
            "evaluation": None
            if evaluator is None
            else ("fqe" if evaluator is ope_evaluator else "simulator"),
            "dataset": dataset_record(dataset, card, data, heldout)
            | {"fingerprint": _fingerprint(dataset)},
            "best": result.best,
            "summary": result.summary,
            "selected_run": self.selected,
            "selection": {"by": "evaluation" if evaluator is not None else "none"},
            "health": [row.to_dict() for row in health],
            "failed_runs": _failed_record(failed, self.seeds),
            "stopped_early": result.stopped_early,
            "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        if ope_evaluator is not None and evaluation is not None and evaluator is not ope_evaluator:
            # Beside the simulator: how far the estimates are from the truth.
            self.training["ope"] = self._side_by_side(
                ope_evaluator, evaluation.episodes, evaluation.seed
            )
        if judge and heldout is not None:
            judged = self._judge_runs(
                heldout, plant_model, ope, verdict, scored=ope_evaluator, runs=healthy
            ).to_dict()
            self.training["verdict"] = judged
            # The verdict's first, not the evaluation's: what is exported is what it judged.
            first = verdict_ranking(judged)[0]
            self.selected = healthy[[self._run_name(run) for run in healthy].index(first)]
            self.training["selected_run"] = self.selected
            self.training["selection"] = {"by": "verdict", "candidate": first}
        return result

    def sweep(
        self,
        data: RunPlan | Dataset | None = None,
        grid: Mapping[str, Sequence[Any]] | None = None,
        *,
        mesh: Any = None,
        plant_model: Any = None,
        verdict: VerdictSettings | None = None,
        **settings: Any,
    ) -> dict[str, Any]:
        """Trains every configuration of ``grid`` × ``seeds`` in one program
        (:func:`~neorl_industrial.functional.transformations.train_sweep`), evaluates every
        run as :meth:`fit` would at its end (the task's simulator with the shield, or FQE
        on held-out episodes when there is none), and keeps the best configuration, chosen
        safety first on its mean over seeds: configurations whose mean episode cost keeps
        every limit rank above the others, then by return.

        ``data`` and ``settings`` as for :meth:`fit` (the settings ``updates``, ``seeds``,
        ``batch_size``, ``chunk``, ``eval_episodes``, ``eval_horizon``, ``eval_shield``,
        ``eval_seed``, ``normalize_observations``, ``reward_scaling``, ``ope``, ``card``);
        a plan's seeds are its grid's ``training.seeds``, else its training's.
        ``grid`` (None: the plan's ``sweep.grid``) maps hyperparameters of the algorithm
        (dotted for nested ones, e.g. ``critic.cvar_level``) to their values; only numeric
        ones that set no shape can be swept in one program. ``mesh`` (``runs_mesh()``)
        lays the runs over its devices, across processes after ``initialize_distributed``.
        The agent ends fitted with the chosen configuration's hyperparameters and its
        seeds' policies (its best seed selected), as after
        :meth:`fit`; ``training["sweep"]`` holds the table this returns:
        ``{"fields", "configurations": [{"values", "runs", "summary", "within_limits"}],
        "selected", "reason"}``. With ``plant_model`` and off-policy evaluation, every
        configuration's runs are judged against the logged operation on the held-out
        episodes, and the table's ``verdict`` says which (if any) to recommend.

        Raises:
            AgentError: for data that does not fit the agent, a bad grid (unknown or
                untraceable field, empty, a value the algorithm refuses) or bad settings.
        """
        from neorl_industrial.functional.transformations.sweep import (
            SweepError,
            expand_grid,
            plan_sweep_groups,
            train_sweep,
        )

        if self.entry.model_based:
            raise AgentError(
                f"algorithm {self.entry.name!r} trains on a plant model and is not swept in "
                "one program; fit each configuration with plant_model= instead"
            )
        plan = self._plan(data, settings, SWEEP_KEYWORDS, "sweep")
        grid = plan.sweep.hyperparameter_grid() if grid is None else grid
        if not grid:
            raise AgentError(
                "grid: no hyperparameter to sweep; give {name: [values]} (or the config's "
                "sweep.grid algorithm.hyperparameters.<name>)"
            )
        if plan.evaluation is None:
            raise AgentError("evaluate: a sweep chooses by evaluation; evaluate the runs")
        training, evaluation = plan.training, plan.evaluation
        dataset, card, seeds = plan.dataset, plan.card, plan.sweep_seeds
        prepared = self._prepare(plan)
        data, hyperparameters = prepared.data, prepared.hyperparameters
        if plant_model is not None:
            self._check_plant_model(plant_model, dataset, prepared.heldout, card)
        verdicts: list[Verdict] = []
        action_size = self.task.num_actions if self.entry.discrete else self.task.action_size
        try:
            groups = plan_sweep_groups(
                self.entry.name,
                grid,
                seeds=seeds,
                obs_size=self.task.observation_size,
                action_size=action_size,
                hyperparameters=hyperparameters,
                contract=self.safety,
            )
        except SweepError as error:
            raise AgentError(str(error)) from None
        if prepared.heldout is None and not self.task.has_simulator:
            raise AgentError(
                f"{self.entry.name}: a sweep chooses by evaluation, and {self.task.name} has "
                "neither a simulator nor held-out episodes for off-policy evaluation"
            )
        points = expand_grid(grid)
        n_seeds = len(groups[0].plan.seeds)
        seeds = list(groups[0].plan.seeds)
        # Per configuration (the grid's order): its runs' evaluations and its policies.
        metrics: list[Any] = [None] * (len(points) * n_seeds)
        truth: list[Any] = [None] * (len(points) * n_seeds)
        health: list[Any] = [None] * (len(points) * n_seeds)
        programs: list[SweepProgram] = []
        estimate = "fqe" if prepared.heldout is not None else "simulator"
        checked = (
            prepared.heldout
            if prepared.heldout is not None
            else self.training_data(plan.split.train)
        )
        source = "held-out observations" if prepared.heldout is not None else "logged observations"
        updates_done = 0
        for group in groups:
            # Each group is one program: the values no program can trace are fixed in it.
            try:
                result = train_sweep(
                    group.plan,
                    data,
                    n_updates=training.updates,
                    chunk_updates=training.chunk,
                    batch_size=training.batch_size,
                    mesh=mesh,
                )
            except SweepError as error:
                raise AgentError(str(error)) from None
            except ValueError as error:
                if type(error) is ValueError:
                    raise AgentError(str(error)) from None
                raise
            updates_done = int(result.state.updates[0])
            group_hyperparameters = with_values(hyperparameters, group.fixed)
            self._build(group_hyperparameters)
            simulator = None
            if self.task.has_simulator:
                simulator = self._evaluator(
                    evaluation.episodes, evaluation.horizon, evaluation.shield, evaluation.seed
                )
            policies = result.state.agent.policy
            names = [configuration_name(index, seed) for index in group.indices for seed in seeds]
            if prepared.heldout is not None:
                # Off policy, as on a plant: with a simulator too when ope.always, which
                # then says how good the offline choice was.
                evaluator = self._ope_evaluator(
                    prepared.heldout, prepared.ope, group_hyperparameters
                )
                own = evaluator(policies, training.updates)
                simulated = None if simulator is None else simulator(policies, training.updates)
            else:
                evaluator = None
                own, simulated = simulator(policies, training.updates), None
            group_health = self._health(policies, checked, source)
            able = [run for run, row in enumerate(group_health) if row.failure is None]
            if plant_model is not None and prepared.heldout is not None and able:
                judged = policies
                if len(able) != len(names):
                    rows = jnp.asarray(able)
                    judged = jax.tree.map(lambda leaf, rows=rows: leaf[rows], policies)
                verdicts.append(
                    self._verdict(
                        prepared.heldout,
                        plant_model,
                        judged,
                        [names[run] for run in able],
                        prepared.ope,
                        verdict,
                        group_hyperparameters,
                        scored=evaluator if len(able) == len(names) else None,
                    )
                )
            for position, index in enumerate(group.indices):
                runs = slice(position * n_seeds, (position + 1) * n_seeds)
                target = slice(index * n_seeds, (index + 1) * n_seeds)
                metrics[target] = own[runs]
                health[target] = group_health[runs]
                if simulated is not None:
                    truth[target] = simulated[runs]
            programs.append(
                SweepProgram(configurations=tuple(group.indices), policies=jax.device_get(policies))
            )
        all_names = [
            configuration_name(index, seed) for index in range(len(points)) for seed in seeds
        ]
        failed = _failures(health, all_names)
        merged = merge_verdicts(verdicts).to_dict() if verdicts else None
        table = sweep_table(
            points,
            metrics,
            seeds,
            truth=truth if estimate == "fqe" and self.task.has_simulator else None,
            verdict=merged,
            programs=len(groups),
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
            run = all_names.index(first)
            chosen, selected = divmod(run, n_seeds)
            table["selected"] = chosen
            table["reason"] = (
                f"the verdict ranks {first} first"
                + (" and recommends it" if merged["recommended"] == first else "")
                + f" (the evaluation's choice: {table['reason']})"
            )
            selection = {"by": "verdict", "candidate": first}
        # The agent becomes the chosen configuration's, as if fitted with it.
        chosen_hyperparameters = with_values(hyperparameters, points[chosen])
        self._build(chosen_hyperparameters)
        program = next(p for p in programs if chosen in p.configurations)
        start = program.configurations.index(chosen) * n_seeds
        self.policies = jax.tree.map(
            lambda leaf: jnp.asarray(leaf[start : start + n_seeds]), program.policies
        )
        self.seeds = seeds
        self.selected = selected
        self.hyperparameters = chosen_hyperparameters
        self.result = None
        record = dataset_record(dataset, card, data, prepared.heldout)
        self.training = {
            "updates": updates_done,
            "seeds": self.seeds,
            "batch_size": training.batch_size,
            "reward_scaling": prepared.reward_scaling,
            "reward_scale": prepared.reward_scale.to_dict(),
            "evaluation": estimate,
            "dataset": record | {"fingerprint": _fingerprint(dataset)},
            "selected_run": self.selected,
            "selection": selection,
            "failed_runs": [
                {"candidate": candidate_id(seeds[run % n_seeds], run // n_seeds), "reason": why}
                for run, why in sorted(failed.items())
            ],
            "sweep": table,
            "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        self._sweep = SweepCandidates(
            fields=list(grid),
            points=[dict(point) for point in points],
            seeds=seeds,
            hyperparameters=hyperparameters,
            programs=programs,
        )
        return table

    def _side_by_side(
        self, ope_evaluator: OffPolicyEvaluator, episodes: int, seed: int
    ) -> list[dict[str, Any]]:
        """FQE's estimates of every run's final choice next to the simulator's discounted
        return and costs of the same (shielded) policy from the reset distribution."""
        from neorl_industrial.functional.transformations.evaluation import discounted_values

        rows = ope_evaluator(self.policies, 0)
        env, params = self.simulator
        horizon = int(params.horizon)
        scaler = self.scaler
        for run, row in enumerate(rows):
            act = ope_evaluator.policy_function(self.policy(run))

            def policy(observations: jax.Array, act: Any = act) -> jax.Array:
                actions = act(observations)
                return actions if scaler is None else scaler.unscale(actions)

            returns, costs = jax.jit(
                lambda key, policy=policy: discounted_values(
                    key, env, params, policy, episodes, horizon, ope_evaluator.discount
                )
            )(jax.random.PRNGKey(seed))
            simulated = float(np.mean(np.asarray(returns)))
            row["simulated_return"] = simulated
            row["relative_error"] = (row["return"] - simulated) / max(abs(simulated), 1e-9)
            row["simulated_cost_value"] = dict(
                zip(env.cost_names, np.asarray(costs).mean(0).tolist(), strict=True)
            )
        return rows

    def _evaluator(
        self, episodes: int, horizon: int | None, shield_actions: bool, seed: int
    ) -> Evaluator:
        env, params = self.simulator
        limits = self.cost_limits
        if limits is not None and (len(limits) != env.n_costs or not all(np.isfinite(limits))):
            limits = None  # a contract of other channels than the simulator's cost vector
        return Evaluator(
            self.algorithm,
            env,
            params,
            episodes=episodes,
            horizon=int(horizon or params.horizon),
            constraints=self.constraints,
            shield=shield_actions,
            cost_limits=limits,
            cost_names=env.cost_names,
            seed=seed,
        )

    def _ope_evaluator(
        self,
        heldout: Dataset,
        ope: OPESettings,
        hyperparameters: dict[str, Any],
        algorithm: Any = None,
    ) -> OffPolicyEvaluator:
        if self.scaler is not None:
            heldout = heldout.replace(actions=self.scaler.scale(heldout.actions))
        limits = self.cost_limits
        lengths = np.asarray(jax.device_get(heldout.episode_lengths))
        episode_length = int(
            hyperparameters.get("episode_length")
            or self.task.episode_length
            or max(1, round(float(lengths.mean())))
        )
        return OffPolicyEvaluator(
            self.policy_algorithm if algorithm is None else algorithm,
            heldout,
            scaler=self.scaler,
            constraints=self.constraints,
            cost_limits=limits if heldout.n_costs == len(limits or []) else None,
            cost_names=self.cost_names,
            episode_length=episode_length,
            updates=ope.updates,
            seeds=tuple(ope.seeds),
            hidden=tuple(ope.hidden),
            discount=ope.discount,
        )

    def _require_fitted(self, what: str) -> None:
        if not self.fitted:
            raise AgentError(f"{what}: the agent has no policy yet; fit or load it first")

    # ----- candidates ------------------------------------------------------------------
    @property
    def candidates(self) -> list[str]:
        """Every policy this agent holds that can act, by name: ``seed<s>`` for a
        training run's seeds, ``config<c>-seed<s>`` for a sweep's every configuration ×
        seed (the failed ones, ``training["failed_runs"]``, are left out)."""
        failed = self._failed()
        if self._sweep is None:
            names = [candidate_id(seed) for seed in self.seeds]
        else:
            names = [
                candidate_id(seed, index)
                for index in range(len(self._sweep.points))
                for seed in self._sweep.seeds
            ]
        return [name for name in names if name not in failed]

    @property
    def selected_candidate(self) -> str | None:
        """The name of the policy :meth:`predict` and :meth:`export` use (None unfitted)."""
        if not self.fitted:
            return None
        return candidate_id(self.seeds[self.selected], self._configuration_index())

    def _configuration_index(self) -> int | None:
        """The sweep configuration whose seeds' policies the agent holds (None: not a
        sweep's agent)."""
        if self._sweep is None:
            return None
        selection = self.training.get("selection") or {}
        if selection.get("by") == "candidate":
            key = parse_candidate(str(selection["candidate"]))
            if key is not None:
                return key[0]
        return (self.training.get("sweep") or {}).get("selected")

    def _able_runs(self) -> list[int]:
        """The runs (of ``self.policies``) whose policy can act."""
        failed, configuration = self._failed(), self._configuration_index()
        return [
            run
            for run, seed in enumerate(self.seeds)
            if candidate_id(seed, configuration) not in failed
        ]

    def _failed(self) -> dict[str, str]:
        return {row["candidate"]: row["reason"] for row in self.training.get("failed_runs") or ()}

    def candidate(self, name: str) -> Agent:
        """A copy of this agent that predicts with and exports candidate ``name`` (see
        :attr:`candidates`; the names a run's own verdict gives, ``run 1 (seed 1)`` and
        ``configuration 3 (seed 0)``, are taken too): a sweep's other configuration
        comes with its own hyperparameters and seeds.

        Raises:
            AgentError: for a name this agent does not hold, or a candidate that failed
                (its policy cannot act).
        """
        self._require_fitted("candidate")
        key = parse_candidate(name)
        known = ", ".join(self.candidates)
        failed = self._failed()
        if key is None:
            raise AgentError(f"candidate: {name!r} is not a candidate's name; known: {known}")
        configuration, seed = key
        canonical = candidate_id(seed, configuration)
        if canonical in failed:
            raise AgentError(
                f"candidate {canonical}: failed ({failed[canonical]}); a policy that cannot "
                "act is never exported"
            )
        other = copy.copy(self)
        other.training = dict(self.training)
        other._decide = None
        sweep = self._sweep
        if sweep is None or configuration is None:
            if sweep is not None or configuration is not None or seed not in self.seeds:
                raise AgentError(f"candidate: no {canonical!r} in this agent; known: {known}")
            other.selected = self.seeds.index(seed)
        else:
            if not 0 <= configuration < len(sweep.points) or seed not in sweep.seeds:
                raise AgentError(f"candidate: no {canonical!r} in this agent; known: {known}")
            hyperparameters = with_values(sweep.hyperparameters, sweep.points[configuration])
            other._build(hyperparameters)
            other.hyperparameters = hyperparameters
            number = next(
                n for n, inside in enumerate(sweep.configurations) if configuration in inside
            )
            start = sweep.configurations[number].index(configuration) * len(sweep.seeds)
            policies = self._program(number)
            other.policies = jax.tree.map(
                lambda leaf: jnp.asarray(leaf[start : start + len(sweep.seeds)]), policies
            )
            other.seeds = list(sweep.seeds)
            other.selected = sweep.seeds.index(seed)
        other.training["selected_run"] = other.selected
        other.training["selection"] = {"by": "candidate", "candidate": canonical}
        return other

    def candidate_stacks(self) -> list[CandidateStack]:
        """Every candidate that can act, as stacks of one algorithm each (a training
        run's seeds; each program of a sweep): what a verdict over them evaluates."""
        self._require_fitted("candidate_stacks")
        failed = self._failed()
        sweep = self._sweep
        if sweep is None:
            stacks = [
                CandidateStack(
                    [candidate_id(seed) for seed in self.seeds],
                    self.policies,
                    self.policy_algorithm,
                    self.hyperparameters,
                )
            ]
        else:
            stacks = []
            for number, configurations in enumerate(sweep.configurations):
                hyperparameters, algorithm = self._configuration(configurations[0])
                names = [candidate_id(seed, c) for c in configurations for seed in sweep.seeds]
                stacks.append(
                    CandidateStack(names, self._program(number), algorithm, hyperparameters)
                )
        kept = []
        for stack in stacks:
            able = [row for row, name in enumerate(stack.names) if name not in failed]
            if not able:
                continue
            policies = stack.policies
            if len(able) != len(stack.names):
                rows = jnp.asarray(able)
                policies = jax.tree.map(lambda leaf, rows=rows: jnp.asarray(leaf)[rows], policies)
            kept.append(stack._replace(names=[stack.names[row] for row in able], policies=policies))
        return kept

    def _configuration(self, index: int) -> tuple[dict[str, Any], Any]:
        """``(hyperparameters, algorithm)`` of a sweep's configuration ``index``."""
        sweep = self._sweep
        assert sweep is not None
        hyperparameters = with_values(sweep.hyperparameters, sweep.points[index])
        try:
            algorithm, _ = build_algorithm(
                self.entry.name,
                self.task.observation_size,
                self.task.num_actions if self.entry.discrete else self.task.action_size,
                hyperparameters,
                contract=self.safety,
            )
        except (HyperparameterError, ValueError) as error:
            raise AgentError(f"configuration {index} of the sweep: {error}") from None
        return hyperparameters, algorithm

    def _program(self, number: int) -> Any:
        """The stacked policies of a sweep's program ``number`` (read from the saved
        agent the first time)."""
        sweep = self._sweep
        assert sweep is not None
        program = sweep.programs[number]
        if program is not None:
            return program.policies
        configurations = sweep.configurations[number]
        _, algorithm = self._configuration(configurations[0])
        runs = list(range(len(configurations) * len(sweep.seeds)))
        template = jax.eval_shape(lambda: init_train_states(algorithm, runs).agent.policy)
        path = sweep.files[number]
        try:
            policies = serialization.from_bytes(template, path.read_bytes())
        except FileNotFoundError:
            raise AgentError(f"{path}: missing") from None
        except (ValueError, KeyError, TypeError) as error:
            raise AgentError(f"{path}: does not match the saved sweep ({error})") from None
        sweep.programs[number] = SweepProgram(configurations, policies)
        return policies

    # ----- acting ----------------------------------------------------------------------
    def policy(self, run: int | None = None) -> Any:
        """The policy parameters of ``run`` (default: the selected, best run)."""
        self._require_fitted("policy")
        index = self.selected if run is None else run
        if not 0 <= index < len(self.seeds):
            raise AgentError(f"run: expected 0 <= run < {len(self.seeds)}, got {run}")
        return jax.tree.map(lambda leaf: leaf[index], self.policies)

    def decide(
        self,
        observation: Any,
        prev_action: Any = None,
        *,
        run: int | None = None,
        shield_actions: bool = True,
    ) -> tuple[np.ndarray, SafetyReport | None]:
        """The action(s), in plant units, for one observation ``[obs]`` or a batch
        ``[b, obs]`` and the shield's report (None with ``shield_actions=False``).
        ``prev_action`` is the action applied at the previous step (rate limits); None or
        NaN: unknown (the start of an episode), and rate limits are left out. Subnormal
        values are read as zero (see :mod:`~neorl_industrial.wrappers.agents.readings`).

        Raises:
            AgentError: for a shape that does not fit, a reading that is not a finite
                float32 number or an infinite previous action, naming the feature.
        """
        self._require_fitted("predict")
        task = self.task
        # Read as the server and the bridge read them (wrappers.agents.readings):
        # subnormals as zero, a reading that is not finite refused by name, a NaN previous
        # action unknown (the shield leaves its rate limit out).
        batch, prev, single = decision_inputs(
            observation,
            None if self.entry.discrete else prev_action,
            task.observation_names,
            ("action",) if self.entry.discrete else task.action_names,
            error=AgentError,
        )
        if self.entry.discrete:
            actions = np.asarray(self._act_batch(self.policy(run), batch))
            return (actions[0] if single else actions), None
        if not shield_actions:
            actions = np.asarray(self._act_batch(self.policy(run), batch))
            return (actions[0] if single else actions), None
        if self._decide is None:
            act, constraints = self.algorithm.act, self.constraints

            def decide(policy: Any, observations: jax.Array, previous: jax.Array) -> Any:
                proposed = jax.vmap(lambda o: act(policy, o, None, deterministic=True))(
                    observations
                )
                return shield(constraints, observations, proposed, previous)

            self._decide = jax.jit(decide)
        safe, report = jax.device_get(self._decide(self.policy(run), batch, prev))
        if single:
            return np.asarray(safe[0]), jax.tree.map(lambda leaf: leaf[0], report)
        return np.asarray(safe), report

    def _act_batch(self, policy: Any, batch: np.ndarray) -> jax.Array:
        act = self.algorithm.act
        return jax.jit(jax.vmap(lambda o: act(policy, o, None, deterministic=True)))(batch)

    def predict(
        self, observation: Any, prev_action: Any = None, *, run: int | None = None
    ) -> np.ndarray:
        """The shielded action(s) in plant units for one observation or a batch (see
        :meth:`decide`)."""
        return self.decide(observation, prev_action, run=run)[0]

    def evaluate(
        self,
        episodes: int = 100,
        *,
        horizon: int | None = None,
        shield_actions: bool = True,
        seed: int = 1,
    ) -> dict[str, Any]:
        """Every run's policy over ``episodes`` simulated episodes (all at once): the
        metrics per run and their mean and 95 % confidence interval over runs.

        Raises:
            AgentError: when the task has no simulator (use :meth:`evaluate_offline`).
        """
        self._require_fitted("evaluate")
        if not self.task.has_simulator:
            raise AgentError(
                f"evaluate: task {self.task.name!r} has no simulator; use "
                "evaluate_offline(dataset) for FQE estimates from logged data"
            )
        evaluator = self._evaluator(episodes, horizon, shield_actions, seed)
        runs = evaluator(self.policies, 0)
        return {"runs": runs, "summary": summarize_runs(runs), "selected_run": self.selected}

    def evaluate_offline(
        self,
        dataset: Dataset,
        ope: OPESettings | None = None,
        *,
        plant_model: Any = None,
        verdict: VerdictSettings | None = None,
        dataset_name: str = "dataset",
    ) -> dict[str, Any]:
        """FQE estimates of every run's return and costs from logged ``dataset``: per
        run, and their mean and 95 % interval over runs (``estimate: "fqe"``); with a
        fitted ``plant_model`` of the same data, also the verdict (``"verdict"``, see
        :meth:`judge`).

        Episodes the agent was trained on (recognised by their content) are left out, and
        the result says how many (``"left_out_training_episodes"``). A dataset that holds
        nothing else is estimated on them with ``"on_training_episodes": True`` (the
        estimates then measure memory, not the plant: the command line says so loudly),
        and refused for a verdict.

        Raises:
            AgentError: for data that does not fit, discrete actions, a verdict asked on
                training episodes only, or a plant model of another task or dataset.
        """
        self._require_fitted("evaluate_offline")
        if self.entry.discrete:
            raise AgentError("evaluate_offline: FQE evaluates continuous-action policies")
        self.check_dataset(dataset)
        ope = ope or OPESettings()
        evaluation, left_out = self._unseen_episodes(dataset)
        on_training = left_out == dataset.n_episodes
        if on_training and plant_model is not None:
            raise AgentError(
                f"{dataset_name}: all {left_out} of its episodes trained this agent; a "
                "verdict on them would measure memory, not the plant. Give episodes it was "
                "not trained on (the run's held-out episodes are those of its training log "
                "it did not train on, or log more)"
            )
        if plant_model is not None:
            self._check_plant_model(plant_model, dataset, evaluation, None, name=dataset_name)
        evaluator = self._ope_evaluator(self.training_data(evaluation), ope, self.hyperparameters)
        runs = evaluator(self.policies, 0)
        result = {
            "runs": runs,
            "summary": summarize_runs(runs),
            "selected_run": self.selected,
            "estimate": "fqe",
            "evaluated_episodes": evaluation.n_episodes,
            "left_out_training_episodes": 0 if on_training else left_out,
            "on_training_episodes": on_training,
        }
        if plant_model is not None:
            result["verdict"] = self._judge_runs(
                evaluation, plant_model, ope, verdict, scored=evaluator
            ).to_dict()
        return result

    def judge(
        self,
        heldout: Dataset,
        plant_model: Any,
        *,
        ope: OPESettings | None = None,
        settings: VerdictSettings | None = None,
    ) -> Verdict:
        """The verdict on every run's policy against the logged operation of ``heldout``
        (episodes neither the agent nor ``plant_model`` was trained on; actions in plant
        units): model-based, FQE and combined estimates with intervals, and
        "recommend" only when the evidence is there, else "keep the current operation"
        (:mod:`~neorl_industrial.wrappers.training.verdict`).

        Raises:
            AgentError: before fitting, for a plant model of another task, or bad input.
        """
        self._require_fitted("judge")
        self._check_plant_model(plant_model, None, heldout, None)
        return self._judge_runs(heldout, plant_model, ope or OPESettings(), settings)

    def _run_name(self, run: int) -> str:
        """Run ``run`` as the verdict names it."""
        return f"run {run} (seed {self.seeds[run]})"

    def _judge_runs(
        self,
        heldout: Dataset,
        plant_model: Any,
        ope: OPESettings,
        settings: VerdictSettings | None,
        scored: OffPolicyEvaluator | None = None,
        runs: Sequence[int] | None = None,
    ) -> Verdict:
        """The verdict on every run's policy that can act (``runs``: those only; see
        :meth:`_verdict` for ``scored``, reused only when every run is judged)."""
        runs = self._able_runs() if runs is None else list(runs)
        policies = self.policies
        if len(runs) != len(self.seeds):
            rows = jnp.asarray(runs)
            policies = jax.tree.map(lambda leaf: leaf[rows], policies)
            scored = None
        return self._verdict(
            heldout,
            plant_model,
            policies,
            [self._run_name(run) for run in runs],
            ope,
            settings,
            self.hyperparameters,
            scored=scored,
        )

    def _health(self, policies: Any, data: Dataset, source: str) -> list[PolicyHealth]:
        """:func:`~neorl_industrial.wrappers.training.selection.policy_health` of
        ``policies`` on ``data``'s observations (``source`` says which they are; its
        actions in plant units are the logged ones)."""
        discrete = self.entry.discrete
        observations = health_observations(data.transition_observations())
        actions = health_observations(jnp.asarray(data.actions).reshape(data.n_transitions, -1))
        return policy_health(
            self.policy_algorithm.act,
            policies,
            observations,
            logged_actions=None if discrete else actions,
            source=source,
            scaler=None if discrete else self.scaler,
            constraints=None if discrete else self.constraints,
        )

    def _verdict(
        self,
        heldout: Dataset,
        plant_model: Any,
        policies: Any,
        names: Sequence[str],
        ope: OPESettings,
        settings: VerdictSettings | None,
        hyperparameters: dict[str, Any],
        scored: OffPolicyEvaluator | None = None,
        algorithm: Any = None,
    ) -> Verdict:
        """The verdict on ``policies`` (of ``algorithm``, default: the agent's);
        ``scored``: an evaluator that has just scored them, whose FQEs are reused when
        they are the ones the verdict would fit."""
        algorithm = self.policy_algorithm if algorithm is None else algorithm
        evaluator = self._ope_evaluator(
            self.training_data(heldout), ope, hyperparameters, algorithm
        )
        settings = settings or VerdictSettings(
            discount=ope.discount,
            fqe_updates=ope.updates,
            fqe_seeds=tuple(ope.seeds),
            fqe_hidden=tuple(ope.hidden),
        )
        fitted = None if scored is None else scored.fitted
        reuse = (
            fitted is not None
            and settings.fqe
            and fitted.fits(
                policies,
                evaluator.dataset,
                updates=settings.fqe_updates,
                seeds=settings.fqe_seeds,
                hidden=settings.fqe_hidden,
                discount=settings.discount,
                batch_size=FQE_BATCH_SIZE,
            )
        )
        try:
            return model_verdict(
                act=algorithm.act,
                policy_params=policies,
                names=names,
                heldout=evaluator.dataset,
                plant_model=plant_model,
                scaler=self.scaler,
                constraints=self.constraints,
                cost_limits=evaluator.cost_limits,
                cost_names=self.cost_names,
                episode_length=evaluator.episode_length,
                fqe_act=evaluator.actions,
                settings=settings,
                fqe_values=fitted.values if reuse else None,
            )
        except VerdictError as error:
            raise AgentError(str(error)) from None

    def _unseen_episodes(self, dataset: Dataset) -> tuple[Dataset, int]:
        """``dataset`` without the episodes the agent was trained on (recognised by their
        content), and how many those were; all of ``dataset`` when every episode trained
        it (the count then equals its episodes)."""
        trained = set((self.training.get("dataset") or {}).get("trained_episodes") or ())
        if not trained:
            return dataset, 0
        digests = episode_digests(dataset)
        unseen = np.asarray([i for i, d in enumerate(digests) if d not in trained], np.int64)
        left_out = len(digests) - len(unseen)
        if left_out == 0 or not len(unseen):
            return dataset, left_out
        return dataset.select_episodes(unseen), left_out

    def _check_plant_model(
        self,
        plant_model: Any,
        dataset: Dataset | None,
        heldout: Dataset | None,
        card: Any,
        *,
        name: str | None = None,
        verdict: bool = True,
    ) -> bool:
        """Refuses a plant model of another task or dataset (by name and fingerprint),
        not fitted, or fitted on episodes the evaluation holds out. ``verdict`` false (a
        model-based agent's own model): a fit without held-out episodes is fine, and a
        verdict is made only when the model never saw the held-out ones.

        Returns:
            Whether the model may judge policies on ``heldout``."""
        from neorl_industrial.wrappers.models import PlantModelError

        name = name or ("dataset" if card is None else f"dataset {card.name!r}")
        if self.entry.discrete:
            raise AgentError(f"plant_model: {self.entry.name} acts on discrete actions")
        if not getattr(plant_model, "fitted", False):
            raise AgentError("plant_model: not fitted; fit one first (neorl-industrial model fit)")
        try:
            plant_model.check_task(self.task, name=name)
            if dataset is not None:
                plant_model.check_same_data(dataset, name=name, task=self.task)
        except PlantModelError as error:
            raise AgentError(f"plant_model: {error}") from None
        if dataset is None:
            return True
        fitted_on = plant_model.card["dataset"]["train_episodes"]
        if heldout is None and not verdict:
            return False
        if heldout is None:
            raise AgentError(
                "plant_model: a verdict is made on held-out episodes, and this fit holds none "
                "out (a task with a simulator: ope=OPESettings(always=True); or evaluate=True)"
            )
        digests = episode_digests(dataset)
        model_trained = {digests[i] for i in fitted_on}
        overlap = sum(d in model_trained for d in episode_digests(heldout))
        if overlap and not verdict:
            return False
        if overlap:
            raise AgentError(
                f"plant_model: fitted on {overlap} of the {heldout.n_episodes} episodes the "
                "evaluation holds out, so it would judge policies on what it memorised; fit "
                "it with the same held-out share and split seed as the evaluation (model fit "
                "--holdout/--split-seed, ope.holdout/ope.split_seed)"
            )
        return True

    # ----- files -------------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        """What :meth:`save` writes next to the parameters."""
        return {
            "format": FORMAT,
            "neorl_industrial": __version__,
            "jax": jax.__version__,
            "algorithm": self.entry.name,
            "hyperparameters": to_json_data(self.hyperparameters),
            "task": self.task.to_dict(limits=False),
            "env": {"id": self.task.env_id, "params": dict(self.task.env_params)},
            "observation_size": self.task.observation_size,
            "action_size": self.task.action_size,
            "observation_names": list(self.task.observation_names),
            "action_names": list(self.task.action_names),
            "constraints": constraint_spec_yaml(self.constraint_spec),
            # The safety contract as resolved (``load`` takes it back as it is).
            **dict(zip(CONTRACT_FIELDS, contract_record(self.safety), strict=True)),
            "seeds": self.seeds,
            "selected_run": self.selected,
            "training": to_json_data(self.training),
            "sweep_candidates": None if self._sweep is None else self._sweep.record(),
        }

    def save(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Writes the agent to the directory ``path`` atomically: ``agent.json`` (task,
        config, constraint spec, cost limits, versions, training summary) and
        ``policies.msgpack`` (every run's policy, normalizer included).

        Raises:
            AgentError: before fitting, or when ``path`` exists and ``overwrite`` is False
                (nothing is written then).
        """
        self._require_fitted("save")
        manifest = json.dumps(self.manifest(), indent=2, allow_nan=False)
        policies = serialization.to_bytes(jax.device_get(self.policies))
        files = {MANIFEST: manifest.encode(), POLICIES: policies}
        if self._sweep is not None:
            for number in range(len(self._sweep.configurations)):
                stack = jax.device_get(self._program(number))
                files[CANDIDATE_FILE.format(number)] = serialization.to_bytes(stack)
        # Staging directories of saves killed mid-write (an hour old or more) go first.
        remove_stale_staging(Path(path).absolute().parent)
        try:
            return write_directory_atomic(
                path,
                files,
                marker=MANIFEST,
                what="a saved agent",
                overwrite=overwrite,
            )
        except FileExistsError as error:
            raise AgentError(str(error)) from None

    @classmethod
    def load(cls, path: str | Path) -> Agent:
        """The agent saved at ``path``: predicts exactly as it did when saved.

        Raises:
            AgentError: naming the file that is missing, unreadable or of another format.
        """
        path = Path(path)
        manifest_path = path / MANIFEST
        try:
            manifest = json.loads(manifest_path.read_text())
        except FileNotFoundError:
            raise AgentError(f"{manifest_path}: missing; {path} is not a saved agent") from None
        except json.JSONDecodeError as error:
            raise AgentError(f"{manifest_path}: not valid JSON ({error})") from None
        if manifest.get("format") != FORMAT:
            raise AgentError(
                f"{manifest_path}: format {manifest.get('format')!r}; this version reads {FORMAT!r}"
            )
        # Agents saved before the contract was saved on its own kept the limits among the
        # hyperparameters too; the contract below is their one holder.
        hyperparameters = {
            key: value for key, value in manifest["hyperparameters"].items() if key != "cost_limits"
        }
        entry = _entry(manifest["algorithm"])
        try:
            if manifest.get("task") is not None:
                task = Task.from_dict(manifest["task"], f"{manifest_path}: task")
            else:
                task = Task.from_env(manifest["env"]["id"], manifest["env"]["params"])
            spec = constraint_spec_from_text(manifest["constraints"], str(manifest_path))
            contract = saved_contract(manifest, task, spec)
        except (TaskError, ConstraintSpecError) as error:
            raise AgentError(str(error)) from None
        except ValueError as error:
            raise AgentError(f"{manifest_path}: {error}") from None
        agent = cls.__new__(cls)
        agent._setup(entry, task, spec, contract, hyperparameters)
        agent.seeds = [int(seed) for seed in manifest["seeds"]]
        # The policies' structure, shapes and dtypes only: traced, neither compiled nor run.
        template = jax.eval_shape(
            lambda: init_train_states(agent.policy_algorithm, agent.seeds).agent.policy
        )
        try:
            policies = serialization.from_bytes(template, (path / POLICIES).read_bytes())
        except FileNotFoundError:
            raise AgentError(f"{path / POLICIES}: missing") from None
        except (ValueError, KeyError, TypeError) as error:
            raise AgentError(
                f"{path / POLICIES}: does not match the saved configuration ({error})"
            ) from None
        agent.policies = jax.tree.map(jnp.asarray, policies)
        agent.selected = int(manifest["selected_run"])
        agent.training = manifest.get("training", {})
        saved = manifest.get("sweep_candidates")
        if saved:
            programs = saved["programs"]
            agent._sweep = SweepCandidates(
                fields=list(saved["fields"]),
                points=[dict(point) for point in saved["points"]],
                seeds=[int(seed) for seed in saved["seeds"]],
                hyperparameters=dict(saved["hyperparameters"]),
                programs=[None] * len(programs),
                files=[path / program["file"] for program in programs],
                configurations=[tuple(program["configurations"]) for program in programs],
            )
        return agent

    def export(
        self,
        path: str | Path,
        *,
        overwrite: bool = False,
        signing_key: Any = None,
        format: str = "jax",
    ) -> Path:
        """Writes a self-contained policy artifact (the selected run's policy, its
        observation normalizer, its action scaling to plant units and the shield,
        compiled and serialized) that the policy server loads without any training code;
        see :mod:`neorl_industrial.wrappers.agents.export`. ``signing_key`` (an Ed25519
        private key or its PEM file) signs it; see :mod:`.signing`. ``format="onnx"``
        adds ``policy.onnx``, the same function as one ONNX graph for edge runtimes (the
        ``onnx`` extra; see :mod:`.onnx_export`)."""
        self._require_fitted("export")
        if self.entry.discrete:
            raise AgentError(
                "export: exported artifacts serve continuous actions through the shield; "
                f"{self.entry.name} acts on discrete ones"
            )
        from neorl_industrial.wrappers.agents.export import export_policy

        act = self.algorithm.act
        task = self.task
        return export_policy(
            path,
            act=lambda policy, observation: act(policy, observation, None, deterministic=True),
            policy_params=self.policy(),
            observation_size=task.observation_size,
            action_size=task.action_size,
            constraints_spec=self.constraint_spec,
            observation_names=list(task.observation_names),
            action_names=list(task.action_names),
            action_low=np.asarray(task.action_low, np.float32),
            action_high=np.asarray(task.action_high, np.float32),
            observation_bounds=(task.observation_low, task.observation_high),
            observation_units=task.observation_units,
            action_units=task.action_units,
            # The data's range (a plant log's observed columns): flagged, not enforced.
            data_bounds=None if task.data_low is None else (task.data_low, task.data_high),
            metadata={
                "algorithm": self.entry.name,
                "env": task.env_id,
                "task": task.to_dict(limits=False),
                "seed": self.seeds[self.selected],
                "candidate": self.selected_candidate,
                **dict(zip(CONTRACT_FIELDS[:2], contract_record(self.safety)[:2], strict=True)),
                "training": to_json_data(self.training),
            },
            overwrite=overwrite,
            signing_key=signing_key,
            format=format,
        )


def _failures(health: Sequence[PolicyHealth], names: Sequence[str]) -> dict[int, str]:
    """``{run: why}`` of the runs whose policy cannot act.

    Raises:
        AgentError: when no run's policy can act, naming the first and how many.
    """
    failed = {run: row.failure for run, row in enumerate(health) if row.failure is not None}
    if failed and len(failed) == len(health):
        first = min(failed)
        others = len(failed) - 1
        raise AgentError(
            f"training: no policy can act, none is kept: {names[first]}: {failed[first]}"
            + (f" (and the other {others} runs likewise)" if others else "")
        )
    return {run: str(why) for run, why in failed.items()}


def _failed_record(failed: Mapping[int, str], seeds: Sequence[int]) -> list[dict[str, Any]]:
    return [
        {"candidate": candidate_id(seeds[run]), "reason": why}
        for run, why in sorted(failed.items())
    ]


def _fingerprint(dataset: Dataset) -> str:
    """The log's digest (a plant model records the same of the data it was fitted on)."""
    from neorl_industrial.wrappers.models.plant_model import dataset_fingerprint

    return dataset_fingerprint(dataset)


def _entry(algorithm: str) -> Any:
    try:
        return algorithm_entry(algorithm)
    except HyperparameterError as error:
        raise AgentError(str(error)) from None


def _check_kind(entry: Any, task: Task) -> None:
    if entry.discrete != task.discrete:
        kind = "discrete" if entry.discrete else "continuous"
        raise AgentError(
            f"algorithm: {entry.name} needs {kind} actions; task {task.name} has "
            f"{'discrete' if task.discrete else 'continuous'} ones"
        )
