"""What the policy server trusts: signed artifacts by its own keys, the pinned constraint
spec, and API keys that are secrets rather than placeholders."""

from __future__ import annotations

import hashlib

import pytest
from fastapi.testclient import TestClient

from neorl_industrial.integration.deployment import ServerSettings, SettingsError, create_app
from neorl_industrial.wrappers.agents import PolicyArtifactError
from neorl_industrial.wrappers.agents.signing import PUBLIC_KEY, generate_key_pair
from neorl_industrial.wrappers.constraint_files import load_constraint_spec
from tests.wrappers.agents.test_export import SPEC_FILE, Policy

ACT, ADMIN = (
    "QXWXDL4jQgskAmg0nz2bk2yip1eEm5gKC4GfPV0J-tc",
    "_-Rc9E6pCqctoqbTHtBh8LaAx5bNbyasrF7G9yBwkow",
)
AS_ADMIN = {"X-API-Key": ADMIN}
OBSERVATION = {"observation": [50.0] * 6}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("trust")
    release = generate_key_pair(root / "release")
    stranger = generate_key_pair(root / "stranger")
    policy = Policy()
    # The same constraints with the joint push bound relaxed: a shield that lets more through.
    relaxed = load_constraint_spec(
        {
            **policy.spec.to_dict(),
            "linear": [{**policy.spec.to_dict()["linear"][0], "bound": 1000.0}],
        }
    )
    return {
        "trusted": release.parent / PUBLIC_KEY,
        "signed": policy.export(root / "signed", signing_key=release),
        "unsigned": policy.export(root / "unsigned"),
        "stranger": policy.export(root / "stranger-signed", signing_key=stranger),
        "relaxed": policy.export(root / "relaxed", signing_key=release, constraints_spec=relaxed),
    }


def _settings(setup, model, **overrides):
    values = {
        "model": str(setup[model]),
        "api_keys": {"act": [ACT], "admin": [ADMIN]},
        "batch_sizes": [1, 2],
        "max_batch": 2,
        "trusted_keys": [setup["trusted"]],
        "pinned_constraints": SPEC_FILE,
        **overrides,
    }
    return ServerSettings(**values)


def test_the_server_serves_a_signed_artifact_and_says_what_it_trusts(setup):
    with TestClient(create_app(_settings(setup, "signed"))) as client:
        info = client.get("/v1/policy", headers={"X-API-Key": ACT}).json()
        trust = info["trust"]
        assert trust["signature"]["verified"] is True
        assert trust["signature"]["key_fingerprint"] in trust["trusted_keys"]
        assert trust["signature_required"] is True
        assert trust["pinned_constraints"] == {
            "file": str(SPEC_FILE),
            "sha256": hashlib.sha256(SPEC_FILE.read_bytes()).hexdigest(),
        }


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("unsigned", r"unsigned \(no signature\.json\)"),
        ("stranger", "not one of the 1 trusted key"),
        ("relaxed", r"differs from the pinned constraint spec .* in \['linear'\]"),
    ],
)
def test_an_untrusted_artifact_is_refused_at_start(setup, model, reason):
    app = create_app(_settings(setup, model))
    with pytest.raises(PolicyArtifactError, match=reason), TestClient(app):
        pass


def test_a_reload_to_an_untrusted_artifact_fails_and_the_old_one_keeps_serving(setup):
    with TestClient(create_app(_settings(setup, "signed"))) as client:
        version = client.get("/readyz").json()["version"]
        for model, reason in [
            ("unsigned", "unsigned"),
            ("stranger", "not one of the 1 trusted key"),
            ("relaxed", "differs from the pinned constraint spec"),
        ]:
            response = client.post(
                "/v1/admin/reload", json={"model": str(setup[model])}, headers=AS_ADMIN
            )
            assert response.status_code == 422 and reason in response.text, response.text
            assert client.get("/readyz").json()["version"] == version
            acted = client.post("/v1/act", json=OBSERVATION, headers={"X-API-Key": ACT})
            assert acted.status_code == 200 and acted.json()["policy_version"] == version


def test_without_trust_settings_any_intact_artifact_serves(setup):
    settings = _settings(setup, "relaxed", trusted_keys=[], pinned_constraints=None)
    with TestClient(create_app(settings)) as client:
        trust = client.get("/v1/policy", headers={"X-API-Key": ACT}).json()["trust"]
        assert trust["signature"]["verified"] is False
        assert trust["pinned_constraints"] is None and trust["signature_required"] is False


def test_unreadable_trust_files_are_named(setup, tmp_path):
    (tmp_path / "bad.pub").write_text("not a key")
    with pytest.raises(SettingsError, match=r"trusted_keys: .*bad\.pub: not a PEM public key"):
        _settings(setup, "signed", trusted_keys=[tmp_path / "bad.pub"]).trust()
    with pytest.raises(SettingsError, match=r"pinned_constraints .*missing\.yaml"):
        _settings(setup, "signed", pinned_constraints=tmp_path / "missing.yaml").trust()


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("replace-with-an-act-key", "is a placeholder"),
        ("change-me-change-me-change-me-change-me", "is a placeholder"),
        ("act-key-0123456789", "shorter than 32 characters"),
        ("ab" * 20, "low-entropy"),
    ],
)
def test_weak_api_keys_are_refused_saying_how_to_make_one(key, reason):
    settings = ServerSettings(model="x", api_keys={"act": [key]})
    with pytest.raises(SettingsError, match=reason) as refused:
        settings.keys()
    assert "secrets.token_urlsafe(32)" in str(refused.value)
    assert key not in str(refused.value)
