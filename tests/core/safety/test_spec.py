"""Constraint specs: YAML round trip, compilation by name, errors that name the field."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from neorl_industrial.core.safety import ConstraintSpec, ConstraintSpecError
from neorl_industrial.wrappers.constraint_files import (
    constraint_spec_from_text,
    constraint_spec_yaml,
    load_constraint_spec,
)

EXAMPLE = Path(__file__).resolve().parents[3] / "configs" / "constraints" / "ib-example.yaml"
OBS = ("setpoint", "velocity", "gain", "shift", "fatigue", "consumption")
ACT = ("velocity", "gain", "shift")


def test_example_loads_compiles_and_round_trips():
    spec = load_constraint_spec(EXAMPLE)
    again = constraint_spec_from_text(constraint_spec_yaml(spec))
    assert again == spec
    compiled = spec.compile(6, 3, OBS, ACT)
    assert compiled.names == spec.hard_names
    assert compiled.names[:3] == ("bounds/velocity", "bounds/gain", "bounds/shift")
    assert "no-velocity-decrease-when-fatigued" in compiled.names
    assert compiled.cost_names == ("fatigue", "consumption")
    np.testing.assert_array_equal(compiled.state_feature, [OBS.index("fatigue")])
    np.testing.assert_allclose(compiled.linear_obs[0], [0, 0.005, 0.005, 0, 0, 0])
    np.testing.assert_allclose(compiled.linear_act[0], [1, 1, 0])
    assert compiled.fallback_kind == "constant"


def test_default_names_when_the_environment_gives_none():
    spec = ConstraintSpec.from_dict({"action_bounds": {"action_1": [-2, 2]}})
    compiled = spec.compile(4, 2)
    np.testing.assert_array_equal(compiled.bound_index, [1])
    assert compiled.names == ("bounds/action_1",)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("action_bounds: {velocity: [1, -1]}", "action_bounds.velocity: low 1.0 is above high"),
        ("action_bounds: {velocity: [1, 2, 3]}", "action_bounds.velocity: expected [low, high]"),
        ("rate_limits: {gain: -0.5}", "rate_limits.gain: must be a finite number in [0, 1e"),
        (
            "rate_limit: {gain: 0.5}",
            "rate_limit: unknown field 'rate_limit'; did you mean 'rate_limits'",
        ),
        (
            "state_limits: [{name: a, when: {feature: f, abov: 1}, action: v, max: 0}]",
            "state_limits[0].when.abov: unknown field 'abov'; did you mean 'above'",
        ),
        (
            "linear: [{name: l, action: {gain: 1}, bound: 1, priorty: 5}]",
            "linear[0].priorty: unknown field 'priorty'; did you mean 'priority'",
        ),
        ("rate_limits: {gain: {max_chnage: 1}}", "rate_limits.gain.max_chnage: unknown field"),
        ("rate_limits: {gain: {max_change: 1, priority: -1}}", "rate_limits.gain.priority"),
        ("rate_limits: {gain: {max_change: 1, priority: 1.5}}", "rate_limits.gain.priority"),
        ("rate_limits: {gain: {max_change: 1, priority: true}}", "rate_limits.gain.priority"),
        (
            "state_limits: [{name: a, when: {feature: fatigue}, action: velocity, max: 0}]",
            "state_limits[0].when: give exactly one of 'above' or 'below'",
        ),
        (
            "state_limits: [{name: a, when: {feature: fatigue, above: 1}, action: velocity}]",
            "state_limits[0]: give 'max', 'min' or both",
        ),
        ("linear: [{name: l, action: {gain: 0}, bound: 1}]", "linear[0]: 'action' needs"),
        ("fallback: {kind: constant}", "fallback: a 'constant' fallback needs a 'value'"),
        ("fallback: {kind: teleport}", "fallback.kind: Input should be"),
        ("costs: [{name: c, feature: fatigue, above: 1, cost_limit: -1}]", "costs[0].cost_limit"),
        ("action_bounds: [1, 2]", "action_bounds: Input should be a valid dictionary"),
        ("[1, 2]", "expected a mapping of constraint kinds"),
        ("action_bounds: {velocity: [.nan, 1]}", "low must be a finite number"),
    ],
)
def test_invalid_specs_name_the_field(text, expected):
    with pytest.raises(ConstraintSpecError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        constraint_spec_from_text(text, "plant.yaml")


def test_errors_name_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("rate_limits: {gain: x}\n")
    with pytest.raises(ConstraintSpecError, match=r"broken.yaml: rate_limits.gain"):
        load_constraint_spec(path)
    with pytest.raises(ConstraintSpecError, match="not valid YAML"):
        constraint_spec_from_text("a: [1, 2", "x.yaml")
    with pytest.raises(ConstraintSpecError, match="cannot read"):
        load_constraint_spec(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"action_bounds": {"velocty": [-1, 1]}},
            r"action_bounds.velocty: unknown action 'velocty'; did you mean \['velocity'\]",
        ),
        (
            {
                "state_limits": [
                    {
                        "name": "s",
                        "when": {"feature": "fatige", "above": 1},
                        "action": "gain",
                        "max": 0,
                    }
                ]
            },
            r"state_limits\[0\].when.feature: unknown observation feature 'fatige'",
        ),
        (
            {
                "linear": [
                    {"name": "l", "observation": {"speed": 1}, "action": {"gain": 1}, "bound": 1}
                ]
            },
            r"linear\[0\].observation.speed",
        ),
        (
            {"fallback": {"kind": "controller", "controller": "nope"}},
            r"fallback.controller: unknown safe controller 'nope'",
        ),
        (
            {"costs": [{"name": "c", "feature": "heat", "above": 1, "cost_limit": 5}]},
            r"costs\[0\].feature",
        ),
    ],
)
def test_unknown_names_fail_at_compile_time(data, expected):
    spec = ConstraintSpec.from_dict(data)
    with pytest.raises(ConstraintSpecError, match=expected):
        spec.compile(6, 3, OBS, ACT)


def test_repeated_names_are_rejected():
    limit = {"name": "same", "when": {"feature": "fatigue", "above": 1}, "action": "gain", "max": 0}
    with pytest.raises(ConstraintSpecError, match="repeated: \\['same'\\]"):
        ConstraintSpec.from_dict({"state_limits": [limit, limit]})


def test_the_ib_default_constraints_are_the_example_file():
    from neorl_industrial.core.environments import make

    env, _ = make("IB-v0")
    default = env.default_constraints()
    example = load_constraint_spec(EXAMPLE)
    assert default.model_dump(exclude={"description"}) == example.model_dump(
        exclude={"description"}
    )
    compiled = env.compile_constraints()
    assert compiled.action_size == 3
    assert compiled.cost_names == env.cost_names
    # The newest frame's fatigue, not an older one.
    assert env.observation_names[int(compiled.state_feature[0])] == "fatigue"


def test_every_registered_environment_declares_constraints():
    from neorl_industrial.core.environments import make, registered_envs

    for env_id in registered_envs():
        env, _ = make(env_id)
        compiled = env.compile_constraints()
        assert compiled.action_size == env.action_size


def test_priorities_default_by_kind_and_round_trip():
    spec = constraint_spec_from_text(
        """
        rate_limits: {velocity: 1.0, gain: {max_change: 0.5, priority: 400}}
        state_limits:
          - {name: interlock, when: {feature: fatigue, above: 50}, action: velocity, min: 0}
          - {name: soft, when: {feature: fatigue, above: 80}, action: gain, max: 0, priority: 50}
        linear:
          - {name: push, action: {velocity: 1, gain: 1}, bound: 1.5}
        """
    )
    assert spec.priorities == {
        "rate/velocity": 100,
        "rate/gain": 400,
        "interlock": 300,
        "soft": 50,
        "push": 200,
    }
    compiled = spec.compile(6, 3, OBS, ACT)
    assert compiled.levels == (400, 300, 200, 100, 50)
    assert dict(zip(compiled.names, compiled.priorities, strict=True)) == {
        "rate/velocity": 100,
        "rate/gain": 400,
        "interlock": 300,
        "soft": 50,
        "push": 200,
    }
    data = spec.to_dict()
    # A rate limit without its own priority stays the bare number.
    assert data["rate_limits"] == {"velocity": 1.0, "gain": {"max_change": 0.5, "priority": 400}}
    assert constraint_spec_from_text(constraint_spec_yaml(spec)) == spec


def test_a_huge_unknown_name_is_quoted_short():
    spec = ConstraintSpec.from_dict({"action_bounds": {"v" * 1_000_000: [-1, 1]}})
    with pytest.raises(ConstraintSpecError) as caught:
        spec.compile(6, 3, OBS, ACT)
    assert len(str(caught.value)) < 600
    assert "(1000000 characters)" in str(caught.value)
