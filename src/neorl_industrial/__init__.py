"""neorl_industrial: safe offline reinforcement learning for industrial control, in JAX.

Importing the package (or any module of its pure core) loads neither Gymnasium nor the
layers above the core. The Gymnasium ids (``gymnasium.make("neorl_industrial/IB-v0")``)
are registered by the wrappers layer: ``import neorl_industrial.wrappers.environments``.
"""

from neorl_industrial.core.environments import make, registered_envs, rollout
from neorl_industrial.version import __version__

__all__ = ["__version__", "make", "registered_envs", "rollout"]
