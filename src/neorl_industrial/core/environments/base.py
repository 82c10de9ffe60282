"""The functional environment API shared by every environment of the core.

An environment instance holds only static configuration (shapes, modes); everything that
changes or may be swept lives in PyTrees: ``params`` (traced, vmappable), ``state`` and
the :class:`TimeStep` it returns. Instances are hashable, so they can be static
arguments of ``jax.jit``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, Generic, Self, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from neorl_industrial.core.safety import ConstraintSpec
from neorl_industrial.core.utils import random as fast_random
from neorl_industrial.core.utils import tree_where

StateT = TypeVar("StateT")
ParamsT = TypeVar("ParamsT")

#: XLA:CPU's older fusion code generator: the compiler options of the environments whose
#: batched rollouts it runs faster (:attr:`Environment.older_cpu_fusion`).
OLDER_CPU_FUSION = {"xla_cpu_use_fusion_emitters": False}


@struct.dataclass
class StepInfo:
    """Information every environment returns with a step.

    Attributes:
        final_observation: the observation that ended the episode when the step auto-reset;
            otherwise equal to the returned observation.
        action_invalid: True when the action held NaN/inf (or an unknown discrete index)
            and was replaced by the environment's neutral action.
    """

    final_observation: jax.Array
    action_invalid: jax.Array

    @classmethod
    def first(cls, observation: jax.Array, **fields: Any) -> Self:
        """The info of the time step ``reset`` returns: ``observation`` is its final one
        and no action was invalid; ``fields`` are a subclass's own."""
        return cls(final_observation=observation, action_invalid=jnp.zeros((), jnp.bool_), **fields)


@struct.dataclass
class TimeStep:
    """What an environment returns after ``reset`` and ``step``."""

    observation: jax.Array
    reward: jax.Array  # float32 scalar
    cost: jax.Array  # float32 [n_costs]: per-step safety costs, 0 when safe
    terminated: jax.Array  # bool
    truncated: jax.Array  # bool
    info: StepInfo

    @property
    def done(self) -> jax.Array:
        return self.terminated | self.truncated

    @classmethod
    def first(cls, observation: jax.Array, n_costs: int, info: StepInfo) -> TimeStep:
        """The time step ``reset`` returns: no reward, no cost, not done."""
        return cls(
            observation=observation,
            reward=jnp.zeros((), jnp.float32),
            cost=jnp.zeros((n_costs,), jnp.float32),
            terminated=jnp.zeros((), jnp.bool_),
            truncated=jnp.zeros((), jnp.bool_),
            info=info,
        )


