"""The model side of MOPO (``mopo.py``): what it needs of a fitted plant model
(:class:`ModelHandle`, its traced part :class:`ModelState`), the rollouts under the current
policy with MOPO's uncertainty penalty (:func:`rollout`), the buffer the transitions enter
(:class:`ModelBuffer`) and the learner's mix of real and model rows (:func:`mixed_batch`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from neorl_industrial.core.agents.types import Batch
from neorl_industrial.core.safety.shield import shield

if TYPE_CHECKING:  # core.models imports core.agents; no import cycle at run time
    from neorl_industrial.core.models.dynamics import Dynamics, DynamicsParams

__all__ = [
    "ModelBuffer",
    "ModelHandle",
    "ModelState",
    "ModelTransitions",
    "mixed_batch",
    "rollout",
    "uncertainty_penalty",
]


class ModelHandle(NamedTuple):
    """What MOPO needs of a fitted plant model.

    Attributes:
        dynamics: the ensemble's pure functions (``PlantModel.dynamics``).
        params: the elites' parameters, leading member axis (``PlantModel.params(seed)``).
        reward_shift: the run's reward scaling ``r -> (r + shift) * scale``, which the
            real batches have had, applied to the model's rewards.
        reward_scale: see ``reward_shift``.
        constraints: the shield's compiled constraints in plant units, or None (no
            shield).
    """

    dynamics: Dynamics
    params: DynamicsParams
    reward_shift: float | jax.Array = 0.0
    reward_scale: float | jax.Array = 1.0
    constraints: Any = None


class ModelTransitions(NamedTuple):
    """Transitions of model rollouts, leading axes as produced."""

    observations: jax.Array
    actions: jax.Array  # in the policy's [-1, 1], after the shield
    rewards: jax.Array  # penalized, in the learner's units
    costs: jax.Array
    next_observations: jax.Array
    discounts: jax.Array  # γ, or 0 after a terminal state
    penalties: jax.Array  # u(s, a), before λ
    overridden: jax.Array  # the shield changed the policy's action


@struct.dataclass
class ModelBuffer:
    """The newest model transitions (a circular buffer)."""

    observations: jax.Array  # [N, obs]
    actions: jax.Array  # [N, act]
    rewards: jax.Array  # [N]
    costs: jax.Array  # [N, n_costs]
    next_observations: jax.Array  # [N, obs]
    discounts: jax.Array  # [N]
    position: jax.Array  # [] next row written
    size: jax.Array  # [] rows filled

    @classmethod
    def empty(cls, capacity: int, obs_size: int, action_size: int, n_costs: int) -> ModelBuffer:
        zeros = jnp.zeros
        return cls(
            observations=zeros((capacity, obs_size), jnp.float32),
            actions=zeros((capacity, action_size), jnp.float32),
            rewards=zeros((capacity,), jnp.float32),
            costs=zeros((capacity, n_costs), jnp.float32),
            next_observations=zeros((capacity, obs_size), jnp.float32),
            discounts=zeros((capacity,), jnp.float32),
            position=jnp.zeros((), jnp.int32),
            size=jnp.zeros((), jnp.int32),
        )

    def add(self, transitions: ModelTransitions) -> ModelBuffer:
        """The buffer with ``transitions`` (any leading axes, flattened) written over
        its oldest rows."""
        capacity = self.rewards.shape[0]
        count = transitions.rewards.size
        rows = (self.position + jnp.arange(count)) % capacity

        def write(stored: jax.Array, new: jax.Array) -> jax.Array:
            return stored.at[rows].set(new.reshape(count, *stored.shape[1:]).astype(stored.dtype))

        return self.replace(
            observations=write(self.observations, transitions.observations),
            actions=write(self.actions, transitions.actions),
            rewards=write(self.rewards, transitions.rewards),
            costs=write(self.costs, transitions.costs),
            next_observations=write(self.next_observations, transitions.next_observations),
            discounts=write(self.discounts, transitions.discounts),
            position=(self.position + count) % capacity,
            size=jnp.minimum(self.size + count, capacity),
        )

    def sample(self, key: jax.Array, count: int) -> Batch:
        """``count`` transitions drawn uniformly from the filled rows."""
        rows = jax.random.randint(key, (count,), 0, jnp.maximum(self.size, 1))
        return Batch(
            observations=self.observations[rows],
            actions=self.actions[rows],
            rewards=self.rewards[rows],
            costs=self.costs[rows],
            next_observations=self.next_observations[rows],
            terminals=self.discounts[rows] == 0.0,
            discounts=self.discounts[rows],
        )


@struct.dataclass
class ModelState:
    """The traced part of a model: the elites' parameters and the reward scaling."""

    params: Any  # DynamicsParams, leading member axis
    reward_shift: jax.Array  # []
    reward_scale: jax.Array  # []

    @classmethod
    def of(cls, model: ModelHandle) -> ModelState:
        return cls(
            params=model.params,
            reward_shift=jnp.asarray(model.reward_shift, jnp.float32),
            reward_scale=jnp.asarray(model.reward_scale, jnp.float32),
        )


