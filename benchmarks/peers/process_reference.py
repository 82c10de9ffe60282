"""The reference simulators of the process tasks, served to ``env_throughput`` one request at
a time: pc-gym 0.1.8's ``four_tank`` and ``cstr``, NeoRL-2's ``Pipeline`` and ``DMSD``.

Runs in the reference environment (``python -m benchmarks.peers.reference_env`` builds it
outside the checkout), started by ``env_throughput`` as a child process that inherits its
CPU pinning, so that reference and project alternate on the same core within one run. It
reads one JSON request per line on stdin and answers one JSON line on stdout:

* ``{"op": "episode", "task": T, "actions": [[...], ...], "seed": s}``: the reference's
  episode under those actions (plant units for pc-gym, the reference's own action for
  NeoRL-2), for the trajectory check before any timing: ``observations`` (the reset's
  first), ``rewards``.
* ``{"op": "time", "task": T, "n_steps": n, "seed": s}``: ``n`` steps with uniform random
  actions drawn inside the timed loop (resetting at the end of each episode, as a user's
  loop would): ``wall_s`` and ``cpu_s`` (the process's CPU time).
* ``{"op": "versions"}``: the reference packages' versions.

The pc-gym environments are the pc-gym paper's benchmarks (``benchmarks/pcgym_reference.py``),
unnormalized, with pc-gym's default integrator (CasADi/CVODES). NeoRL-2's environments are
its own classes at their registered defaults, stepped directly (no Gymnasium wrappers: the
reference's fastest loop). PyPI's ``neorl2==0.0.1`` ships without its reward modules
(``neorl2/envs/reward/``); the two this needs are supplied here as NeoRL-2 publishes them:
Pipeline's ``(0.01 (200 - |d - T|))^2 - 3`` and DMSD's ``sum_i -ln(|x_i - T_i| + 0.01)``, both
of the next observation.
"""

from __future__ import annotations

import json
import sys
import time
import types
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

PCGYM_TASKS = ("four_tank", "cstr")
#: the episode length of each task (pc-gym's benchmarks: N; NeoRL-2's registered limits)
EPISODE_STEPS = {"four_tank": 60, "cstr": 60, "Pipeline": 1000, "DMSD": 100}


def _pipeline_reward(data: dict) -> float:
    next_obs = np.asarray(data["next_obs"], np.float32)
    return float((0.01 * (200.0 - abs(next_obs[0] - next_obs[1]))) ** 2 - 3.0)


def _dmsd_reward(data: dict) -> float:
    next_obs = np.asarray(data["next_obs"], np.float32)
    return float(np.sum(-np.log(np.abs(next_obs[:2] - next_obs[4:6]) + 0.01)))


def _install_neorl2_rewards() -> None:
    """Registers ``neorl2.envs.reward.{pipeline,dmsd}_reward`` (missing from the wheel)."""
    package = types.ModuleType("neorl2.envs.reward")
    package.__path__ = []
    sys.modules["neorl2.envs.reward"] = package
    for name, function in (("pipeline_reward", _pipeline_reward), ("dmsd_reward", _dmsd_reward)):
        module = types.ModuleType(f"neorl2.envs.reward.{name}")
        module.get_reward = function
        sys.modules[module.__name__] = module


def make(task: str) -> Any:
    """The reference environment of ``task`` (a pc-gym model or a NeoRL-2 task)."""
    if task in PCGYM_TASKS:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from pcgym_reference import make as make_pcgym

        return make_pcgym(task, "casadi")
    _install_neorl2_rewards()
    if task == "Pipeline":
        from neorl2.envs.pipline import PipelineEnv

        return PipelineEnv()
    if task == "DMSD":
        from neorl2.envs.dmsd import DoubleMassSpringDamperEnv

        return DoubleMassSpringDamperEnv()
    raise ValueError(
        f"task: unknown reference task {task!r}; expected one of {list(EPISODE_STEPS)}"
    )


def _reset(env: Any, task: str, seed: int | None) -> np.ndarray:
    # pc-gym's reset is deterministic (the benchmark's x0); NeoRL-2's draws from its seed.
    observation, _ = env.reset() if task in PCGYM_TASKS else env.reset(seed=seed)
    return np.asarray(observation, np.float64)


def episode(task: str, actions: list, seed: int) -> dict[str, Any]:
    env = make(task)
    observations = [_reset(env, task, seed)]
    rewards = []
    for action in np.asarray(actions, np.float64):
        dtype = np.float64 if task in PCGYM_TASKS else np.float32
        observation, reward, *_ = env.step(action.astype(dtype))
        observations.append(np.asarray(observation, np.float64))
        rewards.append(float(reward))
    return {"observations": np.stack(observations).tolist(), "rewards": rewards}


def timed(task: str, n_steps: int, seed: int) -> dict[str, Any]:
    env = make(task)
    low, high = env.action_space.low, env.action_space.high
    rng = np.random.default_rng(seed)
    horizon = EPISODE_STEPS[task]

    def loop(steps: int) -> None:
        _reset(env, task, seed)
        done_steps = 0
        for _ in range(steps):
            _, _, terminated, truncated, _ = env.step(rng.uniform(low, high).astype(low.dtype))
            done_steps += 1
            # pc-gym ends its episodes itself (after N - 1 steps); NeoRL-2's never end.
            if terminated or truncated or done_steps == horizon:
                env.reset()
                done_steps = 0

    loop(min(n_steps, horizon))  # warm-up: imports, the first integrator build
    wall, cpu = time.perf_counter(), time.process_time()
    loop(n_steps)
    return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}


def versions() -> dict[str, str]:
    found = {"python": sys.version.split()[0], "numpy": np.__version__}
    for package in ("pcgym", "neorl2", "gymnasium", "casadi"):
        try:
            found[package] = version(package)
        except Exception:  # a package this environment lacks
            found[package] = "absent"
    return found


def serve() -> int:
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["op"] == "episode":
                answer = episode(request["task"], request["actions"], request.get("seed", 0))
            elif request["op"] == "time":
                answer = timed(request["task"], int(request["n_steps"]), request.get("seed", 0))
            elif request["op"] == "versions":
                answer = versions()
            else:
                answer = {"error": f"op: unknown request {request['op']!r}"}
        except Exception as error:  # reported to the parent, which decides
            answer = {"error": f"{type(error).__name__}: {error}"}
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(serve())
