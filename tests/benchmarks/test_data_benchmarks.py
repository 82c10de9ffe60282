"""Tests of the pieces of the data sampling and data generation benchmarks.

Fast: the benchmarks themselves are not run; their baselines, fused samplers, layouts and
target evaluation are checked on small synthetic data.
"""

from __future__ import annotations

import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import data_generation, data_sampling
from benchmarks import run as runner
from neorl_industrial.functional.state_management import (
    gather_nstep,
    gather_transitions,
    gather_windows,
    window_starts,
)

N_EPISODES = 5
EPISODE_LENGTH = 20


@pytest.fixture(scope="module")
def trajectories() -> dict[str, np.ndarray]:
    """Small trajectories; episode 1 terminates early and episode 2 at its last step."""
    data = data_sampling.synthesize(N_EPISODES, EPISODE_LENGTH, seed=7)
    data["terminated"][1, 9] = True
    data["terminated"][2, -1] = True
    return data


@pytest.fixture(scope="module")
def dataset(trajectories: dict[str, np.ndarray]) -> Any:
    return data_sampling.build_dataset(trajectories)


def _assert_same_fields(ours: Any, baseline: dict[str, np.ndarray]) -> None:
    for name, expected in baseline.items():
        np.testing.assert_allclose(
            np.asarray(getattr(ours, name), np.float64),
            np.asarray(expected, np.float64),
            rtol=1e-5,
            atol=1e-5,
            err_msg=name,
        )


# --------------------------------------------------------------------------- python loop


def test_python_loop_uniform_matches_our_gather(dataset: Any) -> None:
    indices = np.arange(dataset.n_transitions)
    assert dataset.n_transitions == (N_EPISODES - 1) * EPISODE_LENGTH + 10  # episode 1 cut
    baseline = data_sampling.python_loop_uniform(data_sampling.host_arrays(dataset), indices)
    assert baseline["terminals"].sum() == 2 and set(np.unique(baseline["discounts"])) == {
        0.0,
        data_sampling.GAMMA,
    }
    _assert_same_fields(gather_transitions(dataset, jnp.asarray(indices)), baseline)


def test_python_loop_nstep_matches_our_gather(dataset: Any) -> None:
    indices = np.arange(dataset.n_transitions)
    baseline = data_sampling.python_loop_nstep(data_sampling.host_arrays(dataset), indices, 5)
    ours = gather_nstep(dataset, jnp.asarray(indices), 5, data_sampling.GAMMA)
    _assert_same_fields(ours, baseline)


def test_python_loop_windows_match_our_gather(dataset: Any) -> None:
    starts = np.asarray(window_starts(dataset, 8))
    baseline = data_sampling.python_loop_windows(data_sampling.host_arrays(dataset), starts, 8)
    _assert_same_fields(gather_windows(dataset, jnp.asarray(starts), 8), baseline)


# --------------------------------------------------------------------------- fused sampler


@pytest.fixture(scope="module")
def long_dataset() -> Any:
    """Episodes long enough for the benchmark's windows."""
    return data_sampling.build_dataset(
        data_sampling.synthesize(3, data_sampling.WINDOW_LENGTH + 8, seed=3)
    )


@pytest.mark.parametrize("name", data_sampling.SAMPLERS)
def test_fused_sampler_consumes_every_batch(long_dataset: Any, name: str) -> None:
    dataset = long_dataset
    sampler = data_sampling.our_samplers()[name]
    starts = window_starts(dataset, data_sampling.WINDOW_LENGTH)
    n_batches = 3
    key = jax.random.PRNGKey(0)
    fused = data_sampling.fused_sampler(sampler, n_batches)
    total = float(fused(dataset, starts, key))
    one_batch = jax.jit(lambda *args: data_sampling.consume(sampler(*args)))
    per_batch = [
        float(one_batch(dataset, starts, batch_key))
        for batch_key in jax.random.split(key, n_batches)
    ]
    assert len(set(per_batch)) == n_batches  # every batch differs
    assert total == pytest.approx(sum(per_batch), rel=1e-4)  # and every one was consumed
    assert float(fused(dataset, starts, jax.random.PRNGKey(1))) != pytest.approx(total, rel=1e-6)


