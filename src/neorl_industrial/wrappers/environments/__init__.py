"""Gymnasium shells over the functional environments: ``gymnasium.Env``, ``VectorEnv``, and
the opt-in ``ShieldWrapper``."""

from neorl_industrial.wrappers.environments.gymnasium_env import GymnasiumEnv
from neorl_industrial.wrappers.environments.registration import (
    NAMESPACE,
    register_gymnasium_envs,
)
from neorl_industrial.wrappers.environments.shield_wrapper import ShieldWrapper
from neorl_industrial.wrappers.environments.vector_env import VectorEnv

__all__ = ["NAMESPACE", "GymnasiumEnv", "ShieldWrapper", "VectorEnv", "register_gymnasium_envs"]
