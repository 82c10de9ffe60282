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
    GRAVITY,
    LEVEL_ENVELOPE,
    FourTankParams,
    four_tank_params,
)
from neorl_industrial.core.environments.ode import integrate_adaptive
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
    #: Error tolerances of the adaptive solver (see :meth:`integrate`): relative, and
    #: absolute [m]. The absolute one sets the accuracy of a nearly empty tank: a pump at
    #: its 0.1 V minimum holds its upper tank at 4e-5 m, which 1e-8 m keeps within 0.1 %.
    rtol = 1e-5
    atol = 1e-8
    #: Solver steps allowed per control interval (accepted and rejected). The default
    #: 16.7 s interval takes 5 to 20 with the default constants. At a nearly empty tank the
    #: count grows by about one step per 2 s of interval (482 for ``dt = 1000 s``), so
    #: intervals up to about 2000 s fit; an interval that needs more is reported as
    #: diverged.
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

    def integrate(
        self, plant: jax.Array, control: jax.Array, disturbance: jax.Array, params: FourTankParams
    ) -> jax.Array:
        """The levels after one control interval: Tsit5 (pc-gym's Runge-Kutta) with its
        step size controlled to :attr:`rtol` and :attr:`atol`.

        A fixed step cannot serve this plant: near an empty tank the outflow's slope,
        ``a sqrt(2 g) / (2 sqrt(h))``, grows without bound, so a pump held at its minimum
        makes the equation stiff (a time constant of about 1 s at 4e-5 m), and when it is
        refilled from there the outflow's derivatives are large for the interval's first
        seconds. Four fixed steps per interval drove such a level to 0 or to 2 to 5 times
        its value (errors up to 2.2e-4 m); sixteen left 3.7e-6 m. The
        adaptive solver takes small steps only there: over episodes that hold the pumps at
        their bounds it agrees with a converged float64 solution to 2.1e-7 m (float32's
        rounding over an episode), within 3e-8 m at the nearly empty tanks. Under ``vmap``
        every plant of a batch runs the step count of the one that needs the most.

        An interval the solver cannot finish within :attr:`max_steps` (a non-finite
        derivative, constants far outside the model's range) returns NaN, which
        :meth:`step_env` reports as diverged.
        """
        return integrate_adaptive(
            self.vector_field,
            plant,
            control,
            disturbance,
            params,
            params.dt,
            rtol=self.rtol,
            atol=self.atol,
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
