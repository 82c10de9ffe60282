"""``Agent``: an offline agent for people, over the run functions and the pure core.

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
and back inside the policy. ``fit`` and ``sweep`` build a
:class:`~neorl_industrial.wrappers.training.plan.RunPlan` and call the run functions
(:func:`~neorl_industrial.wrappers.training.run.train`,
:func:`~neorl_industrial.wrappers.training.run.sweep`): one run per seed at once,
evaluated in the simulator, or off policy (FQE on held-out episodes) when the task has
none, the best kept by the safety-aware criterion; the run's
:class:`~neorl_industrial.wrappers.training.run.RunResult` is ``agent.result``, and
``predict`` uses the selected run's policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from neorl_industrial.core.environments import Task
from neorl_industrial.core.safety import ConstraintSpec, SafetyContract
from neorl_industrial.core.safety.shield import SafetyReport
from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.wrappers.agents import acting, offline, saved_agent
from neorl_industrial.wrappers.agents.agent_candidates import CandidateSelection
from neorl_industrial.wrappers.agents.agent_context import (
    context_of_arguments,
    context_of_config,
    run_config_of,
    run_plan,
)
from neorl_industrial.wrappers.agents.saved_agent import FORMAT, MANIFEST, POLICIES
from neorl_industrial.wrappers.constraint_files import (
    load_constraint_spec,
)
from neorl_industrial.wrappers.training import Callback
from neorl_industrial.wrappers.training.config import OPESettings, RunConfig
from neorl_industrial.wrappers.training.context import PolicyContext, RunError
from neorl_industrial.wrappers.training.plan import (
    DEFAULT_ENV,
    PlanError,
    RunPlan,
    resolve_run,
)
from neorl_industrial.wrappers.training.results import CandidateStack, RunResult, SweepCandidates
from neorl_industrial.wrappers.training.run import sweep, train
from neorl_industrial.wrappers.training.verdict import Verdict, VerdictSettings

__all__ = [
    "DEFAULT_ENV",
    "FORMAT",
    "MANIFEST",
    "POLICIES",
    "Agent",
    "AgentError",
    "CandidateStack",
    "OPESettings",
    "load_constraint_spec",
]

#: An agent that cannot do what was asked (names the argument, file or field): the run
#: functions' :class:`~neorl_industrial.wrappers.training.context.RunError`.
AgentError = RunError


class Agent(CandidateSelection):
    """An offline agent: fit, predict, evaluate, save, load, export.

    Args:
        algorithm: a registered algorithm (``bc``, ``bc-safe``, ``td3bc``, ``td3bc-lag``,
            ``iql``, ``iql-lag``, ``cql``, ``mopo``, ``mopo-bc``, ``mopo-lag``,
            ``discrete-bc``, ``discrete-cql``).
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
        context = context_of_arguments(algorithm, env, task, env_params, constraints, cost_limits)
        self._setup(context, hyperparameters)
        # Checked (and built, to act) at once: the one call into the core's registry.
        self._build(self.hyperparameters)

    def _setup(self, context: PolicyContext, hyperparameters: Mapping[str, Any]) -> None:
        """The agent of a resolved contract: every constructor ends here. The algorithm
        is built when first needed (a run builds its own, once)."""
        self.context = context
        self.entry = context.entry
        self.task = context.task
        self.safety: SafetyContract = context.safety
        self.constraint_spec: ConstraintSpec = context.constraint_spec
        self.scaler = context.scaler
        # The cost limits are the contract's alone: the algorithm's config takes them from
        # it where it is built, never from the hyperparameters.
        self.hyperparameters = context.hyperparameters(hyperparameters)
        self._built: tuple[Any, Any] | None = None  # (acting in [-1, 1], its config)
        self.policies: Any = None  # stacked PolicyParams, one per run
        self.seeds: list[int] = []
        self.selected = 0
        #: What the last ``fit`` or ``sweep`` produced (a loaded agent's: as recorded).
        self.result: RunResult | None = None
        #: The plan ``fit()`` and ``sweep()`` train without data (``from_plan``).
        self.plan: RunPlan | None = None
        #: The configuration a dataset is resolved with (``from_config`` without data).
        self.run_config: RunConfig | None = None
        self._decide: Any = None
        #: A sweep's every configuration × seed policy (None for a training run's agent).
        self.sweep_candidates: SweepCandidates | None = None

    @classmethod
    def from_plan(cls, plan: RunPlan) -> Agent:
        """The agent of a resolved :class:`~neorl_industrial.wrappers.training.plan.RunPlan`:
        its algorithm, task and safety contract (taken as resolved, not resolved again);
        ``fit()`` and ``sweep()`` without data train the plan.

        Raises:
            AgentError: for data that does not fit the task.
        """
        agent = cls.__new__(cls)
        agent._setup(PolicyContext.of_plan(plan), plan.algorithm.hyperparameters)
        agent.check_dataset(plan.dataset, plan.card)
        agent.plan = plan
        return agent

    @classmethod
    def from_result(cls, result: RunResult) -> Agent:
        """The agent of a run's ``result`` (``train(plan)``, ``sweep(plan)``): its
        algorithm, task and contract, fitted with the result's policies.

        Raises:
            AgentError: for a result read back from a record (it holds no policies).
        """
        if result.context is None or result.policies is None:
            raise AgentError("result: a recorded result holds no policies; Agent.load the run")
        agent = cls.__new__(cls)
        agent._setup(result.context, result.hyperparameters or {})
        agent.adopt(result)
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
        config = run_config_of(config)
        if dataset is not None:
            try:
                return cls.from_plan(resolve_run(config, dataset, card, facts))
            except PlanError as error:
                raise AgentError(str(error)) from None
        if card is not None:
            raise AgentError("card: give the dataset with its card (dataset=...)")
        agent = cls.__new__(cls)
        agent._setup(context_of_config(config), config.algorithm.hyperparameters)
        agent._build(agent.hyperparameters)
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
        return self.context.cost_limits

    @property
    def cost_names(self) -> tuple[str, ...]:
        return self.safety.cost_names

    @property
    def simulator(self) -> tuple[Any, Any]:
        """``(env, params)`` of the task's simulator.

        Raises:
            AgentError: when the task has none.
        """
        return self.context.simulator

    @property
    def fitted(self) -> bool:
        return self.policies is not None

    @property
    def policy_algorithm(self) -> Any:
        """The algorithm, acting in the policy's [-1, 1] (built when first needed)."""
        return self._algorithm_and_config()[0]

    @property
    def config(self) -> Any:
        """The algorithm's config."""
        return self._algorithm_and_config()[1]

    def _algorithm_and_config(self) -> tuple[Any, Any]:
        if self._built is None:
            self._build(self.hyperparameters)
        assert self._built is not None
        return self._built

    @property
    def algorithm(self) -> Any:
        """The algorithm, acting in plant units."""
        return self.context.in_plant_units(self.policy_algorithm)

    def _build(self, hyperparameters: Mapping[str, Any], what: str = "") -> None:
        """The algorithm of ``hyperparameters`` (acting, as a loaded agent does; a
        model-based one cannot train without its plant model)."""
        self._built = self.context.build(hyperparameters, what=what)
        self._decide = None

    # ----- training -------------------------------------------------------------------
    def check_dataset(self, dataset: Dataset, card: Any = None) -> None:
        """Raises :class:`AgentError` when ``dataset`` (and its card's names) does not fit
        the agent's task."""
        self.context.check_dataset(dataset, card)

    def training_data(self, dataset: Dataset) -> Dataset:
        """``dataset`` as the contract sees it: costs relabelled from the spec's
        definitions when the spec defines other channels than the data has."""
        return self.context.training_data(dataset)

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
    ) -> RunResult:
        """Trains one run per seed on the data (all at once) and keeps each run's best
        policy: :func:`~neorl_industrial.wrappers.training.run.train` of the plan; the
        agent then holds its result (``agent.result``) and predicts with its selected run.

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
        recorded in ``result.reward_scale`` and the exported policy's metadata.
        ``progress``: show the rich progress bar the command line shows (and say whether
        the fit is tracked in MLflow: it is when ``callbacks`` holds an ``MlflowTracker``).
        ``mesh``: train data-parallel over a ``"data"`` mesh (``data_mesh()``), one shard
        of whole episodes per device and gradients averaged across them (see
        :class:`~neorl_industrial.wrappers.training.Trainer`).
        ``plant_model``: a fitted ``PlantModel`` of this dataset and task; with off-policy
        evaluation, every run's policy is then judged against the logged operation on the
        held-out episodes (``result.verdict``, see :meth:`judge`; ``verdict`` its
        settings).

        Raises:
            AgentError: for data that does not fit the agent, or bad settings; a plant
                model of another task or dataset, or fitted on held-out episodes.
            CheckpointMismatchError: when resuming from another run's checkpoint.
        """
        plan = run_plan(self, data, settings, "fit")
        result = train(
            plan,
            callbacks=callbacks,
            resume=resume,
            progress=progress,
            mesh=mesh,
            plant_model=plant_model,
            verdict=verdict,
        )
        self.adopt(result)
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
        """Trains every configuration of ``grid`` × ``seeds`` in one program and keeps the
        best configuration: :func:`~neorl_industrial.wrappers.training.run.sweep` of the
        plan (which says how the runs are evaluated and chosen).

        ``data`` and ``settings`` as for :meth:`fit` (the settings ``updates``, ``seeds``,
        ``batch_size``, ``chunk``, ``eval_episodes``, ``eval_horizon``, ``eval_shield``,
        ``eval_seed``, ``normalize_observations``, ``reward_scaling``, ``ope``, ``card``);
        a plan's seeds are its grid's ``training.seeds``, else its training's.
        ``grid`` (None: the plan's ``sweep.grid``) maps hyperparameters of the algorithm
        (dotted for nested ones, e.g. ``critic.cvar_level``) to their values; only numeric
        ones that set no shape can be swept in one program. ``mesh`` (``runs_mesh()``)
        lays the runs over its devices, across processes after ``initialize_distributed``.
        The agent ends fitted with the chosen configuration's hyperparameters and its
        seeds' policies (its best seed selected), as after :meth:`fit`;
        ``result.sweep`` holds the table this returns:
        ``{"fields", "configurations": [{"values", "runs", "summary", "within_limits"}],
        "selected", "reason"}``. With ``plant_model`` and off-policy evaluation, every
        configuration's runs are judged against the logged operation on the held-out
        episodes, and the table's ``verdict`` says which (if any) to recommend.

        Raises:
            AgentError: for data that does not fit the agent, a bad grid (unknown or
                untraceable field, empty, a value the algorithm refuses) or bad settings.
        """
        if self.entry.model_based:
            raise AgentError(
                f"algorithm {self.entry.name!r} trains on a plant model and is not swept in "
                "one program; fit each configuration with plant_model= instead"
            )
        plan = run_plan(self, data, settings, "sweep")
        result = sweep(plan, grid, mesh=mesh, plant_model=plant_model, verdict=verdict)
        self.adopt(result)
        assert result.sweep is not None
        return result.sweep

    def adopt(self, result: RunResult) -> None:
        """Holds ``result``'s policies, algorithm and record (what ``fit`` and ``sweep``
        end with)."""
        self.result = result
        self.sweep_candidates = result.candidates
        self.policies = result.policies
        self.seeds = list(result.seeds)
        self.selected = result.selected_run
        # The observation statistics are part of the trained agent's configuration.
        if result.hyperparameters is not None:
            self.hyperparameters = dict(result.hyperparameters)
        self._built = (result.algorithm, result.config) if result.algorithm is not None else None
        self._decide = None

    def _require_fitted(self, what: str) -> None:
        if not self.fitted:
            raise AgentError(f"{what}: the agent has no policy yet; fit or load it first")

    @property
    def record(self) -> dict[str, Any]:
        """What the agent's result records (``{}`` before fitting): the saved agent's and
        the exported policy's ``training`` entry."""
        return {} if self.result is None else self.result.record()

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
        return acting.decide(self, observation, prev_action, run, shield_actions)

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
        return acting.evaluate_in_simulator(self, episodes, horizon, shield_actions, seed)

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
        return offline.evaluate_offline(self, dataset, ope, plant_model, verdict, dataset_name)

    def judge(
        self,
        heldout: Dataset,
        plant_model: Any,
        *,
        ope: OPESettings | None = None,
        settings: VerdictSettings | None = None,
        selection: Dataset | None = None,
    ) -> Verdict:
        """The verdict on every run's policy against the logged operation of ``heldout``
        (episodes neither the agent nor ``plant_model`` was trained on; actions in plant
        units): model-based, FQE and combined estimates with intervals, and
        "recommend" only when the evidence is there, else "keep the current operation"
        (:mod:`~neorl_industrial.wrappers.training.verdict`). ``selection``: the episodes
        the agent was trained on; one run is then selected on them before the test and
        only it can be recommended
        (:mod:`~neorl_industrial.wrappers.training.verdict_selection`).

        Raises:
            AgentError: before fitting, for a plant model of another task, or bad input.
        """
        self._require_fitted("judge")
        self.context.check_plant_model(plant_model, None, heldout, None)
        return offline.judge_runs(
            self, heldout, plant_model, ope or OPESettings(), settings, selection=selection
        )

    # ----- files -------------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        """What :meth:`save` writes next to the parameters."""
        return saved_agent.manifest(self)

    def save(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Writes the agent to the directory ``path`` atomically: ``agent.json`` (task,
        config, constraint spec, cost limits, versions, training summary) and
        ``policies.msgpack`` (every run's policy, normalizer included).

        Raises:
            AgentError: before fitting, or when ``path`` exists and ``overwrite`` is False
                (nothing is written then).
        """
        self._require_fitted("save")
        return saved_agent.save(self, path, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | Path) -> Agent:
        """The agent saved at ``path``: predicts exactly as it did when saved.

        Raises:
            AgentError: naming the file that is missing, unreadable or of another format.
        """
        manifest, context, hyperparameters = saved_agent.read_manifest(Path(path))
        agent = cls.__new__(cls)
        agent._setup(context, hyperparameters)
        saved_agent.restore(agent, Path(path), manifest)
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
        return saved_agent.export(
            self, path, overwrite=overwrite, signing_key=signing_key, format=format
        )
