"""Data-parallel training of one run on a plant log split into shards of episodes: the
shards, the refusals, the same parameters on one device and on four forced host devices,
the command line's ``train --data-parallel``, and two processes on loopback (gloo) that
each load only their own shard."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from neorl_industrial.core.agents.registry import build_algorithm
from neorl_industrial.functional.state_management import ActionScaler, Dataset
from neorl_industrial.functional.transformations.data_parallel import (
    DataParallelError,
    data_mesh,
    observation_moments,
    plan_shards,
    shard_dataset,
    split_dataset,
    train_data_parallel,
)
from neorl_industrial.functional.transformations.offline import Schedule
from neorl_industrial.integration.datasets import load_native_shards, load_plant_log, save_native
from tests.processes import last_json, run_distributed, run_on_host_devices

ROOT = Path(__file__).resolve().parents[3]
TANK = ROOT / "examples" / "mixing-tank"


@pytest.fixture(scope="module")
def tank():
    """The mixing-tank log (8 episodes, no simulator), actions in [-1, 1]."""
    dataset, card = load_plant_log(TANK / "mixing_tank.csv", TANK / "schema.yaml")
    task = card.task()
    scaler = ActionScaler.create(task.action_low, task.action_high)
    return dataset.replace(actions=scaler.scale(dataset.actions)), card


def _algorithm(dataset):
    algorithm, _ = build_algorithm(
        "td3bc", dataset.observation_size, dataset.action_size, {"hidden": (8,)}
    )
    return algorithm


def test_shards_are_whole_episodes_balanced_by_transitions():
    plan = plan_shards([100, 100, 100, 100, 400], 2)
    assert plan.bounds == (0, 4, 5) and plan.transitions == (400, 400)
    plan = plan_shards([10, 500, 10, 10, 10, 10], 3)
    assert plan.n_shards == 3 and sum(plan.transitions) == 550
    assert all(b > a for a, b in zip(plan.bounds, plan.bounds[1:], strict=False))
    assert plan.padded_transitions == max(plan.transitions)
    with pytest.raises(DataParallelError, match="3 episodes cannot fill 4 shards"):
        plan_shards([5, 5, 5], 4)
    with pytest.raises(DataParallelError, match="n_shards: expected a positive integer"):
        plan_shards([5, 5], 0)


def test_a_sharded_dataset_holds_every_episode_once(tank):
    dataset, _ = tank
    sharded = split_dataset(dataset, 4, data_mesh(jax.devices()[:1]))
    counts = np.asarray(sharded.counts)
    assert sharded.n_shards == 4 and counts.sum() == dataset.n_transitions
    plan = plan_shards(np.asarray(dataset.episode_lengths), 4)
    for shard in range(4):
        first, stop = plan.episodes(shard)
        part = dataset.slice_episodes(first, stop)
        n = int(counts[shard])
        rewards = np.asarray(sharded.shards.rewards[shard])
        np.testing.assert_array_equal(rewards[:n], np.asarray(part.rewards))
        assert not rewards[n:].any()  # padding, never sampled
        np.testing.assert_array_equal(
            np.asarray(
                jax.tree.map(lambda x, s=shard: x[s], sharded.shards).transition_observations()
            )[:n],
            np.asarray(part.transition_observations()),
        )


def test_data_parallel_training_learns_and_refuses_what_cannot_divide(tank):
    dataset, _ = tank
    algorithm = _algorithm(dataset)
    mesh = data_mesh(jax.devices()[:1])
    sharded = split_dataset(dataset, 2, mesh)
    state, history = train_data_parallel(
        algorithm,
        sharded,
        mesh=mesh,
        seeds=(0, 1),
        schedule=Schedule(n_updates=20, chunk_updates=10, batch_size=32),
    )
    assert int(state.updates[0]) == 20 and len(history) == 2
    assert np.all(np.isfinite(history[-1]["metrics"]["critic_loss"]))
    with pytest.raises(DataParallelError, match="batch_size: 33 transitions do not divide into 2"):
        train_data_parallel(
            algorithm,
            sharded,
            mesh=mesh,
            schedule=Schedule(n_updates=10, batch_size=33),
        )
    with pytest.raises(DataParallelError, match="8 episodes cannot fill 9 shards"):
        split_dataset(dataset, 9, mesh)


def test_the_trainer_on_a_mesh_trains_what_train_data_parallel_trains(tank):
    from neorl_industrial.wrappers.training import Trainer, TrainingSection

    dataset, _ = tank
    algorithm = _algorithm(dataset)
    mesh = data_mesh(jax.devices()[:1])
    training = TrainingSection(seeds=[0, 1], batch_size=32, chunk=10)
    trainer = Trainer(algorithm, dataset, training, mesh=mesh)
    result = trainer.fit(20)
    # The Trainer splits the data into one shard per device of the mesh.
    state, _ = train_data_parallel(
        algorithm,
        split_dataset(dataset, mesh=mesh),
        mesh=mesh,
        seeds=(0, 1),
        schedule=Schedule(n_updates=20, chunk_updates=10, batch_size=32),
    )
    for ours, theirs in zip(jax.tree.leaves(result.state), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def test_native_shards_are_read_from_the_files_alone(tank, tmp_path):
    dataset, card = tank
    save_native(dataset, tmp_path / "tank", card)
    mesh = data_mesh(jax.devices()[:1])
    shards, plan, _ = load_native_shards(tmp_path / "tank", 4, [1, 2])
    assert [s.n_transitions for s in shards] == list(plan.transitions[1:3])
    everything, plan, _ = load_native_shards(tmp_path / "tank", 4)
    for ours, whole in zip(
        observation_moments(everything), dataset.observation_moments(), strict=True
    ):
        np.testing.assert_allclose(ours, whole, rtol=1e-6, atol=1e-9)
    loaded = shard_dataset(everything, plan, mesh)
    split = split_dataset(dataset, 4, mesh)
    for ours, theirs in zip(jax.tree.leaves(loaded), jax.tree.leaves(split), strict=True):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    stacked = Dataset.from_episodes(
        [
            {
                "observations": np.stack([np.arange(t, t + 4.0) for t in range(6)])[:, ::-1],
                "actions": np.zeros((5, 1)),
                "rewards": np.ones(5),
            }
        ]
        * 2
    )
    assert stacked.frame_stack == 4
    save_native(stacked, tmp_path / "stacked")
    frames, plan, _ = load_native_shards(tmp_path / "stacked", 2)
    assert plan.frame_stack == 4 and all(s.frame_stack == 4 for s in frames)
    np.testing.assert_array_equal(
        frames[1].all_observations(), stacked.slice_episodes(1, 2).all_observations()
    )


FORCED = r"""
import json, subprocess, sys
import jax, numpy as np
from neorl_industrial.core.agents.registry import build_algorithm
from neorl_industrial.functional.state_management import ActionScaler
from neorl_industrial.functional.transformations.offline import Schedule
from neorl_industrial.functional.transformations.data_parallel import (
    data_mesh, split_dataset, train_data_parallel)
