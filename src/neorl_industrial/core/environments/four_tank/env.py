"""The four-tank process (Johansson, 2000) as pc-gym 0.1.8 models it: coupled MIMO level
control.

Two pumps feed four tanks. Pump 1 sends the fraction ``gamma[0]`` of its flow to lower
tank 1 and the rest to upper tank 4; pump 2 sends ``gamma[1]`` to lower tank 2 and the rest
to upper tank 3. Tank 3 drains into tank 1 and tank 4 into tank 2; each tank's outflow
follows Torricelli's law, ``a sqrt(2 g h)``::

    A1 dh1/dt = -a1 sqrt(2 g h1) + a3 sqrt(2 g h3) + gamma1 k1 v1
    A2 dh2/dt = -a2 sqrt(2 g h2) + a4 sqrt(2 g h4) + gamma2 k2 v2
    A3 dh3/dt = -a3 sqrt(2 g h3) + (1 - gamma2) k2 v2
    A4 dh4/dt = -a4 sqrt(2 g h4) + (1 - gamma1) k1 v1

The task tracks setpoints of the upper tanks' levels ``h3`` and ``h4`` with the pump
voltages ``v1``, ``v2``: the reward is pc-gym's, ``-sum_k r_scale_k (h_k - SP_k)^2``.
Every level is observed (in metres), followed by the two setpoints in force for the
coming interval. Eight cost channels, one per tank and limit: ``h<i>_overflow`` while a
level is above the tank height and ``h<i>_empty`` while it is below the low-level alarm
(see :mod:`~neorl_industrial.core.environments.four_tank.params`).

**An empty tank.** pc-gym's outflow ``sqrt(2 g h)`` is NaN for ``h < 0`` and its slope is
infinite at 0, so a solver step that undershoots an emptying tank has no solution: pc-gym
raises an error on that step (CVODES: ``CV_REPTD_RHSFUNC_ERR``; its diffrax path fails
too), e.g. on the fourth step with both pumps at 0 V, when tank 3 runs dry. Within pc-gym's
action bounds (pumps at 0.1 V or more, ``0 < gamma < 1``) every tank is fed and no level
reaches 0. Here an empty tank has no outflow, ``sqrt(2 g max(h, 0))``, and a level that a
solver step leaves below 0 is set to 0 after the interval: a tank empties and stays
empty until it is fed. Above 0 the two models are the same.

**Time conventions against pc-gym.** The dynamics are pc-gym's, step for step. Two of
pc-gym's bookkeeping conventions differ, both by one interval: pc-gym's observation after
a step shows the setpoint of the interval just ended and its reward compares the level
reached with the *next* interval's setpoint; here the observation shows the setpoint of
the next interval (the one the policy acts on) and the reward compares the level reached
with the setpoint in force while it was reached (so reward and observation are Markov).
Rewards therefore differ only on the step before a setpoint change. pc-gym also ends
its episode after ``N - 1`` steps; here an episode runs the ``N`` intervals of ``tsim``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from neorl_industrial.core.environments.four_tank.params import (
    DEFAULT_HORIZON,
    DEFAULT_TSIM,
    GRAVITY,
    LEVEL_ENVELOPE,
    FourTankParams,
    four_tank_params,
)
from neorl_industrial.core.environments.ode import integrate_graded_sdirk
from neorl_industrial.core.environments.process import ProcessEnv, schedule_value
from neorl_industrial.core.safety import ConstraintSpec

LEVEL_NAMES = ("h1", "h2", "h3", "h4")
PUMP_NAMES = ("v1", "v2")
#: pc-gym's action bounds of the benchmark [V]
PUMP_LOW, PUMP_HIGH = 0.1, 10.0
COST_NAMES = (
    *(f"{level}_overflow" for level in LEVEL_NAMES),
    *(f"{level}_empty" for level in LEVEL_NAMES),
)
#: Episode cost limit of each cost channel (DSRL convention: normalized cost = episode
#: cost / limit, safe when <= 1): a tenth of the 60-step episode, as for the IB.
DEFAULT_EPISODE_COST_LIMIT = 6.0
#: The constraints' fallback [V] on both pumps: their mid-range, where the steady levels
#: (0.09 to 0.19 m with the default constants) neither overflow nor empty a tank.
FALLBACK_VOLTAGE = (PUMP_LOW + PUMP_HIGH) / 2.0


class FourTank(ProcessEnv[FourTankParams]):
    """The four-tank process: levels ``h1..h4`` [m], pump voltages ``v1, v2`` [V].

    Args:
        auto_reset: restart finished episodes inside ``step``.
    """

    name = "FourTank-v0"
    #: A rollout of 4,096 under a uniform batch policy on one core: 3.66M -> 5.44M steps/s.
    older_cpu_fusion = True

    state_names = LEVEL_NAMES
    state_units = ("m",) * 4
    state_low = np.zeros(4, np.float32)
    state_high = np.full(4, LEVEL_ENVELOPE, np.float32)
    control_names = PUMP_NAMES
    control_units = ("V", "V")
    control_low = np.full(2, PUMP_LOW, np.float32)
    control_high = np.full(2, PUMP_HIGH, np.float32)
    tracked_states = (2, 3)
    process_cost_names = COST_NAMES
    #: The integration grid (see :meth:`integrate`): one step per ``step_scale`` seconds of
    #: the interval, at least ``min_steps`` (the default 16.7 s interval: 12 steps), graded
    #: towards the interval's start with exponent ``grading`` (the first step is
    #: ``dt / 41.6``, the last ``dt / 8.2``).
    step_scale = DEFAULT_TSIM / DEFAULT_HORIZON / 12
    min_steps = 12
    grading = 1.5
    #: Steps allowed per control interval: intervals up to about 1400 s fit; an interval
    #: that needs more is reported as diverged.
    max_steps = 1024

    def default_params(self, **overrides: Any) -> FourTankParams:
        return four_tank_params(**overrides)

    # ----- the physics ------------------------------------------------------------------
    def vector_field(
        self, plant: jax.Array, control: jax.Array, disturbance: jax.Array, params: FourTankParams
    ) -> jax.Array:
        del disturbance
        outflow = params.outlet_area * jnp.sqrt(2.0 * GRAVITY * jnp.maximum(plant, 0.0))
        pump_flow = params.pump_gain * control
        to_lower = params.gamma * pump_flow
        to_upper = (1.0 - params.gamma) * pump_flow
        inflow = jnp.stack(
            [
                outflow[2] + to_lower[0],
                outflow[3] + to_lower[1],
                to_upper[1],
                to_upper[0],
            ]
        )
        return (inflow - outflow) / params.tank_area

    def stage_solve(self, base: jax.Array, h_gamma: jax.Array, args: tuple) -> jax.Array:
        """The levels' derivative at the solution ``Y`` of one implicit stage,
        ``Y = base + h_gamma f(Y)``, with ``f`` :meth:`vector_field` (one plant).

        The equations are triangular: the upper tanks' levels depend on their own alone, and
        each lower tank's inflow is known once its upper tank's level is. In ``s = sqrt(Y)``
        each tank's stage equation is the quadratic ``A s^2 + h_gamma c s - R = 0``, with
        ``c = a sqrt(2 g)`` and ``R = A base + h_gamma q`` (``q`` the tank's inflow): its
        non-negative root, ``2 R / (h_gamma c + sqrt((h_gamma c)^2 + 4 A R))``, written so that
        nothing cancels; ``R <= 0`` is a tank that the stage empties (``s = 0``, no outflow).
        """
        direct_inflow, outlet, area = args
        upper = _stage_root(base[2:], h_gamma, direct_inflow[2:], outlet[2:], area[2:])
        lower_inflow = direct_inflow[:2] + outlet[2:] * upper
        lower = _stage_root(base[:2], h_gamma, lower_inflow, outlet[:2], area[:2])
        inflow = jnp.concatenate([lower_inflow, direct_inflow[2:]])
        return (inflow - outlet * jnp.concatenate([lower, upper])) / area

    def integrate(
        self, plant: jax.Array, control: jax.Array, disturbance: jax.Array, params: FourTankParams
    ) -> jax.Array:
        """The levels after one control interval: an L-stable SDIRK of order 4 on a grid
        graded towards the interval's start, each stage solved in closed form
        (:meth:`stage_solve`).

        Two things make this plant hard for a fixed explicit step. Near an empty tank the
        outflow's slope, ``a sqrt(2 g) / (2 sqrt(h))``, grows without bound, so a pump held
        at its minimum makes the equation stiff (a time constant of about 1 s at 4e-5 m);
        and a tank refilled from there rises like the square root of time over the
        interval's first milliseconds. Four fixed Tsit5 steps drove such a level to 0 or
        to 2 to 5 times its value (errors up to 2.2e-4 m); an adaptive Tsit5 was accurate
        but, under ``vmap``, every plant of a batch ran the step count of the one that
        needed the most (up to 20 per interval, with the controller's overhead). Here the
        implicit stages cannot overshoot an emptying tank, the grid's first steps (the
        first ``dt / 41.6``) resolve the refill, and every plant takes the same 12 steps
        (at the default ``dt``): over episodes that hold the pumps at their bounds the
        levels agree with a converged float64 solution to 4.5e-7 m (float32's rounding over
        an episode), to 1.3e-8 m at the nearly empty tanks.
        """
        del disturbance
        flow = params.pump_gain * control
        direct_inflow = jnp.stack(
            [
                params.gamma[0] * flow[0],
                params.gamma[1] * flow[1],
                (1.0 - params.gamma[1]) * flow[1],
                (1.0 - params.gamma[0]) * flow[0],
            ]
        )
        outlet = params.outlet_area * jnp.sqrt(2.0 * GRAVITY)
        return integrate_graded_sdirk(
            self.stage_solve,
            plant,
            (direct_inflow, outlet, params.tank_area),
            params.dt,
            step_scale=self.step_scale,
            min_steps=self.min_steps,
            grading=self.grading,
            max_steps=self.max_steps,
        )

    def after_interval(self, plant: jax.Array, params: FourTankParams) -> jax.Array:
        """An emptied tank holds level 0 (a solver step may undershoot below it)."""
        del params
        return jnp.maximum(plant, 0.0)

    def initial_plant(self, key: jax.Array, params: FourTankParams) -> jax.Array:
        del key  # pc-gym's reset is deterministic
        return params.initial_levels

    def setpoint(self, params: FourTankParams, time: jax.Array, episode: jax.Array) -> jax.Array:
        del episode  # the schedule is a parameter
        return schedule_value(params.setpoint, time)

    def disturbance(self, params: FourTankParams, time: jax.Array) -> jax.Array:
        del params, time
        return jnp.zeros((0,), jnp.float32)

    def reward(
        self, plant: jax.Array, control: jax.Array, setpoint: jax.Array, params: FourTankParams
    ) -> jax.Array:
        del control
        error = plant[jnp.asarray(self.tracked_states)] - setpoint
        return -jnp.sum(params.reward_scale * error**2)

    def costs(self, plant: jax.Array, control: jax.Array, params: FourTankParams) -> jax.Array:
        del control
        return jnp.concatenate([plant > params.tank_height, plant < params.min_level]).astype(
            jnp.float32
        )

    # ----- constraints ------------------------------------------------------------------
    def default_constraints(self, params: FourTankParams | None = None) -> Any:
        """The four-tank's default constraints (``configs/constraints/four-tank.yaml``):
        pumps in [0.1, 10] V, a constant mid-range fallback, and the overflow and empty
        cost of each tank with an episode cost limit of 6 each, at the thresholds of
        ``params`` (the defaults without)."""
        params = self.default_params() if params is None else params
        # The float32 leaves as the shortest decimals that round-trip (0.6, not 0.6000000238).
        height, low = (
            float(str(np.float32(value))) for value in (params.tank_height, params.min_level)
        )
        costs = [
            {"name": f"{level}_overflow", "feature": level, "above": height}
            for level in LEVEL_NAMES
        ] + [{"name": f"{level}_empty", "feature": level, "below": low} for level in LEVEL_NAMES]
        return ConstraintSpec.from_dict(
            {
                "name": "four-tank",
                "action_bounds": {name: [PUMP_LOW, PUMP_HIGH] for name in PUMP_NAMES},
                "fallback": {"kind": "constant", "value": FALLBACK_VOLTAGE},
                "costs": [{**cost, "cost_limit": DEFAULT_EPISODE_COST_LIMIT} for cost in costs],
            }
        )


def _stage_root(
    base: jax.Array, h_gamma: jax.Array, inflow: jax.Array, outlet: jax.Array, area: jax.Array
) -> jax.Array:
    """``s = sqrt(Y) >= 0`` solving ``A s^2 + h_gamma c s - (A base + h_gamma q) = 0`` per tank
    (see :meth:`FourTank.stage_solve`)."""
    held = jnp.maximum(area * base + h_gamma * inflow, 0.0)
    damping = h_gamma * outlet
    return 2.0 * held / (damping + jnp.sqrt(damping * damping + 4.0 * area * held))