class Environment(abc.ABC, Generic[StateT, ParamsT]):
    """Base class of functional environments (gymnax-style).

    Subclasses implement :meth:`reset_env` and :meth:`step_env`; the public :meth:`step`
    adds the optional auto-reset. Batched stepping (:meth:`step_batch`) hoists the
    auto-reset to one batch-level ``lax.cond`` so the reset is only computed on the steps
    where some environment finishes, and lets subclasses draw the noise of all copies in
    one call.
    """

    #: The id of the environment's family (the registry's id of its default
    #: configuration); a class attribute: an instance is never renamed after it is built.
    name: str = "Environment"
    auto_reset: bool = True
    #: Whether this environment's batched programs run faster on the CPU with XLA's older
    #: fusion code generator (:data:`OLDER_CPU_FUSION`); measured per environment.
    older_cpu_fusion: bool = False

    # ----- static description -------------------------------------------------------
    @property
    def compiler_options(self) -> dict[str, Any]:
        """XLA options to compile this environment's batched programs with
        (``jax.jit(fn, compiler_options=env.compiler_options)``): those its rollouts run
        fastest with on this backend, measured per environment; empty where XLA's
        defaults are fastest. They change the generated code, not the results."""
        if self.older_cpu_fusion and jax.default_backend() == "cpu":
            return dict(OLDER_CPU_FUSION)
        return {}

    @property
    @abc.abstractmethod
    def observation_size(self) -> int: ...

    @property
    @abc.abstractmethod
    def action_size(self) -> int:
        """Length of a continuous action, or 1 for a discrete action index."""

    @property
    def discrete(self) -> bool:
        return False

    @property
    def num_actions(self) -> int | None:
        """Number of discrete actions, or None for continuous actions."""
        return None

    @property
    @abc.abstractmethod
    def action_low(self) -> np.ndarray: ...

    @property
    @abc.abstractmethod
    def action_high(self) -> np.ndarray: ...

    @property
    @abc.abstractmethod
    def observation_low(self) -> np.ndarray: ...

    @property
    @abc.abstractmethod
    def observation_high(self) -> np.ndarray: ...

    @property
    @abc.abstractmethod
    def cost_names(self) -> tuple[str, ...]: ...

    @property
    def n_costs(self) -> int:
        return len(self.cost_names)

    @property
    def observation_names(self) -> tuple[str, ...]:
        """A name per observation feature (constraints refer to features by name)."""
        return tuple(f"observation_{i}" for i in range(self.observation_size))

    @property
    def exogenous_names(self) -> tuple[str, ...]:
        """The observation features the actions cannot move (setpoint schedules,
        measured disturbances): a plant model may take them from a log that holds their
        future instead of predicting them. None by default."""
        return ()

    @property
    def action_names(self) -> tuple[str, ...]:
        """A name per action component."""
        return tuple(f"action_{i}" for i in range(self.action_size))

    @property
    def observation_units(self) -> tuple[str | None, ...] | None:
        """A unit per observation feature (``None``: not declared)."""
        return None

    @property
    def action_units(self) -> tuple[str | None, ...] | None:
        """A unit per action component (``None``: not declared)."""
        return None

    def default_constraints(self, params: Any = None) -> Any:
        """The plant's hard constraints and costs as a ``ConstraintSpec`` (for ``params``
        where they depend on them): here only the bounds of continuous actions;
        environments with a safety story declare more."""
        if self.discrete:
            return ConstraintSpec(name=f"{type(self).__name__}-default")
        bounds = {
            name: [float(low), float(high)]
            for name, low, high in zip(
                self.action_names, self.action_low, self.action_high, strict=True
            )
        }
        return ConstraintSpec.from_dict(
            {"name": f"{type(self).__name__}-default", "action_bounds": bounds}
        )

    def default_cost_limits(self, params: Any = None) -> dict[str, float]:
        """The default episode cost limit of each cost channel that has one: the default
        constraint spec's (for ``params``); a task whose costs a spec cannot express adds
        their limits here."""
        limits = self.default_constraints(params).cost_limits
        return {name: float(limit) for name, limit in limits.items() if name in self.cost_names}

    def compile_constraints(self, spec: Any = None) -> Any:
        """``spec`` (default: :meth:`default_constraints`) compiled for this environment's
        spaces, with features and actions resolved by name."""
        spec = self.default_constraints() if spec is None else spec
        return spec.compile(
            self.observation_size, self.action_size, self.observation_names, self.action_names
        )

    @abc.abstractmethod
    def default_params(self, **overrides: Any) -> ParamsT:
        """Traced parameters; overrides are validated on the host, naming the bad field."""

    # ----- dynamics -----------------------------------------------------------------
    @abc.abstractmethod
    def reset_env(self, key: jax.Array, params: ParamsT) -> tuple[StateT, TimeStep]: ...

    @abc.abstractmethod
    def step_env(
        self, key: jax.Array, state: StateT, action: jax.Array, params: ParamsT
    ) -> tuple[StateT, TimeStep]:
        """One step without auto-reset."""

    def reset(self, key: jax.Array, params: ParamsT | None = None) -> tuple[StateT, TimeStep]:
        return self.reset_env(key, self.default_params() if params is None else params)

    def step(
        self, key: jax.Array, state: StateT, action: jax.Array, params: ParamsT | None = None
    ) -> tuple[StateT, TimeStep]:
        """One step; with ``auto_reset`` a finished episode restarts in the same call.

        On auto-reset the returned observation is the new episode's first one and
        ``info.final_observation`` keeps the observation that ended the episode; reward,
        cost and the done flags are those of the finishing step.
        """
        params = self.default_params() if params is None else params
        step_key, reset_key = jax.random.split(key)
        state, timestep = self.step_env(step_key, state, action, params)
        return self.maybe_reset(reset_key, state, timestep, params)

    def maybe_reset(
        self, reset_key: jax.Array, state: StateT, timestep: TimeStep, params: ParamsT
    ) -> tuple[StateT, TimeStep]:
        """Applies auto-reset after a step of one environment (a no-op without it)."""
        if not self.auto_reset:
            return state, timestep

        def restart(operands):
            _, timestep = operands
            reset_state, reset_timestep = self.reset_env(reset_key, params)
            return reset_state, timestep.replace(observation=reset_timestep.observation)

        return jax.lax.cond(timestep.done, restart, lambda operands: operands, (state, timestep))

    # ----- randomness drawn ahead -----------------------------------------------------
    def presample(self, key: jax.Array, n_steps: int) -> Any:
        """The randomness of ``n_steps`` steps of one environment, drawn in one call.

        The result is scanned over (leading axis ``n_steps``) and each slice is passed to
        :meth:`step_presampled`. By default it is one key per step.
        """
        return jax.random.split(key, n_steps)

    def step_presampled(
        self, sample: Any, state: StateT, action: jax.Array, params: ParamsT
    ) -> tuple[StateT, TimeStep]:
        """:meth:`step` with its randomness taken from one slice of :meth:`presample`."""
        return self.step(sample, state, action, params)

    # ----- batched ------------------------------------------------------------------
    def reset_batch(
        self, key: jax.Array, n_envs: int, params: ParamsT | None = None
    ) -> tuple[StateT, TimeStep]:
        """Resets ``n_envs`` copies sharing ``params``."""
        params = self.default_params() if params is None else params
        keys = jax.random.split(key, n_envs)
        return jax.vmap(self.reset_env, in_axes=(0, None))(keys, params)

    def step_env_batch(
        self, key: jax.Array, states: StateT, actions: jax.Array, params: ParamsT
    ) -> tuple[StateT, TimeStep]:
        """Steps a batch without auto-reset. Subclasses may draw all noise in one call."""
        n_envs = actions.shape[0]
        keys = jax.random.split(key, n_envs)
        return jax.vmap(self.step_env, in_axes=(0, 0, 0, None))(keys, states, actions, params)

    def step_batch(
        self, key: jax.Array, states: StateT, actions: jax.Array, params: ParamsT | None = None
    ) -> tuple[StateT, TimeStep]:
        """Steps a batch of environments sharing ``params``, with the same semantics as
        :meth:`step` for each of them."""
        return self._step_batch_restarting(self.reset_batch, key, states, actions, params)

    def _step_batch_restarting(
        self,
        reset_batch: Callable[..., tuple[StateT, TimeStep]],
        key: jax.Array,
        states: StateT,
        actions: jax.Array,
        params: ParamsT | None,
    ) -> tuple[StateT, TimeStep]:
        """:meth:`step_batch`, finished environments restarted from ``reset_batch(key,
        n_envs, params)`` (an environment with another batch layout passes the stacked
        one's)."""
        params = self.default_params() if params is None else params
        step_key, reset_key = jax.random.split(key)
        states, timesteps = self.step_env_batch(step_key, states, actions, params)
        if not self.auto_reset:
            return states, timesteps
        done = timesteps.done
        n_envs = done.shape[0]

        def restart(operands):
            states, timesteps = operands
            reset_states, reset_timesteps = reset_batch(reset_key, n_envs, params)
            states = tree_where(done, reset_states, states)
            observation = tree_where(done, reset_timesteps.observation, timesteps.observation)
            return states, timesteps.replace(observation=observation)

        return jax.lax.cond(jnp.any(done), restart, lambda operands: operands, (states, timesteps))

    # ----- identity -----------------------------------------------------------------
    #: The attributes whose values, with the type, identify an environment (the static
    #: configuration a compiled program depends on).
    _static_fields: tuple[str, ...] = ("auto_reset",)

    def _static_config(self) -> tuple:
        """The static configuration that identifies this environment."""
        return (type(self), *(getattr(self, name) for name in self._static_fields))

    def __hash__(self) -> int:
        return hash(self._static_config())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Environment) and self._static_config() == other._static_config()


