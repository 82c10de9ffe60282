"""The policy's parameters as an argument of the artifact's functions: stored in
``params.npz``, digested and signed like every file, checked against what the functions
take, and left out of the compiled programs, so that policies of one architecture share
them."""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.wrappers.agents import PolicyArtifact, PolicyArtifactError
from neorl_industrial.wrappers.agents.artifact import _digest
from neorl_industrial.wrappers.agents.signing import PUBLIC_KEY, generate_key_pair
from tests.wrappers.agents.test_export import exported_policy, plant_inputs
from tests.wrappers.agents.test_signing import rewrite_with_digests

PARAMS = "params.npz"


@pytest.fixture(scope="module")
def artifact_path(tmp_path_factory) -> Path:
    return exported_policy(tmp_path_factory.mktemp("parameters") / "policy")


def _arrays(path: Path) -> list[np.ndarray]:
    with np.load(path / PARAMS, allow_pickle=False) as archive:
        return [archive[f"leaf_{i}"] for i in range(len(archive.files))]


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def test_the_parameters_are_a_file_of_the_artifact_digested_and_signed(artifact_path, tmp_path):
    """``params.npz`` is listed with its sha256: a changed byte is refused by name before
    the file is parsed; another policy's parameters with the digests made to fit break
    the signature."""
    manifest = json.loads((artifact_path / "manifest.json").read_text())
    data = (artifact_path / PARAMS).read_bytes()
    assert manifest["files"][PARAMS] == hashlib.sha256(data).hexdigest()
    arrays = _arrays(artifact_path)
    assert manifest["inputs"][0].startswith(f"parameters: the {len(arrays)} arrays of {PARAMS}")
    assert [a.shape for a in arrays] == [
        aval.shape
        for aval in jax.export.deserialize(
            bytearray((artifact_path / "serve.jaxexport").read_bytes())
        ).in_avals[:-2]
    ]

    flipped = tmp_path / "flipped"
    shutil.copytree(artifact_path, flipped)
    damaged = bytearray(data)
    damaged[len(damaged) // 2] ^= 0xFF
    (flipped / PARAMS).write_bytes(bytes(damaged))
    with pytest.raises(PolicyArtifactError, match=r"params\.npz: corrupt \(sha256 differs"):
        PolicyArtifact.load(flipped)

    key = generate_key_pair(tmp_path / "keys")
    signed = exported_policy(tmp_path / "signed", signing_key=key)
    trusted = [key.parent / PUBLIC_KEY]
    assert PolicyArtifact.load(signed, trusted_keys=trusted).signature["verified"]
    swapped = tmp_path / "swapped"
    shutil.copytree(signed, swapped)
    shutil.copyfile(exported_policy(tmp_path / "other", seed=1) / PARAMS, swapped / PARAMS)
    rewrite_with_digests(swapped)
    with pytest.raises(PolicyArtifactError, match="does not match the manifest"):
        PolicyArtifact.load(swapped, trusted_keys=trusted)
    # Unsigned, the same swap loads and serves the other policy's actions.
    observations, prev_actions = plant_inputs(5)
    other = PolicyArtifact.load(tmp_path / "other").predict(observations, prev_actions)
    served = PolicyArtifact.load(swapped).predict(observations, prev_actions)
    np.testing.assert_array_equal(served.proposed, other.proposed)


def test_parameters_that_do_not_fit_the_functions_are_refused_by_name(artifact_path, tmp_path):
    arrays = _arrays(artifact_path)
    named = {f"leaf_{i}": a for i, a in enumerate(arrays)}
    kernel = arrays[1]  # the first layer's kernel, [observations, hidden]
    assert kernel.ndim == 2
    # leaf_0 with its header intact and its last value cut short.
    truncated = io.BytesIO()
    with (
        zipfile.ZipFile(artifact_path / PARAMS) as original,
        zipfile.ZipFile(truncated, "w") as archive,
    ):
        for name in original.namelist():
            member = original.read(name)
            archive.writestr(name, member[:-4] if name == "leaf_0.npy" else member)
    rows, columns = kernel.shape
    shape = rf"\({rows}, {columns}\)"
    described = f"float32 {shape}"
    cases = [
        (
            _npz({**named, "leaf_1": kernel[:, :-1]}),
            rf"leaf_1\.npy is float32 \({rows}, {columns - 1}\), but the policy functions "
            rf"take {described}",
        ),
        (
            _npz({**named, "leaf_1": kernel.astype(np.float64)}),
            rf"leaf_1\.npy is float64 {shape}, but the policy functions take {described}",
        ),
        (
            _npz({**named, "leaf_1": np.empty(kernel.shape, object)}),  # pickled: never read
            rf"leaf_1\.npy is object .*, but the policy functions take {described}",
        ),
        (
            _npz(dict(list(named.items())[:-1])),
            rf"holds {len(arrays) - 1} arrays \(leaf_0, .*\), but the policy functions take "
            rf"{len(arrays)} \(leaf_0 \.\.\. leaf_{len(arrays) - 1}\)",
        ),
        (_npz({**named, "extra": kernel}), rf"holds {len(arrays) + 1} arrays"),
        (truncated.getvalue(), r"leaf_0\.npy holds \d+ bytes of values, not the \d+ of float32"),
        (b"not an archive", r"not a numpy \.npz archive of the policy's parameters"),
    ]
    for index, (data, message) in enumerate(cases):
        copy = tmp_path / f"copy-{index}"
        shutil.copytree(artifact_path, copy)
        (copy / PARAMS).write_bytes(data)
        rewrite_with_digests(copy)
        prefix = re.escape(str(copy / PARAMS))
        with pytest.raises(PolicyArtifactError, match=rf"{prefix}: {message}"):
            PolicyArtifact.load(copy)

    missing = tmp_path / "missing"
    shutil.copytree(artifact_path, missing)
    (missing / PARAMS).unlink()
    with pytest.raises(PolicyArtifactError, match=r"params\.npz: missing from the policy"):
        PolicyArtifact.load(missing)
    manifest = json.loads((missing / "manifest.json").read_text())
    del manifest["files"][PARAMS]
    manifest["manifest_sha256"] = _digest(manifest)
    (missing / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PolicyArtifactError, match=r"lists no sha256 for params\.npz"):
        PolicyArtifact.load(missing)


def _lowered(function, rows: int) -> str:
    """The program ``function`` (one of the artifact's jitted calls with its parameters
    bound) compiles for ``rows`` rows, as text."""
    observations, prev_actions = plant_inputs(rows)
    return function.func.lower(*function.args, observations, prev_actions).as_text()


def test_policies_of_one_architecture_compile_one_program(tmp_path):
    """Two policies that differ only in their parameters: the same program for every
    function (so the compilation caches hold one for both), different actions. Parameters
    baked into the program as constants would make the programs differ."""
    first = PolicyArtifact.load(exported_policy(tmp_path / "seed0"))
    second = PolicyArtifact.load(exported_policy(tmp_path / "seed1", seed=1))
    for rows in (4, 64):
        assert _lowered(first._serving(rows), rows) == _lowered(second._serving(rows), rows)
    assert _lowered(first._check[1], 4) == _lowered(second._check[1], 4)
    observations, prev_actions = plant_inputs(64)
    assert not np.array_equal(
        first.predict(observations, prev_actions).proposed,
        second.predict(observations, prev_actions).proposed,
    )


def _as_format_2(path: Path, target: Path) -> Path:
    """The artifact at ``path`` as format 2 wrote it: functions that hold their
    parameters, no ``params.npz``."""
    shutil.copytree(path, target)
    manifest = json.loads((path / "manifest.json").read_text())
    parameters = tuple(jnp.asarray(a) for a in _arrays(path))
    entries = [*manifest["functions"], manifest["check"]]
    for entry in entries:
        exported = jax.export.deserialize(bytearray((path / entry["file"]).read_bytes()))
        if "max_batch" in entry:  # the check
            constraints = (f"batch <= {entry['max_batch']}",)
        elif entry["min_batch"] > 1:
            constraints = (f"batch >= {entry['min_batch']}",)
        else:
            constraints = ()
        (batch,) = jax.export.symbolic_shape("batch", constraints=constraints)
        batch_avals = exported.in_avals[-2:]
        data = jax.export.export(
            jax.jit(lambda o, p, exported=exported: exported.call(parameters, o, p)),
            platforms=manifest["platforms"],
        )(*(jax.ShapeDtypeStruct((batch, aval.shape[1]), aval.dtype) for aval in batch_avals))
        (target / entry["file"]).write_bytes(data.serialize())
    (target / PARAMS).unlink()
    del manifest["files"][PARAMS]
    manifest.update(format_version=2)
    (target / "manifest.json").write_text(json.dumps(manifest))
    rewrite_with_digests(target)
    return target


def test_an_artifact_of_format_2_still_serves(artifact_path, tmp_path):
    """Its functions take no parameters (they hold them): the same decisions, from the
    check, the small-batch and the large-batch function."""
    old = PolicyArtifact.load(_as_format_2(artifact_path, tmp_path / "old"))
    new = PolicyArtifact.load(artifact_path)
    for rows in (1, 5, 100):
        observations, prev_actions = plant_inputs(rows, seed=3)
        then, now = old.predict(observations, prev_actions), new.predict(observations, prev_actions)
        for field in ("action", "proposed", "status", "margin", "applied_margin"):
            np.testing.assert_array_equal(getattr(then, field), getattr(now, field), err_msg=field)
    assert old.traced_check_sizes and old.traced_batch_sizes


def test_the_functions_take_one_buffer_per_dtype_and_slice_every_array_back(artifact_path):
    """Each argument of a served call costs its dispatch on every request: the parameters
    reach the functions as one device buffer per dtype, from which the program slices
    each array back exactly, in the order the functions take them."""
    served = PolicyArtifact.load(artifact_path)
    stored = _arrays(artifact_path)
    assert len(stored) > 2 and len(served._parameters.buffers) == 1
    (rebuilt,) = jax.jit(served._parameters.arguments)(served._parameters.buffers)
    assert len(rebuilt) == len(stored)
    for mine, reference in zip(rebuilt, stored, strict=True):
        assert mine.shape == reference.shape and mine.dtype == reference.dtype
        np.testing.assert_array_equal(mine, reference)
    # Mixed dtypes: a buffer each, every array back in its place.
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([7, 8], np.int32)]
    arrays += [np.float32(9.5) * np.ones((), np.float32), np.zeros((0, 4), np.float32)]
    mixed = type(served._parameters).of(arrays)
    assert [b.dtype for b in mixed.buffers] == [np.float32, np.int32]
    (back,) = mixed.arguments(mixed.buffers)
    for mine, reference in zip(back, arrays, strict=True):
        assert mine.shape == reference.shape and mine.dtype == reference.dtype
        np.testing.assert_array_equal(mine, reference)
    # Formats 1 and 2 hold their parameters: no buffers, nothing passed.
    empty = type(served._parameters).of(())
    assert empty.buffers == () and empty.arguments(()) == ()
