"""Records the four-tank's bound-holding sequences for the fidelity tests: run in pc-gym's
own environment (``make reference-env``).

    .venv-reference/bin/python tests/core/environments/references/four_tank_bounds_record.py \
        tests/core/environments/references/four_tank_bounds.json four_tank_bounds.npz

The sequences file (JSON) names the case file whose ``model`` and ``env_params`` they share
(``env_params_from``) and holds ``sequences``: a name, a description and the ``actions``
of each, in volts. For each sequence the output holds, under ``<name>.<field>``:

* ``observations``, ``rewards``: pc-gym's own episode (``pcgym_record.record``: its default
  integrator, CasADi/CVODES, normalization off);
* ``converged``: ``[steps + 1, 4]`` levels of the same ODE, with pc-gym's constants,
  integrated in float64 by scipy's Radau at relative tolerance 1e-12 and absolute 1e-14 m
  (pc-gym's CVODES works at 1e-6 relative; with a pump at 10 V its levels drift from this
  solution by up to 7e-6 m over an episode);
* ``actions``.

and ``pcgym_version``, ``scipy_version``, ``python_version``.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
from pcgym_record import record  # the sibling module: run as a script from this folder

#: scipy's tolerances of the converged solution: relative, absolute [m]
RTOL, ATOL = 1e-12, 1e-14


def converged_levels(actions: np.ndarray, x0: np.ndarray, dt: float) -> np.ndarray:
    """``[steps + 1, 4]`` levels from ``x0`` under ``actions`` held over each interval:
    pc-gym's ``four_tank`` equations and constants, outflow ``a sqrt(2 g max(h, 0))``
    (the same as pc-gym's at every level above 0, where all of these episodes stay)."""
    from pcgym.model_classes import four_tank
    from scipy.integrate import solve_ivp

    model = four_tank()
    gamma = np.array([model.gamma_1, model.gamma_2])
    gain = np.array([model.k1, model.k2])
    outlet = np.array([model.a1, model.a2, model.a3, model.a4])
    area = np.array([model.A1, model.A2, model.A3, model.A4])

    def derivative(_t: float, levels: np.ndarray, pumps: np.ndarray) -> np.ndarray:
        outflow = outlet * np.sqrt(2.0 * model.g * np.maximum(levels, 0.0))
        flow = gain * pumps
        inflow = np.array(
            [
                outflow[2] + gamma[0] * flow[0],
                outflow[3] + gamma[1] * flow[1],
                (1.0 - gamma[1]) * flow[1],
                (1.0 - gamma[0]) * flow[0],
            ]
        )
        return (inflow - outflow) / area

    levels = [np.asarray(x0, np.float64)]
    for pumps in actions:
        solution = solve_ivp(
            derivative,
            (0.0, dt),
            levels[-1],
            method="Radau",
            args=(np.asarray(pumps, np.float64),),
            rtol=RTOL,
            atol=ATOL,
        )
        if not solution.success:
            raise RuntimeError(f"scipy's Radau failed: {solution.message}")
        levels.append(solution.y[:, -1])
    return np.stack(levels)


def record_sequences(sequences_file: Path) -> dict[str, np.ndarray]:
    spec = json.loads(sequences_file.read_text())
    case = json.loads((sequences_file.parent / spec["env_params_from"]).read_text())
    env_params = case["env_params"]
    dt = env_params["tsim"] / env_params["N"]
    x0 = np.asarray(env_params["x0"][:4], np.float64)
    out: dict[str, np.ndarray] = {}
    for name, sequence in spec["sequences"].items():
        actions = np.asarray(sequence["actions"], np.float64)
        episode = record({"model": case["model"], "env_params": env_params, "actions": actions})
        out[f"{name}.observations"] = episode["observations"]
        out[f"{name}.rewards"] = episode["rewards"]
        out[f"{name}.actions"] = episode["actions"]
        out[f"{name}.converged"] = converged_levels(actions, x0, dt)
        out["pcgym_version"] = episode["pcgym_version"]
        out["python_version"] = episode["python_version"]
    out["scipy_version"] = np.asarray(version("scipy"))
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    np.savez_compressed(argv[1], **record_sequences(Path(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
