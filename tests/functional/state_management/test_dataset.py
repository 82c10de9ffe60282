"""The Dataset PyTree, its indices and its samplers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.environments import make, rollout, uniform_random_policy
from neorl_industrial.functional.state_management import (
    Dataset,
    RewardScaling,
    gather_nstep,
    gather_transitions,
    gather_windows,
    sample,
    sample_nstep,
    sample_windows,
    split_episodes,
    window_starts,
)


def _episode(length, obs_size=3, start=0.0, terminated=False, n_costs=1):
    # Observations count up so every row is identifiable: row t of this episode is start+t.
    observations = start + np.arange(length + 1, dtype=np.float32)[:, None] * np.ones(obs_size)
    return {
        "observations": observations,
        "actions": np.full((length, 2), start, np.float32),
        "rewards": start + np.arange(length, dtype=np.float32),
        "costs": np.ones((length, n_costs), np.float32),
        "terminated": terminated,
    }


@pytest.fixture
def small():
    # Episodes of 3, 1 and 4 steps; the second terminates.
    return Dataset.from_episodes(
        [
            _episode(3, start=0.0),
            _episode(1, start=100.0, terminated=True),
            _episode(4, start=200.0),
        ]
    )


def test_indices_are_precomputed(small):
    assert small.n_transitions == 8 and small.n_episodes == 3
    assert small.observations.shape == (11, 3)  # 8 steps + 3 final observations
    np.testing.assert_array_equal(small.episode_lengths, [3, 1, 4])
    np.testing.assert_array_equal(small.episode_starts, [0, 3, 4])
    np.testing.assert_array_equal(small.episode_id, [0, 0, 0, 1, 2, 2, 2, 2])
    np.testing.assert_array_equal(small.steps_to_end, [3, 2, 1, 1, 4, 3, 2, 1])
    np.testing.assert_array_equal(small.observation_index, [0, 1, 2, 4, 6, 7, 8, 9])
    np.testing.assert_array_equal(small.terminals, [0, 0, 0, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(small.timeouts, [0, 0, 1, 0, 0, 0, 0, 1])
    # Next observations come from the row after, including each episode's final one.
    np.testing.assert_array_equal(
        small.next_observations()[:, 0], [1, 2, 3, 101, 201, 202, 203, 204]
    )
    np.testing.assert_allclose(small.episode_returns(), [3.0, 100.0, 806.0])


def test_one_step_batch_matches_the_rows(small):
    batch = gather_transitions(small, jnp.array([2, 3, 7]), gamma=0.9)
    np.testing.assert_array_equal(batch.observations[:, 0], [2, 100, 203])
    np.testing.assert_array_equal(batch.next_observations[:, 0], [3, 101, 204])
    np.testing.assert_allclose(batch.discounts, [0.9, 0.0, 0.9])  # terminal -> no bootstrap


def test_nstep_returns_are_truncated_at_episode_ends(small):
    gamma = 0.5
    batch = gather_nstep(small, jnp.array([0, 1, 3, 4]), n_step=3, gamma=gamma)
    # Transition 0: rewards 0, 1, 2 -> 0 + 0.5 + 0.5; bootstrap 3 steps ahead.
    # Transition 1: only 2 steps left (1, 2) -> 1 + 1; bootstrap from the final observation.
    # Transition 3: 1 step, terminal -> reward 100, discount 0.
    # Transition 4: rewards 200, 201, 202 -> 200 + 100.5 + 50.5.
    np.testing.assert_allclose(batch.rewards, [1.0, 2.0, 100.0, 351.0])
    np.testing.assert_allclose(batch.discounts, [gamma**3, gamma**2, 0.0, gamma**3])
    np.testing.assert_array_equal(batch.next_observations[:, 0], [3, 3, 101, 203])
    np.testing.assert_allclose(batch.costs[:, 0], [1.75, 1.5, 1.0, 1.75])


def test_nstep_with_one_step_equals_one_step_sampling(small):
    indices = jnp.arange(8)
    one = gather_transitions(small, indices, 0.99)
    n1 = gather_nstep(small, indices, 1, 0.99)
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(n1), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_windows_stay_inside_episodes(small):
    starts = window_starts(small, 3)
    np.testing.assert_array_equal(starts, [0, 4, 5])
    windows = gather_windows(small, starts, 3)
    assert windows.observations.shape == (3, 4, 3)
    np.testing.assert_array_equal(windows.observations[1, :, 0], [200, 201, 202, 203])
    np.testing.assert_array_equal(windows.rewards[2], [201, 202, 203])
    sampled = sample_windows(small, starts, jax.random.PRNGKey(0), 16, 3)
    assert set(np.asarray(sampled.start).tolist()) <= {0, 4, 5}
    with pytest.raises(ValueError, match="length"):
        window_starts(small, 5)


def test_samplers_are_jittable_vmappable_and_uniform(small):
    batch = jax.jit(lambda k: sample(small, k, 4000))(jax.random.PRNGKey(0))
    counts = np.bincount(np.asarray(batch.rewards).astype(int) % 100, minlength=8)
    assert batch.observations.shape == (4000, 3)
    keys = jax.random.split(jax.random.PRNGKey(1), 5)
    many = jax.jit(jax.vmap(lambda k: sample_nstep(small, k, 32, 3)))(keys)
    assert many.rewards.shape == (5, 32)
    assert counts[0] > 300  # every transition is drawn about 500 times in 4000


def test_from_flat_splits_at_flags_and_discontinuities():
    observations = np.arange(10, dtype=np.float32)[:, None]
    next_observations = observations + 1
    next_observations[5] = 50.0  # a cut in the log without a flag
    terminals = np.zeros(10, bool)
    terminals[2] = True
    dataset = Dataset.from_flat(
        observations, np.zeros((10, 1)), np.ones(10), next_observations, terminals
    )
    np.testing.assert_array_equal(dataset.episode_lengths, [3, 3, 4])
    flat = dataset.to_flat()
    np.testing.assert_array_equal(flat["next_observations"], next_observations)
    np.testing.assert_array_equal(flat["observations"], observations)


def test_bad_input_names_the_field_and_row():
    good = _episode(3)
    with pytest.raises(ValueError, match="episode 0, observations"):
        Dataset.from_episodes([{**good, "observations": good["observations"][:-1]}])
    bad = {**good, "rewards": np.array([0.0, np.nan, 1.0])}
    with pytest.raises(ValueError, match="rewards step 1: NaN"):
        Dataset.from_episodes([bad])
    with pytest.raises(ValueError, match="observation size"):
        Dataset.from_episodes([good, _episode(2, obs_size=4)])
    with pytest.raises(ValueError, match="actions has 2 rows"):
        Dataset.from_flat(
            np.zeros((3, 1)), np.zeros((2, 1)), np.zeros(3), np.zeros((3, 1)), np.zeros(3)
        )
    observations = np.zeros((4, 1), np.float32)
    observations[2, 0] = np.inf
    with pytest.raises(ValueError, match="observations at row 2"):
        Dataset.from_flat(observations, np.zeros((4, 1)), np.zeros(4), observations, np.zeros(4))


def test_rollout_datasets_and_memory_overhead():
    env, params = make("IB-v0", horizon=100)
    result = rollout(
        jax.random.PRNGKey(0), env, params, uniform_random_policy(env), 4, 250, record=True
    )
    dataset = Dataset.from_rollout(result.transitions)
    # 250 steps with horizon 100 -> episodes of 100, 100 and a cut-off 50 per environment.
    assert dataset.n_episodes == 12
    np.testing.assert_array_equal(sorted(set(np.asarray(dataset.episode_lengths))), [50, 100])
    batch = gather_transitions(dataset, jnp.arange(dataset.n_transitions))
    np.testing.assert_allclose(
        np.sort(np.asarray(batch.rewards)), np.sort(np.asarray(result.transitions.reward).ravel())
    )
    # Within an episode, the next observation is the following step's observation.
    np.testing.assert_array_equal(batch.next_observations[:99], batch.observations[1:100])
    assert dataset.nbytes() / dataset.raw_nbytes() < 1.1


def test_split_by_episodes_is_seeded_and_complete(small):
    train, validation = split_episodes(small, 1 / 3, seed=0)
    again, _ = split_episodes(small, 1 / 3, seed=0)
    assert train.n_episodes == 2 and validation.n_episodes == 1
    assert train.n_transitions + validation.n_transitions == small.n_transitions
    np.testing.assert_array_equal(train.rewards, again.rewards)
    with pytest.raises(ValueError, match="validation_fraction"):
        split_episodes(small, 1.5)
    with pytest.raises(ValueError, match="empty side"):
        split_episodes(small, 0.01)


def test_reward_scalings(small):
    rewards = np.asarray(small.rewards, np.float64)
    std = RewardScaling.fit(small, "std")
    np.testing.assert_allclose(np.std(std.apply(small).rewards), 1.0, rtol=1e-5)
    np.testing.assert_allclose(std.apply(small).rewards, rewards / rewards.std(), rtol=1e-5)
    standard = RewardScaling.fit(small, "standardize").apply(small).rewards
    np.testing.assert_allclose([np.mean(standard), np.std(standard)], [0.0, 1.0], atol=1e-5)
    span = RewardScaling.fit(small, "return_range")
    returns = np.asarray(span.apply(small).episode_returns())
    np.testing.assert_allclose(returns.max() - returns.min(), 1000.0, rtol=1e-5)
    assert RewardScaling.fit(small, "none").apply(small) is small
    assert span.to_dict()["kind"] == "return_range"
    with pytest.raises(ValueError, match="reward_scaling: expected one of"):
        RewardScaling.fit(small, "max")
    flat = small.replace(rewards=jnp.full_like(small.rewards, 2.0))
    with pytest.raises(ValueError, match="no spread to scale by; use reward_scaling 'none'"):
        RewardScaling.fit(flat, "std")
    # Every episode returns 1: nothing to scale the returns' range by.
    same_returns = small.replace(rewards=1.0 / small.episode_lengths[small.episode_id])
    with pytest.raises(ValueError, match="no spread of returns"):
        RewardScaling.fit(same_returns, "return_range")
