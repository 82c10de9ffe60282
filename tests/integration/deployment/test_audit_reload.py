"""The server's audit log: one log across reloads, a reload refused (and nothing swapped)
when the log cannot go on, one writer per log, who asked, and aggregation by default."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from neorl_industrial.integration.deployment import SettingsError, create_app
from neorl_industrial.integration.deployment.deps import key_fingerprint
from neorl_industrial.integration.safety import AuditLog, AuditLogError
from neorl_industrial.integration.safety.audit import check_chain
from neorl_industrial.wrappers.agents import PolicyArtifact
from neorl_industrial.wrappers.agents.signing import generate_key_pair
from tests.integration.deployment.test_server import ACT, ADMIN, AS_ACT, AS_ADMIN
from tests.integration.deployment.test_server import _settings as _server_settings
from tests.wrappers.agents.test_export import exported_policy, plant_inputs


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("audited")
    # Signed by the key _settings trusts (the servers trust only signed policies).
    key = generate_key_pair(root / "keys")
    return {
        "a": exported_policy(root / "a", signing_key=key),
        "b": exported_policy(root / "b", seed=7, signing_key=key),
    }


@pytest.fixture(scope="module")
def overriding(models):
    """A body both versions' proposals break a constraint for (the shield overrides it)."""
    observations, previous = plant_inputs(64, seed=3)
    both = PolicyArtifact.load(models["a"]).predict(observations, previous).overridden
    both &= PolicyArtifact.load(models["b"]).predict(observations, previous).overridden
    row = int(both.argmax())
    assert both[row]
    return {"observation": observations[row].tolist(), "prev_action": previous[row].tolist()}


def _settings(tmp_path, model, **overrides):
    """The policy server's test settings, serving one observation at a time: these tests
    send single requests, so each server (and reload) compiles one batch size, not five."""
    return _server_settings(tmp_path, model, batch_sizes=[1], max_batch=1, **overrides)


def _version(client) -> str:
    return client.get("/readyz").json()["version"]


def test_a_reload_keeps_one_chain_and_records_the_deciding_version(tmp_path, models, overriding):
    with TestClient(create_app(_settings(tmp_path, models["a"]))) as client:
        before = _version(client)
        assert client.post("/v1/act", json=overriding, headers=AS_ACT).json()["report"]
        reloaded = client.post(
            "/v1/admin/reload", json={"model": str(models["b"])}, headers=AS_ADMIN
        )
        assert reloaded.status_code == 200, reloaded.text
        after = _version(client)
        client.post("/v1/act", json=overriding, headers=AS_ADMIN)
    overrides = [r for r in AuditLog.read(tmp_path / "audit.jsonl") if r["kind"] == "override"]
    versions = [r["policy_version"] for r in overrides]
    assert versions[0] == before and after != before
    keys = {r["key"] for r in overrides}
    assert key_fingerprint(ACT) in keys and ACT not in str(overrides)
    assert versions[-1] == after and overrides[-1]["key"] == key_fingerprint(ADMIN)
    assert check_chain(tmp_path / "audit.jsonl").ok


def _move(serving, log):
    log.rename(log.with_name("moved.jsonl"))  # an operator moved the file under the server
    log.touch()
    return "moved, replaced or deleted"


def _fail_a_write(serving, log):
    serving.audit._failed = "[Errno 28] No space left on device"
    return "a write failed: [Errno 28] No space left on device"


@pytest.mark.parametrize("breakage", [_move, _fail_a_write], ids=["moved", "write-failed"])
def test_a_reload_whose_audit_log_cannot_go_on_changes_nothing(
    tmp_path, models, overriding, breakage
):
    log = tmp_path / "audit.jsonl"
    with TestClient(create_app(_settings(tmp_path, models["a"]))) as client:
        before = _version(client)
        reason = breakage(client.app.state.serving, log)
        refused = client.post(
            "/v1/admin/reload", json={"model": str(models["b"])}, headers=AS_ADMIN
        )
        assert refused.status_code == 503, refused.text
        detail = refused.json()["detail"]
        assert str(log) in detail and reason in detail
        assert f"reload refused, {before} keeps serving" in detail
        assert _version(client) == before
        info = client.get("/v1/policy", headers=AS_ACT).json()
        assert info["version"] == before and info["audit"]["records"] >= 1
        if breakage is _move:  # the old policy serves (its overrides go to the open file)
            answer = client.post("/v1/act", json=overriding, headers=AS_ACT)
            assert answer.status_code == 200 and answer.json()["policy_version"] == before


def test_a_second_server_on_the_same_log_refuses_to_start(tmp_path, models):
    with TestClient(create_app(_settings(tmp_path, models["a"]))):
        second = create_app(_settings(tmp_path, models["a"]))
        with pytest.raises(AuditLogError) as refused, TestClient(second):
            pass
        message = str(refused.value)
        assert str(tmp_path / "audit.jsonl") in message and "pid" in message
        assert "held by another process" in message


def test_repeated_overrides_are_aggregated_by_default(tmp_path, models, overriding):
    settings = _settings(tmp_path, models["a"], audit_window_s=10.0, audit_key_rate=10.0)
    with TestClient(create_app(settings)) as client:
        for index in range(20):
            body = {**overriding, "request_id": f"step-{index}"}
            assert client.post("/v1/act", json=body, headers=AS_ACT).json()["report"]["overridden"]
        assert client.get("/v1/policy", headers=AS_ACT).json()["audit"]["folded_rows"] == 19
    records = AuditLog.read(tmp_path / "audit.jsonl")
    assert [r["kind"] for r in records] == ["file", "override", "aggregate"]
    full, aggregate = records[1:]
    assert full["request_id"] == "step-0" and aggregate["count"] == 19
    assert (aggregate["first_request_id"], aggregate["last_request_id"]) == ("step-1", "step-19")
    assert aggregate["key"] == full["key"] == key_fingerprint(ACT)
    assert check_chain(tmp_path / "audit.jsonl").ok


def test_a_key_rate_without_a_window_is_refused_naming_the_settings(tmp_path, models):
    settings = _settings(tmp_path, models["a"], audit_window_s=0.0, audit_key_rate=5.0)
    with pytest.raises(SettingsError, match=r"audit_key_rate: 5 .* needs audit_window_s > 0"):
        create_app(settings)
