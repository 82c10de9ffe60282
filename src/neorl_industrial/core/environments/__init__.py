"""Functional environments (gymnax-style): ``make``, ``rollout``, the Industrial Benchmark,
and the :class:`Task` that describes any process, simulated or not."""

from neorl_industrial.core.environments.base import Environment, StepInfo, TimeStep
from neorl_industrial.core.environments.industrial_benchmark import (
    IBEnvState,
    IBParams,
    IndustrialBenchmark,
)
from neorl_industrial.core.environments.registry import (
    EnvSpec,
    make,
    register,
    registered_envs,
    registered_id,
)
from neorl_industrial.core.environments.rollout import (
    BatchPolicy,
    Policy,
    RolloutResult,
    Transitions,
    constant_policy,
    rollout,
    scan_single,
    uniform_random_batch_policy,
    uniform_random_policy,
)
from neorl_industrial.core.environments.task import Task, TaskError

__all__ = [
    "BatchPolicy",
    "EnvSpec",
    "Environment",
    "IBEnvState",
    "IBParams",
    "IndustrialBenchmark",
    "Policy",
    "RolloutResult",
    "StepInfo",
    "Task",
    "TaskError",
    "TimeStep",
    "Transitions",
    "constant_policy",
    "make",
    "register",
    "registered_envs",
    "registered_id",
    "rollout",
    "scan_single",
    "uniform_random_batch_policy",
    "uniform_random_policy",
]
