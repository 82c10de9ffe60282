"""neorl_industrial: safe offline reinforcement learning for industrial control, in JAX.

Importing the package registers its environments with Gymnasium
(``gymnasium.make("neorl_industrial/IB-v0")``).
"""

from importlib.metadata import PackageNotFoundError, version

from neorl_industrial.core.environments import make, registered_envs, rollout

try:
    __version__ = version("neorl-industrial")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

from neorl_industrial.wrappers.environments import register_gymnasium_envs as _register

_register()

__all__ = ["__version__", "make", "registered_envs", "rollout"]