def uncertainty_penalty(dynamics: Dynamics, params: DynamicsParams, observation, action):
    """MOPO's ``u(s, a) = max_i ||σ_i(s, a)||``: the largest over the members of the norm
    of the predicted standard deviation of the learned targets, in normalized units
    (targets constant in the data are left out). One observation (raw) and action (in
    [-1, 1])."""
    predictions = jax.vmap(dynamics.predict, in_axes=(0, None, None, None))(
        params.networks, params, observation, action
    )
    learned = 1.0 - params.target_fixed.astype(jnp.float32)
    norms = jnp.sqrt(jnp.sum(jnp.square(jnp.exp(predictions.log_std)) * learned, axis=-1))
    return jnp.max(norms)


def _plant_action(params: DynamicsParams, action: jax.Array) -> jax.Array:
    return params.action_low + (action + 1.0) * 0.5 * (params.action_high - params.action_low)


def _policy_action(params: DynamicsParams, plant: jax.Array) -> jax.Array:
    span = jnp.where(
        params.action_high > params.action_low, params.action_high - params.action_low, 1.0
    )
    return 2.0 * (plant - params.action_low) / span - 1.0


def rollout(
    model: ModelHandle,
    act: Any,
    policy_params: Any,
    start: jax.Array,
    key: jax.Array,
    horizon: int,
    penalty_coef: float | jax.Array,
    discount: float,
) -> ModelTransitions:
    """One model rollout of ``horizon`` steps from the raw observation ``start`` (a
    ``lax.scan``): the policy's stochastic action (``act(policy_params, observation, key,
    deterministic=False)``), repaired by the shield in plant units when the model has
    constraints (the previous action unknown at the start), one random elite's sampled
    step, the reward scaled and penalized. After a terminal or non-finite prediction the
    rollout starts again from ``start``.

    Returns:
        :class:`ModelTransitions` with a leading ``[horizon]`` axis.
    """
    dynamics, params = model.dynamics, model.params
    n_members = params.n_members
    action_size = dynamics.layout.action_size

    def body(carry, step_key):
        observation, previous = carry
        act_key, member_key, model_key = jax.random.split(step_key, 3)
        proposed = act(policy_params, observation, act_key, deterministic=False)
        action, overridden = proposed, jnp.zeros((), bool)
        if model.constraints is not None:
            safe, report = shield(
                model.constraints, observation, _plant_action(params, proposed), previous
            )
            action = jnp.clip(_policy_action(params, safe), -1.0, 1.0)
            overridden = report.overridden
            previous = safe
        member = jax.random.randint(member_key, (), 0, n_members)
        # Every member's prediction is made once: the step follows the drawn one and the
        # penalty reads all of them (the same computation, merged by the compiler).
        predicted = dynamics.step(params, observation, action, model_key, member)
        next_observation, reward = predicted.next_observation, predicted.reward
        costs, done = predicted.costs, predicted.done
        penalty = uncertainty_penalty(dynamics, params, observation, action)
        finite = jnp.all(jnp.isfinite(next_observation)) & jnp.isfinite(reward)
        finite = finite & jnp.all(jnp.isfinite(costs)) & jnp.isfinite(penalty)
        reward = (reward + model.reward_shift) * model.reward_scale - penalty_coef * penalty
        ended = done | ~finite
        transition = ModelTransitions(
            observations=observation,
            actions=action,
            rewards=jnp.where(finite, reward, 0.0),
            costs=jnp.where(finite, costs, 0.0),
            next_observations=jnp.where(finite, next_observation, observation),
            discounts=jnp.where(ended, 0.0, discount).astype(jnp.float32),
            penalties=jnp.where(finite, penalty, 0.0),
            overridden=overridden,
        )
        restart_previous = jnp.full((action_size,), jnp.nan, jnp.float32)
        carry = (
            jnp.where(ended, start, next_observation),
            jnp.where(ended, restart_previous, previous),
        )
        return carry, transition

    previous = jnp.full((action_size,), jnp.nan, jnp.float32)
    _, transitions = jax.lax.scan(body, (start, previous), jax.random.split(key, horizon))
    return transitions


def mixed_batch(real: Batch, buffer: ModelBuffer, key: jax.Array, real_ratio: float) -> Batch:
    """The learner's batch: ``round(real_ratio * B)`` rows of the real batch and the rest
    drawn from the model buffer (``B`` the real batch's size)."""
    size = real.rewards.shape[0]
    n_real = round(real_ratio * size)
    model = buffer.sample(key, size - n_real)
    head = jax.tree.map(lambda leaf: leaf[:n_real], real)
    return jax.tree.map(lambda a, b: jnp.concatenate([a, b.astype(a.dtype)], axis=0), head, model)
