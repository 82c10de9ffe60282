"""A fired heater: a process stream heated by burning fuel gas, with the fuel's transport
delay, under sluggish operators (the plant whose operators are clearly beatable).

The stream's flow and inlet temperature drift and step (upstream units change their
rates); the heat released by the fuel reaches the outlet three minutes after the valve
moves (burner and coil delay) and then through the coil's first-order lag (5 min). The
operators run a slow PI loop on the outlet temperature, with no feed-forward from the
feed flow they can see, and aim below the 420 °C target "to keep a margin"; they move
the setpoint between shifts and now and then move the valve by hand. A controller that
uses the measured feed flow and tighter gains holds the target far better.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from benchmarks.plants.base import Column, Cost, Plant, State

DELAY = 3  # steps between a valve move and its heat at the outlet
GAIN = 9.0  # °C of rise per (kg/h of fuel) / (t/h of feed)
FUEL_PER_PCT = 30.0  # kg/h of fuel per % of valve
LAG = 1.0 - np.exp(-1.0 / 5.0)  # the coil's lag: 5 min at 1 min samples
TARGET = 420.0


class FiredHeater(Plant):
    name = "fired-heater"
    description = (
        "A fired heater: fuel valve in %, outlet, inlet temperature and feed flow "
        "measured, 3 min transport delay of the fuel's heat; 1 min samples, 4 h shifts."
    )
    sampling_period = 60.0
    episode_steps = 240
    observations = (
        Column("outlet_temp_c", "degC", 0.0, 1000.0, 2),
        Column("inlet_temp_c", "degC", 0.0, 500.0, 2, exogenous=True),
        Column("feed_flow_t_h", "t/h", 0.0, 200.0, 2, exogenous=True),
        Column("fuel_flow_kg_h", "kg/h", 0.0, 3500.0, 1),
    )
    actions = (Column("fuel_valve_pct", "%", 0.0, 100.0),)
    reward = "-abs(outlet_temp_c - 420) - 0.002 * fuel_flow_kg_h"
    costs = (Cost("overheating", "max(outlet_temp_c - 435, 0)", 60.0),)
    constraints: ClassVar[dict[str, Any]] = {
        "description": "Fuel valve within travel above minimum fire, moved at most 10 % a "
        "minute; cut back hard when the outlet is far too hot.",
        "action_bounds": {"fuel_valve_pct": [5.0, 100.0]},
        "rate_limits": {"fuel_valve_pct": 10.0},
        "state_limits": [
            {
                "name": "cut-fire-when-hot",
                "when": {"feature": "outlet_temp_c", "above": 470.0},
                "action": "fuel_valve_pct",
                "max": 40.0,
            }
        ],
        "fallback": {"kind": "hold_previous"},
    }
    operators_kind = "beatable"

    def reset(self, rng: np.random.Generator, n: int) -> State:
        feed = rng.uniform(65.0, 95.0, n)
        inlet = rng.uniform(240.0, 260.0, n)
        valve = np.clip((TARGET - 15.0 - inlet) * feed / (GAIN * FUEL_PER_PCT), 5.0, 100.0)
        fuel = valve * FUEL_PER_PCT
        return {
            "outlet": inlet + GAIN * fuel / feed + rng.normal(0.0, 3.0, n),
            "inlet": inlet,
            "feed": feed,
            "pipeline": np.repeat(fuel[:, None], DELAY, axis=1),
            "valve": valve,
        }

    def step(self, state: State, action: np.ndarray, rng: np.random.Generator) -> State:
        n = len(state["feed"])
        valve = self.clip_action(action)[:, 0]
        delivered = state["pipeline"][:, 0]
        steady = state["inlet"] + GAIN * delivered / state["feed"]
        outlet = state["outlet"] + LAG * (steady - state["outlet"]) + rng.normal(0.0, 0.5, n)
        # Upstream: the feed drifts back to its rate and steps when a unit changes rate.
        jump = rng.random(n) < 0.02
        feed = state["feed"] + 0.05 * (80.0 - state["feed"]) + rng.normal(0.0, 0.6, n)
        feed = np.clip(
            feed + jump * rng.choice([-1.0, 1.0], n) * rng.uniform(8.0, 18.0, n), 50, 110
        )
        inlet = state["inlet"] + 0.03 * (250.0 - state["inlet"]) + rng.normal(0.0, 0.8, n)
        pipeline = np.concatenate([state["pipeline"][:, 1:], (valve * FUEL_PER_PCT)[:, None]], 1)
        return {
            "outlet": outlet,
            "inlet": inlet,
            "feed": feed,
            "pipeline": pipeline,
            "valve": valve,
        }

    def observe(self, state: State, rng: np.random.Generator) -> dict[str, np.ndarray]:
        n = len(state["feed"])
        return {
            "outlet_temp_c": state["outlet"] + rng.normal(0.0, 0.3, n),
            "inlet_temp_c": state["inlet"] + rng.normal(0.0, 0.3, n),
            "feed_flow_t_h": state["feed"] + rng.normal(0.0, 0.3, n),
            "fuel_flow_kg_h": np.maximum(state["pipeline"][:, -1] + rng.normal(0.0, 5.0, n), 0),
        }

    # ----- the operators: slow PI, aimed low, no feed-forward -----------------------
    def operators_reset(self, rng: np.random.Generator, n: int) -> State:
        return {
            "setpoint": rng.choice([405.0, 410.0, 415.0], n),
            "integral": np.zeros(n),
            "valve": np.full(n, np.nan),
            "step": np.zeros(n),
        }

    def operators_act(
        self, memory: State, row: dict[str, np.ndarray], rng: np.random.Generator
    ) -> tuple[np.ndarray, State]:
        n = len(row["outlet_temp_c"])
        change = (memory["step"] % 80 == 79) & (rng.random(n) < 0.7)
        setpoint = np.where(change, rng.choice([405.0, 410.0, 415.0], n), memory["setpoint"])
        error = setpoint - row["outlet_temp_c"]
        integral = np.clip(memory["integral"] + 0.004 * error, -25.0, 25.0)
        # Their valve position with the loop on manual before (the first row): the fuel
        # flow they read.
        previous = np.where(
            np.isnan(memory["valve"]), row["fuel_flow_kg_h"] / FUEL_PER_PCT, memory["valve"]
        )
        target = 45.0 + 0.12 * error + integral + rng.normal(0.0, 1.5, n)
        manual = rng.random(n) < 0.01
        target = target + manual * rng.normal(0.0, 10.0, n)
        valve = np.clip(previous + np.clip(target - previous, -4.0, 4.0), 5.0, 100.0)
        memory = {
            "setpoint": setpoint,
            "integral": integral,
            "valve": valve,
            "step": memory["step"] + 1,
        }
        return valve[:, None], memory


def feedforward_controller(plant: FiredHeater) -> object:
    """A well-tuned controller the operators could have had: feed-forward of the heat the
    measured feed needs at the target, plus a PI trim (the truth's "clearly better")."""
    from benchmarks.plants.truth import StatelessController

    def act(row: dict[str, np.ndarray], previous: np.ndarray) -> np.ndarray:
        needed = (TARGET - row["inlet_temp_c"]) * row["feed_flow_t_h"] / (GAIN * FUEL_PER_PCT)
        trim = 0.6 * (TARGET - row["outlet_temp_c"])
        valve = needed + np.clip(trim, -8.0, 8.0)
        if previous is not None:
            valve = np.where(
                np.isnan(previous[:, 0]),
                valve,
                np.clip(valve, previous[:, 0] - 10, previous[:, 0] + 10),
            )
        return np.clip(valve, 5.0, 100.0)[:, None]

    return StatelessController(act)
