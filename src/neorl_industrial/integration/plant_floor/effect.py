"""The effect of following the policy, estimated from a plant model
(:class:`~neorl_industrial.wrappers.models.PlantModel`) of the same task, one step ahead:
for every paired tick of a shadow run (the logged observation, the operators' applied
action and the policy's shielded action), each elite member's deterministic mean
prediction of the reward and cost channels of the next step under both actions. Per
channel: the mean difference (policy minus operators, member mean), a 95 % bootstrap
interval over ticks of the member-mean difference, the range of the members' own mean
differences, and the share of ticks where the model flags an input outside its data (the
estimate is called unreliable above :data:`OOD_UNRELIABLE`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from neorl_industrial.core.units import same_unit

if TYPE_CHECKING:
    from neorl_industrial.core.models.dynamics import Dynamics
    from neorl_industrial.wrappers.models import PlantModel

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "CONFIDENCE",
    "ESTIMATOR",
    "OOD_UNRELIABLE",
    "ChannelEffect",
    "PlantEffect",
    "estimate_effect",
    "load_plant_model",
]

#: How the effect is estimated.
ESTIMATOR = "plant model, one step ahead"
#: Above this share of ticks outside the model's data, the estimate is called unreliable.
OOD_UNRELIABLE = 0.2
#: Bootstrap resamples of the ticks, and the interval's confidence level.
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95


def format_cell(value: float | None) -> str:
    """A number of a report's table (``-`` for none)."""
    return "-" if value is None else f"{value:.4g}"


def format_interval(pair: list[float] | None) -> str:
    """An interval of a report's table (``-`` for none)."""
    return "-" if pair is None else f"[{pair[0]:+.4g}, {pair[1]:+.4g}]"


@dataclasses.dataclass
class ChannelEffect:
    """The estimated effect on one channel (reward or a cost) of the next step."""

    name: str
    #: mean over ticks of the members' mean prediction, under each action.
    policy: float
    operators: float
    #: policy minus operators: the mean over ticks of the member-mean difference.
    difference: float
    #: a bootstrap interval over ticks of that mean (None for fewer than two ticks).
    interval: list[float] | None
    #: the lowest and highest of the members' own mean differences.
    member_range: list[float]
    reading: str


