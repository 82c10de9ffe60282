"""The truth about a policy on a study plant: the policy run closed loop in the true
simulator, shield on, over whole episodes, with 95 % intervals; the operators' own truth
the same way (their controller in the loop); and a candidate's true improvement over the
operators measured as the verdict measures it (its starts, horizon and discount).

Controllers (what acts in the loop):

* :func:`policy_controller`: an exported policy artifact folder (what ``neorl-industrial
  train`` / ``export`` writes), loaded as the policy server loads it (its own shield and
  the server's check in the loop), or any ``(observations [n, obs], prev_actions [n,
  act]) -> actions`` in plant units (e.g. ``Agent.predict`` of one run);
* :class:`OperatorsController`: the operators' controller that wrote the log, restarted
  from its memory on the logged row where a start lies mid-episode;
* :class:`StatelessController`: a hand-written controller over the named row.

Two controllers run from one seed meet the same disturbances (the plant's random stream
does not depend on the actions), so improvements are paired and their intervals narrow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.plants.base import Plant, State, logged_row, read_truth

Row = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Interval:
    """A mean and its 95 % interval."""

    value: float
    lower: float
    upper: float

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def mean_interval(values: np.ndarray, level: float = 0.95) -> Interval:
    """Student's t interval of the mean of ``values [n]``."""
    from scipy.stats import t

    values = np.asarray(values, np.float64)
    mean = float(values.mean())
    if len(values) < 2:
        return Interval(mean, mean, mean)
    half = float(
        t.ppf(0.5 + level / 2, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
    )
    return Interval(mean, mean - half, mean + half)


# ----- controllers --------------------------------------------------------------------
class StatelessController:
    """``act(row, previous [n, act] or None) -> actions [n, act]`` in plant units."""

    def __init__(self, act: Callable[[Row, np.ndarray | None], np.ndarray]):
        self.act = act

    def reset(self, plant: Plant, rng: np.random.Generator, n: int, memory: State | None) -> Any:
        return None

    def __call__(
        self, memory: Any, row: Row, previous: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, Any]:
        return np.asarray(self.act(row, previous), np.float64), None


class OperatorsController:
    """The operators' controller of ``plant`` (its noise and manual moves included)."""

    def __init__(self, plant: Plant):
        self.plant = plant

    def reset(self, plant: Plant, rng: np.random.Generator, n: int, memory: State | None) -> Any:
        return plant.operators_reset(rng, n) if memory is None else dict(memory)

    def __call__(
        self, memory: Any, row: Row, previous: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, Any]:
        return self.plant.operators_act(memory, row, rng)


class HistoryController:
    """A policy whose observation stacks the last ``history`` rows (a log imported with
    ``history: H``), newest first, as the plant-floor loop keeps them: ``act(observations
    [n, H x obs], previous [n, act]) -> actions``. Its memory is the earlier rows
    (``[n, H - 1, obs]``, newest first): the logged ones where a start lies mid-episode,
    else the first row repeated, as the import pads an episode's start."""

    def __init__(
        self, plant: Plant, act: Callable[[np.ndarray, np.ndarray], np.ndarray], history: int
    ):
        self.plant = plant
        self.act = act
        self.history = history

    def reset(self, plant: Plant, rng: np.random.Generator, n: int, memory: Any) -> Any:
        return None if memory is None else np.asarray(memory, np.float32)

    def __call__(
        self, memory: Any, row: Row, previous: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, Any]:
        frame = self.plant.matrix(row).astype(np.float32)[:, None]
        earlier = np.repeat(frame, self.history - 1, axis=1) if memory is None else memory
        rows = np.concatenate([frame, earlier], axis=1)
        observations = rows.reshape(len(rows), -1)
        action = np.asarray(self.act(observations, previous.astype(np.float32)), np.float64)
        return action, rows[:, :-1]


def policy_controller(
    plant: Plant, policy: str | Path | Callable, *, history: int = 1
) -> StatelessController | HistoryController:
    """A policy in the loop: an artifact folder loaded as the server loads it (shield on,
    the server's check of every action), or ``policy(observations, prev_actions)``; with a
    ``history``, fed the last rows stacked (:class:`HistoryController`)."""
    from neorl_industrial.core.environments.history import stacked_names

    expected = list(stacked_names(plant.observation_names, history))
    if isinstance(policy, str | Path):
        from neorl_industrial.integration.deployment.policy import (
            PolicyTrust,
            load_policy_source,
        )

        loaded = load_policy_source(str(policy), None, [1], trust=PolicyTrust(allow_unsigned=True))
        names = list(loaded.artifact.observation_names)
        if names != expected:
            raise ValueError(
                f"{policy}: a policy for observations {names}, not {plant.name}'s {expected}"
            )
        artifact = loaded.artifact

        def act(observations: np.ndarray, previous: np.ndarray) -> np.ndarray:
            return np.asarray(artifact.decide_rows(observations, previous).action)

    else:
        act = policy

    if history > 1:
        return HistoryController(plant, act, history)

    def stateless(row: Row, previous: np.ndarray | None) -> np.ndarray:
        observations = plant.matrix(row).astype(np.float32)
        return np.asarray(act(observations, previous.astype(np.float32)), np.float64)

    return StatelessController(stateless)


# ----- closed loop ---------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Runs:
    """Per run: undiscounted return, discounted return and per-channel cost sums."""

    returns: np.ndarray  # [n]
    discounted: np.ndarray  # [n]
    costs: np.ndarray  # [n, C]
    steps: np.ndarray  # [n]


def closed_loop(
    plant: Plant,
    controller: Any,
    states: State,
    steps: np.ndarray,
    *,
    seed: int,
    memory: State | None = None,
    previous: np.ndarray | None = None,
    discount: float = 1.0,
) -> Runs:
    """Runs ``controller`` on the plant from ``states`` (batched) for ``steps [n]``
    transitions each; reward and costs of each transition are the schema's, on the row
    the action led to (as the log's are)."""
    steps = np.asarray(steps, np.int64)
    n = len(steps)
    plant_rng = np.random.default_rng([seed, 0])
    control_rng = np.random.default_rng([seed, 1])
    state = {k: np.array(v) for k, v in states.items()}
    memory = controller.reset(plant, control_rng, n, memory)
    prev = (
        np.full((n, len(plant.actions)), np.nan)
        if previous is None
        else np.asarray(previous, float)
    )
    returns, discounted = np.zeros(n), np.zeros(n)
    costs = np.zeros((n, len(plant.costs)))
    row = logged_row(plant, state, plant_rng)
    for t in range(int(steps.max(initial=0))):
        action, memory = controller(memory, row, prev, control_rng)
        action = plant.clip_action(action)
        state = plant.step(state, action, plant_rng)
        row = logged_row(plant, state, plant_rng)
        reward, cost = plant.signals(row)
        live = t < steps
        returns += np.where(live, reward, 0.0)
        discounted += np.where(live, reward * discount**t, 0.0)
        costs += np.where(live[:, None], cost, 0.0)
        prev = action
    return Runs(returns, discounted, costs, steps)


def _take(states: State, index: np.ndarray) -> State:
    return {k: v[index] for k, v in states.items()}


def episode_truth(plant: Plant, controller: Any, *, episodes: int = 100, seed: int = 12345) -> Runs:
    """``episodes`` whole episodes from the plant's own start distribution."""
    states = plant.reset(np.random.default_rng([seed, 2]), episodes)
    return closed_loop(plant, controller, states, np.full(episodes, plant.episode_steps), seed=seed)


def summarize(runs: Runs, limits: Sequence[float]) -> dict[str, Any]:
    """Mean episode return and per-channel cost, each with its 95 % interval, and the
    share of episodes over each limit."""
    return {
        "return": mean_interval(runs.returns).to_dict(),
        "cost": [mean_interval(runs.costs[:, c]).to_dict() for c in range(runs.costs.shape[1])],
        "normalized_cost": float(
            max(
                (runs.costs[:, c].mean() / limit for c, limit in enumerate(limits) if limit > 0),
                default=0.0,
            )
        ),
        "over_limit_share": [
            float((runs.costs[:, c] > limit).mean()) for c, limit in enumerate(limits)
        ],
        "episodes": len(runs.returns),
    }


# ----- the verdict's starts ------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Starts:
    """Where the verdict starts its rollouts, in the log: the episode, the row within it
    and the transitions to follow (its horizon, capped at the episode's end)."""

    episode: np.ndarray  # [N] the log's episode
    row: np.ndarray  # [N] the row within it
    length: np.ndarray  # [N]
    #: [N] the held-out episode of each start (the verdict's resampling unit)
    group: np.ndarray


def verdict_starts(
    heldout: Any, holdout_episodes: Sequence[int], *, max_starts: int, horizon: int
) -> Starts:
    """The verdict's own starts (``evaluation_starts``) and lengths (``min(steps to the
    episode's end, horizon)``, the horizon capped by the longest) on the held-out
    dataset, mapped to the log's episodes (``holdout_episodes``, from the plant model's
    card, in the held-out dataset's order)."""
    import jax

    from neorl_industrial.wrappers.training.verdict import evaluation_starts

    rows, groups = evaluation_starts(heldout, max_starts)
    first = np.asarray(jax.device_get(heldout.episode_starts), np.int64)
    to_end = np.asarray(jax.device_get(heldout.steps_to_end), np.int64)[rows]
    horizon = int(min(horizon, to_end.max()))
    episodes = np.asarray(holdout_episodes, np.int64)[groups]
    return Starts(episodes, rows - first[groups], np.minimum(to_end, horizon), groups)


def _by_replicate(values: np.ndarray, replicates: int) -> np.ndarray:
    """``[replicates, N]`` of start-major ``[N x replicates]`` run values."""
    return values.reshape(-1, replicates).T


class PlantTruth:
    """The truth of one written log: its plant and the simulator's state on every row.

    Args:
        plant: the plant that wrote the log.
        folder: the folder :func:`~benchmarks.plants.base.write_log` wrote.
    """

    def __init__(self, plant: Plant, folder: str | Path):
        self.plant = plant
        self.saved = read_truth(folder)
        self.limits = [cost.limit for cost in plant.costs]
        #: Rows per observation of the written log (its schema's ``history``).
        self.history = int(self.saved["history"])

    def operators(self) -> OperatorsController:
        return OperatorsController(self.plant)

    def controller(self, policy: Any) -> Any:
        """A controller from a policy artifact folder, a callable or a controller."""
        if hasattr(policy, "reset"):
            return policy
        return policy_controller(self.plant, policy, history=self.history)

    def episodes(self, policy: Any, *, episodes: int = 100, seed: int = 12345) -> dict[str, Any]:
        """Whole-episode truth from the plant's start distribution (:func:`summarize`)."""
        runs = episode_truth(self.plant, self.controller(policy), episodes=episodes, seed=seed)
        return summarize(runs, self.limits) | {"_runs": runs}

    def at_starts(
        self,
        policy: Any,
        starts: Starts,
        *,
        discount: float,
        replicates: int = 20,
        seed: int = 777,
    ) -> np.ndarray:
        """``[replicates, N]`` discounted returns from the starts (each replicate its own
        disturbances; the same for every controller at the same seed)."""
        runs = self.runs_at_starts(
            policy, starts, discount=discount, replicates=replicates, seed=seed
        )
        return _by_replicate(runs.discounted, replicates)

    def runs_at_starts(
        self,
        policy: Any,
        starts: Starts,
        *,
        discount: float,
        replicates: int = 20,
        seed: int = 777,
    ) -> Runs:
        """The closed-loop runs from the starts, ``replicates`` per start (start-major)."""
        controller = self.controller(policy)
        index = (np.repeat(starts.episode, replicates), np.repeat(starts.row, replicates))
        states = {k: v[index] for k, v in self.saved["states"].items()}
        memory = {k: v[index] for k, v in self.saved["memory"].items()}
        actions = self.saved["actions"]
        previous = np.where(
            (index[1] > 0)[:, None], actions[index[0], np.maximum(index[1] - 1, 0)], np.nan
        )
        if isinstance(controller, HistoryController):
            # The logged rows before each start, newest first (the first row repeated
            # before an episode's start, as the import pads it).
            ages = np.maximum(index[1][:, None] - np.arange(1, controller.history), 0)
            logged = np.stack(
                [self.saved["columns"][name] for name in self.plant.observation_names], -1
            )
            memory = logged[index[0][:, None], ages].astype(np.float32)
        elif not isinstance(controller, OperatorsController):
            memory = None
        return closed_loop(
            self.plant,
            controller,
            states,
            np.repeat(starts.length, replicates),
            seed=seed,
            memory=memory,
            previous=previous,
            discount=discount,
        )

    def cost_rate_at_starts(self, runs: Runs, starts: Starts, replicates: int) -> list[float]:
        """Per cost channel: the runs' cost from the starts as a share of what the
        episode limit allows over their lengths (the verdict's ``model`` cost reading:
        ``Σ cost / (limit x length / episode length)``, mean over starts); None where not
        limited."""
        length = np.repeat(starts.length, replicates).astype(np.float64)
        steps = float(self.plant.episode_steps)
        return [
            float(np.mean(runs.costs[:, c] / np.maximum(limit * length / steps, 1e-12)))
            if limit > 0 and np.isfinite(limit)
            else None
            for c, limit in enumerate(self.limits)
        ]

    def improvement(
        self,
        policy: Any,
        starts: Starts,
        *,
        discount: float,
        replicates: int = 20,
        seed: int = 777,
        baseline: np.ndarray | None = None,
    ) -> dict[str, Any]:
        """The candidate's true improvement over the operators' closed loop from the
        verdict's starts: mean over starts of the discounted-return difference, paired
        replicate by replicate, with its 95 % interval over the replicates (the starts are
        the verdict's, fixed), and its cost per channel at the starts (``cost_rate``,
        :meth:`cost_rate_at_starts`). ``baseline``: the operators' :meth:`at_starts`, if known."""
        if baseline is None:
            baseline = self.at_starts(
                self.operators(), starts, discount=discount, replicates=replicates, seed=seed
            )
        runs = self.runs_at_starts(
            policy, starts, discount=discount, replicates=replicates, seed=seed
        )
        own = _by_replicate(runs.discounted, replicates)
        gain = mean_interval((own - baseline).mean(axis=1))
        return {
            "cost_rate": self.cost_rate_at_starts(runs, starts, replicates),
            "improvement": gain.to_dict(),
            "value": mean_interval(own.mean(axis=1)).to_dict(),
            "operators": mean_interval(baseline.mean(axis=1)).to_dict(),
        }
