"""Where each actuator may be, as the bridge knows it: the last position the plant
reported (and when, on the loop's clock), the values written since (their span) and the
last of them, which stands in for a position that cannot be read. From these come the
previous action the shield decides from and the writes that are withheld (an unknown
position, or a value beyond a rate limit from a position the actuator may be at)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ActuatorPositions"]

#: How far a written value may lie beyond a rate limit's band, as a share of the action's
#: range: the shield computes in float32.
RATE_SLACK = 1e-5


class ActuatorPositions:
    """The positions of a plan's actuators.

    Args:
        plan: the :class:`~.plan.BridgePlan` (its action names, bounds, rate limits and
            ``stale_after``).
    """

    def __init__(self, plan: Any) -> None:
        self.plan = plan
        n_act = len(plan.action_names)
        self.reported_at = np.full(n_act, -np.inf)
        self.low = np.full(n_act, np.nan)  # the span of the positions since reported
        self.high = np.full(n_act, np.nan)
        self.held = np.full(n_act, np.nan)  # the last of them

    def previous(self, applied: np.ndarray, read_at: float) -> np.ndarray:
        """The previous action the shield decides from: each position the plant reports
        now; where it cannot be read, the last value written since it last did, else that
        last position if reported within ``stale_after``; else unknown (NaN)."""
        known = np.isfinite(applied)
        self.reported_at[known] = read_at
        self.low[known] = self.high[known] = self.held[known] = applied[known]
        # A position last reported longer ago than a reading stays fresh is not known:
        # the plant's own control may have moved the actuator since.
        lost = read_at - self.reported_at > self.plan.stale_after
        self.low[lost] = self.high[lost] = self.held[lost] = np.nan
        return self.held.copy()

    def sent(self, action: np.ndarray) -> None:
        """The actuators may now be anywhere between where they were and ``action``."""
        self.low = np.fmin(self.low, action)
        self.high = np.fmax(self.high, action)
        self.held = action.copy()

    def withhold(self, action: np.ndarray, prev: np.ndarray) -> dict[str, Any] | None:
        """Why the tick's action must not be written (``None``: it may be): an actuator
        whose position is not known, or a value outside a rate limit's band from a
        position the actuator may be at."""
        plan = self.plan
        names = plan.action_names
        unknown = [n for n, p in zip(names, prev.tolist(), strict=True) if not np.isfinite(p)]
        if unknown:
            return {
                "reason": "position_unknown",
                "actions": unknown,
                "detail": "no position reported (or written) to move from; the plant's own "
                "control keeps the actuators",
            }
        limits = plan.rate_limits
        slack = RATE_SLACK * np.maximum(1.0, np.abs(plan.action_high - plan.action_low))
        slack = np.where(np.isfinite(slack), slack, RATE_SLACK)
        low = self.high - limits - slack  # within the limit of the highest position...
        high = self.low + limits + slack  # ...and of the lowest
        # A value that is not finite is the bounds' guard's (the bridge's ``_safe``).
        limited = np.isfinite(limits) & np.isfinite(action)
        beyond = limited & ~((action >= low) & (action <= high))
        if beyond.any():
            return {
                "reason": "rate_limit",
                "actions": [n for n, b in zip(names, beyond.tolist(), strict=True) if b],
                "detail": "; ".join(
                    f"{names[j]} {action[j]:.6g} outside [{low[j]:.6g}, {high[j]:.6g}] "
                    f"(rate limit {limits[j]:g} from {self.low[j]:.6g}..{self.high[j]:.6g})"
                    for j in np.flatnonzero(beyond)
                ),
            }
        return None
