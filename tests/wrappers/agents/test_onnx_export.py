"""The ONNX graph of an exported policy: parity with the JAX artifact on the shield's edge
cases, dynamic batch, opset, signature and tampering, the runtime class, named errors."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")

from neorl_industrial.core.agents.networks import ObservationNormalizer  # noqa: E402
from neorl_industrial.core.safety.shield import (  # noqa: E402
    FALLBACK,
    INFEASIBLE,
    INVALID,
    INVALID_OBSERVATION,
    OUT_OF_DISTRIBUTION,
    OVERRIDDEN,
    PROJECTED,
)
from neorl_industrial.wrappers.agents import PolicyArtifact, PolicyArtifactError  # noqa: E402
from neorl_industrial.wrappers.agents.artifact import _digest  # noqa: E402
from neorl_industrial.wrappers.agents.export import export_policy  # noqa: E402
from neorl_industrial.wrappers.agents.onnx_export import (  # noqa: E402
    EDGE_CLASSES,
    ONNX_FILE,
    compare_decisions,
    edge_case_inputs,
    runtime_session,
    subnormal_rows,
)
from neorl_industrial.wrappers.agents.onnx_graph import OPSET, OnnxExportError  # noqa: E402
from neorl_industrial.wrappers.agents.signing import generate_key_pair  # noqa: E402
from tests.processes import run_shipped  # noqa: E402

from .test_export import Policy, plant_inputs  # noqa: E402

# The IB's readings: setpoint, velocity, gain, shift in [0, 100], fatigue and consumption
# non-negative (physical bounds); the data the policy learnt from spans these ranges.
TYPICAL = (np.zeros(6), np.asarray([100, 100, 100, 100, 100, 300], np.float64))
PHYSICAL = (np.zeros(6), np.asarray([100, 100, 100, 100, np.inf, np.inf]))
ROWS = 2_000


class NormalizedPolicy(Policy):
    """The test policy with the data's observation statistics, as a trained agent has."""

    def __init__(self):
        super().__init__()
        low, high = TYPICAL
        normalizer = ObservationNormalizer.create((low + high) / 2, (high - low) / np.sqrt(12))
        self.params = self.params.replace(normalizer=normalizer)

    def export(self, path: Path, **overrides) -> Path:
        return super().export(
            path,
            **{"observation_bounds": PHYSICAL, "data_bounds": TYPICAL, **overrides},
        )


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    return generate_key_pair(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def policy() -> NormalizedPolicy:
    return NormalizedPolicy()


@pytest.fixture(scope="module")
def onnx_path(policy, keys, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("onnx") / "policy"
    return policy.export(path, format="onnx", signing_key=keys)


@pytest.fixture(scope="module")
def jax_artifact(onnx_path) -> PolicyArtifact:
    return PolicyArtifact.load(onnx_path)


@pytest.fixture(scope="module")
def session(onnx_path):
    return runtime_session((onnx_path / ONNX_FILE).read_bytes())


@pytest.fixture(scope="module")
def probes(jax_artifact):
    return edge_case_inputs(jax_artifact.compiled_constraints, ROWS, typical=TYPICAL, seed=1)


@pytest.fixture(scope="module")
def expected(onnx_path, probes, tmp_path_factory):
    """The JAX artifact's decisions of the probes, compiled as a user's server compiles it
    (the suite's fast-compile code generator treats subnormal readings as zero)."""
    rows = tmp_path_factory.mktemp("probes") / "rows.npz"
    np.savez(rows, observations=probes.observations, prev_actions=probes.prev_actions)
    return run_shipped(
        "import numpy as np\n"
        "from neorl_industrial.wrappers.agents import PolicyArtifact\n"
        f"rows = np.load({str(rows)!r})\n"
        f"artifact = PolicyArtifact.load({str(onnx_path)!r})\n"
        "result = artifact.decide_rows(rows['observations'], rows['prev_actions'])\n"
    )


def run_onnx(session, observations, prev_actions):
    feeds = {"observations": observations, "prev_actions": prev_actions}
    return session.run(["action", "proposed", "status", "margins"], feeds)


def test_onnx_actions_equal_the_jax_artifacts_on_every_edge_class(session, probes, expected):
    decision = expected
    reference = (decision.action, decision.proposed, decision.status)
    onnx_outputs = run_onnx(session, probes.observations, probes.prev_actions)
    parity = compare_decisions(reference, onnx_outputs, probes.classes, probes.observations)

    assert (
        parity.rows == ROWS
        and parity.status_mismatches == 0
        and set(parity.by_class) == set(EDGE_CLASSES)
    )
    for name, result in parity.by_class.items():
        assert result["max_action_difference"] <= 1e-5, (name, result)
    assert np.all(np.isfinite(onnx_outputs[0]))  # the shield never serves a NaN
    # Statuses are equal bit for bit, except the out-of-distribution flag of a reading
    # one subnormal float outside a data bound of 0: XLA:CPU flushes subnormals to zero
    # in some comparisons, ONNX Runtime compares them as IEEE numbers.
    differs = decision.status != onnx_outputs[2]
    assert np.all(subnormal_rows(probes.observations)[differs])
    assert np.all((decision.status ^ onnx_outputs[2])[differs] == OUT_OF_DISTRIBUTION)
    # The margins too (NaN where a constraint reads an invalid sensor, on both sides).
    margins = np.stack([decision.margin, decision.applied_margin], axis=1)
    np.testing.assert_allclose(onnx_outputs[3], margins, rtol=1e-5, atol=1e-4)
    # The edge classes reach every outcome of the shield.
    status = decision.status
    for bit in (OVERRIDDEN, PROJECTED, FALLBACK, INVALID, INFEASIBLE, INVALID_OBSERVATION):
        assert np.any(status & bit), bit
    assert np.any(status & OUT_OF_DISTRIBUTION) and np.any(status == 0)


@pytest.fixture(scope="module")
def served(onnx_path):
    from neorl_industrial.integration.deployment.onnx_policy import load_artifact

    return load_artifact(onnx_path, runtime="onnx")


def test_the_runtime_class_serves_what_the_jax_artifact_serves(
    onnx_path, served, jax_artifact, probes, expected
):
    from neorl_industrial.integration.deployment.onnx_policy import (
        OnnxPolicyArtifact,
        load_artifact,
    )

    assert isinstance(served, OnnxPolicyArtifact) and served.runtime == "onnx"
    assert served.manifest == jax_artifact.manifest
    decision = served.decide_rows(probes.observations, probes.prev_actions)
    np.testing.assert_allclose(decision.action, expected.action, atol=1e-5)
    same = ~subnormal_rows(probes.observations)
    np.testing.assert_array_equal(decision.status[same], expected.status[same])
    assert np.all(decision.violated_after_mask[same] == expected.violated_after_mask[same])
    # One observation: the JAX artifact's row-wise function (below its 64-row branch).
    observations, prev_actions = plant_inputs(1, seed=1)
    one, reference = (
        artifact.predict(observations[0], prev_actions[0]) for artifact in (served, jax_artifact)
    )
    assert one.action.shape == (3,) and one.margin.shape == (7,)
    np.testing.assert_allclose(one.action, reference.action, atol=1e-5)
    assert int(one.status) == int(reference.status) and one.violated == reference.violated
    with pytest.raises(ValueError, match=r"setpoint.*finite"):
        served.predict(np.full(6, np.nan, np.float32))
    with pytest.raises(ValueError, match="runtime"):
        load_artifact(onnx_path, runtime="tflite")


def test_a_guard_runs_on_the_onnx_actions(served, probes, expected):
    class Strict:
        """Accepts no velocity above 0.1 and replaces it with 0.1 (an incident)."""

        def accepts(self, observations, prev_actions, action):
            return action[:, 0] <= 0.1

        def repair(self, observations, prev_actions, action):
            fixed = action.copy()
            fixed[:, 0] = 0.1
            return fixed, np.ones(len(action), bool)

    incidents = []
    guarded = served.with_guard(Strict(), incidents.append)
    assert guarded.guarded and not served.guarded
    rows = slice(0, 64)
    decision = guarded.predict(probes.observations[rows], probes.prev_actions[rows])
    plain = expected.action[rows]
    high = plain[:, 0] > 0.1
    assert high.any() and (~high).any()
    np.testing.assert_array_equal(decision.incident, high)
    assert np.all(decision.action[:, 0] <= 0.1) and len(incidents) == 1
    np.testing.assert_allclose(decision.action[~high], plain[~high], atol=1e-5)


def test_the_graph_states_its_opset_and_serves_any_batch(onnx_path, session, jax_artifact):
    manifest = json.loads((onnx_path / "manifest.json").read_text())
    entry = manifest["onnx"]
    model = onnx.load(onnx_path / ONNX_FILE)
    assert entry["file"] == ONNX_FILE and entry["opset"] == OPSET == 18
    assert [o.version for o in model.opset_import if o.domain == ""] == [OPSET]
    for value in [*model.graph.input, *model.graph.output]:
        assert value.type.tensor_type.shape.dim[0].dim_param == "batch"
    assert entry["inputs"] == {"observations": ["batch", 6], "prev_actions": ["batch", 3]}
    assert entry["parity"]["max_action_difference"] <= entry["parity"]["target"]
    assert set(manifest["versions"]) >= {"onnx", "onnxruntime"}
    for rows in (1, 3, 1024):
        observations, prev_actions = plant_inputs(rows, seed=2)
        action, _, status, margins = run_onnx(session, observations, prev_actions)
        assert action.shape == (rows, 3) and status.shape == (rows,)
        assert margins.shape == (rows, 2, 7) and status.dtype == np.int32


def test_the_signature_covers_the_graph_and_a_changed_graph_is_refused(onnx_path, keys, tmp_path):
    from neorl_industrial.integration.deployment.onnx_policy import OnnxPolicyArtifact

    public = keys.with_suffix(".pub")
    manifest = json.loads((onnx_path / "manifest.json").read_text())
    data = (onnx_path / ONNX_FILE).read_bytes()
    assert manifest["files"][ONNX_FILE] == hashlib.sha256(data).hexdigest()
    loaded = OnnxPolicyArtifact.load(onnx_path, trusted_keys=[public], require_signature=True)
    assert loaded.signature["verified"]

    tampered = tmp_path / "tampered"
    shutil.copytree(onnx_path, tampered)
    model = onnx.load(tampered / ONNX_FILE)
    bias = next(t for t in model.graph.initializer if t.dims == [3])  # a layer's bias
    array = onnx.numpy_helper.to_array(bias) + 0.5
    bias.CopyFrom(onnx.numpy_helper.from_array(array.astype(np.float32), bias.name))
    (tampered / ONNX_FILE).write_bytes(model.SerializeToString())
    for load in (OnnxPolicyArtifact.load, PolicyArtifact.load):
        with pytest.raises(PolicyArtifactError, match=r"policy\.onnx: corrupt"):
            load(tampered, trusted_keys=[public], require_signature=True)

    # The manifest rewritten to match the changed graph: the signature no longer does.
    manifest["files"][ONNX_FILE] = hashlib.sha256((tampered / ONNX_FILE).read_bytes()).hexdigest()
    manifest["manifest_sha256"] = _digest(manifest)
    (tampered / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PolicyArtifactError, match="signature does not match"):
        OnnxPolicyArtifact.load(tampered, trusted_keys=[public], require_signature=True)
    (tampered / "signature.json").unlink()
    with pytest.raises(PolicyArtifactError, match="unsigned"):
        OnnxPolicyArtifact.load(tampered, trusted_keys=[public], require_signature=True)


def test_an_artifact_without_a_graph_is_refused_by_name(onnx_path, tmp_path):
    from neorl_industrial.integration.deployment.onnx_policy import OnnxPolicyArtifact

    plain = tmp_path / "plain"
    shutil.copytree(onnx_path, plain)
    manifest = json.loads((plain / "manifest.json").read_text())
    del manifest["onnx"], manifest["files"][ONNX_FILE]
    manifest["manifest_sha256"] = _digest(manifest)
    (plain / "manifest.json").write_text(json.dumps(manifest))
    (plain / "signature.json").unlink()
    (plain / ONNX_FILE).unlink()
    PolicyArtifact.load(plain)  # a JAX artifact as any other
    with pytest.raises(PolicyArtifactError, match=r"without an ONNX graph.*--format onnx"):
        OnnxPolicyArtifact.load(plain)


def test_a_policy_with_no_onnx_form_is_a_named_error(policy, tmp_path):
    def sorting_act(params, observation):
        # A sort has no lowering: the export names it and writes nothing.
        return jnp.tanh(jnp.sort(observation)[:3] * params)

    with pytest.raises(OnnxExportError, match=r"'sort'.*format='jax'"):
        export_policy(
            tmp_path / "policy",
            act=sorting_act,
            policy_params=jnp.ones(3),
            observation_size=6,
            action_size=3,
            action_low=-np.ones(3),
            action_high=np.ones(3),
            platforms=("cpu",),
            format="onnx",
        )
    assert not (tmp_path / "policy").exists()
    with pytest.raises(PolicyArtifactError, match="format: expected one of"):
        policy.export(tmp_path / "other", format="tflite")


def test_the_export_command_passes_the_format(tmp_path, monkeypatch):
    from neorl_industrial import cli

    calls = []

    class Saved:
        name = "td3bc"
        selected_candidate = "seed0"

        def export(self, out, **options):
            calls.append(options)
            return Path(out)

    monkeypatch.chdir(tmp_path)
    argv = ["--no-cache", "export", "agent", "--out", "policy"]
    with mock.patch("neorl_industrial.wrappers.agents.Agent.load", return_value=Saved()):
        assert cli.main([*argv, "--format", "onnx"]) == 0
        assert cli.main(argv) == 0
    assert calls == [
        {"overwrite": False, "signing_key": None, "format": "onnx"},
        {"overwrite": False, "signing_key": None},
    ]


def test_edge_cases_cover_every_class_and_refuse_too_few_rows(jax_artifact):
    constraints = jax_artifact.compiled_constraints
    cases = edge_case_inputs(constraints, len(EDGE_CLASSES), seed=0)
    assert list(cases.classes) == list(EDGE_CLASSES)
    assert cases.observations.dtype == np.float32 and cases.prev_actions.shape == (11, 3)
    with pytest.raises(ValueError, match="at least 11"):
        edge_case_inputs(constraints, 3)
    # The comparison sees a difference, a NaN on one side and a status change.
    action = np.zeros((2, 3), np.float32)
    changed = action.copy()
    changed[1, 2] = np.nan
    parity = compare_decisions(
        (action, action, np.zeros(2, np.int32)),
        (changed, action, np.asarray([0, 1], np.int32)),
        np.asarray(["a", "b"], dtype=object),
    )
    assert parity.max_action_difference == np.inf and parity.worst_class == "b"
    assert parity.status_mismatches == 1 and not parity.within()
    # A row with a subnormal reading is counted apart.
    observations = np.asarray([[0.0], [-1e-45]], np.float32)
    apart = compare_decisions(
        (action, action, np.zeros(2, np.int32)),
        (changed, action, np.asarray([0, 1], np.int32)),
        np.asarray(["a", "b"], dtype=object),
        observations,
    )
    assert apart.within() and apart.status_mismatches == 0
    assert apart.subnormal_rows == 1 and apart.subnormal_action_mismatches == 1
    assert jax.numpy.isfinite(parity.by_class["a"]["max_action_difference"])


EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "onnx_edge" / "run_policy.py"


def test_the_edge_example_runs_the_graph_with_onnxruntime_and_numpy_alone(
    onnx_path, keys, session, tmp_path
):
    import subprocess
    import sys

    # Whatever the script imports, neither JAX nor this project are loaded.
    probe = (
        "import runpy, sys; sys.argv = sys.argv[1:]; "
        "code = 0\n"
        "try: runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "except SystemExit as exit: code = exit.code\n"
        "ours = ('jax', 'neorl_industrial')\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ours)\n"
        "print('LOADED', loaded, file=sys.stderr); sys.exit(code)"
    )
    observations, prev_actions = plant_inputs(5, seed=4)
    csv = tmp_path / "observations.csv"
    names = json.loads((onnx_path / "manifest.json").read_text())["observation_names"]
    csv.write_text(
        ",".join(names)
        + "\n"
        + "\n".join(",".join(map(repr, row.tolist())) for row in observations)
    )
    prev_csv = tmp_path / "prev.csv"
    prev_csv.write_text(
        "velocity,gain,shift\n"
        + "\n".join(",".join(map(repr, row.tolist())) for row in prev_actions)
    )
    public = str(keys.with_suffix(".pub"))

    def example(*arguments):
        command = [sys.executable, "-c", probe, str(EXAMPLE), *map(str, arguments)]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    done = example(
        onnx_path,
        "--trusted-key",
        public,
        "--require-signature",
        "--observations",
        csv,
        "--prev-actions",
        prev_csv,
        "--json",
    )
    assert done.returncode == 0, done.stderr
    assert "LOADED []" in done.stderr
    printed = json.loads(done.stdout)
    assert printed["signature"].endswith("(verified)")
    expected = run_onnx(session, observations.astype(np.float32), prev_actions)
    np.testing.assert_array_equal(np.asarray(printed["action"], np.float32), expected[0])
    assert printed["status"] == expected[2].tolist()

    tampered = tmp_path / "tampered"
    shutil.copytree(onnx_path, tampered)
    data = bytearray((tampered / ONNX_FILE).read_bytes())
    data[-1] ^= 1
    (tampered / ONNX_FILE).write_bytes(bytes(data))
    refused = example(tampered, "--trusted-key", public)
    assert refused.returncode == 2 and "policy.onnx: corrupt" in refused.stderr
    (tampered / "signature.json").unlink()
    unsigned = example(tampered, "--require-signature")
    assert unsigned.returncode == 2 and "unsigned" in unsigned.stderr
