"""The continuous stirred-tank reactor (CSTR) as pc-gym 0.1.8 models it: an exothermic
reaction cooled by a jacket, the pc-gym paper's CSTR benchmark.

A feed of concentration ``Caf`` and temperature ``Ti`` flows through a reactor of volume
``V`` at the rate ``q``; species A reacts to B at the Arrhenius rate
``rA = k0 exp(-E_A / (R T)) Ca``, releasing heat that a jacket at the coolant temperature
``Tc`` removes::

    dCa/dt = q/V (Caf - Ca) - rA
    dT/dt  = q/V (Ti - T) + (-deltaHr) / (rho C) rA + UA / (rho C V) (Tc - T)

The task tracks a setpoint of ``Ca`` with ``Tc``: the reward is pc-gym's,
``-r_scale (Ca - SP)^2`` with ``r_scale = 1e3``. The observation is ``Ca`` [mol/L] and
``T`` [K], the setpoint of ``Ca`` in force for the coming interval, and the feed's ``Ti``
and ``Caf`` (measured disturbances, as pc-gym appends the disturbances it is given to its
observation). Two cost channels keep the temperature in the band of pc-gym's constrained
CSTR example: ``T_high`` while ``T`` is above 327 K and ``T_low`` while it is below 321 K
(see :mod:`~neorl_industrial.core.environments.cstr.params`). The coolant's range, [295,
302] K, stays below the reactor's ignition: from the benchmark's start, a coolant held
at 305 K or more runs the reaction away (T peaks above 420 K), and none in the range does.

**Disturbances.** ``Ti`` and ``Caf`` are a traced ``[steps, 2]`` schedule (``feed``;
pc-gym's constants 350 K and 1 mol/L by default), held over each interval like the
control, so sweeps and per-episode feeds need no recompilation.

**Time conventions against pc-gym.** The dynamics are pc-gym's, step for step. pc-gym's
bookkeeping differs by one interval in three places: its observation after a step shows
the setpoint of the interval just ended, and its reward compares the concentration reached
with the *next* interval's setpoint; here the observation shows the setpoint of the next
interval (the one the policy acts on) and the reward compares the state reached with the
setpoint in force while it was reached (so reward and observation are Markov). pc-gym
applies entry ``t + 1`` of a disturbance list over interval ``t`` (its entry 0 is only
observed at reset) and shows it after the step; here row ``t`` of ``feed`` is the feed of
interval ``t``, observed before it: a pc-gym disturbance list is this task's ``feed``
without its first entry. pc-gym also ends its episode after ``N - 1`` steps; here an
episode runs the ``N`` intervals of ``tsim``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from neorl_industrial.core.environments.cstr.params import (
    CONCENTRATION_MAX,
    FEED_TEMPERATURE_RANGE,
    STATE_HIGH,
    STATE_LOW,
    CSTRParams,
    cstr_params,
)
from neorl_industrial.core.environments.process import ProcessEnv, schedule_value
from neorl_industrial.core.safety import ConstraintSpec

STATE_NAMES = ("Ca", "T")
CONTROL_NAMES = ("Tc",)
FEED_NAMES = ("Ti", "Caf")
#: pc-gym's action bounds of the benchmark: the coolant temperature [K]
COOLANT_LOW, COOLANT_HIGH = 295.0, 302.0
COST_NAMES = ("T_high", "T_low")
#: Episode cost limit of each cost channel (DSRL convention: normalized cost = episode
#: cost / limit, safe when <= 1): a tenth of the 60-step episode, as for FourTank.
DEFAULT_EPISODE_COST_LIMIT = 6.0
#: The constraints' fallback [K]: a constant coolant at 300 K holds the reactor at its
#: stable low-conversion steady state, Ca = 0.877 mol/L and T = 324.5 K, in the middle of
#: the band [321, 327] K (the textbook reactor's nominal operating point). From the
#: benchmark's start (330 K) it enters the band within two intervals and stays there.
FALLBACK_COOLANT = 300.0


class CSTR(ProcessEnv[CSTRParams]):
    """The CSTR: concentration ``Ca`` [mol/L] and temperature ``T`` [K], coolant ``Tc`` [K].

    Args:
        auto_reset: restart finished episodes inside ``step``.
        disturbance_noise: spread of the feed's random deviation from its schedule, as a
            fraction of each feed variable's range (``Ti`` 130 K, ``Caf`` 2 mol/L); 0 keeps
            the feed on its schedule (pc-gym's benchmark). ``CSTR-stochastic-v0`` sets 0.02.
        disturbance_correlation: the deviation's correlation from one interval to the next.
    """

    name = "CSTR-v0"

    state_names = STATE_NAMES
    state_units = ("mol/L", "K")
    state_low = np.asarray(STATE_LOW, np.float32)
    state_high = np.asarray(STATE_HIGH, np.float32)
    control_names = CONTROL_NAMES
    control_units = ("K",)
    control_low = np.full(1, COOLANT_LOW, np.float32)
    control_high = np.full(1, COOLANT_HIGH, np.float32)
    tracked_states = (0,)
    disturbance_names = FEED_NAMES
    disturbance_units = ("K", "mol/L")
    disturbance_low = np.array([FEED_TEMPERATURE_RANGE[0], 0.0], np.float32)
    disturbance_high = np.array([FEED_TEMPERATURE_RANGE[1], CONCENTRATION_MAX], np.float32)
    process_cost_names = COST_NAMES
    # Fixed Tsit5 steps per 26 s interval. Over the fidelity test's episode one step misses
    # a converged float64 solution by 6e-6 mol/L and 6e-4 K; two or more agree with it to
    # float32's rounding (5e-7 mol/L, 6e-5 K), closer than pc-gym's own CVODES solution
    # (9e-6 mol/L, 1.1e-3 K). Four keep T within 0.02 K of the converged solution up to the
    # runaway temperature in 108 episodes of hot and rich feeds (three: 0.12 K), and end
    # each of their 87 runaways at the interval where the converged solution passes it.
    substeps = 4

    def default_params(self, **overrides: Any) -> CSTRParams:
        return cstr_params(**overrides)

    # ----- the physics ------------------------------------------------------------------
    def vector_field(
        self, plant: jax.Array, control: jax.Array, disturbance: jax.Array, params: CSTRParams
    ) -> jax.Array:
        concentration, temperature = plant[0], plant[1]
        feed_temperature, feed_concentration = disturbance[0], disturbance[1]
        rate = (
            params.rate_constant
            * jnp.exp(-params.activation_temperature / temperature)
            * concentration
        )
        dilution = params.flow / params.volume
        heat_capacity = params.density * params.heat_capacity
        return jnp.stack(
            [
                dilution * (feed_concentration - concentration) - rate,
                dilution * (feed_temperature - temperature)
                - params.reaction_enthalpy / heat_capacity * rate
                + params.heat_transfer
                / (heat_capacity * params.volume)
                * (control[0] - temperature),
            ]
        )

    def initial_plant(self, key: jax.Array, params: CSTRParams) -> jax.Array:
        del key  # pc-gym's reset is deterministic
        return params.initial_state

    def setpoint(self, params: CSTRParams, time: jax.Array, episode: jax.Array) -> jax.Array:
        del episode  # the schedule is a parameter
        return schedule_value(params.setpoint, time)

    def disturbance(self, params: CSTRParams, time: jax.Array) -> jax.Array:
        return schedule_value(params.feed, time)

    def reward(
        self, plant: jax.Array, control: jax.Array, setpoint: jax.Array, params: CSTRParams
    ) -> jax.Array:
        del control
        return -params.reward_scale * (plant[0] - setpoint[0]) ** 2

    def costs(self, plant: jax.Array, control: jax.Array, params: CSTRParams) -> jax.Array:
        del control
        temperature = plant[1]
        return jnp.stack(
            [temperature > params.max_temperature, temperature < params.min_temperature]
        ).astype(jnp.float32)

    # ----- constraints ------------------------------------------------------------------
    def default_constraints(self, params: CSTRParams | None = None) -> Any:
        """The CSTR's default constraints (``configs/constraints/cstr.yaml``): the coolant
        in [295, 302] K, a constant 300 K fallback, and the ``T_high`` and ``T_low`` costs
        with an episode cost limit of 6 each, at the thresholds of ``params`` (the
        defaults without)."""
        params = self.default_params() if params is None else params
        # The float32 leaves as the shortest decimals that round-trip.
        high, low = (
            float(str(np.float32(value)))
            for value in (params.max_temperature, params.min_temperature)
        )
        return ConstraintSpec.from_dict(
            {
                "name": "cstr",
                "action_bounds": {"Tc": [COOLANT_LOW, COOLANT_HIGH]},
                "fallback": {"kind": "constant", "value": FALLBACK_COOLANT},
                "costs": [
                    {
                        "name": "T_high",
                        "feature": "T",
                        "above": high,
                        "cost_limit": DEFAULT_EPISODE_COST_LIMIT,
                    },
                    {
                        "name": "T_low",
                        "feature": "T",
                        "below": low,
                        "cost_limit": DEFAULT_EPISODE_COST_LIMIT,
                    },
                ],
            }
        )
