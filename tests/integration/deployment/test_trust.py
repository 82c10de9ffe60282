"""What the policy server trusts: policies signed by its own keys (by default), the pinned
constraint spec and task, what the serialized function does (probes at load, every action
at run time), and API keys that are secrets rather than patterns."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fastapi.testclient import TestClient

from neorl_industrial.cli.entry import main
from neorl_industrial.integration.deployment import ServerSettings, SettingsError, create_app
from neorl_industrial.wrappers.agents import PolicyArtifactError
from neorl_industrial.wrappers.agents.signing import (
    PUBLIC_KEY,
    SIGNATURE,
    generate_key_pair,
    sign_manifest,
)
from neorl_industrial.wrappers.constraint_files import constraint_spec_yaml, load_constraint_spec
from tests.wrappers.agents.test_export import SPEC_FILE, Policy, exported_policy
from tests.wrappers.agents.test_signing import rewrite_with_digests

ACT, ADMIN = (
    "QXWXDL4jQgskAmg0nz2bk2yip1eEm5gKC4GfPV0J-tc",
    "_-Rc9E6pCqctoqbTHtBh8LaAx5bNbyasrF7G9yBwkow",
)
AS_ACT, AS_ADMIN = {"X-API-Key": ACT}, {"X-API-Key": ADMIN}
OBSERVATION = {"observation": [50.0] * 6}
#: The reading on which the sometimes-lying function lies (probes draw floats at random).
TRIGGER = 77.0
FUNCTIONS = (("serve.jaxexport", 1), ("serve_large.jaxexport", 64))
CHECK = "check.jaxexport"


def forge(source: Path, target: Path, serve, key: Path | None = None) -> Path:
    """What an attacker does: a copy of ``source`` whose serialized functions are
    ``serve(original, observations, prev_actions)`` (taking the artifact's parameters as
    the originals do), with the manifest's digests made to fit, and re-signed with ``key``
    (a trusted key that leaked) or left with the old signature."""
    shutil.copytree(source, target)
    for name, min_batch in FUNCTIONS:
        original = jax.export.deserialize(bytearray((source / name).read_bytes()))
        constraints = () if min_batch == 1 else (f"batch >= {min_batch}",)
        (batch,) = jax.export.symbolic_shape("batch", constraints=constraints)
        exported = jax.export.export(
            jax.jit(lambda a, o, p, original=original: serve(_Bound(original, a), o, p)),
            platforms=("cpu",),
        )(*_inputs(original, batch))
        (target / name).write_bytes(exported.serialize())
    # The check serves batches that keep every rule: the attacker forges it too.
    original = jax.export.deserialize(bytearray((source / CHECK).read_bytes()))
    (batch,) = jax.export.symbolic_shape("batch", constraints=("batch <= 63",))
    exported = jax.export.export(
        jax.jit(lambda a, o, p, original=original: _as_check(serve, _Bound(original, a), o, p)),
        platforms=("cpu",),
    )(*_inputs(original, batch))
    (target / CHECK).write_bytes(exported.serialize())
    rewrite_with_digests(target)
    if key is not None:
        manifest = json.loads((target / "manifest.json").read_text())
        (target / SIGNATURE).write_text(json.dumps(sign_manifest(manifest, key)))
    return target


def _inputs(original, batch) -> tuple:
    """The inputs of ``original``, the artifact's function: its parameters (as it takes
    them), then ``batch`` observations and previous actions."""
    parameters = tuple(
        jax.ShapeDtypeStruct(aval.shape, aval.dtype) for aval in original.in_avals[:-2]
    )
    return (
        parameters,
        jax.ShapeDtypeStruct((batch, 6), jnp.float32),
        jax.ShapeDtypeStruct((batch, 3), jnp.float32),
    )


class _Bound:
    """The artifact's function on the parameters it is given: ``call(observations,
    prev_actions)``."""

    def __init__(self, exported, parameters):
        self.exported, self.parameters = exported, parameters

    def call(self, observations, prev_actions):
        return self.exported.call(self.parameters, observations, prev_actions)


class _CheckAsServe:
    """The check's outputs as the serving function's (its proposal as the action)."""

    def __init__(self, check):
        self.check = check

    def call(self, observations, prev_actions):
        _, proposed, status, margins = self.check.call(observations, prev_actions)
        return proposed, proposed, status, margins


def _as_check(serve, original, observations, prev_actions):
    """``serve``'s lie told by the check: its action in place of the proposal."""
    kept = original.call(observations, prev_actions)[0]
    action, _, status, margins = serve(_CheckAsServe(original), observations, prev_actions)
    return kept, action, status, margins


