"""What acting, evaluating and judging the policies of one algorithm on one task under
one safety contract needs: the algorithm's registry entry, the task, the constraint spec,
the resolved contract and the action scaling between plant units and the policy's [-1, 1].

A :class:`PolicyContext` is made once per run (``train``, ``sweep``) and once per agent,
from the contract as resolved (the plan's, or a saved agent's): it never resolves limits
again. It builds the algorithm (the one call into the core's registry), checks data
against the task, relabels costs as the contract defines them, and makes the evaluators
(the simulator's, FQE on held-out episodes), the health check and the verdict of a stack of
policies.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from neorl_industrial.core.agents.registry import (
    HyperparameterError,
    algorithm_entry,
    build_algorithm,
)
from neorl_industrial.core.environments import Task, TaskError
from neorl_industrial.core.safety import ConstraintSpec, SafetyContract
from neorl_industrial.functional.state_management import (
    ActionScaler,
    Dataset,
    RewardScaling,
    relabel_costs,
    with_action_scaling,
)
from neorl_industrial.wrappers.training.config import AlgorithmSection, OPESettings, RunConfig
from neorl_industrial.wrappers.training.evaluation import Evaluator
from neorl_industrial.wrappers.training.ope import OffPolicyEvaluator
from neorl_industrial.wrappers.training.plan import (
    PlanError,
    RunPlan,
    contract_record,
    plan_settings,
    resolve_run,
)
from neorl_industrial.wrappers.training.selection import (
    PolicyHealth,
    health_observations,
    policy_health,
)
from neorl_industrial.wrappers.training.verdict import (
    FQE_BATCH_SIZE,
    PlantRules,
    Verdict,
    VerdictCandidates,
    VerdictError,
    VerdictSettings,
    episode_digests,
    model_verdict,
)

__all__ = ["PolicyContext", "RunError", "algorithm_of"]


class RunError(PlanError):
    """A run (or an agent) that cannot do what was asked: names the argument, file or
    field. The Agent raises it as ``AgentError``."""


def algorithm_of(name: str) -> Any:
    """The registry entry of algorithm ``name``.

    Raises:
        RunError: for an algorithm that is not registered, listing those that are.
    """
    try:
        return algorithm_entry(name)
    except HyperparameterError as error:
        raise RunError(str(error)) from None


class CandidateStack(NamedTuple):
    """Candidates of one algorithm, their policies stacked on a leading axis."""

    names: list[str]
    policies: Any
    algorithm: Any  # acts in the policy's [-1, 1]
    hyperparameters: dict[str, Any]

    def able(self, failed: Mapping[str, str]) -> CandidateStack | None:
        """This stack without the ``failed`` candidates (None when none is left)."""
        able = [row for row, name in enumerate(self.names) if name not in failed]
        if not able:
            return None
        if len(able) == len(self.names):
            return self
        rows = jnp.asarray(able)
        policies = jax.tree.map(lambda leaf: jnp.asarray(leaf)[rows], self.policies)
        return self._replace(names=[self.names[row] for row in able], policies=policies)


@dataclasses.dataclass(frozen=True, eq=False)
class PolicyContext:
    """An algorithm on a task under a resolved safety contract.

    Attributes:
        entry: the algorithm's registry entry.
        task: the process.
        constraint_spec: the hard constraints and cost definitions.
        safety: the resolved contract (the one holder of the cost limits).
        scaler: plant units to the policy's [-1, 1] (None: the identity, or discrete).
    """

    entry: Any
    task: Task
    constraint_spec: ConstraintSpec
    safety: SafetyContract
    scaler: ActionScaler | None

    @classmethod
    def create(
        cls, entry: Any, task: Task, spec: ConstraintSpec, safety: SafetyContract
    ) -> PolicyContext:
        """The context of a resolved contract.

        Raises:
            RunError: for an algorithm of the other kind of actions than the task's, or
                action bounds that cannot be scaled.
        """
        cls.check_kind(entry, task)
        scaler = None
        if not task.discrete and not ActionScaler.is_identity(task.action_low, task.action_high):
            try:
                scaler = ActionScaler.create(task.action_low, task.action_high, task.action_names)
            except ValueError as error:
                raise RunError(str(error)) from None
        return cls(entry, task, spec, safety, scaler)

    @staticmethod
    def check_kind(entry: Any, task: Task) -> None:
        """Raises :class:`RunError` for an algorithm of the other kind of actions than
        the task's (discrete or continuous)."""
        if entry.discrete != task.discrete:
            kind = "discrete" if entry.discrete else "continuous"
            raise RunError(
                f"algorithm: {entry.name} needs {kind} actions; task {task.name} has "
                f"{'discrete' if task.discrete else 'continuous'} ones"
            )

    @classmethod
    def of_plan(cls, plan: RunPlan) -> PolicyContext:
        """The context of ``plan``'s algorithm, task and contract (taken as resolved)."""
        return cls.create(
            algorithm_of(plan.algorithm.name), plan.task, plan.constraint_spec, plan.safety
        )

    def check_plan(self, plan: RunPlan) -> None:
        """Raises :class:`RunError` when ``plan`` is not of this algorithm, task and
        contract (an agent asked to train another agent's plan)."""
        ours = (self.entry.name, self.task, *contract_record(self.safety)[:2])
        name = algorithm_of(plan.algorithm.name).name
        theirs = (name, plan.task, *contract_record(plan.safety)[:2])
        if ours != theirs:
            raise RunError(
                f"plan: made for {theirs[0]} on {plan.label} with cost limits {theirs[2]}, "
                f"not this agent ({ours[0]} on {self.task.name}, {ours[2]}); make the plan's "
                "agent with Agent.from_plan(plan)"
            )

    def plan_for(
        self,
        data: RunPlan | Dataset | None,
        settings: Mapping[str, Any],
        allowed: Sequence[str],
        *,
        hyperparameters: Mapping[str, Any],
        run_config: RunConfig | None = None,
        what: str = "fit",
    ) -> RunPlan:
        """The plan an agent of this context trains: ``data`` when it is one (without
        ``settings``), else one built for the dataset ``data`` from ``run_config`` (whose
        settings are the configuration's) or from the keyword ``settings`` (``allowed``
        of them; see :func:`~neorl_industrial.wrappers.training.plan.plan_settings`).

        Raises:
            RunError: for no data, settings beside a plan or a configuration, settings
                the configuration's fields refuse, or a plan of another agent.
        """
        if data is None:
            raise RunError(
                f"{what}: no data; pass a dataset or a RunPlan (an agent of "
                "Agent.from_config(config, dataset=...) trains its own)"
            )
        if isinstance(data, RunPlan):
            if settings:
                raise RunError(
                    f"{', '.join(sorted(settings))}: a plan carries its settings; set them in "
                    "the plan (RunPlan.create, or the run's configuration) or pass a dataset"
                )
            plan = data
        elif run_config is not None:
            extra = sorted(set(settings) - {"card"})
            if extra:
                raise RunError(
                    f"{', '.join(extra)}: this agent's settings come from its "
                    "configuration; change them there (RunConfig.with_overrides)"
                )
            plan = _planned(resolve_run, run_config, data, settings.get("card"))
        else:
            algorithm = AlgorithmSection.model_construct(
                name=self.entry.name, hyperparameters=dict(hyperparameters)
            )
            created = _planned(plan_settings, settings, allowed=allowed)
            plan = _planned(
                RunPlan.create,
                data,
                algorithm=algorithm,
                task=self.task,
                constraints=self.constraint_spec,
                safety=self.safety,
                **created,
            )
        self.check_plan(plan)
        return plan

    # ----- what the contract says -------------------------------------------------------
    @property
    def constraints(self) -> Any:
        """The compiled hard constraints the shield enforces."""
        return self.safety.constraints

    @property
    def cost_limits(self) -> list[float] | None:
        """Episode cost limit per cost channel (None when the task has no channels)."""
        return [float(x) for x in self.safety.limits()] or None

    @property
    def cost_names(self) -> tuple[str, ...]:
        return self.safety.cost_names

    @property
    def action_size(self) -> int:
        """The policy's output: the number of actions of a discrete task."""
        return self.task.num_actions if self.entry.discrete else self.task.action_size

    @functools.cached_property
    def simulator(self) -> tuple[Any, Any]:
        """``(env, params)`` of the task's simulator.

        Raises:
            RunError: when the task has none.
        """
        try:
            return self.task.make_simulator()
        except TaskError as error:
            raise RunError(str(error)) from None

    def hyperparameters(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """``given`` with what the task fixes: a safe algorithm's episode length is the
        task's unless given."""
        if (
            self.entry.safe
            and "episode_length" in self.entry.fields
            and self.task.episode_length is not None
        ):
            return {"episode_length": int(self.task.episode_length), **given}
        return dict(given)

    # ----- the algorithm ----------------------------------------------------------------
    def build(
        self,
        hyperparameters: Mapping[str, Any],
        plant_model: Any = None,
        reward_scale: RewardScaling | None = None,
        *,
        what: str = "",
    ) -> tuple[Any, Any]:
        """``(algorithm, config)`` of ``hyperparameters``, the algorithm acting in the
        policy's [-1, 1]; a model-based one steps ``plant_model`` (without one it
        initialises and acts, as a loaded agent does, but cannot train). ``what`` prefixes
        an error (``"configuration 3 of the sweep: "``).

        Raises:
            RunError: for hyperparameters the algorithm refuses.
        """
        name, obs_size = self.entry.name, self.task.observation_size
        try:
            if self.entry.model_based and plant_model is not None:
                from neorl_industrial.wrappers.training.model_based import (
                    build_model_based,
                    model_handle,
                )

                handle = model_handle(
                    plant_model, reward_scaling=reward_scale, constraints=self.constraints
                )
                return build_model_based(
                    name,
                    obs_size,
                    self.action_size,
                    dict(hyperparameters),
                    handle,
                    contract=self.safety,
                )
            return build_algorithm(
                name, obs_size, self.action_size, dict(hyperparameters), contract=self.safety
            )
        except (HyperparameterError, ValueError) as error:
            raise RunError(f"{what}{error}") from None

    def in_plant_units(self, algorithm: Any) -> Any:
        """``algorithm`` acting in plant units (the action scaling around its ``act``)."""
        return with_action_scaling(algorithm, self.scaler)

    # ----- data -------------------------------------------------------------------------
    def check_dataset(self, dataset: Dataset, card: Any = None) -> None:
        """Raises :class:`RunError` when ``dataset`` (and its card's names) does not fit
        the task or the contract."""
        name = "dataset" if card is None else f"dataset {card.name!r}"
        try:
            self.task.check_dataset(dataset, source=name, card=card)
        except TaskError as error:
            raise RunError(str(error)) from None
        if self.entry.safe and not self.safety.relabel and dataset.n_costs != self.safety.n_costs:
            raise RunError(
                f"{name}: {dataset.n_costs} cost channels; {self.entry.name} is held to "
                f"{self.safety.n_costs} ({', '.join(self.safety.cost_names)})"
            )

    def training_data(self, dataset: Dataset) -> Dataset:
        """``dataset`` as the contract sees it: costs relabelled from the spec's
        definitions when the spec defines other channels than the data has."""
        if self.safety.relabel and self.safety.constraints.n_costs:
            return relabel_costs(dataset, self.safety.constraints)
        return dataset

    # ----- evaluation -------------------------------------------------------------------
    def simulator_evaluator(
        self, algorithm: Any, episodes: int, horizon: int | None, shield_actions: bool, seed: int
    ) -> Evaluator:
        """Evaluates policies of ``algorithm`` (acting in plant units) in the simulator."""
        env, params = self.simulator
        limits = self.cost_limits
        if limits is not None and (len(limits) != env.n_costs or not all(np.isfinite(limits))):
            limits = None  # a contract of other channels than the simulator's cost vector
        return Evaluator(
            algorithm,
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

    def ope_evaluator(
        self,
        algorithm: Any,
        heldout: Dataset,
        ope: OPESettings,
        hyperparameters: Mapping[str, Any],
    ) -> OffPolicyEvaluator:
        """FQE estimates, on ``heldout`` (plant units), of policies of ``algorithm``
        (acting in the policy's [-1, 1])."""
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
            algorithm,
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

    def health(
        self, algorithm: Any, policies: Any, data: Dataset, source: str
    ) -> list[PolicyHealth]:
        """:func:`~neorl_industrial.wrappers.training.selection.policy_health` of
        ``policies`` on ``data``'s observations (``source`` says which they are; its
        actions in plant units are the logged ones)."""
        discrete = self.entry.discrete
        observations = health_observations(data.transition_observations())
        actions = health_observations(jnp.asarray(data.actions).reshape(data.n_transitions, -1))
        return policy_health(
            algorithm.act,
            policies,
            observations,
            logged_actions=None if discrete else actions,
            source=source,
            scaler=None if discrete else self.scaler,
            constraints=None if discrete else self.constraints,
        )

    # ----- the verdict ------------------------------------------------------------------
    def verdict(
        self,
        candidates: CandidateStack,
        heldout: Dataset,
        plant_model: Any,
        ope: OPESettings,
        settings: VerdictSettings | None,
        scored: OffPolicyEvaluator | None = None,
        selection: Dataset | None = None,
    ) -> Verdict:
        """The verdict on ``candidates`` (one algorithm's policies, stacked, with their
        names and hyperparameters) against the logged operation of ``heldout``;
        ``scored``: an evaluator that has just scored them, whose FQEs are reused when they
        are the ones the verdict would fit; ``selection``: the episodes they were trained
        on, one candidate selected on them before the test (see
        :mod:`~neorl_industrial.wrappers.training.verdict_selection`).

        Raises:
            RunError: for a verdict the data or settings cannot give.
        """
        algorithm, policies, names = candidates.algorithm, candidates.policies, candidates.names
        evaluator = self.ope_evaluator(
            algorithm, self.training_data(heldout), ope, candidates.hyperparameters
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
            candidates = VerdictCandidates(
                names, algorithm.act, policies, evaluator.actions, fitted.values if reuse else None
            )
            rules = PlantRules(
                self.scaler, self.constraints, evaluator.cost_limits, self.cost_names,
                evaluator.episode_length,
            )  # fmt: skip
            return model_verdict(
                candidates,
                evaluator.dataset,
                plant_model,
                rules,
                settings,
                selection=None if selection is None else self.training_data(selection),
            )
        except VerdictError as error:
            raise RunError(str(error)) from None

    def check_plant_model(
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
            Whether the model may judge policies on ``heldout``.

        Raises:
            RunError: naming ``plant_model`` and what is wrong with it.
        """
        from neorl_industrial.wrappers.models import PlantModelError

        name = name or ("dataset" if card is None else f"dataset {card.name!r}")
        if self.entry.discrete:
            raise RunError(f"plant_model: {self.entry.name} acts on discrete actions")
        if not getattr(plant_model, "fitted", False):
            raise RunError("plant_model: not fitted; fit one first (neorl-industrial model fit)")
        try:
            plant_model.check_task(self.task, name=name)
            if dataset is not None:
                plant_model.check_same_data(dataset, name=name, task=self.task)
        except PlantModelError as error:
            raise RunError(f"plant_model: {error}") from None
        if dataset is None:
            return True
        fitted_on = plant_model.card["dataset"]["train_episodes"]
        if heldout is None and not verdict:
            return False
        if heldout is None:
            raise RunError(
                "plant_model: a verdict is made on held-out episodes, and this fit holds none "
                "out (a task with a simulator: ope=OPESettings(always=True); or evaluate=True)"
            )
        digests = episode_digests(dataset)
        model_trained = {digests[i] for i in fitted_on}
        overlap = sum(d in model_trained for d in episode_digests(heldout))
        if overlap and not verdict:
            return False
        if overlap:
            raise RunError(
                f"plant_model: fitted on {overlap} of the {heldout.n_episodes} episodes the "
                "evaluation holds out, so it would judge policies on what it memorised; fit "
                "it with the same held-out share and split seed as the evaluation (model fit "
                "--holdout/--split-seed, ope.holdout/ope.split_seed)"
            )
        return True


def _planned(make: Any, *args: Any, **kwargs: Any) -> Any:
    """``make(*args, **kwargs)``, its :class:`PlanError` raised as a :class:`RunError`."""
    try:
        return make(*args, **kwargs)
    except RunError:
        raise
    except PlanError as error:
        raise RunError(str(error)) from None
