"""NeoRL-2's DMSD: a double mass-spring-damper servo as a functional environment.

Two masses on a line, joined to each other and to two walls by three springs and three
dampers; a force acts on each mass, and each mass tracks its own target position. The
dynamics, constants, target process, start distribution and reward are those of NeoRL-2's
``DoubleMassSpringDamperEnv`` (``neorl2/envs/dmsd.py``, train mode, the registered one;
``neorl2/envs/reward/dmsd_reward.py``):

* explicit Euler at ``dt = 0.2`` (here diffrax's Euler, one step per interval: the same
  update), ``m1 = m2 = 20``, ``k1 = k2 = k3 = 2``, ``d1 = d2 = d3 = 4``;
* per episode and mass, a target drawn from U(-1.5, 1.5), and with probability 1/2 a second
  one from step 50 on; the start positions from U(-0.25, 0.25), velocities U(-0.1, 0.1);
* the reward ``sum_i -ln(|x_i - T_i| + 0.01)`` of the state reached against the target
  observed with it (NeoRL-2 computes it on the next observation); 100 steps, no terminal
  states.

What differs, on purpose: the action is the force on each mass **in newtons**, [-30, 30]
(the reference's action ``a`` in [-1, 1] is the force ``30 a``: scale NeoRL-2's data by
30 to import it); the reference declares an unbounded observation space, here a state
outside the physical envelope (|x| > 50, |v| > 50: far beyond the ±15 that the largest
forces hold against the springs) ends the episode as diverged; and the reference has no
costs, here a position outside the servo's travel (|x_i| > 2, the targets lie within
±1.5) costs 1 per mass, direction and step. The reference names no length unit.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from neorl_industrial.core.environments.process import ProcessEnv
from neorl_industrial.core.environments.validation import (
    finite_array,
    finite_number,
    positive_int,
    with_overrides,
)
from neorl_industrial.core.safety import ConstraintSpec

STATE_NAMES = ("position_1", "position_2", "velocity_1", "velocity_2")
FORCE_NAMES = ("force_1", "force_2")
COST_NAMES = ("position_1_high", "position_1_low", "position_2_high", "position_2_low")
#: the largest force on a mass [N] (the reference's ``force_bounds``)
MAX_FORCE = 30.0
#: the physical envelope of positions and velocities; beyond it a step has diverged
ENVELOPE = 50.0
#: the servo's travel; a position beyond it is a cost (the targets lie within ±1.5)
DEFAULT_TRAVEL = 2.0
#: episode limit of each travel cost (steps of 100)
DEFAULT_EPISODE_COST_LIMIT = 5.0
DEFAULT_HORIZON = 100
#: the step at which a mass's target may switch (the reference: horizon // 2)
SWITCH_STEP = 50
#: NeoRL-2's normalization of episode returns (``neorl2/envs/info.py``): a score is
#: ``100 (return - min) / (max - min)``.
REFERENCE_SCORES = {"min": 30.60, "max": 849.51}


def normalized_score(episode_return: float) -> float:
    """NeoRL-2's normalized score of a DMSD episode return (0: random, 100: its expert)."""
    low, high = REFERENCE_SCORES["min"], REFERENCE_SCORES["max"]
    return 100.0 * (episode_return - low) / (high - low)


@struct.dataclass
class DMSDParams:
    """Traced parameters of the servo (vmappable for sweeps)."""

    mass: jax.Array  # [2] kg
    stiffness: jax.Array  # [3] springs: wall–mass 1, mass 1–mass 2, mass 2–wall
    damping: jax.Array  # [3] dampers, in the same places
    dt: jax.Array  # s per control interval
    horizon: jax.Array  # int32 steps per episode
    target_range: jax.Array  # [2] low, high of a target position
    switch_probability: jax.Array  # chance that a mass's target switches at step 50
    start_position: jax.Array  # half-width of the uniform start positions
    start_velocity: jax.Array  # half-width of the uniform start velocities
    travel: jax.Array  # |position| beyond which a step costs 1


