"""Per-episode arrays checked and joined into the flat arrays of a dataset (what
:meth:`Dataset.from_episodes` builds on), with errors that name the episode and field."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["EpisodeColumns"]


class EpisodeColumns:
    """Accumulates validated episodes and builds the index arrays once."""

    def __init__(self, name: str):
        self.name = name
        self.parts: dict[str, list[np.ndarray]] = {
            k: [] for k in ("observations", "actions", "rewards", "costs", "terminals", "timeouts")
        }
        self.lengths: list[int] = []
        self.obs_size: int | None = None
        self.action_shape: tuple[int, ...] | None = None
        self.n_costs: int | None = None

    def _where(self, number: int, episode: dict[str, Any], field: str, row: int | None = None):
        first_row = episode.get("first_row")
        if row is not None and first_row is not None:
            return f"{self.name}: {field} at row {first_row + row} (episode {number})"
        if row is not None:
            return f"{self.name}: episode {number}, {field} step {row}"
        return f"{self.name}: episode {number}, {field}"

    def add(self, number: int, episode: dict[str, Any]) -> None:
        for field in ("observations", "actions", "rewards"):
            if episode.get(field) is None:
                raise ValueError(f"{self._where(number, episode, field)}: missing")
        observations = np.asarray(episode["observations"], np.float32)
        rewards = np.asarray(episode["rewards"], np.float32).reshape(-1)
        length = len(rewards)
        if length == 0:
            raise ValueError(f"{self._where(number, episode, 'rewards')}: empty episode")
        if observations.ndim != 2 or len(observations) != length + 1:
            raise ValueError(
                f"{self._where(number, episode, 'observations')}: expected shape "
                f"[{length + 1}, obs_size] (one more than the {length} steps), "
                f"got {observations.shape}"
            )
        actions = np.asarray(episode["actions"])
        discrete = np.issubdtype(actions.dtype, np.integer) and actions.ndim == 1
        actions = actions.astype(np.int32 if discrete else np.float32)
        if actions.ndim == 1 and not discrete:
            actions = actions[:, None]
        if len(actions) != length:
            raise ValueError(
                f"{self._where(number, episode, 'actions')}: {len(actions)} rows for {length} steps"
            )
        costs = episode.get("costs")
        costs = (
            np.zeros((length, 0), np.float32)
            if costs is None
            else np.asarray(costs, np.float32).reshape(length, -1)
        )
        for field, array in (
            ("observations", observations),
            ("actions", actions),
            ("rewards", rewards),
            ("costs", costs),
        ):
            if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
                bad = int(np.argwhere(~np.isfinite(array))[0][0])
                raise ValueError(f"{self._where(number, episode, field, bad)}: NaN or infinite")
        self._check_consistent(number, "observation size", observations.shape[1], "obs_size")
        self._check_consistent(number, "action shape", actions.shape[1:], "action_shape")
        self._check_consistent(number, "number of costs", costs.shape[1], "n_costs")
        terminated = bool(episode.get("terminated", False))
        terminals = np.zeros(length, bool)
        timeouts = np.zeros(length, bool)
        (terminals if terminated else timeouts)[-1] = True
        for field, array in (
            ("observations", observations),
            ("actions", actions),
            ("rewards", rewards),
            ("costs", costs),
            ("terminals", terminals),
            ("timeouts", timeouts),
        ):
            self.parts[field].append(array)
        self.lengths.append(length)

    def _check_consistent(self, number: int, what: str, value: Any, attribute: str) -> None:
        current = getattr(self, attribute)
        if current is None:
            setattr(self, attribute, value)
        elif current != value:
            raise ValueError(
                f"{self.name}: episode {number} has {what} {value}, earlier episodes {current}"
            )

    def arrays(self) -> dict[str, np.ndarray]:
        """The accumulated episodes as the arrays :meth:`Dataset.from_arrays` takes."""
        arrays = {field: np.concatenate(parts) for field, parts in self.parts.items()}
        return {**arrays, "episode_lengths": np.asarray(self.lengths, np.int32)}
