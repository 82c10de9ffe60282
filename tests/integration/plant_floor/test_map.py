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


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("stale_after", float("inf"), r"\(0, 86400\] seconds"),
        ("stale_after", 1e308, r"\(0, 86400\] seconds"),
        ("stale_after", "1e308", r"\(0, 86400\] seconds"),
        ("stale_after", float("nan"), r"\(0, 86400\] seconds"),
        ("stale_after", 0.0, r"\(0, 86400\] seconds"),
        ("clock_skew", float("inf"), r"\[0, 300\] seconds"),
        ("clock_skew", 1e308, r"\[0, 300\] seconds"),
        ("clock_skew", -1.0, r"\[0, 300\] seconds"),
        ("sampling_period", float("inf"), r"\(0, 86400\] seconds"),
        ("request_timeout", 1e9, r"\(0, 600\] seconds"),
    ],
)
def test_a_duration_outside_its_range_is_named_with_the_range(tmp_path, field, value, allowed):
    path = write_map(tmp_path, "map.yaml", map_data(**{field: value}))
    expected = rf"map.yaml: {field}: .* outside the allowed range {allowed}"
    with pytest.raises(MapError, match=expected):
        load_map(path)


def test_a_duration_the_task_states_outside_its_range_is_named(tmp_path):
    plant_map = load_map(write_map(tmp_path, "map.yaml", map_data(None, stale_after=None)))
    with pytest.raises(MapError, match=r"sampling_period: the task's inf is outside"):
        plant_map.period(float("inf"), "map")
    assert plant_map.stale_limit(86400.0) == 86400.0  # 2.5 periods, at most a day


def test_a_node_with_two_meanings_is_refused_by_name(tmp_path):
    data = map_data()
    data["observations"]["inflow_m3h"]["node"] = "ns=2;s=Tank.Level"
    with pytest.raises(
        NodeIdError,
        match=r"observations.inflow_m3h.node: node 'ns=2;s=Tank.Level' is also bound to "
        r"observations.level_m",
    ):
        load_map(write_map(tmp_path, "map.yaml", data))
    # The same node written another way is the same node.
    data = map_data()
    data["observations"]["inflow_m3h"]["node"] = "ns=2;i=7"
    data["observations"]["level_m"]["node"] = "ns=2;i=0007"
    with pytest.raises(NodeIdError, match=r"'ns=2;i=7' is also bound to observations\.level_m"):
        load_map(write_map(tmp_path, "map.yaml", data))
    data = map_data()
    data["actions"]["pump_pct"]["applied"] = data["actions"]["valve_pct"]["applied"]
    with pytest.raises(
        NodeIdError,
        match=r"actions.pump_pct.applied: node 'ns=2;s=Tank.ValvePosition' also reports "
        r"actions.valve_pct.applied",
    ):
        load_map(write_map(tmp_path, "map.yaml", data))
    data = map_data()
    data["actions"]["pump_pct"]["write"] = data["actions"]["valve_pct"]["applied"]
    with pytest.raises(NodeIdError, match="would write another action's position"):
        load_map(write_map(tmp_path, "map.yaml", data))


def _served():
    from neorl_industrial.core.environments import Task
    from neorl_industrial.integration.deployment.pin import ServedTask

    return ServedTask.of_task(Task.from_dict(TASK))