def test_consume_uses_every_field() -> None:
    tree = {"a": jnp.ones((2, 3)), "b": jnp.array([True, False, True]), "c": jnp.arange(4)}
    assert float(data_sampling.consume(tree)) == 6.0 + 2.0 + 6.0


# --------------------------------------------------------------------------- targets and ratios


def test_targets_mark_pass_and_fail_from_synthetic_numbers() -> None:
    targets = data_sampling.evaluate_targets({"uniform_fused_vs_d3rlpy": 12.5, "memory_ratio": 1.2})
    assert targets["uniform_fused_vs_d3rlpy"]["passed"] is True
    assert targets["memory_ratio"]["passed"] is False
    assert targets["memory_ratio"]["threshold"] == 1.1
    boundary = data_sampling.evaluate_targets(
        {"uniform_fused_vs_d3rlpy": 10.0, "memory_ratio": 1.1}
    )
    assert boundary["uniform_fused_vs_d3rlpy"]["passed"] is True
    assert boundary["memory_ratio"]["passed"] is True
    missing = data_sampling.evaluate_targets({"uniform_fused_vs_d3rlpy": None})
    assert missing["uniform_fused_vs_d3rlpy"]["passed"] is None
    assert missing["memory_ratio"]["passed"] is None and missing["memory_ratio"]["value"] is None
    with pytest.raises(ValueError, match="unknown comparison"):
        data_sampling.evaluate_targets({"x": 1.0}, {"x": ("==", 1.0, "")})


def test_generation_target_judges_the_jax_rate() -> None:
    met = data_generation.evaluate_targets(
        {"jax_transitions_per_s": 1.2e6}, data_generation.TARGETS
    )
    missed = data_generation.evaluate_targets(
        {"jax_transitions_per_s": 6e5}, data_generation.TARGETS
    )
    assert met["jax_transitions_per_s"]["passed"] is True
    assert missed["jax_transitions_per_s"]["passed"] is False


def test_sampler_ratios_are_empty_without_d3rlpy() -> None:
    entry = {
        "ours_fused": {"batches_per_s": 1000.0},
        "ours_per_call": {"batches_per_s": 500.0},
        "python_loop": {"batches_per_s": 100.0},
        "d3rlpy": {"error": "d3rlpy not available", "batches_per_s": None},
    }
    ratios = data_sampling.sampler_ratios(entry)
    assert ratios["fused_vs_d3rlpy"] is None and ratios["per_call_vs_d3rlpy"] is None
    assert ratios["fused_vs_python_loop"] == 10.0
    assert ratios["per_call_vs_python_loop"] == 5.0
    assert ratios["fused_vs_per_call"] == 2.0


def test_generation_summary_picks_the_best_size() -> None:
    rows = [
        {
            "n_trajectories": n,
            **{
                s: {"transitions_per_s": r * f}
                for s, f in zip(data_generation.STAGES, (1.0, 1.5, 0.9, 0.5), strict=True)
            },
        }
        for n, r in ((100, 3.0), (500, 5.0), (1000, 4.0))
    ]
    summary = data_generation.summarise({"mlp": rows})["mlp"]
    assert summary["jax_transitions_per_s"] == 5.0 and summary["jax_n_trajectories"] == 500
    assert summary["jax_reused_buffer_transitions_per_s"] == 7.5
    assert summary["end_to_end_transitions_per_s"] == 2.5


def test_mlp_multiply_adds() -> None:
    assert data_generation.mlp_multiply_adds(180, (64, 64), 3) == 180 * 64 + 64 * 64 + 2 * 64 * 3


