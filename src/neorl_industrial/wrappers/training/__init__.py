"""The Trainer: scan-fused chunks, host callbacks, evaluation, best-policy selection,
early stopping and atomic checkpoints with exact resume; the run configuration."""

from neorl_industrial.wrappers.training.callbacks import Callback, History, RichProgress
from neorl_industrial.wrappers.training.config import (
    AlgorithmSection,
    CheckpointSection,
    ConfigError,
    DataSection,
    EnvSection,
    EvaluationSection,
    RunConfig,
    SafetySection,
    TrackingSection,
    TrainingSection,
    apply_overrides,
)
from neorl_industrial.wrappers.training.evaluation import (
    Evaluator,
    mean_confidence_interval,
    selection_key,
    summarize_runs,
)
from neorl_industrial.wrappers.training.trainer import (
    CheckpointMismatchError,
    Trainer,
    TrainResult,
    dataset_fingerprint,
)

__all__ = [
    "AlgorithmSection",
    "Callback",
    "CheckpointMismatchError",
    "CheckpointSection",
    "ConfigError",
    "DataSection",
    "EnvSection",
    "EvaluationSection",
    "Evaluator",
    "History",
    "RichProgress",
    "RunConfig",
    "SafetySection",
    "TrackingSection",
    "TrainResult",
    "Trainer",
    "TrainingSection",
    "apply_overrides",
    "dataset_fingerprint",
    "mean_confidence_interval",
    "selection_key",
    "summarize_runs",
]