def always_five(original, observations, prev_actions):
    """Ignores the shield: 5.0 for every action (the bounds are [-1, 1])."""
    action, proposed, status, margin = original.call(observations, prev_actions)
    return jnp.full_like(action, 5.0), proposed, jnp.zeros_like(status), margin


def five_on_trigger(original, observations, prev_actions):
    """The honest function, except 5.0 when the setpoint reads exactly TRIGGER."""
    action, proposed, status, margin = original.call(observations, prev_actions)
    lie = observations[:, :1] == TRIGGER
    return jnp.where(lie, 5.0, action), proposed, status, margin


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("trust")
    release = generate_key_pair(root / "release")
    stranger = generate_key_pair(root / "stranger")
    policy = Policy()
    env = policy.env
    task = root / "task.json"
    task.write_text(
        json.dumps(
            {
                "name": "ib-classic",
                "observation_names": list(env.observation_names),
                "action_names": list(env.action_names),
                "action_low": np.asarray(env.action_low, float).tolist(),
                "action_high": np.asarray(env.action_high, float).tolist(),
            }
        )
    )
    spec = policy.spec.to_dict()
    # The same constraints with the joint push bound relaxed: a shield that lets more through.
    relaxed = load_constraint_spec({**spec, "linear": [{**spec["linear"][0], "bound": 1000.0}]})
    # The same constraints in other words: what is enforced is what counts.
    reworded = load_constraint_spec({**spec, "name": "ib", "description": "other prose"})
    # The shield reads fatigue where velocity is: a velocity decrease at fatigue 90 passes.
    names = list(env.observation_names)
    i, j = names.index("velocity"), names.index("fatigue")
    names[i], names[j] = names[j], names[i]
    signed = exported_policy(root / "signed", signing_key=release)
    paths = {
        "trusted": release.parent / PUBLIC_KEY,
        "task": task,
        "signed": signed,
        "unsigned": exported_policy(root / "unsigned"),
        "stranger": exported_policy(root / "stranger-signed", signing_key=stranger),
        "relaxed": policy.export(root / "relaxed", signing_key=release, constraints_spec=relaxed),
        "reworded": policy.export(
            root / "reworded", signing_key=release, constraints_spec=reworded
        ),
        "permuted": policy.export(root / "permuted", signing_key=release, observation_names=names),
        "replaced": forge(signed, root / "replaced", always_five),
        "lying": forge(signed, root / "lying", always_five, key=release),
        "sometimes": forge(signed, root / "sometimes", five_on_trigger, key=release),
    }
    paths["unsigned-lying"] = forge(paths["unsigned"], root / "unsigned-lying", always_five)
    paths["no-signature"] = root / "no-signature"
    shutil.copytree(signed, paths["no-signature"])
    (paths["no-signature"] / SIGNATURE).unlink()
    return paths


def _settings(setup, model, **overrides):
    values = {
        "model": str(setup[model]),
        "api_keys": {"act": [ACT], "admin": [ADMIN]},
        "batch_sizes": [1, 2],
        "max_batch": 2,
        "trusted_keys": [setup["trusted"]],
        "pinned_constraints": SPEC_FILE,
        "pinned_task": setup["task"],
        **overrides,
    }
    return ServerSettings(**values)


def test_the_server_serves_a_signed_artifact_and_says_what_it_trusts(setup):
    with TestClient(create_app(_settings(setup, "signed"))) as client:
        trust = client.get("/v1/policy", headers=AS_ACT).json()["trust"]
        assert trust["signature"]["verified"] is True
        assert trust["signature"]["key_fingerprint"] in trust["trusted_keys"]
        assert trust["signature_required"] is True and trust["allow_unsigned"] is False
        assert trust["pinned_constraints"] == {
            "file": str(SPEC_FILE),
            "sha256": hashlib.sha256(SPEC_FILE.read_bytes()).hexdigest(),
        }
        assert trust["pinned_task"]["file"] == str(setup["task"])
        assert trust["guarded"] is True and trust["incidents"] == 0


