"""Stacked observations stored once: frames found in the data, gathered at sampling time,
the same batches as whole observations, in memory, on disk and from memory-mapped files."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.environments import make, rollout, uniform_random_policy
from neorl_industrial.core.environments.history import frame_of, stacked_names
from neorl_industrial.functional.state_management import (
    Dataset,
    gather_nstep,
    gather_transitions,
    gather_windows,
    sample,
    split_episodes,
)
from neorl_industrial.functional.state_management.dataset import find_frame_stack
from neorl_industrial.integration.datasets import (
    DatasetFormatError,
    MemmapSampler,
    load_native,
    save_native,
)
from neorl_industrial.integration.datasets.arrays import dataset_arrays

FRAME, STACK = 2, 4
FIELDS = ("observations", "actions", "rewards", "costs", "next_observations", "discounts")


def _stacked_episode(rng, length, frame=FRAME, stack=STACK, terminated=False):
    """An episode whose observation stacks the last ``stack`` frames, newest first (the
    first observation's history is arbitrary, as a plant's buffer before logging)."""
    frames = rng.normal(size=(length + stack, frame)).astype(np.float32)
    observations = np.stack([frames[t : t + stack][::-1].reshape(-1) for t in range(length + 1)])
    return {
        "observations": observations,
        "actions": rng.normal(size=(length, 3)).astype(np.float32),
        "rewards": rng.normal(size=length).astype(np.float32),
        "costs": rng.uniform(size=(length, 2)).astype(np.float32),
        "terminated": terminated,
    }


@pytest.fixture(scope="module")
def episodes():
    rng = np.random.default_rng(0)
    return [_stacked_episode(rng, length, terminated=length == 1) for length in (5, 1, 9, 3, 12)]


@pytest.fixture(scope="module")
def pair(episodes):
    """The same data stored as frames and as whole observations."""
    stacked = Dataset.from_episodes(episodes)
    whole = dataset_arrays(stacked, frames=False)
    lengths = whole.pop("episode_lengths")
    plain = Dataset.from_arrays(**whole, episode_lengths=lengths, frame_stack=1)
    return stacked, plain


def _assert_same(actual, expected, fields=FIELDS):
    for field in fields:
        np.testing.assert_array_equal(
            np.asarray(getattr(actual, field)), np.asarray(getattr(expected, field)), field
        )


def test_frames_are_found_and_stored_once(pair):
    stacked, plain = pair
    assert (stacked.frame_stack, stacked.frame_size) == (STACK, FRAME)
    assert stacked.observation_size == plain.observation_size == STACK * FRAME
    # N + E H rows of one frame instead of N + E rows of H frames.
    n, e = stacked.n_transitions, stacked.n_episodes
    assert stacked.observations.shape == (n + e * STACK, FRAME)
    assert plain.frame_stack == 1 and plain.observations.shape == (n + e, STACK * FRAME)


def test_every_sampler_gives_the_same_batches_as_whole_observations(pair):
    stacked, plain = pair
    every = jnp.arange(stacked.n_transitions)
    _assert_same(gather_transitions(stacked, every), gather_transitions(plain, every))
    _assert_same(gather_nstep(stacked, every, 3, 0.9), gather_nstep(plain, every, 3, 0.9))
    starts = jnp.asarray([0, 6, 7, 15])  # windows of 2 inside episodes
    _assert_same(
        gather_windows(stacked, starts, 2), gather_windows(plain, starts, 2), ("observations",)
    )
    # The gather runs inside the compiled, vmapped sampler.
    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    sampled = jax.jit(jax.vmap(lambda k: sample(stacked, k, 16)))(keys)
    expected = jax.jit(jax.vmap(lambda k: sample(plain, k, 16)))(keys)
    _assert_same(sampled, expected)


def test_views_statistics_and_episode_selection_agree(pair, episodes):
    stacked, plain = pair
    np.testing.assert_array_equal(stacked.all_observations(), plain.all_observations())
    np.testing.assert_array_equal(
        stacked.initial_observations(), np.stack([ep["observations"][0] for ep in episodes])
    )
    moments = zip(stacked.observation_moments(), plain.observation_moments(), strict=True)
    for ours, theirs in moments:
        np.testing.assert_allclose(ours, theirs, rtol=1e-12)
    np.testing.assert_array_equal(
        plain.observation_moments()[0], np.asarray(plain.all_observations(), np.float64).mean(0)
    )
    for field, values in stacked.to_flat().items():
        np.testing.assert_array_equal(values, plain.to_flat()[field], field)
    train, validation = split_episodes(stacked, 0.4, seed=1)
    assert train.frame_stack == validation.frame_stack == STACK
    assert train.n_transitions + validation.n_transitions == stacked.n_transitions
    np.testing.assert_array_equal(
        stacked.select_episodes(np.array([3])).all_observations(),
        episodes[3]["observations"],
    )


def test_the_industrial_benchmark_history_is_thirty_frames_of_six():
    env, params = make("IB-v0", horizon=50)
    result = rollout(
        jax.random.PRNGKey(0), env, params, uniform_random_policy(env), 2, 50, record=True
    )
    dataset = Dataset.from_rollout(result.transitions)
    assert (dataset.frame_stack, dataset.frame_size) == (30, 6)
    batch = gather_transitions(dataset, jnp.arange(dataset.n_transitions))
    recorded = np.asarray(result.transitions.observation).transpose(1, 0, 2).reshape(-1, 180)
    np.testing.assert_array_equal(batch.observations, recorded)
    # 100 transitions: 160 frames of 6 values against 102 observations of 180.
    assert dataset.observations.nbytes * 19 < 102 * 180 * 4


def test_data_without_stacking_stays_whole():
    rng = np.random.default_rng(2)
    episode = {
        "observations": rng.normal(size=(11, 6)),
        "actions": rng.normal(size=(10, 1)),
        "rewards": rng.normal(size=10),
    }
    dataset = Dataset.from_episodes([episode])
    assert dataset.frame_stack == 1 and dataset.observations.shape == (11, 6)
    # One shifted pair is not enough: every pair inside every episode must shift.
    almost = _stacked_episode(rng, 6)
    almost["observations"][4, 0] += 1.0
    assert find_frame_stack(almost["observations"], [6]) == 1
    # Episode boundaries are not compared: separately stacked episodes still stack.
    two = [_stacked_episode(rng, 4), _stacked_episode(rng, 4)]
    assert find_frame_stack(np.concatenate([ep["observations"] for ep in two]), [4, 4]) == STACK


def test_native_files_hold_frames_and_memmap_batches_match(tmp_path, pair):
    stacked, plain = pair
    card = save_native(stacked, tmp_path / "d")
    assert card.sizes.frame_stack == STACK
    assert np.load(tmp_path / "d" / "observations.npy").shape == stacked.observations.shape
    loaded, _ = load_native(tmp_path / "d", mmap=True)
    assert loaded.frame_stack == STACK
    every = jnp.arange(stacked.n_transitions)
    _assert_same(gather_transitions(loaded, every), gather_transitions(plain, every))
    indices = np.arange(stacked.n_transitions)
    for n_step in (1, 3):
        with MemmapSampler(tmp_path / "d", batch_size=4, n_step=n_step, gamma=0.9) as sampler:
            batch = sampler.gather(indices)
        expected = (
            gather_transitions(plain, every, 0.9)
            if n_step == 1
            else gather_nstep(plain, every, n_step, 0.9)
        )
        for field in FIELDS:
            np.testing.assert_allclose(
                np.asarray(getattr(batch, field)),
                np.asarray(getattr(expected, field)),
                rtol=1e-6,
                err_msg=field,
            )


def test_whole_observations_saved_by_an_older_writer_are_stacked_on_load(tmp_path, pair):
    stacked, plain = pair
    save_native(plain, tmp_path / "whole")
    assert np.load(tmp_path / "whole" / "observations.npy").shape[1] == STACK * FRAME
    loaded, card = load_native(tmp_path / "whole")
    assert card.sizes.frame_stack == 1 and loaded.frame_stack == STACK
    _assert_same(
        gather_transitions(loaded, jnp.arange(5)), gather_transitions(stacked, jnp.arange(5))
    )


def test_a_card_whose_frames_disagree_with_the_file_is_named(tmp_path, pair):
    stacked, _ = pair
    save_native(stacked, tmp_path / "d")
    card_path = tmp_path / "d" / "dataset.json"
    card = json.loads(card_path.read_text())
    card["sizes"]["frame_stack"] = 3
    card_path.write_text(json.dumps(card))
    with pytest.raises(DatasetFormatError, match=r"observations\.npy.*3 frame\(s\) of 2 values"):
        load_native(tmp_path / "d", verify=False)
    card["sizes"]["frame_stack"] = 0
    card_path.write_text(json.dumps(card))
    with pytest.raises(DatasetFormatError, match="frame_stack"):
        load_native(tmp_path / "d", verify=False)


def test_from_episodes_with_a_history_stacks_rows_and_pads_each_start():
    rows = [np.arange(8.0).reshape(4, 2), 100 + np.arange(6.0).reshape(3, 2)]
    episodes = [
        {"observations": r, "actions": np.zeros((len(r) - 1, 1)), "rewards": np.zeros(len(r) - 1)}
        for r in rows
    ]
    dataset = Dataset.from_episodes(episodes, history=2)
    assert dataset.frame_stack == 2
    stacked = [np.concatenate([r[t], r[max(t - 1, 0)]]) for r in rows for t in range(len(r))]
    np.testing.assert_array_equal(dataset.all_observations(), stacked)
    # The same observations given whole are found to stack two frames and stored alike.
    whole = [
        {
            **e,
            "observations": np.stack(
                [np.concatenate([r[t], r[max(t - 1, 0)]]) for t in range(len(r))]
            ),
        }
        for e, r in zip(episodes, rows, strict=True)
    ]
    found = Dataset.from_episodes(whole)
    assert found.frame_stack == 2
    np.testing.assert_array_equal(found.observations, dataset.observations)
    # Cut to the newest frame: the rows themselves, episode by episode.
    newest = dataset.newest_frames()
    assert newest.frame_stack == 1
    np.testing.assert_array_equal(newest.all_observations(), np.concatenate(rows))
    np.testing.assert_array_equal(newest.actions, dataset.actions)
    assert newest.episode_lengths.tolist() == dataset.episode_lengths.tolist()
    assert found.newest_frames().frame_stack == 1 and newest.newest_frames() is newest
    for history in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="history must be a whole number >= 1"):
            Dataset.from_episodes(episodes, history=history)


def test_stacked_names_and_their_frame():
    frame = ("level", "flow")
    names = stacked_names(frame, 3)
    assert names == ("level", "flow", "level@t-1", "flow@t-1", "level@t-2", "flow@t-2")
    assert frame_of(names) == (frame, 3)
    assert frame_of(frame) == (frame, 1)
    # Names that only look alike stack nothing.
    assert frame_of(("a", "a@t-2")) == (("a", "a@t-2"), 1)
    assert frame_of(("a", "b", "a@t-1", "c@t-1")) == (("a", "b", "a@t-1", "c@t-1"), 1)
