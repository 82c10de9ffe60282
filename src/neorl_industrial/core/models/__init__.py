"""Learned models of a plant: an ensemble of probabilistic dynamics models and the known
reward and cost channels computed from its predictions (pure JAX)."""

from neorl_industrial.core.models.dynamics import (
    Dynamics,
    DynamicsLayout,
    DynamicsParams,
    MemberPrediction,
    ModelBatch,
    StepOutput,
    gaussian_nll,
    make_dynamics,
    out_of_distribution,
)
from neorl_industrial.core.models.network import DynamicsConfig
from neorl_industrial.core.models.signals import (
    KnownSignal,
    KnownSignals,
    compile_expression,
    match_row,
)

__all__ = [
    "Dynamics",
    "DynamicsConfig",
    "DynamicsLayout",
    "DynamicsParams",
    "KnownSignal",
    "KnownSignals",
    "MemberPrediction",
    "ModelBatch",
    "StepOutput",
    "compile_expression",
    "gaussian_nll",
    "make_dynamics",
    "match_row",
    "out_of_distribution",
]
