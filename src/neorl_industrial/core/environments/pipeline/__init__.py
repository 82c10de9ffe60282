"""NeoRL-2's Pipeline: a water channel with a 19-step transport delay, tracking a target."""

from neorl_industrial.core.environments.pipeline.env import (
    ACTION_NAMES,
    COST_NAMES,
    DEFAULT_DELAY,
    DEFAULT_HISTORY,
    REFERENCE_SCORES,
    Pipeline,
    PipelineBatchState,
    PipelineState,
    next_target,
    normalized_score,
)
from neorl_industrial.core.environments.pipeline.params import (
    DEFAULT_COST_BAND,
    DEFAULT_EPISODE_COST_LIMIT,
    SAMPLE_INITIAL_TARGET,
    PipelineParams,
    pipeline_params,
)

__all__ = [
    "ACTION_NAMES",
    "COST_NAMES",
    "DEFAULT_COST_BAND",
    "DEFAULT_DELAY",
    "DEFAULT_EPISODE_COST_LIMIT",
    "DEFAULT_HISTORY",
    "REFERENCE_SCORES",
    "SAMPLE_INITIAL_TARGET",
    "Pipeline",
    "PipelineBatchState",
    "PipelineParams",
    "PipelineState",
    "next_target",
    "normalized_score",
    "pipeline_params",
]
