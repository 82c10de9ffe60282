"""Algorithms as NamedTuples of pure functions: SAC (online, for behaviour policies),
behaviour cloning, TD3+BC, IQL and CQL (with the Lagrangian CQL-alpha); the safe
variants follow."""

from neorl_industrial.core.agents.bc import BCConfig, BCState, make_bc
from neorl_industrial.core.agents.cql import CQLConfig, CQLState, make_cql
from neorl_industrial.core.agents.iql import IQLConfig, IQLState, make_iql
from neorl_industrial.core.agents.networks import ObservationNormalizer, PolicyParams
from neorl_industrial.core.agents.sac import SACConfig, SACState, make_sac
from neorl_industrial.core.agents.td3bc import TD3BCConfig, TD3BCState, make_td3bc
from neorl_industrial.core.agents.types import Algorithm, Metrics

__all__ = [
    "Algorithm",
    "BCConfig",
    "BCState",
    "CQLConfig",
    "CQLState",
    "IQLConfig",
    "IQLState",
    "Metrics",
    "ObservationNormalizer",
    "PolicyParams",
    "SACConfig",
    "SACState",
    "TD3BCConfig",
    "TD3BCState",
    "make_bc",
    "make_cql",
    "make_iql",
    "make_sac",
    "make_td3bc",
]
