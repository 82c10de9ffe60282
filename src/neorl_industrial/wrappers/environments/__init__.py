"""Gymnasium shells over the functional environments: ``gymnasium.Env``, ``VectorEnv``, and
the opt-in ``ShieldWrapper``.

Importing this package registers every functional environment with Gymnasium under
``neorl_industrial/``, so ``gymnasium.make("neorl_industrial/IB-v0")`` and
``gymnasium.make_vec`` work after it (``gymnasium.register_envs`` takes the module, for
linters that flag an unused import).
"""

from neorl_industrial.wrappers.environments.gymnasium_env import GymnasiumEnv
from neorl_industrial.wrappers.environments.registration import (
    NAMESPACE,
    register_gymnasium_envs,
)
from neorl_industrial.wrappers.environments.shield_wrapper import ShieldWrapper
from neorl_industrial.wrappers.environments.vector_env import VectorEnv

register_gymnasium_envs()

__all__ = ["NAMESPACE", "GymnasiumEnv", "ShieldWrapper", "VectorEnv", "register_gymnasium_envs"]
