"""Does the plant remember more than the model sees? A model reads one observation (its
frames) and one action; a plant with a transport delay, a slow hidden drift or a state
the historian does not record answers to earlier steps too. On held-out episodes the
model's one-step errors are regressed on the earlier steps' observations and actions,
beside the model's own inputs, out of sample (folds of whole episodes): the share of the
error the earlier steps explain is what the model cannot see. A share near 0 says the
observation holds what the plant's next step depends on; a large share says it does not,
and estimates for policies that act unlike the logged operation rest on a model that
misses part of the plant's response.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from neorl_industrial.functional.state_management.dataset import Dataset
from neorl_industrial.functional.state_management.frames import gather_stacked
from neorl_industrial.functional.transformations.dynamics import MIN_STD

__all__ = ["LAGS", "REMEMBERED", "memory_table", "one_step_errors"]

#: Earlier steps the check reads (observations and actions 1 to ``LAGS`` steps back).
LAGS = 3
#: The explained share from which a feature is said to answer to earlier steps the
#: model does not see.
REMEMBERED = 0.1
#: Transitions per call of the compiled one-step program.
_CHUNK = 8192
#: The most transitions the regression reads (evenly spread over the held-out ones).
_MOST_ROWS = 20_000


def one_step_errors(
    predict: Callable[[jax.Array, jax.Array], jax.Array], dataset: Dataset
) -> np.ndarray:
    """``[N, F]`` per transition of ``dataset`` (actions in [-1, 1]): the logged next
    frame minus ``predict(observations [B, obs], actions [B, A]) -> [B, obs]``, the
    model's point prediction of the next observation (the members' average of their mean
    predictions; a plant model's ``predict_program``). Batches are padded to a power of
    two (at most :data:`_CHUNK` transitions), so datasets of similar sizes share one
    compiled program."""
    index = np.asarray(jax.device_get(dataset.observation_index), np.int64)
    frames = np.asarray(jax.device_get(dataset.observations), np.float32)
    actions = np.asarray(jax.device_get(dataset.actions), np.float32)
    frame = frames.shape[1]
    n = dataset.n_transitions
    size = min(_CHUNK, 1 << max(n - 1, 0).bit_length())
    errors = []
    for begin in range(0, n, size):
        rows = np.arange(begin, min(begin + size, n))
        padded = np.concatenate([rows, np.full(size - len(rows), rows[-1])])
        observations = gather_stacked(frames, index[padded], dataset.frame_stack)
        predicted = np.asarray(
            jax.device_get(predict(jnp.asarray(observations), jnp.asarray(actions[padded]))),
            np.float32,
        )[: len(rows), :frame]
        errors.append(frames[index[rows] + 1] - predicted)
    return np.concatenate(errors) if errors else np.zeros((0, frame), np.float32)


def memory_table(
    errors: np.ndarray,
    dataset: Dataset,
    names: Sequence[str],
    given: Sequence[bool],
    lags: int = LAGS,
) -> dict[str, Any]:
    """Per predicted feature: the share of its one-step error (``errors [N, F]``, of
    :func:`one_step_errors`) that the observations' newest frames and the actions of the
    ``lags`` earlier steps explain beyond the model's own inputs (the observation and
    the action), out of sample: linear least squares fitted on all but one fold of whole
    episodes and scored on that fold, ``1 - SSE(own inputs and earlier steps) /
    SSE(own inputs)`` summed over the folds (``explained``, at least 0; None for a given
    feature, a constant error, or fewer than 2 episodes with steps past the lags). At
    most :data:`_MOST_ROWS` transitions are read, evenly spread."""
    episode = np.asarray(jax.device_get(dataset.episode_id), np.int64)
    first = np.asarray(jax.device_get(dataset.episode_starts), np.int64)
    position = np.arange(dataset.n_transitions) - first[episode]
    index = np.asarray(jax.device_get(dataset.observation_index), np.int64)
    frames = np.asarray(jax.device_get(dataset.observations), np.float64)
    actions = np.asarray(jax.device_get(dataset.actions), np.float64).reshape(
        dataset.n_transitions, -1
    )
    rows = np.flatnonzero(position >= lags)
    if len(rows) > _MOST_ROWS:
        rows = rows[np.linspace(0, len(rows) - 1, _MOST_ROWS).astype(np.int64)]
    observations = gather_stacked(frames, index[rows], dataset.frame_stack)
    own = np.concatenate([observations, actions[rows]], axis=1)
    earlier = np.concatenate(
        [np.concatenate([frames[index[rows - lag]], actions[rows - lag]], axis=1)
         for lag in range(1, lags + 1)],
        axis=1,
    )  # fmt: skip
    groups = episode[rows]
    labels = np.unique(groups)
    folds = np.array_split(labels, min(5, len(labels))) if len(labels) >= 2 else []
    table = []
    for i, name in enumerate(names):
        explained = None
        target = errors[rows, i].astype(np.float64)
        if not given[i] and len(folds) >= 2 and float(np.std(target)) > MIN_STD:
            explained = _explained(own, earlier, target, groups, folds)
        table.append({"name": str(name), "explained": explained})
    return {
        "lags": int(lags),
        "transitions": len(rows),
        "episodes": len(labels),
        "rows": table,
    }


def _explained(
    own: np.ndarray,
    earlier: np.ndarray,
    target: np.ndarray,
    groups: np.ndarray,
    folds: Sequence[np.ndarray],
) -> float:
    """``1 - SSE(own + earlier) / SSE(own)`` of out-of-fold least-squares predictions."""
    both = np.concatenate([own, earlier], axis=1)
    errors = {"own": 0.0, "both": 0.0}
    for fold in folds:
        test = np.isin(groups, fold)
        for key, inputs in (("own", own), ("both", both)):
            errors[key] += float(np.sum(np.square(_fitted(inputs, target, test) - target[test])))
    if errors["own"] <= 0.0:
        return 0.0
    return float(max(0.0, 1.0 - errors["both"] / errors["own"]))


def _fitted(inputs: np.ndarray, target: np.ndarray, test: np.ndarray) -> np.ndarray:
    """Least squares (standardized inputs, an intercept, a slight ridge) fitted on the
    rows outside ``test``, predicted on ``test``."""
    train = ~test
    mean = inputs[train].mean(axis=0)
    scale = inputs[train].std(axis=0)
    scale = np.where(scale > MIN_STD, scale, 1.0)
    x_train = (inputs[train] - mean) / scale
    x_test = (inputs[test] - mean) / scale
    offset = target[train].mean()
    ridge = 1e-3 * len(x_train)
    gram = x_train.T @ x_train + ridge * np.eye(x_train.shape[1])
    weights = np.linalg.solve(gram, x_train.T @ (target[train] - offset))
    return x_test @ weights + offset