@dataclasses.dataclass
class PlantEffect:
    """What a plant model estimates following the policy would have changed."""

    estimator: str
    model: str
    task: str
    members: int
    ticks: int
    channels: list[ChannelEffect]
    #: share of ticks whose observation or either action lies outside the model's data.
    out_of_distribution: float
    reliable: bool
    confidence: float
    #: the model card's held-out fidelity of the channels one step ahead.
    fidelity: list[dict[str, Any]]

    def headline(self) -> str:
        """One line: the first channel's difference and interval, and the reliability."""
        if not self.channels:
            return f"{ESTIMATOR}: no tick with an observation and both actions"
        first = self.channels[0]
        text = (
            f"{first.name} {first.difference:+.4g} (policy - operators; "
            f"{format_interval(first.interval)}, members {format_interval(first.member_range)}) "
            f"[{self.estimator}, {self.ticks} ticks]"
        )
        if not self.reliable:
            text += f"; unreliable: {100 * self.out_of_distribution:.0f} % of ticks out of data"
        return text

    def markdown(self) -> list[str]:
        level = f"{100 * self.confidence:g} %"
        lines = [
            f"An estimate, not a measurement. Estimator: {self.estimator}, with the plant model "
            f"`{self.model}` (task {self.task}, {self.members} members) on {self.ticks} "
            "paired ticks (the logged observation; the operators' applied action and the "
            "policy's shielded action).",
            "",
            f"| channel | operators | policy | policy - operators | {level} interval (ticks) "
            "| member range | reading |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for c in self.channels:
            lines.append(
                f"| {c.name} | {c.operators:.4g} | {c.policy:.4g} | {c.difference:+.4g} | "
                f"{format_interval(c.interval)} | {format_interval(c.member_range)} | {c.reading} |"
            )
        share = f"{100 * self.out_of_distribution:.1f} %"
        lines += [
            "",
            f"Out of the model's data: {share} of the ticks"
            + (
                "."
                if self.reliable
                else f" (more than {100 * OOD_UNRELIABLE:g} %): the estimate is unreliable."
            ),
        ]
        if self.fidelity:
            lines += [
                "",
                "The model's held-out fidelity one step ahead (its card):",
                "",
                "| channel | RMSE | relative RMSE | 90 % interval coverage |",
                "|---|---:|---:|---:|",
            ]
            for row in self.fidelity:
                cells = [format_cell(row.get(k)) for k in ("rmse", "relative_rmse", "coverage")]
                lines.append(f"| {row['name']} | {' | '.join(cells)} |")
        return lines


def _fidelity(card: dict[str, Any]) -> list[dict[str, Any]]:
    rows = (card.get("fidelity") or {}).get("rows") or []
    return [row for row in rows if row.get("kind") == "signal" and row.get("step") == 1]


def load_plant_model(path: str | Path, task: dict[str, Any], log: str | Path) -> PlantModel:
    """The plant model saved at ``path``, refused unless it is of the log's task: the
    same observation and action names (and units, where the log states them).

    Raises:
        PlantModelError: naming the model's and the log's task where they differ, or the
            model's file that is missing or unreadable.
    """
    from neorl_industrial.wrappers.models import PlantModel, PlantModelError

    missing = [key for key in ("observation_names", "action_names") if not task.get(key)]
    if missing:
        raise PlantModelError(
            f"{log}: its header's task names no {' and no '.join(missing)}; the plant model "
            f"{path} cannot be matched to it"
        )
    model = PlantModel.load(path)
    mine = model.task
    differences = []
    for field in ("observation_names", "action_names", "observation_units", "action_units"):
        theirs = task.get(field)
        if theirs is None:
            continue
        ours = list(getattr(mine, field))
        if field.endswith("units"):
            # Units are compared as units (degC is °C), not as written.
            same = len(ours) == len(theirs) and all(
                same_unit(a, b) for a, b in zip(ours, theirs, strict=True)
            )
        else:
            same = ours == list(theirs)
        if not same:
            differences.append(f"{field} {ours} vs {list(theirs)}")
    if differences:
        raise PlantModelError(
            f"plant model {path}: task {mine.name!r} is not the task of the log {log} "
            f"({'; '.join(differences)}); fit a plant model on this plant's data"
        )
    return model


def _effect_program(dynamics: Dynamics) -> Any:
    """Compiled: the reward, costs and out-of-distribution measure of every member's
    deterministic one-step prediction, ``[actions, members, ticks, ...]`` for observations
    ``[ticks, obs]`` and actions ``[actions, ticks, act]`` in [-1, 1]. Each member's is
    ``transition`` of that member alone: the numbers of ``step`` with ``member`` and
    ``deterministic``, one network evaluated instead of all."""
    import jax
    import jax.numpy as jnp

    from neorl_industrial.core.models.dynamics import out_of_distribution

    def one(params, member, observation, action):
        _, reward, costs, _ = dynamics.transition(
            params, observation, action, jax.random.PRNGKey(0), member, True
        )
        return reward, costs

    @jax.jit
    def program(params, observations, actions):
        over_ticks = jax.vmap(one, in_axes=(None, None, 0, 0))
        over_members = jax.vmap(over_ticks, in_axes=(None, 0, None, None))
        over_actions = jax.vmap(over_members, in_axes=(None, None, None, 0))
        rewards, costs = over_actions(params, jnp.arange(params.n_members), observations, actions)
        ood = jax.vmap(
            jax.vmap(out_of_distribution, in_axes=(None, 0, 0)), in_axes=(None, None, 0)
        )(params, observations, actions)
        return rewards, costs, ood

    return program


def _reading(interval: list[float] | None, member_range: list[float]) -> str:
    """One line: whether the intervals (over ticks and over members) contain 0."""
    low = min(member_range[0], interval[0] if interval else member_range[0])
    high = max(member_range[1], interval[1] if interval else member_range[1])
    if low <= 0.0 <= high:
        return "an interval contains 0: the model cannot tell them apart"
    side = "higher" if low > 0 else "lower"
    return f"{side} under the policy (both intervals {'above' if low > 0 else 'below'} 0)"


def estimate_effect(
    model: PlantModel,
    model_dir: str | Path,
    observations: np.ndarray,
    operators: np.ndarray,
    policy: np.ndarray,
    *,
    seed: int = 0,
) -> PlantEffect:
    """The plant model's one-step estimate of following ``policy`` instead of
    ``operators`` (both ``[ticks, act]`` in plant units) from ``observations``
    ``[ticks, obs]`` (see the module docstring)."""
    from scipy.stats import bootstrap

    task = model.task
    low = np.asarray(task.action_low, np.float64)
    high = np.asarray(task.action_high, np.float64)
    actions = np.stack([operators, policy]).astype(np.float64)
    if model.scaler is not None:
        # As the model maps plant units: not clipped, so the out-of-distribution measure
        # sees an action outside its bounds.
        actions = 2.0 * (actions - low) / (high - low) - 1.0
    params = model.params(seed)
    members = params.n_members
    ticks = len(observations)
    channels: list[ChannelEffect] = []
    share = 0.0
    if ticks:
        rewards, costs, ood = (
            np.asarray(x, np.float64)
            for x in _effect_program(model.dynamics)(
                params, np.asarray(observations, np.float32), np.asarray(actions, np.float32)
            )
        )
        share = float(np.mean(np.max(ood, axis=0) > 0.0))
        values = {"reward": rewards} | {
            name: costs[..., i] for i, name in enumerate(task.cost_names)
        }
        for name, value in values.items():  # [2 (operators, policy), members, ticks]
            difference = value[1] - value[0]
            per_tick = difference.mean(axis=0)
            per_member = difference.mean(axis=1)
            interval = None
            if ticks > 1:
                found = bootstrap(
                    (per_tick,),
                    np.mean,
                    n_resamples=BOOTSTRAP_RESAMPLES,
                    confidence_level=CONFIDENCE,
                    method="percentile",
                    rng=np.random.default_rng(seed),
                ).confidence_interval
                interval = [float(found.low), float(found.high)]
            member_range = [float(per_member.min()), float(per_member.max())]
            channels.append(
                ChannelEffect(
                    name=name,
                    policy=float(value[1].mean()),
                    operators=float(value[0].mean()),
                    difference=float(per_tick.mean()),
                    interval=interval,
                    member_range=member_range,
                    reading=_reading(interval, member_range),
                )
            )
    return PlantEffect(
        estimator=ESTIMATOR,
        model=str(model_dir),
        task=task.name,
        members=members,
        ticks=ticks,
        channels=channels,
        out_of_distribution=share,
        reliable=share <= OOD_UNRELIABLE,
        confidence=CONFIDENCE,
        fidelity=_fidelity(model.card),
    )
