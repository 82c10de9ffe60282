"""What a run produced: :class:`RunResult` (a training run) and :class:`SweepResult` (a
sweep), frozen and read by attribute, and a sweep's every policy (:class:`SweepCandidates`).

A result's recorded fields are what a saved agent and an exported policy keep (their
``training`` entry: :meth:`RunResult.record`, read back by :meth:`RunResult.from_record`);
its products (the policies, the algorithm, the Trainer's history) live in the process
that trained.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from neorl_industrial.wrappers.hostio import to_json_data
from neorl_industrial.wrappers.training.context import CandidateStack, PolicyContext, RunError
from neorl_industrial.wrappers.training.evaluation import selection_key
from neorl_industrial.wrappers.training.selection import PolicyHealth
from neorl_industrial.wrappers.training.sweep_table import candidate_id, with_values
from neorl_industrial.wrappers.training.trainer import TrainResult
from neorl_industrial.wrappers.training.verdict import episode_digests

__all__ = [
    "CANDIDATE_FILE",
    "CandidateStack",
    "RunResult",
    "SweepCandidates",
    "SweepProgram",
    "SweepResult",
    "failed_runs",
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
        context: the algorithm, task and resolved contract the run trained under.
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
    context: PolicyContext | None = dataclasses.field(
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

    def _trained_mask(self, dataset: Any) -> np.ndarray:
        """``[episodes]`` whether each episode of ``dataset`` trained the runs
        (recognised by its content)."""
        trained = self.trained_episodes
        digests = episode_digests(dataset) if trained else [None] * dataset.n_episodes
        return np.asarray([d in trained for d in digests], bool)

    def unseen_episodes(self, dataset: Any) -> tuple[Any, int]:
        """``dataset`` without the episodes the runs were trained on (recognised by their
        content), and how many those were; all of ``dataset`` when every episode trained
        them (the count then equals its episodes)."""
        mask = self._trained_mask(dataset)
        left_out = int(mask.sum())
        if left_out == 0 or left_out == len(mask):
            return dataset, left_out
        return dataset.select_episodes(np.flatnonzero(~mask)), left_out

    def seen_episodes(self, dataset: Any) -> Any:
        """The episodes of ``dataset`` the runs were trained on (recognised by their
        content), or None when none of them was."""
        mask = self._trained_mask(dataset)
        return dataset.select_episodes(np.flatnonzero(mask)) if mask.any() else None

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


def failed_runs(health: Sequence[PolicyHealth], names: Sequence[str]) -> dict[int, str]:
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
