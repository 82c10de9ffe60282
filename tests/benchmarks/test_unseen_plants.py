"""The study plants: each one's log imports with the documented schema into the dataset
its simulator describes, the operators' logged return is their closed-loop truth, and the
truth ranks a clearly better controller above the operators (and an exported policy is
run as the server runs it)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.plants import PLANTS, make_plant, write_plant
from benchmarks.plants.heater import feedforward_controller
from benchmarks.plants.truth import PlantTruth, Starts, episode_truth, summarize


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    from neorl_industrial.integration.datasets import load_plant_log

    out = {}
    for name in PLANTS:
        folder = tmp_path_factory.mktemp(name)
        csv = write_plant(name, folder, seed=3, episodes=8)
        out[name] = (folder, *load_plant_log(csv, folder / "schema.yaml"))
    return out


@pytest.mark.parametrize("name", PLANTS)
def test_the_log_imports_with_the_documented_schema(name, logs):
    import jax

    plant = make_plant(name)
    folder, dataset, card = logs[name]
    task = card.task(dataset)
    assert dataset.n_episodes == 8 and dataset.n_transitions == 8 * plant.episode_steps
    assert list(task.observation_names) == plant.observation_names
    assert list(task.action_names) == plant.action_names
    assert task.cost_limits == {cost.name: cost.limit for cost in plant.costs}
    # The measured disturbances (the heater's inlet and feed, the pH plant's effluent
    # flow) are marked as no action moves them; the compressor observes none.
    assert task.exogenous == tuple(c.name for c in plant.observations if c.exogenous)
    assert bool(task.exogenous) == (name != "gas-compressor")
    # The dataset's rewards are the simulator's: the schema's expression on the next row.
    truth = PlantTruth(plant, folder)
    states = {k: v[0] for k, v in truth.saved["states"].items()}
    assert truth.saved["actions"].shape == (8, plant.episode_steps + 1, len(plant.actions))
    assert states[next(iter(states))].shape[0] == plant.episode_steps + 1
    observations = np.asarray(jax.device_get(dataset.observations))
    assert np.isfinite(observations).all()
    low = np.asarray([c.low for c in plant.observations])
    high = np.asarray([c.high for c in plant.observations])
    assert ((observations >= low) & (observations <= high)).all()
    if plant.flags:  # the alarm flag is the cost column itself: 0 or 1 a step
        costs = np.asarray(jax.device_get(dataset.costs))
        assert set(np.unique(costs)) <= {0.0, 1.0}


@pytest.mark.parametrize("name", PLANTS)
def test_the_operators_logged_return_is_their_closed_loop_truth(name, logs):
    import jax

    plant = make_plant(name)
    folder, dataset, _ = logs[name]
    logged = np.asarray(jax.device_get(dataset.episode_returns()), np.float64)
    runs = episode_truth(plant, PlantTruth(plant, folder).operators(), episodes=64, seed=5)
    # Different episodes of the same operators: equal within three standard errors.
    error = np.sqrt(logged.var(ddof=1) / len(logged) + runs.returns.var(ddof=1) / 64)
    assert abs(logged.mean() - runs.returns.mean()) < 3.0 * error
    # From the logged rows themselves (state and operators' memory restored mid-episode),
    # the rest of each episode: the logged discounted returns again.
    rewards = np.asarray(jax.device_get(dataset.rewards), np.float64)
    first = np.asarray(jax.device_get(dataset.episode_starts))
    row, length = 60, plant.episode_steps - 60
    starts = Starts(np.arange(8), np.full(8, row), np.full(8, length), np.arange(8))
    truth = PlantTruth(plant, folder).at_starts(
        PlantTruth(plant, folder).operators(), starts, discount=0.99, replicates=16
    )
    weights = 0.99 ** np.arange(length)
    logged_rest = np.asarray([rewards[s + row : s + row + length] @ weights for s in first])
    per_start = truth.mean(axis=0)
    spread = truth.std(axis=0, ddof=1)
    assert np.mean(np.abs(logged_rest - per_start) <= 3.0 * spread + 1e-9) >= 0.75


def test_the_truth_ranks_a_clearly_better_controller_above_the_operators(logs):
    plant = make_plant("fired-heater")
    folder, _, _ = logs["fired-heater"]
    truth = PlantTruth(plant, folder)
    operators = truth.episodes(truth.operators(), episodes=50)
    better = truth.episodes(feedforward_controller(plant), episodes=50)
    assert better["return"]["lower"] > operators["return"]["upper"]
    # Clearly better: by at least a quarter of the operators' |return|, cost within half.
    assert better["return"]["value"] - operators["return"]["value"] >= 0.25 * abs(
        operators["return"]["value"]
    )
    assert better["normalized_cost"] <= 0.5
    starts = Starts(np.arange(4), np.asarray([0, 30, 90, 150]), np.full(4, 80), np.arange(4))
    gain = truth.improvement(feedforward_controller(plant), starts, discount=0.99, replicates=8)
    assert gain["improvement"]["lower"] > 0.0
    assert gain["improvement"]["value"] == pytest.approx(
        gain["value"]["value"] - gain["operators"]["value"]
    )
    # The operators against themselves: the paired difference is nil.
    same = truth.improvement(truth.operators(), starts, discount=0.99, replicates=4)
    assert same["improvement"]["value"] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.slow  # trains, exports and loads a policy (about 20 s)
def test_an_exported_policy_runs_as_the_server_runs_it(logs, tmp_path):
    from neorl_industrial.wrappers.agents import Agent

    plant = make_plant("fired-heater")
    folder, dataset, card = logs["fired-heater"]
    agent = Agent(
        "bc", task=card.task(dataset), constraints=folder / "constraints.yaml", hidden=(8,)
    )
    agent.fit(dataset, updates=20, chunk=20, seeds=[0], evaluate=False)
    path = agent.export(tmp_path / "policy")
    truth = PlantTruth(plant, folder)
    runs = episode_truth(plant, truth.controller(path), episodes=4, seed=1)
    own = episode_truth(
        plant,
        truth.controller(lambda obs, prev: agent.predict(obs, prev)),
        episodes=4,
        seed=1,
    )
    # The artifact (shield and server check in the loop) acts as the agent's shielded act.
    np.testing.assert_allclose(runs.returns, own.returns, rtol=1e-3)
    assert summarize(runs, truth.limits)["episodes"] == 4
    with pytest.raises(ValueError, match="not ph-neutraliser's"):
        PlantTruth(make_plant("ph-neutraliser"), logs["ph-neutraliser"][0]).controller(path)


def test_unknown_plants_and_short_logs_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="unknown 'boiler'"):
        make_plant("boiler")
    with pytest.raises(ValueError, match="episodes: expected at least 4, got 2"):
        write_plant("fired-heater", tmp_path, episodes=2)


def test_a_policy_of_the_last_rows_is_fed_the_logged_rows_at_each_start(tmp_path):
    """A log written with ``history: 3``: the import stacks the rows, and the truth
    feeds a policy the same stacked observation, at a start mid-episode from the logged
    rows before it, at an episode's start the first row repeated (as the import pads)."""
    import jax

    from neorl_industrial.integration.datasets import load_plant_log

    plant = make_plant("fired-heater")
    csv = write_plant("fired-heater", tmp_path, seed=3, episodes=4, history=3)
    dataset, card = load_plant_log(csv, tmp_path / "schema.yaml")
    assert dataset.frame_stack == 3 and len(card.task(dataset).observation_names) == 12
    truth = PlantTruth(plant, tmp_path)
    assert truth.history == 3
    seen = []

    def policy(observations, previous):
        seen.append(np.asarray(observations).copy())
        return np.full((len(observations), 1), 40.0)

    starts = Starts(np.asarray([1, 2]), np.asarray([0, 57]), np.full(2, 3), np.arange(2))
    truth.runs_at_starts(policy, starts, discount=0.99, replicates=1)
    first = seen[0]
    stacked = np.asarray(jax.device_get(dataset.transition_observations()))
    steps = plant.episode_steps
    # Episode 1's first row and episode 2's row 57: the rows before as the dataset holds
    # them; the start's own row the simulator's state observed afresh (its sensor noise).
    for observation, row in zip(first, (1 * steps + 0, 2 * steps + 57), strict=True):
        np.testing.assert_allclose(observation[4:], stacked[row, 4:], rtol=1e-6)
        np.testing.assert_allclose(observation[:4], stacked[row, :4], rtol=1e-2)
    # The next step's observation: the new row, then the two before it.
    np.testing.assert_array_equal(seen[1][:, 4:], first[:, :8])
