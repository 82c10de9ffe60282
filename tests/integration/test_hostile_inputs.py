"""Hostile files and flags: each is refused with one line naming what is wrong, exit 2, and
nothing written; no number in a schema, spec or configuration can switch a check off."""

from __future__ import annotations

import os
import textwrap
import threading

import pytest

from neorl_industrial import cli
from neorl_industrial.core.safety import ConstraintSpec, ConstraintSpecError
from neorl_industrial.wrappers.training.config import ConfigError, RunConfig

SCHEMA = """\
timestamp: time
sampling_period: 60
observations:
  - {column: temperature, unit: degC, physical: [0, 500]}
actions:
  - {column: valve, unit: "%", bounds: [0, 100]}
reward: -temperature
"""
LOG = """\
time,temperature,valve
2024-03-01T08:00:00,340,10
2024-03-01T08:01:00,341,11
2024-03-01T08:02:00,342,12
"""


def refusal(capsys, argv: list[str]) -> str:
    """Runs the command line; asserts exit 2 with one line on stderr and no traceback."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def _import(tmp_path, capsys, schema: str = SCHEMA, log: str = LOG) -> tuple[str, object]:
    (tmp_path / "log.csv").write_text(log)
    (tmp_path / "schema.yaml").write_text(textwrap.dedent(schema))
    out = tmp_path / "out"
    line = refusal(
        capsys,
        [
            "--no-cache",
            "datasets",
            "import",
            str(tmp_path / "log.csv"),
            "--schema",
            str(tmp_path / "schema.yaml"),
            "--out",
            str(out),
        ],
    )
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.csv", "schema.yaml"]
    return line, tmp_path


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (("sampling_period: 60", "sampling_period: .inf"), "sampling_period: inf s is outside"),
        (("sampling_period: 60", "sampling_period: 0.0"), "allowed range [1e-06, 604800] s"),
        (("sampling_period: 60", "sampling_period: 60\ngap_factor: 1e300"), "gap_factor: 1e+300"),
        (("physical: [0, 500]", "physical: [-1e308, 1e308]"), "observations[0].physical: -1e+308"),
        (("bounds: [0, 100]", "bounds: [-1e308, 1e308]"), "actions[0].bounds"),
        (("unit: degC", 'unit: "deg\\e[31mC"'), "observations[0].unit: control character U+001B"),
        (("unit: degC", 'unit: "deg\\nC"'), "observations[0].unit: control character U+000A"),
        (("reward: -temperature", "reward: -temperature\ncosts: [{name: c, limit: 1e308}]"),
         "costs[0].limit: must be a finite number in [0, 1e+12]"),
    ],
)  # fmt: skip
def test_a_schema_cannot_switch_a_check_off(tmp_path, capsys, change, named):
    line, _ = _import(tmp_path, capsys, SCHEMA.replace(*change))
    assert "schema.yaml: invalid plant-log schema: " in line and named in line, line
    assert "allowed range" in line or "finite number" in line or "control character" in line


@pytest.mark.parametrize(("stamp", "row"), [("9999-12-31T23:59:00", 2), ("0001-01-01T00:00:00", 0)])
def test_timestamps_nanoseconds_cannot_hold_name_file_column_and_row(tmp_path, capsys, stamp, row):
    lines = LOG.splitlines()
    lines[row + 1] = stamp + lines[row + 1][len(stamp) :]
    line, _ = _import(tmp_path, capsys, log="\n".join(lines) + "\n")
    assert f"log.csv: column 'time', row {row}: timestamp {stamp[:4]}" in line, line
    assert "1678-01-01 to 2261-12-31" in line


def test_numeric_seconds_beyond_the_range_name_the_row(tmp_path, capsys):
    log = "time,temperature,valve\n0,340,10\n60,341,11\n1e300,342,12\n"
    line, _ = _import(tmp_path, capsys, log=log)
    assert "column 'time', row 2: 1e+300 s is outside the allowed range" in line, line


@pytest.mark.parametrize("which", ["log", "schema", "npz"])
def test_a_fifo_is_refused_at_once_not_read(tmp_path, capsys, which):
    (tmp_path / "schema.yaml").write_text(SCHEMA)
    (tmp_path / "log.csv").write_text(LOG)
    fifo = tmp_path / {"log": "fifo.csv", "schema": "fifo.yaml", "npz": "fifo.npz"}[which]
    os.mkfifo(fifo)
    data = fifo if which != "schema" else tmp_path / "log.csv"
    argv = ["--no-cache", "datasets", "import", str(data), "--out", str(tmp_path / "out")]
    if which != "npz":
        argv += ["--schema", str(fifo if which == "schema" else tmp_path / "schema.yaml")]
    # A reader that opens the FIFO blocks until a writer comes: this one comes after 20 s,
    # so a hang fails the test instead of stopping the suite.
    rescue = threading.Timer(20.0, lambda: open(fifo, "w").close())
    rescue.start()
    try:
        line = refusal(capsys, argv)
    finally:
        rescue.cancel()
    assert f"{fifo}: a FIFO, not a regular file" in line and "nothing was read" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ({"rate_limits": {"a": 1e308}}, "rate_limits.a: must be a finite number in [0, 1e+12]"),
        ({"action_bounds": {"a": [-1e308, 1e308]}}, "action_bounds.a: low: -1e+308"),
        ({"linear": [{"name": "r", "action": {"a": 1.0}, "bound": 1e308}]}, "bound: 1e+308"),
        ({"linear": [{"name": "r", "action": {"a": 1e-300}, "bound": 1}]},
         "coefficient of 'a': 1e-300 is too small to keep in float32"),
        ({"state_limits": [{"name": "s", "when": {"feature": "x", "above": 1e308},
                            "action": "a", "max": 5}]}, "the threshold: 1e+308"),
        ({"costs": [{"name": "c", "feature": "x", "above": 1, "cost_limit": 1e308}]},
         "cost_limit: 1e+308"),
        ({"linear": [{"name": "r\n[ok]", "action": {"a": 1}, "bound": 1}]},
         "control character U+000A"),
    ],
)  # fmt: skip
def test_a_constraint_spec_cannot_switch_a_rule_off(spec, named):
    with pytest.raises(ConstraintSpecError) as caught:
        ConstraintSpec.from_dict({"action_bounds": {"a": [0, 100]}, **spec}, "plant.yaml")
    message = str(caught.value)
    assert message.startswith("plant.yaml: ") and named in message and "\n" not in message


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("safety.cost_limits=[1e308]", "safety.cost_limits: [0]: 1e+308 is outside"),
        ("tracking.flush_timeout=1e308", "tracking.flush_timeout: Input should be less than"),
        ("tracking.flush_timeout=.inf", "tracking.flush_timeout: Input should be a finite"),
    ],
)
def test_a_run_configuration_cannot_switch_a_limit_off(override, named):
    with pytest.raises(ConfigError) as caught:
        RunConfig().with_overrides([override])
    assert named in str(caught.value) and "\n" not in str(caught.value)


def test_strong_schemas_and_specs_still_load():
    spec = ConstraintSpec.from_dict(
        {
            "action_bounds": {"a": [-1e12, 1e12]},
            "rate_limits": {"a": 1e12},
            "linear": [{"name": "r", "action": {"a": 1e-12}, "bound": 0.0}],
        }
    )
    assert spec.hard_names == ("bounds/a", "rate/a", "r")
    assert RunConfig().with_overrides(["safety.cost_limits=[1e12]"]).safety.cost_limits == [1e12]
