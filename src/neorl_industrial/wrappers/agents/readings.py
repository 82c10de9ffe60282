"""What a policy decides on: the same readings and previous actions at every entry point.

``Agent.predict``, the policy server (``/v1/act``, ``/v1/act/batch``) and the OPC UA
bridge hand their inputs to :func:`decision_inputs` before anything checks or decides on
them. The ONNX graph refuses nothing (a graph cannot) but flushes subnormal inputs as its
first operation, and ``PolicyArtifact.decide_rows`` flushes them before its program runs;
a program that runs the graph reads its inputs with this function first. The rules:

* **Subnormal values are zero.** A float32 value whose magnitude is below the smallest
  normal float32 (``1.18e-38``) but not zero, in a reading or a previous action, is read
  as ``0.0``. XLA on CPU flushes subnormals to zero in some fused operations and not in
  others, numpy and ONNX Runtime never do: left as they are, ``-1.4e-45`` on a feature
  bounded at 0 was a broken sensor to one check and a valid reading to the next, and the
  server counted an honest policy's decision as a safety incident. Flushed first, every
  check, the policy and the shield see the same number on every runtime. No sensor
  resolves ``1e-38`` of anything, so nothing real is lost.
* **A reading that is not a finite float32 number is refused**, naming the field, row and
  feature: a NaN or infinite reading (or one beyond float32's range, ``3.4e38``) is a
  broken sensor, and reporting it is the caller's business (the server answers 422, the
  bridge counts a faulty tick and applies its fallback, ``predict`` raises). The policy
  never decides on one; the shield's own broken-sensor check (a finite reading outside
  the plant's physical bounds: fallback and ``invalid_observation``) is unchanged.
* **A NaN previous action is unknown**, as an omitted one (``None``) is: the shield
  leaves that action's rate limit out (a batch may mix rows whose previous action is known
  with rows at an episode's start). NaN adds nothing to what omitting the previous action
  already allows; the bridge, which reads each actuator's position from the plant, writes
  no rate-limited action where it is unknown. An infinite previous action is no position:
  refused by name.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["SMALLEST_NORMAL", "decision_inputs", "flush_subnormals"]

#: The smallest normal float32; nonzero magnitudes below it are subnormal.
SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)
_TINY = np.float32(SMALLEST_NORMAL)
_HUGE = np.float32(np.finfo(np.float32).max)
_SMALLEST, _LARGEST = SMALLEST_NORMAL, float(_HUGE)
#: Up to this many values, :func:`_unusual` loops in Python.
_LOOP_MAX = 64


def flush_subnormals(values: np.ndarray) -> np.ndarray:
    """``values`` (float32) with every subnormal element replaced by ``0.0``; the same
    array when it holds none (the common case: no copy). NaN stays NaN."""
    small = np.abs(values) < _TINY
    if not small.any():
        return values
    small &= values != 0  # zeros (of either sign) are left as they are
    if not small.any():
        return values
    values = values.copy()
    values[small] = 0.0
    return values


def decision_inputs(
    observations: Any,
    prev_actions: Any,
    observation_names: Sequence[str],
    action_names: Sequence[str],
    *,
    error: type[Exception] = ValueError,
) -> tuple[np.ndarray, np.ndarray, bool]:
    """The ``[rows, obs]`` readings and ``[rows, act]`` previous actions a policy decides
    on, as float32, subnormals flushed to zero, and whether one row was given unbatched.

    Args:
        observations: ``[obs]`` or ``[rows, obs]`` readings in plant units.
        prev_actions: ``[act]`` or ``[rows, act]`` like the observations; ``None`` or
            NaN: unknown (the shield leaves the rate limits out).
        observation_names, action_names: the features' and actions' names, for errors.
        error: the exception class raised (a caller's own ``ValueError`` subclass).

    Raises:
        error: for values that are not numbers, a shape that does not fit, a reading that
            is not a finite float32 number or an infinite previous action, naming the
            field, row and feature.
    """
    obs, single = _rows(observations, "observation", observation_names, error)
    if _unusual(obs):
        _finite(obs, "observation", observation_names, single, False, error)
        obs = flush_subnormals(obs)
    if prev_actions is None:
        return obs, _unknown(len(obs), len(action_names)), single
    prev, prev_single = _rows(prev_actions, "prev_action", action_names, error)
    if prev_single != single or len(prev) != len(obs):
        expected = [len(action_names)] if single else [len(obs), len(action_names)]
        raise error(
            f"prev_action: expected the shape {expected} of one action per observation, "
            f"got {list(np.shape(prev_actions))}"
        )
    if _unusual(prev):
        _finite(prev, "prev_action", action_names, single, True, error)
        prev = flush_subnormals(prev)
    return obs, prev, single


@functools.lru_cache(maxsize=32)
def _unknown(rows: int, width: int) -> np.ndarray:
    """``[rows, width]`` NaN (previous actions unknown), read-only and shared: most
    requests send none."""
    unknown = np.full((rows, width), np.nan, np.float32)
    unknown.setflags(write=False)
    return unknown


def _unusual(array: np.ndarray) -> bool:
    """Whether ``array`` holds a value that is not finite or is subnormal. A served row
    is a handful of numbers, which a Python loop judges faster than numpy's calls do
    (this runs on every request)."""
    if array.size <= _LOOP_MAX:
        for value in array.ravel().tolist():
            if not (_SMALLEST <= abs(value) <= _LARGEST or value == 0.0):
                return True
        return False
    magnitude = np.abs(array)
    return not (((magnitude >= _TINY) & (magnitude <= _HUGE)) | (array == 0)).all()


def _rows(
    values: Any, field: str, names: Sequence[str], error: type[Exception]
) -> tuple[np.ndarray, bool]:
    size = len(names)
    if isinstance(values, np.ndarray) and values.dtype == np.float32:
        array = values  # the server's rows: no conversion, nothing to warn of
    else:
        array = _float32(values, field, size, error)
    if array.ndim not in (1, 2) or array.shape[-1] != size or array.size == 0:
        raise error(
            f"{field}: expected shape [{size}] or [rows, {size}] (rows >= 1), got "
            f"{list(array.shape)}"
        )
    return array.reshape(-1, size), array.ndim == 1


def _float32(values: Any, field: str, size: int, error: type[Exception]) -> np.ndarray:
    try:
        with np.errstate(over="ignore"):  # beyond float32: inf, refused by name after
            return np.asarray(values, np.float32)
    except (TypeError, ValueError) as problem:
        raise error(f"{field}: expected numbers, [{size}] or [rows, {size}]: {problem}") from None


def _finite(
    array: np.ndarray,
    field: str,
    names: Sequence[str],
    single: bool,
    nan_allowed: bool,
    error: type[Exception],
) -> None:
    good = np.isfinite(array)
    if nan_allowed:
        good |= np.isnan(array)
    if good.all():
        return
    row, column = (int(i) for i in np.argwhere(~good)[0])
    where = "" if single else f" row {row}"
    if field == "observation":
        allowed = "a finite float32 number (a broken sensor is the caller's to report)"
    else:
        allowed = "a finite float32 number, or NaN where unknown"
    raise error(f"{field}:{where} {names[column]!r} is {array[row, column]}; expected {allowed}")
