"""The exported policy artifact: round trip, serving without training code, integrity."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.agents.td3bc import TD3BCConfig, make_td3bc
from neorl_industrial.core.environments import make
from neorl_industrial.core.safety import shield
from neorl_industrial.wrappers.agents import PolicyArtifact, PolicyArtifactError, export_policy
from neorl_industrial.wrappers.agents.signing import SIGNATURE, sign_manifest
from neorl_industrial.wrappers.constraint_files import load_constraint_spec
from tests.shared import built_once

SPEC_FILE = Path(__file__).resolve().parents[3] / "configs" / "constraints" / "ib-example.yaml"
TRAINING_MODULES = (
    "optax",
    "neorl_industrial.core.agents",
    "neorl_industrial.functional.transformations",
    "neorl_industrial.wrappers.training",
)


class Policy:
    """A small TD+BC policy on the IB's classic observation, with its constraints."""

    def __init__(self):
        env, _ = make("IB-v0", observation="classic")
        self.env = env
        self.spec = load_constraint_spec(SPEC_FILE)
        self.algorithm = make_td3bc(TD3BCConfig(hidden=(32, 32)), 6, 3)
        self.params = self.algorithm.init(jax.random.key(0)).policy
        self.compiled = self.spec.compile(6, 3, env.observation_names, env.action_names)
        self._reference = jax.jit(self._act_and_shield)

    def export(self, path: Path, **overrides) -> Path:
        arguments = dict(
            act=self.algorithm.act,
            policy_params=self.params,
            observation_size=6,
            action_size=3,
            constraints_spec=self.spec,
            observation_names=self.env.observation_names,
            action_names=self.env.action_names,
            action_low=self.env.action_low,
            action_high=self.env.action_high,
            metadata={"algorithm": "td3bc", "config": {"hidden": [32, 32]}, "return": 0.5},
        )
        from neorl_industrial.wrappers.agents.export import PolicyExport

        return export_policy(path, PolicyExport.from_arguments(**{**arguments, **overrides}))

    def _act_and_shield(self, observations: jax.Array, prev_actions: jax.Array):
        act = lambda o: self.algorithm.act(self.params, o)  # noqa: E731
        proposed = jax.vmap(act)(observations) if observations.ndim == 2 else act(observations)
        safe, report = shield(self.compiled, observations, proposed, prev_actions)
        return safe, proposed, report

    def reference(self, observations: np.ndarray, prev_actions: np.ndarray):
        """In-process ``act`` and ``shield`` on the same inputs."""
        safe, proposed, report = self._reference(observations, prev_actions)
        return np.asarray(safe), np.asarray(proposed), report


def exported_policy(target: Path, *, seed: int = 0, signing_key: Path | None = None) -> Path:
    """:class:`Policy`'s export, its parameters initialised from ``seed``, copied to
    ``target`` and signed with ``signing_key`` when given (``signature.json`` as
    ``export(signing_key=...)`` writes it). The export itself is built once per test run
    (tests/shared.py): the deployment tests serve the same few policies."""

    def build(directory: Path) -> None:
        policy = Policy()
        if seed:
            policy.params = policy.algorithm.init(jax.random.key(seed)).policy
        policy.export(directory / "policy")

    shutil.copytree(built_once(f"exported-policy-seed{seed}", build) / "policy", target)
    if signing_key is not None:
        manifest = json.loads((target / "manifest.json").read_text())
        signature = sign_manifest(manifest, signing_key)
        (target / SIGNATURE).write_text(json.dumps(signature, indent=2))
    return target


