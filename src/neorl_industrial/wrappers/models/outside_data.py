"""What a plant model is asked outside the data it was fitted on, named for people.

A learned model answers anywhere, but beyond the range of its data it extrapolates.
``PlantModel.predict`` and ``rollout`` therefore compare their inputs (and a rollout's own
predicted states) with the data's range of every feature and action, on the host, and
warn with an :class:`OutsideDataWarning` naming each feature, its most extreme value and
the bound it passes, in the plant's units. The result still comes back, flagged
(``outside_data``, ``out_of_distribution``): a question outside the data is a question
whose answer deserves less trust, not a mistake. A caller who wants it to be one turns the
warning into an error (``warnings.simplefilter("error", OutsideDataWarning)``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

__all__ = ["OutsideDataWarning", "OutsideFeature", "outside_features", "outside_message"]


@dataclasses.dataclass(frozen=True)
class OutsideFeature:
    """One feature or action beyond the range of the model's data.

    Attributes:
        name: the feature's or action's name.
        unit: its unit (None: none given).
        value: its most extreme value beyond the range, in the plant's units.
        bound: the data's bound it passes (its lowest or highest value in the data).
        side: ``"above"`` or ``"below"``.
        rows: how many of the checked rows are beyond the range on this feature.
        total: how many rows were checked.
        counted: what a row is (``"rows"`` of inputs, ``"predicted states"``).
    """

    name: str
    unit: str | None
    value: float
    bound: float
    side: str
    rows: int
    total: int
    counted: str = "rows"

    def __str__(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        extreme = "highest" if self.side == "above" else "lowest"
        return (
            f"{self.name} = {self.value:.4g}{unit}, {self.side} the data's {extreme} "
            f"{self.bound:.4g}{unit} (in {self.rows} of {self.total} {self.counted})"
        )


class OutsideDataWarning(UserWarning):
    """A plant model was asked to predict outside the range of its data.

    Attributes:
        features: every feature and action beyond the range (:class:`OutsideFeature`).
    """

    def __init__(self, message: str, features: Sequence[OutsideFeature] = ()):
        super().__init__(message)
        self.features = tuple(features)


def outside_features(
    checked: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    names: Sequence[str],
    units: Sequence[str | None],
    *,
    shown: np.ndarray | None = None,
    to_plant: tuple[np.ndarray, np.ndarray] | None = None,
    counted: str = "rows",
) -> list[OutsideFeature]:
    """The features of ``checked`` ``[..., F]`` beyond ``[low, high]`` (strictly, as the
    compiled out-of-distribution measure compares them), one per feature.

    Args:
        checked: the values compared, in the space ``low`` and ``high`` are in.
        low, high: ``[F]`` the data's range.
        names, units: ``[F]`` of the features.
        shown: the same values in the plant's units, when ``checked`` is not (actions
            in [-1, 1]); default ``checked``.
        to_plant: ``(plant_low, plant_high)`` mapping a bound from [-1, 1] to the
            plant's units; None: the bounds are in the plant's units already.
        counted: what one row of ``checked`` is, for the message.
    """
    checked = np.asarray(checked).reshape(-1, len(names))
    shown = checked if shown is None else np.asarray(shown).reshape(-1, len(names))
    low, high = np.asarray(low), np.asarray(high)
    below, above = checked < low, checked > high
    found = []
    for index in np.flatnonzero(below.any(axis=0) | above.any(axis=0)):
        # the side passed farthest (in the checked space, where both sides compare)
        under = float(np.max(low[index] - checked[:, index], initial=0.0))
        over = float(np.max(checked[:, index] - high[index], initial=0.0))
        side = "above" if over >= under else "below"
        mask = (above if side == "above" else below)[:, index]
        values = shown[mask, index]
        value = float(values.max() if side == "above" else values.min())
        bound = float(high[index] if side == "above" else low[index])
        if to_plant is not None:
            plant_low, plant_high = (float(x[index]) for x in to_plant)
            bound = plant_low + (bound + 1.0) * 0.5 * (plant_high - plant_low)
        found.append(
            OutsideFeature(
                name=str(names[index]),
                unit=units[index],
                value=value,
                bound=bound,
                side=side,
                rows=int(mask.sum()),
                total=len(checked),
                counted=counted,
            )
        )
    return found


def outside_message(
    what: str, dataset: str, given: Sequence[OutsideFeature], reached: Sequence[OutsideFeature]
) -> str:
    """The warning's text: what was asked outside the data of ``dataset``, and (for a
    rollout) where its own predicted states left it."""
    parts = []
    if given:
        parts.append(
            f"{what}: asked outside the range of the data the model was fitted on "
            f"({dataset}): " + "; ".join(map(str, given))
        )
    if reached:
        parts.append(
            f"{what}: the predicted states leave the range of the data ({dataset}): "
            + "; ".join(map(str, reached))
        )
    return (
        ". ".join(parts) + ". The model extrapolates there; `out_of_distribution` in the "
        "result says how far, in spreads of each feature"
    )
