"""The four-tank process: fidelity to pc-gym 0.1.8, constraints, bad input and batching."""

from __future__ import annotations

import json
import subprocess
import warnings
from pathlib import Path

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import neorl_industrial.wrappers.environments  # noqa: F401  (registers the Gymnasium ids)
from neorl_industrial.core.environments import Task, make, rollout
from neorl_industrial.core.environments.four_tank import COST_NAMES, FourTank
from neorl_industrial.core.environments.ode import graded_steps
from neorl_industrial.core.environments.process import check_observation_bounds
from neorl_industrial.core.environments.rollout import constant_policy, uniform_random_policy
from neorl_industrial.core.safety.constraints import costs as spec_costs
from neorl_industrial.wrappers.constraint_files import load_constraint_spec
from tests.core.environments.episodes import KEY, jit_step, run_actions

ROOT = Path(__file__).resolve().parents[3]
REFERENCES = Path(__file__).resolve().parent / "references"
CASE_FILE = REFERENCES / "four_tank_case.json"
RECORDED = REFERENCES / "four_tank_pcgym.npz"
BOUNDS_FILE = REFERENCES / "four_tank_bounds.json"
BOUNDS_RECORDED = REFERENCES / "four_tank_bounds_pcgym.npz"
REFERENCE_PYTHON = ROOT / ".venv-reference" / "bin" / "python"
BOUND_SEQUENCES = tuple(json.loads(BOUNDS_FILE.read_text())["sequences"])

# Tolerance on the levels [m]. pc-gym integrates in float64 with CVODES (its default;
# relative tolerance 1e-6), we in float32 with an L-stable SDIRK of order 4 on 12 graded
# steps per interval. Over the random episode our levels differ from pc-gym's by at most
# 1.7e-6 m: that is CVODES's own error (pc-gym's other integrator, diffrax at tolerance
# 1e-8, differs from it as much). 5e-6 m leaves a factor 3.
LEVEL_ATOL = 5e-6
# With a pump held at 10 V for the episode, CVODES's levels drift from a converged
# float64 solution by up to 9.5e-6 of the level (6.9e-6 m at 0.73 m), ours by 2e-7 m:
# against pc-gym the bound-holding sequences add 1e-5 of its level to LEVEL_ATOL.
BOUNDS_LEVEL_RTOL = 1e-5
# Against the converged float64 solution of the same ODE (scipy's Radau at relative
# tolerance 1e-12, recorded beside pc-gym's episodes) every level of every bound-holding
# sequence is within 1e-6 m (measured 4.5e-7, mostly float32's rounding over an episode;
# the task's target is 1e-5 m), and the nearly empty tanks (below 1e-4 m; their floor is
# 3.6e-5 m) within 5e-8 m (measured 1.3e-8). Four fixed Tsit5 steps per interval missed
# by up to 2.2e-4 m there, sixteen by 3.7e-6 m; the same SDIRK on 8 steps graded with
# exponent 2 by 5.1e-7 m overall but 3e-7 m at the floor.
CONVERGED_ATOL = 1e-6
FLOOR_LEVEL, FLOOR_ATOL = 1e-4, 5e-8


@pytest.fixture(scope="module")
def four_tank():
    return make("FourTank-v0")


@pytest.fixture(scope="module")
def random_rollout(four_tank):
    """Four environments under uniformly random pumps for 70 steps (one reset each)."""
    env, params = four_tank
    return rollout(KEY, env, params, uniform_random_policy(env), 4, 70, record=True)


@pytest.fixture(scope="module")
def case():
    return json.loads(CASE_FILE.read_text())


def params_of(case: dict):
    """Our parameters for a pc-gym case: its x0, setpoint schedules, dt = tsim / N, N."""
    env_params = case["env_params"]
    return make(
        "FourTank-v0",
        initial_levels=env_params["x0"][:4],
        setpoint=np.stack([env_params["SP"]["h3"], env_params["SP"]["h4"]], axis=1),
        dt=env_params["tsim"] / env_params["N"],
        horizon=env_params["N"],
    )


