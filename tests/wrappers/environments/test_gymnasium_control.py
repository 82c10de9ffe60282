"""``info["control"]`` of the Gymnasium shell is the action the plant applied: saturated at
the bounds and, for NaN/inf, what the task put in its place; checked on every registered
environment against the effect in the environment's own state."""

from __future__ import annotations

import numpy as np
import pytest

from neorl_industrial.core.environments import make, registered_envs
from neorl_industrial.core.environments.industrial_benchmark import IndustrialBenchmark
from neorl_industrial.core.environments.industrial_benchmark.dynamics import (
    GAIN_STEP,
    VELOCITY_STEP,
)
from neorl_industrial.core.environments.industrial_benchmark.env import NEUTRAL_DISCRETE_ACTION
from neorl_industrial.core.environments.pipeline import Pipeline
from neorl_industrial.core.environments.process import ProcessEnv
from neorl_industrial.wrappers.environments import GymnasiumEnv

#: One registered task per way of decoding an action (each compiles its own shell).
DECODINGS = {
    ProcessEnv: "FourTank-v0",  # per element: saturated, NaN holds the last control
    IndustrialBenchmark: "IB-classic-v0",  # NaN anywhere: the neutral "no change"
    Pipeline: "Pipeline-v0",
}


def test_every_registered_task_decodes_its_actions_one_of_the_tested_ways():
    for env_id in registered_envs():
        env, _ = make(env_id)
        families = [kind for kind in DECODINGS if isinstance(env, kind)]
        assert len(families) == 1, (env_id, type(env).__name__)
        assert not env.discrete or families == [IndustrialBenchmark], env_id


def applied_in_state(env, before, after) -> np.ndarray:
    """The action the plant applied, read from the environment's state around the step."""
    if isinstance(env, ProcessEnv):
        return np.asarray(after.last_control)
    if isinstance(env, Pipeline):
        return np.asarray(after.action_history[:1])
    assert isinstance(env, IndustrialBenchmark)
    # Velocity and gain move by their step sizes times the increment (within [0, 100]).
    return np.array(
        [
            (float(after.plant.velocity) - float(before.plant.velocity)) / VELOCITY_STEP,
            (float(after.plant.gain) - float(before.plant.gain)) / GAIN_STEP,
        ]
    )


def step(shell: GymnasiumEnv, action) -> tuple[dict, np.ndarray]:
    before = shell.state
    _, _, _, _, info = shell.step(np.asarray(action, np.float32))
    applied = applied_in_state(shell.env, before, shell.state)
    return info, applied


@pytest.mark.parametrize("env_id", sorted(DECODINGS.values()))
def test_control_is_the_applied_action_in_plant_units(env_id):
    shell = GymnasiumEnv(env_id, normalize_actions=False)
    shell.reset(seed=0)
    low, high = shell.env.action_low, shell.env.action_high
    span = high - low
    inside = low + 0.25 * span
    checked = 2 if isinstance(shell.env, IndustrialBenchmark) else len(low)
    expected_previous = None
    for action, expected in (
        (inside, inside),
        (high + span, high),  # beyond the bounds: saturated
        (low - 3.0 * span, low),
        (np.where(np.arange(len(low)) == 0, np.nan, inside), None),  # NaN: replaced
    ):
        info, applied = step(shell, action)
        control = info["control"]
        assert control.dtype == np.float32 and control.shape == low.shape
        np.testing.assert_allclose(control[:checked], applied, rtol=1e-5, atol=1e-5)
        if expected is not None:
            assert not info["action_invalid"]
            np.testing.assert_allclose(control, expected, rtol=1e-6)
            expected_previous = control
            continue
        assert info["action_invalid"]
        if isinstance(shell.env, ProcessEnv):  # that actuator holds its last control
            np.testing.assert_array_equal(control[0], expected_previous[0])
            np.testing.assert_allclose(control[1:], inside[1:], rtol=1e-6)
        else:  # the neutral "no change"
            np.testing.assert_array_equal(control, np.zeros_like(control))


def test_a_normalized_shell_reports_the_saturated_plant_action():
    shell = GymnasiumEnv("FourTank-v0")
    assert shell.normalize_actions
    shell.reset(seed=0)
    # 3.0 maps to 29.8 V and -2.0 to -4.85 V: the pumps apply their 10 V and 0.1 V.
    _, _, _, _, info = shell.step(np.array([3.0, -2.0], np.float32))
    np.testing.assert_allclose(info["control"], [10.0, 0.1], rtol=1e-6)
    np.testing.assert_array_equal(info["control"], shell.state.last_control)


def test_a_discrete_control_is_the_index_applied():
    shell = GymnasiumEnv("IB-discrete-v0")
    shell.reset(seed=0)
    _, _, _, _, info = shell.step(5)
    assert info["control"] == 5 and not info["action_invalid"]
    _, _, _, _, info = shell.step(shell.env.num_actions + 3)  # unknown: the neutral index
    assert info["control"] == NEUTRAL_DISCRETE_ACTION and info["action_invalid"]