TAMPERED = [
    ("unsigned", r"unsigned \(no signature\.json\)"),
    ("no-signature", r"unsigned \(no signature\.json\)"),
    ("stranger", "not one of the 1 trusted key"),
    ("replaced", "the signature does not match the manifest"),
    ("relaxed", r"differs from the pinned constraint spec .* in \['linear'\]"),
    ("permuted", r"observation_names: the same names in another order \(position 1: 'fatigue'"),
    ("lying", r"break the enforced constraints .*breaking \['bounds/velocity'"),
]


@pytest.mark.parametrize(("model", "reason"), TAMPERED)
def test_every_tampered_variant_is_refused_at_start(setup, model, reason):
    app = create_app(_settings(setup, model))
    with pytest.raises(PolicyArtifactError, match=reason), TestClient(app):
        pass


def test_a_function_that_ignores_the_shield_is_refused_without_a_pin_too(setup, caplog):
    """Signed by a trusted key, or unsigned on a server that allows that: the function
    is checked against the bundled constraints, compiled by the server."""
    for model, overrides in (
        ("lying", {}),
        ("unsigned-lying", {"allow_unsigned": True, "trusted_keys": []}),
    ):
        settings = _settings(setup, model, pinned_constraints=None, pinned_task=None, **overrides)
        with (
            pytest.raises(PolicyArtifactError, match="does not keep the bundled constraints"),
            TestClient(create_app(settings)),
        ):
            pass


def test_the_default_trusts_nothing_but_the_key_beside_the_run(setup, tmp_path, monkeypatch):
    settings = ServerSettings(model=str(setup["signed"]), api_keys={"act": [ACT]})
    monkeypatch.chdir(tmp_path)  # no keys/ here
    with pytest.raises(SettingsError, match=r"no key to verify .*--allow-unsigned"):
        settings.trust()
    # As `neorl-industrial run` leaves it: keys/policy-signing.pub where the server starts.
    (tmp_path / "keys").mkdir()
    shutil.copyfile(setup["trusted"], tmp_path / "keys" / PUBLIC_KEY)
    trust = settings.trust()
    assert trust.require_signature and len(trust.keys) == 1
    assert trust.key_files == (str(Path("keys") / PUBLIC_KEY),)


def test_allow_unsigned_is_loud(setup, caplog):
    settings = _settings(setup, "unsigned", allow_unsigned=True, trusted_keys=[])
    with (
        caplog.at_level(logging.WARNING, "neorl_industrial.serve"),
        TestClient(create_app(settings)) as client,
    ):
        trust = client.get("/v1/policy", headers=AS_ACT).json()["trust"]
        assert trust["allow_unsigned"] is True and trust["signature_required"] is False
        response = client.post("/v1/admin/reload", json={}, headers=AS_ADMIN)
        assert response.status_code == 200, response.text
    warnings = [r for r in caplog.records if "allow_unsigned" in r.getMessage()]
    assert len(warnings) == 2  # at start and at the reload


def test_the_pin_compares_what_is_enforced_not_the_prose(setup):
    with TestClient(create_app(_settings(setup, "reworded"))) as client:
        assert client.post("/v1/act", json=OBSERVATION, headers=AS_ACT).status_code == 200


def test_a_lie_the_probes_missed_is_caught_on_every_served_action(setup, caplog):
    with (
        caplog.at_level(logging.WARNING, "neorl_industrial.serve"),
        TestClient(create_app(_settings(setup, "sometimes", max_batch=4))) as client,
    ):
        honest = client.post("/v1/act", json=OBSERVATION, headers=AS_ACT).json()
        assert honest["report"]["overridden"] in (True, False)
        assert client.get("/v1/policy", headers=AS_ACT).json()["trust"]["incidents"] == 0
        lie = [TRIGGER, 50.0, 50.0, 50.0, 50.0, 50.0]
        acted = client.post("/v1/act", json={"observation": lie}, headers=AS_ACT).json()
        assert all(-1.0 <= value <= 1.0 for value in acted["action"]), acted
        assert acted["report"]["overridden"] is True
        batch = {"observations": [lie, [50.0] * 6, lie], "prev_actions": [[0.0] * 3] * 3}
        actions = client.post("/v1/act/batch", json=batch, headers=AS_ACT).json()["actions"]
        assert np.abs(actions).max() <= 1.0, actions
        assert client.get("/v1/policy", headers=AS_ACT).json()["trust"]["incidents"] == 3
    incidents = [r for r in caplog.records if "safety incident" in r.getMessage()]
    assert len(incidents) == 2  # one per batch that had any