# --------------------------------------------------------------------------- d3rlpy


def test_d3rlpy_layout_adds_the_final_observation_row(trajectories: dict[str, Any]) -> None:
    data = data_sampling.synthesize(3, 4, seed=1)
    flat = data_sampling.d3rlpy_flat(data)
    assert flat["observations"].shape == (3 * 5, data_sampling.OBSERVATION_SIZE)
    assert np.shares_memory(flat["observations"], data["observations"])  # a view, not a copy
    np.testing.assert_array_equal(flat["timeouts"].reshape(3, 5)[:, -1], 1.0)
    assert flat["timeouts"].sum() == 3 and flat["terminals"].sum() == 0
    np.testing.assert_array_equal(flat["actions"].reshape(3, 5, -1)[:, :4], data["actions"])
    np.testing.assert_array_equal(flat["rewards"].reshape(3, 5)[:, -1], 0.0)
    with pytest.raises(ValueError, match="timed-out"):
        data_sampling.d3rlpy_flat(trajectories)


def test_d3rlpy_holds_our_transitions() -> None:
    pytest.importorskip("d3rlpy")
    from d3rlpy.dataset import MDPDataset

    data = data_sampling.synthesize(3, 6, seed=2)
    ours = data_sampling.build_dataset(data)
    flat = data_sampling.d3rlpy_flat(data)
    with data_sampling._quiet():
        theirs = MDPDataset(
            flat["observations"],
            flat["actions"],
            flat["rewards"],
            flat["terminals"],
            flat["timeouts"],
        )
    assert theirs.transition_count == ours.n_transitions
    batch = gather_transitions(ours, jnp.arange(ours.n_transitions))
    for index in range(ours.n_transitions):
        episode, step = theirs.buffer[index]
        transition = theirs.transition_picker(episode, step)
        np.testing.assert_array_equal(transition.observation, batch.observations[index])
        np.testing.assert_array_equal(transition.next_observation, batch.next_observations[index])
        np.testing.assert_array_equal(transition.action, batch.actions[index])


def test_missing_d3rlpy_is_recorded_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "d3rlpy", None)  # makes `import d3rlpy` fail
    result = data_sampling.measure_d3rlpy({}, data_sampling.settings(quick=True))
    assert "d3rlpy not available" in result["error"]
    assert result["samplers"] == {}


# --------------------------------------------------------------------------- reports


def test_reports_render_synthetic_results() -> None:
    sampler_entry = {
        "ours_fused": {"batches_per_s": 1000.0},
        "ours_per_call": {"batches_per_s": 500.0},
        "python_loop": {"batches_per_s": 100.0},
        "d3rlpy": {"batches_per_s": None, "error": "missing"},
        "ratios": {"fused_vs_python_loop": 10.0},
    }
    results = {
        "dataset": {"n_transitions": 10},
        "samplers": {"uniform": sampler_entry},
        "components": {"uniform": {"rng_only": {"us_per_batch": 1.0, "batches_per_s": 1e6}}},
        "memory": {"ours": {"ratio": 1.01}, "d3rlpy": {}, "process": {"end": {}}},
        "d3rlpy": {"error": "d3rlpy not available"},
        "targets": data_sampling.evaluate_targets({"memory_ratio": 1.01}),
    }
    tables = data_sampling.report({"batch_size": 256}, results)
    assert tables[0].rows[0][0] == "uniform" and "not available" in tables[0].caption
    generation = {
        "generation": {"mlp_64x64": [{"n_trajectories": 10, "jax": {"transitions_per_s": 1.0}}]},
        "components": {"mean_action_only": {"gflop_per_s": 50.0}},
        "targets": data_generation.evaluate_targets(
            {"jax_transitions_per_s": 1.0}, data_generation.TARGETS
        ),
    }
    tables = data_generation.report({"n_steps": 5, "cpu_affinity": [0]}, generation)
    assert tables[0].rows[0][:3] == ["mlp_64x64", 10, 1.0]