def check_against_reference(case: dict, reference, level_rtol: float = 0.0) -> np.ndarray:
    """Our episode of ``case`` against pc-gym's: levels within ``LEVEL_ATOL + level_rtol
    |pc-gym's level|``, setpoints and rewards under the conventions of the task. Returns
    our levels (``[steps + 1, 4]``)."""
    env, params = params_of(case)
    actions = np.asarray(case["actions"])
    observations, steps = run_actions(env, params, actions)
    expected = np.asarray(reference["observations"])
    assert observations.shape == expected.shape == (len(actions) + 1, 6)
    assert not bool(steps.terminated.any())
    np.testing.assert_allclose(
        observations[:, :4], expected[:, :4], rtol=level_rtol, atol=LEVEL_ATOL
    )
    # pc-gym shows the setpoint of the interval just ended, we show the next one's.
    np.testing.assert_allclose(observations[:-1, 4:], expected[1:, 4:], rtol=0, atol=1e-7)
    # The rewards are -sum_k (h_k - SP_k)^2 over the tracked h3, h4: a level within tol_k of
    # pc-gym's moves it by at most sum_k 2 |h_k - SP_k| tol_k + tol_k^2 (1.9e-5 at most here).
    setpoint = np.asarray(params.setpoint, np.float64)[: len(actions)]
    tracked = expected[1:, 2:4]
    tol = LEVEL_ATOL + level_rtol * np.abs(tracked)
    reward_tol = np.sum(2.0 * np.abs(tracked - setpoint) * tol + tol**2, axis=1)
    # pc-gym rewards the level reached with the next interval's setpoint, we with the one
    # in force while it was reached: the same wherever the setpoint does not change ...
    rewards, expected_rewards = np.asarray(steps.reward), np.asarray(reference["rewards"])
    next_setpoint = np.asarray(params.setpoint, np.float64)[1 : len(actions) + 1]
    same = np.all(setpoint == next_setpoint, axis=1)
    assert same.sum() == len(actions) - 1  # the schedule changes once, after step 29
    assert np.all(np.abs(rewards - expected_rewards)[same] <= reward_tol[same])
    # ... and on every step pc-gym's reward of its own levels with our setpoint convention.
    ours = -np.sum((tracked - setpoint) ** 2, axis=1)
    assert np.all(np.abs(rewards - ours) <= reward_tol)
    return observations[:, :4]


def test_matches_the_recorded_pcgym_episode(case):
    reference = np.load(RECORDED)
    assert str(reference["pcgym_version"]) == "0.1.8"
    np.testing.assert_array_equal(reference["actions"], case["actions"])
    # The case drives the levels through most of their range, empty alarm included.
    levels = reference["observations"][:, :4]
    assert levels.min() < 0.01 and levels.max() > 0.5 and levels.min() > 0.0
    check_against_reference(case, reference)


@pytest.fixture(scope="module")
def bounds_recorded():
    recorded = np.load(BOUNDS_RECORDED)
    assert str(recorded["pcgym_version"]) == "0.1.8"
    return recorded


def recorded_sequence(recorded, name: str) -> dict[str, np.ndarray]:
    return {
        field: recorded[f"{name}.{field}"]
        for field in ("observations", "rewards", "actions", "converged")
    }


def test_the_bound_sequences_hold_the_pumps_at_their_bounds(bounds_recorded):
    sequences = json.loads(BOUNDS_FILE.read_text())["sequences"]
    held = set()
    for name, sequence in sequences.items():
        actions = recorded_sequence(bounds_recorded, name)["actions"]
        np.testing.assert_array_equal(actions, sequence["actions"])
        assert actions.shape == (59, 2) and set(np.unique(actions)) <= {0.1, 10.0}
        held |= {tuple(row) for row in actions}
        if name.startswith("alternate_each") or name == "alternate_crossed":
            assert np.all(actions[1:] != actions[:-1])  # both pumps switch every interval
    # Every corner of the action box, held and alternating; the tanks drained to their
    # floor (levels below 1e-4 m) and filled above the rim.
    assert held == {(0.1, 0.1), (0.1, 10.0), (10.0, 0.1), (10.0, 10.0)}
    converged = np.stack([bounds_recorded[f"{name}.converged"] for name in sequences])
    assert converged.min() < 4e-5 and converged.max() > 0.7 and converged.min() > 0.0