class DMSD(ProcessEnv[DMSDParams]):
    """NeoRL-2's double mass-spring-damper servo; see the module docstring."""

    name = "DMSD-v0"
    #: A rollout of 4,096 under a uniform batch policy on one core: 32.7M -> 35.8M steps/s.
    older_cpu_fusion = True

    state_names = STATE_NAMES
    state_units = (None, None, None, None)  # the reference names no length unit
    state_low = np.full(4, -ENVELOPE, np.float32)
    state_high = np.full(4, ENVELOPE, np.float32)
    control_names = FORCE_NAMES
    control_units = ("N", "N")
    control_low = np.full(2, -MAX_FORCE, np.float32)
    control_high = np.full(2, MAX_FORCE, np.float32)
    tracked_states = (0, 1)
    process_cost_names = COST_NAMES
    substeps = 1
    solver = "euler"
    reward_against_next_setpoint = True

    def initial_control(self, params: DMSDParams) -> jax.Array:
        del params
        return jnp.zeros(2, jnp.float32)

    def default_params(self, **overrides: Any) -> DMSDParams:
        values: dict[str, Any] = {
            "mass": (20.0, 20.0),
            "stiffness": (2.0, 2.0, 2.0),
            "damping": (4.0, 4.0, 4.0),
            "dt": 0.2,
            "horizon": DEFAULT_HORIZON,
            "target_range": (-1.5, 1.5),
            "switch_probability": 0.5,
            "start_position": 0.25,
            "start_velocity": 0.1,
            "travel": DEFAULT_TRAVEL,
        }
        values = with_overrides("DMSD", values, overrides)
        mass = finite_array("mass", values["mass"], (2,), positive=True)
        stiffness = finite_array("stiffness", values["stiffness"], (3,), low=0.0)
        damping = finite_array("damping", values["damping"], (3,), low=0.0)
        target_range = finite_array(
            "target_range", values["target_range"], (2,), low=-ENVELOPE, high=ENVELOPE
        )
        if not target_range[0] <= target_range[1]:
            raise ValueError(f"target_range: low must not exceed high, got {target_range.tolist()}")
        return DMSDParams(
            mass=jnp.asarray(mass, jnp.float32),
            stiffness=jnp.asarray(stiffness, jnp.float32),
            damping=jnp.asarray(damping, jnp.float32),
            dt=jnp.asarray(finite_number("dt", values["dt"], positive=True), jnp.float32),
            horizon=jnp.asarray(positive_int("horizon", values["horizon"]), jnp.int32),
            target_range=jnp.asarray(target_range, jnp.float32),
            switch_probability=jnp.asarray(
                finite_number(
                    "switch_probability", values["switch_probability"], low=0.0, high=1.0
                ),
                jnp.float32,
            ),
            start_position=jnp.asarray(
                finite_number("start_position", values["start_position"], low=0.0, high=ENVELOPE),
                jnp.float32,
            ),
            start_velocity=jnp.asarray(
                finite_number("start_velocity", values["start_velocity"], low=0.0, high=ENVELOPE),
                jnp.float32,
            ),
            travel=jnp.asarray(
                finite_number("travel", values["travel"], positive=True), jnp.float32
            ),
        )

    def default_constraints(self, params: DMSDParams | None = None) -> Any:
        """The force limits, a zero-force fallback, and a cost per mass and direction while
        its position is beyond the servo's travel, with an episode limit of 5 of 100 steps
        (identical to ``configs/constraints/dmsd.yaml`` at the defaults)."""
        travel = DEFAULT_TRAVEL if params is None else float(params.travel)
        costs = []
        for mass in ("1", "2"):
            feature = f"position_{mass}"
            costs.append({"name": f"{feature}_high", "feature": feature, "above": travel})
            costs.append({"name": f"{feature}_low", "feature": feature, "below": -travel})
        return ConstraintSpec.from_dict(
            {
                "name": "dmsd",
                "action_bounds": {name: [-MAX_FORCE, MAX_FORCE] for name in FORCE_NAMES},
                "fallback": {"kind": "constant", "value": 0.0},
                "costs": [{**cost, "cost_limit": DEFAULT_EPISODE_COST_LIMIT} for cost in costs],
            }
        )

    # ----- physics ----------------------------------------------------------------------
    def vector_field(
        self, plant: jax.Array, control: jax.Array, disturbance: jax.Array, params: DMSDParams
    ) -> jax.Array:
        del disturbance
        x1, x2, v1, v2 = plant
        k1, k2, k3 = params.stiffness
        d1, d2, d3 = params.damping
        m1, m2 = params.mass
        a1 = (-(k1 + k2) * x1 + k2 * x2 - (d1 + d2) * v1 + d2 * v2 + control[0]) / m1
        a2 = (k2 * x1 - (k2 + k3) * x2 + d2 * v1 - (d2 + d3) * v2 + control[1]) / m2
        return jnp.stack([v1, v2, a1, a2])

    def initial_plant(self, key: jax.Array, params: DMSDParams) -> jax.Array:
        position_key, velocity_key = jax.random.split(key)
        positions = jax.random.uniform(
            position_key, (2,), minval=-params.start_position, maxval=params.start_position
        )
        velocities = jax.random.uniform(
            velocity_key, (2,), minval=-params.start_velocity, maxval=params.start_velocity
        )
        return jnp.concatenate([positions, velocities])

    def draw_episode(self, key: jax.Array, params: DMSDParams) -> jax.Array:
        """``[4]``: each mass's first and second target (equal when it does not switch)."""
        first_key, second_key, switch_key = jax.random.split(key, 3)
        low, high = params.target_range[0], params.target_range[1]
        first = jax.random.uniform(first_key, (2,), minval=low, maxval=high)
        second = jax.random.uniform(second_key, (2,), minval=low, maxval=high)
        switches = jax.random.uniform(switch_key, (2,)) < params.switch_probability
        return jnp.concatenate([first, jnp.where(switches, second, first)])

    def setpoint(self, params: DMSDParams, time: jax.Array, episode: jax.Array) -> jax.Array:
        del params
        # The reference looks its targets up at min(t, horizon - 1) with t counted from 1
        # after the first step; the switch shows from the observation of step 50 on.
        return jnp.where(time >= SWITCH_STEP, episode[2:], episode[:2])

    def disturbance(self, params: DMSDParams, time: jax.Array) -> jax.Array:
        del params, time
        return jnp.zeros((0,), jnp.float32)

    def reward(
        self, plant: jax.Array, control: jax.Array, setpoint: jax.Array, params: DMSDParams
    ) -> jax.Array:
        del control, params
        return jnp.sum(-jnp.log(jnp.abs(plant[:2] - setpoint) + 0.01))

    def costs(self, plant: jax.Array, control: jax.Array, params: DMSDParams) -> jax.Array:
        del control
        positions = plant[:2]
        high = positions > params.travel
        low = positions < -params.travel
        return jnp.stack([high[0], low[0], high[1], low[1]]).astype(jnp.float32)
