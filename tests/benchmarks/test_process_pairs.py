"""The process tasks' paired benchmark: no timing without a matching trajectory, and the
alternated rounds' summaries (without the reference environment: a stand-in answers)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from benchmarks.peers import process_pairs
from neorl_industrial.core.environments import make


class StandIn:
    """Answers as the reference worker would: the episode ours gives, ``offset`` added to
    every observation, and fixed timings."""

    def __init__(self, offset: float):
        self.offset = offset
        self.asked: list[str] = []

    def ask(self, **request):
        self.asked.append(request["op"])
        if request["op"] == "time":
            return {"wall_s": 2.0, "cpu_s": 1.0}
        env, params = make("FourTank-v0")
        observations, rewards = process_pairs._run_ours(env, params, np.asarray(request["actions"]))
        return {"observations": (observations + self.offset).tolist(), "rewards": rewards.tolist()}


@pytest.fixture(scope="module")
def four_tank_pair():
    pair = process_pairs.PAIRS["FourTank-v0"]
    return process_pairs.Pair(pair.env_id, pair.reference, pair.source, 40, 200, 20)


def test_a_trajectory_beyond_the_tolerance_is_not_timed(four_tank_pair):
    # 2e-5 m is beyond FourTank's 5e-6 m plus 1e-5 of the level at every level below 1.5 m.
    worker = StandIn(offset=2e-5)
    entry = process_pairs.measure_pair(
        four_tank_pair, worker, 2, (4,), lambda n: 10, None, None, quick=False
    )
    assert entry["error"] == "trajectory check failed: not timed"
    assert not entry["check"]["passed"] and entry["check"]["max_over_tolerance"] > 1.0
    assert worker.asked == ["episode"]


def _work(*sizes):
    """A stand-in for the project's compiled programs (the rounds, not the task, are tested)."""
    return lambda key: jax.numpy.sum(jax.random.uniform(key, (int(np.prod(sizes)),)))


def test_rounds_alternate_and_report_min_median_max(four_tank_pair):
    worker = StandIn(offset=0.0)
    entry = process_pairs.measure_pair(
        four_tank_pair,
        worker,
        3,
        (4,),
        lambda n: 10,
        lambda env_id, n_steps: _work(n_steps),
        lambda env_id, n_envs, n_steps: _work(n_envs, n_steps),
        quick=False,
    )
    assert entry["check"]["passed"] and entry["check"]["max_over_tolerance"] == 0.0
    assert worker.asked == ["episode", "time", "time", "time", "time"]  # a warm-up, 3 rounds
    rounds = entry["rounds"]
    assert len(rounds) == 3 and all(row["reference"]["steps_per_s_cpu"] == 40.0 for row in rounds)
    for name, steps in (("single", 200), ("x4", 40)):
        ratios = [row[name]["ratio_cpu"] for row in rounds]
        assert all(row[name]["steps"] == steps for row in rounds)
        assert entry["summary"][name]["ratio_cpu"] == {
            "min": min(ratios),
            "median": sorted(ratios)[1],
            "max": max(ratios),
        }
    assert process_pairs.spread([3.0, None]) == {"min": None, "median": None, "max": None}
