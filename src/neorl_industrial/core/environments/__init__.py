"""Functional environments (gymnax-style): ``make``, ``rollout`` and the Industrial Benchmark."""

from neorl_industrial.core.environments.base import Environment, StepInfo, TimeStep
from neorl_industrial.core.environments.industrial_benchmark import (
    IBEnvState,
    IBParams,
    IndustrialBenchmark,
)
from neorl_industrial.core.environments.registry import EnvSpec, make, register, registered_envs
from neorl_industrial.core.environments.rollout import (
    Policy,
    RolloutResult,
    Transitions,
    constant_policy,
    rollout,
    scan_single,
    uniform_random_policy,
)

__all__ = [
    "EnvSpec",
    "Environment",
    "IBEnvState",
    "IBParams",
    "IndustrialBenchmark",
    "Policy",
    "RolloutResult",
    "StepInfo",
    "TimeStep",
    "Transitions",
    "constant_policy",
    "make",
    "register",
    "registered_envs",
    "rollout",
    "scan_single",
    "uniform_random_policy",
]