from neorl_industrial.integration.datasets import load_plant_log

root, out = sys.argv[1], sys.argv[2]
dataset, card = load_plant_log(root + "/mixing_tank.csv", root + "/schema.yaml")
task = card.task()
dataset = dataset.replace(
    actions=ActionScaler.create(task.action_low, task.action_high).scale(dataset.actions))
algorithm, _ = build_algorithm("td3bc", dataset.observation_size, dataset.action_size,
                               {"hidden": (8,)})
states = {}
for n in (1, 4):
    mesh = data_mesh(jax.devices()[:n])
    data = split_dataset(dataset, 4, mesh)
    states[n], _ = train_data_parallel(algorithm, data, mesh=mesh, seeds=(0, 1),
                                       schedule=Schedule(20, chunk_updates=10, batch_size=32))
relative = max(
    float(np.max(np.abs(np.asarray(a) - np.asarray(b)) / (np.abs(np.asarray(a)) + 1e-3)))
    for a, b in zip(jax.tree.leaves(states[1]), jax.tree.leaves(states[4])))
print(json.dumps({"devices": len(jax.devices()), "relative": relative,
                  "shard_devices": len(data.shards.rewards.devices())}))
"""


def test_four_host_devices_train_the_parameters_one_device_trains(tank, tmp_path):
    result = last_json(run_on_host_devices(["-c", FORCED, str(TANK), str(tmp_path)], 4))
    assert result["devices"] == 4 and result["shard_devices"] == 4
    # The same program up to the order of the gradient sums (measured 1.1e-4 after 20
    # Adam updates from uniform initialization, whose rescaling amplifies the rounding of
    # near-zero gradients; a wrong shard or a missing average is off by order one).
    assert result["relative"] < 5e-4


@pytest.mark.slow
def test_train_data_parallel_on_the_command_line(tank, tmp_path):
    """``neorl-industrial train --data-parallel`` on two forced host devices: the plant
    log's run trains over both, is evaluated off policy and exported as usual."""
    data = tmp_path / "tank"
    save_native(tank[0], data, tank[1])
    sets = [
        f"data.path={data}",
        f"output={tmp_path}",
        "name=parallel",
        f"safety.constraints={TANK / 'constraints.yaml'}",
        "algorithm.name=td3bc-lag",
        "algorithm.hyperparameters={hidden: [8]}",
        "training.updates=20",
        "training.chunk=10",
        "training.batch_size=32",
        "training.seeds=[0]",
        "evaluation.ope={holdout: 0.25, updates: 20, seeds: [0, 1], hidden: [8]}",
        "tracking.enabled=false",
    ]
    command = ["-m", "neorl_industrial", "--no-cache", "train", "--data-parallel"]
    command += ["-c", str(TANK / "run.yaml"), *[a for s in sets for a in ("--set", s)]]
    done = run_on_host_devices(command, 2)
    assert "data-parallel over 2 devices in 1 processes" in done.stdout
    report = json.loads((tmp_path / "parallel" / "report.json").read_text())
    assert report["devices"] == 2 and report["training"]["updates"] == 20
    assert (tmp_path / "parallel" / "policy" / "manifest.json").is_file()


