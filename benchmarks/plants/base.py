"""What every study plant is: a batched numpy simulator in plant units, its operators'
controller, and the historian log the two of them write.

A plant is simulated for a batch of ``n`` independent runs at once (every array's first
axis). Two random streams drive a closed loop: the plant's (disturbances, process and
sensor noise; the same draws whatever the controller does, so that two controllers run
from one seed meet the same disturbances) and the controller's own (the operators' noise
and manual moves).

The log is what a plant historian exports: a CSV with a timestamp column, one column per
sensor and actuator in plant units and the logged alarm flags, episodes separated by
gaps in time; beside it ``schema.yaml`` (the documented plant-log schema),
``constraints.yaml`` (the safety engineer's spec), ``run.yaml`` (``neorl-industrial
train``) and ``truth.npz``: the simulator's own state on every row (never imported), from
which the truth restarts the plant.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import yaml

State = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Column:
    """A logged column: its name, unit and physical range (an action's travel)."""

    name: str
    unit: str
    low: float
    high: float
    #: decimals the historian keeps
    decimals: int = 3
    #: no action moves it (a measured disturbance): ``exogenous: true`` in the schema
    exogenous: bool = False


@dataclasses.dataclass(frozen=True)
class Cost:
    """A cost channel: an expression over the row, or the logged column ``name``."""

    name: str
    expression: str | None
    limit: float


class Plant:
    """A study plant (subclasses set the class attributes and the physics)."""

    name: str
    description: str
    sampling_period: float  # seconds between rows
    episode_steps: int  # transitions per episode (rows: one more)
    observations: tuple[Column, ...]
    actions: tuple[Column, ...]
    flags: tuple[str, ...] = ()  # logged 0/1 columns that are not observations
    reward: str  # over the row an action led to (reward_row: next)
    costs: tuple[Cost, ...]
    constraints: ClassVar[dict[str, Any]]
    #: what the operators are: "beatable" or "near-optimal"
    operators_kind: str

    # ----- physics ------------------------------------------------------------------
    def reset(self, rng: np.random.Generator, n: int) -> State:
        raise NotImplementedError

    def step(self, state: State, action: np.ndarray, rng: np.random.Generator) -> State:
        """The state one sampling period later under ``action [n, act]`` (plant units,
        clipped to the actuators' travel)."""
        raise NotImplementedError

    def observe(self, state: State, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """The row the historian logs for ``state``: every observation column (sensor
        noise added) and every flag."""
        raise NotImplementedError

    # ----- operators ----------------------------------------------------------------
    def operators_reset(self, rng: np.random.Generator, n: int) -> State:
        raise NotImplementedError

    def operators_act(
        self, memory: State, row: dict[str, np.ndarray], rng: np.random.Generator
    ) -> tuple[np.ndarray, State]:
        """The operators' action for the logged ``row`` and their memory after it."""
        raise NotImplementedError

    # ----- derived ------------------------------------------------------------------
    @property
    def observation_names(self) -> list[str]:
        return [c.name for c in self.observations]

    @property
    def action_names(self) -> list[str]:
        return [c.name for c in self.actions]

    @property
    def action_low(self) -> np.ndarray:
        return np.asarray([c.low for c in self.actions])

    @property
    def action_high(self) -> np.ndarray:
        return np.asarray([c.high for c in self.actions])

    def clip_action(self, action: np.ndarray) -> np.ndarray:
        return np.clip(np.asarray(action, np.float64), self.action_low, self.action_high)

    def matrix(self, row: dict[str, np.ndarray]) -> np.ndarray:
        """``[n, obs]`` observations of a row, in the schema's order."""
        return np.stack([row[name] for name in self.observation_names], axis=1)

    def signals(self, row: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """``(reward [n], costs [n, C])`` of the row an action led to, by the schema's own
        expressions (the product's evaluator: the log's numbers and the truth's agree)."""
        n = len(next(iter(row.values())))
        reward, costs = self._expressions
        values = [
            np.asarray(row[cost.name], np.float64)
            if expression is None
            else expression.evaluate(row, n)
            for cost, expression in zip(self.costs, costs, strict=True)
        ]
        return np.asarray(reward.evaluate(row, n), np.float64), np.stack(values, axis=1)

    @functools.cached_property
    def _expressions(self) -> tuple[Any, list[Any]]:
        from neorl_industrial.integration.datasets.expressions import Expression

        return Expression(self.reward), [
            None if cost.expression is None else Expression(cost.expression) for cost in self.costs
        ]

    def schema(self, history: int = 1) -> dict[str, Any]:
        """The plant-log schema of the log (docs: the plant-log schema), its observations
        stacking the last ``history`` rows."""
        return {
            "name": self.name,
            "description": self.description,
            "timestamp": "time",
            "sampling_period": self.sampling_period,
            "gap_factor": 1.5,
            "observations": [
                {"column": c.name, "unit": c.unit, "physical": [c.low, c.high]}
                | ({"exogenous": True} if c.exogenous else {})
                for c in self.observations
            ],
            "actions": [
                {"column": c.name, "unit": c.unit, "bounds": [c.low, c.high]} for c in self.actions
            ],
            "reward": self.reward,
            "reward_row": "next",
            "costs": [
                {"name": cost.name, "limit": cost.limit}
                | ({"expression": cost.expression} if cost.expression is not None else {})
                for cost in self.costs
            ],
        } | ({"history": history} if history > 1 else {})


Controller = Callable[[dict[str, np.ndarray], np.ndarray, np.ndarray], np.ndarray]


def _round(values: np.ndarray, decimals: int) -> np.ndarray:
    return np.round(np.asarray(values, np.float64), decimals)


def simulate_log(plant: Plant, seed: int, episodes: int) -> dict[str, Any]:
    """``episodes`` episodes of the operators running the plant, side by side: every
    row's logged columns (rounded as the historian keeps them), actions, the plant's
    state and the operators' memory, ``[episodes, rows, ...]``."""
    plant_rng = np.random.default_rng([seed, 0])
    operator_rng = np.random.default_rng([seed, 1])
    state = plant.reset(plant_rng, episodes)
    memory = plant.operators_reset(operator_rng, episodes)
    rows = plant.episode_steps + 1
    columns: dict[str, list[np.ndarray]] = {}
    actions, states, memories = [], [], []
    for _ in range(rows):
        row = logged_row(plant, state, plant_rng)
        action, next_memory = plant.operators_act(memory, row, operator_rng)
        action = np.round(plant.clip_action(action), 2)
        for name, value in row.items():
            columns.setdefault(name, []).append(value)
        actions.append(action)
        states.append(state)
        memories.append(memory)
        state = plant.step(state, action, plant_rng)
        memory = next_memory

    def stacked(items: list[State]) -> State:
        return {key: np.stack([item[key] for item in items], axis=1) for key in items[0]}

    return {
        "columns": {name: np.stack(values, axis=1) for name, values in columns.items()},
        "actions": np.stack(actions, axis=1),
        "states": stacked(states),
        "memory": stacked(memories),
    }


def _decimals(plant: Plant, name: str) -> int:
    return next((c.decimals for c in plant.observations if c.name == name), 3)


def logged_row(plant: Plant, state: State, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The row the historian keeps of ``state``: observed, rounded to its decimals."""
    return {
        name: value if name in plant.flags else _round(value, _decimals(plant, name))
        for name, value in plant.observe(state, rng).items()
    }


def write_log(
    plant: Plant, folder: str | Path, *, seed: int = 0, episodes: int = 16, history: int = 1
) -> Path:
    """Writes the plant's historian log and its files into ``folder``: ``<name>.csv``,
    ``schema.yaml`` (observations of ``history`` rows), ``constraints.yaml``, ``run.yaml``
    and ``truth.npz``. Returns the CSV's path.

    Raises:
        ValueError: for fewer than 4 episodes (a held-out quarter needs at least one).
    """
    if episodes < 4:
        raise ValueError(f"episodes: expected at least 4, got {episodes}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    log = simulate_log(plant, seed, episodes)
    rows = plant.episode_steps + 1
    period = timedelta(seconds=plant.sampling_period)
    stamp = datetime(2026, 1, 5, 6, 0, tzinfo=UTC)
    header = ["time", *plant.observation_names, *plant.action_names, *plant.flags]
    lines = [",".join(header)]
    for episode in range(episodes):
        for row in range(rows):
            values = [stamp.isoformat().replace("+00:00", "Z")]
            values += [
                repr(float(log["columns"][n][episode, row])) for n in plant.observation_names
            ]
            values += [repr(float(v)) for v in log["actions"][episode, row]]
            values += [str(int(log["columns"][n][episode, row])) for n in plant.flags]
            lines.append(",".join(values))
            stamp += period
        # A shift change, a maintenance stop: the historian's gap starts a new episode.
        stamp += timedelta(minutes=30 + 15 * (episode % 3))
    csv = folder / f"{plant.name}.csv"
    csv.write_text("\n".join(lines) + "\n")
    (folder / "schema.yaml").write_text(yaml.safe_dump(plant.schema(history), sort_keys=False))
    constraints = {"name": plant.name, **plant.constraints}
    (folder / "constraints.yaml").write_text(yaml.safe_dump(constraints, sort_keys=False))
    run = {
        "name": f"{plant.name}-td3bc-lag",
        "data": {"path": str(folder / "dataset")},
        "algorithm": {"name": "td3bc-lag", "hyperparameters": {"hidden": [64, 64]}},
        "training": {"updates": 2000, "chunk": 1000, "seeds": [0, 1]},
        "evaluation": {"ope": {"holdout": 0.25, "updates": 500, "seeds": [0, 1]}},
        "safety": {"constraints": str(folder / "constraints.yaml")},
    }
    (folder / "run.yaml").write_text(yaml.safe_dump(run, sort_keys=False))
    np.savez_compressed(
        folder / "truth.npz",
        seed=seed,
        episodes=episodes,
        history=history,
        **{f"column.{k}": v for k, v in log["columns"].items()},
        **{f"state.{k}": v for k, v in log["states"].items()},
        **{f"memory.{k}": v for k, v in log["memory"].items()},
        actions=log["actions"],
    )
    return csv


def read_truth(folder: str | Path) -> dict[str, Any]:
    """The simulator's state, the operators' memory and the logged columns on every row
    (``[episodes, rows, ...]``) and the schema's ``history``, as :func:`write_log` saved
    them."""
    with np.load(Path(folder) / "truth.npz") as saved:
        data = {key: saved[key] for key in saved.files}
    return {
        "states": {k.removeprefix("state."): v for k, v in data.items() if k.startswith("state.")},
        "memory": {
            k.removeprefix("memory."): v for k, v in data.items() if k.startswith("memory.")
        },
        "columns": {
            k.removeprefix("column."): v for k, v in data.items() if k.startswith("column.")
        },
        "actions": data["actions"],
        "seed": int(data["seed"]),
        "history": int(data.get("history", 1)),
    }
