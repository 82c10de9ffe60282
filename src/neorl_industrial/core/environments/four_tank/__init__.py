"""The four-tank process: pc-gym 0.1.8's ``four_tank`` as a functional environment."""

from neorl_industrial.core.environments.four_tank.env import (
    COST_NAMES,
    LEVEL_NAMES,
    PUMP_NAMES,
    FourTank,
)
from neorl_industrial.core.environments.four_tank.params import (
    GRAVITY,
    FourTankParams,
    four_tank_params,
)

__all__ = [
    "COST_NAMES",
    "GRAVITY",
    "LEVEL_NAMES",
    "PUMP_NAMES",
    "FourTank",
    "FourTankParams",
    "four_tank_params",
]
