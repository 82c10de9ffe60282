"""Records a pc-gym episode for the fidelity tests: run in pc-gym's own environment.

    .venv-reference/bin/python tests/core/environments/references/pcgym_record.py \
        tests/core/environments/references/cstr_case.json cstr_pcgym.npz

The case file (JSON) names the pc-gym ``model``, its ``env_params`` (arrays as lists; the
``a_space``/``o_space``/``disturbance_bounds`` low/high become arrays, ``SP`` and
``disturbances`` schedules lists of numbers) and the ``actions`` to apply, one row per
step in the plant's units. Normalization is switched off so the recorded observations are
the plant's own states, setpoints and disturbances. The output holds ``observations``
(``[steps + 1, n]``, the reset's first), ``rewards`` (``[steps]``), ``actions``, and the
pc-gym and Python versions it was made with.
"""

from __future__ import annotations

import json
import platform
import sys
from importlib.metadata import version

import numpy as np

BOX_KEYS = ("a_space", "o_space", "disturbance_bounds", "a_space_act")


def _env_params(case: dict) -> dict:
    params = dict(case["env_params"])
    params["model"] = case["model"]
    params["normalise_a"] = False
    params["normalise_o"] = False
    for key in BOX_KEYS:
        if key in params:
            params[key] = {bound: np.asarray(v, np.float64) for bound, v in params[key].items()}
    params["x0"] = np.asarray(params["x0"], np.float64)
    for key in ("SP", "disturbances"):
        if key in params:
            params[key] = {name: list(map(float, values)) for name, values in params[key].items()}
    return params


def record(case: dict) -> dict[str, np.ndarray]:
    """Runs the case's actions through ``pcgym.make_env`` and returns what it observed."""
    from pcgym import make_env

    env = make_env(_env_params(case))
    observation, _ = env.reset()
    observations = [np.asarray(observation, np.float64).copy()]
    rewards = []
    for action in np.asarray(case["actions"], np.float64):
        observation, reward, _, _, _ = env.step(action)
        observations.append(np.asarray(observation, np.float64).copy())
        rewards.append(float(reward))
    return {
        "observations": np.stack(observations),
        "rewards": np.asarray(rewards, np.float64),
        "actions": np.asarray(case["actions"], np.float64),
        "pcgym_version": np.asarray(version("pcgym")),
        "python_version": np.asarray(platform.python_version()),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as handle:
        case = json.load(handle)
    np.savez_compressed(argv[1], **record(case))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
