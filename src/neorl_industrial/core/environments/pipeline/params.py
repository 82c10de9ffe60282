"""Parameters of NeoRL-2's Pipeline task, validated on the host.

The defaults are those of NeoRL-2's ``PipelineEnv`` (``neorl2/envs/pipline.py``, the
registered ``Pipeline``): a channel of capacity 200 whose gate flow reaches the outlet 19
steps later, a target flow switching with probability 0.003 per step among
{50, 80, 110, 140}, an initial flow drawn from U(80, 120), and 1000-step episodes.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from neorl_industrial.core.environments.validation import (
    finite_array,
    finite_number,
    positive_int,
    with_overrides,
)

#: the channel's capacity: the gate flow (and so every flow) lies in [0, MAX_FLOW]
DEFAULT_MAX_FLOW = 200.0
DEFAULT_TARGET_LEVELS = (50.0, 80.0, 110.0, 140.0)
#: chance per step that a new target is drawn (it may repeat the old one, so the target's
#: value changes with probability 0.003 * 3/4 = 0.00225 per step)
DEFAULT_SWITCH_PROBABILITY = 0.003
DEFAULT_INITIAL_FLOW_RANGE = (80.0, 120.0)
DEFAULT_HORIZON = 1000
#: ``initial_target`` value that draws the first target uniformly from the levels
SAMPLE_INITIAL_TARGET = -1.0
#: |downstream - target| above which a step costs 1 (``flow_off_target``): the spacing of
#: the default levels, so a flow outside it is more than one level away from its target
DEFAULT_COST_BAND = 30.0
#: The episode limit of ``flow_off_target`` (steps of 1000). After a target change of
#: ``Δ`` no policy brings the outlet within the band for about ``19 + (Δ - band)`` steps:
#: the 19-step delay, then a gate that moves at most 1 per step (the first target is as far
#: from the initial flow). The target changes 2.25 times per episode on average, by 30, 60
#: or 90. A controller that predicts the flow in the channel and moves the gate at full rate
#: pays 75 steps per episode on average, and more than 200 in 5 % of episodes (those with
#: several large changes); random or zero gate changes pay more than 200 in 3 of 4 episodes.
DEFAULT_EPISODE_COST_LIMIT = 200.0


@struct.dataclass
class PipelineParams:
    """Traced parameters of the pipeline (vmappable for sweeps)."""

    target_levels: jax.Array  # [n_levels] flows the target is drawn from
    switch_probability: jax.Array  # chance per step that a new target is drawn
    initial_flow_range: jax.Array  # [2] low, high of the uniform initial flow
    initial_target: jax.Array  # the first target; SAMPLE_INITIAL_TARGET: draw from the levels
    max_flow: jax.Array  # the channel's capacity (gate flow clip and the reward's scale)
    horizon: jax.Array  # int32 steps per episode
    cost_band: jax.Array  # |downstream - target| above which a step costs 1


def pipeline_params(**overrides: Any) -> PipelineParams:
    """The pipeline's parameters: NeoRL-2's defaults with ``overrides`` applied.

    Raises:
        ValueError: naming the unknown or invalid field (a level outside
            ``[0, max_flow]``, a probability outside ``[0, 1]``, an inverted range, ...).
    """
    values: dict[str, Any] = {
        "target_levels": DEFAULT_TARGET_LEVELS,
        "switch_probability": DEFAULT_SWITCH_PROBABILITY,
        "initial_flow_range": DEFAULT_INITIAL_FLOW_RANGE,
        "initial_target": SAMPLE_INITIAL_TARGET,
        "max_flow": DEFAULT_MAX_FLOW,
        "horizon": DEFAULT_HORIZON,
        "cost_band": DEFAULT_COST_BAND,
    }
    values = with_overrides("Pipeline", values, overrides)
    max_flow = finite_number("max_flow", values["max_flow"], positive=True)
    levels = finite_array("target_levels", values["target_levels"], (None,), low=0.0, high=max_flow)
    if levels.size == 0:
        raise ValueError("target_levels: give at least one target level")
    initial_flow_range = finite_array(
        "initial_flow_range", values["initial_flow_range"], (2,), low=0.0, high=max_flow
    )
    if not initial_flow_range[0] <= initial_flow_range[1]:
        raise ValueError(
            f"initial_flow_range: low must not exceed high, got {initial_flow_range.tolist()}"
        )
    initial_target = finite_number("initial_target", values["initial_target"])
    if initial_target != SAMPLE_INITIAL_TARGET and not 0.0 <= initial_target <= max_flow:
        raise ValueError(
            f"initial_target: expected {SAMPLE_INITIAL_TARGET} (draw from the levels) or a "
            f"flow in [0, {max_flow}], got {initial_target}"
        )
    return PipelineParams(
        target_levels=jnp.asarray(levels, jnp.float32),
        switch_probability=jnp.asarray(
            finite_number("switch_probability", values["switch_probability"], low=0.0, high=1.0),
            jnp.float32,
        ),
        initial_flow_range=jnp.asarray(initial_flow_range, jnp.float32),
        initial_target=jnp.asarray(initial_target, jnp.float32),
        max_flow=jnp.asarray(max_flow, jnp.float32),
        horizon=jnp.asarray(positive_int("horizon", values["horizon"]), jnp.int32),
        cost_band=jnp.asarray(
            finite_number("cost_band", values["cost_band"], positive=True), jnp.float32
        ),
    )
