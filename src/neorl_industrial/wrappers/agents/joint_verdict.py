"""One verdict over the candidates of several runs and sweeps: every saved seed and every
configuration a sweep trained, judged together against the logged operation, one answer.

    from neorl_industrial.wrappers.agents import Agent
    from neorl_industrial.wrappers.agents.joint_verdict import judge_together

    joint = judge_together(
        {"td3bc-lag": Agent.load("runs/td3bc-lag/agent"),
         "iql-sweep": Agent.load("runs/iql-sweep/agent")},
        dataset, plant_model, card=card,
    )
    joint.verdict.statement, joint.ranking[0]        # "iql-sweep/config1-seed0"
    Agent.load("runs/iql-sweep/agent").candidate("config1-seed0").export("policy")

Candidates are named ``<run>/<candidate>`` (``seed1``, ``config3-seed0``; see
:attr:`Agent.candidates`). They must be of one task, one safety contract and one log:
a run of another task, other cost limits or constraints, or trained on another log (by
the log's fingerprint) is refused by name. The verdict is made on the episodes of the
log that no candidate trained on and the plant model was not fitted on; every candidate
of every algorithm is evaluated by one compiled program (each acts with its own
algorithm), from the same starts, against the same logged operation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.wrappers.agents.agent import Agent, AgentError, CandidateStack
from neorl_industrial.wrappers.training.config import OPESettings
from neorl_industrial.wrappers.training.plan import contract_record
from neorl_industrial.wrappers.training.selection import verdict_ranking
from neorl_industrial.wrappers.training.verdict import (
    Verdict,
    VerdictSettings,
    episode_digests,
)

__all__ = ["JointVerdict", "judge_together", "mixture_act", "mixture_params"]


@dataclasses.dataclass(frozen=True)
class JointVerdict:
    """The answer over every candidate of several runs.

    Attributes:
        verdict: the verdict (candidates named ``<run>/<candidate>``).
        ranking: the candidates, best first (:func:`~.selection.verdict_ranking`): the
            first is the one to export.
        runs: per run: its algorithm, its candidates and the ones that failed.
        heldout: the episodes judged on: how many, and of which log.
    """

    verdict: Verdict
    ranking: list[str]
    runs: dict[str, dict[str, Any]]
    heldout: dict[str, Any]

    @property
    def first(self) -> tuple[str, str]:
        """``(run, candidate)`` the verdict ranks first."""
        run, _, candidate = self.ranking[0].rpartition("/")
        return run, candidate

    def to_dict(self) -> dict[str, Any]:
        run, candidate = self.first
        return {
            "verdict": self.verdict.to_dict(),
            "ranking": list(self.ranking),
            "first": {"run": run, "candidate": candidate},
            "runs": self.runs,
            "heldout": self.heldout,
        }


def mixture_params(stacks: Sequence[Any]) -> dict[str, Any]:
    """The candidates of several algorithms as one stack (see :func:`mixture_act`):
    ``which`` says each candidate's algorithm, ``slots`` holds per algorithm a stack with
    the candidate's own parameters in its algorithm's slot (the others' first candidate,
    never used, in the other slots)."""
    counts = [int(jax.tree.leaves(stack)[0].shape[0]) for stack in stacks]
    which = np.repeat(np.arange(len(counts)), counts)
    slots = []
    for own, stack in enumerate(stacks):
        rows = np.concatenate(
            [
                np.arange(n) if group == own else np.zeros(n, np.int64)
                for group, n in enumerate(counts)
            ]
        )
        slots.append(jax.tree.map(lambda leaf, rows=rows: jnp.asarray(leaf)[rows], stack))
    return {"which": jnp.asarray(which, jnp.int32), "slots": tuple(slots)}


def mixture_act(acts: Sequence[Any]) -> Any:
    """One ``act`` over the candidates of several algorithms (``acts``, one per
    algorithm, parameters as :func:`mixture_params` stacks them): each candidate acts
    with its own algorithm's ``act``, so that all of them are evaluated by one compiled
    program (under ``vmap`` every algorithm's actor runs and the candidate's is kept)."""

    def act(params: Any, observation: Any, key: Any = None, deterministic: bool = True) -> Any:
        branches = [
            lambda slots, observation, own=own, function=function: function(
                slots[own], observation, key, deterministic=deterministic
            )
            for own, function in enumerate(acts)
        ]
        return jax.lax.switch(params["which"], branches, params["slots"], observation)

    return act


@dataclasses.dataclass(frozen=True)
class _Mixture:
    """An algorithm-like object whose ``act`` is a mixture's."""

    act: Any


