"""Pure Industrial Benchmark dynamics: Markov state, per-step noise and the transition.

Randomness is separate from dynamics. ``sample_noise`` draws every random number one step
needs into an :class:`IBNoise` PyTree; :func:`transition` is a deterministic function of
``(state, action, noise, params)``. Replaying the reference implementation's draws as
noise reproduces its trajectories; drawing the noise of many environments at once from
one key (:func:`noise_from_uniforms`) is what makes batched rollouts fast.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from neorl_industrial.core.environments.industrial_benchmark import goldstone

# Plant constants of the reference implementation.
GS_BOUND = 1.5
GS_SETPOINT_DEPENDENCY = 0.02
GS_SCALE = 2.0 * GS_BOUND + 100.0 * GS_SETPOINT_DEPENDENCY
SHIFT_STEP = (goldstone.MAX_REQUIRED_STEP / 0.9) * 100.0 / GS_SCALE
GAIN_STEP = 10.0
VELOCITY_STEP = 1.0
FATIGUE_WEIGHT = 3.0
CONSUMPTION_WEIGHT = 1.0
MISCALIBRATION_WEIGHT = 25.0

FATIGUE_EXP_SCALE = 0.1
ACTION_TOLERANCE = 0.05
FATIGUE_AMPLIFICATION = 1.1
FATIGUE_AMPLIFICATION_MAX = 5.0
FATIGUE_AMPLIFICATION_START = 1.2
ALPHA_MEAN = 2.4
ALPHA_STD = 0.4

COST_SETPOINT = 2.0
COST_VELOCITY = 4.0
COST_GAIN = 2.5
OPERATIONAL_COST_HISTORY = 10
OPERATIONAL_COST_KERNEL = (0.11111, 0.22222, 0.33333, 0.22222, 0.11111, 0.0, 0.0, 0.0, 0.0, 0.0)

SETPOINT_SEGMENT_MAX = 100  # segment lengths are drawn from [1, SETPOINT_SEGMENT_MAX)
SETPOINT_STILL_PROBABILITY = 0.1

N_UNIFORMS = 12  # uniforms consumed by :func:`noise_from_uniforms`
N_STATIONARY_UNIFORMS = 8  # the same without the four of the setpoint walk


@struct.dataclass
class IBState:
    """Full Markov state of one Industrial Benchmark plant.

    Names follow the reference: ``p`` setpoint, ``v`` velocity, ``g`` gain, ``h`` shift,
    ``f`` fatigue, ``c`` consumption; the rest is hidden.
    """

    setpoint: jax.Array
    velocity: jax.Array
    gain: jax.Array
    shift: jax.Array
    fatigue: jax.Array
    consumption: jax.Array
    effective_shift: jax.Array  # he: shift as seen by the goldstone dynamics
    basic_fatigue: jax.Array  # fb: fatigue before the amplification by alpha
    hidden_velocity: jax.Array  # hv
    hidden_gain: jax.Array  # hg
    effective_velocity: jax.Array  # ve: alpha of the effective action
    effective_gain: jax.Array  # ge: beta of the effective action
    operational_cost_history: jax.Array  # o[10]: oldest first
    current_operational_cost: jax.Array  # coc
    operational_cost: jax.Array  # oc: the delayed (convolved) operational cost
    miscalibration: jax.Array  # MC
    gs_domain: jax.Array  # int32, -1 or +1
    gs_system_response: jax.Array  # int32, +1 advantageous, -1 disadvantageous
    gs_phi_idx: jax.Array  # int32 in [-6, 6]
    setpoint_change: jax.Array  # per-step setpoint change of the current segment
    setpoint_segment_step: jax.Array  # int32: steps taken in the current segment
    setpoint_segment_length: jax.Array  # int32: length of the current segment
    fresh: jax.Array  # bool: the operational-cost history has not been filled yet

    @property
    def reward(self) -> jax.Array:
        """Reward of the last step: minus the weighted fatigue and consumption."""
        return -(FATIGUE_WEIGHT * self.fatigue + CONSUMPTION_WEIGHT * self.consumption)

    def observation(self) -> jax.Array:
        """The observable frame ``[p, v, g, h, f, c]``."""
        return jnp.stack(
            [self.setpoint, self.velocity, self.gain, self.shift, self.fatigue, self.consumption]
        )


@struct.dataclass
class IBNoise:
    """Every random number of one step, in the distributions the reference draws them from."""

    gain_exponential: jax.Array  # Exponential(scale=0.1)
    velocity_exponential: jax.Array  # Exponential(scale=0.1)
    gain_uniform: jax.Array  # U[0, 1)
    velocity_uniform: jax.Array  # U[0, 1)
    gain_bernoulli_uniform: jax.Array  # U[0, 1): the Bernoulli outcome is u < p
    velocity_bernoulli_uniform: jax.Array  # U[0, 1)
    alpha_normal: jax.Array  # Normal(2.4, 0.4): used when fatigue amplification saturates
    consumption_normal: jax.Array  # Normal(0, 1)
    setpoint_segment_length: jax.Array  # int32 in [1, 100): used when a segment ends
    setpoint_change_uniform: jax.Array  # U[0, 1): new change 2u - 1
    setpoint_still_uniform: jax.Array  # U[0, 1): change set to 0 when below 0.1
    setpoint_flip_uniform: jax.Array  # U[0, 1): direction flips at a bound when above 0.5


def noise_from_uniforms(uniforms: jax.Array) -> IBNoise:
    """Transforms ``uniforms[N_UNIFORMS, ...]`` in [0, 1) into one step's noise.

    The uniforms' index comes first and any batch shape follows, so a batch of
    environments draws its noise with a single call of the random number generator and
    each noise field is a contiguous slice.
    """
    u = uniforms
    if u.shape[0] == N_STATIONARY_UNIFORMS:
        # A stationary setpoint needs no walk: its fields are zeros, never read.
        zeros = jnp.zeros(u.shape[1:], uniforms.dtype)
        u = [*u, zeros, zeros, zeros, zeros]
    dtype = uniforms.dtype
    one = jnp.asarray(1.0, dtype)
    # Inverse CDF of the exponential; 1 - u lies in (0, 1], so the log is finite.
    exponential = [-FATIGUE_EXP_SCALE * jnp.log(one - u[i]) for i in (0, 1)]
    # Box-Muller: one log, one sqrt and a sin/cos pair give both normals.
    radius = jnp.sqrt(-2.0 * jnp.log(one - u[6]))
    angle = (2.0 * math.pi) * u[7]
    segment = 1 + jnp.floor(u[8] * (SETPOINT_SEGMENT_MAX - 1)).astype(jnp.int32)
    return IBNoise(
        gain_exponential=exponential[0],
        velocity_exponential=exponential[1],
        gain_uniform=u[2],
        velocity_uniform=u[3],
        gain_bernoulli_uniform=u[4],
        velocity_bernoulli_uniform=u[5],
        alpha_normal=ALPHA_MEAN + ALPHA_STD * radius * jnp.cos(angle),
        consumption_normal=radius * jnp.sin(angle),
        setpoint_segment_length=jnp.minimum(segment, SETPOINT_SEGMENT_MAX - 1),
        setpoint_change_uniform=u[9],
        setpoint_still_uniform=u[10],
        setpoint_flip_uniform=u[11],
    )


def sample_noise(key: jax.Array, dtype=jnp.float32) -> IBNoise:
    """Draws one step's noise from ``key``."""
    return noise_from_uniforms(jax.random.uniform(key, (N_UNIFORMS,), dtype=dtype))


