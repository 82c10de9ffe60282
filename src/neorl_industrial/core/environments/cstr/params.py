"""Parameters of the CSTR: pc-gym's canonical benchmark, validated on the host.

The defaults are pc-gym 0.1.8's ``cstr`` model constants (the exothermic first-order
reaction A -> B of Seborg's and Henson's textbook reactor; time in minutes, volumes in
litres, concentrations in mol/L) and the CSTR benchmark of the pc-gym paper
(``pc-gym_paper/train_policies/cstr/cstr_train.py``): 60 control intervals over
``tsim = 26 min``, the coolant temperature in [295, 302] K, the concentration ``Ca``
tracked at 0.85, 0.9 then 0.87 mol/L (20 intervals each), ``r_scale = {'Ca': 1e3}``, and
the episode starting from ``Ca = 0.8 mol/L``, ``T = 330 K``. The temperature band of the
cost channels is that of the paper's constrained CSTR example
(``pc-gym_paper/constraint_showcase/constraint_paper.py``: ``321 K <= T <= 327 K``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from neorl_industrial.core.environments.validation import (
    finite_array,
    finite_number,
    positive_int,
    with_overrides,
)

# pc-gym 0.1.8's ``cstr`` constants.
DEFAULT_FLOW = 100.0  # q, volumetric feed (and outlet) flow [L/min]
DEFAULT_VOLUME = 100.0  # V, reactor volume [L]
DEFAULT_DENSITY = 1000.0  # rho [g/L]
DEFAULT_HEAT_CAPACITY = 0.239  # C [J/(g K)]
DEFAULT_REACTION_ENTHALPY = -5e4  # deltaHr [J/mol] (negative: exothermic)
DEFAULT_ACTIVATION_TEMPERATURE = 8750.0  # E_A / R [K]
DEFAULT_RATE_CONSTANT = 7.2e10  # k0, pre-exponential factor [1/min]
DEFAULT_HEAT_TRANSFER = 5e4  # UA, jacket heat transfer coefficient times area [J/(min K)]
#: pc-gym's feed temperature ``Ti`` [K] and feed concentration ``Caf`` [mol/L]
DEFAULT_FEED = (350.0, 1.0)

# The benchmark of the pc-gym paper: dt = tsim / N.
DEFAULT_TSIM = 26.0  # [min]
DEFAULT_HORIZON = 60
DEFAULT_INITIAL_STATE = (0.8, 330.0)  # Ca [mol/L], T [K]
#: ``[N, 1]`` setpoints of ``Ca`` [mol/L]: 0.85, then 0.9 from step 20, then 0.87 from 40
DEFAULT_SETPOINT = np.repeat([0.85, 0.9, 0.87], DEFAULT_HORIZON // 3)[:, None]
#: pc-gym's ``r_scale`` of ``Ca`` in the benchmark
DEFAULT_REWARD_SCALE = 1e3

#: The temperature band of pc-gym's constrained CSTR example [K]: a step that ends above
#: ``max_temperature`` costs ``T_high``, below ``min_temperature`` ``T_low``. The band is
#: tight on purpose: the steady states of the setpoints 0.85, 0.87 and 0.9 mol/L lie at
#: 327.3, 325.3 and 321.7 K, so tracking 0.85 exactly holds T 0.3 K above the band (a
#: concentration of 0.853 mol/L keeps it at 327 K), and an undershoot on the way to 0.9
#: leaves it below.
DEFAULT_MAX_TEMPERATURE = 327.0
DEFAULT_MIN_TEMPERATURE = 321.0

#: The largest feed concentration a parameter may set [mol/L] (twice pc-gym's 1 mol/L;
#: pc-gym's disturbance studies draw it from [0.9, 1.5]). Dilution and a reaction that
#: only consumes A keep ``Ca`` between 0 and the largest of its initial value and the
#: feed's, so every concentration of a valid episode lies in [0, CONCENTRATION_MAX].
CONCENTRATION_MAX = 2.0
#: The runaway temperature [K], the top of the state's envelope. The benchmark's reactor
#: stays in 312-331 K; hotter or richer feeds (or a coolant above 302 K) ignite it: the
#: reaction's heat speeds the reaction and, as A is consumed within seconds, T peaks at
#: 400-590 K (feeds of 345-430 K and 0.8-2 mol/L under the coolant's range), where no
#: setpoint of the task is reachable. Among those feeds an episode either stays below
#: 340 K or runs away past 400 K. An interval that ends above 380 K has run away and ends
#: the episode (``diverged``, cost 1 in every channel). This is also where the task's
#: fixed solver steps stop being trustworthy: at the ignition's peak the reaction's time
#: constant is under a second (the Arrhenius rate exceeds 80 /min above 425 K), which no
#: affordable explicit step resolves, while up to 380 K (7 /min) four Tsit5 steps per
#: interval are accurate (see ``CSTR.substeps``).
RUNAWAY_TEMPERATURE = 380.0
#: The bottom of the temperature envelope [K]: a liquid reactor below it would be frozen.
#: Feeds and coolant are at least this warm, so only an endothermic reaction
#: (``reaction_enthalpy > 0``) can cool the reactor to it.
MIN_TEMPERATURE = 250.0
#: The feed temperatures a parameter may set [K]: the envelope of the reactor's (pc-gym's
#: disturbance example steps Ti from 350 K to 345 K, within [320, 350] K).
FEED_TEMPERATURE_RANGE = (MIN_TEMPERATURE, RUNAWAY_TEMPERATURE)
#: The physical envelope of the state, beyond which a step is reported as diverged:
#: ``Ca`` in [0, 2 CONCENTRATION_MAX] mol/L (twice what a valid episode can reach; a
#: value outside it is the solver's, not the reactor's) and ``T`` in
#: [MIN_TEMPERATURE, RUNAWAY_TEMPERATURE].
STATE_LOW = (0.0, MIN_TEMPERATURE)
STATE_HIGH = (2.0 * CONCENTRATION_MAX, RUNAWAY_TEMPERATURE)


@struct.dataclass
class CSTRParams:
    """Traced parameters of the CSTR (vmappable for sweeps).

    Attributes:
        flow: feed (and outlet) flow ``q`` [L/min].
        volume: reactor volume ``V`` [L].
        density: ``rho`` of the mixture [g/L].
        heat_capacity: ``C`` of the mixture [J/(g K)].
        reaction_enthalpy: ``deltaHr`` [J/mol] (negative: the reaction heats the reactor).
        activation_temperature: ``E_A / R`` of the Arrhenius rate [K].
        rate_constant: the rate's pre-exponential factor ``k0`` [1/min].
        heat_transfer: ``UA`` of the cooling jacket [J/(min K)].
        initial_state: ``[2]`` ``Ca`` [mol/L] and ``T`` [K] at reset.
        setpoint: ``[steps, 1]`` setpoint of ``Ca`` per control interval [mol/L]; the last
            row holds after the schedule ends.
        feed: ``[steps, 2]`` measured disturbances held over each control interval: the
            feed temperature ``Ti`` [K] and the feed concentration ``Caf`` [mol/L]; the
            last row holds after the schedule ends.
        reward_scale: weight of the squared tracking error of ``Ca``.
        max_temperature: the temperature above which a step costs ``T_high`` [K].
        min_temperature: the temperature below which a step costs ``T_low`` [K].
        dt: minutes per control interval.
        horizon: int32 control intervals per episode.
    """

    flow: jax.Array
    volume: jax.Array
    density: jax.Array
    heat_capacity: jax.Array
    reaction_enthalpy: jax.Array
    activation_temperature: jax.Array
    rate_constant: jax.Array
    heat_transfer: jax.Array
    initial_state: jax.Array
    setpoint: jax.Array
    feed: jax.Array
    reward_scale: jax.Array
    max_temperature: jax.Array
    min_temperature: jax.Array
    dt: jax.Array
    horizon: jax.Array


DEFAULTS: dict[str, Any] = {
    "flow": DEFAULT_FLOW,
    "volume": DEFAULT_VOLUME,
    "density": DEFAULT_DENSITY,
    "heat_capacity": DEFAULT_HEAT_CAPACITY,
    "reaction_enthalpy": DEFAULT_REACTION_ENTHALPY,
    "activation_temperature": DEFAULT_ACTIVATION_TEMPERATURE,
    "rate_constant": DEFAULT_RATE_CONSTANT,
    "heat_transfer": DEFAULT_HEAT_TRANSFER,
    "initial_state": DEFAULT_INITIAL_STATE,
    "setpoint": DEFAULT_SETPOINT,
    "feed": [DEFAULT_FEED],
    "reward_scale": DEFAULT_REWARD_SCALE,
    "max_temperature": DEFAULT_MAX_TEMPERATURE,
    "min_temperature": DEFAULT_MIN_TEMPERATURE,
    "dt": DEFAULT_TSIM / DEFAULT_HORIZON,
    "horizon": DEFAULT_HORIZON,
}
#: the physical constants, each a positive number (``reaction_enthalpy`` may take any sign)
POSITIVE_CONSTANTS = (
    "flow",
    "volume",
    "density",
    "heat_capacity",
    "activation_temperature",
    "rate_constant",
    "heat_transfer",
)


def _schedule(value: Any, width: int) -> Any:
    """A schedule given as one row (or, for one column, one number or a flat list) as the
    ``[steps, width]`` nesting :func:`finite_array` checks; other values pass unchanged."""
    try:
        array = np.asarray(value, np.float64)
    except (TypeError, ValueError):
        return value  # not numbers: finite_array names the field
    if array.ndim == 0 and width == 1:
        return array.reshape(1, 1)
    if array.ndim == 1:
        return array.reshape(-1, 1) if width == 1 else array.reshape(1, -1)
    return array


def cstr_params(**overrides: Any) -> CSTRParams:
    """The canonical parameters with ``overrides`` applied, checked on the host.

    ``setpoint`` takes a ``[steps, 1]`` schedule, a flat list of one setpoint per interval
    (pc-gym's ``SP['Ca']``) or one number held throughout; ``feed`` a ``[steps, 2]``
    schedule of ``(Ti, Caf)`` or one pair held throughout. Overriding ``horizon`` keeps
    ``dt``.

    Raises:
        ValueError: naming the unknown or invalid field (a non-positive volume or flow, a
            setpoint outside ``[0, Caf]``, a feed outside its range, a non-finite value, ...).
    """
    values = with_overrides("CSTR", DEFAULTS, overrides)
    scalars = {
        name: finite_number(name, values[name], positive=True) for name in POSITIVE_CONSTANTS
    }
    scalars["reaction_enthalpy"] = finite_number("reaction_enthalpy", values["reaction_enthalpy"])
    scalars["reward_scale"] = finite_number("reward_scale", values["reward_scale"], low=0.0)
    max_temperature = finite_number(
        "max_temperature", values["max_temperature"], low=STATE_LOW[1], high=STATE_HIGH[1]
    )
    min_temperature = finite_number(
        "min_temperature", values["min_temperature"], low=STATE_LOW[1], high=STATE_HIGH[1]
    )
    if min_temperature >= max_temperature:
        raise ValueError(
            f"min_temperature: must lie below max_temperature ({max_temperature} K), "
            f"got {min_temperature}"
        )
    feed = finite_array(
        "feed",
        _schedule(values["feed"], 2),
        (None, 2),
        low=np.array([FEED_TEMPERATURE_RANGE[0], 0.0]),
        high=np.array([FEED_TEMPERATURE_RANGE[1], CONCENTRATION_MAX]),
    )
    if feed.shape[0] == 0:
        raise ValueError("feed: expected at least one row of [Ti, Caf], got none")
    max_feed = float(feed[:, 1].max())
    setpoint = finite_array(
        "setpoint", _schedule(values["setpoint"], 1), (None, 1), low=0.0, high=max_feed
    )
    if setpoint.shape[0] == 0:
        raise ValueError("setpoint: expected at least one setpoint of Ca, got none")
    initial_state = finite_array(
        "initial_state",
        values["initial_state"],
        (2,),
        low=np.array([0.0, STATE_LOW[1]]),
        high=np.array([CONCENTRATION_MAX, STATE_HIGH[1]]),
    )
    return CSTRParams(
        **{name: jnp.asarray(value, jnp.float32) for name, value in scalars.items()},
        initial_state=jnp.asarray(initial_state, jnp.float32),
        setpoint=jnp.asarray(setpoint, jnp.float32),
        feed=jnp.asarray(feed, jnp.float32),
        max_temperature=jnp.asarray(max_temperature, jnp.float32),
        min_temperature=jnp.asarray(min_temperature, jnp.float32),
        dt=jnp.asarray(finite_number("dt", values["dt"], positive=True), jnp.float32),
        horizon=jnp.asarray(positive_int("horizon", values["horizon"]), jnp.int32),
    )
