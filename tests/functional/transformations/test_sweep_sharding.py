"""A sweep's runs laid out over a mesh of forced host devices give the parameters the
one-device sweep gives; runs that do not divide over the devices are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.compile_flags import with_fast_compile

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = r"""
import json, sys
import jax, numpy as np
from neorl_industrial.functional.state_management import ActionScaler
from neorl_industrial.functional.transformations.sweep import (
    SweepError, plan_sweep, runs_mesh, train_sweep)
from neorl_industrial.integration.datasets import load_plant_log

root = sys.argv[1]
dataset, card = load_plant_log(root + "/mixing_tank.csv", root + "/schema.yaml")
task = card.task()
dataset = dataset.replace(
    actions=ActionScaler.create(task.action_low, task.action_high).scale(dataset.actions))
plan = plan_sweep("td3bc", {"alpha": [1.0, 4.0]}, seeds=(0, 1),
                  obs_size=dataset.observation_size, action_size=dataset.action_size,
                  hyperparameters={"hidden": (8,)})
settings = dict(n_updates=20, chunk_updates=10, batch_size=32)
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


def test_runs_sharded_over_four_host_devices_match_one_device():
    flags = with_fast_compile("--xla_force_host_platform_device_count=4")
    environment = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(ROOT / "examples" / "mixing-tank")],
        capture_output=True,
        text=True,
        env=environment,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["devices"] == 4 and result["leaf_devices"] == 4
    assert result["distance"] < 1e-5
    assert "3 runs do not divide over 4 devices" in result["refused"]
