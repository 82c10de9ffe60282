"""Host I/O: atomic writes, JSON conversion and YAML without aliases."""

from __future__ import annotations

import math
import os
import time

import numpy as np
import pytest

from neorl_industrial.wrappers.hostio import (
    MAX_YAML_BYTES,
    YamlError,
    atomic_directory,
    load_yaml_text,
    read_yaml,
    remove_stale_staging,
    to_json_data,
    write_json_atomic,
    write_text_atomic,
)


def test_an_interrupted_directory_write_leaves_nothing(tmp_path):
    target = tmp_path / "agent"
    with pytest.raises(RuntimeError), atomic_directory(target) as staging:
        (staging / "half.bin").write_bytes(b"x")
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


def test_a_directory_is_replaced_only_when_allowed_and_recognised(tmp_path):
    target = tmp_path / "out"
    with atomic_directory(target) as staging:
        (staging / "a").write_text("1")
    with pytest.raises(FileExistsError, match="already exists"), atomic_directory(target):
        pass
    with (
        pytest.raises(FileExistsError, match="is not mine; refusing"),
        atomic_directory(
            target, overwrite=True, replaceable=lambda p: False, refusal="is not mine"
        ),
    ):
        pass
    with atomic_directory(target, overwrite=True) as staging:
        (staging / "b").write_text("2")
    assert sorted(p.name for p in target.iterdir()) == ["b"]


def test_files_are_written_whole_and_json_converts_numpy(tmp_path):
    write_text_atomic(tmp_path / "a.txt", "hello")
    write_json_atomic(tmp_path / "a.json", {"x": np.float32(1.5), "v": np.arange(2)})
    assert (tmp_path / "a.txt").read_text() == "hello"
    assert '"v": [\n    0,\n    1\n  ]' in (tmp_path / "a.json").read_text()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_stale_staging_left_by_a_killed_writer_is_removed(tmp_path):
    stale = tmp_path / ".dataset.abc.tmp"
    stale.mkdir()
    fresh = tmp_path / ".other.def.tmp"
    fresh.write_text("x")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    assert remove_stale_staging(tmp_path, older_than=3600) == 1
    assert not stale.exists() and fresh.exists()


def test_strict_json_names_the_entry_that_is_not_json():
    assert to_json_data({"a": (1, np.int64(2))}) == {"a": [1, 2]}
    with pytest.raises(ValueError, match=r"metadata\['a'\]\[1\]: nan is not valid JSON"):
        to_json_data({"a": [1.0, math.nan]}, where="metadata", strict=True)
    with pytest.raises(ValueError, match="ndarray is not JSON data"):
        to_json_data({"a": np.zeros(2)}, strict=True)


def test_yaml_refuses_aliases_huge_and_deep_documents(tmp_path):
    assert load_yaml_text("a: [1, 2]") == {"a": [1, 2]}
    bomb = 'a: &a ["x", "x"]\nb: &b [*a, *a]\nc: [*b, *b]\n'
    with pytest.raises(YamlError, match=r"schema.yaml: not valid YAML.*anchors"):
        load_yaml_text(bomb, "schema.yaml")
    with pytest.raises(YamlError, match="larger than"):
        load_yaml_text("a: " + "x" * (MAX_YAML_BYTES + 1))
    with pytest.raises(YamlError, match=r"nested too deeply|not valid YAML"):
        load_yaml_text("[" * 5000 + "]" * 5000)
    with pytest.raises(YamlError, match="cannot read the constraint spec: no such file"):
        read_yaml(tmp_path / "missing.yaml", what="constraint spec")
