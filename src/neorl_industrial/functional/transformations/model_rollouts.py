"""MOPO's model rollouts as one compiled program: many starts at once (``vmap`` of the
core's :func:`~neorl_industrial.core.agents.mopo.rollout`, a ``lax.scan`` over the
horizon), for inspecting or storing the data a model-based agent trains on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from neorl_industrial.core.agents.mopo import ModelHandle, ModelTransitions, rollout

__all__ = ["make_model_rollouts"]


def make_model_rollouts(
    model: ModelHandle,
    act: Callable[..., jax.Array],
    *,
    horizon: int,
    penalty_coef: float,
    discount: float,
) -> Callable[[Any, jax.Array, jax.Array], ModelTransitions]:
    """``rollouts(policy_params, starts, key) -> ModelTransitions [N, horizon]``, jitted:
    a rollout of ``horizon`` steps from each raw observation of ``starts [N, obs_size]``
    under the policy ``act`` (an ``Algorithm.act``), shielded when ``model`` has
    constraints, its rewards penalized by ``penalty_coef`` times MOPO's uncertainty.

    Raises:
        ValueError: for a horizon that is not a positive integer.
    """
    if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
        raise ValueError(f"horizon: expected a positive integer, got {horizon!r}")

    def rollouts(policy_params: Any, starts: jax.Array, key: jax.Array) -> ModelTransitions:
        def one(start: jax.Array, start_key: jax.Array) -> ModelTransitions:
            return rollout(
                model, act, policy_params, start, start_key, horizon, penalty_coef, discount
            )

        return jax.vmap(one)(starts, jax.random.split(key, starts.shape[0]))

    return jax.jit(rollouts)
