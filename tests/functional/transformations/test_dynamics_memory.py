"""The memory check: the share of a model's one-step error that earlier steps explain
beyond its own inputs, out of sample by whole episodes: large for a plant with a
transport delay the observation does not show, near 0 where the error is noise."""

from __future__ import annotations

import numpy as np
import pytest

from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.functional.transformations.dynamics_memory import LAGS, memory_table

EPISODES, STEPS = 8, 120


def plant_log(seed: int = 0) -> tuple[Dataset, np.ndarray]:
    """Logged episodes of two features and one action, and the ``[N, 3]`` frames
    after each transition (a feature's next value, its error to be)."""
    rng = np.random.default_rng(seed)
    observations, actions, nexts = [], [], []
    for _ in range(EPISODES):
        frames = rng.normal(size=(STEPS + 1, 3))
        moves = rng.uniform(-1, 1, size=(STEPS, 1))
        observations.append(frames)
        actions.append(moves)
        nexts.append(frames[1:])
    dataset = Dataset.from_arrays(
        observations=np.concatenate(observations).astype(np.float32),
        actions=np.concatenate(actions).astype(np.float32),
        rewards=np.zeros(EPISODES * STEPS, np.float32),
        costs=np.zeros((EPISODES * STEPS, 0), np.float32),
        terminals=np.zeros(EPISODES * STEPS, bool),
        timeouts=np.tile(np.arange(STEPS) == STEPS - 1, EPISODES),
        episode_lengths=np.full(EPISODES, STEPS),
        frame_stack=1,
    )
    return dataset, np.concatenate(actions)[:, 0]


def test_a_delayed_response_is_explained_by_earlier_steps_and_noise_is_not():
    dataset, actions = plant_log()
    rng = np.random.default_rng(1)
    n = dataset.n_transitions
    position = np.tile(np.arange(STEPS), EPISODES)
    two_back = np.where(position >= 2, np.roll(actions, 2), 0.0)
    errors = np.zeros((n, 3))
    # A transport delay: the first feature's error is the action two steps back.
    errors[:, 0] = 2.0 * two_back + 0.3 * rng.normal(size=n)
    # Noise alone: nothing earlier explains it.
    errors[:, 1] = rng.normal(size=n)
    # The third is given (taken from the log): not scored.
    table = memory_table(errors, dataset, ["delayed", "noisy", "setpoint"], [False, False, True])
    delayed, noisy, setpoint = table["rows"]
    assert table["lags"] == LAGS and table["episodes"] == EPISODES
    assert table["transitions"] == EPISODES * (STEPS - LAGS)
    # The delay's share of the variance (2 U(-1, 1): 4 / 3; the noise 0.09), out of
    # sample: nearly all of it.
    assert delayed["explained"] == pytest.approx((4 / 3) / (4 / 3 + 0.09), abs=0.02)
    assert 0.0 <= noisy["explained"] < 0.05
    assert setpoint["explained"] is None


def test_the_own_inputs_are_not_counted_as_memory():
    """An error that depends on the current observation and action (a model biased on
    its own inputs) is explained by them, not by the earlier steps."""
    dataset, actions = plant_log(2)
    rng = np.random.default_rng(3)
    frames = np.asarray(dataset.observations)[np.asarray(dataset.observation_index)]
    errors = np.zeros((dataset.n_transitions, 3))
    errors[:, 0] = 1.5 * frames[:, 1] - actions + 0.2 * rng.normal(size=dataset.n_transitions)
    (own, *_) = memory_table(errors, dataset, ["a", "b", "c"], [False] * 3)["rows"]
    assert own["explained"] < 0.05


def test_too_few_episodes_or_a_constant_error_say_nothing():
    dataset, _ = plant_log()
    one = dataset.select_episodes(np.array([0]))
    errors = np.random.default_rng(0).normal(size=(one.n_transitions, 3))
    rows = memory_table(errors, one, ["a", "b", "c"], [False] * 3)["rows"]
    assert [row["explained"] for row in rows] == [None, None, None]
    constant = memory_table(np.zeros((dataset.n_transitions, 3)), dataset, "abc", [False] * 3)
    assert [row["explained"] for row in constant["rows"]] == [None, None, None]
