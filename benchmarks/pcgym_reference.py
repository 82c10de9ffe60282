"""pc-gym's benchmarks of its ``cstr`` and ``four_tank`` models (:data:`BENCHMARKS`,
:func:`make`), the reference environments of ``env_throughput``'s process rows
(``benchmarks/peers/process_reference.py`` builds them from here), and on its own a
best-of-repeats steps/s of one of them.

Runs in pc-gym's own environment (``python -m benchmarks.peers.reference_env``, or
``make reference-env``)::

    .venv-reference/bin/python benchmarks/pcgym_reference.py cstr 600 3 casadi

Arguments: the pc-gym model (``cstr`` or ``four_tank``), the number of steps to time, the
repeats, and pc-gym's integration method (``casadi``, its default, or ``jax``). The
environment is the pc-gym paper's benchmark of that model, without normalization; uniform
random actions within the action space are drawn inside the timed loop, and the episode is
reset when it ends (pc-gym builds its integrator anew at each reset, as a user's loop
would). Prints one JSON object: ``steps_per_s`` (best of the repeats after one untimed
warm-up episode), all times, and the versions.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from importlib.metadata import version

import numpy as np

#: the pc-gym paper's benchmark of each model: 60 intervals, setpoint schedule, bounds, x0
BENCHMARKS = {
    "cstr": {
        "N": 60,
        "tsim": 26.0,
        "SP": {"Ca": [0.85] * 20 + [0.9] * 20 + [0.87] * 20},
        "a_space": {"low": [295.0], "high": [302.0]},
        "o_space": {"low": [0.7, 300.0, 0.8], "high": [1.0, 350.0, 0.9]},
        "x0": [0.8, 330.0, 0.8],
        "r_scale": {"Ca": 1e3},
    },
    "four_tank": {
        "N": 60,
        "tsim": 1000.0,
        "SP": {"h3": [0.5] * 30 + [0.1] * 30, "h4": [0.2] * 30 + [0.3] * 30},
        "a_space": {"low": [0.1, 0.1], "high": [10.0, 10.0]},
        "o_space": {"low": [0.0] * 6, "high": [0.6] * 6},
        "x0": [0.141, 0.112, 0.072, 0.42, 0.5, 0.2],
        "r_scale": {"h3": 1.0, "h4": 1.0},
    },
}


def make(model: str, method: str):
    from pcgym import make_env

    params = dict(BENCHMARKS[model])
    params["a_space"] = {k: np.asarray(v, np.float64) for k, v in params["a_space"].items()}
    params["o_space"] = {k: np.asarray(v, np.float64) for k, v in params["o_space"].items()}
    params["x0"] = np.asarray(params["x0"], np.float64)
    params.update(model=model, normalise_a=False, normalise_o=False, integration_method=method)
    return make_env(params)


def measure(model: str, n_steps: int, repeats: int, method: str) -> dict:
    env = make(model, method)
    low, high = env.action_space.low, env.action_space.high
    rng = np.random.default_rng(0)

    def loop(steps: int) -> None:
        env.reset()
        for _ in range(steps):
            action = rng.uniform(low, high)
            _, _, done, truncated, _ = env.step(action)
            if done or truncated:
                env.reset()

    loop(BENCHMARKS[model]["N"])  # warm-up: imports, the first integrator build, JIT
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        loop(n_steps)
        times.append(time.perf_counter() - start)
    best = min(times)
    return {
        "model": model,
        "integration_method": method,
        "n_steps": n_steps,
        "best_s": best,
        "all_s": times,
        "steps_per_s": n_steps / best,
        "pcgym_version": version("pcgym"),
        "python_version": platform.python_version(),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[0] not in BENCHMARKS:
        print(__doc__, file=sys.stderr)
        return 2
    model, n_steps, repeats, method = argv[0], int(argv[1]), int(argv[2]), argv[3]
    print(json.dumps(measure(model, n_steps, repeats, method)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