@pytest.mark.parametrize("name", BOUND_SEQUENCES)
def test_pumps_held_at_their_bounds_match_pcgym_and_a_converged_solution(
    case, bounds_recorded, name
):
    recorded = recorded_sequence(bounds_recorded, name)
    levels = check_against_reference(
        {**case, "actions": recorded["actions"]}, recorded, level_rtol=BOUNDS_LEVEL_RTOL
    )
    np.testing.assert_allclose(levels, recorded["converged"], rtol=0, atol=CONVERGED_ATOL)
    floor = recorded["converged"] < FLOOR_LEVEL
    assert np.all(np.abs(levels - recorded["converged"])[floor] <= FLOOR_ATOL)


def test_a_long_interval_from_an_empty_floor_matches_a_converged_solution(four_tank):
    """The graded grid takes the stiff floor at any ``dt`` (here 300 s, 18 benchmark
    intervals in one, 216 steps): pumps at 0.1 V hold the floor, then at 10 V refill from
    it."""
    from scipy.integrate import solve_ivp

    env, _ = four_tank
    _, params = make("FourTank-v0", dt=300.0, initial_levels=[2e-4, 1e-4, 1e-4, 5e-5])
    actions = np.array([[0.1, 0.1], [10.0, 10.0], [0.1, 10.0]])
    observations, steps = run_actions(env, params, actions)
    assert not bool(steps.info.diverged.any())

    def derivative(_t, levels, pumps):  # the model's equations in float64
        outflow = np.array([0.0035, 0.0030, 0.0020, 0.0025]) * np.sqrt(
            2 * 9.81 * np.maximum(levels, 0.0)
        )
        flow = np.array([0.00085, 0.00095]) * pumps
        to_lower, to_upper = 0.2 * flow, 0.8 * flow
        inflow = [outflow[2] + to_lower[0], outflow[3] + to_lower[1], to_upper[1], to_upper[0]]
        return np.asarray(inflow) - outflow

    expected = [observations[0, :4]]
    for pumps in actions:
        solution = solve_ivp(
            derivative, (0.0, 300.0), expected[-1], "Radau", args=(pumps,), rtol=1e-10, atol=1e-14
        )
        expected.append(solution.y[:, -1])
    expected = np.stack(expected)
    # Within 1e-5 of the level, and 1e-7 m at the floor (measured 4.4e-11 m; 1.6e-7 m,
    # 5.4e-7 of the level, after 300 s of filling).
    np.testing.assert_allclose(observations[:, :4], expected, rtol=1e-5, atol=1e-7)
    assert expected[1, 2:].max() < 1e-4  # the first interval ends on the upper tanks' floor


def test_an_interval_beyond_the_solver_budget_is_reported_as_diverged(four_tank):
    _, params = four_tank
    assert int(graded_steps(params.dt, step_scale=FourTank.step_scale, min_steps=12)) == 12
    assert int(graded_steps(300.0, step_scale=FourTank.step_scale, min_steps=12)) == 216
    env = type("FourTankTwoSteps", (FourTank,), {"max_steps": 2})()
    state, _ = env.reset(KEY, params)
    state, timestep = jit_step(env, state, jnp.array([5.0, 5.0]), params)
    # The interval needs 12 steps; the budget allows 2: no state of the interval is claimed.
    assert bool(timestep.terminated) and bool(timestep.info.diverged)
    np.testing.assert_array_equal(timestep.observation[:4], params.initial_levels)
    np.testing.assert_array_equal(timestep.cost, np.ones(8))


@pytest.mark.slow
def test_matches_a_live_pcgym_recording(case, tmp_path):
    if not REFERENCE_PYTHON.exists():
        pytest.skip("pc-gym's environment (.venv-reference) is not installed")
    out = tmp_path / "four_tank_live.npz"
    subprocess.run(
        [str(REFERENCE_PYTHON), str(REFERENCES / "pcgym_record.py"), str(CASE_FILE), str(out)],
        check=True,
        capture_output=True,
    )
    live = np.load(out)
    np.testing.assert_allclose(live["observations"], np.load(RECORDED)["observations"], atol=1e-12)
    check_against_reference(case, live)


