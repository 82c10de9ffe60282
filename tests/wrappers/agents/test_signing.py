"""Signed policy artifacts: who exported a policy, and that nothing in it changed since."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from neorl_industrial.wrappers.agents import PolicyArtifact, PolicyArtifactError
from neorl_industrial.wrappers.agents.artifact import _digest
from neorl_industrial.wrappers.agents.signing import (
    PRIVATE_KEY,
    PUBLIC_KEY,
    SIGNATURE,
    canonical_manifest_bytes,
    generate_key_pair,
    load_private_key,
    load_public_keys,
)
from tests.wrappers.agents.test_export import Policy


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("keys")
    return {name: generate_key_pair(root / name) for name in ("release", "stranger")}


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy()


@pytest.fixture(scope="module")
def signed(policy, keys, tmp_path_factory) -> Path:
    return policy.export(tmp_path_factory.mktemp("signed") / "policy", signing_key=keys["release"])


@pytest.fixture(scope="module")
def unsigned(tmp_path_factory) -> Path:
    """Another policy's artifact (the same network, other parameters), not signed."""
    other = Policy()
    other.params = other.algorithm.init(jax.random.key(1)).policy
    return other.export(tmp_path_factory.mktemp("unsigned") / "policy")


def public(private: Path) -> Path:
    return private.parent / PUBLIC_KEY


def rewrite_with_digests(path: Path) -> None:
    """What a forger does after replacing a file: new sha256s and a new manifest digest."""
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"] = {
        name: hashlib.sha256((path / name).read_bytes()).hexdigest() for name in manifest["files"]
    }
    manifest["manifest_sha256"] = _digest(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest, indent=2))


def test_the_private_key_is_written_0600_and_the_pair_loads(keys):
    private = keys["release"]
    assert private.name == PRIVATE_KEY
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    key = load_private_key(private)
    (fingerprint,) = load_public_keys([public(private)])
    assert fingerprint.startswith("sha256:") and len(fingerprint) == 7 + 64
    assert load_public_keys([key.public_key()]).keys() == {fingerprint}
    with pytest.raises(FileExistsError, match=PRIVATE_KEY):
        generate_key_pair(private.parent)


def test_a_signed_artifact_verifies_against_its_key(signed, keys):
    artifact = PolicyArtifact.load(
        signed, trusted_keys=[public(keys["release"])], require_signature=True
    )
    (fingerprint,) = load_public_keys([public(keys["release"])])
    assert artifact.signature == {"key_fingerprint": fingerprint, "verified": True}
    signature = json.loads((signed / SIGNATURE).read_text())
    assert signature["key_fingerprint"] == fingerprint
    # The signature covers the manifest, which holds the sha256 of every file.
    manifest = json.loads((signed / "manifest.json").read_text())
    load_public_keys([public(keys["release"])])[fingerprint].verify(
        base64.b64decode(signature["signature"]), canonical_manifest_bytes(manifest)
    )
    assert artifact.predict(np.full(6, 50.0, np.float32)).action.shape == (3,)
    # Without trusted keys it still loads; the signature is reported, not verified.
    assert PolicyArtifact.load(signed).signature == {
        "key_fingerprint": fingerprint,
        "verified": False,
    }


def test_an_unsigned_artifact_is_refused_when_a_signature_is_required(unsigned, keys):
    with pytest.raises(PolicyArtifactError, match=r"unsigned \(no signature\.json\)"):
        PolicyArtifact.load(
            unsigned, trusted_keys=[public(keys["release"])], require_signature=True
        )
    assert PolicyArtifact.load(unsigned).signature is None


def test_a_signature_by_an_untrusted_key_is_refused(signed, keys):
    with pytest.raises(PolicyArtifactError, match="not one of the 1 trusted key"):
        PolicyArtifact.load(signed, trusted_keys=[public(keys["stranger"])])
    with pytest.raises(PolicyArtifactError, match="no trusted keys were given"):
        PolicyArtifact.load(signed, require_signature=True)


def test_a_replaced_constraint_spec_or_shield_breaks_the_signature(
    signed, unsigned, keys, tmp_path
):
    trusted = [public(keys["release"])]

    # A spec that lets anything through, with the manifest's digests made to fit.
    permissive = tmp_path / "permissive"
    shutil.copytree(signed, permissive)
    spec = permissive / "constraints.yaml"
    spec.write_text(spec.read_text().replace("bound: 1.5", "bound: 1000000.0"))
    rewrite_with_digests(permissive)
    with pytest.raises(PolicyArtifactError, match="does not match the manifest"):
        PolicyArtifact.load(permissive, trusted_keys=trusted)

    # Another artifact's parameters, serialized policy and shield in place of the signed one.
    swapped = tmp_path / "swapped"
    shutil.copytree(signed, swapped)
    for name in ("serve.jaxexport", "serve_large.jaxexport", "params.npz"):
        shutil.copyfile(unsigned / name, swapped / name)
    rewrite_with_digests(swapped)
    with pytest.raises(PolicyArtifactError, match="does not match the manifest"):
        PolicyArtifact.load(swapped, trusted_keys=trusted)

    # A signature copied onto another artifact.
    copied = tmp_path / "copied"
    shutil.copytree(unsigned, copied)
    shutil.copyfile(signed / SIGNATURE, copied / SIGNATURE)
    with pytest.raises(PolicyArtifactError, match="does not match the manifest"):
        PolicyArtifact.load(copied, trusted_keys=trusted, require_signature=True)


