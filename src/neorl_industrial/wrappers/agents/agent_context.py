"""The resolved contract an ``Agent`` is built on (its
:class:`~neorl_industrial.wrappers.training.context.PolicyContext`): from the
constructor's arguments or from a run configuration without its data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from neorl_industrial.core.environments import Task, TaskError
from neorl_industrial.core.safety import ConstraintSpec
from neorl_industrial.wrappers.training.config import RunConfig
from neorl_industrial.wrappers.training.context import PolicyContext, RunError, algorithm_of
from neorl_industrial.wrappers.training.plan import (
    DEFAULT_ENV,
    KEYWORDS,
    PLAN_KEYWORDS,
    PlanError,
    RunPlan,
    contract_of,
    resolve_contract,
    resolve_task,
)

__all__ = [
    "FIT_KEYWORDS",
    "SWEEP_KEYWORDS",
    "context_of_arguments",
    "context_of_config",
    "run_config_of",
    "run_plan",
]

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
#: The keyword settings of ``Agent.fit`` and ``Agent.sweep``.
_SETTINGS = {"fit": FIT_KEYWORDS, "sweep": SWEEP_KEYWORDS}


def context_of_arguments(
    algorithm: str,
    env: str | None,
    task: Task | None,
    env_params: Mapping[str, Any] | None,
    constraints: ConstraintSpec | str | Path | None,
    cost_limits: Sequence[float] | None,
) -> PolicyContext:
    """The context of ``Agent(algorithm, env, task=..., ...)`` (see it).

    Raises:
        RunError: naming the argument that does not fit.
    """
    entry = algorithm_of(algorithm)
    if task is None:
        try:
            task = Task.from_env(env or DEFAULT_ENV, env_params)
        except TaskError as error:
            raise RunError(str(error)) from None
    elif env_params:
        raise RunError("env_params: give them to the task (Task.from_env), not the agent")
    PolicyContext.check_kind(entry, task)
    try:
        spec, safety = resolve_contract(task, constraints, cost_limits, safe=entry.safe)
    except PlanError as error:
        raise RunError(str(error)) from None
    return PolicyContext.create(entry, task, spec, safety)


def run_config_of(config: RunConfig | Mapping[str, Any] | str | Path) -> RunConfig:
    """``config`` as a :class:`RunConfig` (a mapping or a YAML file read).

    Raises:
        ConfigError: for a file or field the configuration refuses.
    """
    if isinstance(config, Mapping):
        return RunConfig.from_dict(dict(config))
    if not isinstance(config, RunConfig):
        return RunConfig.from_yaml(config)
    return config


def context_of_config(config: RunConfig) -> PolicyContext:
    """The context of ``config``'s algorithm, task and safety contract.

    Raises:
        RunError: naming the field that does not fit.
    """
    try:
        entry = algorithm_of(config.algorithm.name)
        task = resolve_task(config)
        PolicyContext.check_kind(entry, task)
        spec, contract = contract_of(config, task)
    except PlanError as error:
        raise RunError(str(error)) from None
    return PolicyContext.create(entry, task, spec, contract)


def run_plan(agent: Any, data: Any, settings: dict[str, Any], what: str) -> RunPlan:
    """The plan ``agent.fit`` or ``agent.sweep`` (``what``) trains: a plan as it is, a
    dataset with keyword ``settings`` (:meth:`PolicyContext.plan_for`), or ``None``, the
    agent's own plan (``from_plan``) or run configuration (``from_config``).

    Raises:
        RunError: for data that does not fit the agent, or bad settings.
    """
    return agent.context.plan_for(
        agent.plan if data is None else data,
        settings,
        _SETTINGS[what],
        hyperparameters=agent.hyperparameters,
        run_config=agent.run_config,
        what=what,
    )