def plant_inputs(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """IB observations over their range and previous actions in [-1, 1]: some rows keep
    every constraint, others break rate, fatigue or joint-push limits."""
    rng = np.random.default_rng(seed)
    high = np.asarray([100, 100, 100, 100, 100, 300], np.float32)
    observations = (rng.random((rows, 6)) * high).astype(np.float32)
    prev_actions = rng.uniform(-1, 1, (rows, 3)).astype(np.float32)
    return observations, prev_actions


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy()


@pytest.fixture(scope="module")
def artifact_path(tmp_path_factory) -> Path:
    return exported_policy(tmp_path_factory.mktemp("export") / "policy")


@pytest.fixture(scope="module")
def artifact(artifact_path) -> PolicyArtifact:
    return PolicyArtifact.load(artifact_path)


def sha256s(path: Path) -> dict[str, str]:
    return {file.name: hashlib.sha256(file.read_bytes()).hexdigest() for file in path.iterdir()}


@pytest.mark.parametrize("rows", [1, 5, 100])
def test_actions_match_the_in_process_policy_and_shield(policy, artifact, rows):
    observations, prev_actions = plant_inputs(rows)
    decision = artifact.predict(observations, prev_actions)
    safe, proposed, report = policy.reference(observations, prev_actions)

    np.testing.assert_allclose(decision.proposed, proposed, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(decision.action, safe, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(decision.status, np.asarray(report.status))
    np.testing.assert_array_equal(decision.overridden, np.asarray(report.overridden))
    np.testing.assert_array_equal(decision.fallback, np.asarray(report.fallback))
    np.testing.assert_allclose(decision.margin, np.asarray(report.margin), rtol=1e-5, atol=1e-5)
    violated = np.asarray(report.violated)
    assert decision.violated == tuple(
        tuple(name for name, bad in zip(artifact.constraint_names, row, strict=True) if bad)
        for row in violated
    )
    if rows == 100:  # the batch exercises both outcomes
        assert 0 < decision.overridden.sum() < rows
        assert any("rate/velocity" in names for names in decision.violated)


def test_one_observation_gives_unbatched_arrays(policy, artifact):
    observations, prev_actions = plant_inputs(3, seed=1)
    for observation, prev_action in zip(observations, prev_actions, strict=True):
        decision = artifact.predict(observation, prev_action)
        safe, _, report = policy.reference(observation, prev_action)
        assert decision.action.shape == (3,) and decision.margin.shape == (7,)
        np.testing.assert_allclose(decision.action, safe, rtol=1e-5, atol=1e-5)
        assert int(decision.status) == int(report.status)
        assert isinstance(decision.violated, tuple) and all(
            isinstance(name, str) for name in decision.violated
        )
    # Without a previous action the episode starts from zeros.
    start = artifact.predict(observations[0])
    np.testing.assert_allclose(
        start.action, policy.reference(observations[0], np.zeros(3, np.float32))[0], atol=1e-5
    )


def test_batch_sizes_share_compilations(artifact_path):
    artifact = PolicyArtifact.load(artifact_path)
    observations, prev_actions = plant_inputs(8)
    first = artifact.predict(observations[:5], prev_actions[:5])
    for rows in (5, 6, 7, 8, 5):
        decision = artifact.predict(observations[:rows], prev_actions[:rows])
        assert decision.action.shape == (rows, 3)
    assert artifact.traced_batch_sizes == (8,)
    np.testing.assert_array_equal(decision.action, first.action)
    # Padded rows do not leak into the answer: a row's action is the same in any batch.
    np.testing.assert_allclose(
        artifact.predict(observations[4], prev_actions[4]).action, first.action[4], atol=1e-5
    )
    artifact.predict(observations[:5], prev_actions[:5])
    assert artifact.traced_batch_sizes == (8, 1)


def test_the_artifact_describes_itself(policy, artifact, artifact_path):
    manifest = artifact.manifest
    assert sorted(path.name for path in artifact_path.iterdir()) == [
        "check.jaxexport",
        "constraints.yaml",
        "manifest.json",
        "params.msgpack",
        "params.npz",
        "serve.jaxexport",
        "serve_large.jaxexport",
    ]
    assert set(manifest["files"]) == {
        "check.jaxexport",
        "constraints.yaml",
        "params.msgpack",
        "params.npz",
        "serve.jaxexport",
        "serve_large.jaxexport",
    }
    assert manifest["format_version"] == 3
    assert {"jax", "jaxlib", "neorl_industrial"} <= set(manifest["versions"])
    assert manifest["platforms"][0] == "cpu"
    assert manifest["status_bits"]["fallback"] == 4
    assert artifact.observation_names == policy.env.observation_names
    assert artifact.action_names == ("velocity", "gain", "shift")
    assert artifact.constraint_names == policy.compiled.names
    assert artifact.constraint_spec == policy.spec
    assert artifact.metadata == {
        "algorithm": "td3bc",
        "config": {"hidden": [32, 32]},
        "return": 0.5,
    }
    np.testing.assert_array_equal(artifact.action_high, np.ones(3, np.float32))
    parameters = artifact.parameters()
    kernel = parameters["actor/params/Dense_0/kernel"]
    np.testing.assert_array_equal(kernel, policy.params.actor["params"]["Dense_0"]["kernel"])


def test_serving_imports_no_training_code(artifact_path):
    script = f"""
import json, sys
from neorl_industrial.wrappers.agents import PolicyArtifact
artifact = PolicyArtifact.load(sys.argv[1])
decision = artifact.predict([[50.0, 40.0, 60.0, 30.0, 70.0, 200.0]] * 3)
training = sorted(
    name for name in sys.modules
    if any(name == module or name.startswith(module + ".") for module in {TRAINING_MODULES!r})
)
print(json.dumps({{"training": training, "action": decision.action.tolist()}}))
"""
    environment = {**os.environ, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", script, str(artifact_path)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["training"] == []
    expected = PolicyArtifact.load(artifact_path).predict([50.0, 40.0, 60.0, 30.0, 70.0, 200.0])
    np.testing.assert_allclose(answer["action"], [expected.action.tolist()] * 3, atol=1e-5)


@pytest.mark.parametrize("with_spec", [True, False])
def test_a_nan_policy_still_leaves_safe_actions(policy, tmp_path, with_spec):
    def broken_act(params, observation):
        return jnp.full((3,), jnp.nan) * params["scale"]

    path = policy.export(
        tmp_path / "broken",
        act=broken_act,
        policy_params={"scale": jnp.ones(())},
        constraints_spec=policy.spec if with_spec else None,
        platforms=("cpu",),
    )
    artifact = PolicyArtifact.load(path)
    observations, prev_actions = plant_inputs(4)
    prev_actions = np.clip(prev_actions, -0.5, 0.5)
    decision = artifact.predict(observations, prev_actions)
    assert np.isnan(decision.proposed).all()
    assert np.isfinite(decision.action).all()
    assert decision.fallback.all() and decision.invalid.all() and decision.overridden.all()
    assert all("bounds/velocity" in names for names in decision.violated)
    if with_spec:  # the IB spec's fallback: no change
        np.testing.assert_array_equal(decision.action, np.zeros((4, 3), np.float32))
    else:  # the action bounds alone, holding the previous setting
        assert artifact.constraint_names == ("bounds/velocity", "bounds/gain", "bounds/shift")
        np.testing.assert_array_equal(decision.action, prev_actions)


def test_tampered_missing_or_unknown_files_are_named(artifact_path, tmp_path):
    def damaged(name: str, damage) -> Path:
        copy = tmp_path / f"copy-{name}-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(artifact_path, copy)
        damage(copy / name)
        return copy

    def flip_byte(file: Path) -> None:
        data = bytearray(file.read_bytes())
        data[len(data) // 2] ^= 0xFF
        file.write_bytes(bytes(data))

    def edit_manifest(**changes):
        def edit(file: Path) -> None:
            file.write_text(json.dumps({**json.loads(file.read_text()), **changes}))

        return edit

    cases = [
        (damaged("serve.jaxexport", flip_byte), r"serve\.jaxexport: corrupt"),
        (damaged("constraints.yaml", Path.unlink), r"constraints\.yaml: missing"),
        (damaged("manifest.json", Path.unlink), r"manifest\.json: missing"),
        (damaged("manifest.json", edit_manifest(format_version=4)), "format_version 4 is unknown"),
        (
            damaged("manifest.json", edit_manifest(action_high=[2, 2, 2])),
            r"manifest\.json: corrupt",
        ),
    ]
    for path, message in cases:
        with pytest.raises(PolicyArtifactError, match=message):
            PolicyArtifact.load(path)


def test_an_existing_artifact_is_kept_unless_overwrite(policy, artifact_path, tmp_path):
    path = tmp_path / "policy"
    shutil.copytree(artifact_path, path)
    before = sha256s(path)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        policy.export(path, metadata={"algorithm": "other"}, platforms=("cpu",))
    assert sha256s(path) == before

    policy.export(path, metadata={"algorithm": "other"}, platforms=("cpu",), overwrite=True)
    assert PolicyArtifact.load(path).metadata == {"algorithm": "other"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"]  # no staging left behind

    unrelated = tmp_path / "notes"
    unrelated.mkdir()
    (unrelated / "todo.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a policy artifact"):
        policy.export(unrelated, platforms=("cpu",), overwrite=True)
    assert (unrelated / "todo.txt").read_text() == "keep me"


def test_bad_exports_are_named_and_leave_nothing(policy, tmp_path):
    path = tmp_path / "policy"
    with pytest.raises(PolicyArtifactError, match=r"metadata\['summary'\]\['returns'\]: ndarray"):
        policy.export(path, metadata={"summary": {"returns": np.zeros(3)}})
    with pytest.raises(PolicyArtifactError, match=r"act: expected a float array \[3\]"):
        policy.export(path, act=lambda params, observation: observation)
    with pytest.raises(PolicyArtifactError, match="action_low"):
        policy.export(path, action_low=[-1.0, -1.0])
    assert list(tmp_path.iterdir()) == []


def test_bad_observations_are_named(artifact):
    # The wording of every entry point (wrappers.agents.readings.decision_inputs).
    with pytest.raises(ValueError, match=r"observation: expected shape \[6\] or \[rows, 6\]"):
        artifact.predict(np.zeros(5))
    with pytest.raises(ValueError, match=r"observation: expected shape .* got \[0, 6\]"):
        artifact.predict(np.zeros((0, 6)))
    observations = np.ones((3, 6))
    observations[2, 4] = np.nan
    with pytest.raises(ValueError, match="observation: row 2 'fatigue' is nan"):
        artifact.predict(observations)
    with pytest.raises(ValueError, match="prev_action: expected the shape"):
        artifact.predict(np.ones((3, 6)), np.zeros((2, 3)))


def test_the_manifest_records_the_task_a_server_pins(policy, tmp_path):
    low = np.full(6, -np.inf)
    high = np.asarray([100.0, 100.0, 100.0, 100.0, np.inf, 1000.0])
    path = policy.export(
        tmp_path / "policy",
        observation_bounds=(low, high),
        observation_units=["%", "-", "-", "-", None, "kW"],
        action_units=["-", "-", "-"],
    )
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["observation_names"] == list(policy.env.observation_names)
    assert manifest["observation_low"] == [None] * 6
    assert manifest["observation_high"] == [100.0, 100.0, 100.0, 100.0, None, 1000.0]
    assert manifest["observation_units"] == ["%", "-", "-", "-", None, "kW"]
    assert manifest["action_units"] == ["-", "-", "-"]
    with pytest.raises(PolicyArtifactError, match=r"action_units: expected 3"):
        policy.export(tmp_path / "bad", action_units=["-"])


def test_an_export_removes_the_staging_left_by_a_killed_export(policy, tmp_path):
    """A process killed mid-export leaves its hidden staging directory; the next export
    beside it removes it once it is an hour old (a younger one may still be written)."""
    stale, fresh = tmp_path / ".policy.killed.tmp", tmp_path / ".other.running.tmp"
    for staging in (stale, fresh):
        staging.mkdir()
        (staging / "serve.jaxexport").write_bytes(b"half")
    os.utime(stale, (0, 0))
    policy.export(tmp_path / "policy")
    assert not stale.exists() and fresh.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.running.tmp", "policy"]


def test_batches_that_keep_every_rule_are_served_from_the_check_with_the_same_outputs(
    artifact_path, artifact
):
    """The artifact's check (the policy and the shield's reading, without the repair)
    serves small batches whose every row keeps every rule: its outputs are the serving
    function's, bit for bit; a batch with one row to repair goes to the serving
    function. The same decisions as an artifact served without the check, on batches
    all kept, mixed, and larger than the check serves."""
    manifest = json.loads((artifact_path / "manifest.json").read_text())
    assert manifest["check"] == {"file": "check.jaxexport", "max_batch": 63}
    assert "check.jaxexport" in manifest["files"]
    without = PolicyArtifact.load(artifact_path)
    without._check = None
    observations, prev_actions = plant_inputs(400, seed=7)
    full = without.decide_rows(observations, prev_actions)
    kept = np.flatnonzero(full.status == 0)
    repaired = np.flatnonzero(full.overridden)
    assert len(kept) >= 40 and len(repaired) >= 40  # both outcomes among the rows
    max_batch, check = artifact._check
    calls = []

    def counted(*arguments):
        packed = check(*arguments)
        calls.append(bool(np.asarray(packed)[0, -1]))
        return packed

    artifact._check = (max_batch, counted)
    try:
        # Padded to powers of two: the check serves up to 32 rows.
        for rows in (kept[:1], kept[:3], kept[:17], kept[:30], np.r_[kept[:5], repaired[:1]],
                     repaired[:2], kept[:40]):  # fmt: skip
            ours = artifact.decide_rows(observations[rows], prev_actions[rows])
            theirs = without.decide_rows(observations[rows], prev_actions[rows])
            for field in ("action", "proposed", "status", "margin", "applied_margin", "incident"):
                np.testing.assert_array_equal(
                    getattr(ours, field), getattr(theirs, field), err_msg=f"{field}, {len(rows)}"
                )
    finally:
        artifact._check = (max_batch, check)
    # The four all-kept batches from the check; the two with a row to repair past it; the
    # 40 rows (64 padded, above the check's size) never asked it.
    assert calls == [True, True, True, True, False, False]
