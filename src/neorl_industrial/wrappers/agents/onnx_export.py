"""The ONNX graph of an exported policy, and how its decisions are checked against JAX's.

``export_policy(..., format="onnx")`` adds ``policy.onnx`` to the artifact: the same
serving function as the artifact's ``serve_large.jaxexport`` (the policy, its observation
normalizer, its action scaling and the shield), lowered by :mod:`.onnx_graph` to one
ONNX graph with a dynamic batch axis. The manifest lists its sha256 like every other
file (so the signature covers it) and describes it under ``"onnx"``::

    "onnx": {"file": "policy.onnx", "opset": 18, "ir_version": 8,
             "inputs": {"observations": ["batch", 6], "prev_actions": ["batch", 3]},
             "outputs": {"action": ["batch", 3], "proposed": ["batch", 3],
                         "status": ["batch"], "margins": ["batch", 2, 7]},
             "parity": {"rows": 640, "max_action_difference": 2.4e-07, ...}}

Before it is written, the graph is run with ONNX Runtime on probe inputs that cover the
shield's edge cases (:func:`edge_case_inputs`) and compared with the JAX function
(:func:`compare_decisions`); a graph whose actions differ is not written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from neorl_industrial.core.safety import CompiledConstraints
from neorl_industrial.extras import optional_imports
from neorl_industrial.wrappers.agents.artifact import OUTPUTS
from neorl_industrial.wrappers.agents.onnx_graph import (
    BATCH,
    OPSET,
    OnnxExportError,
    lower_to_onnx,
)

__all__ = [
    "EDGE_CLASSES",
    "INPUTS",
    "ONNX_FILE",
    "PARITY_TOLERANCE",
    "REFUSAL_TOLERANCE",
    "EdgeCases",
    "OnnxExportError",
    "Parity",
    "compare_decisions",
    "edge_case_inputs",
    "onnx_policy_graph",
    "runtime_session",
    "subnormal_rows",
]

ONNX_FILE = "policy.onnx"
INPUTS = ("observations", "prev_actions")
#: The parity target: ONNX Runtime's actions within this of JAX's (both float32; the
#: network's sums are rounded in another order, which at plant scales moves an action by
#: a few 1e-7 and with readings far outside the data's range up to about 1e-5).
PARITY_TOLERANCE = 1e-5
#: An export refuses a graph whose actions differ by more than this on its probes: ten
#: times the target, far below what a wrong lowering gives (a repair or a fallback taken
#: on one side only moves an action by a sizeable part of its range).
REFUSAL_TOLERANCE = 1e-4
#: Rows of each edge class in the export's own parity check.
_PROBE_ROWS_PER_CLASS = 48

#: The classes of :func:`edge_case_inputs`, in order.
EDGE_CLASSES = (
    "nominal",  # typical readings, previous actions inside the action bounds
    "previous_at_bounds",  # previous actions at the corners of the action bounds
    "previous_unknown",  # previous actions NaN: no rate limit applies
    "previous_extreme",  # previous actions far outside the bounds (±1e7) or infinite
    "state_thresholds",  # state-limit features at their threshold and one float apart
    "physical_bounds",  # features at, just inside and just outside their physical bounds
    "out_of_distribution",  # features outside the data's range
    "nan_observation",  # one feature NaN
    "inf_observation",  # one feature ±inf
    "extreme_observation",  # features at ±1e6 ... ±3e38: saturated policy, cancellations
    "subnormal_observation",  # features at float32 subnormals (XLA:CPU flushes them to 0)
)


@dataclasses.dataclass(frozen=True)
class EdgeCases:
    """Probe inputs and the edge class of each row."""

    observations: np.ndarray  # [rows, obs] float32
    prev_actions: np.ndarray  # [rows, act] float32
    classes: np.ndarray  # [rows] str


def edge_case_inputs(
    constraints: CompiledConstraints,
    rows: int,
    *,
    typical: tuple[Sequence[float], Sequence[float]] | None = None,
    seed: int = 0,
) -> EdgeCases:
    """``rows`` inputs covering every class of :data:`EDGE_CLASSES` (about equally).

    Args:
        constraints: what the shield enforces (bounds, thresholds, ranges are read from
            it).
        rows: how many rows (at least one per class).
        typical: ``(low, high)`` per feature of typical readings; default the data's
            range where known, else the physical bounds, else ``[-1, 1]``.
        seed: of the random draws.
    """
    classes = len(EDGE_CLASSES)
    if rows < classes:
        raise ValueError(f"rows: at least {classes} (one per edge class), got {rows}")
    rng = np.random.default_rng(seed)
    low, high = _typical_range(constraints, typical)
    size = low.shape[0]
    bounds_low, bounds_high = _action_range(constraints)
    counts = np.full(classes, rows // classes)
    counts[: rows % classes] += 1
    observations, previous, labels = [], [], []
    for name, count in zip(EDGE_CLASSES, counts.tolist(), strict=True):
        obs = (low + (high - low) * rng.random((count, size))).astype(np.float32)
        prev = bounds_low + (bounds_high - bounds_low) * rng.random((count, len(bounds_low)))
        prev = prev.astype(np.float32)
        _edit(name, obs, prev, constraints, rng, bounds_low, bounds_high)
        observations.append(obs)
        previous.append(prev)
        labels.extend([name] * count)
    return EdgeCases(
        np.concatenate(observations), np.concatenate(previous), np.asarray(labels, dtype=object)
    )


def _typical_range(
    constraints: CompiledConstraints, typical: tuple[Sequence[float], Sequence[float]] | None
) -> tuple[np.ndarray, np.ndarray]:
    if typical is not None:
        low, high = (np.asarray(bound, np.float64) for bound in typical)
        return low, high
    low = np.full(constraints.observation_low.shape, -1.0)
    high = np.full(constraints.observation_low.shape, 1.0)
    for source_low, source_high in (
        (constraints.observation_low, constraints.observation_high),
        (constraints.data_low, constraints.data_high),
    ):
        source_low, source_high = np.asarray(source_low), np.asarray(source_high)
        known = np.isfinite(source_low) & np.isfinite(source_high)
        low[known], high[known] = source_low[known], source_high[known]
    return low, high


def _action_range(constraints: CompiledConstraints) -> tuple[np.ndarray, np.ndarray]:
    low = np.full(constraints.action_size, -1.0)
    high = np.full(constraints.action_size, 1.0)
    for k, j in enumerate(constraints.bound_index):
        low[j], high[j] = float(constraints.bound_low[k]), float(constraints.bound_high[k])
    return low, high


def _edit(
    name: str,
    obs: np.ndarray,
    prev: np.ndarray,
    constraints: CompiledConstraints,
    rng: np.random.Generator,
    bounds_low: np.ndarray,
    bounds_high: np.ndarray,
) -> None:
    """Turns typical rows into rows of the edge class ``name`` (in place)."""
    count, size = obs.shape
    rows = np.arange(count)
    feature = rng.integers(0, size, count)
    if name == "previous_at_bounds":
        corner = rng.random(prev.shape) < 0.5
        prev[:] = np.where(corner, bounds_low, bounds_high)
    elif name == "previous_unknown":
        prev[rng.random(prev.shape) < 0.7] = np.nan
    elif name == "previous_extreme":
        values = np.asarray([1e7, -1e7, np.inf, -np.inf], np.float32)
        prev[:] = values[rng.integers(0, len(values), prev.shape)]
    elif name == "state_thresholds":
        thresholds = np.asarray(constraints.state_threshold, np.float32)
        if len(constraints.state_feature):
            limit = rng.integers(0, len(constraints.state_feature), count)
            where = np.asarray(constraints.state_feature)[limit]
            value = thresholds[limit]
            step = rng.integers(-1, 2, count)  # one float below, at, one float above
            value = np.where(step < 0, np.nextafter(value, -np.inf, dtype=np.float32), value)
            value = np.where(step > 0, np.nextafter(value, np.inf, dtype=np.float32), value)
            obs[rows, where] = value
    elif name in ("physical_bounds", "out_of_distribution"):
        source = "observation" if name == "physical_bounds" else "data"
        low = np.asarray(getattr(constraints, f"{source}_low"), np.float32)
        high = np.asarray(getattr(constraints, f"{source}_high"), np.float32)
        checked = np.flatnonzero(np.isfinite(low) | np.isfinite(high))
        if len(checked):
            where = checked[rng.integers(0, len(checked), count)]
            side = rng.random(count) < 0.5
            bound = np.where(side, low[where], high[where])
            bound = np.where(np.isfinite(bound), bound, np.where(side, high[where], low[where]))
            outward = np.where(bound == low[where], -1.0, 1.0).astype(np.float32)
            span = np.maximum(np.abs(bound), 1.0).astype(np.float32)
            offset = rng.choice(np.asarray([0.0, -1e-3, 1e-3, 1.0], np.float32), count)
            obs[rows, where] = bound + outward * offset * span
            if name == "physical_bounds":  # exactly one float outside, too
                nudged = np.nextafter(bound, bound + outward, dtype=np.float32)
                pick = rng.random(count) < 0.25
                obs[rows[pick], where[pick]] = nudged[pick]
    elif name == "nan_observation":
        obs[rows, feature] = np.nan
    elif name == "inf_observation":
        obs[rows, feature] = np.where(rng.random(count) < 0.5, np.inf, -np.inf)
    elif name == "extreme_observation":
        values = np.asarray([1e6, -1e6, 1e20, -1e20, 3e38, -3e38], np.float32)
        chosen = rng.random(obs.shape) < 0.5
        obs[chosen] = values[rng.integers(0, len(values), int(chosen.sum()))]
    elif name == "subnormal_observation":
        tiny = np.asarray([1e-40, -1e-40, 1e-45, 0.0], np.float32)
        chosen = rng.random(obs.shape) < 0.5
        obs[chosen] = tiny[rng.integers(0, len(tiny), int(chosen.sum()))]


@dataclasses.dataclass(frozen=True)
class Parity:
    """How ONNX Runtime's decisions compare with JAX's, per edge class.

    Rows whose observation holds a subnormal float32 reading are counted apart
    (``subnormal_*``): XLA:CPU flushes subnormals to zero in some of its fused comparisons
    and not in others, ONNX Runtime compares them as the IEEE numbers they are, so a
    reading a subnormal away from a physical bound or data bound of 0 can be valid on one
    side and invalid (the fallback) on the other. Every other figure is of the other rows.
    """

    rows: int
    max_action_difference: float
    worst_class: str | None
    #: Per class: rows, the largest action difference, rows whose status differs, and
    #: the rows with a subnormal reading and how many of them decide differently.
    by_class: dict[str, dict[str, float | int]]
    status_mismatches: int
    proposed_mismatches: int  # rows whose proposal differs by more than the tolerance
    subnormal_rows: int
    subnormal_action_mismatches: int  # of those, rows whose action differs (tolerance)

    def within(self, tolerance: float = PARITY_TOLERANCE) -> bool:
        return self.max_action_difference <= tolerance

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def subnormal_rows(observations: np.ndarray) -> np.ndarray:
    """``[rows]`` bool: the row holds a subnormal float32 reading."""
    tiny = np.finfo(np.float32).tiny
    values = np.abs(np.asarray(observations, np.float32))
    return np.any((values < tiny) & (values != 0), axis=-1)


def compare_decisions(
    reference: Sequence[np.ndarray],
    candidate: Sequence[np.ndarray],
    classes: np.ndarray,
    observations: np.ndarray | None = None,
    tolerance: float = PARITY_TOLERANCE,
) -> Parity:
    """Compares two ``(action, proposed, status, ...)`` tuples row by row.

    Actions are compared as numbers (a NaN on one side only counts as an infinite
    difference); statuses bit for bit; proposals with NaN equal to NaN. With
    ``observations``, rows holding a subnormal reading are counted apart (see
    :class:`Parity`).
    """
    action_ref, proposed_ref, status_ref = (np.asarray(x) for x in reference[:3])
    action, proposed, status = (np.asarray(x) for x in candidate[:3])
    difference = _difference(action_ref, action).max(axis=-1)
    proposal = _difference(proposed_ref, proposed).max(axis=-1)
    status_differs = status_ref != status
    apart = (
        np.zeros(len(difference), bool) if observations is None else subnormal_rows(observations)
    )
    counted = np.where(apart, 0.0, difference)
    by_class: dict[str, dict[str, float | int]] = {}
    for name in dict.fromkeys(classes.tolist()):
        rows = classes == name
        by_class[name] = {
            "rows": int(rows.sum()),
            "max_action_difference": float(counted[rows].max()),
            "status_mismatches": int((status_differs & rows & ~apart).sum()),
            "subnormal_rows": int((rows & apart).sum()),
            "subnormal_action_mismatches": int((rows & apart & (difference > tolerance)).sum()),
        }
    worst = int(np.argmax(counted)) if len(counted) else None
    return Parity(
        rows=len(difference),
        max_action_difference=float(counted.max()) if len(counted) else 0.0,
        worst_class=None if worst is None else str(classes[worst]),
        by_class=by_class,
        status_mismatches=int((status_differs & ~apart).sum()),
        proposed_mismatches=int(((proposal > tolerance) & ~apart).sum()),
        subnormal_rows=int(apart.sum()),
        subnormal_action_mismatches=int((apart & (difference > tolerance)).sum()),
    )


def _difference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    both_nan = np.isnan(a) & np.isnan(b)
    same = (a == b) | both_nan  # equal infinities too
    with np.errstate(invalid="ignore"):
        difference = np.abs(a - b)
    difference = np.where(same, 0.0, difference)
    return np.where(np.isnan(difference), np.inf, difference)


def onnx_policy_graph(
    function: Callable[[Any, Any], tuple[Any, ...]],
    observation_size: int,
    action_size: int,
    n_constraints: int,
    *,
    trace_min_batch: int,
    reference: Callable[[np.ndarray, np.ndarray], Sequence[np.ndarray]],
    probes: EdgeCases,
    metadata: Mapping[str, str] | None = None,
) -> tuple[bytes, dict[str, Any]]:
    """The serialized ONNX graph of ``function`` and its manifest entry.

    Args:
        function: ``serve(observations, prev_actions) -> (action, proposed, status,
            margins)`` for a batch.
        observation_size, action_size, n_constraints: the sizes of its arrays.
        trace_min_batch: traced as a batch of at least this many rows (see
            :func:`.onnx_graph.lower_to_onnx`).
        reference: the JAX artifact's function on numpy arrays, for the parity check.
        probes: the parity check's inputs.
        metadata: ``metadata_props`` of the model.

    Raises:
        OnnxExportError: for a function with no ONNX form, or a graph whose actions
            differ from ``reference``'s on ``probes`` by more than
            :data:`PARITY_TOLERANCE`.
    """
    model = lower_to_onnx(
        function,
        [
            ("observations", (observation_size,), np.float32),
            ("prev_actions", (action_size,), np.float32),
        ],
        list(OUTPUTS),
        doc=(
            "neorl_industrial policy: observation normalizer, policy network, action scaling "
            "and safety shield; inputs observations [batch, obs] and prev_actions [batch, "
            "act] (NaN: unknown), outputs action, proposed, status bits, margins"
        ),
        metadata=dict(metadata or {}),
        trace_min_batch=trace_min_batch,
    )
    data = model.SerializeToString()
    parity = _checked_parity(data, reference, probes)
    return data, _graph_entry(model, observation_size, action_size, n_constraints, parity)


def _checked_parity(
    data: bytes,
    reference: Callable[[np.ndarray, np.ndarray], Sequence[np.ndarray]],
    probes: EdgeCases,
) -> Parity:
    """The graph ``data`` on ONNX Runtime against ``reference`` on ``probes``.

    Raises:
        OnnxExportError: for actions apart by more than :data:`REFUSAL_TOLERANCE`.
    """
    session = runtime_session(data)
    candidate = session.run(
        None, {"observations": probes.observations, "prev_actions": probes.prev_actions}
    )
    parity = compare_decisions(
        reference(probes.observations, probes.prev_actions),
        candidate,
        probes.classes,
        probes.observations,
    )
    if not parity.within(REFUSAL_TOLERANCE):
        raise OnnxExportError(
            f"the ONNX graph's actions differ from the JAX function's by up to "
            f"{parity.max_action_difference:.3g} (above {REFUSAL_TOLERANCE:g}) on probe rows "
            f"of the class {parity.worst_class!r}; per class: {parity.by_class}"
        )
    return parity


def _graph_entry(
    model: Any, observation_size: int, action_size: int, n_constraints: int, parity: Parity
) -> dict[str, Any]:
    """The manifest's ``"onnx"`` entry: the graph's file, opset, inputs and outputs (of
    these sizes) and its parity check."""
    return {
        "file": ONNX_FILE,
        "opset": OPSET,
        "ir_version": int(model.ir_version),
        "inputs": {
            "observations": [BATCH, observation_size],
            "prev_actions": [BATCH, action_size],
        },
        "outputs": {
            "action": [BATCH, action_size],
            "proposed": [BATCH, action_size],
            "status": [BATCH],
            "margins": [BATCH, 2, n_constraints],
        },
        "nodes": len(model.graph.node),
        "parity": {
            "rows": parity.rows,
            "target": PARITY_TOLERANCE,
            "refused_above": REFUSAL_TOLERANCE,
            "max_action_difference": parity.max_action_difference,
            "status_mismatches": parity.status_mismatches,
            "subnormal_rows": parity.subnormal_rows,
            "subnormal_action_mismatches": parity.subnormal_action_mismatches,
        },
    }


def runtime_session(data: bytes, threads: int = 1) -> Any:
    """An ONNX Runtime CPU session of the graph ``data`` (``threads`` intra-op threads)."""
    with optional_imports():
        import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    try:
        return onnxruntime.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own classes
        raise OnnxExportError(f"ONNX Runtime cannot load the graph: {error}") from error
