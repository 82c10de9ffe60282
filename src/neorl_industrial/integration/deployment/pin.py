"""What the server checks an artifact against, with its own code: the pinned task, the
constraints it enforces, a battery of probe inputs at load and a guard on every served
action.

An artifact's manifest, its ``constraints.yaml`` and its serialized function are the
artifact's word; a signature says who exported them, not that they agree. So the server:

* compares the artifact's task (observation and action names in order, units, action and
  observation bounds) with the pinned task (:func:`task_differences`), and its bundled
  constraints with the pinned ones by what they enforce, not by their prose
  (:func:`enforced_differences`);
* compiles the constraints it enforces itself (:func:`server_constraints`) and, at load,
  runs every serialized function on probe inputs (:func:`probe_inputs`: random in-bounds
  observations, bound edges, state-limit thresholds, rate-limit edges, invalid readings)
  through that check, which must not replace a single action (:func:`probe_refusals`);
* at run time, checks every served action with the same compiled constraints inside the
  artifact's jitted call (:class:`ServerCheck`): an action its shield would not pass is
  replaced by the shield's own (projection or fallback) and counted as an incident.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from neorl_industrial.core.safety import CompiledConstraints, ConstraintSpec, satisfies, shield
from neorl_industrial.core.safety.constraints import observation_valid, violations
from neorl_industrial.core.safety.shield import BRANCH_MIN_BATCH
from neorl_industrial.core.units import same_unit
from neorl_industrial.core.utils.limits import check_magnitude, check_text
from neorl_industrial.core.utils.messages import quote, validation_lines

__all__ = [
    "ServedTask",
    "ServerCheck",
    "enforced_differences",
    "load_pinned_task",
    "probe_inputs",
    "probe_refusals",
    "server_constraints",
    "task_differences",
]

if TYPE_CHECKING:
    from neorl_industrial.core.environments import Task

#: How far (absolute, plus relative) a served action may be from what the server's
#: shield keeps before it counts as replaced: float32 roundings of the same computation.
_ATOL, _RTOL = 1e-4, 1e-5
#: Random probe rows beside the edge rows.
_RANDOM_PROBES = 192


class ServedTask:
    """The task the server checks against: names in order, units and bounds."""

    def __init__(
        self,
        observation_names: Sequence[str],
        action_names: Sequence[str],
        action_low: Sequence[float],
        action_high: Sequence[float],
        observation_low: Sequence[float | None] | None = None,
        observation_high: Sequence[float | None] | None = None,
        observation_units: Sequence[str | None] | None = None,
        action_units: Sequence[str | None] | None = None,
    ) -> None:
        self.observation_names = tuple(observation_names)
        self.action_names = tuple(action_names)
        self.action_low = np.asarray(action_low, np.float64)
        self.action_high = np.asarray(action_high, np.float64)
        n_obs = len(self.observation_names)
        self.observation_low = _bounds(observation_low, n_obs, -math.inf)
        self.observation_high = _bounds(observation_high, n_obs, math.inf)
        self.observation_units = _units(observation_units, n_obs)
        self.action_units = _units(action_units, len(self.action_names))

    @classmethod
    def of_task(cls, task: Task) -> ServedTask:
        return cls(
            task.observation_names,
            task.action_names,
            task.action_low,
            task.action_high,
            task.observation_low,
            task.observation_high,
            task.observation_units,
            task.action_units,
        )

    @classmethod
    def of_manifest(cls, manifest: dict[str, Any]) -> ServedTask:
        """The task an artifact says it was exported for (older artifacts kept units and
        observation bounds only in their metadata's ``task``)."""
        described = (manifest.get("metadata") or {}).get("task") or {}
        if not isinstance(described, dict):
            described = {}

        def field(name: str) -> Any:
            value = manifest.get(name)
            return described.get(name) if value is None else value

        return cls(
            manifest["observation_names"],
            manifest["action_names"],
            manifest["action_low"],
            manifest["action_high"],
            field("observation_low"),
            field("observation_high"),
            field("observation_units"),
            field("action_units"),
        )

    @property
    def observation_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        return self.observation_low, self.observation_high


def _bounds(values: Sequence[float | None] | None, size: int, fill: float) -> np.ndarray:
    if values is None or len(values) != size:
        return np.full(size, fill, np.float64)
    return np.asarray([fill if v is None else float(v) for v in values], np.float64)


def _units(units: Sequence[str | None] | None, size: int) -> tuple[str | None, ...]:
    if units is None or len(units) != size:
        return (None,) * size
    return tuple(None if unit in (None, "") else str(unit) for unit in units)


def load_pinned_task(path: str | Path) -> tuple[Task, str]:
    """The task in ``path``: a dataset card (``dataset.json``, as ``datasets import`` and
    every run write it) or a task file (the fields of ``Task.to_dict``, JSON or YAML).

    Returns:
        The task and the sha256 of the file.

    Raises:
        ValueError: naming the file and what is wrong with it.
    """
    from neorl_industrial.core.environments import Task, TaskError
    from neorl_industrial.wrappers.hostio import YamlError, read_yaml

    path = Path(path)
    try:
        # A FIFO or a device would block the read (or never end): regular files only.
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ValueError(f"pinned_task {path}: not a regular file (nothing was read)")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        data = read_yaml(path, what="pinned task")
    except (OSError, YamlError) as error:
        raise ValueError(f"pinned_task {path}: cannot be read: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(
            f"pinned_task {path}: expected a dataset card or a task (a mapping with "
            f"observation_names and action_names), got {type(data).__name__}"
        )
    if "observation_names" in data or "action_names" in data:
        try:
            task = Task.from_dict(data, f"pinned_task {path}")
        except TaskError as error:
            raise ValueError(" ".join(str(error).split())) from None
        return _sane(task, path), digest
    from pydantic import ValidationError

    from neorl_industrial.integration.datasets.card import DatasetCard

    try:
        card = DatasetCard.model_validate_json(json.dumps(data))
        task = card.task()
    except (ValidationError, ValueError, TaskError, RecursionError) as error:
        details = (
            "; ".join(validation_lines(error, DatasetCard, ""))
            if isinstance(error, ValidationError)
            else " ".join(str(error).split()) or type(error).__name__
        )
        raise ValueError(
            f"pinned_task {path}: neither a task (observation_names, action_names, "
            f"action_low, action_high, ...) nor a dataset card that names one: {details}"
        ) from None
    return _sane(task, path), digest


def _sane(task: Task, path: Path) -> Task:
    """``task`` if its bounds are within ±1e12 (an observation's side may be open) and its
    names and units printable: a pinned bound of 1e308 is float32 infinity, no bound."""
    try:
        for what in ("action_low", "action_high"):
            for name, value in zip(task.action_names, getattr(task, what), strict=True):
                check_magnitude(float(value), f"{what} of {quote(name)}")
        for what in ("observation_low", "observation_high"):
            for name, value in zip(task.observation_names, getattr(task, what), strict=True):
                if math.isfinite(value):
                    check_magnitude(float(value), f"{what} of {quote(name)}")
        for name, unit in (
            *zip(task.observation_names, task.observation_units, strict=True),
            *zip(task.action_names, task.action_units, strict=True),
        ):
            check_text(name, "a name")
            if unit is not None:
                check_text(unit, f"the unit of {quote(name)}")
    except ValueError as error:
        raise ValueError(f"pinned_task {path}: {error}") from None
    return task


def task_differences(artifact: ServedTask, pinned: ServedTask) -> list[str]:
    """What in the artifact's task differs from the pinned one, in words (empty: none)."""
    found = []
    for what in ("observation", "action"):
        mine, theirs = getattr(artifact, f"{what}_names"), getattr(pinned, f"{what}_names")
        if mine != theirs:
            found.append(_names_difference(f"{what}_names", mine, theirs))
            continue
        units_mine, units_theirs = (
            getattr(artifact, f"{what}_units"),
            getattr(pinned, f"{what}_units"),
        )
        for name, unit_mine, unit_theirs in zip(mine, units_mine, units_theirs, strict=True):
            # Units by the units library: `°C` pinned against the artifact's `degC` is the
            # same unit; `degF` is not (the shield's bounds would be in another scale).
            if unit_theirs is not None and not same_unit(unit_mine, unit_theirs):
                found.append(
                    f"{what}_units: {name!r} is in {unit_mine!r} in the artifact, "
                    f"{unit_theirs!r} pinned"
                )
                break
    for what in ("action", "observation"):
        names = getattr(artifact, f"{what}_names")
        if names != getattr(pinned, f"{what}_names"):
            continue  # the names' difference is reported; bounds of other names mean nothing
        for side in ("low", "high"):
            difference = _bound_difference(
                f"{what}_{side}",
                names,
                getattr(artifact, f"{what}_{side}"),
                getattr(pinned, f"{what}_{side}"),
            )
            if difference:
                found.append(difference)
    return found


def _names_difference(field: str, mine: tuple[str, ...], theirs: tuple[str, ...]) -> str:
    if sorted(mine) == sorted(theirs):
        index = next(i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b)
        return (
            f"{field}: the same names in another order (position {index}: {mine[index]!r} in "
            f"the artifact, {theirs[index]!r} pinned); the shield would read the wrong column"
        )
    missing = [name for name in theirs if name not in mine][:5]
    extra = [name for name in mine if name not in theirs][:5]
    return (
        f"{field}: {len(mine)} names in the artifact, {len(theirs)} pinned; pinned but "
        f"missing: {missing}, not pinned: {extra}"
    )


def _bound_difference(
    field: str, names: Sequence[str], mine: np.ndarray, theirs: np.ndarray
) -> str | None:
    # float32 is what the artifact compiles: bounds equal as float32 are the same bound.
    a, b = np.asarray(mine, np.float32), np.asarray(theirs, np.float32)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    if same.all():
        return None
    index = int(np.argmin(same))
    return (
        f"{field}: {names[index]!r} is {float(a[index])} in the artifact, {float(b[index])} pinned"
    )


def server_constraints(spec: ConstraintSpec, task: ServedTask) -> CompiledConstraints:
    """``spec`` compiled by the server for ``task``: the task's action bounds on every
    action the spec leaves unbounded (as the export does), the task's observation bounds.

    Raises:
        ConstraintSpecError: for a spec that names what the task does not have.
    """
    from neorl_industrial.wrappers.agents.export import _effective_spec

    effective = _effective_spec(spec, task.action_names, task.action_low, task.action_high)
    return effective.compile(
        len(task.observation_names),
        len(task.action_names),
        task.observation_names,
        task.action_names,
        observation_bounds=task.observation_bounds,
    )


#: The compiled fields a shield enforces (not costs, which are the training's), by the
#: spec section a difference is reported as.
_ENFORCED = {
    "action_bounds": ("bound_index", "bound_low", "bound_high"),
    "rate_limits": ("rate_index", "rate_limit"),
    "state_limits": (
        "state_feature",
        "state_action",
        "state_threshold",
        "state_above",
        "state_low",
        "state_high",
    ),
    "linear": ("linear_obs", "linear_act", "linear_bound"),
    "fallback": ("fallback_kind", "controller", "fallback_value"),
    "names": ("names",),
}


def enforced_differences(mine: CompiledConstraints, theirs: CompiledConstraints) -> list[str]:
    """The spec sections whose enforced content differs between two compiled specs (the
    name, description and costs do not count)."""
    found = []
    for section, fields in _ENFORCED.items():
        for field in fields:
            a, b = getattr(mine, field), getattr(theirs, field)
            if isinstance(a, tuple | str) or a is None:
                same = a == b
            else:
                a, b = np.asarray(a), np.asarray(b)
                same = a.shape == b.shape and bool(np.array_equal(a, b))
            if not same:
                found.append(section)
                break
    return found


# The repair's shield takes the constraints as an argument, not as constants of its program:
# every server (and every reload) with constraints of the same structure runs one program.
_repair = jax.jit(
    lambda compiled, observations, actions, prev: shield(compiled, observations, actions, prev)[0]
)


class ServerCheck:
    """The server's check of served actions (a :class:`~neorl_industrial.wrappers.agents.
    artifact.Guard`), from the constraints it compiled itself.

    :meth:`accepts` runs in the artifact's jitted call: a row whose action is finite and
    keeps every constraint for a valid observation is served as it is (one margin
    evaluation per batch). The other rows, rare, go to :meth:`repair` on the host: the
    server's own shield decides them, with the served action as the proposal, in chunks
    of one compiled size; a row whose action the shield would change is an incident, and
    the shield's action (a projection or the fallback) is served instead. A legitimate
    fallback (a bad reading, an infeasible row) is what the shield keeps, so it is not one.
    """

    #: Rows the repair's shield is compiled for (the shield's batch path from here on).
    CHUNK = 64

    def __init__(self, compiled: CompiledConstraints) -> None:
        self.compiled = compiled
        self.last_incident: dict[str, Any] | None = None

    def accepts(
        self, observations: jax.Array, prev_actions: jax.Array, action: jax.Array
    ) -> jax.Array:
        compiled = self.compiled
        return satisfies(compiled, observations, action, prev_actions) & observation_valid(
            compiled, observations
        )

    def warmup(self) -> None:
        """Compiles the repair's shield, so the first rejected row does not wait for it."""
        n_obs, n_act = int(self.compiled.observation_low.shape[-1]), self.compiled.action_size
        actions = np.zeros((self.CHUNK, n_act), np.float32)
        _repair(self.compiled, np.zeros((self.CHUNK, n_obs), np.float32), actions, actions)

    def broken(self, row: dict[str, Any]) -> list[str]:
        """The constraints a recorded incident's action breaks (``not finite`` too)."""
        mask = np.asarray(
            violations(self.compiled, row["observation"], row["action"], row["prev_action"])
        )
        names = [n for n, b in zip(self.compiled.names, mask.tolist(), strict=True) if b]
        if not np.isfinite(row["action"]).all():
            names.append("not finite")
        return names or ["what the shield keeps"]

    def repair(
        self, observations: np.ndarray, prev_actions: np.ndarray, action: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        rows = len(observations)
        safe = np.empty_like(action)
        for start in range(0, rows, self.CHUNK):
            stop = min(start + self.CHUNK, rows)
            pad = ((0, self.CHUNK - (stop - start)), (0, 0))
            chunk = [np.pad(x[start:stop], pad, mode="edge") for x in (observations, action)]
            previous = np.pad(prev_actions[start:stop], pad, mode="edge")
            safe[start:stop] = np.asarray(_repair(self.compiled, chunk[0], chunk[1], previous))[
                : stop - start
            ]
        close = np.abs(safe - action) <= _ATOL + _RTOL * np.abs(safe)
        incident = ~np.all(close, axis=-1)
        if incident.any():
            # Kept as it is; named (eagerly, slowly) only when a probe refusal says it.
            row = int(np.argmax(incident))
            self.last_incident = {
                "observation": observations[row],
                "prev_action": prev_actions[row],
                "action": action[row],
            }
        return safe, incident


def probe_inputs(
    compiled: CompiledConstraints, task: ServedTask, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Observations and previous actions that exercise a shield: random rows within the
    bounds, every bounded feature at its bounds and past them (invalid readings), every
    state limit's feature at its threshold, previous actions unknown, at the action
    bounds and inside them (rate limits binding at the edges)."""
    n_obs, n_act = len(task.observation_names), len(task.action_names)
    low_obs, high_obs = task.observation_bounds
    thresholds: dict[int, list[float]] = {}
    for feature, threshold in zip(
        compiled.state_feature, np.asarray(compiled.state_threshold).tolist(), strict=True
    ):
        thresholds.setdefault(feature, []).append(float(threshold))
    # A sampling range per feature: its bounds, else around the thresholds that read it.
    sample_low, sample_high = np.empty(n_obs), np.empty(n_obs)
    for j in range(n_obs):
        marks = thresholds.get(j, [0.0])
        centre, half = float(np.mean(marks)), max(100.0, 2.0 * max(abs(t) for t in marks))
        sample_low[j] = low_obs[j] if np.isfinite(low_obs[j]) else centre - half
        sample_high[j] = high_obs[j] if np.isfinite(high_obs[j]) else centre + half
        if sample_low[j] > sample_high[j]:
            sample_low[j], sample_high[j] = sample_high[j], sample_low[j]
    act_low, act_high = task.action_low, task.action_high
    observations = [rng.uniform(sample_low, sample_high, (_RANDOM_PROBES, n_obs))]
    base = rng.uniform(sample_low, sample_high, n_obs)
    for j in range(n_obs):
        span = max(abs(sample_high[j] - sample_low[j]), 1.0)
        for bound, outward in ((low_obs[j], -1.0), (high_obs[j], 1.0)):
            if np.isfinite(bound):
                for value in (bound, bound + outward * 1e-3 * span, bound + outward * 1e6):
                    row = base.copy()
                    row[j] = value
                    observations.append(row[None])
        for threshold in thresholds.get(j, []):
            step = 1e-3 * (1.0 + abs(threshold))
            for value in (threshold - step, threshold, threshold + step):
                row = base.copy()
                row[j] = value
                observations.append(row[None])
    observations = np.concatenate(observations).astype(np.float32)
    rows = len(observations)
    prev = rng.uniform(act_low, act_high, (rows, n_act))
    choice = rng.integers(0, 4, rows)
    prev[choice == 0] = np.nan  # unknown: no rate limit
    prev[choice == 1] = act_low
    prev[choice == 2] = act_high
    return observations, prev.astype(np.float32)


def probe_refusals(
    artifact: Any,
    check: ServerCheck,
    task: ServedTask,
    batch_sizes: Sequence[int],
    *,
    seed: int | None = None,
) -> list[str]:
    """What ``artifact`` (serving through ``check``) served on the probe inputs that the
    server's own shield would not pass (empty: every action passed), in words.

    Every serialized function the server will call is probed, in batches of the largest
    of ``batch_sizes`` (the padded sizes it compiles) that reaches it: batches from the
    shield's batch path on (64 rows) take another function than smaller ones. The random
    probes are drawn from ``seed``, by default from the artifact's content (its files'
    digests): the same artifact meets the same probes at every start, so a server that
    refuses it refuses it every time, not on one start in many."""
    if seed is None:
        files = sorted((getattr(artifact, "manifest", None) or {}).get("files", {}).items())
        content = hashlib.sha256(json.dumps(files).encode()).digest()
        seed = int.from_bytes(content[:8], "little")
    rng = np.random.default_rng(seed)
    observations, prev = probe_inputs(check.compiled, task, rng)
    sizes = sorted(set(batch_sizes))
    chosen = [max(s for s in sizes if s < BRANCH_MIN_BATCH)] if sizes[0] < BRANCH_MIN_BATCH else []
    chosen += [sizes[-1]] if sizes[-1] >= BRANCH_MIN_BATCH else []
    found = []
    for size in chosen:
        incidents = 0
        check.last_incident = None
        for start in range(0, len(observations), size):
            rows = slice(start, start + size)
            decision = artifact.decide_rows(observations[rows], prev[rows])
            incidents += int(decision.incident.sum())
        if incidents:
            last = check.last_incident or {}
            broken = check.broken(last) if last else []
            found.append(
                f"in batches of {size}, {incidents} of {len(observations)} probe actions "
                f"break the enforced constraints (e.g. observation "
                f"{_short(last.get('observation'))} with prev_action "
                f"{_short(last.get('prev_action'))} served {_short(last.get('action'))}, "
                f"breaking {broken})"
            )
    return found


def _short(values: np.ndarray | None) -> str:
    if values is None:
        return "?"
    shown = ", ".join(f"{float(v):.4g}" for v in values[:6])
    return f"[{shown}{', ...' if len(values) > 6 else ''}]"