@pytest.mark.slow
def test_the_bound_sequences_match_a_live_recording(bounds_recorded, tmp_path):
    if not REFERENCE_PYTHON.exists():
        pytest.skip("pc-gym's environment (.venv-reference) is not installed")
    out = tmp_path / "four_tank_bounds_live.npz"
    subprocess.run(
        [
            str(REFERENCE_PYTHON),
            str(REFERENCES / "four_tank_bounds_record.py"),
            str(BOUNDS_FILE),
            str(out),
        ],
        check=True,
        capture_output=True,
        cwd=REFERENCES,
    )
    live = np.load(out)
    for name in BOUND_SEQUENCES:
        ours, theirs = recorded_sequence(live, name), recorded_sequence(bounds_recorded, name)
        np.testing.assert_allclose(ours["observations"], theirs["observations"], atol=1e-12)
        np.testing.assert_allclose(ours["converged"], theirs["converged"], atol=1e-11)


def test_the_vector_field_is_pc_gyms_model(four_tank):
    env, params = four_tank
    levels = np.array([0.3, 0.2, 0.5, 0.1])
    pumps = np.array([4.0, 7.0])
    outflow = np.array([0.0035, 0.0030, 0.0020, 0.0025]) * np.sqrt(2 * 9.81 * levels)
    expected = [
        -outflow[0] + outflow[2] + 0.2 * 0.00085 * pumps[0],
        -outflow[1] + outflow[3] + 0.2 * 0.00095 * pumps[1],
        -outflow[2] + 0.8 * 0.00095 * pumps[1],
        -outflow[3] + 0.8 * 0.00085 * pumps[0],
    ]
    derivative = env.vector_field(jnp.asarray(levels), jnp.asarray(pumps), jnp.zeros(0), params)
    np.testing.assert_allclose(derivative, expected, rtol=1e-5)


def test_each_implicit_stage_is_solved_exactly(four_tank):
    """The closed-form stage solve returns the derivative at the stage's own solution:
    ``k = f(base + h_gamma k)`` for the model's vector field, from the floor to the rim,
    for stages short and long and pumps anywhere in their range."""
    env, params = four_tank
    rng = np.random.default_rng(3)
    base = np.concatenate([rng.uniform(0.0, 0.7, (200, 4)), rng.uniform(0.0, 1e-4, (200, 4))])
    h_gamma = np.exp(rng.uniform(np.log(1e-3), np.log(10.0), 400))
    pumps = rng.uniform(0.1, 10.0, (400, 2))

    def residual(base, h_gamma, pumps):
        flow = params.pump_gain * pumps
        direct = jnp.stack(
            [
                params.gamma[0] * flow[0],
                params.gamma[1] * flow[1],
                (1 - params.gamma[1]) * flow[1],
                (1 - params.gamma[0]) * flow[0],
            ]
        )
        outlet = params.outlet_area * jnp.sqrt(2.0 * 9.81)
        k = env.stage_solve(base, h_gamma, (direct, outlet, params.tank_area))
        level = base + h_gamma * k
        return level, k - env.vector_field(level, pumps, jnp.zeros(0), params)

    level, error = jax.jit(jax.vmap(residual))(
        jnp.asarray(base, jnp.float32), jnp.asarray(h_gamma, jnp.float32), jnp.asarray(pumps)
    )
    assert np.all(np.asarray(level) >= -1e-9)
    # To float32's rounding of the largest flow (8e-3 m/s): 4e-9 m/s is 4 of its ulps.
    np.testing.assert_allclose(error, 0.0, atol=4e-9)


def test_an_unfed_tank_empties_and_stays_empty(four_tank):
    env, _ = four_tank
    # A pump gain of 1e-12 feeds nothing: the tanks drain, where pc-gym's solver fails.
    _, params = make("FourTank-v0", pump_gain=[1e-12, 1e-12])
    observations, steps = run_actions(env, params, np.full((60, 2), 0.1))
    levels = observations[:, :4]
    assert np.all(np.isfinite(levels)) and not bool(steps.info.diverged.any())
    # Empty: below 1e-15 m (the trickle of 1e-13 m³/s holds a tank at about 1e-21 m;
    # float32 resolves 6e-8 m at the rim).
    empty = levels < 1e-15
    assert np.all(levels >= 0.0) and np.all(empty[-1])
    first_empty = np.argmax(empty[:, 2])
    assert 0 < first_empty < 10 and np.all(empty[first_empty:, 2])


