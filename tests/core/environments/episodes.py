"""Open-loop episodes of a functional environment for the fidelity tests: the reset's
observation and the time steps of a fixed action sequence, one compiled scan each."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

#: The key of every reset and step (the process tasks' resets and steps draw nothing).
KEY = jax.random.PRNGKey(0)


@functools.partial(jax.jit, static_argnums=0)
def _episode(env, params, actions):
    state, first = env.reset_env(KEY, params)

    def one_step(state, action):
        return env.step_env(KEY, state, action, params)

    _, steps = jax.lax.scan(one_step, state, actions)
    return jnp.concatenate([first.observation[None], steps.observation]), steps


@functools.partial(jax.jit, static_argnums=0)
def jit_step(env, state, action, params):
    return env.step_env(KEY, state, action, params)


def run_actions(env, params, actions):
    """Observations (the reset's first) and the time steps of one episode."""
    observations, steps = _episode(env, params, jnp.asarray(actions, jnp.float32))
    return np.asarray(observations, np.float64), steps
