"""Registers every functional environment with Gymnasium under ``neorl_industrial/``."""

from __future__ import annotations

from typing import Any

import gymnasium

from neorl_industrial.core.environments import registered_envs

NAMESPACE = "neorl_industrial"


def make_gymnasium_env(env_id: str, **kwargs: Any):
    from neorl_industrial.wrappers.environments.gymnasium_env import GymnasiumEnv

    return GymnasiumEnv(env_id, **kwargs)


def make_vector_env(env_id: str, num_envs: int = 1, **kwargs: Any):
    from neorl_industrial.wrappers.environments.vector_env import VectorEnv

    return VectorEnv(num_envs, env_id, **kwargs)


def register_gymnasium_envs() -> None:
    """Makes ``gymnasium.make("neorl_industrial/<id>")`` and ``gymnasium.make_vec`` work.

    Idempotent: ids already known to Gymnasium are left alone.
    """
    for env_id in registered_envs():
        gym_id = f"{NAMESPACE}/{env_id}"
        if gym_id in gymnasium.registry:
            continue
        gymnasium.register(
            id=gym_id,
            entry_point=f"{__name__}:make_gymnasium_env",
            vector_entry_point=f"{__name__}:make_vector_env",
            kwargs={"env_id": env_id},
        )
