"""NeoRL-2's double mass-spring-damper servo (DMSD) as a functional environment."""

from neorl_industrial.core.environments.dmsd.env import (
    COST_NAMES,
    DMSD,
    FORCE_NAMES,
    REFERENCE_SCORES,
    STATE_NAMES,
    DMSDParams,
    normalized_score,
)

__all__ = [
    "COST_NAMES",
    "DMSD",
    "FORCE_NAMES",
    "REFERENCE_SCORES",
    "STATE_NAMES",
    "DMSDParams",
    "normalized_score",
]
