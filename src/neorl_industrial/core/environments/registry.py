"""Named environments: ``make("IB-v0", **overrides) -> (env, params)``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from neorl_industrial.core.environments.base import Environment
from neorl_industrial.core.environments.cstr import CSTR
from neorl_industrial.core.environments.dmsd import DMSD
from neorl_industrial.core.environments.four_tank import FourTank
from neorl_industrial.core.environments.industrial_benchmark import IndustrialBenchmark
from neorl_industrial.core.environments.pipeline import Pipeline


@dataclass(frozen=True)
class EnvSpec:
    """How to build a registered environment.

    Attributes:
        env_id: the registered name.
        factory: builds the environment from its static configuration.
        static_defaults: static configuration (shapes, modes) of this id.
        param_defaults: parameter overrides of this id, applied to ``default_params``.
        description: one line for listings.
    """

    env_id: str
    factory: Callable[..., Environment]
    static_defaults: dict[str, Any] = field(default_factory=dict)
    param_defaults: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    def static_fields(self) -> set[str]:
        return set(inspect.signature(self.factory).parameters)


_REGISTRY: dict[str, EnvSpec] = {}


def register(spec: EnvSpec, *, overwrite: bool = False) -> None:
    """Adds an environment to the registry."""
    if spec.env_id in _REGISTRY and not overwrite:
        raise ValueError(f"env_id: {spec.env_id!r} is already registered")
    _REGISTRY[spec.env_id] = spec


def registered_envs() -> dict[str, EnvSpec]:
    """All registered environments by id."""
    return dict(_REGISTRY)


def registered_id(env: Environment) -> str:
    """The id registered for ``env``'s configuration: the first id whose factory builds an
    equal environment (same class and static configuration), else the class's ``name``.

    An environment is not renamed by :func:`make`; this is how its id is told back (for
    messages), without a lookup table kept on the instance.
    """
    for env_id, spec in _REGISTRY.items():
        if spec.factory(**spec.static_defaults) == env:
            return env_id
    return env.name


def make(env_id: str, **overrides: Any) -> tuple[Environment, Any]:
    """Builds a registered environment and its default parameters.

    Overrides that name static configuration (e.g. ``observation``, ``action_type``,
    ``stationary``) build the environment; all others are parameters (e.g. ``setpoint``,
    ``horizon``, cost limits) and are validated by ``env.default_params``.

    Raises:
        ValueError: for an unknown id or an invalid override, naming it.
    """
    if env_id not in _REGISTRY:
        raise ValueError(f"env_id: unknown environment {env_id!r}; registered: {sorted(_REGISTRY)}")
    spec = _REGISTRY[env_id]
    static_fields = spec.static_fields()
    static = dict(spec.static_defaults)
    params = dict(spec.param_defaults)
    for name, value in overrides.items():
        (static if name in static_fields else params)[name] = value
    env = spec.factory(**static)
    return env, env.default_params(**params)


register(
    EnvSpec(
        "IB-v0",
        IndustrialBenchmark,
        description="Industrial Benchmark, continuous actions, 30 past frames (180 values)",
    )
)
register(
    EnvSpec(
        "IB-classic-v0",
        IndustrialBenchmark,
        static_defaults={"observation": "classic"},
        description="Industrial Benchmark, continuous actions, the current frame (6 values)",
    )
)
register(
    EnvSpec(
        "IB-discrete-v0",
        IndustrialBenchmark,
        static_defaults={"action_type": "discrete"},
        description="Industrial Benchmark, the 27 discrete actions, 30 past frames",
    )
)
register(
    EnvSpec(
        "IB-nonstationary-v0",
        IndustrialBenchmark,
        static_defaults={"stationary": False},
        description="Industrial Benchmark with the setpoint's random walk, 30 past frames",
    )
)
register(
    EnvSpec(
        "FourTank-v0",
        FourTank,
        description="pc-gym's four-tank process: track h3, h4 with two pumps, 60 steps of 16.7 s",
    )
)
register(
    EnvSpec(
        "DMSD-v0",
        DMSD,
        description="NeoRL-2's double mass-spring-damper servo: two forces, two targets, 100 steps",
    )
)
register(
    EnvSpec(
        "Pipeline-v0",
        Pipeline,
        description="NeoRL-2's pipeline: the gate's flow reaches the outlet 19 steps later",
    )
)
register(
    EnvSpec(
        "CSTR-v0",
        CSTR,
        description="pc-gym's CSTR: track Ca with the coolant temperature, 60 steps of 26 s",
    )
)
register(
    EnvSpec(
        "CSTR-stochastic-v0",
        CSTR,
        static_defaults={"disturbance_noise": 0.02, "disturbance_correlation": 0.9},
        description="CSTR-v0 with a random feed: Ti and Caf wander around their schedule "
        "(AR(1), 2 % of their ranges: 2.6 K, 0.04 mol/L; correlation 0.9 per interval)",
    )
)
