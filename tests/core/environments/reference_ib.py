"""Runs the reference Industrial Benchmark while recording every random draw it makes.

The recorded draws are turned into one :class:`IBNoise` per step so the JAX port can
replay the reference trajectory draw for draw.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

np.float = float  # the reference still calls np.float, removed from NumPy

from industrial_benchmark_python import IDS as ids_module  # noqa: E402

# Markov-state variables of the reference and their names in the port's IBState.
MARKOV_FIELDS = {
    "p": "setpoint",
    "v": "velocity",
    "g": "gain",
    "h": "shift",
    "f": "fatigue",
    "c": "consumption",
    "he": "effective_shift",
    "fb": "basic_fatigue",
    "hv": "hidden_velocity",
    "hg": "hidden_gain",
    "ve": "effective_velocity",
    "ge": "effective_gain",
    "o": "operational_cost_history",
    "coc": "current_operational_cost",
    "oc": "operational_cost",
    "MC": "miscalibration",
    "gs_domain": "gs_domain",
    "gs_sys_response": "gs_system_response",
    "gs_phi_idx": "gs_phi_idx",
}

_RECORDED = ("exponential", "rand", "binomial", "normal", "randn", "randint")


@dataclass
class ReferenceRun:
    noise: dict[str, np.ndarray]  # IBNoise field -> [n_steps + 1] (row 0: construction)
    states: dict[str, np.ndarray]  # reference variable -> [n_steps + 1, ...]
    rewards: np.ndarray  # [n_steps + 1]
    setpoint_walk: dict[str, np.ndarray]  # change, step, length after each step


@contextlib.contextmanager
def _recording(log: list):
    originals = {name: getattr(np.random, name) for name in _RECORDED}
    original_step = ids_module.IDS.step

    def recorder(name):
        def draw(*args, **kwargs):
            value = originals[name](*args, **kwargs)
            log.append((name, value))
            return value

        return draw

    def step(self, delta):
        log.append(("step", None))
        return original_step(self, delta)

    try:
        for name in _RECORDED:
            setattr(np.random, name, recorder(name))
        ids_module.IDS.step = step
        yield
    finally:
        for name, function in originals.items():
            setattr(np.random, name, function)
        ids_module.IDS.step = original_step


def _parse_step(draws: list, pending_sequence: list) -> dict[str, float]:
    """Maps one step's draws, in the reference's order, onto IBNoise fields."""
    noise = dict.fromkeys(
        [
            "alpha_normal",
            "setpoint_segment_length",
            "setpoint_change_uniform",
            "setpoint_still_uniform",
            "setpoint_flip_uniform",
        ],
        0.0,
    )
    draws = list(pending_sequence) + list(draws)
    if draws and draws[0][0] == "randint":
        (_, length), (_, change), (_, still) = draws[:3]
        noise.update(
            setpoint_segment_length=length,
            setpoint_change_uniform=change,
            setpoint_still_uniform=still,
        )
        draws = draws[3:]
    if draws[0][0] == "rand":
        noise["setpoint_flip_uniform"] = draws[0][1]
        draws = draws[1:]
    names = [name for name, _ in draws]
    expected = ["exponential", "exponential", "rand", "rand", "binomial", "binomial"]
    assert names[:6] == expected, names
    values = [value for _, value in draws]
    noise.update(
        gain_exponential=values[0],
        velocity_exponential=values[1],
        gain_uniform=values[2],
        velocity_uniform=values[3],
        # u < p reproduces the outcome for any p in [0.001, 0.999].
        gain_bernoulli_uniform=0.0 if values[4] else 1.0,
        velocity_bernoulli_uniform=0.0 if values[5] else 1.0,
    )
    rest = draws[6:]
    if rest[0][0] == "normal":
        noise["alpha_normal"] = rest[0][1]
        rest = rest[1:]
    assert [name for name, _ in rest] == ["randn"], rest
    noise["consumption_normal"] = rest[0][1]
    return noise


def run_reference(
    setpoint: float, stationary: bool, seed: int, actions: np.ndarray
) -> ReferenceRun:
    """Builds the reference plant and applies ``actions``, recording draws and states."""
    log: list = []
    snapshots = []

    def snapshot(ids):
        state = {name: np.array(ids.state[name], dtype=np.float64) for name in MARKOV_FIELDS}
        walk = {
            "setpoint_change": float(getattr(ids, "_p_ch", 0.0)),
            "setpoint_segment_step": int(getattr(ids, "_p_step", 0)),
            "setpoint_segment_length": int(getattr(ids, "_p_steps", 0)),
        }
        snapshots.append((state, float(ids.state["reward"]), walk))

    with _recording(log):
        ids = ids_module.IDS(setpoint, stationary_p=stationary, inital_seed=seed)
        snapshot(ids)
        for action in actions:
            ids.step(np.asarray(action, dtype=np.float64))
            snapshot(ids)

    # Split the log at step markers; draws before the first marker define the first
    # setpoint segment during construction.
    segments: list[list] = [[]]
    for entry in log:
        if entry[0] == "step":
            segments.append([])
        else:
            segments[-1].append(entry)
    pending, per_step = segments[0], segments[1:]
    rows = [_parse_step(per_step[0], pending)]
    rows += [_parse_step(draws, []) for draws in per_step[1:]]
    noise = {name: np.array([row[name] for row in rows]) for name in rows[0]}
    states = {name: np.stack([snap[0][name] for snap in snapshots]) for name in MARKOV_FIELDS}
    walk = {name: np.array([snap[2][name] for snap in snapshots]) for name in snapshots[0][2]}
    rewards = np.array([snap[1] for snap in snapshots])
    return ReferenceRun(noise=noise, states=states, rewards=rewards, setpoint_walk=walk)
