"""Algorithms as NamedTuples of pure functions: SAC (online, for behaviour policies),
behaviour cloning, TD3+BC, IQL and CQL (with the Lagrangian CQL-alpha), discrete BC and
CQL, the safe variants TD3BC-Lag and IQL-Lag (the base algorithm + cost critics + a
Lagrange multiplier, PID or gradient ascent (``core.optimizers``), on cost limits carried as
traced leaves), the model-based MOPO, MOPO-BC and MOPO-Lag (``mopo.py``), and FQE, the
off-policy evaluator (``fqe.py``). ``registry.py`` names the ones a run can ask for."""

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
from neorl_industrial.core.agents.networks import ObservationNormalizer, PolicyParams
from neorl_industrial.core.agents.sac import SACConfig, SACState, make_sac
from neorl_industrial.core.agents.td3bc import TD3BCConfig, TD3BCState, make_td3bc
from neorl_industrial.core.agents.td3bc_lag import TD3BCLagConfig, TD3BCLagState, make_td3bc_lag
from neorl_industrial.core.agents.types import Algorithm, Batch, Metrics
from neorl_industrial.core.optimizers import GradientAscentConfig, PIDConfig

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
    "ObservationNormalizer",
    "PIDConfig",
    "PolicyParams",
    "SACConfig",
    "SACState",
    "SafetyConfig",
    "TD3BCConfig",
    "TD3BCLagConfig",
    "TD3BCLagState",
    "TD3BCState",
    "check_cost_limits",
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
    "with_cost_limits",
]