def test_units_are_compared_as_units_not_as_written(tmp_path):
    from neorl_industrial.integration.plant_floor.mapping import check_map

    data = map_data()
    data["observations"]["temperature_c"]["unit"] = "°C"  # what OPC UA servers state
    data["observations"]["inflow_m3h"]["unit"] = "m³/h"
    assert check_map(load_map(write_map(tmp_path, "map.yaml", data)), _served(), "map") == {}
    # A real conversion is refused unless the binding asks for it, and named.
    data["observations"]["temperature_c"]["unit"] = "degF"
    plant_map = load_map(write_map(tmp_path, "map.yaml", data))
    with pytest.raises(
        UnitMismatchError,
        match=r"observations.temperature_c.unit: .*'degF'.*'degC': a real conversion "
        r"\(degC = 0.555556 \* degF - 17.7778\); add convert: true",
    ):
        check_map(plant_map, _served(), "map")
    data["observations"]["temperature_c"]["convert"] = True
    data["observations"]["inflow_m3h"] = {"node": "ns=2;s=Tank.Inflow", "unit": "l/min"}
    data["observations"]["inflow_m3h"]["convert"] = True
    found = check_map(load_map(write_map(tmp_path, "map.yaml", data)), _served(), "map")
    fahrenheit, litres = found["observations.temperature_c"], found["observations.inflow_m3h"]
    assert fahrenheit(212.0) == pytest.approx(100.0)
    assert fahrenheit.inverse(0.0) == pytest.approx(32.0)
    assert litres(1000.0 / 60.0) == pytest.approx(1.0)  # 1 m³/h
    # Another quantity, or convert where there is nothing to convert: refused by name.
    data["observations"]["inflow_m3h"]["unit"] = "m"
    with pytest.raises(UnitMismatchError, match=r"inflow_m3h.unit: .*no conversion relates"):
        check_map(load_map(write_map(tmp_path, "map.yaml", data)), _served(), "map")
    data["observations"]["inflow_m3h"]["unit"] = "m3/h"
    with pytest.raises(UnitMismatchError, match=r"inflow_m3h.convert: 'm3/h' is the task's"):
        check_map(load_map(write_map(tmp_path, "map.yaml", data)), _served(), "map")


def test_a_binding_without_the_unit_the_policy_states_is_refused(tmp_path):
    from neorl_industrial.integration.plant_floor.mapping import check_map

    # No task file: the policy's own task (its manifest's units) is the one compared.
    data = map_data(task=None)
    del data["observations"]["inflow_m3h"]["unit"]
    with pytest.raises(UnitMismatchError, match=r"observations.inflow_m3h.unit: not stated"):
        check_map(load_map(write_map(tmp_path, "map.yaml", data)), _served(), "map")
    data["observations"]["inflow_m3h"]["unit"] = " "
    with pytest.raises(UnitMismatchError, match=r"observations.inflow_m3h.unit: not stated"):
        check_map(load_map(write_map(tmp_path, "map.yaml", data)), _served(), "map")
    data["observations"]["inflow_m3h"]["unit"] = "m3/h\x1b[2J"
    with pytest.raises(MapError, match=r"observations.inflow_m3h.unit: .*control characters"):
        load_map(write_map(tmp_path, "map.yaml", data))


def test_engineering_units_as_servers_state_them():
    from asyncua import ua

    from neorl_industrial.core.units import UNECE_NAMESPACE, unit_id
    from neorl_industrial.integration.plant_floor.opcua import judge_units

    def stated(display, code=None):
        return ua.EUInformation(
            NamespaceUri=UNECE_NAMESPACE if code else None,
            UnitId=unit_id(code) if code else -1,
            DisplayName=ua.LocalizedText(display),
        )

    assert judge_units(stated("°C", "CEL"), "degC") is None
    assert judge_units(stated("m³/h", "MQH"), "m3/h") is None
    assert judge_units(stated("", "MQH"), "m3/h") is None  # the code alone
    assert judge_units(stated("Kubikmeter/h", "MQH"), "m3/h") is None  # the code confirms
    assert judge_units(stated("°C", "FAH"), "degC") == (
        "EngineeringUnits UnitId 4604232 (UNECE FAH), not 'degC'"
    )
    assert judge_units(stated("", "KPA"), "bar") == (
        "EngineeringUnits UnitId 4935745 (UNECE KPA), not 'bar'"
    )
    assert "no unit the bridge knows" in judge_units(stated("Kubikmeter/h"), "m3/h")
    assert judge_units(stated("vendor-units"), "vendor-units") is None


def test_the_command_line_names_a_map_that_switches_a_check_off(tmp_path, task, capsys):
    path = write_map(tmp_path, "map.yaml", map_data(stale_after=float("inf")))
    endpoint = "opc.tcp://127.0.0.1:9/plant"
    code = main(["--no-cache", "bridge", "--model", NO_POLICY, "--endpoint", endpoint,
                 "--map", str(path)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert "stale_after: inf is outside the allowed range (0, 86400] seconds" in err
    assert "Traceback" not in err and "JSON compliant" not in err
