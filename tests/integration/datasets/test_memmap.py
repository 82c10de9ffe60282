"""MemmapSampler: same batches as the in-memory gathers, and a prefetch thread that stops."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.functional.state_management import gather_nstep, gather_transitions
from neorl_industrial.integration.datasets import MemmapSampler, save_native
from tests.integration.datasets import make_dataset

FIELDS = (
    "observations",
    "actions",
    "rewards",
    "costs",
    "next_observations",
    "terminals",
    "discounts",
)


@pytest.fixture
def stored(tmp_path):
    dataset = make_dataset((5, 3, 7, 1, 4))
    save_native(dataset, tmp_path / "d")
    return dataset, tmp_path / "d"


def _assert_batches_equal(actual, expected):
    for field in FIELDS:
        np.testing.assert_allclose(
            np.asarray(getattr(actual, field)),
            np.asarray(getattr(expected, field)),
            rtol=1e-6,
            atol=1e-7,
            err_msg=field,
        )


def test_one_step_batch_equals_the_in_memory_gather(stored):
    dataset, path = stored
    indices = np.arange(dataset.n_transitions)  # every transition, episode ends included
    with MemmapSampler(path, batch_size=4, gamma=0.9) as sampler:
        batch = sampler.gather(indices)
    _assert_batches_equal(batch, gather_transitions(dataset, jnp.asarray(indices), 0.9))
    assert batch.terminals.sum() == 1  # the one terminal step


@pytest.mark.parametrize("n_step", [2, 3, 8])
def test_n_step_batch_equals_the_in_memory_gather(stored, n_step):
    dataset, path = stored
    indices = np.arange(dataset.n_transitions)
    with MemmapSampler(path, batch_size=4, n_step=n_step, gamma=0.9) as sampler:
        batch = sampler.gather(indices)
    _assert_batches_equal(batch, gather_nstep(dataset, jnp.asarray(indices), n_step, 0.9))


def test_sampled_indices_are_sorted_uniform_and_reproducible(stored):
    _, path = stored
    with MemmapSampler(path, batch_size=2000, seed=3) as first:
        indices = first.sample_indices()
    with MemmapSampler(path, batch_size=2000, seed=3) as second:
        assert np.array_equal(second.sample_indices(), indices)
    assert np.all(np.diff(indices) >= 0)
    counts = np.bincount(indices, minlength=20)
    assert counts.min() > 50 and counts.max() < 150  # 100 expected per transition


def test_iteration_prefetches_device_batches_and_the_thread_stops(stored):
    dataset, path = stored
    sampler = MemmapSampler(path, batch_size=16, n_step=2, seed=1, prefetch=3)
    expected_sampler = MemmapSampler(path, batch_size=16, n_step=2, seed=1)
    batches = [batch for _, batch in zip(range(5), sampler, strict=False)]
    assert sampler.running
    for batch in batches:
        assert isinstance(batch.observations, jax.Array)
        assert batch.observations.shape == (16, dataset.observation_size)
        assert batch.costs.shape == (16, dataset.n_costs)
        # The thread samples in order, so the batches are those of a plain sampler.
        _assert_batches_equal(batch, expected_sampler.sample())
    sampler.close()
    assert not sampler.running
    assert not any(t.name == "memmap-prefetch" and t.is_alive() for t in threading.enumerate())
    with pytest.raises(StopIteration):
        next(sampler)
    sampler.close()  # idempotent


def test_context_manager_stops_a_thread_blocked_on_a_full_queue(stored):
    _, path = stored
    with MemmapSampler(path, batch_size=8, prefetch=1) as sampler:
        next(sampler)
        # Let the producer fill the queue and block on it.
        for _ in range(100):
            if sampler._queue.full():
                break
            threading.Event().wait(0.01)
        assert sampler.running
    assert not sampler.running


def test_an_error_in_the_thread_reaches_the_consumer(stored, monkeypatch):
    _, path = stored
    sampler = MemmapSampler(path, batch_size=8)

    def broken_sample():
        raise OSError("disk gone")

    monkeypatch.setattr(sampler, "sample", broken_sample)
    with pytest.raises(OSError, match="disk gone"):
        next(sampler)
    assert not sampler.running


def test_bad_arguments_are_rejected(stored):
    _, path = stored
    with pytest.raises(ValueError, match="batch_size, n_step and prefetch must be >= 1"):
        MemmapSampler(path, batch_size=0)
