"""A pH neutraliser: an acid effluent neutralised with caustic in a stirred tank, under
well-tuned operators (the plant whose operators are near-optimal).

The effluent's flow steps and its acid strength drifts unmeasured; the tank's pH follows
the titration curve of the buffered effluent (steep around 7: a 1 % dosing error moves
it by tenths). The operators dose caustic in ratio to the measured effluent flow, and a
PI trim on the pH learns the acid strength the ratio misses, as a good instrument
engineer tunes it; their noise is small.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from benchmarks.plants.base import Column, Cost, Plant, State

VOLUME = 5.0  # m³
CAUSTIC = 500.0  # mol/m³ of the caustic
PUMP_MAX = 1.0  # m³/h at 100 %
BUFFER = 1e-4  # mol/L: the effluent's lumped buffer (the curve's width around 7)
HOURS = 20.0 / 3600.0  # one sample
SUBSTEPS = 10


def ph_of(excess: np.ndarray) -> np.ndarray:
    """The tank's pH from its excess acid (mol/m³; negative: excess caustic)."""
    x = excess / 1000.0
    return 7.0 - np.log10((x / 2.0 + np.sqrt(x * x / 4.0 + BUFFER**2)) / BUFFER)


class PhNeutraliser(Plant):
    name = "ph-neutraliser"
    description = (
        "A 5 m3 neutralisation tank: caustic pump in %, tank pH, effluent and caustic "
        "flows measured; effluent flow steps, its acid strength drifts unmeasured; 20 s "
        "samples, 1 h episodes."
    )
    sampling_period = 20.0
    episode_steps = 180
    observations = (
        Column("ph", "pH", 0.0, 14.0, 3),
        Column("effluent_flow_m3h", "m3/h", 0.0, 40.0, 2, exogenous=True),
        Column("caustic_flow_m3h", "m3/h", 0.0, 1.2, 4),
    )
    actions = (Column("caustic_pump_pct", "%", 0.0, 100.0),)
    reward = "-abs(ph - 7) - 0.5 * caustic_flow_m3h"
    costs = (Cost("off_spec", "max(abs(ph - 7) - 0.5, 0)", 2.0),)
    constraints: ClassVar[dict[str, Any]] = {
        "description": "Caustic pump within travel, moved at most 10 % a sample, held low "
        "when the tank is already alkaline.",
        "action_bounds": {"caustic_pump_pct": [0.0, 100.0]},
        "rate_limits": {"caustic_pump_pct": 10.0},
        "state_limits": [
            {
                "name": "no-caustic-when-alkaline",
                "when": {"feature": "ph", "above": 9.5},
                "action": "caustic_pump_pct",
                "max": 20.0,
            }
        ],
        "fallback": {"kind": "hold_previous"},
    }
    operators_kind = "near-optimal"

    def reset(self, rng: np.random.Generator, n: int) -> State:
        flow = rng.uniform(16.0, 24.0, n)
        acid = rng.uniform(8.0, 12.0, n)
        caustic = flow * acid / CAUSTIC * rng.uniform(0.97, 1.03, n)
        return {
            "excess": rng.normal(0.0, 0.3, n),
            "flow": flow,
            "acid": acid,
            "caustic": caustic,
        }

    def step(self, state: State, action: np.ndarray, rng: np.random.Generator) -> State:
        n = len(state["flow"])
        command = self.clip_action(action)[:, 0] / 100.0 * PUMP_MAX
        caustic = state["caustic"] + 0.6 * (command - state["caustic"])
        excess = state["excess"]
        for _ in range(SUBSTEPS):
            rate = state["flow"] * (state["acid"] - excess) - caustic * (CAUSTIC + excess)
            excess = excess + rate / VOLUME * HOURS / SUBSTEPS
        jump = rng.random(n) < 0.02
        flow = state["flow"] + 0.03 * (20.0 - state["flow"]) + rng.normal(0.0, 0.15, n)
        flow = np.clip(flow + jump * rng.choice([-1.0, 1.0], n) * rng.uniform(2.0, 5.0, n), 8, 32)
        acid = np.clip(
            state["acid"] + 0.01 * (10.0 - state["acid"]) + rng.normal(0.0, 0.08, n), 6.0, 14.0
        )
        return {"excess": excess, "flow": flow, "acid": acid, "caustic": caustic}

    def observe(self, state: State, rng: np.random.Generator) -> dict[str, np.ndarray]:
        n = len(state["flow"])
        return {
            "ph": np.clip(ph_of(state["excess"]) + rng.normal(0.0, 0.02, n), 0.0, 14.0),
            "effluent_flow_m3h": state["flow"] + rng.normal(0.0, 0.1, n),
            "caustic_flow_m3h": np.clip(state["caustic"] + rng.normal(0.0, 0.003, n), 0, 1.2),
        }

    # ----- the operators: ratio control with an adaptive PI trim ---------------------
    def operators_reset(self, rng: np.random.Generator, n: int) -> State:
        return {"strength": np.full(n, 10.0), "pump": np.full(n, np.nan)}

    def operators_act(
        self, memory: State, row: dict[str, np.ndarray], rng: np.random.Generator
    ) -> tuple[np.ndarray, State]:
        n = len(row["ph"])
        error = row["ph"] - 7.0  # below 7: too little caustic
        strength = np.clip(memory["strength"] - 1.0 * error, 4.0, 16.0)
        ratio = row["effluent_flow_m3h"] * strength / CAUSTIC / PUMP_MAX * 100.0
        pump = ratio - 12.0 * error + rng.normal(0.0, 0.3, n)
        pump = pump + (rng.random(n) < 0.005) * rng.normal(0.0, 3.0, n)
        previous = np.where(np.isnan(memory["pump"]), pump, memory["pump"])
        pump = np.clip(np.clip(pump, previous - 10.0, previous + 10.0), 0.0, 100.0)
        return pump[:, None], {"strength": strength, "pump": pump}
