"""The candidates an agent holds, by name: a training run's seeds (``seed<s>``) or a
sweep's every configuration × seed (``config<c>-seed<s>``), each a policy that can be
predicted with, judged and exported on its own."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Self

from neorl_industrial.wrappers.training.context import RunError
from neorl_industrial.wrappers.training.results import CandidateStack, RunResult
from neorl_industrial.wrappers.training.sweep_table import (
    candidate_id,
    parse_candidate,
    with_values,
)

__all__ = ["CandidateSelection"]


class CandidateSelection:
    """:class:`~neorl_industrial.wrappers.agents.Agent`'s candidates: naming, selecting
    and stacking the policies it holds. Reads the agent's ``seeds``, ``policies``,
    ``result``, ``sweep_candidates``, ``selected`` and ``context``."""

    seeds: list[int]
    policies: Any
    selected: int
    result: RunResult | None
    sweep_candidates: Any

    @property
    def candidates(self) -> list[str]:
        """Every policy this agent holds that can act, by name: ``seed<s>`` for a
        training run's seeds, ``config<c>-seed<s>`` for a sweep's every configuration ×
        seed (the failed ones, ``result.failed_runs``, are left out)."""
        sweep = self.sweep_candidates
        names = [candidate_id(seed) for seed in self.seeds] if sweep is None else sweep.names()
        return [name for name in names if name not in self._failed()]

    @property
    def selected_candidate(self) -> str | None:
        """The name of the policy :meth:`predict` and :meth:`export` use (None unfitted)."""
        if not self.fitted:
            return None
        return candidate_id(self.seeds[self.selected], self._configuration_index())

    def _configuration_index(self) -> int | None:
        """The sweep configuration whose seeds' policies the agent holds (None: not a
        sweep's agent)."""
        if self.sweep_candidates is None or self.result is None:
            return None
        selection = self.result.selection
        key = parse_candidate(str(selection.get("candidate")))
        if selection.get("by") == "candidate" and key is not None:
            return key[0]
        return (self.result.sweep or {}).get("selected")

    def able_runs(self) -> list[int]:
        """The runs (of ``self.policies``) whose policy can act."""
        failed, configuration = self._failed(), self._configuration_index()
        return [
            run
            for run, seed in enumerate(self.seeds)
            if candidate_id(seed, configuration) not in failed
        ]

    def _failed(self) -> dict[str, str]:
        return {} if self.result is None else self.result.failed

    def candidate(self, name: str) -> Self:
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
            raise RunError(f"candidate: {name!r} is not a candidate's name; known: {known}")
        configuration, seed = key
        canonical = candidate_id(seed, configuration)
        if canonical in failed:
            raise RunError(
                f"candidate {canonical}: failed ({failed[canonical]}); a policy that cannot "
                "act is never exported"
            )
        other = copy.copy(self)
        other._decide = None
        sweep = self.sweep_candidates
        if sweep is None or configuration is None:
            if sweep is not None or configuration is not None or seed not in self.seeds:
                raise RunError(f"candidate: no {canonical!r} in this agent; known: {known}")
            other.selected = self.seeds.index(seed)
        else:
            if not 0 <= configuration < len(sweep.points) or seed not in sweep.seeds:
                raise RunError(f"candidate: no {canonical!r} in this agent; known: {known}")
            other.hyperparameters = with_values(sweep.hyperparameters, sweep.points[configuration])
            other._build(other.hyperparameters)
            other.policies = sweep.seeds_of(configuration, self.context)
            other.seeds = list(sweep.seeds)
            other.selected = sweep.seeds.index(seed)
        other.result = dataclasses.replace(
            self.result or RunResult(),
            selected_run=other.selected,
            selection={"by": "candidate", "candidate": canonical},
            policies=other.policies,
            hyperparameters=other.hyperparameters,
        )
        return other

    def candidate_stacks(self) -> list[CandidateStack]:
        """Every candidate that can act, as stacks of one algorithm each (a training
        run's seeds; each program of a sweep): what a verdict over them evaluates."""
        self._require_fitted("candidate_stacks")
        failed = self._failed()
        sweep = self.sweep_candidates
        if sweep is None:
            names = [candidate_id(seed) for seed in self.seeds]
            stack = CandidateStack(
                names, self.policies, self.policy_algorithm, self.hyperparameters
            )
            stacks = [stack]
        else:
            stacks = []
            for number, configurations in enumerate(sweep.configurations):
                hyperparameters, algorithm = sweep.configuration(configurations[0], self.context)
                names = [candidate_id(seed, c) for c in configurations for seed in sweep.seeds]
                policies = sweep.program(number, self.context)
                stacks.append(CandidateStack(names, policies, algorithm, hyperparameters))
        return [kept for stack in stacks if (kept := stack.able(failed)) is not None]
