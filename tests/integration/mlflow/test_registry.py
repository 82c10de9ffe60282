"""The promotion rule (safe first, then return) and its record in a real registry."""

from __future__ import annotations

import json

import pytest

from neorl_industrial.integration.mlflow.registry import (
    RegistryError,
    VersionSummary,
    decide_promotion,
    list_versions,
    policy_signature_tag,
    promote,
)
from tests.shared import mlflow_store

FINGERPRINT = "sha256:" + "ab" * 32


def _version(number, ret, cost, env="IB-v0", hard=0, signature=FINGERPRINT):
    metrics = {"return": ret, "hard_violation_steps": hard}
    if cost is not None:
        metrics["normalized_cost"] = cost
    return VersionSummary(
        "m", str(number), (), None, env, "td3bc-lag", metrics, signature=signature
    )


@pytest.mark.parametrize(
    ("candidate", "champion", "promoted", "reason"),
    [
        (_version(1, -10.0, 0.5), None, True, "no champion yet"),
        (_version(1, -10.0, 1.5), None, False, "not within its cost limits"),
        (_version(2, -5.0, 1.2), _version(1, -10.0, 0.5), False, "not within"),
        (_version(2, -5.0, 0.9), _version(1, -10.0, 0.5), True, "higher return"),
        (_version(2, -12.0, 0.1), _version(1, -10.0, 0.5), False, "does not beat"),
        (_version(2, -12.0, 0.1), _version(1, -1.0, 3.0), True, "is not"),
        (_version(2, -5.0, 0.5, hard=3), _version(1, -10.0, 0.5), False, "not within"),
        (
            _version(2, -5.0, 0.5, env="IB-classic-v0"),
            _version(1, -10.0, 0.5),
            False,
            "do not compare",
        ),
        (_version(2, -5.0, None), _version(1, -10.0, None), True, "higher return"),
        (_version(1, -5.0, 0.5), _version(1, -5.0, 0.5), False, "is the champion"),
    ],
)
def test_safe_first_then_return(candidate, champion, promoted, reason):
    decision = decide_promotion(candidate, champion)
    assert decision.promoted is promoted
    assert reason in decision.reason


def test_force_promotes_an_unsafe_candidate_and_says_so():
    decision = decide_promotion(_version(2, -5.0, 2.0), _version(1, -10.0, 0.5), force=True)
    assert decision.promoted and decision.reason.startswith("forced")


@pytest.mark.parametrize("signature", ["unsigned", None])
def test_an_unsigned_version_is_never_promoted_not_even_forced(signature):
    for force in (False, True):
        decision = decide_promotion(_version(1, -5.0, 0.5, signature=signature), None, force=force)
        assert not decision.promoted
        assert "is unsigned" in decision.reason and "--sign-key" in decision.reason


def test_the_signature_tag_names_the_key_or_unsigned(tmp_path):
    from neorl_industrial.wrappers.agents.signing import SIGNATURE

    assert policy_signature_tag(tmp_path) == "unsigned"
    (tmp_path / SIGNATURE).write_text(json.dumps({"key_fingerprint": FINGERPRINT}))
    assert policy_signature_tag(tmp_path) == FINGERPRINT


def test_promotion_is_recorded_on_the_versions_and_the_model(tmp_path):
    from mlflow import MlflowClient

    uri = mlflow_store(tmp_path)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model("m")
    for ret, cost in ((-10.0, 0.5), (-5.0, 2.0), (-4.0, 0.8)):
        version = client.create_model_version(
            "m",
            str(tmp_path),
            tags={
                "return": str(ret),
                "normalized_cost": str(cost),
                "hard_violation_steps": "0",
                "env": "IB-v0",
                "signature": FINGERPRINT,
            },
        )
        client.set_registered_model_alias("m", "challenger", version.version)
        decision = promote(client, "m")
    # Version 1 became champion, 2 was refused (unsafe), 3 beat 1.
    assert str(client.get_model_version_by_alias("m", "champion").version) == "3"
    assert client.get_model_version("m", "2").tags["promotion.decision"] == "false"
    assert (
        "not within its cost limits" in client.get_model_version("m", "2").tags["promotion.reason"]
    )
    third = client.get_model_version("m", "3").tags
    assert (
        third["promotion.previous_champion"] == "1" and "higher return" in third["promotion.reason"]
    )
    assert client.get_registered_model("m").tags["champion.version"] == "3"
    assert decision.promoted
    versions = list_versions(client, "m")
    assert [v.version for v in versions] == ["3", "2", "1"]
    assert versions[0].aliases == ("champion",) and not versions[1].safe
    with pytest.raises(RegistryError, match="no registered model 'other'"):
        list_versions(client, "other")
    with pytest.raises(RegistryError, match="no version 9"):
        promote(client, "m", "9")
    # An unsigned version that would beat the champion is refused, and the reason recorded.
    unsigned = client.create_model_version(
        "m",
        str(tmp_path),
        tags={"return": "0.0", "normalized_cost": "0.1", "env": "IB-v0", "signature": "unsigned"},
    )
    assert not promote(client, "m", unsigned.version).promoted
    reason = client.get_model_version("m", unsigned.version).tags["promotion.reason"]
    assert "is unsigned" in reason
    assert str(client.get_model_version_by_alias("m", "champion").version) == "3"