def test_a_reload_to_an_untrusted_artifact_fails_and_the_old_one_keeps_serving(setup):
    with TestClient(create_app(_settings(setup, "signed"))) as client:
        version = client.get("/readyz").json()["version"]
        for model, reason in [
            ("unsigned", "unsigned"),
            ("stranger", "not one of the 1 trusted key"),
            ("relaxed", "differs from the pinned constraint spec"),
            ("permuted", "in another order"),
            ("lying", "break the enforced constraints"),
        ]:
            response = client.post(
                "/v1/admin/reload", json={"model": str(setup[model])}, headers=AS_ADMIN
            )
            assert response.status_code == 422 and reason in response.text, response.text
            assert client.get("/readyz").json()["version"] == version
            acted = client.post("/v1/act", json=OBSERVATION, headers=AS_ACT)
            assert acted.status_code == 200 and acted.json()["policy_version"] == version


def test_bad_trust_settings_are_named(setup, tmp_path):
    (tmp_path / "bad.pub").write_text("not a key")
    with pytest.raises(SettingsError, match=r"trusted_keys: .*bad\.pub: not a PEM public key"):
        _settings(setup, "signed", trusted_keys=[tmp_path / "bad.pub"]).trust()
    with pytest.raises(SettingsError, match=r"pinned_constraints .*missing\.yaml"):
        _settings(setup, "signed", pinned_constraints=tmp_path / "missing.yaml").trust()
    with pytest.raises(SettingsError, match="pin the task too"):
        _settings(setup, "signed", pinned_task=None).trust()
    (tmp_path / "task.yaml").write_text("observation_names: [a]\n")
    with pytest.raises(SettingsError, match=r"pinned_task .*task\.yaml"):
        _settings(setup, "signed", pinned_task=tmp_path / "task.yaml").trust()
    # A spec naming a feature the pinned task lacks can never pass: refused at start.
    other = tmp_path / "other.yaml"
    other.write_text(constraint_spec_yaml(load_constraint_spec(SPEC_FILE)).replace("fatigue", "x"))
    with pytest.raises(SettingsError, match=r"does not fit the pinned task .*'x'"):
        _settings(setup, "signed", pinned_constraints=other).trust()


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        ([], "no key to verify policy signatures"),
        (["--trusted-key", "{stranger}"], "not one of the 1 trusted key"),
        (["--trusted-key", "{trusted}", "--pinned-constraints", "{spec}"], "pin the task too"),
        (["--trusted-key", "{trusted}", "--model", "{missing}"], "no such policy artifact"),
    ],
)
def test_serve_start_up_failures_are_one_line_and_exit_2(
    setup, tmp_path, monkeypatch, capsys, arguments, reason
):
    monkeypatch.chdir(tmp_path)
    values = {
        "stranger": str(setup["trusted"].parent.parent / "stranger" / PUBLIC_KEY),
        "trusted": str(setup["trusted"]),
        "spec": str(SPEC_FILE),
        "missing": str(tmp_path / "missing"),
    }
    keys = tmp_path / "api-keys.yaml"
    keys.write_text(f"act: [{ACT}]\n")
    argv = ["--no-cache", "serve", "--model", str(setup["signed"]), "--api-keys-file", str(keys)]
    argv += [argument.format(**values) for argument in arguments]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert reason in " ".join(err.split()), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("replace-with-an-act-key", "is a placeholder"),
        ("change-me-change-me-change-me-change-me", "is a placeholder"),
        ("your-api-key-here-please-replace-it", "is a placeholder"),
        ("password" * 4, "is a placeholder"),
        ("act-key-0123456789", "shorter than 32 characters"),
        ("ab" * 20, "low-entropy"),
        ("abcabcabcabcabcabcabcabcabcabcabc", "low-entropy"),
        ("qwertyuiopasdfghjklzxcvbnm123456789", "low-entropy"),
        ("1234567890123456789012345678901234", "low-entropy"),
        ("zyxwvutsrqponmlkjihgfedcbazyxwvutsrq", "low-entropy"),
        ("QWERTYUIOPASDFGHJKLZXCVBNM0987654321", "low-entropy"),
        ("correcthorsebatterystaplecorrecthorse", "low-entropy"),
        ("thisismyverysecretapikeyforproduction", "low-entropy"),
        ("Summer2024!Summer2024!Summer2024!", "low-entropy"),
        ("adminadminadminadminadminadminadmin", "low-entropy"),
        ("letmeinletmeinletmeinletmeinletmein", "low-entropy"),
        ("monkey123monkey123monkey123monkey123", "low-entropy"),
        ("trustno1trustno1trustno1trustno1tru", "low-entropy"),
        ("0123456789abcdef0123456789abcdef", "low-entropy"),
        ("!@#$%^&*()!@#$%^&*()!@#$%^&*()!@#$", "low-entropy"),
        ("a" * 36, "low-entropy"),
        ("P@ssw0rdP@ssw0rdP@ssw0rdP@ssw0rd", "low-entropy"),
    ],
)
def test_weak_api_keys_are_refused_saying_how_to_make_one(key, reason):
    settings = ServerSettings(model="x", api_keys={"act": [key]})
    with pytest.raises(SettingsError, match=reason) as refused:
        settings.keys()
    assert "secrets.token_urlsafe(32)" in str(refused.value)
    assert key not in str(refused.value)


