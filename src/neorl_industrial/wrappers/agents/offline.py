"""An agent's policies judged on logged data: FQE estimates (``Agent.evaluate_offline``)
and the verdict against the logged operation (``Agent.judge``)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.wrappers.training import summarize_runs
from neorl_industrial.wrappers.training.config import OPESettings
from neorl_industrial.wrappers.training.context import CandidateStack, RunError
from neorl_industrial.wrappers.training.results import RunResult
from neorl_industrial.wrappers.training.verdict import Verdict, VerdictSettings

__all__ = ["evaluate_offline", "judge_runs"]


def evaluate_offline(
    agent: Any,
    dataset: Dataset,
    ope: OPESettings | None,
    plant_model: Any,
    verdict: VerdictSettings | None,
    dataset_name: str,
) -> dict[str, Any]:
    """``Agent.evaluate_offline`` of fitted ``agent`` (see it).

    Raises:
        RunError: for data that does not fit, discrete actions, a verdict asked on
            training episodes only, or a plant model of another task or dataset.
    """
    if agent.entry.discrete:
        raise RunError("evaluate_offline: FQE evaluates continuous-action policies")
    agent.check_dataset(dataset)
    ope = ope or OPESettings()
    evaluation, left_out = (agent.result or RunResult()).unseen_episodes(dataset)
    on_training = left_out == dataset.n_episodes
    if on_training and plant_model is not None:
        raise RunError(
            f"{dataset_name}: all {left_out} of its episodes trained this agent; a "
            "verdict on them would measure memory, not the plant. Give episodes it was "
            "not trained on (the run's held-out episodes are those of its training log "
            "it did not train on, or log more)"
        )
    if plant_model is not None:
        agent.context.check_plant_model(plant_model, dataset, evaluation, None, name=dataset_name)
    evaluator = agent.context.ope_evaluator(
        agent.policy_algorithm, agent.training_data(evaluation), ope, agent.hyperparameters
    )
    runs = evaluator(agent.policies, 0)
    result = {
        "runs": runs,
        "summary": summarize_runs(runs),
        "selected_run": agent.selected,
        "estimate": "fqe",
        "evaluated_episodes": evaluation.n_episodes,
        "left_out_training_episodes": 0 if on_training else left_out,
        "on_training_episodes": on_training,
    }
    if plant_model is not None:
        trained = (agent.result or RunResult()).seen_episodes(dataset)
        result["verdict"] = judge_runs(
            agent, evaluation, plant_model, ope, verdict, scored=evaluator, selection=trained
        ).to_dict()
    return result


def judge_runs(
    agent: Any,
    heldout: Dataset,
    plant_model: Any,
    ope: OPESettings,
    settings: VerdictSettings | None,
    scored: Any = None,
    selection: Dataset | None = None,
) -> Verdict:
    """The verdict on every run's policy that can act (``scored``: an evaluator that
    has just scored them all, whose FQEs are reused; ``selection``: the episodes they
    were trained on, one selected on them before the test)."""
    runs = agent.able_runs()
    policies = agent.policies
    if len(runs) != len(agent.seeds):
        rows = jnp.asarray(runs)
        policies = jax.tree.map(lambda leaf: leaf[rows], policies)
        scored = None
    names = [f"run {run} (seed {agent.seeds[run]})" for run in runs]
    candidates = CandidateStack(names, policies, agent.policy_algorithm, agent.hyperparameters)
    return agent.context.verdict(
        candidates, heldout, plant_model, ope, settings, scored=scored, selection=selection
    )