def test_names_units_and_the_task(four_tank):
    env, params = four_tank
    check_observation_bounds(env)  # names, units and bounds agree in length
    assert env.observation_names == ("h1", "h2", "h3", "h4", "h3_setpoint", "h4_setpoint")
    assert env.observation_units == ("m",) * 6
    assert env.action_names == ("v1", "v2") and env.action_units == ("V", "V")
    assert env.cost_names == COST_NAMES and len(COST_NAMES) == 8
    np.testing.assert_allclose(float(params.dt), 1000.0 / 60.0, rtol=1e-7)
    task = Task.from_env("FourTank-v0")
    assert task.observation_names == env.observation_names
    assert task.observation_units == env.observation_units
    assert (task.action_names, task.action_units) == (("v1", "v2"), ("V", "V"))
    assert task.action_low == pytest.approx((0.1, 0.1)) and task.action_high == (10.0, 10.0)
    assert task.cost_names == COST_NAMES and task.episode_length == 60
    limits = dict.fromkeys(COST_NAMES, 6.0)
    assert env.default_cost_limits() == limits
    assert task.cost_limits == limits and task.constraints.cost_limits == limits


def test_default_constraints_are_the_yaml_file_and_price_the_levels(four_tank, random_rollout):
    env, params = four_tank
    spec = env.default_constraints()
    from_file = load_constraint_spec(ROOT / "configs" / "constraints" / "four-tank.yaml")
    assert spec.model_dump(exclude={"description"}) == from_file.model_dump(exclude={"description"})
    moved = env.default_constraints(env.default_params(tank_height=0.5, min_level=0.02))
    assert {cost.threshold for cost in moved.costs} == {0.5, 0.02}
    # The spec's costs, computed from the observation, are the environment's.
    compiled = env.compile_constraints(spec)
    transitions = random_rollout.transitions
    np.testing.assert_array_equal(
        spec_costs(compiled, transitions.next_observation), transitions.cost
    )
    # Pump 2 at full voltage overflows tank 3 and only it; both pumps at the minimum
    # empty every tank.
    full = np.asarray(run_actions(env, params, np.tile([5.0, 10.0], (60, 1)))[1].cost).sum(0)
    assert full[2] > 0 and full[[0, 1, 3]].sum() == 0
    drained = run_actions(env, params, np.full((60, 2), 0.1))[1].cost
    assert np.all(np.asarray(drained[:, 4:]).sum(0) > 0) and float(drained[:, :4].sum()) == 0
    start = np.asarray(params.initial_levels)
    assert np.all((start > params.min_level) & (start < params.tank_height))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"tank_area": [1.0, -1.0, 1.0, 1.0]}, r"tank_area\[1\]"),
        ({"outlet_area": [0.0035, 0.0, 0.002, 0.0025]}, r"outlet_area\[1\]: must be positive"),
        ({"outlet_area": [2.0, 0.003, 0.002, 0.0025]}, r"outlet_area\[0\]: must be smaller"),
        ({"gamma": [0.2, 1.5]}, r"gamma\[1\]"),
        ({"pump_gain": [0.00085, float("nan")]}, r"pump_gain\[1\]"),
        ({"setpoint": [[0.5, 0.2], [0.1, 0.7]]}, r"setpoint\[\[1, 1\]\]"),
        ({"setpoint": [0.5, -0.1]}, r"setpoint\[\[0, 1\]\]"),
        ({"setpoint": np.zeros((0, 2))}, "setpoint: expected at least one row"),
        ({"initial_levels": [0.1, 0.1, 0.1]}, "initial_levels: expected shape"),
        ({"initial_levels": [0.1, 0.1, 0.65, 0.1]}, r"initial_levels\[2\]"),
        ({"tank_height": 0.0}, "tank_height: must be positive"),
        ({"min_level": 0.7}, "min_level: must lie below tank_height"),
        ({"dt": -1.0}, "dt: must be positive"),
        ({"horizon": 0}, "horizon: expected a positive integer"),
        ({"gravity": 9.81}, "gravity: unknown four-tank parameter"),
    ],
)
def test_invalid_parameters_name_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        make("FourTank-v0", **overrides)


