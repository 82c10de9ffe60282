"""Runtime aggregation of the shield's reports on the host.

A :class:`SafetyMonitor` counts what the shield did — decisions, overrides, projections,
fallbacks, invalid proposals, infeasible situations, observations outside their physical
bounds or outside the training data's range, violations per hard constraint by the
proposed and by the applied action — and
keeps running statistics of each constraint's margin. It takes whole batches of reports,
is safe to call from several threads (a server's workers), and summarizes to strict JSON
(no infinities or NaN).

A server observes one report per request, mostly of one row: the rows of reports with
``status`` bits are copied into a buffer of :data:`PENDING_ROWS` rows and counted in one
NumPy pass when it fills or when anything is read, rather than a dozen NumPy operations
per request.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from neorl_industrial.core.safety import TOLERANCE
from neorl_industrial.wrappers.agents.artifact import STATUS_BITS

__all__ = ["PENDING_ROWS", "HostReport", "SafetyMonitor", "host_report"]

#: Rows of reports a monitor holds before it counts them (see the module's docstring).
PENDING_ROWS = 256


class HostReport(NamedTuple):
    """A ``SafetyReport`` as NumPy arrays, flattened to rows.

    Attributes:
        overridden: ``[rows]`` bool.
        projected: ``[rows]`` bool.
        fallback: ``[rows]`` bool.
        invalid: ``[rows]`` bool.
        infeasible: ``[rows]`` bool.
        invalid_observation: ``[rows]`` bool.
        out_of_distribution: ``[rows]`` bool.
        violated: ``[rows, n_hard]`` bool: the proposed action breaks the constraint.
        margin: ``[rows, n_hard]`` float64.
        batch_shape: the report's leading axes (``()`` for a single decision).
        violated_after: ``[rows, n_hard]`` bool: the applied action breaks the constraint
            or cannot be shown to keep it (``None``: the report does not say).
    """

    overridden: np.ndarray
    projected: np.ndarray
    fallback: np.ndarray
    invalid: np.ndarray
    infeasible: np.ndarray
    invalid_observation: np.ndarray
    out_of_distribution: np.ndarray
    violated: np.ndarray
    margin: np.ndarray
    batch_shape: tuple[int, ...]
    violated_after: np.ndarray | None = None

    @property
    def rows(self) -> int:
        """The number of decisions in the report."""
        return int(self.overridden.shape[0])


def host_report(
    report: Any, n_constraints: int, *, against: str = "constraint_names lists"
) -> HostReport:
    """Copies a single or batched ``SafetyReport`` to the host, one transfer per leaf.

    A report with ``status`` bits (the shield's own) is decoded with NumPy; any other
    object with boolean ``overridden``, ``projected``, ``fallback``, ``invalid``,
    ``infeasible``, ``violated`` and a ``margin`` (``invalid_observation`` and
    ``out_of_distribution`` where it has them) is read field by field. What the applied
    action breaks is read from ``applied_margin`` (or ``violated_after``) where the report
    has it.

    Args:
        report: the shield's report, any leading axes.
        n_constraints: the number of hard constraints the caller expects.
        against: the phrase the error message puts before ``n_constraints``.

    Returns:
        The report's arrays, the leading axes flattened to one row axis.

    Raises:
        ValueError: when the report's constraint columns are not ``n_constraints`` wide or
            its flags and margins disagree on the leading axes.
    """
    margin = np.asarray(report.margin, np.float64)
    status = getattr(report, "status", None)
    if status is not None:
        status = np.asarray(status)
        flags = {name: (status & bit) != 0 for name, bit in STATUS_BITS.items()}
        violated = ~(margin >= -TOLERANCE)
        applied_margin = getattr(report, "applied_margin", None)
        after = None if applied_margin is None else ~(np.asarray(applied_margin) >= -TOLERANCE)
    else:
        # Reports from before the observation check have no such flag: never set.
        flags = {
            name: np.asarray(getattr(report, name, np.zeros_like(report.overridden)), bool)
            for name in STATUS_BITS
        }
        violated = np.asarray(report.violated, bool)
        after = getattr(report, "violated_after", None)
        after = None if after is None else np.asarray(after, bool)
    width = violated.shape[-1] if violated.ndim else 0
    if violated.ndim == 0 or width != n_constraints:
        raise ValueError(
            f"report: {width} constraint columns, {against} {n_constraints} constraints"
        )
    batch_shape = violated.shape[:-1]
    if margin.shape != violated.shape or any(f.shape != batch_shape for f in flags.values()):
        raise ValueError(
            f"report: flags of shape {flags['overridden'].shape} and margins of shape "
            f"{margin.shape} do not line up"
        )
    if after is not None and after.shape != violated.shape:
        raise ValueError(
            f"report: applied margins of shape {after.shape}, proposed margins of shape "
            f"{violated.shape}"
        )
    rows = math.prod(batch_shape)
    return HostReport(
        **{name: values.reshape(rows) for name, values in flags.items()},
        violated=violated.reshape(rows, n_constraints),
        margin=margin.reshape(rows, n_constraints),
        batch_shape=tuple(batch_shape),
        violated_after=None if after is None else after.reshape(rows, n_constraints),
    )


def _checked_status_report(
    report: Any, n_constraints: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A report with ``status`` bits as ``(status [rows], margins [rows, n], applied
    margins [rows, n] or None)``, its shapes checked as :func:`host_report` checks them."""
    margin = np.asarray(report.margin)
    status = np.asarray(report.status)
    width = margin.shape[-1] if margin.ndim else 0
    if margin.ndim == 0 or width != n_constraints:
        raise ValueError(
            f"report: {width} constraint columns, the monitor knows {n_constraints} constraints"
        )
    if status.shape != margin.shape[:-1]:
        raise ValueError(
            f"report: flags of shape {status.shape} and margins of shape {margin.shape} do "
            "not line up"
        )
    applied = getattr(report, "applied_margin", None)
    if applied is not None:
        applied = np.asarray(applied)
        if applied.shape[-1:] != (n_constraints,) or applied.size != margin.size:
            raise ValueError(
                f"report: applied margins of shape {applied.shape}, proposed margins of "
                f"shape {margin.shape}"
            )
        applied = applied.reshape(-1, n_constraints)
    return status.reshape(-1), margin.reshape(-1, n_constraints), applied


def _status_counts(
    status: np.ndarray, margin: np.ndarray, applied: np.ndarray | None
) -> tuple[int, dict[str, int], np.ndarray, np.ndarray, np.ndarray | None]:
    """What :meth:`SafetyMonitor.observe` counts of status rows, in a few NumPy operations
    whatever their number: ``(rows, flag counts, margins [rows, n], violated [rows, n],
    violated after [rows, n] or None)``. The flags are counted only when some bit is set
    (rarely, on a server)."""
    margin = np.asarray(margin, np.float64)
    rows = len(status)
    flags = dict.fromkeys(STATUS_BITS, 0)
    if rows and status.any():
        for name, bit in STATUS_BITS.items():
            flags[name] = int(np.count_nonzero(status & bit))
    after = None if applied is None else ~(applied >= -TOLERANCE)
    return rows, flags, margin, ~(margin >= -TOLERANCE), after


def _json_number(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


class SafetyMonitor:
    """Counts and margin statistics over every observed ``SafetyReport``.

    Margin statistics use the finite margins only: an inactive state-conditional limit
    reports ``+inf`` and a NaN observation NaN, and neither says how close an action came.

    Args:
        constraint_names: the hard constraints' names (``CompiledConstraints.names``), in
            the order of the reports' ``violated`` and ``margin`` columns.
    """

    def __init__(self, constraint_names: Sequence[str]) -> None:
        self.constraint_names = tuple(constraint_names)
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Forgets everything observed so far."""
        n = len(self.constraint_names)
        with self._lock:
            self._decisions = 0
            self._flags = dict.fromkeys(STATUS_BITS, 0)
            self._violations = np.zeros(n, np.int64)
            self._violations_after = np.zeros(n, np.int64)
            self._margin_count = np.zeros(n, np.int64)
            self._margin_sum = np.zeros(n, np.float64)
            self._margin_min = np.full(n, np.inf)
            self._by_version: dict[str, int] = {}
            # Rows observed but not counted yet (see the module's docstring): all of one
            # policy version and all with or all without applied margins.
            self._pending_status = np.zeros(PENDING_ROWS, np.int64)
            self._pending_margin = np.zeros((PENDING_ROWS, n), np.float64)
            self._pending_applied = np.zeros((PENDING_ROWS, n), np.float64)
            self._pending_rows = 0
            self._pending_version: str | None = None
            self._pending_has_applied = False

    def observe(self, report: Any, *, policy_version: str | None = None) -> None:
        """Adds one report or a batch of them (any leading axes).

        Args:
            report: a ``SafetyReport`` (device or host arrays).
            policy_version: counts the report's overrides under this version too.

        Raises:
            ValueError: when the report's constraint columns do not match the names.
        """
        n = len(self.constraint_names)
        if getattr(report, "status", None) is None:
            host = host_report(report, n, against="the monitor knows")
            flags = {name: int(getattr(host, name).sum()) for name in STATUS_BITS}
            with self._lock:
                self._count(
                    host.rows, flags, host.margin, host.violated, host.violated_after,
                    policy_version,
                )  # fmt: skip
            return
        status, margin, applied = _checked_status_report(report, n)
        rows = len(status)
        if rows == 0:
            return
        has_applied = applied is not None
        with self._lock:
            start = self._pending_rows
            if start and (
                start + rows > PENDING_ROWS
                or policy_version != self._pending_version
                or has_applied != self._pending_has_applied
            ):
                self._flush()
                start = 0
            if rows > PENDING_ROWS:  # a large batch: counted at once
                self._count(*_status_counts(status, margin, applied), policy_version)
                return
            stop = start + rows
            self._pending_status[start:stop] = status
            self._pending_margin[start:stop] = margin
            if has_applied:
                self._pending_applied[start:stop] = applied
            self._pending_rows = stop
            self._pending_version = policy_version
            self._pending_has_applied = has_applied

    def _flush(self) -> None:
        """Counts the pending rows (the lock held)."""
        rows = self._pending_rows
        if not rows:
            return
        applied = self._pending_applied[:rows] if self._pending_has_applied else None
        counts = _status_counts(self._pending_status[:rows], self._pending_margin[:rows], applied)
        self._pending_rows = 0
        self._count(*counts, self._pending_version)

    def _count(
        self,
        rows: int,
        flags: dict[str, int],
        margin: np.ndarray,
        violated: np.ndarray,
        after: np.ndarray | None,
        policy_version: str | None,
    ) -> None:
        """Adds counted rows to the totals (the lock held)."""
        finite = np.isfinite(margin)
        self._decisions += rows
        for name, value in flags.items():
            self._flags[name] += value
        self._violations += violated.sum(axis=0)
        if after is not None:
            self._violations_after += after.sum(axis=0)
        self._margin_count += finite.sum(axis=0)
        self._margin_sum += np.where(finite, margin, 0.0).sum(axis=0)
        lowest = np.where(finite, margin, np.inf).min(axis=0, initial=np.inf)
        np.minimum(self._margin_min, lowest, out=self._margin_min)
        if policy_version is not None:
            self._by_version[policy_version] = (
                self._by_version.get(policy_version, 0) + flags["overridden"]
            )

    @property
    def decisions(self) -> int:
        """Actions the shield decided on."""
        with self._lock:
            self._flush()
            return self._decisions

    @property
    def overrides(self) -> int:
        """Actions the shield replaced."""
        with self._lock:
            self._flush()
            return self._flags["overridden"]

    @property
    def override_rate(self) -> float:
        """Overrides per decision (0.0 before the first decision)."""
        with self._lock:
            self._flush()
            return self._rate()

    def _rate(self) -> float:
        return self._flags["overridden"] / self._decisions if self._decisions else 0.0

    def per_constraint(self) -> dict[str, dict[str, Any]]:
        """Per hard constraint: violations by the proposed and by the applied actions and
        margin statistics (of the proposed actions).

        Returns:
            ``{name: {"violations", "violations_after", "margin_min", "margin_mean",
            "margin_count"}}``, the statistics over finite margins only and ``None`` where
            there were none; ``violations_after`` counts applied actions that break the
            constraint or cannot be shown to keep it (reports that say so only).
        """
        with self._lock:
            self._flush()
            return self._per_constraint()

    def _per_constraint(self) -> dict[str, dict[str, Any]]:
        out = {}
        for i, name in enumerate(self.constraint_names):
            count = int(self._margin_count[i])
            out[name] = {
                "violations": int(self._violations[i]),
                "violations_after": int(self._violations_after[i]),
                "margin_min": _json_number(self._margin_min[i]) if count else None,
                "margin_mean": _json_number(self._margin_sum[i] / count) if count else None,
                "margin_count": count,
            }
        return out

    def summary(self) -> dict[str, Any]:
        """Everything observed, as strict JSON-ready data (``None`` for no value).

        Returns:
            ``decisions``, ``overrides``, ``projected``, ``fallback``, ``invalid``,
            ``infeasible``, ``invalid_observation``, ``override_rate``, ``constraints``
            (see :meth:`per_constraint`) and ``overrides_by_policy_version``, taken
            together under the lock.
        """
        with self._lock:
            self._flush()
            return {
                "decisions": self._decisions,
                "overrides": self._flags["overridden"],
                **{name: self._flags[name] for name in STATUS_BITS if name != "overridden"},
                "override_rate": self._rate(),
                "constraints": self._per_constraint(),
                "overrides_by_policy_version": dict(self._by_version),
            }
