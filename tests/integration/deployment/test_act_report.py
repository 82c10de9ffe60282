"""The live ``/v1/act`` report of a policy exported from a plant log (no simulator): a
reading outside the data's range is flagged and decided as any other, and a conflict
says what the applied action still breaks, in the response and in the audit record."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from neorl_industrial.integration.deployment import create_app
from neorl_industrial.integration.safety import AuditLog
from neorl_industrial.wrappers.agents import PolicyArtifact
from neorl_industrial.wrappers.agents.signing import generate_key_pair
from tests.integration.deployment.test_server import AS_ACT, _settings
from tests.wrappers.agents.test_export_report import (
    HIGH,
    HOTTER,
    INSIDE,
    conflicting_spec,
    export_plant_policy,
    plant_task,
)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("plant-report")
    _, _, task = plant_task()
    # Signed by the key _settings trusts (the servers trust only signed policies).
    key = generate_key_pair(root / "keys")
    model = export_plant_policy(root / "policy", task, conflicting_spec(), signing_key=key)
    # Batches of up to 4 (the batch request below sends 3): the server compiles the
    # conflicting shield for 1, 2 and 4 rows only, not every size up to 16.
    settings = _settings(root, model, batch_sizes=[1, 2, 4], max_batch=4)
    with TestClient(create_app(settings)) as client:
        yield client, PolicyArtifact.load(model), root / "audit.jsonl"


def test_a_reading_outside_the_data_is_flagged_not_overridden(served):
    client, artifact, _ = served
    proposal = artifact.predict(np.asarray([HOTTER], np.float32)).proposed[0]
    body = {"observation": HOTTER, "prev_action": proposal.tolist()}
    response = client.post("/v1/act", json=body, headers=AS_ACT)
    assert response.status_code == 200, response.text
    data = response.json()
    report = data["report"]
    assert report["out_of_distribution"] is True and report["status"] & 64
    assert report["overridden"] is False and report["violated_after"] == []
    np.testing.assert_allclose(data["action"], proposal, atol=1e-4)
    inside = client.post("/v1/act", json={"observation": INSIDE}, headers=AS_ACT).json()
    assert inside["report"]["out_of_distribution"] is False


def test_a_conflict_names_what_the_applied_action_still_breaks(served):
    client, _, audit = served
    body = {"observation": HIGH, "prev_action": [50.0, 50.0], "request_id": "conflict-1"}
    report = client.post("/v1/act", json=body, headers=AS_ACT).json()["report"]
    assert report["infeasible"] and report["fallback"] and report["overridden"]
    assert report["violated_after"] == ["outflow-budget"]
    assert report["out_of_distribution"] is False
    (record,) = [r for r in AuditLog.read(audit) if r.get("request_id") == "conflict-1"]
    assert record["violated_after"] == ["outflow-budget"]
    batch = {"observations": [HIGH, INSIDE, HOTTER], "prev_actions": [[50.0, 50.0]] * 3}
    reports = client.post("/v1/act/batch", json=batch, headers=AS_ACT).json()["reports"]
    assert [r["violated_after"] for r in reports][:2] == [["outflow-budget"], []]
    assert [r["out_of_distribution"] for r in reports] == [False, False, True]


def test_the_start_probes_are_the_artifacts_own(tmp_path, monkeypatch):
    """The random probes a server draws at start come from the artifact's content: the
    same policy, exported twice, meets the same probes (a refusal is reproducible, not
    one start in many); another policy meets others."""
    from neorl_industrial.integration.deployment import pin
    from neorl_industrial.integration.deployment.policy import PolicyTrust

    drawn = []

    def recorded(compiled, task, rng):
        observations, prev = probe_inputs(compiled, task, rng)
        drawn.append(observations)
        return observations, prev

    probe_inputs = pin.probe_inputs
    monkeypatch.setattr(pin, "probe_inputs", recorded)
    _, _, task = plant_task()
    for name, spec in (("a", conflicting_spec()), ("b", conflicting_spec()), ("c", None)):
        path = export_plant_policy(tmp_path / name, task, spec or _plain_spec())
        artifact = PolicyArtifact.load(path, require_signature=False)
        enforced, served = PolicyTrust(allow_unsigned=True).check(artifact)
        check = pin.ServerCheck(enforced)
        pin.probe_refusals(artifact.with_guard(check), check, served, [1, 2])
    first, again, other = drawn
    np.testing.assert_array_equal(first, again)
    assert first.shape != other.shape or not np.array_equal(first, other)


def _plain_spec():
    from neorl_industrial.wrappers.constraint_files import load_constraint_spec
    from tests.wrappers.agents.test_export_report import EXAMPLE

    return load_constraint_spec(EXAMPLE / "constraints.yaml")