def judge_together(
    agents: Mapping[str, Agent],
    dataset: Dataset,
    plant_model: Any,
    *,
    card: Any = None,
    ope: OPESettings | None = None,
    settings: VerdictSettings | None = None,
) -> JointVerdict:
    """One verdict over every candidate of ``agents`` (run name: its trained or loaded
    agent) on the episodes of ``dataset`` (the log they were trained on) that none of
    them trained on and ``plant_model`` was not fitted on.

    Raises:
        AgentError: naming the run: agents of another task, safety contract or log than
            the first, an unfitted or discrete-action agent, a plant model of another log,
            no episode held out from every candidate and the model, or a run name with a
            ``/``.
    """
    _check_runs(agents)
    first = next(iter(agents.values()))
    heldout, held, rest = _heldout_from_every_run(agents, dataset, plant_model, card)
    first.context.check_plant_model(plant_model, dataset, heldout, card)
    stacks, runs = _candidates_of(agents)
    names = [name for stack in stacks for name in stack.names]
    if len(stacks) == 1:
        algorithm, policies = stacks[0].algorithm, stacks[0].policies
    else:
        algorithm = _Mixture(mixture_act([stack.algorithm.act for stack in stacks]))
        policies = mixture_params([stack.policies for stack in stacks])
    candidates = CandidateStack(names, policies, algorithm, stacks[0].hyperparameters)
    verdict = first.context.verdict(
        candidates, heldout, plant_model, ope or OPESettings(), settings, selection=rest
    )
    return JointVerdict(
        verdict=verdict,
        ranking=verdict_ranking(verdict.to_dict()),
        runs=runs,
        heldout={"log": None if card is None else card.name, **held},
    )


def _check_runs(agents: Mapping[str, Agent]) -> None:
    """Refuses, naming the run, no runs, a run name with a ``/``, an agent without a
    policy or one acting on discrete actions."""
    if not agents:
        raise AgentError("agents: no run to judge")
    for label, agent in agents.items():
        if "/" in label or not label.strip():
            raise AgentError(f"run name {label!r}: expected a name without '/'")
        if not agent.fitted:
            raise AgentError(f"{label}: the agent has no policy yet; fit or load it first")
        if agent.entry.discrete:
            raise AgentError(f"{label}: {agent.name} acts on discrete actions")


def _heldout_from_every_run(
    agents: Mapping[str, Agent], dataset: Dataset, plant_model: Any, card: Any
) -> tuple[Dataset, dict[str, Any], Dataset | None]:
    """The episodes of ``dataset`` no run trained on and the plant model was not fitted
    on, their record (fingerprint, counts), and the other episodes (the candidates are
    selected on them before the test; None when there are none), after checking that
    every run is of the first's kind and was trained on this log."""
    first_label, first = next(iter(agents.items()))
    log = "dataset" if card is None else f"dataset {card.name!r}"
    fingerprint = _fingerprint(dataset)
    digests = episode_digests(dataset)
    trained: set[str] = set()
    for label, agent in agents.items():
        _check_same_kind(label, agent, first_label, first)
        agent.check_dataset(dataset, card)
        record = {} if agent.result is None else agent.result.dataset
        _check_same_log(label, record, fingerprint, digests, log)
        trained |= set(record.get("trained_episodes") or ())
    model_fit = {int(i) for i in plant_model.card["dataset"]["train_episodes"]}
    heldout_ids = [
        episode
        for episode, digest in enumerate(digests)
        if digest not in trained and episode not in model_fit
    ]
    if not heldout_ids:
        raise AgentError(
            f"{log}: none of its {len(digests)} episodes is held out from every run and the "
            f"plant model ({len(trained & set(digests))} trained a candidate, "
            f"{len(model_fit)} fitted the model); train every run and fit the model with the "
            "same held-out share and split seed (evaluation.ope.holdout/split_seed, model "
            "fit --holdout/--split-seed)"
        )
    heldout = dataset.select_episodes(np.asarray(heldout_ids, np.int64))
    rest_ids = sorted(set(range(len(digests))) - set(heldout_ids))
    rest = dataset.select_episodes(np.asarray(rest_ids, np.int64)) if rest_ids else None
    return (
        heldout,
        {
            "fingerprint": fingerprint,
            "episodes": len(heldout_ids),
            "of": len(digests),
            "transitions": heldout.n_transitions,
        },
        rest,
    )


