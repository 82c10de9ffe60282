"""Parameters of the four-tank process: pc-gym's canonical benchmark, validated on the host.

The defaults are pc-gym 0.1.8's ``four_tank`` model constants and the four-tank benchmark
of the pc-gym paper (``pc-gym_paper/train_policies/four_tank/4tank_train.py``): 60 control
intervals over ``tsim = 1000 s``, pumps in [0.1, 10] V, every level observed in [0, 0.6] m,
the upper tanks' levels ``h3`` and ``h4`` tracked from ``(0.5, 0.2) m`` to ``(0.1, 0.3) m``
halfway through, and the episode starting from ``(0.141, 0.112, 0.072, 0.42) m``.
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

#: acceleration due to gravity [m/s²] in Torricelli's outflow ``a sqrt(2 g h)`` (pc-gym's)
GRAVITY = 9.81

# pc-gym 0.1.8's ``four_tank`` constants.
DEFAULT_GAMMA = (0.2, 0.2)  # fraction of pump 1 (2) sent to lower tank 1 (2) [-]
DEFAULT_PUMP_GAIN = (0.00085, 0.00095)  # [m³/(V s)]
DEFAULT_OUTLET_AREA = (0.0035, 0.0030, 0.0020, 0.0025)  # [m²]
DEFAULT_TANK_AREA = (1.0, 1.0, 1.0, 1.0)  # [m²]

# The benchmark of the pc-gym paper: dt = tsim / N.
DEFAULT_TSIM = 1000.0  # [s]
DEFAULT_HORIZON = 60
DEFAULT_INITIAL_LEVELS = (0.141, 0.112, 0.072, 0.42)  # [m]
#: ``[N, 2]`` setpoints of ``h3`` and ``h4`` [m]: (0.5, 0.2) then (0.1, 0.3) from step 30
DEFAULT_SETPOINT = np.array(
    [(0.5, 0.2)] * (DEFAULT_HORIZON // 2) + [(0.1, 0.3)] * (DEFAULT_HORIZON // 2), np.float64
)
#: pc-gym's ``r_scale`` of the tracked levels (its default, 1 each)
DEFAULT_REWARD_SCALE = (1.0, 1.0)

#: The tank height [m]: pc-gym observes every level in [0, 0.6] m. pc-gym's model has no
#: rim (a level above it is computed like any other, as here); a level above it is the
#: ``overflow`` cost, the water a real tank would lose over its rim.
DEFAULT_TANK_HEIGHT = 0.6
#: The low-level alarm [m]; pc-gym declares none. A level below it is the ``empty`` cost.
#: At 5 cm it lies below every level the benchmark asks for or starts from (the lowest:
#: the initial ``h3 = 0.072 m``; the setpoint ``h3 = 0.1 m``, whose steady state holds
#: ``h1`` at 0.078 m) and below the steady levels with both pumps at mid-range (0.09 to
#: 0.19 m), while a pump held at its 0.1 V minimum drains its tanks below 0.1 mm.
DEFAULT_MIN_LEVEL = 0.05
#: The physical envelope of a level [m]: the model with the default constants cannot
#: exceed 0.74 m (tank 3, pump 2 at 10 V); a level above 2 m means constants far outside
#: the model's range, and the step is reported as diverged.
LEVEL_ENVELOPE = 2.0


@struct.dataclass
class FourTankParams:
    """Traced parameters of the four-tank process (vmappable for sweeps).

    Attributes:
        gamma: ``[2]`` valve splits: the fraction of pump 1's flow sent to lower tank 1
            (the rest to upper tank 4), and of pump 2's to lower tank 2 (the rest to upper
            tank 3). ``gamma[0] + gamma[1] < 1`` makes the process non-minimum-phase.
        pump_gain: ``[2]`` flow per volt of each pump [m³/(V s)].
        outlet_area: ``[4]`` cross-section of each tank's outlet [m²].
        tank_area: ``[4]`` cross-section of each tank [m²].
        initial_levels: ``[4]`` levels at reset [m].
        setpoint: ``[steps, 2]`` setpoints of ``h3`` and ``h4`` per control interval [m];
            the last row holds after the schedule ends.
        reward_scale: ``[2]`` weight of each tracked level's squared error.
        tank_height: the level above which a tank overflows [m] (the ``overflow`` costs).
        min_level: the level below which a tank runs empty [m] (the ``empty`` costs).
        dt: seconds per control interval.
        horizon: int32 control intervals per episode.
    """

    gamma: jax.Array
    pump_gain: jax.Array
    outlet_area: jax.Array
    tank_area: jax.Array
    initial_levels: jax.Array
    setpoint: jax.Array
    reward_scale: jax.Array
    tank_height: jax.Array
    min_level: jax.Array
    dt: jax.Array
    horizon: jax.Array


DEFAULTS: dict[str, Any] = {
    "gamma": DEFAULT_GAMMA,
    "pump_gain": DEFAULT_PUMP_GAIN,
    "outlet_area": DEFAULT_OUTLET_AREA,
    "tank_area": DEFAULT_TANK_AREA,
    "initial_levels": DEFAULT_INITIAL_LEVELS,
    "setpoint": DEFAULT_SETPOINT,
    "reward_scale": DEFAULT_REWARD_SCALE,
    "tank_height": DEFAULT_TANK_HEIGHT,
    "min_level": DEFAULT_MIN_LEVEL,
    "dt": DEFAULT_TSIM / DEFAULT_HORIZON,
    "horizon": DEFAULT_HORIZON,
}


def _positive_array(field: str, value: Any, shape: tuple[int, ...]) -> np.ndarray:
    array = finite_array(field, value, shape, low=0.0)
    if (array <= 0.0).any():
        index = int(np.argmax(array <= 0.0))
        raise ValueError(f"{field}[{index}]: must be positive, got {array[index]}")
    return array


def four_tank_params(**overrides: Any) -> FourTankParams:
    """The canonical parameters with ``overrides`` applied, checked on the host.

    ``setpoint`` takes a ``[steps, 2]`` schedule or one ``[h3, h4]`` pair held throughout.
    Overriding ``horizon`` keeps ``dt``.

    Raises:
        ValueError: naming the unknown or invalid field (a negative area, a setpoint or an
            initial level outside ``[0, tank_height]``, ...).
    """
    values = with_overrides("four-tank", DEFAULTS, overrides)
    tank_height = finite_number(
        "tank_height", values["tank_height"], high=LEVEL_ENVELOPE, positive=True
    )
    min_level = finite_number("min_level", values["min_level"], low=0.0)
    if min_level >= tank_height:
        raise ValueError(
            f"min_level: must lie below tank_height ({tank_height} m), got {min_level}"
        )
    tank_area = _positive_array("tank_area", values["tank_area"], (4,))
    outlet_area = _positive_array("outlet_area", values["outlet_area"], (4,))
    if (outlet_area >= tank_area).any():
        index = int(np.argmax(outlet_area >= tank_area))
        raise ValueError(
            f"outlet_area[{index}]: must be smaller than tank_area[{index}] "
            f"({tank_area[index]} m²), got {outlet_area[index]}"
        )
    setpoint = values["setpoint"]
    try:
        one_pair = np.asarray(setpoint, np.float64).ndim == 1
    except (TypeError, ValueError):
        one_pair = False  # not numbers: finite_array names the field
    if one_pair:
        setpoint = [setpoint]
    arrays = {
        "gamma": finite_array("gamma", values["gamma"], (2,), low=0.0, high=1.0),
        "pump_gain": _positive_array("pump_gain", values["pump_gain"], (2,)),
        "outlet_area": outlet_area,
        "tank_area": tank_area,
        "initial_levels": finite_array(
            "initial_levels", values["initial_levels"], (4,), low=0.0, high=tank_height
        ),
        "setpoint": finite_array("setpoint", setpoint, (None, 2), low=0.0, high=tank_height),
        "reward_scale": finite_array("reward_scale", values["reward_scale"], (2,), low=0.0),
    }
    if arrays["setpoint"].shape[0] == 0:
        raise ValueError("setpoint: expected at least one row of [h3, h4] setpoints, got none")
    return FourTankParams(
        **{name: jnp.asarray(array, jnp.float32) for name, array in arrays.items()},
        tank_height=jnp.asarray(tank_height, jnp.float32),
        min_level=jnp.asarray(min_level, jnp.float32),
        dt=jnp.asarray(finite_number("dt", values["dt"], positive=True), jnp.float32),
        horizon=jnp.asarray(positive_int("horizon", values["horizon"]), jnp.int32),
    )
