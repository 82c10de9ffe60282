"""The Task: one description of a process, from a simulator or written for a plant."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from neorl_industrial.core.environments import Task, TaskError
from neorl_industrial.core.safety import ConstraintSpec, ConstraintSpecError


def plant_task(**changes) -> Task:
    values = dict(
        name="mixing-tank",
        observation_names=("level_m", "temperature_c", "inflow_m3h"),
        action_names=("valve_pct", "pump_pct"),
        action_low=(0.0, 10.0),
        action_high=(100.0, 100.0),
        observation_units=("m", "degC", "m3/h"),
        action_units=("%", "%"),
        cost_names=("high_level",),
        cost_limits={"high_level": 30.0},
    )
    values.update(changes)
    return Task.create(**values)


def test_a_simulator_task_carries_its_names_bounds_costs_and_parameters():
    task = Task.from_env("IB-v0", {"setpoint": 30.0})
    assert (task.observation_size, task.action_size) == (180, 3)
    assert task.cost_names == ("fatigue", "consumption")
    assert task.has_simulator and task.kind == "simulator"
    assert task.episode_length == 1000
    assert task.env_params == {"setpoint": 30.0}
    env, params = task.make_simulator()
    assert float(params.setpoint) == 30.0 and env.observation_size == 180
    assert task.action_low == (-1.0, -1.0, -1.0)


def test_a_plant_task_has_no_simulator_and_says_how_to_evaluate():
    task = plant_task()
    assert not task.has_simulator and task.kind == "plant"
    with pytest.raises(TaskError, match="no simulator; evaluate it off policy"):
        task.make_simulator()


def test_round_trip_through_plain_data_keeps_every_field():
    for task in (
        plant_task(observation_high=(3.2, math.inf, 80.0), exogenous=("inflow_m3h",)),
        Task.from_env("IB-v0"),
    ):
        assert Task.from_dict(task.to_dict()) == task
    # A task without exogenous features keeps the record it always had.
    assert "exogenous" not in plant_task().to_dict()


def test_a_simulator_names_what_no_action_moves():
    # The process tasks' setpoints and feed disturbances, the IB's setpoint.
    assert Task.from_env("CSTR-v0").exogenous == ("Ca_setpoint", "Ti", "Caf")
    assert Task.from_env("FourTank-v0").exogenous == ("h3_setpoint", "h4_setpoint")
    assert Task.from_env("IB-v0").exogenous == ("setpoint",)
    assert Task.from_env("Pipeline-v0").exogenous == ("target_flow",)


def test_a_run_record_holds_the_task_without_its_default_cost_limits():
    task = Task.from_env("IB-v0")
    assert task.cost_limits
    data = task.to_dict(limits=False)
    assert "cost_limits" not in data
    assert Task.from_dict(data) == dataclasses.replace(task, cost_limits={})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"action_low": (0.0, 100.0)}, "pump_pct' has a zero-width or inverted range"),
        ({"action_high": (math.inf, 100.0)}, "valve_pct' needs finite bounds"),
        ({"action_names": ("valve_pct", "valve_pct")}, "named more than once"),
        ({"observation_names": ()}, "at least one feature"),
        ({"cost_limits": {"overflow": 3.0}}, r"\['overflow'\] are not cost channels"),
        ({"cost_limits": {"high_level": -1.0}}, "cost_limits.high_level"),
        ({"action_low": (0.0,)}, "action_low: expected 2 values"),
        ({"exogenous": ("outflow_m3h",)}, r"exogenous: \['outflow_m3h'\] are not observation"),
        ({"exogenous": ("inflow_m3h", "inflow_m3h")}, "exogenous: .* named more than once"),
    ],
)
def test_bad_tasks_are_refused_naming_the_field(changes, message):
    with pytest.raises(TaskError, match=message):
        plant_task(**changes)


def test_constraints_resolve_against_the_plants_own_names():
    task = plant_task()
    spec = ConstraintSpec.from_dict(
        {
            "action_bounds": {"valve_pct": [0, 90]},
            "rate_limits": {"pump_pct": 5.0},
            "state_limits": [
                {
                    "name": "pump-when-high",
                    "when": {"feature": "level_m", "above": 2.6},
                    "action": "pump_pct",
                    "min": 60,
                }
            ],
        }
    )
    compiled = task.compile_constraints(spec)
    assert compiled.names == ("bounds/valve_pct", "rate/pump_pct", "pump-when-high")
    bad = ConstraintSpec.from_dict({"action_bounds": {"valve_position": [0, 90]}})
    with pytest.raises(ConstraintSpecError, match=r"action_bounds\.valve_position"):
        task.compile_constraints(bad)
    typo = ConstraintSpec.from_dict(
        {
            "state_limits": [
                {
                    "name": "x",
                    "when": {"feature": "levle_m", "above": 1},
                    "action": "pump_pct",
                    "max": 50,
                }
            ]
        }
    )
    with pytest.raises(ConstraintSpecError, match=r"state_limits\[0\].when.feature.*level_m"):
        task.compile_constraints(typo)


def test_default_constraints_are_the_action_bounds_in_plant_units():
    compiled = plant_task().compile_constraints()
    np.testing.assert_array_equal(np.asarray(compiled.bound_low), [0.0, 10.0])
    np.testing.assert_array_equal(np.asarray(compiled.bound_high), [100.0, 100.0])


def test_data_that_disagrees_is_refused_naming_what_differs():
    task = plant_task()
    fits = dict(observation_size=3, action_size=2, discrete=False, n_costs=1)
    task.check_data(**fits, observation_names=task.observation_names)
    with pytest.raises(TaskError, match="observations have 4 features; mixing-tank has 3"):
        task.check_data(**{**fits, "observation_size": 4})
    with pytest.raises(TaskError, match="actions have 3 dimensions"):
        task.check_data(**{**fits, "action_size": 3})
    with pytest.raises(TaskError, match="2 cost channels"):
        task.check_data(**{**fits, "n_costs": 2})
    with pytest.raises(TaskError, match=r"observation names differ.*'level' vs 'level_m'"):
        task.check_data(**fits, observation_names=("level", "temperature_c", "inflow_m3h"))


@pytest.mark.parametrize(
    ("env_id", "what"),
    [
        ("IB-v0", "Industrial Benchmark"),
        ("Pipeline-v0", "Pipeline"),
        ("DMSD-v0", "DMSD"),
        ("CSTR-v0", "CSTR"),
        ("FourTank-v0", "four-tank"),
    ],
)
def test_an_unknown_parameter_is_named_with_the_task_s_fields(env_id, what):
    from neorl_industrial.core.environments import make

    with pytest.raises(ValueError, match=f"bogus: unknown {what} parameter; expected one of"):
        make(env_id, bogus=1.0)