def _candidates_of(
    agents: Mapping[str, Agent],
) -> tuple[list[CandidateStack], dict[str, dict[str, Any]]]:
    """Every run's candidate stacks, their names prefixed by the run's, and each run's
    record (algorithm, candidates, failed runs, its own selection)."""
    stacks: list[CandidateStack] = []
    runs: dict[str, dict[str, Any]] = {}
    for label, agent in agents.items():
        own = agent.candidate_stacks()
        runs[label] = {
            "algorithm": agent.name,
            "candidates": [name for stack in own for name in stack.names],
            "failed": [] if agent.result is None else list(agent.result.failed_runs),
            "selected": agent.selected_candidate,
        }
        stacks += [stack._replace(names=[f"{label}/{n}" for n in stack.names]) for stack in own]
    if not stacks:
        raise AgentError("agents: every candidate failed; none can be judged")
    return stacks, runs


def _fingerprint(dataset: Dataset) -> str:
    from neorl_industrial.wrappers.models.model_data import dataset_fingerprint

    return dataset_fingerprint(dataset)


def _check_same_kind(label: str, agent: Agent, first_label: str, first: Agent) -> None:
    """Refuses, naming both runs, an agent of another task or safety contract."""
    task, theirs = agent.task, first.task
    mine = (task.name, task.observation_names, task.action_names)
    if mine != (theirs.name, theirs.observation_names, theirs.action_names):
        raise AgentError(
            f"{label}: task {task.name!r} is not {first_label}'s task {theirs.name!r}; one "
            "verdict judges candidates of one task"
        )
    ours, other = contract_record(agent.safety)[:2], contract_record(first.safety)[:2]
    if ours != other:
        raise AgentError(
            f"{label}: cost limits {ours[0]} of {ours[1]} are not {first_label}'s {other[0]} "
            f"of {other[1]}; one verdict holds every candidate to the same limits"
        )
    if agent.constraint_spec.to_dict() != first.constraint_spec.to_dict():
        raise AgentError(
            f"{label}: its constraint spec is not {first_label}'s; one verdict judges "
            "candidates behind the same shield"
        )


def _check_same_log(
    label: str, record: Mapping[str, Any], fingerprint: str, digests: Sequence[str], log: str
) -> None:
    """Refuses, naming the run and both logs, an agent trained on another log: by the
    log's fingerprint when the agent recorded it, else by its training episodes."""
    recorded = record.get("fingerprint")
    name = record.get("name")
    if recorded is not None and recorded != fingerprint:
        raise AgentError(
            f"{label}: trained on log {name!r} ({recorded[:19]}...), not {log} "
            f"({fingerprint[:19]}...); one verdict judges candidates of one log"
        )
    unknown = set(record.get("trained_episodes") or ()) - set(digests)
    if unknown:
        raise AgentError(
            f"{label}: {len(unknown)} of the episodes it trained on are not in {log}: it was "
            f"trained on another log ({name!r}); one verdict judges candidates of one log"
        )
