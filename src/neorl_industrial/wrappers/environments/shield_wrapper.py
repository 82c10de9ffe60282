"""An opt-in Gymnasium wrapper that passes every action through the safety shield."""

from __future__ import annotations

from typing import Any

import gymnasium
import jax
import numpy as np

from neorl_industrial.core.safety import CompiledConstraints, ConstraintSpec, shield
from neorl_industrial.wrappers.environments.gymnasium_env import from_plant_units, to_plant_units

_jitted_shield = jax.jit(shield)


class ShieldWrapper(gymnasium.Wrapper):
    """Shields the actions of a :class:`GymnasiumEnv` (continuous actions).

    The wrapped environment receives the shield's action; ``info["safety"]`` says what
    the shield did: ``overridden``, ``projected``, ``fallback``, ``infeasible``, the names
    of the constraints the proposed action broke, and both actions. The previous applied
    action (for rate limits) starts at zero on every reset.

    Args:
        env: a :class:`GymnasiumEnv` (or a wrapper around one).
        constraints: a spec or compiled constraints; by default the environment's own
            ``default_constraints()``.

    Raises:
        ValueError: for a discrete-action environment, or constraints compiled for
            another action size.
    """

    def __init__(self, env: gymnasium.Env, constraints: Any = None):
        super().__init__(env)
        functional = env.unwrapped.env
        if functional.discrete:
            raise ValueError("env: the shield needs continuous actions")
        if constraints is None or isinstance(constraints, ConstraintSpec):
            constraints = functional.compile_constraints(constraints)
        if not isinstance(constraints, CompiledConstraints):
            raise ValueError(
                "constraints: expected a ConstraintSpec or CompiledConstraints, "
                f"got {type(constraints).__name__}"
            )
        if constraints.action_size != functional.action_size:
            raise ValueError(
                f"constraints: compiled for {constraints.action_size} actions, the "
                f"environment has {functional.action_size}"
            )
        self.constraints = constraints
        self._functional = functional
        # A shell acting in [-1, 1]: the shield works in the plant's units, as everywhere.
        self._normalized = bool(getattr(env.unwrapped, "normalize_actions", False))
        self._observation: np.ndarray | None = None
        self._prev_action = np.zeros(functional.action_size, np.float32)

    def reset(self, **kwargs: Any):
        observation, info = self.env.reset(**kwargs)
        self._observation = observation
        self._prev_action = np.zeros_like(self._prev_action)
        return observation, info

    def step(self, action: Any):
        if self._observation is None:
            raise RuntimeError("step() called before reset()")
        proposed = np.asarray(action, np.float32).reshape(self._prev_action.shape)
        if self._normalized:
            proposed = to_plant_units(self._functional, proposed)
        safe, report = _jitted_shield(
            self.constraints, self._observation, proposed, self._prev_action
        )
        safe = np.asarray(safe)
        violated = np.asarray(report.violated)
        applied = from_plant_units(self._functional, safe) if self._normalized else safe
        observation, reward, terminated, truncated, info = self.env.step(applied)
        self._observation = observation
        self._prev_action = safe
        info = dict(info)
        info["safety"] = {
            "overridden": bool(report.overridden),
            "projected": bool(report.projected),
            "fallback": bool(report.fallback),
            "infeasible": bool(report.infeasible),
            "invalid_observation": bool(report.invalid_observation),
            "violated": [n for n, v in zip(self.constraints.names, violated, strict=True) if v],
            "proposed_action": proposed,
            "applied_action": safe,
        }
        return observation, reward, terminated, truncated, info
