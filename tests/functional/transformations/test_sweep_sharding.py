"""A sweep's runs laid out over a mesh of forced host devices give the parameters the
one-device sweep gives; runs that do not divide over the devices are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import free_port, last_json, run_distributed, run_on_host_devices

ROOT = Path(__file__).resolve().parents[3]

#: The mixing-tank log, actions scaled to [-1, 1], and a 2 x 2 TD3+BC sweep of it (the
#: child scripts' common part; the log's folder is their first argument).
DATA = r"""
from neorl_industrial.functional.state_management import ActionScaler
from neorl_industrial.integration.datasets import load_plant_log

root = sys.argv[1]
dataset, card = load_plant_log(root + "/mixing_tank.csv", root + "/schema.yaml")
task = card.task()
dataset = dataset.replace(
    actions=ActionScaler.create(task.action_low, task.action_high).scale(dataset.actions))
plan = plan_sweep("td3bc", {"alpha": [1.0, 4.0]}, seeds=(0, 1),
                  obs_size=dataset.observation_size, action_size=dataset.action_size,
                  hyperparameters={"hidden": (8,)})
"""

SCRIPT = (
    r"""
import json, sys
import jax, numpy as np
from neorl_industrial.functional.transformations.offline import Schedule
from neorl_industrial.functional.transformations.sweep import (
    SweepError, plan_sweep, runs_mesh, train_sweep)
"""
    + DATA
    + r"""
settings = dict(schedule=Schedule(n_updates=20, chunk_updates=10, batch_size=32))
one = train_sweep(plan, dataset, **settings)
mesh = runs_mesh()
sharded = train_sweep(plan, dataset, mesh=mesh, **settings)
leaf = jax.tree.leaves(sharded.state.agent)[0]
distance = max(
    float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
    for a, b in zip(jax.tree.leaves(one.state.agent), jax.tree.leaves(sharded.state.agent)))
odd = plan_sweep("td3bc", {"alpha": [1.0, 2.0, 4.0]}, seeds=(0,),
                 obs_size=dataset.observation_size, action_size=dataset.action_size,
                 hyperparameters={"hidden": (8,)})
try:
    train_sweep(odd, dataset, mesh=mesh, **settings)
    refused = None
except SweepError as error:
    refused = str(error)
print(json.dumps({"devices": len(jax.devices()), "leaf_devices": len(leaf.devices()),
                  "distance": distance, "refused": refused}))
"""
)


def test_runs_sharded_over_four_host_devices_match_one_device():
    done = run_on_host_devices(["-c", SCRIPT, str(ROOT / "examples" / "mixing-tank")], 4)
    result = last_json(done)
    assert result["devices"] == 4 and result["leaf_devices"] == 4
    assert result["distance"] < 1e-5
    assert "3 runs do not divide over 4 devices" in result["refused"]


DISTRIBUTED = (
    r"""
import json, sys
import jax, numpy as np
from neorl_industrial.functional.transformations.offline import Schedule
from neorl_industrial.functional.transformations.sweep import plan_sweep, runs_mesh, train_sweep
from neorl_industrial.cli.runtime import initialize_distributed

index, count = initialize_distributed(timeout_s=60)
out = sys.argv[2]
"""
    + DATA
    + r"""
result = train_sweep(plan, dataset, Schedule(n_updates=20, chunk_updates=10, batch_size=32),
                     mesh=runs_mesh())
if index == 0:
    leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(result.state.agent)]
    np.savez(out, *leaves)
print(json.dumps({"index": index, "count": count, "devices": len(jax.devices()),
                  "local": len(jax.local_devices())}))
"""
)


@pytest.mark.slow
def test_two_processes_on_loopback_train_the_sweep_one_process_trains(tmp_path):
    import jax
    import numpy as np

    from neorl_industrial.functional.state_management import ActionScaler
    from neorl_industrial.functional.transformations.offline import Schedule
    from neorl_industrial.functional.transformations.sweep import plan_sweep, train_sweep
    from neorl_industrial.integration.datasets import load_plant_log

    root = ROOT / "examples" / "mixing-tank"
    outputs = run_distributed(
        [sys.executable, "-c", DISTRIBUTED, str(root), str(tmp_path / "state.npz")]
    )
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert [r["index"] for r in reports] == [0, 1]
    assert all(r["count"] == 2 and r["devices"] == 2 and r["local"] == 1 for r in reports)
    # the same sweep in this one process
    dataset, card = load_plant_log(root / "mixing_tank.csv", root / "schema.yaml")
    task = card.task()
    scaler = ActionScaler.create(task.action_low, task.action_high)
    dataset = dataset.replace(actions=scaler.scale(dataset.actions))
    plan = plan_sweep(
        "td3bc",
        {"alpha": [1.0, 4.0]},
        seeds=(0, 1),
        obs_size=dataset.observation_size,
        action_size=dataset.action_size,
        hyperparameters={"hidden": (8,)},
    )
    one = train_sweep(
        plan,
        dataset,
        schedule=Schedule(n_updates=20, chunk_updates=10, batch_size=32),
    )
    saved = np.load(tmp_path / "state.npz")
    theirs = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    ours = [np.asarray(leaf) for leaf in jax.tree.leaves(one.state.agent)]
    assert len(ours) == len(theirs)
    for mine, other in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(mine, other, rtol=1e-5, atol=1e-5)


def test_a_process_that_cannot_reach_the_coordinator_names_the_address():
    script = (
        "from neorl_industrial.cli.runtime import initialize_distributed, DistributedError\n"
        "try:\n    initialize_distributed(timeout_s=3)\n"
        "except DistributedError as error:\n    print(error)\n"
    )
    port = free_port()
    environment = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "NEORL_INDUSTRIAL_COORDINATOR": f"127.0.0.1:{port}",
        "NEORL_INDUSTRIAL_NUM_PROCESSES": "2",
        "NEORL_INDUSTRIAL_PROCESS_ID": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=environment,
        cwd=ROOT,
        timeout=120,
    )
    assert f"could not join the coordinator at 127.0.0.1:{port} within 3 s" in done.stdout, (
        done.stdout + done.stderr[-1500:]
    )