class UniformNoiseEnvironment(Environment[StateT, ParamsT]):
    """An environment whose step draws its randomness as ``n_uniforms`` uniforms in
    [0, 1) (:meth:`step_from_uniforms`), so that the uniforms of many steps are drawn
    ahead in one call of the generator."""

    @property
    @abc.abstractmethod
    def n_uniforms(self) -> int:
        """Uniform numbers one step consumes."""

    @abc.abstractmethod
    def step_from_uniforms(
        self, uniforms: jax.Array, state: StateT, action: jax.Array, params: ParamsT
    ) -> tuple[StateT, TimeStep]:
        """:meth:`step_env` with its randomness given as ``uniforms[n_uniforms]``."""

    def presample(self, key: jax.Array, n_steps: int) -> tuple[jax.Array, jax.Array]:
        """A reset key per step and the ``[n_steps, n_uniforms]`` uniforms of the steps."""
        uniform_key, reset_key = jax.random.split(key)
        uniforms = fast_random.uniform(uniform_key, (n_steps, self.n_uniforms))
        return jax.random.split(reset_key, n_steps), uniforms

    def step_presampled(
        self,
        sample: tuple[jax.Array, jax.Array],
        state: StateT,
        action: jax.Array,
        params: ParamsT,
    ) -> tuple[StateT, TimeStep]:
        reset_key, uniforms = sample
        state, timestep = self.step_from_uniforms(uniforms, state, action, params)
        return self.maybe_reset(reset_key, state, timestep, params)