def test_a_constant_setpoint_pair_is_held_for_the_episode():
    _, params = make("FourTank-v0", setpoint=[0.3, 0.25])
    assert params.setpoint.shape == (1, 2)
    env = FourTank()
    observations, _ = run_actions(env, params, np.full((3, 2), 5.0))
    np.testing.assert_allclose(observations[:, 4:], np.tile([0.3, 0.25], (4, 1)), rtol=1e-7)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_actions_are_flagged_and_hold_the_control(four_tank, bad):
    env, params = four_tank
    state, _ = env.reset(KEY, params)
    state, timestep = jit_step(env, state, jnp.array([3.0, 20.0]), params)
    assert not bool(timestep.info.action_invalid)
    np.testing.assert_allclose(state.last_control, [3.0, 10.0])  # saturated at 10 V
    state, timestep = jit_step(env, state, jnp.array([bad, 4.0]), params)
    assert bool(timestep.info.action_invalid)
    np.testing.assert_allclose(state.last_control, [3.0, 4.0])
    assert np.all(np.isfinite(timestep.observation))


def test_leaving_the_envelope_or_a_non_finite_state_terminates_with_full_cost(four_tank):
    env, _ = four_tank
    start = env.default_params().initial_levels
    # Pumps a thousand times too strong fill the tanks beyond 2 m within one interval ...
    _, strong = make("FourTank-v0", pump_gain=[1.0, 1.0])
    # ... and a tank without area (past the host's checks) makes the derivative infinite.
    flat = env.default_params().replace(tank_area=jnp.zeros(4))
    for params in (strong, flat):
        state, _ = env.reset(KEY, params)
        state, timestep = jit_step(env, state, jnp.array([5.0, 5.0]), params)
        assert bool(timestep.terminated) and bool(timestep.info.diverged)
        np.testing.assert_array_equal(timestep.cost, np.ones(8))
        np.testing.assert_array_equal(timestep.observation[:4], start)
        assert np.all(np.isfinite(timestep.observation))


def test_check_env_passes_with_warnings_as_errors():
    env = gymnasium.make("neorl_industrial/FourTank-v0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # The Gymnasium shell acts in [-1, 1], mapped to the pumps' [0.1, 10] V.
        check_env(env.unwrapped, skip_render_check=True)


def test_batched_steps_and_rollouts_auto_reset_without_nan(four_tank, random_rollout):
    env, params = four_tank
    states, timesteps = env.reset_batch(KEY, 3, params)
    assert timesteps.observation.shape == (3, 6)
    actions = jnp.array([[0.1, 0.1], [5.0, 5.0], [10.0, 10.0]])
    states, timesteps = jax.jit(env.step_batch)(KEY, states, actions, params)
    start = env.reset(KEY, params)[0]
    single = [jit_step(env, start, action, params)[1].observation for action in actions]
    np.testing.assert_allclose(timesteps.observation, np.stack(single), rtol=1e-6)
    assert len(set(np.asarray(timesteps.observation[:, 0]).tolist())) == 3
    transitions = random_rollout.transitions
    np.testing.assert_array_equal(random_rollout.episodes, [1, 1, 1, 1])
    assert np.all(np.isfinite(transitions.observation)) and np.all(np.isfinite(transitions.reward))
    np.testing.assert_array_equal(transitions.truncated[59], True)
    # Step 60 starts a new episode from the canonical levels.
    np.testing.assert_allclose(
        transitions.observation[60, :, :4], np.tile(params.initial_levels, (4, 1))
    )


def test_a_vmap_over_two_traced_parameter_values_compiles_once(four_tank):
    env, _ = four_tank
    traces = []
    first = env.default_params(gamma=[0.2, 0.2])
    second = env.default_params(gamma=[0.7, 0.6], setpoint=np.full((60, 2), 0.2), dt=10.0)
    params = jax.tree.map(lambda a, b: jnp.stack([a, b]), first, second)

    @jax.jit
    def returns(params):
        traces.append(None)

        def one(params):
            return rollout(KEY, env, params, constant_policy(jnp.array([6.0, 4.0])), 1, 20)

        return jax.vmap(one)(params).total_reward[:, 0]

    values = np.asarray(returns(params))
    again = np.asarray(returns(jax.tree.map(lambda leaf: leaf[::-1], params)))
    assert len(traces) == 1
    assert np.all(np.isfinite(values)) and values[0] != values[1]
    np.testing.assert_allclose(again, values[::-1], rtol=1e-6)
