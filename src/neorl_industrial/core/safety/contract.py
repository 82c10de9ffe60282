"""The safety contract of a run: hard constraints, cost channels and their episode limits,
resolved once from a task, a constraint spec and explicit limits.

Which cost channels a run trains against, and where each limit comes from, is decided
here and nowhere else:

* The channels are the constraint spec's ``costs`` when it declares any (the data's costs
  are then relabelled from the spec's per-step definitions if the data's channels are
  other ones, or the same channels defined with other thresholds); otherwise the task's
  own channels (a plant log's cost columns, a simulator's cost vector).
* Each limit is, first found: the explicit ``cost_limits`` of the run, the spec's
  ``cost_limit``, the task's default limit for that channel.

The limits are a traced leaf (``cost_limits``) so a sweep over them is a ``vmap``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import struct

from neorl_industrial.core.safety.constraints import CompiledConstraints
from neorl_industrial.core.safety.spec import ConstraintSpec

__all__ = ["SafetyContract", "check_cost_limits", "resolve_safety"]


def check_cost_limits(
    cost_limits: Any,
    n_costs: int | None = None,
    field: str = "cost_limits",
    names: Sequence[str] | None = None,
) -> None:
    """Checks episode cost limits: finite, ``>= 0``, one per cost channel (the last axis;
    leading axes, as of stacked agent states, are allowed). The one check of cost limits:
    the safety contract, the safe agents' configs and states all call it.

    Raises:
        ValueError: naming ``field`` (and the channel) that is wrong and what would be right.
    """
    try:
        values = np.asarray(cost_limits, np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{field}: expected numbers, got {cost_limits!r}") from None
    if values.ndim == 0:
        if not (math.isfinite(values) and values >= 0.0):
            raise ValueError(f"{field}: must be a finite number >= 0, got {float(values)}")
        return
    if values.shape[-1] == 0:
        raise ValueError(f"{field}: give one episode cost limit per cost channel")
    if n_costs is not None and values.shape[-1] != n_costs:
        channels = f"{n_costs}: {', '.join(names)}" if names else str(n_costs)
        raise ValueError(
            f"{field}: expected one episode cost limit per cost channel ({channels}), "
            f"got {values.shape[-1]}"
        )
    bad = np.argwhere(~(np.isfinite(values) & (values >= 0.0)))
    if len(bad):
        where = tuple(bad[0])
        channel = names[where[-1]] if names else where[-1]
        raise ValueError(f"{field}[{channel}]: must be a finite number >= 0, got {values[where]}")


@struct.dataclass
class SafetyContract:
    """What a run is held to.

    Attributes:
        constraints: the shield's hard constraints (and the spec's cost definitions).
        cost_limits: ``[n_costs]`` episode cost limit per channel (traced).
        cost_names: the channels, in the order of the data's cost columns after
            relabelling.
        relabel: the data's costs must be recomputed from ``constraints`` (the spec
            defines other channels than the data has).
        limit_sources: where each limit came from (``run``, ``spec`` or ``task``).
    """

    constraints: CompiledConstraints
    cost_limits: jax.Array
    cost_names: tuple[str, ...] = struct.field(pytree_node=False, default=())
    relabel: bool = struct.field(pytree_node=False, default=False)
    limit_sources: tuple[str, ...] = struct.field(pytree_node=False, default=())

    @property
    def n_costs(self) -> int:
        return len(self.cost_names)

    def limits(self) -> list[float]:
        """The episode cost limits on the host (``inf``: the channel has no limit)."""
        return np.asarray(self.cost_limits, np.float64).reshape(-1).tolist()

    def limit_record(self) -> list[float | None] | None:
        """The limits as a record holds them (report.json, MLflow, a saved agent): JSON
        has no infinity, so a channel without a limit is null; a task without cost
        channels has None."""
        return [limit if math.isfinite(limit) else None for limit in self.limits()] or None


def resolve_safety(
    task: Any,
    spec: ConstraintSpec | None = None,
    cost_limits: Sequence[float] | None = None,
    *,
    require_limits: bool = False,
) -> SafetyContract:
    """The run's safety contract (see the module docstring).

    Args:
        task: the ``Task`` (names, channels and default limits).
        spec: the constraint spec; None: the task's default constraints.
        cost_limits: explicit episode limits, one per channel (they win).
        require_limits: every channel must end up with a limit (the safe agents).

    Raises:
        ValueError: naming the field: a spec that names features or actions the task does
            not have (``ConstraintSpecError``), limits of the wrong number or value, a
            channel without a limit where one is required.
    """
    given = spec is not None
    spec = task.default_constraints() if spec is None else spec
    compiled = task.compile_constraints(spec)
    if spec.costs:
        names = tuple(cost.name for cost in spec.costs)
        defaults = {cost.name: (cost.cost_limit, "spec") for cost in spec.costs}
        # Another channel, or the same channel defined otherwise (another threshold):
        # the data's costs are recomputed from the spec's definitions.
        redefined = given and any(
            task.cost_definitions.get(cost.name, cost.definition) != cost.definition
            for cost in spec.costs
        )
        relabel = names != tuple(task.cost_names) or redefined
    else:
        names = tuple(task.cost_names)
        defaults = {}
        relabel = False
    for name in names:
        if name not in defaults and name in task.cost_limits:
            defaults[name] = (task.cost_limits[name], "task")
    if cost_limits is not None:
        check_cost_limits(cost_limits, len(names), "cost_limits", names)
        values = [float(limit) for limit in cost_limits]
        sources = ("run",) * len(names)
    else:
        missing = [name for name in names if name not in defaults]
        if missing and require_limits:
            raise ValueError(
                f"cost_limits: no episode cost limit for {missing}; give cost_limits, a "
                "constraint spec with costs, or limits in the dataset's schema"
            )
        values = [defaults[name][0] if name in defaults else math.inf for name in names]
        sources = tuple(defaults[name][1] if name in defaults else "none" for name in names)
    return SafetyContract(
        constraints=compiled,
        cost_limits=np.asarray(values, np.float32),
        cost_names=names,
        relabel=relabel,
        limit_sources=sources,
    )
