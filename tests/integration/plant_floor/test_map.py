"""The bridge's bad input, each a named error before anything connects: a map naming a
feature the task lacks or leaving one unbound, units that disagree, node ids that are not
node ids, unknown keys, security options that cannot work, and the command line's exit
status for them."""

from __future__ import annotations

import json

import pytest

from neorl_industrial.cli.entry import main
from neorl_industrial.integration.plant_floor import (
    MapError,
    NodeIdError,
    SecurityError,
    UnitMismatchError,
    UnknownFeatureError,
    load_map,
    prepare,
)
from neorl_industrial.integration.plant_floor.opcua import Security
from tests.integration.plant_floor.plant_fixtures import TASK, map_data, write_map

#: Never read: every error below comes before the policy is.
NO_POLICY = "/nonexistent/policy"


@pytest.fixture
def task(tmp_path):
    (tmp_path / "task.json").write_text(json.dumps(TASK))
    return tmp_path / "task.json"


def _prepare(tmp_path, data):
    return prepare(NO_POLICY, write_map(tmp_path, "map.yaml", data), mode="closed-loop")


def test_a_map_naming_a_feature_the_task_lacks_is_named(tmp_path, task):
    data = map_data()
    data["observations"]["pressure_bar"] = {"node": "ns=2;s=Tank.Pressure", "unit": "bar"}
    with pytest.raises(
        UnknownFeatureError, match=r"observations: 'pressure_bar' is not in the task"
    ):
        _prepare(tmp_path, data)


def test_a_task_feature_left_unbound_is_named(tmp_path, task):
    data = map_data()
    del data["actions"]["pump_pct"]
    with pytest.raises(UnknownFeatureError, match=r"actions: the task's 'pump_pct' is not bound"):
        _prepare(tmp_path, data)


def test_units_that_disagree_are_named(tmp_path, task):
    data = map_data()
    data["observations"]["level_m"]["unit"] = "ft"
    with pytest.raises(UnitMismatchError, match=r"observations.level_m.unit: .*'ft'.*'m'"):
        _prepare(tmp_path, data)
    data = map_data()
    del data["actions"]["valve_pct"]["unit"]
    with pytest.raises(UnitMismatchError, match=r"actions.valve_pct.unit: not stated"):
        _prepare(tmp_path, data)


def test_node_ids_that_are_not_node_ids_are_named(tmp_path, task):
    data = map_data()
    data["observations"]["level_m"]["node"] = "Tank.Level"
    with pytest.raises(NodeIdError, match=r"observations.level_m.node: 'Tank.Level' is not an"):
        _prepare(tmp_path, data)
    data = map_data()
    data["actions"]["pump_pct"]["write"] = data["actions"]["valve_pct"]["write"]
    with pytest.raises(NodeIdError, match="also written for 'valve_pct'"):
        _prepare(tmp_path, data)
    data = map_data()
    data["actions"]["pump_pct"]["write"] = "ns=2;s=Tank.Level"
    with pytest.raises(NodeIdError, match="would write a sensor"):
        _prepare(tmp_path, data)


def test_unknown_keys_and_bad_values_are_named(tmp_path):
    path = write_map(tmp_path, "map.yaml", map_data(sampling_perod=10))
    with pytest.raises(
        MapError, match="unknown field 'sampling_perod'; did you mean 'sampling_period'"
    ):
        load_map(path)
    path = write_map(tmp_path, "map.yaml", map_data(on_fault="ignore"))
    with pytest.raises(MapError, match="on_fault"):
        load_map(path)
    path = write_map(tmp_path, "map.yaml", map_data(period=-1.0))
    with pytest.raises(MapError, match="sampling_period"):
        load_map(path)
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(MapError, match="expected a mapping"):
        load_map(tmp_path / "list.yaml")
    with pytest.raises(MapError, match="no such file"):
        load_map(tmp_path / "missing.yaml")


def test_a_period_comes_from_the_map_or_the_task(tmp_path):
    plant_map = load_map(write_map(tmp_path, "map.yaml", map_data(None, stale_after=None)))
    assert plant_map.period(10.0, "map") == 10.0
    with pytest.raises(MapError, match="sampling_period: the map states none"):
        plant_map.period(None, "map")
    assert plant_map.stale_limit(10.0) == 25.0


def test_security_that_cannot_work_is_named(tmp_path):
    with pytest.raises(SecurityError, match="give the bridge's certificate"):
        Security(policy="Basic256Sha256").check()
    with pytest.raises(SecurityError, match="both --username-file and --password-file"):
        Security(username_file=tmp_path / "user").check()
    (tmp_path / "user").write_text("operator\n")
    with pytest.raises(SecurityError, match="no such file"):
        Security(username_file=tmp_path / "user", password_file=tmp_path / "pw").check()


def test_the_command_line_names_bad_input_and_takes_no_secret(tmp_path, task, capsys):
    data = map_data()
    data["observations"]["level_m"]["unit"] = "ft"
    path = write_map(tmp_path, "map.yaml", data)
    endpoint = "opc.tcp://127.0.0.1:9/plant"  # nothing listens: nothing may connect
    code = main(["--no-cache", "bridge", "--model", NO_POLICY, "--endpoint", endpoint,
                 "--map", str(path), "--mode", "closed-loop"])  # fmt: skip
    assert code == 2
    assert "observations.level_m.unit" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a password is read from a file, never the line
        main(["bridge", "--model", NO_POLICY, "--endpoint", endpoint, "--map", str(path),
              "--password", "secret"])  # fmt: skip
