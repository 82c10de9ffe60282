"""``/v1/act``'s inputs: observations and previous actions by name, previous actions
outside the action's bounds, and what the report says the applied action still breaks."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from fastapi.testclient import TestClient

from neorl_industrial.integration.deployment import create_app
from neorl_industrial.integration.deployment.routes import _reports, orjson_response
from neorl_industrial.integration.mlflow.pyfunc import FLAGS
from neorl_industrial.wrappers.agents import PolicyArtifact
from neorl_industrial.wrappers.agents.signing import generate_key_pair
from tests.integration.deployment.test_server import AS_ACT, _settings
from tests.wrappers.agents.test_export import exported_policy, plant_inputs


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    # Signed by the key _settings trusts (the servers trust only signed policies).
    model = exported_policy(root / "policy", signing_key=generate_key_pair(root / "keys"))
    with TestClient(create_app(_settings(root, model))) as client:
        yield client, PolicyArtifact.load(model)


def _act(client, body):
    return client.post("/v1/act", json=body, headers=AS_ACT)


def _detail(response):
    assert response.status_code == 422, response.text
    return response.json()["detail"]


def test_named_inputs_give_the_same_decision_as_ordered_ones(served):
    client, artifact = served
    observations, previous = plant_inputs(4, seed=3)
    for row in range(4):
        ordered = {"observation": observations[row].tolist(), "prev_action": previous[row].tolist()}
        named = {
            # Reversed: the order of a mapping does not matter.
            "observation": dict(
                reversed(list(zip(artifact.observation_names, ordered["observation"], strict=True)))
            ),
            "prev_action": dict(zip(artifact.action_names, ordered["prev_action"], strict=True)),
        }
        by_order, by_name = _act(client, ordered), _act(client, named)
        assert by_order.status_code == by_name.status_code == 200, by_name.text
        assert by_name.json()["action"] == by_order.json()["action"]
        assert by_name.json()["report"] == by_order.json()["report"]
    mixed = {
        "observation": dict(zip(artifact.observation_names, observations[0].tolist(), strict=True))
    }
    mixed["prev_action"] = previous[0].tolist()
    assert _act(client, mixed).status_code == 200


def test_every_observation_name_is_required(served):
    client, artifact = served
    names = artifact.observation_names
    body = {"observation": {name: 1.0 for name in names[2:]}}
    (detail,) = _detail(_act(client, body))
    assert detail["loc"] == ["body", "observation"]
    assert detail["msg"] == f"missing 2 of the 6 names: {names[0]!r}, {names[1]!r}"


def test_unknown_names_are_refused_with_a_suggestion(served):
    client, artifact = served
    names = artifact.observation_names
    values = {name: 1.0 for name in names}
    typo = names[3][:-1] + names[3][-1].upper() + "s"
    body = {"observation": {**{k: v for k, v in values.items() if k != names[3]}, typo: 1.0}}
    (detail,) = _detail(_act(client, body))
    assert detail["loc"] == ["body", "observation", typo]
    assert detail["msg"] == f"unknown name {typo!r} (did you mean {names[3]!r}?)"
    body = {"observation": values, "prev_action": {"speed": 0.0, "gain": 0.0, "shift": 0.0}}
    (detail,) = _detail(_act(client, body))
    assert detail["loc"] == ["body", "prev_action", "speed"] and "unknown name" in detail["msg"]
    two = {"observation": {**values, "a": 1.0, "b": 2.0}}
    assert "(2 unknown names in all)" in _detail(_act(client, two))[0]["msg"]


@pytest.mark.parametrize(
    ("value", "message"),
    [("1.0", "valid number"), (True, "valid number"), (1e39, "outside float32")],
)
def test_named_values_are_checked_like_ordered_ones(served, value, message):
    client, artifact = served
    names = artifact.observation_names
    body = {"observation": {**{name: 1.0 for name in names}, names[4]: value}}
    (detail,) = _detail(_act(client, body))
    assert detail["loc"] == ["body", "observation", names[4]] and message in detail["msg"]


def test_ordered_errors_name_the_element_without_the_forms_tag(served):
    client, _ = served
    detail = _detail(_act(client, {"observation": [1.0, "x", 1.0, 1.0, 1.0, 1.0]}))
    assert [d["loc"] for d in detail] == [["body", "observation", 1]]
    detail = _detail(_act(client, {"observation": 3}))
    assert detail[0]["loc"] == ["body", "observation"] and "valid list" in detail[0]["msg"]


def test_a_previous_action_outside_its_bounds_is_refused(served):
    client, artifact = served
    low, high = artifact.action_low, artifact.action_high
    observation = [50.0] * 6
    on_bounds = {"observation": observation, "prev_action": high.tolist()}
    assert _act(client, on_bounds).status_code == 200
    assert _act(client, {"observation": observation, "prev_action": low.tolist()}).is_success
    outside = high.tolist()
    outside[1] = float(high[1]) + 0.5
    (detail,) = _detail(_act(client, {"observation": observation, "prev_action": outside}))
    name = artifact.action_names[1]
    assert detail["loc"] == ["body", "prev_action", 1]
    assert detail["msg"] == (
        f"{outside[1]!r} is outside the bounds [{low[1]:g}, {high[1]:g}] of {name!r}; the "
        "action applied at the previous step is within them"
    )
    named = dict(zip(artifact.action_names, outside, strict=True))
    (detail,) = _detail(_act(client, {"observation": observation, "prev_action": named}))
    assert detail["loc"] == ["body", "prev_action", name]
    batch = {"observations": [observation] * 3, "prev_actions": [high.tolist()] * 3}
    batch["prev_actions"][2] = [float(low[0]) - 3.0, 0.0, 0.0]
    response = client.post("/v1/act/batch", json=batch, headers=AS_ACT)
    (detail,) = _detail(response)
    assert detail["loc"] == ["body", "prev_actions", 2, 0] and "outside" in detail["msg"]


def test_the_schema_documents_both_forms(served):
    client, _ = served
    schema = client.get("/openapi.json").json()["components"]["schemas"]["ActRequest"]
    forms = schema["properties"]["observation"]["oneOf"]
    assert {form["type"] for form in forms} == {"array", "object"}


def test_reports_name_what_the_applied_action_still_breaks():
    names = ("a", "b", "c")
    decision = SimpleNamespace(
        constraint_names=names,
        margin=np.array([[-1.0, 0.5, np.inf], [0.0, 0.0, 0.0]]),
        applied_margin=np.array([[0.0, -0.2, np.nan], [0.0, 0.0, 0.0]]),
        violated=(("a",), ()),
        status=np.array([1, 0]),
        **{flag: np.array([flag == "overridden", False]) for flag in FLAGS},
    )
    first, second = _reports(decision)
    # NaN: a constraint that could not be checked counts as broken.
    assert first["violated_after"] == ["b", "c"] and second["violated_after"] == []
    assert first["violated"] == ["a"]
    # The inactive constraint's infinite margin is null in the answer's JSON.
    assert json.loads(orjson_response(first).body)["margin"] == {"a": -1.0, "b": 0.5, "c": None}


def _without_id(response):
    data = response.json()
    if isinstance(data, dict):
        data.pop("request_id", None)
    return response.status_code, data


def test_the_fast_path_answers_as_the_route_and_hands_it_everything_else(served):
    """``/v1/act``'s common form is answered without the framework's routing; the answer
    is the route's, byte for byte but the generated id, and every request it does not
    take (bad values, named values, a wrong key, another content type) gets the route's
    own answer."""
    client, artifact = served
    fast = client.app.front.app
    observations, previous = plant_inputs(4, seed=11)
    row, prev = observations[0].tolist(), previous[0].tolist()
    taken = [
        {"observation": row},
        {"observation": row, "prev_action": prev, "request_id": "plant-7/step:12"},
        {"observation": [round(v) for v in row]},  # JSON integers are numbers
        {"observation": observations[1].tolist(), "prev_action": None},
    ]
    handed = [
        {"observation": [True, *row[1:]]},  # a boolean is not a number
        {"observation": ["1.0", *row[1:]]},
        {"observation": row[:-1]},
        {"observation": [1e39, *row[1:]]},  # outside float32
        {"observation": row, "extra": 1},
        {"observation": row, "prev_action": [5.0] * len(prev)},  # outside the bounds
        {"observation": row, "request_id": "a b"},
        {"observation": dict(zip(artifact.observation_names, row, strict=True))},
        {"prev_action": prev},
        [row],
    ]
    for body in taken + handed:
        answered = fast.answered
        first = _without_id(_act(client, body))
        took = fast.answered == answered + 1
        assert took == (body in taken), body
        fast.enabled = False
        try:
            assert _without_id(_act(client, body)) == first, body
        finally:
            fast.enabled = True
        named = isinstance(body, dict) and isinstance(body.get("observation"), dict)
        assert (first[0] == 200) == (body in taken or named), body
    raw = json.dumps(taken[0]).encode()
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {**AS_ACT, "Content-Type": "text/plain"},
    ):
        answered = fast.answered
        response = client.post("/v1/act", content=raw, headers=headers)
        assert fast.answered == answered and response.status_code in (401, 422), headers
    # A header's request id is kept where it keeps the rule, as the route keeps it.
    response = client.post("/v1/act", json=taken[0], headers={**AS_ACT, "X-Request-ID": "r-1"})
    assert response.json()["request_id"] == "r-1"
