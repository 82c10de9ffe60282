"""The offline dataset as a PyTree on device, with its episode structure precomputed.

Observations are stored once per step, episode by episode, with each episode's final
next-observation appended: an episode of ``T`` steps holds ``T + 1`` observations, and the
next observation of transition ``i`` is the row after ``observation_index[i]``. Memory per
transition stays within ``(T + 1) / T`` of the raw observations, and no second copy of
every observation exists.

Stacked observations (a history of ``H`` frames, newest first, each step's observation the
previous one shifted by a frame, as IB-v0's 30 frames of 6 values) are stored as frames:
each episode holds its first observation's ``H`` frames (oldest first) and then one new
frame per step, ``T + H`` rows of ``F`` values instead of ``T + 1`` rows of ``H * F``. An
observation is the ``H`` rows ending at its newest frame, gathered inside the compiled
sampler (:meth:`Dataset.observations_at`). :meth:`Dataset.from_arrays` finds the stacking
in the data itself (exact equality, so storing frames loses nothing); nothing names a
simulator.

Everything sampling needs (episode ids, steps to the episode's end, valid window starts)
is computed once here, on the host, so a batch is a handful of gathers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from neorl_industrial.functional.state_management.episode_columns import EpisodeColumns
from neorl_industrial.functional.state_management.frames import (
    find_frame_stack,
    gather_stacked,
    observation_rows,
    padded_frames,
    stored_rows,
    to_frames,
)

__all__ = [
    "Dataset",
    "episode_range_arrays",
    "episodes_dataset",
    "find_frame_stack",
    "gather_stacked",
    "observation_rows",
    "split_episodes",
    "stored_rows",
    "to_frames",
]


@struct.dataclass
class Dataset:
    """Transitions of many episodes and the indices that make sampling cheap.

    Shapes: ``N`` transitions, ``E`` episodes, ``N + E`` stored observations (``N + E H``
    frames of ``obs_size / H`` values when ``frame_stack`` is ``H > 1``).
    """

    observations: jax.Array  # [N + E H, obs_size / H] float32, episode-major with final obs
    actions: jax.Array  # [N, action_size] float32, or [N] int32 for discrete actions
    rewards: jax.Array  # [N] float32
    costs: jax.Array  # [N, n_costs] float32
    terminals: jax.Array  # [N] bool: the episode ended in a terminal state
    timeouts: jax.Array  # [N] bool: the episode was cut off (no terminal state)
    observation_index: jax.Array  # [N] int32: row of transition i's observation
    episode_id: jax.Array  # [N] int32
    steps_to_end: jax.Array  # [N] int32: transitions left in the episode, >= 1
    episode_starts: jax.Array  # [E] int32: first transition of each episode
    episode_lengths: jax.Array  # [E] int32
    #: Frames per observation (1: rows are whole observations); see the module docs.
    frame_stack: int = struct.field(pytree_node=False, default=1)

    # ----- sizes (static: read from shapes) ------------------------------------------
    @property
    def n_transitions(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def n_episodes(self) -> int:
        return int(self.episode_starts.shape[0])

    @property
    def observation_size(self) -> int:
        return int(self.observations.shape[1]) * self.frame_stack

    @property
    def frame_size(self) -> int:
        """Values per stored row: a frame, or the whole observation without stacking."""
        return int(self.observations.shape[1])

    @property
    def action_size(self) -> int:
        return 1 if self.actions.ndim == 1 else int(self.actions.shape[1])

    @property
    def discrete(self) -> bool:
        return self.actions.ndim == 1

    @property
    def n_costs(self) -> int:
        return int(self.costs.shape[1])

    def __len__(self) -> int:
        return self.n_transitions

    # ----- views ----------------------------------------------------------------------
    def observations_at(self, rows: Any) -> Any:
        """``[..., obs_size]`` observations whose newest stored row is ``rows`` (as
        ``observation_index`` gives them): a gather of ``frame_stack`` rows each. Works on
        device arrays inside compiled code and on a host copy (``jax.device_get``) alike."""
        return gather_stacked(self.observations, rows, self.frame_stack)

    def observation_rows(self) -> np.ndarray:
        """``[N + E]`` stored row of every observation (each transition's and each
        episode's final one), episode-major, on the host."""
        return observation_rows(jax.device_get(self.episode_lengths), self.frame_stack)

    def all_observations(self) -> jax.Array:
        """``[N + E, obs_size]`` every observation, final ones included (allocates the
        full stack)."""
        return self.observations_at(jnp.asarray(self.observation_rows(), jnp.int32))

    def observation_moments(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of every observation feature over all ``N + E``
        observations, in float64 on the host, without building the stacked array."""
        frames = np.asarray(jax.device_get(self.observations))
        rows = self.observation_rows()
        means, stds = [], []
        for age in range(self.frame_stack):
            values = frames[rows - age].astype(np.float64)
            means.append(values.mean(0))
            stds.append(values.std(0))
        return np.concatenate(means), np.concatenate(stds)

    def newest_frames(self) -> Dataset:
        """The same episodes with each observation cut to its newest frame (itself when
        observations stack no frames)."""
        if self.frame_stack == 1:
            return self
        frames = np.asarray(jax.device_get(self.observations))[self.observation_rows()]
        return Dataset.from_arrays(
            observations=frames,
            actions=self.actions,
            rewards=self.rewards,
            costs=self.costs,
            terminals=self.terminals,
            timeouts=self.timeouts,
            episode_lengths=self.episode_lengths,
            frame_stack=1,
        )

    def transition_observations(self) -> jax.Array:
        """``[N, obs_size]`` observation of every transition (a gather; allocates)."""
        return self.observations_at(self.observation_index)

    def next_observations(self) -> jax.Array:
        """``[N, obs_size]`` next observation of every transition (a gather; allocates)."""
        return self.observations_at(self.observation_index + 1)

    def initial_observations(self) -> jax.Array:
        """``[E, obs_size]`` first observation of every episode."""
        return self.observations_at(self.observation_index[self.episode_starts])

    def episode_observations(self, episode: int) -> np.ndarray:
        """``[T + 1, obs_size]`` observations of one episode, final one included (host)."""
        host = jax.device_get(self)
        first = int(host.observation_index[int(host.episode_starts[episode])])
        length = int(host.episode_lengths[episode])
        return np.asarray(host.observations_at(np.arange(first, first + length + 1)))

    def episode_returns(self) -> jax.Array:
        """``[E]`` undiscounted return of every episode."""
        return jax.ops.segment_sum(self.rewards, self.episode_id, self.n_episodes)

    def episode_costs(self) -> jax.Array:
        """``[E, n_costs]`` summed costs of every episode."""
        return jax.ops.segment_sum(self.costs, self.episode_id, self.n_episodes)

    def nbytes(self) -> int:
        """Bytes held on device by the dataset, indices included."""
        return sum(int(leaf.nbytes) for leaf in jax.tree.leaves(self))

    def raw_nbytes(self) -> int:
        """Bytes of the same data as flat arrays: observations, actions, rewards, costs
        and flags per transition, without next observations or indices."""
        n = self.n_transitions
        per_transition = (
            self.observation_size * self.observations.dtype.itemsize
            + int(np.prod(self.actions.shape[1:], dtype=np.int64)) * self.actions.dtype.itemsize
            + self.rewards.dtype.itemsize
            + self.n_costs * self.costs.dtype.itemsize
            + 2
        )
        return n * per_transition

    # ----- construction ---------------------------------------------------------------
    @classmethod
    def from_arrays(
        cls,
        observations: Any,
        actions: Any,
        rewards: Any,
        costs: Any,
        terminals: Any,
        timeouts: Any,
        episode_lengths: Any,
        *,
        frame_stack: int | None = None,
    ) -> Dataset:
        """The dataset of already laid-out arrays: the episode structure follows from the
        episode lengths, so the sampling indices are computed here, once, in numpy.

        ``observations`` has ``N + E`` rows (each episode's steps, then its final
        observation), or ``N + E H`` frames when ``frame_stack`` is ``H > 1``; the others
        have ``N`` rows. With ``frame_stack=None`` the observations are whole ones, and
        stacked frames are found in them (:func:`find_frame_stack`) and stored once.
        Arrays may be memory-mapped: each is read once, straight into device memory.
        Callers validate untrusted input.
        """
        lengths = np.asarray(episode_lengths, np.int32)
        if frame_stack is None:
            frame_stack = find_frame_stack(observations, lengths)
            if frame_stack > 1:
                observations = to_frames(np.asarray(observations), lengths, frame_stack)
        ends = np.cumsum(lengths, dtype=np.int64)
        starts = ends - lengths
        n_transitions = int(ends[-1])
        episode_id = np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)
        transition = np.arange(n_transitions, dtype=np.int32)
        actions = np.asarray(actions)
        actions = actions.astype(np.int32 if actions.dtype.kind in "iu" else np.float32)
        return cls(
            observations=jnp.asarray(observations, jnp.float32),
            actions=jnp.asarray(actions),
            rewards=jnp.asarray(rewards, jnp.float32),
            costs=jnp.asarray(costs, jnp.float32),
            terminals=jnp.asarray(terminals, bool),
            timeouts=jnp.asarray(timeouts, bool),
            observation_index=jnp.asarray(stored_rows(transition, episode_id, frame_stack)),
            episode_id=jnp.asarray(episode_id),
            steps_to_end=jnp.asarray((ends[episode_id] - transition).astype(np.int32)),
            episode_starts=jnp.asarray(starts.astype(np.int32)),
            episode_lengths=jnp.asarray(lengths),
            frame_stack=int(frame_stack),
        )

    @classmethod
    def from_episodes(
        cls, episodes: Sequence[dict[str, Any]], *, name: str = "dataset", history: int = 1
    ) -> Dataset:
        """Builds a dataset from per-episode arrays.

        Each episode is a mapping with ``observations`` ``[T + 1, obs]`` (the last row is the
        final next-observation), ``actions`` ``[T, act]`` (or ``[T]`` discrete), ``rewards``
        ``[T]`` and optionally ``costs`` ``[T, n_costs]`` and ``terminated`` (bool: whether
        the episode ended in a terminal state; otherwise it timed out).

        With ``history`` ``H > 1`` each row of ``observations`` is one frame, and the
        dataset's observation at step ``t`` stacks rows ``t, t - 1, ..., t - H + 1``
        (newest first), the episode's first row standing in for the rows before it; the
        rows are stored once (``frame_stack = H``).

        Raises:
            ValueError: naming the episode and field when shapes disagree or values are
                not finite, or for a ``history`` below 1.
        """
        if not episodes:
            raise ValueError(f"{name}: no episodes")
        if type(history) is not int or history < 1:
            raise ValueError(f"{name}: history must be a whole number >= 1, got {history!r}")
        columns = EpisodeColumns(name)
        for number, episode in enumerate(episodes):
            columns.add(number, episode)
        arrays = columns.arrays()
        if history == 1:
            return Dataset.from_arrays(**arrays)
        arrays["observations"] = padded_frames(
            arrays["observations"], arrays["episode_lengths"], history
        )
        return Dataset.from_arrays(**arrays, frame_stack=history)

    @classmethod
    def from_flat(
        cls,
        observations: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_observations: np.ndarray,
        terminals: np.ndarray,
        timeouts: np.ndarray | None = None,
        costs: np.ndarray | None = None,
        *,
        name: str = "dataset",
    ) -> Dataset:
        """Builds a dataset from flat transition arrays (the D4RL / NeoRL layout).

        Episodes end where a transition is terminal or timed out, or where the next
        observation differs from the following transition's observation (logs cut
        without a flag). The final next-observation of each episode is kept.

        Raises:
            ValueError: naming the field and row when lengths disagree or values are not
                finite.
        """
        n = len(rewards)
        arrays = {
            "observations": observations,
            "actions": actions,
            "rewards": rewards,
            "next_observations": next_observations,
            "terminals": terminals,
        }
        if timeouts is not None:
            arrays["timeouts"] = timeouts
        if costs is not None:
            arrays["costs"] = costs
        for field, array in arrays.items():
            if len(array) != n:
                raise ValueError(
                    f"{name}: {field} has {len(array)} rows but rewards has {n}; "
                    "every field needs one row per transition"
                )
        if n == 0:
            raise ValueError(f"{name}: no transitions")
        observations = np.asarray(observations, np.float32)
        next_observations = np.asarray(next_observations, np.float32)
        terminals = np.asarray(terminals, bool).reshape(n)
        timeouts = np.zeros(n, bool) if timeouts is None else np.asarray(timeouts, bool).reshape(n)
        continues = np.zeros(n, bool)
        continues[:-1] = np.all(next_observations[:-1] == observations[1:], axis=1)
        ends = terminals | timeouts | ~continues
        boundaries = np.flatnonzero(ends) + 1
        starts = np.concatenate([[0], boundaries[:-1]])
        episodes = []
        for start, stop in zip(starts, boundaries, strict=True):
            episodes.append(
                {
                    "observations": np.concatenate(
                        [observations[start:stop], next_observations[stop - 1 : stop]]
                    ),
                    "actions": np.asarray(actions)[start:stop],
                    "rewards": np.asarray(rewards)[start:stop],
                    "costs": None if costs is None else np.asarray(costs)[start:stop],
                    "terminated": bool(terminals[stop - 1]),
                    "first_row": int(start),
                }
            )
        return cls.from_episodes(episodes, name=name)

    @classmethod
    def from_rollout(cls, transitions: Any, *, name: str = "rollout") -> Dataset:
        """Builds a dataset from recorded rollout transitions (time-major
        ``[n_steps, n_envs, ...]``), one episode per environment and finished episode.

        Episodes still running at the end of the rollout are kept, cut off as timeouts.
        """
        host = jax.device_get(transitions)
        n_steps, n_envs = host.reward.shape
        done = np.asarray(host.terminated) | np.asarray(host.truncated)
        episodes = []
        for env in range(n_envs):
            ends = np.flatnonzero(done[:, env]) + 1
            if not len(ends) or ends[-1] != n_steps:
                ends = np.append(ends, n_steps)
            start = 0
            for stop in ends:
                steps = slice(start, stop)
                observations = host.observation[steps, env]
                episodes.append(
                    {
                        "observations": np.concatenate(
                            [observations, host.next_observation[stop - 1 : stop, env]]
                        ),
                        "actions": host.action[steps, env],
                        "rewards": host.reward[steps, env],
                        "costs": host.cost[steps, env],
                        "terminated": bool(host.terminated[stop - 1, env]),
                    }
                )
                start = stop
        return cls.from_episodes(episodes, name=name)

    @classmethod
    def from_trajectories(
        cls,
        observations: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        costs: np.ndarray,
        terminated: np.ndarray,
        *,
        name: str = "trajectories",
    ) -> Dataset:
        """Builds a dataset from equal-length trajectories, batch-major.

        Args:
            observations: ``[n, T + 1, obs_size]``, each trajectory's final observation last.
            actions: ``[n, T, action_size]`` or ``[n, T]`` (discrete).
            rewards: ``[n, T]``.
            costs: ``[n, T, n_costs]``.
            terminated: ``[n, T]``; a trajectory is cut after its first terminal step and
                the steps after it are dropped. Trajectories that never terminate are
                timeouts at their last step.

        Without early terminals this is a reshape: no per-episode work on the host.
        """
        observations = np.asarray(observations, np.float32)
        terminated = np.asarray(terminated, bool)
        n, length = terminated.shape
        if observations.shape[:2] != (n, length + 1):
            raise ValueError(
                f"{name}: observations have shape {observations.shape}, expected "
                f"[{n}, {length + 1}, obs_size] for {n} trajectories of {length} steps"
            )
        if terminated[:, :-1].any():
            episodes = []
            for row in range(n):
                ends = np.flatnonzero(terminated[row])
                stop = int(ends[0]) + 1 if len(ends) else length
                episodes.append(
                    {
                        "observations": observations[row, : stop + 1],
                        "actions": actions[row, :stop],
                        "rewards": rewards[row, :stop],
                        "costs": costs[row, :stop],
                        "terminated": bool(len(ends)),
                    }
                )
            return cls.from_episodes(episodes, name=name)
        arrays = {
            "observations": observations,
            "rewards": np.asarray(rewards, np.float32),
            "costs": np.asarray(costs, np.float32),
        }
        for field, array in arrays.items():
            if not np.all(np.isfinite(array)):
                trajectory, step = np.argwhere(~np.isfinite(array))[0][:2]
                raise ValueError(
                    f"{name}: trajectory {trajectory}, {field} step {step}: NaN or infinite"
                )
        actions = np.asarray(actions)
        terminals = np.zeros((n, length), bool)
        terminals[:, -1] = terminated[:, -1]
        timeouts = np.zeros((n, length), bool)
        timeouts[:, -1] = ~terminated[:, -1]
        return cls.from_arrays(
            observations=observations.reshape(n * (length + 1), -1),
            actions=actions.reshape(n * length, *actions.shape[2:]),
            rewards=arrays["rewards"].reshape(-1),
            costs=arrays["costs"].reshape(n * length, -1),
            terminals=terminals.reshape(-1),
            timeouts=timeouts.reshape(-1),
            episode_lengths=np.full(n, length, np.int32),
        )

    def to_flat(self) -> dict[str, np.ndarray]:
        """Flat host arrays in the D4RL / NeoRL layout (with next observations)."""
        host = jax.device_get(self)
        rows = np.asarray(host.observation_index)
        return {
            "observations": np.asarray(host.observations_at(rows)),
            "next_observations": np.asarray(host.observations_at(rows + 1)),
            "actions": np.asarray(host.actions),
            "rewards": np.asarray(host.rewards),
            "costs": np.asarray(host.costs),
            "terminals": np.asarray(host.terminals),
            "timeouts": np.asarray(host.timeouts),
            "episode_id": np.asarray(host.episode_id),
        }

    def stored_arrays(self, *, frames: bool = True) -> dict[str, np.ndarray]:
        """Host copies of the arrays that define the dataset, indices excluded (the native
        format's files): observations as stored (frames when ``frame_stack > 1``), or
        whole (``[N + E, obs_size]``) with ``frames=False``."""
        host = jax.device_get(self)
        observations = host.observations if frames else self.all_observations()
        return {
            "observations": np.asarray(observations, np.float32),
            "actions": np.asarray(host.actions, np.int32 if self.discrete else np.float32),
            "rewards": np.asarray(host.rewards, np.float32),
            "costs": np.asarray(host.costs, np.float32),
            "terminals": np.asarray(host.terminals, bool),
            "timeouts": np.asarray(host.timeouts, bool),
            "episode_lengths": np.asarray(host.episode_lengths, np.int32),
        }

    def slice_episodes(self, first: int, stop: int) -> Dataset:
        """Episodes ``first .. stop - 1`` as a dataset of their own (same frame stacking)."""
        return episodes_dataset(self.stored_arrays(), first, stop, self.frame_stack)

    def to_episodes(self, episode_ids: Any = None) -> list[dict[str, np.ndarray | bool]]:
        """Per-episode host arrays (the form :meth:`from_episodes` takes) of the given
        episodes in the given order, all of them by default."""
        host = jax.device_get(self)
        if episode_ids is None:
            episode_ids = np.arange(self.n_episodes)
        episodes = []
        for episode in np.asarray(episode_ids):
            start = int(host.episode_starts[episode])
            length = int(host.episode_lengths[episode])
            episodes.append(
                {
                    "observations": host.episode_observations(int(episode)),
                    "actions": host.actions[start : start + length],
                    "rewards": host.rewards[start : start + length],
                    "costs": host.costs[start : start + length],
                    "terminated": bool(host.terminals[start + length - 1]),
                }
            )
        return episodes

    def select_episodes(self, episode_ids: np.ndarray) -> Dataset:
        """A new dataset made of the given episodes, in the given order (on the host)."""
        return Dataset.from_episodes(self.to_episodes(episode_ids))


def split_episodes(
    dataset: Dataset, validation_fraction: float, seed: int = 0
) -> tuple[Dataset, Dataset]:
    """Splits by whole episodes, shuffled with ``seed``: ``(train, validation)``.

    Raises:
        ValueError: if the fraction is not in (0, 1) or leaves either side empty.
    """
    if not 0.0 < validation_fraction < 1.0:
        raise ValueError(
            f"validation_fraction: must lie strictly between 0 and 1, got {validation_fraction}"
        )
    n_validation = round(dataset.n_episodes * validation_fraction)
    if n_validation < 1 or n_validation >= dataset.n_episodes:
        raise ValueError(
            f"validation_fraction: {validation_fraction} of {dataset.n_episodes} episodes "
            f"leaves an empty side; use more episodes or another fraction"
        )
    order = np.random.default_rng(seed).permutation(dataset.n_episodes)
    validation = np.sort(order[:n_validation])
    train = np.sort(order[n_validation:])
    return dataset.select_episodes(train), dataset.select_episodes(validation)


# ----- contiguous episode ranges (shards) ----------------------------------------------
def episode_range_arrays(
    arrays: Any, first: int, stop: int, frame_stack: int = 1
) -> dict[str, Any]:
    """The stored arrays (``observations``, ``actions``, ``rewards``, ``costs``,
    ``terminals``, ``timeouts``, ``episode_lengths``: the native format's) of episodes
    ``first .. stop - 1``, as slices: memory-mapped input stays on disk until read."""
    lengths = np.asarray(arrays["episode_lengths"], np.int64)
    if not 0 <= first < stop <= len(lengths):
        raise ValueError(
            f"episodes {first}..{stop - 1}: expected a non-empty range within the "
            f"{len(lengths)} episodes"
        )
    begin = int(lengths[:first].sum())
    end = begin + int(lengths[first:stop].sum())
    transitions = slice(begin, end)
    rows = slice(begin + first * frame_stack, end + stop * frame_stack)
    return {
        "observations": arrays["observations"][rows],
        **{
            name: arrays[name][transitions]
            for name in ("actions", "rewards", "costs", "terminals", "timeouts")
        },
        "episode_lengths": np.asarray(arrays["episode_lengths"][first:stop]),
    }


def episodes_dataset(arrays: Any, first: int, stop: int, frame_stack: int = 1) -> Dataset:
    """Episodes ``first .. stop - 1`` of stored arrays (see :func:`episode_range_arrays`)
    as a :class:`Dataset` stacking ``frame_stack`` frames, as the arrays do."""
    ranged = episode_range_arrays(arrays, first, stop, frame_stack)
    return Dataset.from_arrays(**ranged, frame_stack=frame_stack)
