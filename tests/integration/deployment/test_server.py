"""The policy server through HTTP: shielded actions, reports, audit, auth, bad input,
metrics, micro-batching without recompiles, hot reload under load, the CLI,
dependencies overridden by a test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from benchmarks.harness import free_port, wait_for_http
from neorl_industrial.integration.deployment import ServerSettings, SettingsError, create_app
from neorl_industrial.integration.safety import AuditLog
from neorl_industrial.wrappers.agents import PolicyArtifact
from neorl_industrial.wrappers.agents.signing import PUBLIC_KEY, generate_key_pair
from tests.wrappers.agents.test_export import Policy, exported_policy, plant_inputs

# Keys as secrets.token_urlsafe(32) makes them (shorter or placeholder keys are refused).
ACT, ADMIN = (
    "QXWXDL4jQgskAmg0nz2bk2yip1eEm5gKC4GfPV0J-tc",
    "_-Rc9E6pCqctoqbTHtBh8LaAx5bNbyasrF7G9yBwkow",
)
AS_ACT = {"Authorization": f"Bearer {ACT}"}
AS_ADMIN = {"X-API-Key": ADMIN}
FILE_KEY = "vQttCykv5qgd6NwJbUDJoRAB2syOwal-bgJTdtHwCmc"


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    """Two versions of a small policy (different parameters), and one of another size."""
    root = tmp_path_factory.mktemp("policies")
    import jax

    # Signed, as a server trusts only signed policies (the key: _settings' trusted_keys).
    key = generate_key_pair(root / "keys")
    paths = {
        "a": exported_policy(root / "a", signing_key=key),
        "b": exported_policy(root / "b", seed=7, signing_key=key),
    }
    from neorl_industrial.core.agents.td3bc import TD3BCConfig, make_td3bc

    wide = make_td3bc(TD3BCConfig(hidden=(8, 8)), 7, 3)
    first = Policy()
    paths["other"] = first.export(
        root / "other",
        act=wide.act,
        policy_params=wide.init(jax.random.key(1)).policy,
        observation_size=7,
        observation_names=[*first.env.observation_names, "extra"],
        signing_key=key,
    )
    return paths


def _settings(tmp_path, model, **overrides):
    values = {
        "model": str(model),
        "trusted_keys": [Path(model).parent / "keys" / PUBLIC_KEY],
        "api_keys": {"act": [ACT], "admin": [ADMIN]},
        "batch_sizes": [1, 2, 4, 8, 16],
        "max_batch": 16,
        "max_wait_ms": 2.0,
        "audit_log": tmp_path / "audit.jsonl",
        "audit_window_s": 0.0,  # every override in full, so a test finds each by its id
        "audit_key_rate": 0.0,
        **overrides,
    }
    return ServerSettings(**values)


@pytest.fixture(scope="module")
def served(tmp_path_factory, policies):
    """One server for the module (compiling its batch sizes once); the reload test, which
    changes the policy, runs last."""
    tmp = tmp_path_factory.mktemp("served")
    with TestClient(create_app(_settings(tmp, policies["a"]))) as test_client:
        yield test_client, tmp


@pytest.fixture
def client(served):
    return served[0]


def test_act_returns_the_shielded_action_and_its_report(served, policies):
    client, tmp_path = served
    artifact = PolicyArtifact.load(policies["a"])
    observations, previous = plant_inputs(16, seed=3)
    expected = artifact.predict(observations, previous)
    overridden = int(np.argmax(expected.overridden))
    assert expected.overridden.any()
    for row in range(4):
        body = {"observation": observations[row].tolist(), "prev_action": previous[row].tolist()}
        response = client.post("/v1/act", json=body, headers={**AS_ACT, "X-Request-ID": f"r{row}"})
        assert response.status_code == 200, response.text
        data = response.json()
        np.testing.assert_allclose(data["action"], expected.action[row], atol=1e-5)
        report = data["report"]
        assert report["overridden"] == bool(expected.overridden[row])
        assert report["violated"] == list(expected.violated[row])
        assert set(report["margin"]) == set(artifact.constraint_names)
        assert data["request_id"] == f"r{row}" and data["policy_version"]
    body = {
        "observation": observations[overridden].tolist(),
        "prev_action": previous[overridden].tolist(),
        "request_id": "override-1",
    }
    assert client.post("/v1/act", json=body, headers=AS_ACT).json()["report"]["overridden"]
    records = AuditLog.read(tmp_path / "audit.jsonl")
    assert records[-1]["request_id"] == "override-1" and records[-1]["violated"]
    assert AuditLog.verify(tmp_path / "audit.jsonl")[0]


def test_batch_matches_the_artifact(client, policies):
    artifact = PolicyArtifact.load(policies["a"])
    observations, previous = plant_inputs(16, seed=5)
    body = {"observations": observations.tolist(), "prev_actions": previous.tolist()}
    response = client.post("/v1/act/batch", json=body, headers=AS_ACT)
    assert response.status_code == 200, response.text
    data = response.json()
    expected = artifact.predict(observations, previous)
    np.testing.assert_allclose(data["actions"], expected.action, atol=1e-5)
    assert [r["overridden"] for r in data["reports"]] == expected.overridden.tolist()


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"observation": [1.0] * 5}, ["body", "observation"], "expected 6 values"),
        ({"observation": [1.0] * 6, "prev_action": [0.0]}, ["body", "prev_action"], "expected 3"),
        ({"observation": ["a"] * 6}, ["body", "observation", 0], "valid number"),
        ({"observation": None}, ["body", "observation"], "valid list"),
        ({}, ["body", "observation"], "Field required"),
        ({"observation": [1.0] * 6, "extra": 1}, ["body", "extra"], "Extra inputs"),
        ({"observation": [1.0] * 6, "request_id": "a b"}, ["body", "request_id"], "pattern"),
    ],
)
def test_bad_single_requests_get_422_naming_the_field(client, body, field, message):
    response = client.post("/v1/act", json=body, headers=AS_ACT)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert any(d["loc"] == field and message in d["msg"] for d in detail), detail


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_get_422(client, literal):
    body = '{"observation": [1, 2, 3, 4, 5, %s]}' % literal  # noqa: UP031
    headers = {**AS_ACT, "Content-Type": "application/json"}
    response = client.post("/v1/act", content=body, headers=headers)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "observation", 5]


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        (
            {"observation": [1.0, 2.0, 1e39, 0, 0, 0]},
            ["body", "observation", 2],
            "1e+39 is outside",
        ),
        ({"observation": [-3.5e38] + [0.0] * 5}, ["body", "observation", 0], "outside float32"),
        (
            {"observation": [0.0] * 6, "prev_action": [0.0, 3.5e38, 0.0]},
            ["body", "prev_action", 1],
            "outside float32",
        ),
        ({"observation": ["1.0"] + [0.0] * 5}, ["body", "observation", 0], "valid number"),
        ({"observation": [True] + [0.0] * 5}, ["body", "observation", 0], "valid number"),
    ],
)
def test_numbers_outside_float32_strings_and_booleans_get_422(client, body, field, message):
    response = client.post("/v1/act", json=body, headers=AS_ACT)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert any(d["loc"] == field and message in d["msg"] for d in detail), detail
    batch = {"observations": [body["observation"]] * 2}
    if field[1] == "observation":
        response = client.post("/v1/act/batch", json=batch, headers=AS_ACT)
        assert response.status_code == 422
        assert response.json()["detail"][0]["loc"] == ["body", "observations", 0, field[2]]


def test_a_request_that_breaks_the_batched_call_fails_alone(client):
    serving = client.app.state.serving
    predict = serving.batcher.predict
    poison = 666.0

    def fragile(observations, prev):
        if (observations[:, 0] == poison).any():
            raise ValueError("observation 0 is poison")
        return predict(observations, prev)

    def one(row):
        value = poison if row % 4 == 0 else 50.0
        body = {"observation": [value] + [50.0] * 5}
        return row, client.post("/v1/act", json=body, headers=AS_ACT)

    serving.batcher.predict = fragile
    try:
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(one, range(64)))
    finally:
        serving.batcher.predict = predict
    for row, response in results:
        if row % 4:
            assert response.status_code == 200, response.text
        else:
            assert response.status_code == 422, response.text
            detail = response.json()["detail"][0]
            assert detail["loc"] == ["body", "observation"] and "poison" in detail["msg"]


def test_request_ids_that_break_the_rule_are_replaced(client):
    body = {"observation": [50.0] * 6}
    for given, kept in [("plant-7/step:12.a", True), ("a b", False), ("x" * 129, False),
                        ("id\nforged", False)]:  # fmt: skip
        headers = {**AS_ACT, "X-Request-ID": given}
        rid = client.post("/v1/act", json=body, headers=headers).json()["request_id"]
        assert (rid == given) is kept and len(rid) <= 128


def test_bad_batches_get_422_and_oversized_bodies_413(client):
    def batch(body):
        return client.post("/v1/act/batch", json=body, headers=AS_ACT)

    assert batch({"observations": []}).json()["detail"][0]["loc"] == ["body", "observations"]
    too_many = batch({"observations": [[1.0] * 6] * 17})
    assert too_many.status_code == 422 and "at most 16" in too_many.text
    ragged = batch({"observations": [[1.0] * 6, [1.0] * 5]})
    assert ragged.json()["detail"][0]["loc"] == ["body", "observations", 1]
    mismatch = batch({"observations": [[1.0] * 6] * 2, "prev_actions": [[0.0] * 3]})
    assert mismatch.json()["detail"][0]["loc"] == ["body", "prev_actions"]
    not_json = client.post(
        "/v1/act/batch", content=b"{", headers={**AS_ACT, "Content-Type": "application/json"}
    )
    assert not_json.status_code == 422
    huge = client.post("/v1/act", content=b"x" * 2_000_000, headers=AS_ACT)
    assert huge.status_code == 413

    def chunks():
        for _ in range(40):
            yield b" " * 50_000

    chunked = client.post("/v1/act", content=chunks(), headers=AS_ACT)
    assert chunked.status_code == 413
    # The server is still fine.
    assert client.post("/v1/act", json={"observation": [1.0] * 6}, headers=AS_ACT).is_success


def test_auth_roles(client, tmp_path, policies):
    body = {"observation": [1.0] * 6}
    missing = client.post("/v1/act", json=body)
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert (
        client.post("/v1/act", json=body, headers={"X-API-Key": "wrong-key-123"}).status_code == 401
    )
    assert client.post("/v1/act", json=body, headers=AS_ADMIN).status_code == 200
    assert client.post("/v1/admin/reload", json={}, headers=AS_ACT).status_code == 403
    assert client.get("/v1/policy").status_code == 401
    # Operations endpoints are open.
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json()["status"] == "ready"
    # CORS is off by default: no header for a foreign origin.
    preflight = client.options(
        "/v1/act",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in preflight.headers

    with pytest.raises(SettingsError, match="no API key configured"):
        create_app(ServerSettings(model=str(policies["a"])))
    with pytest.raises(SettingsError, match="shorter than 32 characters"):
        create_app(ServerSettings(model=str(policies["a"]), api_keys={"act": ["short"]}))
    secrets = tmp_path / "keys.yaml"
    secrets.write_text(f"act: [{FILE_KEY}]\nroot: [x]\n")
    with pytest.raises(SettingsError, match="unknown role 'root'"):
        ServerSettings(model="x", api_keys_file=secrets).keys()
    secrets.write_text(f"act: [{FILE_KEY}]\n")
    assert ServerSettings(model="x", api_keys_file=secrets).keys() == {FILE_KEY: "act"}
    assert ServerSettings(model="x", auth=False).keys() == {}


def test_policy_description_and_metrics(client):
    info = client.get("/v1/policy", headers=AS_ACT).json()
    assert info["observation"]["size"] == 6 and info["action"]["names"] == [
        "velocity",
        "gain",
        "shift",
    ]
    assert "limit-joint-velocity-gain-push" in info["constraints"]["hard"]
    assert info["metadata"]["algorithm"] == "td3bc"

    def counter(text, name):
        line = next((line for line in text.splitlines() if line.startswith(name + " ")), None)
        return 0.0 if line is None else float(line.rsplit(" ", 1)[1])

    batch_ok = 'neorl_requests_total{route="/v1/act/batch",status="200"}'
    act_bad = 'neorl_requests_total{route="/v1/act",status="422"}'
    before = client.get("/metrics").text
    observations, previous = plant_inputs(8, seed=9)
    body = {"observations": observations.tolist(), "prev_actions": previous.tolist()}
    client.post("/v1/act/batch", json=body, headers=AS_ACT)
    client.post("/v1/act", json={"observation": [1.0]}, headers=AS_ACT)
    text = client.get("/metrics").text
    assert counter(text, batch_ok) == counter(before, batch_ok) + 1
    assert counter(text, act_bad) == counter(before, act_bad) + 1
    assert "neorl_request_seconds_bucket" in text and "neorl_batch_rows_bucket" in text
    decided = "neorl_decisions_total"
    assert counter(text, decided) == counter(before, decided) + 8
    assert 'neorl_overrides_by_constraint_total{constraint="' in text
    assert 'neorl_policy_info{source="directory"' in text
    assert str(client.app.state.serving.policy.source) not in text  # no file path without auth


def test_concurrent_requests_are_micro_batched_without_recompiling(client):
    artifact = client.app.state.serving.policy.artifact
    compiled = artifact.traced_batch_sizes
    observations, _ = plant_inputs(64, seed=11)

    def one(row):
        response = client.post(
            "/v1/act", json={"observation": observations[row].tolist()}, headers=AS_ACT
        )
        return response.status_code

    def totals():
        samples = client.app.state.serving.metrics.batch_rows.collect()[0].samples
        calls = next(s.value for s in samples if s.name.endswith("_count"))
        return calls, next(s.value for s in samples if s.name.endswith("_sum"))

    calls_before, rows_before = totals()
    with ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(one, range(64)))
    assert codes == [200] * 64
    calls, rows = totals()
    assert rows - rows_before == 64
    assert calls - calls_before < 64  # several requests shared a compiled call
    assert artifact.traced_batch_sizes == compiled  # every padded size compiled at start


def test_reload_under_load_fails_no_request(client, policies):
    stop = threading.Event()
    results = []

    def hammer():
        while not stop.is_set():
            response = client.post("/v1/act", json={"observation": [50.0] * 6}, headers=AS_ACT)
            results.append((response.status_code, response.json().get("policy_version")))

    workers = [threading.Thread(target=hammer) for _ in range(4)]
    for worker in workers:
        worker.start()
    time.sleep(0.3)
    reloaded = client.post("/v1/admin/reload", json={"model": str(policies["b"])}, headers=AS_ADMIN)
    time.sleep(0.3)
    stop.set()
    for worker in workers:
        worker.join()
    assert reloaded.status_code == 200, reloaded.text
    versions = [version for _, version in results]
    assert {code for code, _ in results} == {200}
    assert versions[0] == reloaded.json()["previous"] and versions[-1] == reloaded.json()["version"]
    assert reloaded.json()["version"] != reloaded.json()["previous"]

    # A policy that cannot be loaded, or of another plant, is refused; the current one stays.
    missing = client.post("/v1/admin/reload", json={"model": "/no/such/policy"}, headers=AS_ADMIN)
    assert missing.status_code == 422 and "cannot load" in missing.text
    other = client.post(
        "/v1/admin/reload", json={"model": str(policies["other"])}, headers=AS_ADMIN
    )
    assert other.status_code == 422 and "takes 7 observations" in other.text
    assert client.get("/readyz").json()["version"] == reloaded.json()["version"]


def test_cli_serve_starts_uvicorn(policies, tmp_path):
    port = free_port()
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"act: [{ACT}]\n")
    command = [
        sys.executable, "-m", "neorl_industrial.cli", "--no-cache", "serve",
        "--model", str(policies["a"]), "--port", str(port), "--api-keys-file", str(keys),
        "--trusted-key", str(policies["a"].parent / "keys" / PUBLIC_KEY), "--log-level", "warning",
    ]  # fmt: skip
    # Two batch sizes, set as a deployment sets them: a request needs no more, and the
    # defaults' nine compile in the plant journey's server (tests/test_plant_journey.py).
    environment = {**os.environ, "NEORL_SERVE_BATCH_SIZES": "[1, 2]", "NEORL_SERVE_MAX_BATCH": "2"}
    server = subprocess.Popen(command, env=environment)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/readyz", server)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/act",
            json.dumps({"observation": [50.0] * 6}).encode(),
            {"Content-Type": "application/json", **AS_ACT},
        )
        data = json.loads(urllib.request.urlopen(request, timeout=10).read())
        assert len(data["action"]) == 3 and "report" in data
    finally:
        server.terminate()
        server.wait(30)


def test_a_dependency_can_be_overridden(client):
    """The routes take the policy and the caller's role from dependencies, so a test swaps
    either for a stub with ``app.dependency_overrides``."""
    from neorl_industrial.integration.deployment.deps import get_policy, require_act_key

    class StubPolicy:
        version, source = "stub-1", "stub"
        observation_size, action_size = 4, 3

        def describe(self):
            return {"version": self.version, "source": self.source}

    overrides = client.app.dependency_overrides
    overrides[get_policy] = StubPolicy
    overrides[require_act_key] = lambda: "act"
    try:
        info = client.get("/v1/policy")  # no key: the stubbed auth lets it through
        assert info.status_code == 200
        assert info.json()["version"] == "stub-1" and "safety" in info.json()
        act = client.post("/v1/act", json={"observation": [1.0] * 6})
        assert act.status_code == 422 and "expected 4 values" in act.text
    finally:
        overrides.clear()
    assert client.get("/v1/policy").status_code == 401
    assert client.get("/v1/policy", headers=AS_ACT).json()["version"] != "stub-1"


def test_without_keys_the_server_acts_for_anyone_and_reloads_for_no_one(policies, tmp_path, caplog):
    settings = _settings(tmp_path, policies["a"], api_keys={}, auth=False)
    with caplog.at_level("WARNING", logger="neorl_industrial.serve"):
        app = create_app(settings)
    assert any("auth is off" in record.getMessage() for record in caplog.records)
    with TestClient(app) as client:
        acted = client.post("/v1/act", json={"observation": [0.0] * 6})
        assert acted.status_code == 200
        version = client.get("/v1/policy").json()["version"]
        for headers in ({}, AS_ADMIN):
            refused = client.post(
                "/v1/admin/reload", json={"model": str(policies["b"])}, headers=headers
            )
            assert refused.status_code == 403 and "runs without keys" in refused.text
        assert client.get("/v1/policy").json()["version"] == version
