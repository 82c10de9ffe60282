"""Run configuration files and ``--set`` overrides are untrusted YAML: no anchors or
aliases (a few hundred bytes of them expand to gigabytes), no documents over 1 MiB, and
errors that name the file and line as a ConfigError."""

from __future__ import annotations

import time

import pytest

from neorl_industrial.wrappers.training import ConfigError, RunConfig, apply_overrides

ALIAS_BOMB = "".join(
    f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]\n"
    for previous, name in zip("abcdefgh", "bcdefghi", strict=True)
)


def test_a_config_file_with_an_alias_bomb_is_refused_at_once(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text('a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]\n' + ALIAS_BOMB)
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=r"(?s)run.yaml: not valid YAML.*anchors.*line 1"):
        RunConfig.from_yaml(path)
    assert time.perf_counter() - started < 1.0


def test_a_config_file_over_one_mebibyte_is_not_read(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("name: big\n" + "#" * (1 << 20))
    with pytest.raises(ConfigError, match=r"run.yaml: larger than 1048576 bytes"):
        RunConfig.from_yaml(path)


def test_a_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("name: fine\ntraining: [1, 2\n")
    with pytest.raises(ConfigError, match=r"(?s)run.yaml: not valid YAML.*line 3"):
        RunConfig.from_yaml(path)


@pytest.mark.parametrize(
    "override",
    ["training.seeds=&s [0, 1]", "training.seeds=*s", "name=!!python/object:os.system ls"],
)
def test_overrides_refuse_aliases_and_python_objects(override):
    with pytest.raises(ConfigError, match=r"(?s)override .*: not valid YAML"):
        apply_overrides({}, [override])


def test_plain_overrides_still_read_as_yaml():
    values = apply_overrides({}, ["training.seeds=[0, 1, 2]", "name=run-7"])
    assert values == {"training": {"seeds": [0, 1, 2]}, "name": "run-7"}
