"""Parity of the JAX Industrial Benchmark with the reference implementation.

The reference's random draws are recorded and replayed as noise, so every Markov-state
variable can be compared step by step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.environments.industrial_benchmark import dynamics
from tests.core.environments.reference_ib import MARKOV_FIELDS, run_reference

N_STEPS = 1000
# (setpoint, stationary, seed, action scale): >= 10 runs over several setpoints, both
# setpoint modes, and actions beyond [-1, 1] so the clipping is exercised too.
CASES = [
    (10.0, True, 1005, 1.0),
    (30.0, True, 1006, 1.0),
    (50.0, True, 1007, 1.0),
    (70.0, True, 1008, 1.5),
    (90.0, True, 1009, 1.0),
    (100.0, True, 1010, 1.0),
    (20.0, False, 1011, 1.0),
    (45.0, False, 1012, 1.0),
    (70.0, False, 1013, 1.5),
    (95.0, False, 1014, 1.0),
    (0.0, False, 1015, 1.0),
]


def _replay(setpoint, stationary, noise, actions, dtype):
    noise = dynamics.IBNoise(
        **{
            name: jnp.asarray(values, jnp.int32 if name == "setpoint_segment_length" else dtype)
            for name, values in noise.items()
        }
    )
    first = jax.tree.map(lambda leaf: leaf[0], noise)
    rest = jax.tree.map(lambda leaf: leaf[1:], noise)

    @jax.jit
    def run(first, rest, actions):
        state = dynamics.initial_state(jnp.asarray(setpoint, dtype), first, stationary=stationary)

        def one_step(state, inputs):
            action, step_noise = inputs
            state = dynamics.transition(state, action, step_noise, stationary=stationary)
            return state, (state, state.reward)

        _, (states, rewards) = jax.lax.scan(one_step, state, (actions, rest))
        initial = jax.tree.map(lambda leaf: leaf[None], state)
        states = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), initial, states)
        rewards = jnp.concatenate([state.reward[None], rewards])
        return states, rewards

    return run(first, rest, jnp.asarray(actions, dtype))


@pytest.mark.parametrize(("setpoint", "stationary", "seed", "scale"), CASES)
def test_replay_matches_reference_markov_state(setpoint, stationary, seed, scale):
    rng = np.random.default_rng(seed)
    actions = scale * (2.0 * rng.random((N_STEPS, 3)) - 1.0)
    reference = run_reference(setpoint, stationary, seed, actions)
    with jax.enable_x64(True):
        states, rewards = _replay(setpoint, stationary, reference.noise, actions, jnp.float64)
        states = jax.tree.map(np.asarray, states)
        rewards = np.asarray(rewards)
    for ref_name, port_name in MARKOV_FIELDS.items():
        np.testing.assert_allclose(
            getattr(states, port_name),
            reference.states[ref_name],
            rtol=1e-5,
            atol=1e-9,
            err_msg=f"{ref_name} ({port_name}) diverged, setpoint={setpoint}",
        )
    np.testing.assert_allclose(rewards, reference.rewards, rtol=1e-5, atol=1e-9)
    if not stationary:
        # The setpoint must actually wander for the non-stationary case to mean anything.
        assert np.ptp(reference.states["p"]) > 5.0
        for name in ("setpoint_change", "setpoint_segment_step", "setpoint_segment_length"):
            np.testing.assert_allclose(
                getattr(states, name), reference.setpoint_walk[name], rtol=1e-5, atol=1e-9
            )


def test_float32_replay_tracks_reference():
    """The default float32 port stays on the reference trajectory too."""
    rng = np.random.default_rng(7)
    actions = 2.0 * rng.random((N_STEPS, 3)) - 1.0
    reference = run_reference(60.0, False, 77, actions)
    states, rewards = _replay(60.0, False, reference.noise, actions, jnp.float32)
    np.testing.assert_allclose(rewards, reference.rewards, rtol=1e-3, atol=1e-3)
    for ref_name, port_name in MARKOV_FIELDS.items():
        np.testing.assert_allclose(
            np.asarray(getattr(states, port_name), np.float64),
            reference.states[ref_name],
            rtol=1e-3,
            atol=1e-3,
            err_msg=f"{ref_name} ({port_name}) diverged in float32",
        )
