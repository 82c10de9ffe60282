"""MOPO (Yu et al., NeurIPS 2020): model-based offline policy optimization on the plant
model's ensemble, and MOPO-Lag, its Lagrangian variant for cost limits.

Every update:

1. **Rollouts.** The first ``rollout_starts`` observations of the real batch (uniform
   draws from the dataset) start rollouts of ``rollout_horizon`` steps under the current
   policy (its stochastic action, as MOPO's), each step in an elite member drawn at random
   (:func:`rollout`). With a shield (the plant's compiled constraints) every action is
   repaired in plant units before the model sees it, as on the plant. A rollout that the
   model ends in a terminal state, or whose prediction is not finite, starts again from its
   dataset state.
2. **Pessimism.** The model's reward is penalized by ``λ u(s, a)``, ``u`` the largest over
   members of the norm of the predicted standard deviation (MOPO's ``max_i ||Σ_i||_F``,
   its default "learned variance" penalty), in normalized units: each target divided by
   its spread in the data, so ``u`` is scale-free like the ``std``-scaled rewards it is
   subtracted from (MOPO's targets are raw). The model's rewards are first put in the
   learner's units by the run's reward scaling (``ModelHandle.reward_shift``/``scale``).
   Costs (known channels computed, the others predicted) are kept unpenalized: the
   pessimism of MOPO-Lag's cost critics comes from their own maximum.
3. **Buffer.** The transitions enter a circular buffer of ``buffer_size``.
4. **Learner.** A batch of ``real_ratio`` real transitions and the rest from the buffer
   trains the learner: SAC for MOPO (the paper's), TD3BC-Lag for MOPO-Lag (cost critics,
   PID multipliers on the episode cost limits, ``td3bc_lag.py``).

Defaults are MOPO's (its ``base_mopo`` configuration): ``h = 5``, ``λ = 1``, real ratio
0.05, and its rate of model data, 50 000 rollouts per 1 000 updates, as 50 starts per
update. Where MOPO keeps five epochs of rollouts (1.25 M transitions) the buffer holds
``buffer_size`` (50 000 by default, the last 200 updates' rollouts): a state vmapped over
seeds on a CPU cannot carry a million transitions per seed.

The model is handed in (:class:`ModelHandle`: the ensemble's pure functions, its elites'
parameters, the reward scaling and optionally the shield's constraints). The pure
functions and the constraints are closed over; the elites' parameters and the reward
scaling are traced leaves of the state (:class:`ModelState`), so one compiled program
trains agents of several datasets, each with its own model, in one ``vmap``
(:func:`with_model` puts another model in a state). Built without a model
(``model=None``) the algorithm initializes and acts (a saved policy needs no model) but
refuses to update, naming what it needs.

The model's side (the handle, the rollouts, the buffer and the mixed batch) lives in
``mopo_rollouts.py``; its names are importable from here as well.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from neorl_industrial.core.agents import sac, td3bc, td3bc_lag
from neorl_industrial.core.agents.mopo_rollouts import (
    ModelBuffer,
    ModelHandle,
    ModelState,
    ModelTransitions,
    mixed_batch,
    rollout,
    uncertainty_penalty,
)
from neorl_industrial.core.agents.networks import FrozenConfig, check_positive_int
from neorl_industrial.core.agents.types import Algorithm, Batch, Metrics

__all__ = [
    "MOPOBCConfig",
    "MOPOConfig",
    "MOPOLagConfig",
    "MOPOState",
    "ModelBuffer",
    "ModelHandle",
    "ModelState",
    "ModelTransitions",
    "RolloutConfig",
    "make_mopo",
    "make_mopo_bc",
    "make_mopo_lag",
    "mixed_batch",
    "rollout",
    "uncertainty_penalty",
    "with_model",
]


@dataclasses.dataclass(frozen=True)
class RolloutConfig(FrozenConfig):
    """The model-based fields MOPO and MOPO-Lag share (MOPO's defaults).

    Attributes:
        rollout_horizon: steps ``h`` of every model rollout.
        penalty_coef: ``λ`` of the reward penalty ``λ u(s, a)``.
        real_ratio: share of real transitions in the learner's batch.
        rollout_starts: rollouts started per update (from the real batch's first rows).
        buffer_size: transitions the model buffer keeps (the newest).
    """

    rollout_horizon: int = 5
    penalty_coef: float = 1.0
    real_ratio: float = 0.05
    rollout_starts: int = 50
    buffer_size: int = 50_000

    def check_rollout(self) -> None:
        """Raises ``ValueError`` naming a model-based field that does not fit."""
        check_positive_int(self, "rollout_horizon", "rollout_starts", "buffer_size")
        if not self.penalty_coef >= 0.0:
            raise ValueError(f"penalty_coef: must be >= 0, got {self.penalty_coef}")
        if not 0.0 <= self.real_ratio <= 1.0:
            raise ValueError(f"real_ratio: must lie in [0, 1], got {self.real_ratio}")
        if self.buffer_size < self.rollout_starts * self.rollout_horizon:
            raise ValueError(
                f"buffer_size: {self.buffer_size} cannot hold one update's rollouts "
                f"(rollout_starts x rollout_horizon = "
                f"{self.rollout_starts * self.rollout_horizon})"
            )


@dataclasses.dataclass(frozen=True)
class MOPOConfig(sac.SACConfig, RolloutConfig):
    """Hyperparameters of MOPO: SAC's (``gamma`` is the discount of the model's
    transitions and must be the one the real batches are sampled with) and the
    model-based ones (:class:`RolloutConfig`)."""

    def __post_init__(self) -> None:
        sac.SACConfig.__post_init__(self)
        self.check_rollout()

    def learner_config(self) -> sac.SACConfig:
        """SAC's config of the learner: a batch's ``discounts`` carry γ already, so the
        learner's own ``gamma`` is 1."""
        values = {
            field.name: getattr(self, field.name) for field in dataclasses.fields(sac.SACConfig)
        }
        return sac.SACConfig.create(**{**values, "gamma": 1.0})


@dataclasses.dataclass(frozen=True)
class MOPOLagConfig(td3bc_lag.TD3BCLagConfig, RolloutConfig):
    """Hyperparameters of MOPO-Lag: TD3BC-Lag's (the learner; ``discount`` is that of the
    model's transitions) and the model-based ones (:class:`RolloutConfig`)."""

    def __post_init__(self) -> None:
        td3bc_lag.TD3BCLagConfig.__post_init__(self)
        self.check_rollout()

    def learner_config(self) -> td3bc_lag.TD3BCLagConfig:
        values = {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(td3bc_lag.TD3BCLagConfig)
        }
        return td3bc_lag.TD3BCLagConfig.create(**values)


@dataclasses.dataclass(frozen=True)
class MOPOBCConfig(td3bc.TD3BCConfig, RolloutConfig):
    """Hyperparameters of MOPO-BC: TD3+BC's (the learner) and the model-based ones
    (:class:`RolloutConfig`); ``discount`` is that of the model's transitions (the real
    batches carry theirs)."""

    discount: float = 0.99

    def __post_init__(self) -> None:
        td3bc.TD3BCConfig.__post_init__(self)
        self.check_rollout()
        if not 0.0 < self.discount <= 1.0:
            raise ValueError(f"discount: must lie in (0, 1], got {self.discount}")

    def learner_config(self) -> td3bc.TD3BCConfig:
        values = {
            field.name: getattr(self, field.name) for field in dataclasses.fields(td3bc.TD3BCConfig)
        }
        return td3bc.TD3BCConfig.create(**values)


@struct.dataclass
class MOPOState:
    """The learner's state, the model buffer and the model (None in a template built
    without one). ``policy`` is the learner's (what an Agent saves and exports), and
    ``replace(policy=...)`` sets it there."""

    learner: Any
    buffer: ModelBuffer
    model: ModelState | None = None

    @property
    def policy(self) -> Any:
        return self.learner.policy

    @property
    def step(self) -> jax.Array:
        return self.learner.step


def _replace_state(state: MOPOState, **changes: Any) -> MOPOState:
    """``state`` with ``changes``; ``policy`` goes to the learner's state."""
    if "policy" in changes:
        learner = changes.get("learner", state.learner)
        changes["learner"] = learner.replace(policy=changes.pop("policy"))
    return dataclasses.replace(state, **changes)


# flax's ``struct.dataclass`` sets its own ``replace``; MOPO's routes ``policy``.
MOPOState.replace = _replace_state


def with_model(state: MOPOState, model: ModelHandle) -> MOPOState:
    """``state`` stepping ``model``'s elites with its reward scaling (a model of the same
    shapes as the algorithm's: the compiled program is reused)."""
    return state.replace(model=ModelState.of(model))


def _require(model: ModelHandle | None, name: str) -> ModelHandle:
    if model is None:
        raise ValueError(
            f"{name}: training needs a fitted plant model (a ModelHandle: the ensemble's "
            "dynamics and elite parameters); build the algorithm with model=... (e.g. from "
            "`neorl-industrial model fit`); acting needs none"
        )
    return model


class Learner(NamedTuple):
    """The agent a model-based algorithm trains, and how.

    Attributes:
        algorithm: its own algorithm, whose ``init`` and ``act`` the model-based one keeps.
        update: ``update(state, mixed, key, real) -> (state, metrics)``: one step on MOPO's
            mixed batch, ``real`` the whole real batch.
        n_costs: the cost channels it learns (the buffer's when there is no model).
    """

    algorithm: Algorithm
    update: Callable[[Any, Batch, jax.Array, Batch], tuple[Any, Metrics]]
    n_costs: int = 0


def _model_based(
    name: str,
    config: RolloutConfig,
    learner: Learner,
    obs_size: int,
    action_size: int,
    discount: float,
    model: ModelHandle | None,
) -> Algorithm:
    """``learner`` trained on MOPO's mix of real and penalized model transitions, those of
    the model rolled out with ``discount``."""
    if model is not None:
        layout = model.dynamics.layout
        if (layout.observation_size, layout.action_size) != (obs_size, action_size):
            raise ValueError(
                f"model: predicts observations of {layout.observation_size} and actions of "
                f"{layout.action_size} features, the agent has {obs_size} and {action_size}"
            )

    # Without a model the state is a template (a saved policy's shapes) that cannot train.
    n_costs = learner.n_costs if model is None else model.dynamics.layout.n_costs

    def init(key: jax.Array) -> MOPOState:
        return MOPOState(
            learner=learner.algorithm.init(key),
            buffer=ModelBuffer.empty(config.buffer_size, obs_size, action_size, n_costs),
            model=None if model is None else ModelState.of(model),
        )

    def update(state: MOPOState, batch: Batch, key: jax.Array) -> tuple[MOPOState, Metrics]:
        handle = _require(model, name)
        if state.model is None:
            raise ValueError(f"{name}: the state has no model; put one in with with_model")
        handle = handle._replace(
            params=state.model.params,
            reward_shift=state.model.reward_shift,
            reward_scale=state.model.reward_scale,
        )
        if batch.observations.shape[0] < config.rollout_starts:
            raise ValueError(
                f"rollout_starts: {config.rollout_starts} starts need batches of at least as "
                f"many rows, got {batch.observations.shape[0]}"
            )
        rollout_key, mix_key, learner_key = jax.random.split(key, 3)
        starts = batch.observations[: config.rollout_starts]

        def one(start: jax.Array, start_key: jax.Array) -> ModelTransitions:
            return rollout(
                handle,
                learner.algorithm.act,
                state.learner.policy,
                start,
                start_key,
                config.rollout_horizon,
                config.penalty_coef,
                discount,
            )

        transitions = jax.vmap(one)(starts, jax.random.split(rollout_key, config.rollout_starts))
        buffer = state.buffer.add(transitions)
        mixed = mixed_batch(batch, buffer, mix_key, config.real_ratio)
        learner_state, metrics = learner.update(state.learner, mixed, learner_key, batch)
        metrics = {
            **metrics,
            "model_penalty": jnp.mean(transitions.penalties),
            "model_reward": jnp.mean(transitions.rewards),
            "model_cost": jnp.mean(jnp.sum(transitions.costs, axis=-1)),
            "model_overridden": jnp.mean(transitions.overridden.astype(jnp.float32)),
            "model_ended": jnp.mean((transitions.discounts == 0.0).astype(jnp.float32)),
        }
        return state.replace(learner=learner_state, buffer=buffer), metrics

    return Algorithm(init=init, update=update, act=learner.algorithm.act)


def make_mopo(
    config: MOPOConfig, obs_size: int, action_size: int, model: ModelHandle | None = None
) -> Algorithm:
    """MOPO as ``Algorithm(init, update, act)``: SAC on real and penalized model data."""
    learner = sac.make_sac(config.learner_config(), obs_size, action_size)

    def learner_update(state: Any, batch: Batch, key: jax.Array, real: Batch):
        del real  # SAC's actor and critics learn from the mixed batch alike
        sac_batch = sac.Batch(
            observations=batch.observations,
            actions=batch.actions,
            rewards=batch.rewards,
            next_observations=batch.next_observations,
            discounts=batch.discounts,
        )
        return learner.update(state, sac_batch, key)

    return _model_based(
        "mopo", config, Learner(learner, learner_update), obs_size, action_size, config.gamma, model
    )


def make_mopo_lag(
    config: MOPOLagConfig, obs_size: int, action_size: int, model: ModelHandle | None = None
) -> Algorithm:
    """MOPO-Lag as ``Algorithm(init, update, act)``: TD3BC-Lag on real and penalized
    model data, the model's costs included."""
    learner = td3bc_lag.make_td3bc_lag(config.learner_config(), obs_size, action_size)
    if model is not None and model.dynamics.layout.n_costs != len(config.cost_limits):
        raise ValueError(
            f"cost_limits: {len(config.cost_limits)} limits for a model of "
            f"{model.dynamics.layout.n_costs} cost channels"
        )

    def learner_update(state: Any, batch: Batch, key: jax.Array, real: Batch):
        del real  # TD3BC-Lag learns from the mixed batch alike
        return learner.update(state, batch, key)

    return _model_based(
        "mopo-lag",
        config,
        Learner(learner, learner_update, len(config.cost_limits)),
        obs_size,
        action_size,
        config.discount,
        model,
    )


def make_mopo_bc(
    config: MOPOBCConfig, obs_size: int, action_size: int, model: ModelHandle | None = None
) -> Algorithm:
    """MOPO-BC as ``Algorithm(init, update, act)``: TD3+BC whose critics learn from MOPO's
    mix of real and penalized model transitions and whose actor takes TD3+BC's step on the
    whole real batch, ``-λ Q(s, π(s)) + (π(s) - a)²`` at logged states and actions.

    The behaviour-cloning term is the regularizer of the model-based family's
    behaviour-regularized members (COMBO and MOBILE keep the policy near the data through
    the critic; here, as in TD3+BC, through the actor): on model rows its target would be
    the policy's own recent action, so the actor sees the logged rows only, and the model's
    transitions reach it through the critics that judge its actions. The rollouts follow
    the deterministic policy; the model's sampled steps spread them.
    """
    learner_config = config.learner_config()
    learner = td3bc.make_td3bc(learner_config, obs_size, action_size)
    networks = td3bc.make_networks(learner_config, action_size)

    def learner_update(state: Any, batch: Batch, key: jax.Array, real: Batch):
        observations, next_observations = state.policy.normalize_batch(batch)
        noise_key, critic_key = td3bc.split_for_critics(learner_config, key)
        next_actions = td3bc.target_actions(
            networks, learner_config, state, next_observations, noise_key
        )
        state, critic_loss, q = td3bc.critic_step(
            networks, state, batch, observations, next_observations, next_actions, critic_key
        )
        real_observations = state.policy.normalizer(real.observations)
        step = jax.lax.cond(
            td3bc.is_policy_update(learner_config, state),
            lambda _: td3bc.policy_step(
                networks, learner_config, state, real_observations, real.actions
            ),
            lambda _: td3bc.held_policy_step(state),
            None,
        )
        metrics = {"critic_loss": critic_loss, "actor_loss": step.loss, "q_mean": jnp.mean(q)}
        return td3bc.apply_policy_step(state, step), metrics

    return _model_based(
        "mopo-bc",
        config,
        Learner(learner, learner_update),
        obs_size,
        action_size,
        config.discount,
        model,
    )
