"""Writes ``mixing_tank.csv``: a logged week-end of a mixing tank under its operators' PI
level control, as a plant historian would export it.

The process: a 4 m² tank fed through an inlet valve from a header whose supply flow
drifts, emptied by a variable-speed outlet pump. Sensors: level (m), outlet temperature
(°C, the feed's temperature mixed with the tank's, minus losses) and the measured inflow
(m³/h). Actuators: inlet valve opening and pump speed, both in %. The operators run a PI
controller on the level around a setpoint that they move between shifts, with their own
nudges; header pressure surges now and then push the level up before the controller
catches it; a high-level alarm column is logged when the level exceeds 2.4 m. The log has
gaps (historian outages and maintenance stops), so it splits into several episodes.

Run ``python examples/mixing-tank/generate.py`` to write it again (bit for bit).
"""

from __future__ import annotations

import csv
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

SAMPLING_PERIOD = 10.0  # seconds
AREA = 4.0  # m²
SUPPLY_MAX = 40.0  # m³/h through a fully open valve at nominal header pressure
PUMP_MAX = 36.0  # m³/h at full speed and 1.5 m of level
ALARM_LEVEL = 2.4  # m
ROWS = 4200
GAPS = {
    row: timedelta(minutes=5 + 7 * (row % 3)) for row in (480, 1020, 1500, 2010, 2600, 3100, 3650)
}


def simulate(seed: int = 7) -> list[dict[str, object]]:
    rng = np.random.default_rng(seed)
    level, temperature = 1.6, 48.0
    valve, pump = 45.0, 50.0
    integral = 0.0
    supply = 1.0
    setpoint = 1.8
    surge = 0  # steps left of a header pressure surge
    stamp = datetime(2026, 3, 14, 6, 0, tzinfo=UTC)
    rows = []
    for row in range(ROWS):
        if row in GAPS:
            stamp += GAPS[row]
            level += rng.normal(0.0, 0.05)
        if row % 700 == 0 and row:
            setpoint = float(rng.choice([1.6, 2.0, 2.3, 2.5]))
        supply = float(np.clip(supply + rng.normal(0.0, 0.03) + 0.002 * (1.0 - supply), 0.6, 1.4))
        if surge == 0 and rng.random() < 0.003:
            surge = int(rng.integers(40, 120))
        surge = max(surge - 1, 0)
        feed_temperature = 52.0 + 6.0 * np.sin(row / 500.0) + rng.normal(0.0, 0.3)
        inflow = valve / 100.0 * SUPPLY_MAX * supply * (1.8 if surge else 1.0)
        outflow = pump / 100.0 * PUMP_MAX * np.sqrt(max(level, 0.0) / 1.5)
        # The operators' PI controller (on the pump, the valve follows demand) with noise.
        error = level - setpoint
        integral = float(np.clip(integral + error * SAMPLING_PERIOD / 300.0, -6.0, 6.0))
        target_pump = 45.0 + 25.0 * error + 8.0 * integral + rng.normal(0.0, 4.0)
        target_valve = 45.0 - 10.0 * error + rng.normal(0.0, 5.0)
        if rng.random() < 0.01:  # an operator's nudge
            target_valve += rng.normal(0.0, 20.0)
        pump = float(np.clip(pump + np.clip(target_pump - pump, -8.0, 8.0), 10.0, 100.0))
        valve = float(np.clip(valve + np.clip(target_valve - valve, -12.0, 12.0), 0.0, 100.0))
        rows.append(
            {
                "time": stamp.isoformat().replace("+00:00", "Z"),
                "level_m": round(level + rng.normal(0.0, 0.005), 4),
                "temperature_c": round(temperature + rng.normal(0.0, 0.05), 3),
                "inflow_m3h": round(inflow + rng.normal(0.0, 0.2), 3),
                "valve_pct": round(valve, 2),
                "pump_pct": round(pump, 2),
                "high_level_alarm": int(level > ALARM_LEVEL),
            }
        )
        hours = SAMPLING_PERIOD / 3600.0
        volume = AREA * level
        mixed = (volume * temperature + inflow * hours * feed_temperature) / max(
            volume + inflow * hours, 1e-6
        )
        temperature = mixed - 0.02 * (mixed - 20.0) * hours * 10.0
        level = float(np.clip(level + (inflow - outflow) * hours / AREA, 0.05, 3.2))
        stamp += timedelta(seconds=SAMPLING_PERIOD)
    return rows


def main() -> None:
    rows = simulate()
    path = Path(__file__).with_name("mixing_tank.csv")
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {len(rows)} rows to {path}")


if __name__ == "__main__":
    main()
