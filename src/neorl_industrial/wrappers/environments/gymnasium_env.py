"""A ``gymnasium.Env`` over a functional environment.

The shell holds the PRNG key, the environment state and the parameters; every reset and
step is one call of a jitted pure function followed by one transfer of its outputs to the
host.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces
from jax.flatten_util import ravel_pytree

from neorl_industrial.core.environments import Environment, make
from neorl_industrial.core.environments.industrial_benchmark import IndustrialBenchmark
from neorl_industrial.core.environments.industrial_benchmark.env import NEUTRAL_DISCRETE_ACTION
from neorl_industrial.core.environments.pipeline import Pipeline
from neorl_industrial.core.environments.process import ProcessEnv


def applied_action(env: Environment, state: Any, action: jax.Array) -> jax.Array:
    """The action the plant applies when ``action`` is taken in ``state``: the
    environment's own decoding, for the report of what was done (``info["control"]``).

    * process tasks (:class:`ProcessEnv`): saturated at the actuator's bounds; a NaN or
      infinite element holds the previous interval's control;
    * the Industrial Benchmark: its increments saturated at [-1, 1], NaN/inf the neutral
      "no change"; for discrete actions the index applied (an unknown one is the neutral
      index);
    * the pipeline: the gate change saturated at [-1, 1], NaN/inf no change;
    * any other continuous task: saturated at its action bounds (NaN stays NaN, which its
      ``action_invalid`` flags).
    """
    if isinstance(env, ProcessEnv):
        control, _ = env.decode_control(action, state.last_control)
        return control
    if env.discrete:
        index = jnp.reshape(action, ()).astype(jnp.int32)
        if isinstance(env, IndustrialBenchmark):
            unknown = (index < 0) | (index >= env.num_actions)
            index = jnp.where(unknown, NEUTRAL_DISCRETE_ACTION, index)
        return index
    if isinstance(env, (IndustrialBenchmark, Pipeline)):
        action, _ = env.decode_action(action)
    action = jnp.reshape(action, (env.action_size,)).astype(jnp.float32)
    return jnp.clip(action, env.action_low, env.action_high)


class _FlatStepper:
    """Jitted reset and step of one environment over a flat state vector.

    Dispatching a jitted call costs time per argument leaf; the Industrial Benchmark's
    state has dozens. Raveling it into one float32 vector (its integer and boolean
    leaves are small and exact in float32) and packing each step's outputs into another
    makes a step one call with three small arguments and one host transfer. The PRNG
    key stays a separate uint32 array, which float32 could not hold exactly.
    """

    def __init__(self, env: Environment, params: Any):
        example = jax.eval_shape(env.reset_env, jax.random.PRNGKey(0), params)[0]
        _, self.unravel = ravel_pytree(
            jax.tree.map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype), example)
        )
        n_obs, n_costs = env.observation_size, env.n_costs

        n_controls = 1 if env.discrete else env.action_size

        def pack(state, timestep, control):
            flat_state, _ = ravel_pytree(state)
            flags = jnp.stack(
                [timestep.terminated, timestep.truncated, timestep.info.action_invalid]
            ).astype(jnp.float32)
            outputs = jnp.concatenate(
                [
                    timestep.observation,
                    timestep.reward[None],
                    timestep.cost,
                    # a discrete index is exact in float32
                    jnp.reshape(control, (n_controls,)).astype(jnp.float32),
                    flags,
                ]
            )
            return flat_state, outputs

        def reset(key, params):
            key, reset_key = jax.random.split(key)
            state, timestep = env.reset_env(reset_key, params)
            return key, *pack(state, timestep, jnp.zeros((n_controls,), jnp.float32))

        def step(key, flat_state, action, params):
            key, step_key = jax.random.split(key)
            state = self.unravel(flat_state)
            control = applied_action(env, state, action)
            return key, *pack(*env.step_env(step_key, state, action, params), control)

        self.reset = jax.jit(reset)
        self.step = jax.jit(step)
        self.slices = (n_obs, n_obs + 1, n_obs + 1 + n_costs, n_obs + 1 + n_costs + n_controls)


@functools.lru_cache(maxsize=32)
def _stepper(env: Environment, params_key: tuple) -> _FlatStepper:
    return _FlatStepper(env, _params_from_key(params_key))


def _params_key(params: Any) -> tuple:
    """A hashable copy of ``params``: each leaf's dtype, shape and values (array leaves,
    such as a setpoint schedule, flattened to tuples)."""
    leaves, treedef = jax.tree.flatten(params)
    arrays = [np.asarray(leaf) for leaf in leaves]
    return treedef, tuple(
        (array.dtype.str, array.shape, tuple(array.ravel().tolist())) for array in arrays
    )


def _params_from_key(params_key: tuple) -> Any:
    treedef, leaves = params_key
    return jax.tree.unflatten(
        treedef, [jnp.asarray(v, dtype=d).reshape(shape) for d, shape, v in leaves]
    )


def observation_space(env: Environment) -> spaces.Box:
    return spaces.Box(
        low=env.observation_low,
        high=env.observation_high,
        shape=(env.observation_size,),
        dtype=np.float32,
    )


def action_space(env: Environment, normalized: bool = False) -> spaces.Space:
    """The action space: the task's own bounds, or [-1, 1] per action when ``normalized``."""
    if env.discrete:
        return spaces.Discrete(env.num_actions)
    if normalized:
        ones = np.ones(env.action_size, np.float32)
        return spaces.Box(low=-ones, high=ones, dtype=np.float32)
    return spaces.Box(low=env.action_low, high=env.action_high, dtype=np.float32)