DISTRIBUTED = r"""
import json, sys
import jax, numpy as np
from neorl_industrial.core.agents.registry import build_algorithm
from neorl_industrial.functional.transformations.offline import Schedule
from neorl_industrial.functional.transformations.data_parallel import (
    data_mesh, observation_moments, shard_dataset, train_data_parallel)
from neorl_industrial.cli.runtime import initialize_distributed
from neorl_industrial.integration.datasets import load_native_shards

index, count = initialize_distributed(timeout_s=60)
path, out = sys.argv[1], sys.argv[2]
shards, plan, _ = load_native_shards(path, 2)  # this process's shard only
mean, std = observation_moments(shards)  # over both processes' shards
mesh = data_mesh()
data = shard_dataset(shards, plan, mesh)
algorithm, _ = build_algorithm("td3bc", shards[0].observation_size, shards[0].action_size,
                               {"hidden": (8,)})
state, _ = train_data_parallel(algorithm, data, mesh=mesh, seeds=(0, 1),
                               schedule=Schedule(20, chunk_updates=10, batch_size=32))
if index == 0:
    np.savez(out, mean, std, *[np.asarray(leaf) for leaf in jax.tree.leaves(state)])
print(json.dumps({"index": index, "devices": len(jax.devices()),
                  "loaded": [s.n_transitions for s in shards], "plan": list(plan.transitions)}))
"""


@pytest.mark.slow
def test_two_processes_each_with_its_own_shard_train_what_one_process_trains(tank, tmp_path):
    dataset, card = tank
    save_native(dataset, tmp_path / "tank", card)
    outputs = run_distributed(
        [sys.executable, "-c", DISTRIBUTED, str(tmp_path / "tank"), str(tmp_path / "s.npz")]
    )
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    plan = reports[0]["plan"]
    # Each process read only its own episodes.
    assert [r["loaded"] for r in reports] == [[plan[0]], [plan[1]]]
    assert all(r["devices"] == 2 for r in reports)
    mesh = data_mesh(jax.devices()[:1])
    one, _ = train_data_parallel(
        _algorithm(dataset),
        split_dataset(dataset, 2, mesh),
        mesh=mesh,
        seeds=(0, 1),
        schedule=Schedule(n_updates=20, chunk_updates=10, batch_size=32),
    )
    saved = np.load(tmp_path / "s.npz")
    for gathered, whole in zip(
        (saved["arr_0"], saved["arr_1"]), dataset.observation_moments(), strict=True
    ):
        np.testing.assert_allclose(gathered, whole, rtol=1e-6, atol=1e-9)
    theirs = [saved[f"arr_{i}"] for i in range(2, len(saved.files))]
    ours = [np.asarray(leaf) for leaf in jax.tree.leaves(one)]
    assert len(ours) == len(theirs)
    for mine, other in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(mine, other, rtol=1e-4, atol=1e-5)
