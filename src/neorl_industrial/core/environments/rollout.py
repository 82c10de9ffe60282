"""Batched rollouts: ``vmap`` over environments, ``lax.scan`` over time."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypedDict, Unpack

import jax
import jax.numpy as jnp
from flax import struct

from neorl_industrial.core.environments.base import Environment
from neorl_industrial.core.safety import shield, violations
from neorl_industrial.core.utils import random as fast_random

#: ``policy(policy_params, observation, key) -> action`` for one environment.
Policy = Callable[[Any, jax.Array, jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class BatchPolicy:
    """A policy that acts on a whole batch in one call:
    ``act(policy_params, observations [n, ...], key) -> actions [n, ...]``, one key per
    step for the batch. :func:`rollout` calls it once a step instead of ``vmap``-ping a
    :data:`Policy` over per-environment keys (the split alone is a threefry hash per
    environment and step)."""

    act: Callable[[Any, jax.Array, jax.Array], jax.Array]


@struct.dataclass
class Transitions:
    """Per-step data of a rollout, time-major: ``[n_steps, n_envs, ...]``."""

    observation: jax.Array
    action: jax.Array
    reward: jax.Array
    cost: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    next_observation: jax.Array  # the true next observation (the final one on a reset)


@struct.dataclass
class ShieldStats:
    """Per-environment counts of a rollout under constraints, over all its steps.

    ``violations`` counts the steps whose *proposed* action broke each hard constraint;
    ``applied_violations`` re-checks the action that reached the plant, independently of
    the shield's own report (zero whenever the shield was on and a safe action existed).
    """

    decisions: jax.Array  # [n_envs] int32 steps checked
    overrides: jax.Array  # [n_envs] int32 steps whose action the shield changed
    projections: jax.Array  # [n_envs] int32 overrides repaired by projection
    fallbacks: jax.Array  # [n_envs] int32 overrides that used the fallback
    infeasible: jax.Array  # [n_envs] int32 steps where not even the fallback was safe
    violations: jax.Array  # [n_envs, n_hard] int32 proposed action broke the constraint
    applied_violations: jax.Array  # [n_envs, n_hard] int32 applied action broke it
    episode_overrides_sum: jax.Array  # [n_envs] int32 overrides within completed episodes

    def override_rate(self) -> jax.Array:
        """Fraction of all steps of all environments whose action was overridden."""
        return self.overrides.sum() / jnp.maximum(self.decisions.sum(), 1)


@struct.dataclass
class RolloutResult:
    """Summary of a rollout, per environment."""

    final_state: Any
    final_observation: jax.Array
    total_reward: jax.Array  # [n_envs] over all steps
    total_cost: jax.Array  # [n_envs, n_costs] over all steps
    episodes: jax.Array  # [n_envs] completed episodes
    episode_return_sum: jax.Array  # [n_envs] sum of returns of completed episodes
    episode_cost_sum: jax.Array  # [n_envs, n_costs] sum of costs of completed episodes
    invalid_actions: jax.Array  # [n_envs] steps whose action was replaced
    transitions: Transitions | None = None
    safety: ShieldStats | None = None  # with ``constraints``: what the shield saw and did

    def mean_episode_return(self) -> jax.Array:
        """Mean return over all completed episodes of all environments."""
        return self.episode_return_sum.sum() / jnp.maximum(self.episodes.sum(), 1)

    def mean_episode_cost(self) -> jax.Array:
        """Mean episode cost per cost channel over all completed episodes."""
        return self.episode_cost_sum.sum(0) / jnp.maximum(self.episodes.sum(), 1)


class RolloutOptions(TypedDict, total=False):
    """The optional settings of :func:`rollout`, passed as keywords (all static)."""

    #: Also return the per-step :class:`Transitions` (memory grows with
    #: ``n_steps * n_envs * observation_size``).
    record: bool
    #: Compiled hard constraints (``core.safety``). Every proposed action is checked
    #: against them, with the previous applied action of its environment (zero at the
    #: start of an episode) for rate limits.
    constraints: Any
    #: With ``constraints``, pass every action through the safety shield (the default);
    #: ``False`` only counts the violations of the proposed actions.
    shield_actions: bool


@struct.dataclass
class _Totals:
    """The running sums of a rollout, per environment (part of the scan's carry)."""

    reward: jax.Array  # [n_envs] over all steps
    cost: jax.Array  # [n_envs, n_costs] over all steps
    episode_reward: jax.Array  # [n_envs] of the running episode
    episode_cost: jax.Array  # [n_envs, n_costs] of the running episode
    episodes: jax.Array  # [n_envs] completed episodes
    return_sum: jax.Array  # [n_envs] returns of completed episodes
    cost_sum: jax.Array  # [n_envs, n_costs] costs of completed episodes
    invalid: jax.Array  # [n_envs] steps whose action was replaced

    @classmethod
    def zeros(cls, n_envs: int, n_costs: int) -> _Totals:
        zeros = jnp.zeros((n_envs,), jnp.float32)
        zero_costs = jnp.zeros((n_envs, n_costs), jnp.float32)
        counts = jnp.zeros((n_envs,), jnp.int32)
        return cls(
            reward=zeros,
            cost=zero_costs,
            episode_reward=zeros,
            episode_cost=zero_costs,
            episodes=counts,
            return_sum=zeros,
            cost_sum=zero_costs,
            invalid=counts,
        )

    def after(self, ts: Any, done: jax.Array) -> _Totals:
        """These sums after the batch step ``ts`` (``done``: its finished environments);
        finished episodes move into the completed sums, their running sums restart."""
        episode_reward = self.episode_reward + ts.reward
        episode_cost = self.episode_cost + ts.cost
        return _Totals(
            reward=self.reward + ts.reward,
            cost=self.cost + ts.cost,
            episode_reward=jnp.where(done, 0.0, episode_reward),
            episode_cost=jnp.where(done[:, None], 0.0, episode_cost),
            episodes=self.episodes + done,
            return_sum=self.return_sum + jnp.where(done, episode_reward, 0.0),
            cost_sum=self.cost_sum + jnp.where(done[:, None], episode_cost, 0.0),
            invalid=self.invalid + ts.info.action_invalid,
        )


@struct.dataclass
class _SafetyCounts:
    """The shield's counts so far (part of the scan's carry): the :class:`ShieldStats`
    and the overrides within each running episode."""

    stats: ShieldStats
    episode_overrides: jax.Array  # [n_envs] int32

    @classmethod
    def zeros(cls, n_envs: int, n_hard: int) -> _SafetyCounts:
        counts = jnp.zeros((n_envs,), jnp.int32)
        zero_hard = jnp.zeros((n_envs, n_hard), jnp.int32)
        stats = ShieldStats(
            decisions=counts,
            overrides=counts,
            projections=counts,
            fallbacks=counts,
            infeasible=counts,
            violations=zero_hard,
            applied_violations=zero_hard,
            episode_overrides_sum=counts,
        )
        return cls(stats=stats, episode_overrides=counts)

    def after_decision(
        self,
        overridden: jax.Array,
        projected: jax.Array,
        fallback: jax.Array,
        infeasible: jax.Array,
        proposed_violations: jax.Array,
        applied_violations: jax.Array,
    ) -> _SafetyCounts:
        """These counts after one decision per environment: what the shield did, the
        hard constraints the proposed action broke and those the applied one broke."""
        stats = self.stats.replace(
            decisions=self.stats.decisions + 1,
            overrides=self.stats.overrides + overridden,
            projections=self.stats.projections + projected,
            fallbacks=self.stats.fallbacks + fallback,
            infeasible=self.stats.infeasible + infeasible,
            violations=self.stats.violations + proposed_violations,
            applied_violations=self.stats.applied_violations + applied_violations,
        )
        return _SafetyCounts(stats=stats, episode_overrides=self.episode_overrides + overridden)

    def after_episodes(self, done: jax.Array) -> _SafetyCounts:
        """These counts after the batch step whose finished environments are ``done``."""
        episode_overrides = self.episode_overrides
        stats = self.stats.replace(
            episode_overrides_sum=self.stats.episode_overrides_sum
            + jnp.where(done, episode_overrides, 0)
        )
        return _SafetyCounts(stats=stats, episode_overrides=jnp.where(done, 0, episode_overrides))


def rollout(
    key: jax.Array,
    env: Environment,
    params: Any,
    policy: Policy | BatchPolicy,
    n_envs: int,
    n_steps: int,
    *,
    policy_params: Any = None,
    **options: Unpack[RolloutOptions],
) -> RolloutResult:
    """Runs ``n_envs`` environments for ``n_steps`` steps each under ``policy``.

    Pure and jit-compatible (``env``, ``policy``, ``n_envs``, ``n_steps`` and the static
    ``options`` are static). Environments auto-reset at the end of an episode; the reset
    is computed only on steps where some environment finishes.

    Args:
        key: PRNG key for resets, environment noise and the policy.
        env: the environment.
        params: environment parameters shared by all copies.
        policy: pure function ``(policy_params, observation, key) -> action`` for one
            environment, vmapped over environments with a key each; or a
            :class:`BatchPolicy` called once a step on the whole batch.
        n_envs: number of environments stepped together.
        n_steps: number of steps.
        policy_params: passed to ``policy`` unchanged.
        **options: :class:`RolloutOptions`: ``record`` (default False), ``constraints``
            (default None) and ``shield_actions`` (default True).

    Returns:
        A :class:`RolloutResult` with per-environment totals, with ``record`` the
        transitions, and with ``constraints`` the :class:`ShieldStats`.
    """
    record, constraints, shield_actions = _settings(options)
    reset_key, loop_key = jax.random.split(key)
    states, timestep = env.reset_batch(reset_key, n_envs, params)
    batched_policy = _batch_policy(policy, n_envs)
    guard = _make_guard(constraints, shield_actions)

    def one_step(carry, step_key):
        states, observation, prev_action, totals, safety = carry
        policy_key, env_key = jax.random.split(step_key)
        proposed = batched_policy(policy_params, observation, policy_key)
        actions, safety = guard(observation, proposed, prev_action, safety)
        states, ts = env.step_batch(env_key, states, actions, params)
        done = ts.done
        totals = totals.after(ts, done)
        if safety is not None:
            safety = safety.after_episodes(done)
            # A new episode starts from "no previous action" (only rate limits read it).
            prev_action = jnp.where(
                done.reshape((-1,) + (1,) * (actions.ndim - 1)), jnp.zeros_like(actions), actions
            )
        out = _transitions(observation, actions, ts) if record else None
        return (states, ts.observation, prev_action, totals, safety), out

    safety = None
    if constraints is not None:
        safety = _SafetyCounts.zeros(n_envs, len(constraints.names))
    first_action = jnp.zeros((n_envs, *_action_shape(env)), _action_dtype(env))
    (states, observation, _, totals, safety), transitions = jax.lax.scan(
        one_step,
        (states, timestep.observation, first_action, _Totals.zeros(n_envs, env.n_costs), safety),
        jax.random.split(loop_key, n_steps),
    )
    return RolloutResult(
        final_state=states,
        final_observation=observation,
        total_reward=totals.reward,
        total_cost=totals.cost,
        episodes=totals.episodes,
        episode_return_sum=totals.return_sum,
        episode_cost_sum=totals.cost_sum,
        invalid_actions=totals.invalid,
        transitions=transitions,
        safety=None if safety is None else safety.stats,
    )


def _batch_policy(policy: Policy | BatchPolicy, n_envs: int) -> Callable:
    """``act(policy_params, observations, key)`` for the batch: a :class:`BatchPolicy`'s
    own, or ``policy`` vmapped over ``n_envs`` keys split from ``key``."""
    if isinstance(policy, BatchPolicy):
        return policy.act
    per_env = jax.vmap(policy, in_axes=(None, 0, 0))
    return lambda params, observations, key: per_env(
        params, observations, jax.random.split(key, n_envs)
    )


def _settings(options: RolloutOptions) -> tuple[bool, Any, bool]:
    """``record``, ``constraints`` and ``shield_actions`` of :func:`rollout`'s keywords,
    defaults filled in; an unknown keyword is refused as a call with it would be."""
    unknown = sorted(set(options) - set(RolloutOptions.__annotations__))
    if unknown:
        raise TypeError(f"rollout() got unexpected keyword arguments {unknown}")
    return (
        options.get("record", False),
        options.get("constraints"),
        options.get("shield_actions", True),
    )


def _transitions(observation: jax.Array, actions: jax.Array, ts: Any) -> Transitions:
    """The recorded data of one batch step from ``observation`` under ``actions``."""
    return Transitions(
        observation=observation,
        action=actions,
        reward=ts.reward,
        cost=ts.cost,
        terminated=ts.terminated,
        truncated=ts.truncated,
        next_observation=ts.info.final_observation,
    )


def _action_shape(env: Environment) -> tuple[int, ...]:
    return () if env.discrete else (env.action_size,)


def _action_dtype(env: Environment) -> Any:
    return jnp.int32 if env.discrete else jnp.float32


def _make_guard(constraints: Any, shield_actions: bool) -> Callable:
    """``guard(observation, proposed, prev_action, safety) -> (actions, safety)`` for a
    batch: the identity without constraints; otherwise the shield (or only the check)
    with its counts accumulated into ``safety`` (:class:`_SafetyCounts`)."""
    if constraints is None:
        return lambda observation, proposed, prev_action, safety: (proposed, safety)

    # Both take the whole batch: the shield repairs only when some action needs it.
    check = violations
    batched_shield = shield

    def guard(observation, proposed, prev_action, safety):
        if shield_actions:
            actions, report = batched_shield(constraints, observation, proposed, prev_action)
            proposed_violations = report.violated
            overridden = report.overridden
            projected, fallback, infeasible = report.projected, report.fallback, report.infeasible
        else:
            actions = proposed
            proposed_violations = check(constraints, observation, proposed, prev_action)
            overridden = projected = fallback = infeasible = jnp.zeros(
                proposed.shape[:1], jnp.bool_
            )
        applied_violations = check(constraints, observation, actions, prev_action)
        safety = safety.after_decision(
            overridden, projected, fallback, infeasible, proposed_violations, applied_violations
        )
        return actions, safety

    return guard


def scan_single(
    key: jax.Array,
    env: Environment,
    params: Any,
    policy: Policy | BatchPolicy,
    n_steps: int,
    *,
    policy_params: Any = None,
) -> tuple[Any, jax.Array]:
    """Runs one environment (no batch axis) for ``n_steps``; returns the final state and
    the total reward. The single-environment counterpart of :func:`rollout`."""
    reset_key, policy_key, env_key = jax.random.split(key, 3)
    state, timestep = env.reset(reset_key, params)
    # All randomness is drawn ahead in two vectorized calls; the loop is deterministic.
    samples = env.presample(env_key, n_steps)
    policy_keys = jax.random.split(policy_key, n_steps)
    if isinstance(policy, BatchPolicy):
        batch_act = policy.act

        def policy(params, observation, key):
            return batch_act(params, observation[None], key)[0]

    def one_step(carry, inputs):
        state, observation, total = carry
        sample, step_policy_key = inputs
        action = policy(policy_params, observation, step_policy_key)
        state, ts = env.step_presampled(sample, state, action, params)
        return (state, ts.observation, total + ts.reward), None

    (state, _, total), _ = jax.lax.scan(
        one_step,
        (state, timestep.observation, jnp.zeros((), jnp.float32)),
        (samples, policy_keys),
    )
    return state, total


def uniform_random_policy(env: Environment) -> Policy:
    """A policy drawing uniform actions in the environment's action space."""
    if env.discrete:
        n = env.num_actions

        def discrete_policy(_params, _observation, key):
            return jax.random.randint(key, (), 0, n)

        return discrete_policy
    low = jnp.asarray(env.action_low)
    span = jnp.asarray(env.action_high) - low

    def continuous_policy(_params, _observation, key):
        return low + span * fast_random.uniform(key, low.shape)

    return continuous_policy


def uniform_random_batch_policy(env: Environment) -> BatchPolicy:
    """:func:`uniform_random_policy` for a whole batch: one draw of the batch's actions per
    step (the same distribution, another stream)."""
    if env.discrete:
        n = env.num_actions
        return BatchPolicy(
            lambda _params, observations, key: jax.random.randint(key, observations.shape[:1], 0, n)
        )
    low = jnp.asarray(env.action_low)
    span = jnp.asarray(env.action_high) - low
    return BatchPolicy(
        lambda _params, observations, key: (
            low + span * fast_random.uniform(key, observations.shape[:1] + low.shape)
        )
    )


def constant_policy(action: Any) -> Policy:
    """A policy that always returns ``action``."""
    action = jnp.asarray(action)

    def policy(_params, _observation, _key):
        return action

    return policy
