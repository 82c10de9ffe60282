"""The Industrial Benchmark: a faithful pure-JAX port of the reference simulator."""

from neorl_industrial.core.environments.industrial_benchmark import dynamics, goldstone
from neorl_industrial.core.environments.industrial_benchmark.dynamics import (
    IBNoise,
    IBState,
    initial_state,
    noise_from_uniforms,
    pre_initial_state,
    sample_noise,
    transition,
)
from neorl_industrial.core.environments.industrial_benchmark.env import (
    COST_NAMES,
    DISCRETE_ACTIONS,
    FRAME_NAMES,
    IBEnvState,
    IBParams,
    IBStepInfo,
    IndustrialBenchmark,
)

__all__ = [
    "COST_NAMES",
    "DISCRETE_ACTIONS",
    "FRAME_NAMES",
    "IBEnvState",
    "IBNoise",
    "IBParams",
    "IBState",
    "IBStepInfo",
    "IndustrialBenchmark",
    "dynamics",
    "goldstone",
    "initial_state",
    "noise_from_uniforms",
    "pre_initial_state",
    "sample_noise",
    "transition",
]