def test_a_bad_signing_key_is_named(policy, tmp_path):
    (tmp_path / "not-a-key.pem").write_text("hello")
    with pytest.raises(PolicyArtifactError, match=r"not-a-key\.pem: not an unencrypted PEM"):
        policy.export(tmp_path / "policy", signing_key=tmp_path / "not-a-key.pem")
    assert not (tmp_path / "policy").exists()


def test_the_keys_command_generates_a_pair(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "neorl_industrial", "keys", "generate", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE((tmp_path / PRIVATE_KEY).stat().st_mode) == 0o600
    (fingerprint,) = load_public_keys([tmp_path / PUBLIC_KEY])
    assert fingerprint in result.stdout


def test_the_export_command_takes_asigning_key():
    from neorl_industrial.cli.entry import build_parser

    args = build_parser().parse_args(["export", "agent", "--out", "policy", "--sign-key", "k.pem"])
    assert args.sign_key == "k.pem"
    assert build_parser().parse_args(["export", "agent", "--out", "policy"]).sign_key is None


@pytest.mark.parametrize("kind", ["fifo", "symlink-out", "symlink-in", "directory"])
def test_anything_but_regular_files_is_refused_before_reading(signed, tmp_path, kind):
    """A FIFO would block the reader forever (a reload hung); a symlink could point out
    of the directory. Refused at once, naming the entry, with nothing read."""
    import os
    import threading

    artifact = tmp_path / "policy"
    shutil.copytree(signed, artifact)
    target = artifact / "params.msgpack"
    if kind == "fifo":
        target.unlink()
        os.mkfifo(target)
        expected = "a FIFO, not a regular file"
    elif kind == "symlink-out":
        outside = tmp_path / "elsewhere.msgpack"
        shutil.move(target, outside)
        target.symlink_to(outside)
        expected = "a symbolic link, not a regular file"
    elif kind == "symlink-in":
        target.unlink()
        target.symlink_to(artifact / "constraints.yaml")
        expected = "a symbolic link, not a regular file"
    else:
        (artifact / "extra").mkdir()
        target = artifact / "extra"
        expected = "a directory, not a regular file"
    outcome: list[BaseException] = []

    def load() -> None:
        try:
            PolicyArtifact.load(artifact)
        except BaseException as error:  # handed to the test thread
            outcome.append(error)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    loader.join(60)
    assert not loader.is_alive(), "loading the artifact blocked"
    (error,) = outcome
    assert isinstance(error, PolicyArtifactError)
    assert str(target) in str(error) and expected in str(error)


def test_two_runs_making_the_key_pair_at_once_get_one_whole_pair(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    def make(_: int) -> str:
        try:
            generate_key_pair(tmp_path)
            return "made"
        except FileExistsError:
            return "exists"

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(make, range(8)))
    assert outcomes.count("made") == 1
    private = load_private_key(tmp_path / PRIVATE_KEY)
    (fingerprint,) = load_public_keys([tmp_path / PUBLIC_KEY])
    assert load_public_keys([private.public_key()]).keys() == {fingerprint}
    assert sorted(p.name for p in tmp_path.iterdir()) == [PRIVATE_KEY, PUBLIC_KEY]


def test_runs_sign_by_default_with_keys_made_on_first_use(tmp_path, monkeypatch):
    """Every run signs its policy: with keys/ in the working directory (made on first
    use, where a server started there looks), or the configured directory; unsigned only
    when asked, and said."""
    import io

    from rich.console import Console

    from neorl_industrial.cli.keys import signing_key
    from neorl_industrial.cli.run_glue import main_job_config
    from neorl_industrial.wrappers.training import RunConfig

    monkeypatch.chdir(tmp_path)
    config = RunConfig.from_dict({"env": {"id": "IB-v0"}}, source="test")
    assert config.export.signing_keys == "keys" and config.export.create_keys
    key = signing_key(config, None)
    assert key == Path("keys") / PRIVATE_KEY and (tmp_path / "keys" / PUBLIC_KEY).is_file()
    assert signing_key(config, None) == key  # the same pair next time
    assert main_job_config().export.signing_keys == "keys"
    unsigned = config.with_overrides(["export.signing_keys=null"])
    output = io.StringIO()
    assert signing_key(unsigned, Console(file=output, width=200)) is None
    assert "exported unsigned" in output.getvalue()


def test_the_export_command_signs_with_the_keys_here_by_default(tmp_path, monkeypatch, capsys):
    from unittest import mock

    from neorl_industrial import cli

    exported = []

    class Saved:
        name = "td3bc"
        selected_candidate = "seed0"

        def export(self, out, *, overwrite, signing_key):
            exported.append(signing_key)
            return Path(out)

    monkeypatch.chdir(tmp_path)
    argv = ["--no-cache", "export", "agent", "--out", "policy"]
    with mock.patch("neorl_industrial.wrappers.agents.Agent.load", return_value=Saved()):
        assert cli.main(argv) == 0
        printed = " ".join(capsys.readouterr().out.split())
        assert ", unsigned" in printed and "no --sign-key and no keys/policy-signing.key" in printed
        generate_key_pair(tmp_path / "keys")
        assert cli.main(argv) == 0
        assert "signed with keys/policy-signing.key" in " ".join(capsys.readouterr().out.split())
        assert cli.main([*argv, "--sign-key", "mine.pem"]) == 0
    assert exported == [None, Path("keys") / PRIVATE_KEY, "mine.pem"]
