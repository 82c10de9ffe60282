"""Algorithms as NamedTuples of pure functions: SAC (online, for behaviour policies),
behaviour cloning, TD3+BC, IQL and CQL (with the Lagrangian CQL-alpha), discrete BC and
CQL, and the safe variants TD3BC-Lag and IQL-Lag with their PID Lagrange multiplier."""

from neorl_industrial.core.agents.bc import BCConfig, BCState, make_bc
from neorl_industrial.core.agents.cost import (
    PIDConfig,
    PIDState,
    per_step_cost_threshold,
    pid_init,
    pid_update,
)
from neorl_industrial.core.agents.cql import CQLConfig, CQLState, make_cql
from neorl_industrial.core.agents.discrete import (
    DiscreteBCConfig,
    DiscreteCQLConfig,
    make_discrete_bc,
    make_discrete_cql,
)
from neorl_industrial.core.agents.iql import IQLConfig, IQLState, make_iql
from neorl_industrial.core.agents.iql_lag import IQLLagConfig, IQLLagState, make_iql_lag
from neorl_industrial.core.agents.networks import ObservationNormalizer, PolicyParams
from neorl_industrial.core.agents.sac import SACConfig, SACState, make_sac
from neorl_industrial.core.agents.td3bc import TD3BCConfig, TD3BCState, make_td3bc
from neorl_industrial.core.agents.td3bc_lag import TD3BCLagConfig, TD3BCLagState, make_td3bc_lag
from neorl_industrial.core.agents.types import Algorithm, Metrics

__all__ = [
    "Algorithm",
    "BCConfig",
    "BCState",
    "CQLConfig",
    "CQLState",
    "DiscreteBCConfig",
    "DiscreteCQLConfig",
    "IQLConfig",
    "IQLLagConfig",
    "IQLLagState",
    "IQLState",
    "Metrics",
    "ObservationNormalizer",
    "PIDConfig",
    "PIDState",
    "PolicyParams",
    "SACConfig",
    "SACState",
    "TD3BCConfig",
    "TD3BCLagConfig",
    "TD3BCLagState",
    "TD3BCState",
    "make_bc",
    "make_cql",
    "make_discrete_bc",
    "make_discrete_cql",
    "make_iql",
    "make_iql_lag",
    "make_sac",
    "make_td3bc",
    "make_td3bc_lag",
    "per_step_cost_threshold",
    "pid_init",
    "pid_update",
]