def test_benchmarks_are_registered() -> None:
    assert runner.BENCHMARKS["data_sampling"] == "benchmarks.data_sampling"
    assert runner.BENCHMARKS["data_generation"] == "benchmarks.data_generation"
    assert runner.describe("data_sampling") == data_sampling.DESCRIPTION
    assert runner.describe("data_generation") == data_generation.DESCRIPTION


# --------------------------------------------------------------------------- small measurements


def test_sampling_measurements_run_on_a_small_dataset(long_dataset: Any) -> None:
    dataset = long_dataset
    sampler = data_sampling.our_samplers()["uniform"]
    starts = window_starts(dataset, data_sampling.WINDOW_LENGTH)
    fused = data_sampling.measure_fused(sampler, dataset, starts, n_batches=4, repeats=1)
    per_call = data_sampling.measure_per_call(sampler, dataset, starts, n_batches=2, repeats=1)
    loop = data_sampling.measure_python_loop(
        "windows", data_sampling.host_arrays(dataset), np.asarray(starts), 2, 1
    )
    for entry in (fused, per_call, loop):
        assert entry["batches_per_s"] > 0
        assert entry["samples_per_s"] == entry["batches_per_s"] * data_sampling.BATCH_SIZE


def test_behaviour_policy_acts_in_the_action_space() -> None:
    from neorl_industrial.core.environments import make

    env, _ = make("IB-classic-v0")  # a small observation: quick to compile
    policy, policy_params = data_generation.make_policy(env, (8,))
    actions = jax.jit(jax.vmap(policy, in_axes=(None, 0, 0)))(
        policy_params,
        jnp.zeros((4, env.observation_size)),
        jax.random.split(jax.random.PRNGKey(0), 4),
    )
    assert actions.shape == (4, env.action_size) and bool(jnp.all(jnp.abs(actions) < 1.0))


def test_generation_measurement_builds_the_dataset() -> None:
    from neorl_industrial.core.environments import make

    # The smaller environment and the random policy compile faster; the code path is the same.
    env, params = make("IB-classic-v0")
    policy, _ = data_generation.make_policy(env, None)
    entry = data_generation.measure_generation(
        env, params, policy, None, n_trajectories=3, n_steps=4, repeats=1
    )
    assert entry["dataset_transitions"] == 12
    for stage in data_generation.STAGES:
        assert entry[stage]["transitions_per_s"] > 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux's")
def test_peak_rss_of_a_child_is_its_own_not_its_parents() -> None:
    """A child started while this process holds 400 MB reports its own, small peak
    (``getrusage`` alone carries the parent's peak across ``exec``)."""
    import subprocess

    held = np.ones(400 * 2**20 // 8)
    held[::512] = 2.0  # touch every page
    code = (
        "import json; from benchmarks.data_sampling import peak_rss_bytes; "
        "print(json.dumps(peak_rss_bytes()))"
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(child.stdout.strip()) < 200 * 2**20
    assert data_sampling.peak_rss_bytes() >= held.nbytes


def test_frames_benchmark_measures_both_layouts_of_the_same_data():
    from benchmarks import frames

    arrays = frames.synthesize(2, 20)
    # The synthetic observations really stack: each is the previous shifted by a frame.
    observations = arrays["observations"]
    np.testing.assert_array_equal(observations[1, frames.FRAME :], observations[0, : -frames.FRAME])
    config, results = frames.run(quick=True)
    layouts = results["layouts"]
    assert (layouts["whole"]["frame_stack"], layouts["frames"]["frame_stack"]) == (1, 30)
    comparison = results["comparison"]
    assert comparison["observations_whole_over_frames"] > 25
    assert 5 < comparison["disk_whole_over_frames"] < comparison["observations_whole_over_frames"]
    assert len(frames.report(config, results)[0].rows) == 2