def test_random_keys_pass_the_entropy_estimate():
    import secrets

    from neorl_industrial.integration.deployment.settings import check_api_key

    # Tens of ms a key (zxcvbn's matching): 20 keys of each kind. The smallest estimates
    # of 1,500 each: token_urlsafe(32) 197 bits, token_hex(16) 106 bits (90 needed).
    for _ in range(20):
        for key in (secrets.token_urlsafe(32), secrets.token_hex(24), secrets.token_hex(16)):
            check_api_key(key, "act")


def test_no_request_compiles_the_servers_repair(setup):
    """The repair's shield is compiled at load: a rejected row (a lie) costs no compile."""
    from neorl_industrial.integration.deployment.pin import _repair

    with TestClient(create_app(_settings(setup, "sometimes"))) as client:
        compiled_before = _repair._cache_size()
        lie = {"observation": [TRIGGER, 50.0, 50.0, 50.0, 50.0, 50.0]}
        assert client.post("/v1/act", json=lie, headers=AS_ACT).json()["report"]["overridden"]
        assert compiled_before >= 1 and _repair._cache_size() == compiled_before


def test_the_task_pin_covers_names_order_units_and_bounds():
    from neorl_industrial.integration.deployment.pin import ServedTask, task_differences

    def task(**changes):
        values = {
            "observation_names": ["level_m", "temperature_c", "inflow_m3h"],
            "action_names": ["valve_pct", "pump_pct"],
            "action_low": [0.0, 0.0],
            "action_high": [100.0, 100.0],
            "observation_low": [0.0, None, 0.0],
            "observation_high": [3.0, None, 50.0],
            "observation_units": ["m", "degC", "m3/h"],
            "action_units": ["%", "%"],
            **changes,
        }
        return ServedTask(**values)

    pinned = task()
    assert task_differences(task(), pinned) == []
    # Units the artifact does not state pass only where the pin does not state them either.
    assert task_differences(task(), task(observation_units=None)) == []
    # Units are compared as units: the UNECE display names OPC UA servers send are the same.
    assert task_differences(task(), task(observation_units=["m", "°C", "m³/h"])) == []
    cases = {
        "observation_names: the same names in another order (position 0: 'inflow_m3h'": task(
            observation_names=["inflow_m3h", "temperature_c", "level_m"]
        ),
        "action_names: 2 names in the artifact, 2 pinned; pinned but missing: ['pump_pct']": task(
            action_names=["valve_pct", "pump"]
        ),
        "observation_units: 'temperature_c' is in 'K' in the artifact, 'degC' pinned": task(
            observation_units=["m", "K", "m3/h"]
        ),
        "action_high: 'pump_pct' is 80.0 in the artifact, 100.0 pinned": task(
            action_high=[100.0, 80.0]
        ),
        "observation_high: 'level_m' is inf in the artifact, 3.0 pinned": task(
            observation_high=[None, None, 50.0]
        ),
    }
    for expected, artifact in cases.items():
        (found,) = task_differences(artifact, pinned)
        assert found.startswith(expected), found
