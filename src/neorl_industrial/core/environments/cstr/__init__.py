"""The continuous stirred-tank reactor: pc-gym 0.1.8's ``cstr`` as a functional environment."""

from neorl_industrial.core.environments.cstr.env import (
    CONTROL_NAMES,
    COST_NAMES,
    CSTR,
    FEED_NAMES,
    STATE_NAMES,
)
from neorl_industrial.core.environments.cstr.params import CSTRParams, cstr_params

__all__ = [
    "CONTROL_NAMES",
    "COST_NAMES",
    "CSTR",
    "FEED_NAMES",
    "STATE_NAMES",
    "CSTRParams",
    "cstr_params",
]