def resolve_normalized_actions(env: Environment, normalize_actions: bool | None) -> bool:
    """Whether a Gymnasium shell acts in [-1, 1]: as asked, or by default exactly when the
    task's actions are in plant units other than [-1, 1] (Gymnasium's agents expect a
    symmetric, normalized box; pc-gym normalizes by default for the same reason).

    Raises:
        ValueError: for a value that is not a bool or None, or for normalizing discrete
            actions.
    """
    if normalize_actions is not None and not isinstance(normalize_actions, bool):
        raise ValueError(
            f"normalize_actions: expected True, False or None, got {normalize_actions!r}"
        )
    if env.discrete:
        if normalize_actions:
            raise ValueError("normalize_actions: the actions are discrete")
        return False
    if normalize_actions is None:
        return not (np.all(env.action_low == -1.0) and np.all(env.action_high == 1.0))
    return normalize_actions


def to_plant_units(env: Environment, action: np.ndarray) -> np.ndarray:
    """Maps actions in [-1, 1] to the task's bounds (NaN stays NaN: the environment flags
    it; values outside [-1, 1] map outside the bounds and the environment saturates them)."""
    low, high = env.action_low, env.action_high
    return (low + (action + 1.0) * 0.5 * (high - low)).astype(np.float32)


def validate_action(env: Environment, action: Any, batch_shape: tuple[int, ...] = ()) -> np.ndarray:
    """Converts a user's action to an array of the right shape, or raises ``ValueError``.

    Values are not checked: out-of-range actions are clipped and NaN/inf actions are
    replaced and flagged by the environment itself.
    """
    try:
        array = np.asarray(action, dtype=np.int32 if env.discrete else np.float32)
    except (TypeError, ValueError):
        raise ValueError(f"action: expected numbers, got {action!r}") from None
    expected = batch_shape if env.discrete else (*batch_shape, env.action_size)
    if env.discrete and array.shape == (*batch_shape, 1):
        array = array.reshape(expected)
    if array.shape != expected:
        raise ValueError(f"action: expected shape {expected}, got {array.shape}")
    return array


def from_plant_units(env: Environment, control: np.ndarray) -> np.ndarray:
    """The inverse of :func:`to_plant_units`."""
    low, high = env.action_low, env.action_high
    return (2.0 * (control - low) / (high - low) - 1.0).astype(np.float32)


class GymnasiumEnv(gymnasium.Env):
    """Gymnasium interface to a registered functional environment.

    Args:
        env_id: a name from :func:`neorl_industrial.core.environments.registered_envs`.
        render_mode: only ``None`` is supported.
        normalize_actions: act in [-1, 1] (mapped linearly to the task's bounds) instead of
            the plant's units; ``None``: only for tasks whose bounds are not [-1, 1]
            already. ``info["control"]`` is the action the plant applied, in plant units
            either way: saturated at the bounds, a NaN/inf replaced as the task replaces it
            (see :func:`applied_action`).
        **overrides: static configuration and parameters, as for ``make``.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(
        self,
        env_id: str = "IB-v0",
        render_mode: str | None = None,
        normalize_actions: bool | None = None,
        **overrides: Any,
    ):
        if render_mode is not None:
            raise ValueError(f"render_mode: {env_id} cannot render, got {render_mode!r}")
        self.env, self.params = make(env_id, **overrides)
        self.normalize_actions = resolve_normalized_actions(self.env, normalize_actions)
        self.observation_space = observation_space(self.env)
        self.action_space = action_space(self.env, self.normalize_actions)
        self.render_mode = None
        self._stepper = _stepper(self.env, _params_key(self.params))
        self._key: jax.Array | None = None
        self._flat_state: jax.Array | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if seed is not None or self._key is None:
            self._key = jax.random.PRNGKey(int(self.np_random.integers(0, 2**31 - 1)))
        self._key, self._flat_state, outputs = self._stepper.reset(self._key, self.params)
        observation, _, cost, _, _, _, _ = self._unpack(outputs)
        return observation, {"cost": cost, "action_invalid": False}

    def step(self, action: Any):
        if self._flat_state is None:
            raise RuntimeError("step() called before reset()")
        action = validate_action(self.env, action)
        if self.normalize_actions:
            action = to_plant_units(self.env, action)
        self._key, self._flat_state, outputs = self._stepper.step(
            self._key, self._flat_state, action, self.params
        )
        observation, reward, cost, control, terminated, truncated, invalid = self._unpack(outputs)
        info = {"cost": cost, "action_invalid": invalid, "control": control}
        return observation, reward, terminated, truncated, info

    def _unpack(self, outputs: jax.Array):
        outputs = np.asarray(outputs)
        obs_end, reward_end, cost_end, control_end = self._stepper.slices
        terminated, truncated, invalid = (bool(flag) for flag in outputs[control_end:])
        control = outputs[cost_end:control_end]
        return (
            outputs[:obs_end].astype(np.float32),
            float(outputs[obs_end]),
            outputs[reward_end:cost_end].astype(np.float32),
            np.int64(control[0]) if self.env.discrete else control.astype(np.float32),
            terminated,
            truncated,
            invalid,
        )

    @property
    def state(self) -> Any:
        """The functional environment state (a PyTree), for inspection."""
        return None if self._flat_state is None else self._stepper.unravel(self._flat_state)
