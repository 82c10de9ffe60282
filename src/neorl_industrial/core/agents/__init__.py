"""Algorithms as NamedTuples of pure functions: SAC (online, for behaviour policies) and
behaviour cloning so far; TD3+BC, IQL and CQL with their safe variants follow."""

from neorl_industrial.core.agents.bc import BCConfig, BCState, make_bc
from neorl_industrial.core.agents.networks import ObservationNormalizer, PolicyParams
from neorl_industrial.core.agents.sac import SACConfig, SACState, make_sac
from neorl_industrial.core.agents.types import Algorithm, Metrics

__all__ = [
    "Algorithm",
    "BCConfig",
    "BCState",
    "Metrics",
    "ObservationNormalizer",
    "PolicyParams",
    "SACConfig",
    "SACState",
    "make_bc",
    "make_sac",
]
