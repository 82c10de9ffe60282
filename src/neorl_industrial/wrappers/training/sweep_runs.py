"""A sweep's runs as its programs train and evaluate them (``sweep(plan)`` of
:mod:`~neorl_industrial.wrappers.training.run`): every configuration × seed evaluated as a
training run is at its end, health-checked, judged with a plant model, and the table, the
choice and the chosen configuration's :class:`SweepResult` made from them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import jax
import jax.numpy as jnp

from neorl_industrial.wrappers.training.context import CandidateStack, RunError
from neorl_industrial.wrappers.training.evaluation import selection_key
from neorl_industrial.wrappers.training.results import (
    SweepCandidates,
    SweepProgram,
    SweepResult,
    failed_runs,
)
from neorl_industrial.wrappers.training.selection import verdict_ranking
from neorl_industrial.wrappers.training.sweep_table import (
    candidate_id,
    configuration_name,
    sweep_table,
    with_values,
)
from neorl_industrial.wrappers.training.verdict import Verdict, VerdictSettings, merge_verdicts

__all__ = ["SweepRuns"]


class SweepRuns:
    """A sweep's runs as its programs train and evaluate them, in the grid's order."""

    def __init__(
        self,
        prepared: Any,
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
        from neorl_industrial.functional.transformations.offline import Schedule
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
                schedule=Schedule(
                    n_updates=training.updates,
                    chunk_updates=training.chunk,
                    batch_size=training.batch_size,
                ),
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
                    CandidateStack(
                        [names[run] for run in able], judged, algorithm, hyperparameters
                    ),
                    heldout,
                    self.plant_model,
                    plan.ope,
                    self.verdict_settings,
                    scored=evaluator if len(able) == len(names) else None,
                    selection=prepared.plan.split.train,
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
        failed = failed_runs(self.health, all_names)
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
            context=context,
            candidates=SweepCandidates(
                fields=fields,
                points=[dict(point) for point in self.points],
                seeds=seeds,
                hyperparameters=prepared.hyperparameters,
                programs=list(self.programs),
            ),
        )
