"""Algorithms as NamedTuples of pure functions: SAC (online, for behaviour policies),
behaviour cloning, TD3+BC, IQL and CQL (with the Lagrangian CQL-alpha), discrete BC and
CQL, and the safe variants TD3BC-Lag and IQL-Lag (the base algorithm + cost critics + a
Lagrange multiplier, PID or gradient ascent, on cost limits carried as traced leaves)."""

from neorl_industrial.core.agents.bc import BCConfig, BCState, make_bc
from neorl_industrial.core.agents.cost import (
    LagrangianState,
    SafetyConfig,
    check_cost_limits,
    per_step_cost_threshold,
    with_cost_limits,
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
from neorl_industrial.core.agents.multipliers import (
    GradientAscentConfig,
    Multiplier,
    PIDConfig,
    PIDState,
    gradient_ascent_multiplier,
    pid_init,
    pid_multiplier,
    pid_update,
)
from neorl_industrial.core.agents.networks import ObservationNormalizer, PolicyParams
from neorl_industrial.core.agents.sac import SACConfig, SACState, make_sac
from neorl_industrial.core.agents.td3bc import TD3BCConfig, TD3BCState, make_td3bc
from neorl_industrial.core.agents.td3bc_lag import TD3BCLagConfig, TD3BCLagState, make_td3bc_lag
from neorl_industrial.core.agents.types import Algorithm, Batch, Metrics

__all__ = [
    "Algorithm",
    "BCConfig",
    "BCState",
    "Batch",
    "CQLConfig",
    "CQLState",
    "DiscreteBCConfig",
    "DiscreteCQLConfig",
    "GradientAscentConfig",
    "IQLConfig",
    "IQLLagConfig",
    "IQLLagState",
    "IQLState",
    "LagrangianState",
    "Metrics",
    "Multiplier",
    "ObservationNormalizer",
    "PIDConfig",
    "PIDState",
    "PolicyParams",
    "SACConfig",
    "SACState",
    "SafetyConfig",
    "TD3BCConfig",
    "TD3BCLagConfig",
    "TD3BCLagState",
    "TD3BCState",
    "check_cost_limits",
    "gradient_ascent_multiplier",
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
    "pid_multiplier",
    "pid_update",
    "with_cost_limits",
]
