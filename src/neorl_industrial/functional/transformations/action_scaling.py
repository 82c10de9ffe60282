"""An environment in plant units driven by a policy that acts in [-1, 1].

Agents such as SAC squash their actions into [-1, 1]; process tasks take theirs in the
plant's units (pump voltages, forces). :class:`ActionScaledEnv` puts the task's
:class:`~neorl_industrial.functional.state_management.ActionScaler` between the two for
online training, so the agent learns in [-1, 1] while the plant, its rewards and costs
see exactly what a policy built with ``with_action_scaling`` would send it.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from neorl_industrial.core.environments import Environment, TimeStep, registered_id
from neorl_industrial.functional.state_management import ActionScaler


def action_scaler_for(env: Environment) -> ActionScaler | None:
    """The scaler between ``env``'s action bounds and [-1, 1]; None when the bounds are
    [-1, 1] already (no scaling, bit for bit).

    Raises:
        ValueError: for discrete actions, or naming an action whose bounds are not a
            finite range.
    """
    if env.discrete:
        raise ValueError(
            f"env: {registered_id(env)} has discrete actions; only continuous actions are scaled"
        )
    if ActionScaler.is_identity(env.action_low, env.action_high):
        return None
    return ActionScaler.create(env.action_low, env.action_high, env.action_names)


def normalized_actions(env: Environment) -> Environment:
    """``env`` acting in [-1, 1]: itself when its bounds are [-1, 1], otherwise wrapped
    in :class:`ActionScaledEnv`.

    Raises:
        ValueError: as :func:`action_scaler_for`.
    """
    return env if action_scaler_for(env) is None else ActionScaledEnv(env)


class ActionScaledEnv(Environment):
    """``inner`` with actions in [-1, 1], mapped to its bounds by ``ActionScaler.unscale``.

    Everything else is the inner environment's: observations, rewards, costs, auto-reset,
    the randomness of every step (the same keys give the same episodes as the inner
    environment driven with the unscaled actions). A NaN action stays NaN and the inner
    environment flags it. The plant's constraints, with their bounds in plant units,
    are ``inner.default_constraints()``; this environment declares only its [-1, 1] box.

    Args:
        inner: a continuous-action environment whose bounds are not [-1, 1].

    Raises:
        ValueError: for discrete actions or bounds that are [-1, 1] already (use
            :func:`normalized_actions`, which wraps only when needed).
    """

    def __init__(self, inner: Environment):
        scaler = action_scaler_for(inner)
        if scaler is None:
            raise ValueError(
                f"env: {registered_id(inner)} already acts in [-1, 1]; use normalized_actions(env)"
            )
        self.inner = inner
        self.scaler = scaler
        self.name = inner.name

    def __repr__(self) -> str:
        return f"ActionScaledEnv({self.inner!r})"

    @property
    def auto_reset(self) -> bool:  # type: ignore[override]
        return self.inner.auto_reset

    # ----- static description -------------------------------------------------------
    @property
    def observation_size(self) -> int:
        return self.inner.observation_size

    @property
    def action_size(self) -> int:
        return self.inner.action_size

    @property
    def action_low(self) -> np.ndarray:
        return -np.ones(self.inner.action_size, np.float32)

    @property
    def action_high(self) -> np.ndarray:
        return np.ones(self.inner.action_size, np.float32)

    @property
    def observation_low(self) -> np.ndarray:
        return self.inner.observation_low

    @property
    def observation_high(self) -> np.ndarray:
        return self.inner.observation_high

    @property
    def cost_names(self) -> tuple[str, ...]:
        return self.inner.cost_names

    @property
    def observation_names(self) -> tuple[str, ...]:
        return self.inner.observation_names

    @property
    def action_names(self) -> tuple[str, ...]:
        return self.inner.action_names

    @property
    def observation_units(self) -> tuple[str | None, ...] | None:
        return self.inner.observation_units

    def default_params(self, **overrides: Any) -> Any:
        return self.inner.default_params(**overrides)

    # ----- dynamics: the inner environment's, with the action unscaled ---------------
    def reset_env(self, key: jax.Array, params: Any) -> tuple[Any, TimeStep]:
        return self.inner.reset_env(key, params)

    def step_env(
        self, key: jax.Array, state: Any, action: jax.Array, params: Any
    ) -> tuple[Any, TimeStep]:
        return self.inner.step_env(key, state, self.scaler.unscale(action), params)

    def reset(self, key: jax.Array, params: Any = None) -> tuple[Any, TimeStep]:
        return self.inner.reset(key, params)

    def step(
        self, key: jax.Array, state: Any, action: jax.Array, params: Any = None
    ) -> tuple[Any, TimeStep]:
        return self.inner.step(key, state, self.scaler.unscale(action), params)

    def presample(self, key: jax.Array, n_steps: int) -> Any:
        return self.inner.presample(key, n_steps)

    def step_presampled(
        self, sample: Any, state: Any, action: jax.Array, params: Any
    ) -> tuple[Any, TimeStep]:
        return self.inner.step_presampled(sample, state, self.scaler.unscale(action), params)

    def reset_batch(self, key: jax.Array, n_envs: int, params: Any = None) -> tuple[Any, TimeStep]:
        return self.inner.reset_batch(key, n_envs, params)

    def step_env_batch(
        self, key: jax.Array, states: Any, actions: jax.Array, params: Any
    ) -> tuple[Any, TimeStep]:
        return self.inner.step_env_batch(key, states, self.scaler.unscale(actions), params)

    def step_batch(
        self, key: jax.Array, states: Any, actions: jax.Array, params: Any = None
    ) -> tuple[Any, TimeStep]:
        return self.inner.step_batch(key, states, self.scaler.unscale(actions), params)

    # ----- identity -----------------------------------------------------------------
    def _static_config(self) -> tuple:
        # The scaler follows from the inner environment's static bounds.
        return (type(self), self.inner._static_config())
