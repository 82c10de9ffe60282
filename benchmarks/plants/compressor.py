"""A gas compressor feeding a header, with its surge line: the plant whose cost is a
logged 0/1 alarm flag (``surge_alarm``, on when the surge margin is under 5 %).

The compressor runs on its map (the flow it delivers at a speed against the header's
pressure); the header's consumers draw a drifting demand and now and then one trips,
which raises the pressure and drives the compressor towards surge unless the speed
comes down or the recycle (anti-surge) valve opens. Recycled gas costs power. The
operators run a PI loop of the header pressure on the speed and an anti-surge
controller on the recycle valve with a standing opening "for safety" (power wasted),
and the alarm still trips when a consumer drops out fast.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from benchmarks.plants.base import Column, Cost, Plant, State

SUCTION = 1.0  # bar
SETPOINT = 8.0  # bar in the header
SHUT_OFF = 9.0  # (pressure ratio - 1) / speed² at zero flow
CURVE = 0.01  # its drop with the flow squared (per (k m³/h)²)
SURGE = 4.5  # surge flow per sqrt(pressure ratio - 1)
RECYCLE_MAX = 8.0  # k m³/h through the open recycle valve at 8 bar


def compressor_flow(pressure: np.ndarray, speed: np.ndarray) -> np.ndarray:
    """k m³/h the compressor delivers at ``speed`` (fraction) against ``pressure``."""
    rise = pressure / SUCTION - 1.0
    return speed * np.sqrt(np.maximum(SHUT_OFF - rise / speed**2, 0.0) / CURVE)


def surge_margin(pressure: np.ndarray, flow: np.ndarray) -> np.ndarray:
    """Flow over the surge line's, less one."""
    return flow / (SURGE * np.sqrt(np.maximum(pressure / SUCTION - 1.0, 1e-6))) - 1.0


class GasCompressor(Plant):
    name = "gas-compressor"
    description = (
        "A gas compressor on a header: speed and recycle valve in %, header pressure, "
        "flow, speed, power and surge margin measured, a surge alarm flag logged; 5 s "
        "samples, 20 min episodes."
    )
    sampling_period = 5.0
    episode_steps = 240
    observations = (
        Column("discharge_bar", "bar", 0.0, 12.0, 3),
        Column("flow_kscmh", "k m3/h", 0.0, 40.0, 3),
        Column("speed_pct", "%", 0.0, 110.0, 2),
        Column("power_kw", "kW", 0.0, 20000.0, 0),
        Column("surge_margin_pct", "%", -100.0, 400.0, 2),
    )
    actions = (
        Column("speed_cmd_pct", "%", 60.0, 105.0),
        Column("recycle_pct", "%", 0.0, 100.0),
    )
    flags = ("surge_alarm",)
    reward = "-0.001 * power_kw - 3 * abs(discharge_bar - 8)"
    costs = (Cost("surge_alarm", None, 10.0),)
    constraints: ClassVar[dict[str, Any]] = {
        "description": "Speed within the machine's range, moved at most 5 % a sample; the "
        "recycle valve at least 30 % open when the surge margin reads under 8 %.",
        "action_bounds": {"speed_cmd_pct": [60.0, 105.0], "recycle_pct": [0.0, 100.0]},
        "rate_limits": {"speed_cmd_pct": 5.0},
        "state_limits": [
            {
                "name": "recycle-open-near-surge",
                "when": {"feature": "surge_margin_pct", "below": 8.0},
                "action": "recycle_pct",
                "min": 30.0,
            }
        ],
        "fallback": {"kind": "hold_previous"},
    }
    operators_kind = "anti-surge"

    def reset(self, rng: np.random.Generator, n: int) -> State:
        demand = rng.uniform(11.5, 14.0, n)
        return {
            "pressure": SETPOINT + rng.normal(0.0, 0.1, n),
            "demand": demand,
            "speed": np.full(n, 1.0) + rng.normal(0.0, 0.01, n),
            "recycle": np.full(n, 15.0),
        }

    def _recycled(self, state: State) -> np.ndarray:
        opening = state["recycle"] / 100.0
        return opening * RECYCLE_MAX * np.sqrt(np.maximum(state["pressure"] - SUCTION, 0.0) / 7)

    def step(self, state: State, action: np.ndarray, rng: np.random.Generator) -> State:
        n = len(state["demand"])
        action = self.clip_action(action)
        speed = state["speed"] + 0.3 * (action[:, 0] / 100.0 - state["speed"])
        recycle = state["recycle"] + 0.7 * (action[:, 1] - state["recycle"])
        moved = dict(state, speed=speed, recycle=recycle)
        flow = compressor_flow(state["pressure"], speed)
        net = flow - self._recycled(moved) - state["demand"]
        pressure = np.clip(state["pressure"] + 0.03 * net + rng.normal(0.0, 0.005, n), 1.0, 11.5)
        trip = rng.random(n) < 0.008
        demand = state["demand"] + 0.02 * (13.0 - state["demand"]) + rng.normal(0.0, 0.08, n)
        demand = np.clip(demand - trip * rng.uniform(3.0, 6.0, n), 4.0, 18.0)
        return {"pressure": pressure, "demand": demand, "speed": speed, "recycle": recycle}

    def observe(self, state: State, rng: np.random.Generator) -> dict[str, np.ndarray]:
        n = len(state["demand"])
        flow = compressor_flow(state["pressure"], state["speed"])
        margin = surge_margin(state["pressure"], flow)
        power = 300.0 * flow * np.log(state["pressure"] / SUCTION)
        return {
            "discharge_bar": state["pressure"] + rng.normal(0.0, 0.01, n),
            "flow_kscmh": flow + rng.normal(0.0, 0.05, n),
            "speed_pct": 100.0 * state["speed"] + rng.normal(0.0, 0.05, n),
            "power_kw": np.maximum(power + rng.normal(0.0, 5.0, n), 0.0),
            "surge_margin_pct": 100.0 * margin + rng.normal(0.0, 0.5, n),
            "surge_alarm": (margin < 0.05).astype(np.int64),
        }

    # ----- the operators: pressure PI on the speed, anti-surge on the recycle --------
    def operators_reset(self, rng: np.random.Generator, n: int) -> State:
        return {
            "integral": np.zeros(n),
            "speed": np.full(n, np.nan),
            "bias": rng.uniform(10, 20, n),
        }

    def operators_act(
        self, memory: State, row: dict[str, np.ndarray], rng: np.random.Generator
    ) -> tuple[np.ndarray, State]:
        n = len(row["discharge_bar"])
        error = SETPOINT - row["discharge_bar"]
        integral = np.clip(memory["integral"] + 0.4 * error, -30.0, 10.0)
        speed = 100.0 + 6.0 * error + integral + rng.normal(0.0, 0.4, n)
        previous = np.where(np.isnan(memory["speed"]), row["speed_pct"], memory["speed"])
        speed = np.clip(np.clip(speed, previous - 5.0, previous + 5.0), 60.0, 105.0)
        shortfall = np.maximum(15.0 - row["surge_margin_pct"], 0.0)
        recycle = memory["bias"] + 6.0 * shortfall + rng.normal(0.0, 1.5, n)
        recycle = recycle + (rng.random(n) < 0.01) * rng.uniform(0.0, 25.0, n)
        recycle = np.clip(recycle, 0.0, 100.0)
        action = np.stack([speed, recycle], axis=1)
        return action, {"integral": integral, "speed": speed, "bias": memory["bias"]}