def effective_action(
    velocity: jax.Array, gain: jax.Array, setpoint: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Effective velocity (alpha) and gain (beta) of the current operating point, in [0, 1]."""

    def effective_a(a):
        return a + 101.0 - setpoint

    def effective_b(b):
        return b + 1.0 + setpoint

    def velocity_unscaled(a, b):
        return (effective_b(b) + 1.0) / effective_a(a)

    min_alpha = velocity_unscaled(100.0, 0.0)
    max_alpha = velocity_unscaled(0.0, 100.0)
    alpha = (velocity_unscaled(velocity, gain) - min_alpha) / (max_alpha - min_alpha)

    min_beta = 1.0 / effective_b(100.0)
    max_beta = 1.0 / effective_b(0.0)
    beta = (1.0 / effective_b(gain) - min_beta) / (max_beta - min_beta)
    return alpha, beta


def _hidden_fatigue(effective, hidden, noise):
    return jnp.where(
        effective <= ACTION_TOLERANCE,
        effective,
        jnp.where(
            hidden >= FATIGUE_AMPLIFICATION_START,
            jnp.minimum(FATIGUE_AMPLIFICATION_MAX, FATIGUE_AMPLIFICATION * hidden),
            0.9 * hidden + noise / 3.0,
        ),
    )


def _update_setpoint(state: IBState, noise: IBNoise, stationary: bool) -> IBState:
    if stationary:
        return state
    segment_over = state.setpoint_segment_step == state.setpoint_segment_length
    new_change = 2.0 * noise.setpoint_change_uniform - 1.0
    new_change = jnp.where(
        noise.setpoint_still_uniform < SETPOINT_STILL_PROBABILITY, 0.0, new_change
    )
    change = jnp.where(segment_over, new_change.astype(state.setpoint.dtype), state.setpoint_change)
    segment_step = jnp.where(segment_over, 0, state.setpoint_segment_step)
    segment_length = jnp.where(
        segment_over, noise.setpoint_segment_length, state.setpoint_segment_length
    )

    moved = state.setpoint + change
    out_of_range = (moved > 100.0) | (moved < 0.0)
    change = jnp.where(out_of_range & (noise.setpoint_flip_uniform > 0.5), -change, change)
    return state.replace(
        setpoint=jnp.clip(moved, 0.0, 100.0),
        setpoint_change=change,
        setpoint_segment_step=segment_step + 1,
        setpoint_segment_length=segment_length,
    )


class _Fatigue(NamedTuple):
    """The fatigue part of a step's state (the :class:`IBState` fields of that name)."""

    fatigue: jax.Array
    basic_fatigue: jax.Array
    hidden_velocity: jax.Array
    hidden_gain: jax.Array
    effective_velocity: jax.Array
    effective_gain: jax.Array


def _operating_point(
    state: IBState, action: jax.Array, setpoint: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Velocity, gain and shift after ``action`` (clipped to [-1, 1] as in the
    reference), and the effective shift the goldstone dynamics see."""
    delta = jnp.clip(action.astype(state.velocity.dtype), -1.0, 1.0)
    velocity = jnp.clip(state.velocity + VELOCITY_STEP * delta[0], 0.0, 100.0)
    gain = jnp.clip(state.gain + GAIN_STEP * delta[1], 0.0, 100.0)
    shift = jnp.clip(state.shift + SHIFT_STEP * delta[2], 0.0, 100.0)
    effective_shift = jnp.clip(
        GS_SCALE * shift / 100.0 - GS_SETPOINT_DEPENDENCY * setpoint - GS_BOUND, -GS_BOUND, GS_BOUND
    )
    return velocity, gain, shift, effective_shift


def _fatigue_noise(
    exponential: jax.Array, bernoulli_uniform: jax.Array, uniform: jax.Array, effective: jax.Array
) -> jax.Array:
    """The noise driving one hidden fatigue variable (velocity or gain): a squashed
    exponential, raised towards 1 with probability ``effective``."""
    noise = 2.0 * (1.0 / (1.0 + jnp.exp(-exponential)) - 0.5)
    bernoulli = bernoulli_uniform < jnp.clip(effective, 0.001, 0.999)
    return noise + jnp.where(bernoulli, (1.0 - noise) * uniform * effective, 0.0)


def _fatigue(
    state: IBState, noise: IBNoise, velocity: jax.Array, gain: jax.Array, setpoint: jax.Array
) -> _Fatigue:
    """Fatigue: hidden velocity and gain driven by noise, amplified when they run away."""
    effective_velocity, effective_gain = effective_action(velocity, gain, setpoint)
    noise_gain = _fatigue_noise(
        noise.gain_exponential, noise.gain_bernoulli_uniform, noise.gain_uniform, effective_gain
    )
    noise_velocity = _fatigue_noise(
        noise.velocity_exponential,
        noise.velocity_bernoulli_uniform,
        noise.velocity_uniform,
        effective_velocity,
    )
    hidden_gain = _hidden_fatigue(effective_gain, state.hidden_gain, noise_gain)
    hidden_velocity = _hidden_fatigue(effective_velocity, state.hidden_velocity, noise_velocity)
    saturated = jnp.maximum(hidden_velocity, hidden_gain) == FATIGUE_AMPLIFICATION_MAX
    alpha = jnp.where(
        saturated,
        1.0 / (1.0 + jnp.exp(-noise.alpha_normal.astype(state.velocity.dtype))),
        jnp.maximum(noise_velocity, noise_gain),
    )
    basic_fatigue = jnp.maximum(0.0, 30000.0 / (5.0 * velocity + 100.0) - 0.01 * gain * gain)
    return _Fatigue(
        fatigue=basic_fatigue * (1.0 + 2.0 * alpha) / 3.0,
        basic_fatigue=basic_fatigue,
        hidden_velocity=hidden_velocity,
        hidden_gain=hidden_gain,
        effective_velocity=effective_velocity,
        effective_gain=effective_gain,
    )


def _operational_cost(
    state: IBState, velocity: jax.Array, gain: jax.Array, setpoint: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The operational cost's history, its current value and the delayed cost that
    enters consumption (a convolution over the history)."""
    current_cost = jnp.exp(
        (COST_SETPOINT * setpoint + COST_GAIN * gain + COST_VELOCITY * velocity) / 100.0
    )
    shifted = jnp.concatenate([state.operational_cost_history[1:], current_cost[None]])
    history = jnp.where(state.fresh, jnp.full_like(shifted, current_cost), shifted)
    kernel = jnp.asarray(OPERATIONAL_COST_KERNEL, state.velocity.dtype)
    return history, current_cost, jnp.dot(history, kernel)


def transition(
    state: IBState, action: jax.Array, noise: IBNoise, *, stationary: bool = True
) -> IBState:
    """Advances one plant by one step; pure and deterministic given ``noise``.

    Args:
        state: the Markov state.
        action: ``[Δvelocity, Δgain, Δshift]``; clipped to [-1, 1] as in the reference.
        noise: the step's random numbers.
        stationary: whether the setpoint stays fixed (static: it selects code paths).

    Returns:
        The next Markov state; its ``reward`` property is the step's reward.
    """
    dtype = state.velocity.dtype
    state = _update_setpoint(state, noise, stationary)
    setpoint = state.setpoint
    velocity, gain, shift, effective_shift = _operating_point(state, action, setpoint)
    fatigue = _fatigue(state, noise, velocity, gain, setpoint)
    history, current_cost, operational_cost = _operational_cost(state, velocity, gain, setpoint)

    # Mis-calibration from the goldstone dynamics.
    domain, phi_idx, system_response = goldstone.transition(
        state.gs_domain, state.gs_phi_idx, state.gs_system_response, effective_shift
    )
    miscalibration = -goldstone.penalty(phi_idx, effective_shift)

    hidden_consumption = operational_cost - MISCALIBRATION_WEIGHT * (miscalibration - 1.0)
    consumption = hidden_consumption - noise.consumption_normal.astype(dtype) * (
        1.0 + 0.005 * hidden_consumption
    )

    return state.replace(
        velocity=velocity,
        gain=gain,
        shift=shift,
        consumption=consumption,
        effective_shift=effective_shift,
        **fatigue._asdict(),
        operational_cost_history=history,
        current_operational_cost=current_cost,
        operational_cost=operational_cost,
        miscalibration=miscalibration,
        gs_domain=domain,
        gs_system_response=system_response,
        gs_phi_idx=phi_idx,
        fresh=jnp.zeros_like(state.fresh),
    )


def pre_initial_state(setpoint: jax.Array, dtype=jnp.float32) -> IBState:
    """The state a plant is built in, before its first (zero-action) step.

    Velocity, gain and shift start at 50, the mis-calibration at its rest position, and the
    setpoint segment is marked as finished so the first step starts a new one.
    """
    zero = jnp.zeros((), dtype)
    fifty = jnp.full((), 50.0, dtype)
    zero_int = jnp.zeros((), jnp.int32)
    one_int = jnp.ones((), jnp.int32)
    return IBState(
        setpoint=jnp.asarray(setpoint, dtype),
        velocity=fifty,
        gain=fifty,
        shift=fifty,
        fatigue=zero,
        consumption=zero,
        effective_shift=zero,
        basic_fatigue=zero,
        hidden_velocity=zero,
        hidden_gain=zero,
        effective_velocity=zero,
        effective_gain=zero,
        operational_cost_history=jnp.zeros((OPERATIONAL_COST_HISTORY,), dtype),
        current_operational_cost=zero,
        operational_cost=zero,
        miscalibration=zero,
        gs_domain=one_int,
        gs_system_response=one_int,
        gs_phi_idx=zero_int,
        setpoint_change=zero,
        setpoint_segment_step=zero_int,
        setpoint_segment_length=zero_int,
        fresh=jnp.ones((), jnp.bool_),
    )


def initial_state(setpoint: jax.Array, noise: IBNoise, *, stationary: bool = True) -> IBState:
    """The state after construction: the pre-initial state advanced by a zero action."""
    dtype = noise.consumption_normal.dtype
    state = pre_initial_state(setpoint, dtype)
    return transition(state, jnp.zeros((3,), dtype), noise, stationary=stationary)
