"""The mixing tank's served decisions on 20,000 valid readings, each checked by the
independent oracle of ``random_shield`` (scipy's HiGHS LP: could the rules the applied
action breaks have been kept?).

The policy is the README's: IQL-Lag trained on the shipped mixing-tank log with its
constraint file, exported, and loaded as a server loads it (``PolicyArtifact``). The
readings are what a plant may send: every feature anywhere in its physical range, the
previous action anywhere in the actions' bounds (one row in ten with the previous action
unknown, as at a start). A field test of the earlier shield found 664 of 20,000 such
readings applied the held previous action while raising the pump kept every rule.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from neorl_industrial.integration.datasets import load_plant_log
from neorl_industrial.wrappers.agents import Agent, OPESettings, PolicyArtifact

from .random_shield import Batch, Structure, Verdict, judge

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "mixing-tank"
READINGS = 20_000


def _readings(artifact: PolicyArtifact, rows: int, seed: int):
    constraints = artifact.compiled_constraints
    rng = np.random.default_rng(seed)
    low = np.asarray(constraints.observation_low, np.float64)
    high = np.asarray(constraints.observation_high, np.float64)
    observations = rng.uniform(low, high, (rows, low.size)).astype(np.float32)
    a_low = np.asarray(constraints.bound_low, np.float64)
    a_high = np.asarray(constraints.bound_high, np.float64)
    previous = rng.uniform(a_low, a_high, (rows, a_low.size)).astype(np.float32)
    previous[rng.random(rows) < 0.1] = np.nan  # unknown: no rate limit on that row
    return observations, previous


@pytest.mark.slow  # trains the README's agent, then 20,000 decisions through the oracle
def test_twenty_thousand_valid_readings_break_no_rule_that_can_be_kept(tmp_path):
    logs, card = load_plant_log(EXAMPLE / "mixing_tank.csv", EXAMPLE / "schema.yaml")
    agent = Agent(
        "iql-lag",
        task=card.task(logs),
        constraints=str(EXAMPLE / "constraints.yaml"),
        hidden=(64, 64),
    )
    agent.fit(logs, updates=500, chunk=250, seeds=[0, 1], ope=OPESettings(updates=500))
    artifact = PolicyArtifact.load(agent.export(tmp_path / "policy"))
    observations, previous = _readings(artifact, READINGS, seed=2026)
    decision = artifact.decide_rows(observations, previous)
    constraints = artifact.compiled_constraints
    batch = Batch(
        structure=Structure(
            n_actions=2,
            rated=(),
            rate_priority=(),
            states=(),
            linear_priority=(),
            linear_reads=(),
            fallback="hold_previous",
        ),
        specs=[artifact.constraint_spec.to_dict()],
        variant=np.zeros(READINGS, np.int64),
        observations=observations,
        proposals=np.asarray(decision.proposed),
        previous=previous,
    )
    batch.applied = np.asarray(decision.action)
    batch.status = np.asarray(decision.status)
    batch.compiled = [constraints]
    verdict = judge(batch, Verdict())
    overridden = int(np.sum(decision.overridden))
    print(
        f"{verdict.decisions} readings, {overridden} overridden, "
        f"{int(np.sum(decision.fallback))} fallback, {int(np.sum(decision.infeasible))} "
        f"infeasible; {verdict.breaks} broke a keepable rule, {verdict.thin} a rule keepable "
        f"only by less than 1e-4 of the ranges, {verdict.false_infeasible} flagged infeasible "
        "while keepable"
    )
    assert verdict.decisions == READINGS
    # The check saw repairs: the readings are not all ones the policy handles alone.
    assert overridden > 100
    assert verdict.breaks == 0, verdict.examples
    assert verdict.false_infeasible == 0
    assert not np.any(decision.incident)
