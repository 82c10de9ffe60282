"""Fitting a dynamics ensemble over members and seeds: it learns a known linear system,
its members differ, elites are the best held-out members, calibration is counted right."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.models import DynamicsConfig, DynamicsLayout, make_dynamics
from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.functional.transformations.dynamics import (
    bootstrap_indices,
    data_statistics,
    fit_ensemble,
    holdout_batch,
    select_elites,
    window_batch,
)
from neorl_industrial.functional.transformations.dynamics_fidelity import (
    coverage,
    fidelity_table,
    open_loop,
    open_loop_windows,
)
from neorl_industrial.functional.transformations.offline import Schedule

A = np.asarray([[0.9, 0.1], [0.0, 0.8]])
B = np.asarray([[0.0], [0.5]])
NOISE = 0.01


def linear_dataset(episodes: int, steps: int, seed: int) -> Dataset:
    """``x' = A x + B u + noise`` under uniform random actions; reward ``-|x_0|`` and one
    cost ``max(x_1 - 1, 0)`` of the next state."""
    rng = np.random.default_rng(seed)
    data = []
    for _ in range(episodes):
        x = rng.normal(size=2)
        xs, us = [x], []
        for _ in range(steps):
            u = rng.uniform(-1, 1, size=1)
            x = A @ x + B @ u + NOISE * rng.normal(size=2)
            xs.append(x)
            us.append(u)
        xs = np.asarray(xs, np.float32)
        data.append(
            {
                "observations": xs,
                "actions": np.asarray(us, np.float32),
                "rewards": -np.abs(xs[:-1, 0]),
                "costs": np.maximum(xs[1:, 1:2] - 1.0, 0.0),
            }
        )
    return Dataset.from_episodes(data)


@pytest.fixture(scope="module")
def fitted():
    train, holdout = linear_dataset(24, 40, 0), linear_dataset(6, 40, 1)
    layout = DynamicsLayout(observation_size=2, frame_size=2, action_size=1, n_costs=1)
    config = DynamicsConfig(hidden=(32, 32), n_members=3, n_elites=2, learning_rate=3e-3)
    dynamics = make_dynamics(config, layout)
    stats = data_statistics(train, dynamics, [-1.0], [1.0])
    result = fit_ensemble(
        dynamics,
        stats,
        train,
        holdout,
        schedule=Schedule(n_updates=1200, chunk_updates=400, batch_size=128),
        seeds=(0, 1),
    )
    return dynamics, stats, result, holdout


def _first_seed_open_loop(dynamics, stats, result, holdout, samples):
    """The first seed's elites (2) open loop over 10 steps from 40 held-out windows:
    ``(params, starts, run, {1: {name: rmse}, 10: {name: rmse}})``."""
    params, _ = select_elites(result.state, stats, 2)
    one_seed = params.replace(networks=jax.tree.map(lambda leaf: leaf[0], params.networks))
    starts = open_loop_windows(holdout, 10, 40)
    key = jax.random.PRNGKey(0)
    run = open_loop(dynamics, one_seed, holdout, starts, 10, key, n_samples=samples)
    rows = fidelity_table(run, ["x0", "x1"], [1.0, 1.0], ["reward", "cost"], [1.0, 1.0], (1, 10))
    errors = {step: {r["name"]: r["rmse"] for r in rows if r["step"] == step} for step in (1, 10)}
    return one_seed, starts, run, errors


def test_the_ensemble_learns_a_linear_system(fitted):
    dynamics, stats, result, holdout = fitted
    one_seed, starts, run, errors = _first_seed_open_loop(dynamics, stats, result, holdout, 4)
    # The noise is 0.01; the states spread over about 1: the model is within a few noises.
    assert errors[1]["x0"] < 0.05 and errors[1]["x1"] < 0.05
    assert errors[1]["reward"] < 0.06
    assert errors[10]["x0"] < 0.15
    # The truth the model is held to is the logged next state, also in the windows.
    np.testing.assert_allclose(run.truth[:, 0], np.asarray(holdout.next_observations())[starts])
    # Members and seeds differ (initialization and bootstrap), all of them learned.
    mse = np.asarray(result.state.best_score)
    assert mse.shape == (2, 3) and np.all(mse < 0.1)
    first = jax.tree.leaves(result.state.best_networks)[0]
    assert not np.allclose(first[0, 0], first[0, 1]) and not np.allclose(first[0, 0], first[1, 0])
    observation, action = jnp.asarray([0.5, -0.3]), jnp.asarray([0.2])
    out = dynamics.step(one_seed, observation, action, jax.random.PRNGKey(0), None, True)
    assert 0.0 < float(jnp.max(out.member_std)) < 0.05
    np.testing.assert_allclose(
        out.next_observation, A @ np.asarray([0.5, -0.3]) + B @ [0.2], atol=0.05
    )


def test_elites_are_the_best_held_out_members(fitted):
    _, stats, result, _ = fitted
    params, elites = select_elites(result.state, stats, 2)
    scores = np.asarray(result.state.best_score)
    for seed in range(2):
        assert set(elites[seed]) == set(np.argsort(scores[seed])[:2])
        chosen = jax.tree.leaves(params.networks)[0][seed, 0]
        best = jax.tree.leaves(result.state.best_networks)[0][seed, elites[seed][0]]
        np.testing.assert_array_equal(chosen, best)
    assert result.history[-1]["updates"] == 1200 and len(result.history) == 3


def test_coverage_counts_values_inside_the_central_interval():
    # Samples 0..100: the 90 % interval is [5, 95]; 4 of these 6 values lie inside it.
    samples = np.arange(101, dtype=np.float64)[:, None].repeat(6, axis=1)
    truth = np.asarray([4.0, 5.0, 50.0, 95.0, 96.0, 70.0])
    inside = coverage(samples, truth, 0.9)
    assert inside.tolist() == [False, True, True, True, False, True]
    # Calibrated Gaussian samples hold about 90 % of draws of the same law, far fewer of a
    # law three times wider; numpy and jax agree.
    rng = np.random.default_rng(0)
    samples = rng.normal(size=(400, 3000))
    calibrated = coverage(samples, rng.normal(size=3000), 0.9).mean()
    assert calibrated == pytest.approx(0.9, abs=0.02)
    assert coverage(samples, 3.0 * rng.normal(size=3000), 0.9).mean() < 0.5
    truth = rng.normal(size=3000)
    np.testing.assert_array_equal(
        np.asarray(coverage(jnp.asarray(samples), jnp.asarray(truth), 0.9)),
        coverage(samples.astype(np.float32), truth.astype(np.float32), 0.9),
    )
    with pytest.raises(ValueError, match="level"):
        coverage(samples, truth, 1.5)


def test_fidelity_table_errors_and_coverage_per_feature_and_step():
    from neorl_industrial.functional.transformations.dynamics_fidelity import OpenLoop

    truth = np.zeros((4, 3, 1))
    point = np.full((4, 3, 1), 2.0)  # off by 2 everywhere
    particles = np.linspace(-1, 1, 21)[None, :, None, None].repeat(4, 0).repeat(3, 2)
    run = OpenLoop(
        truth=truth,
        point=point,
        particles=particles,
        signal_truth=np.zeros((4, 3, 0)),
        signal_point=np.zeros((4, 3, 0)),
        signal_particles=np.zeros((4, 21, 3, 0)),
        valid=np.asarray([[True] * 3] * 3 + [[True, False, False]]),
        starts=np.arange(4),
    )
    run.point[3, 1:] = 100.0  # past the end of its episode: not counted
    run.truth[0, 0] = 3.0  # outside [-0.9, 0.9]
    rows = fidelity_table(run, ["level"], [4.0], [], [], (1, 3))
    assert [(row["step"], row["windows"]) for row in rows] == [(1, 4), (3, 3)]
    assert rows[0]["rmse"] == pytest.approx(np.sqrt((1.0 + 3 * 4.0) / 4))
    assert rows[1]["rmse"] == pytest.approx(2.0) and rows[1]["relative_rmse"] == pytest.approx(0.5)
    assert rows[0]["coverage"] == 0.75 and rows[1]["coverage"] == 1.0
    run.valid[:, 2] = False
    assert fidelity_table(run, ["level"], [4.0], [], [], (3,))[0]["rmse"] is None
    constant = fidelity_table(run, ["level"], [0.0], [], [], (1,))
    assert constant[0]["relative_rmse"] is None


def test_fit_refuses_bad_settings_by_name(fitted):
    dynamics, stats, _, holdout = fitted
    with pytest.raises(ValueError, match="chunk_updates"):
        fit_ensemble(dynamics, stats, holdout, holdout, schedule=Schedule(1200, chunk_updates=0))
    with pytest.raises(ValueError, match="patience"):
        fit_ensemble(dynamics, stats, holdout, holdout, patience=0)
    with pytest.raises(ValueError, match="seeds"):
        fit_ensemble(dynamics, stats, holdout, holdout, seeds=())
    with pytest.raises(ValueError, match="window_steps"):
        fit_ensemble(dynamics, stats, holdout, holdout, window_steps=0)


def test_windows_are_consecutive_steps_cut_at_their_episode_end(fitted):
    dynamics = fitted[0]
    data = linear_dataset(3, 5, 2)  # transitions 0-4, 5-9, 10-14
    batch, valid = window_batch(data, dynamics, jnp.asarray([0, 3, 9, 14]), 4)
    assert batch.observations.shape == (4, 4, 2) and batch.targets.shape == (4, 4, 4)
    np.testing.assert_array_equal(
        np.asarray(valid),
        [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]],
    )
    observations = np.asarray(data.transition_observations())
    np.testing.assert_array_equal(np.asarray(batch.observations[0]), observations[0:4])
    np.testing.assert_array_equal(np.asarray(batch.observations[1, :2]), observations[3:5])
    np.testing.assert_array_equal(np.asarray(batch.actions[2, 0]), np.asarray(data.actions[9]))


def test_a_fit_on_windows_of_its_own_predictions_learns_the_system(fitted):
    dynamics, stats, _, holdout = fitted
    train = linear_dataset(24, 40, 0)
    result = fit_ensemble(
        dynamics,
        stats,
        train,
        holdout,
        schedule=Schedule(n_updates=600, chunk_updates=300, batch_size=64),
        window_steps=5,
    )
    errors = _first_seed_open_loop(dynamics, stats, result, holdout, 2)[-1]
    assert errors[10]["x0"] < 0.15 and errors[10]["x1"] < 0.15
    assert result.history[-1]["updates"] == 600
    # Best parameters and elites are scored as they were trained: over held-out windows.
    held = holdout_batch(holdout, dynamics, window_steps=5)
    assert held[0].observations.shape[1] == 5
    best = jax.tree.map(lambda leaf: leaf[0, 1], result.state.best_networks)
    _, metrics = dynamics.window_loss(best, stats, *held)
    assert float(metrics["mse"]) == pytest.approx(float(result.state.best_score[0, 1]), rel=1e-4)


def test_members_train_on_bootstrapped_episodes_not_transitions():
    # 8 episodes of 25 transitions: each member draws only from the episodes it resampled,
    # an episode drawn k times weighing k times; members see different episode sets.
    episode_id = np.repeat(np.arange(8), 25)
    indices = np.asarray(bootstrap_indices(episode_id, 2, 5, seed=3))
    assert indices.shape == (2, 5, 200) and indices.min() >= 0 and indices.max() < 200
    seen = [frozenset(np.unique(episode_id[member]).tolist()) for member in indices.reshape(10, -1)]
    # a bootstrap of 8 episodes leaves out about 8 (1 - 1/8)^8 = 2.6 of them per member
    assert all(len(episodes) < 8 for episodes in seen)
    assert len(set(seen)) > 1
    # the same seed draws the same indices; a single episode is a bootstrap of its steps
    assert np.array_equal(indices, np.asarray(bootstrap_indices(episode_id, 2, 5, seed=3)))
    single = np.asarray(bootstrap_indices(np.zeros(50, np.int32), 1, 3, seed=0))
    assert single.shape == (1, 3, 50) and len(np.unique(single[0, 0])) < 50
