"""Which channels a plant model computes instead of learning: a plant log's definitions,
an alarm threshold written as a comparison, and the constraint thresholds of a task whose
dataset card defines nothing (a simulator's) — each only where it reproduces the data."""

from __future__ import annotations

import numpy as np

from neorl_industrial.core.environments import Task
from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.integration.datasets import generate_dataset
from neorl_industrial.wrappers.models.model_data import known_signals


def _plant_log(threshold: float) -> tuple[Task, Dataset]:
    """A plant log with no simulator: a temperature, a valve, and an alarm logged when the
    temperature was above ``threshold``."""
    rng = np.random.default_rng(0)
    episodes = []
    for _ in range(4):
        temperature = 400.0 + np.cumsum(rng.normal(0.0, 5.0, 31))
        valve = rng.uniform(0.0, 100.0, (30, 1))
        episodes.append(
            {
                "observations": temperature[:, None],
                "actions": valve,
                "rewards": -np.abs(temperature[:-1] - 400.0),
                "costs": (temperature[1:] > threshold).astype(np.float64)[:, None],
            }
        )
    dataset = Dataset.from_episodes(episodes, name="kiln")
    task = Task.create(
        name="kiln",
        observation_names=["temperature"],
        action_names=["valve"],
        action_low=[0.0],
        action_high=[100.0],
        cost_names=["alarm"],
        cost_definitions={"alarm": "the kiln's high-temperature alarm (a logged flag)"},
    )
    return task, dataset


def test_an_alarm_threshold_on_a_plant_log_is_computed_where_it_reproduces_the_flag():
    task, dataset = _plant_log(threshold=405.0)
    assert float(np.asarray(dataset.costs).sum()) > 10  # the alarm did trip
    known, how = known_signals(task, {"alarm": "temperature > 405"}, None, dataset)
    assert [(s.channel, s.row) for s in known.signals] == [("alarm", "next")]
    assert how["alarm"] == "computed: temperature > 405 (on the next row)"
    assert how["reward"] == "learned (no definition)"
    # A threshold other than the one that raised the alarm is not the logged channel.
    known, how = known_signals(task, {"alarm": "temperature > 410"}, None, dataset)
    assert known.signals == ()
    assert how["alarm"] == "learned: temperature > 410 does not reproduce the logged values"


def test_a_channel_the_task_defines_in_words_stays_learned():
    task, dataset = _plant_log(threshold=405.0)
    known, how = known_signals(task, {}, None, dataset)
    assert known.signals == ()
    assert how == {"reward": "learned (no definition)", "alarm": "learned (no definition)"}


def test_a_simulator_task_s_constraint_thresholds_compute_its_costs():
    # The CSTR's dataset card defines nothing; its task's costs are the constraint spec's
    # temperature thresholds, which reproduce the logged costs on the next row.
    dataset, card = generate_dataset("CSTR-v0", "medium", 10, seed=0)
    task = card.task(dataset)
    assert card.definitions == {}
    costs = np.asarray(dataset.costs).reshape(-1, dataset.n_costs)
    assert costs.sum(axis=0).min() > 0  # both limits were crossed in the data
    known, how = known_signals(task, card.definitions, None, dataset)
    rows = {s.channel: (s.source, s.row) for s in known.signals}
    assert rows == {
        "T_high": (task.cost_definitions["T_high"], "next"),
        "T_low": (task.cost_definitions["T_low"], "next"),
    }
    assert how["T_high"] == f"computed: {task.cost_definitions['T_high']} (on the next row)"
    # Logged costs that are not those thresholds (here: doubled) stay learned.
    doubled = dataset.replace(costs=dataset.costs * 2.0)
    known, how = known_signals(task, card.definitions, None, doubled)
    assert known.signals == ()
    assert how["T_low"].endswith("does not reproduce the logged values")


def test_a_limit_never_crossed_is_computed_on_the_row_the_others_were_found_on():
    # Twenty four-tank episodes: two tanks ran low (on the next row, where the simulator
    # counts it), no tank overflowed or ran low otherwise. The channels that never changed
    # are reproduced on either row and take the next row too.
    dataset, card = generate_dataset("FourTank-v0", "medium", 20, seed=0)
    task = card.task(dataset)
    events = np.asarray(dataset.costs).reshape(-1, dataset.n_costs).sum(axis=0)
    tripped = {name for name, count in zip(task.cost_names, events, strict=True) if count > 0}
    assert tripped and len(tripped) < len(task.cost_names)
    known, how = known_signals(task, card.definitions, None, dataset)
    assert [s.channel for s in known.signals] == list(task.cost_names)  # in the task's order
    assert {s.row for s in known.signals} == {"next"}
    assert list(how) == ["reward", *task.cost_names]
