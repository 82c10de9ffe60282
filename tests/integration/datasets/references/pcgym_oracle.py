"""Runs pc-gym's NMPC oracle on a recorded pc-gym case and writes the controls it chose:
run in pc-gym's own environment (with do-mpc installed there).

    .venv-reference/bin/python tests/integration/datasets/references/pcgym_oracle.py \
        tests/core/environments/references/four_tank_case.json four_tank_oracle.json

The oracle is pc-gym 0.1.8's ``pcgym.oracle.oracle`` with its defaults (do-mpc, prediction
horizon 5, ``Q = I`` on the tracked states, ``R = 0``), with two changes that are not
optimizations:

* do-mpc 5 passes the time to the parameter functions as an array, which pc-gym 0.1.8
  cannot index with; it is passed as a number.
* pc-gym's oracle reads the setpoint of interval ``i`` at index ``i - 1`` (the first
  interval at index -1, the schedule's last). The oracle here reads index ``i``: the
  setpoint in force while interval ``i`` runs, which the task's reward compares with.

The output (JSON) holds the ``controller`` description, the ``actions`` (one row per
interval, in the plant's units) and the versions it was made with. The task is
deterministic, so replaying the actions from its reset gives the oracle's episode.
"""

from __future__ import annotations

import json
import platform
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np

CONTROLLER = (
    "pc-gym 0.1.8 NMPC oracle (do-mpc, prediction horizon 5, Q = I on the tracked states, "
    "R = 0), reading the setpoint in force during each interval"
)


def _time_as_number(set_p_fun, shift_intervals: float):
    def patched(controller, function):
        step = controller.settings.t_step
        return set_p_fun(
            controller,
            lambda time: function(float(np.asarray(time).reshape(-1)[0]) + shift_intervals * step),
        )

    return patched


def run(case: dict) -> dict:
    """The oracle's controls over the case's episode (its ``N`` intervals)."""
    import do_mpc
    from pcgym import make_env
    from pcgym.oracle import oracle

    sys.path.insert(0, str(Path(__file__).parents[3] / "core" / "environments" / "references"))
    from pcgym_record import _env_params

    do_mpc.controller.MPC.set_p_fun = _time_as_number(do_mpc.controller.MPC.set_p_fun, 1.0)
    do_mpc.simulator.Simulator.set_p_fun = _time_as_number(
        do_mpc.simulator.Simulator.set_p_fun, 0.0
    )
    params = _env_params(case)
    _, controls = oracle(make_env(params), params).mpc()
    return {
        "controller": CONTROLLER,
        "model": case["model"],
        "actions": np.asarray(controls, np.float64).T.tolist(),
        "pcgym_version": version("pcgym"),
        "do_mpc_version": version("do-mpc"),
        "python_version": platform.python_version(),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    case = json.loads(Path(argv[0]).read_text())
    Path(argv[1]).write_text(json.dumps(run(case), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
