"""The safety contract: which cost channels a run is held to and where each limit comes
from, decided in one place."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from neorl_industrial.core.environments import Task
from neorl_industrial.core.safety import ConstraintSpec, check_cost_limits, resolve_safety


def plant(**changes) -> Task:
    values = dict(
        name="tank",
        observation_names=("level", "temperature"),
        action_names=("valve",),
        action_low=(0.0,),
        action_high=(100.0,),
        cost_names=("alarm",),
        cost_limits={"alarm": 12.0},
    )
    return Task.create(**{**values, **changes})


def test_the_tasks_channels_and_limits_without_a_spec_of_costs():
    contract = resolve_safety(plant())
    assert contract.cost_names == ("alarm",)
    assert contract.limits() == [12.0] and contract.limit_sources == ("task",)
    assert not contract.relabel


def test_explicit_limits_win_then_the_spec_then_the_task():
    spec = ConstraintSpec.from_dict(
        {"costs": [{"name": "alarm", "feature": "level", "above": 2.5, "cost_limit": 5.0}]}
    )
    assert resolve_safety(plant(), spec).limits() == [5.0]
    assert resolve_safety(plant(), spec).limit_sources == ("spec",)
    assert resolve_safety(plant(), spec, [7.0]).limits() == [7.0]
    assert resolve_safety(plant(), spec, [7.0]).limit_sources == ("run",)


def test_a_spec_defining_other_channels_relabels_the_data():
    spec = ConstraintSpec.from_dict(
        {"costs": [{"name": "too-hot", "feature": "temperature", "above": 80, "cost_limit": 3}]}
    )
    contract = resolve_safety(plant(), spec)
    assert contract.cost_names == ("too-hot",) and contract.relabel


def test_missing_and_bad_limits_are_named():
    no_limits = plant(cost_limits={})
    assert resolve_safety(no_limits).limit_sources == ("none",)
    with pytest.raises(ValueError, match=r"no episode cost limit for \['alarm'\]"):
        resolve_safety(no_limits, require_limits=True)
    with pytest.raises(ValueError, match="expected one episode cost limit per cost channel"):
        resolve_safety(plant(), None, [1.0, 2.0])
    with pytest.raises(ValueError, match=r"cost_limits\[alarm\]: must be a finite number >= 0"):
        check_cost_limits([float("nan")], 1, "cost_limits", ["alarm"])


def test_limits_are_a_traced_leaf():
    contracts = [resolve_safety(plant(), None, [limit]) for limit in (1.0, 2.0)]
    stacked = jax.tree.map(lambda *leaves: np.stack(leaves), *contracts)
    doubled = jax.vmap(lambda contract: contract.cost_limits * 2)(stacked)
    np.testing.assert_array_equal(np.asarray(doubled), [[2.0], [4.0]])


def test_a_spec_redefining_a_channel_relabels_and_the_tasks_own_does_not():
    task = Task.from_env("IB-classic-v0", {"fatigue_limit": 50.0})
    assert task.cost_definitions["fatigue"] == "fatigue > 50.0"
    assert not resolve_safety(task).relabel  # the task's own spec follows its parameters
    stricter = ConstraintSpec.from_dict(
        {
            "costs": [
                {"name": "fatigue", "feature": "fatigue", "above": 40.0, "cost_limit": 10},
                {"name": "consumption", "feature": "consumption", "above": 280.0, "cost_limit": 10},
            ]
        }
    )
    assert resolve_safety(task, stricter).relabel


def test_a_channel_without_a_limit_is_recorded_as_null_not_infinity():
    """One record form for the limits (report.json, MLflow, a saved agent): JSON has no
    infinity."""
    import json

    two = plant(cost_names=("alarm", "trip"), cost_limits={"alarm": 12.0})
    contract = resolve_safety(two)
    assert contract.limits() == [12.0, float("inf")]  # for the computation
    assert contract.limit_record() == [12.0, None]
    assert json.loads(json.dumps(contract.limit_record(), allow_nan=False)) == [12.0, None]
    assert resolve_safety(plant(cost_names=(), cost_limits={})).limit_record() is None
