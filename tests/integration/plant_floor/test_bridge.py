"""The OPC UA bridge against the demo plant's real asyncua server, in-process: shadow mode
reads, decides and logs without writing; closed loop writes shielded values and audits
them; bad readings, stale timestamps, a refused write and a server killed mid-run give
the fallback or a hand-back, never a bad write; the shadow report and the command line."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import math
import urllib.request

import numpy as np
import pytest

from benchmarks.harness import free_port
from neorl_industrial.core.environments import Task
from neorl_industrial.core.environments.history import stacked_names
from neorl_industrial.integration.deployment.pin import ServedTask
from neorl_industrial.integration.plant_floor import (
    BridgeMetrics,
    ClosedLoopRefused,
    NodeIdError,
    PlantBridge,
    PolicyTaskError,
    SecurityError,
    UnitMismatchError,
    prepare,
    read_tick_log,
)
from neorl_industrial.integration.plant_floor.bridge import Backoff, Reconnection
from neorl_industrial.integration.plant_floor.errors import UnknownFeatureError
from neorl_industrial.integration.plant_floor.mapping import check_map, load_map
from neorl_industrial.integration.plant_floor.opcua import Security
from neorl_industrial.integration.plant_floor.report import NO_PLANT_MODEL, shadow_report
from neorl_industrial.integration.plant_floor.ticklog import TickLog
from neorl_industrial.integration.safety.audit import AuditLog, check_chain
from neorl_industrial.wrappers.agents import PolicyArtifactError
from neorl_industrial.wrappers.constraint_files import load_constraint_spec
from tests.integration.plant_floor.plant_fixtures import (
    TASK,
    PlantThread,
    make_certificates,
    make_policies,
    map_data,
    write_map,
)
from tests.wrappers.agents.test_export_report import EXAMPLE

PERIOD = 0.1
PASSWORD = "mixing-tank-operator-7c2e"
#: The module's security (set by the plant fixture's first user).
SECURITY: list[Security] = []


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("plant-floor")


@pytest.fixture(scope="module")
def policies(root):
    return make_policies(root)


@pytest.fixture(scope="module")
def certificates(root):
    return make_certificates(root)


@pytest.fixture(scope="module")
def security(certificates, root):
    """The bridge's security: the plant's server offers Basic256Sha256 only, and signs in
    its one user (credentials from files)."""
    (root / "username").write_text("operator\n")
    (root / "password").write_text(f"{PASSWORD}\n")
    return Security(
        policy="Basic256Sha256",
        mode="SignAndEncrypt",
        certificate=certificates["bridge_certificate"],
        private_key=certificates["bridge_key"],
        username_file=root / "username",
        password_file=root / "password",
    )


@pytest.fixture(scope="module")
def plant(certificates, security):
    thread = PlantThread(period=PERIOD, certificates=certificates, users={"operator": PASSWORD})
    SECURITY[:] = [security]
    yield thread
    thread.close()


@pytest.fixture(scope="module")
def map_file(root, policies):
    """The mixing tank's map at 0.1 s, beside its task file."""
    return write_map(root, "map.yaml", map_data(PERIOD))


@pytest.fixture(scope="module")
def plans(root, policies, map_file):
    """The signed policy checked for shadow mode, closed loop with the fallback and closed
    loop handing back (each compiled once)."""
    keys = [policies["key"]]
    fallback = map_file
    hand_back = write_map(root, "map-hand-back.yaml", map_data(PERIOD, on_fault="hand_back"))
    closed = prepare(str(policies["signed"]), fallback, mode="closed-loop", trusted_keys=keys)
    return {
        # One checked and compiled policy, in the modes and maps the tests need.
        "shadow": dataclasses.replace(closed, mode="shadow"),
        "closed": closed,
        # The same checked policy under another map (prepare's checks are tested elsewhere).
        "hand_back": with_map(closed, hand_back),
    }


def with_map(plan, path):
    return dataclasses.replace(plan, plant_map=load_map(path), map_path=path)


def run(plan, plant, root, name, ticks, on_tick=None, **options):
    """Runs a bridge for ``ticks`` ticks (``on_tick(bridge)`` after each, if given)."""
    options.setdefault("security", SECURITY[0])
    bridge = PlantBridge(
        plan,
        plant.endpoint,
        root / f"{name}.jsonl",
        audit_path=root / f"{name}-audit.jsonl" if plan.closed_loop else None,
        reconnection=Reconnection(backoff=Backoff(initial=0.1, maximum=0.4)),
        **options,
    )
    if on_tick is not None:
        decide = bridge._tick

        async def tick(index):
            await decide(index)
            on_tick(bridge)

        bridge._tick = tick
    summary = asyncio.run(bridge.run(ticks=ticks))
    _headers, records = read_tick_log(root / f"{name}.jsonl")
    ticks_ = [r for r in records if r["kind"] == "tick"]
    events = [r["event"] for r in records if r["kind"] == "event"]
    return bridge, summary, ticks_, events


def writes_during(plant, action):
    """The plant's record of client writes made while ``action()`` runs."""
    before = len(plant.plant.writes)
    result = action()
    return result, plant.plant.writes[before:]


def shield_keeps(rows) -> bool:
    """Every written action keeps the mixing tank's constraints (the server's own check)."""
    from neorl_industrial.core.safety import satisfies

    task = Task.from_dict(TASK)
    compiled = task.compile_constraints(load_constraint_spec(EXAMPLE / "constraints.yaml"))
    observations = np.asarray([r["observation"] for r in rows], np.float32)
    actions = np.asarray([r["action"] for r in rows], np.float32)
    prev = np.asarray([r["applied"] for r in rows], np.float32)
    return bool(np.all(satisfies(compiled, observations, actions, prev)))


@pytest.fixture(scope="module")
def shadow_run(plans, plant, root):
    """A 12-tick shadow run (its log, root/shadow.jsonl, feeds the report's tests)."""
    return writes_during(plant, lambda: run(plans["shadow"], plant, root, "shadow", 12))


def test_shadow_mode_logs_what_it_would_do_and_writes_nothing(shadow_run, root):
    (bridge, summary, ticks, events), written = shadow_run
    assert written == []  # not one write reached the server
    assert summary.decided == len(ticks) - summary.faulty > 0
    assert (
        summary.writes == 0 and bridge.metrics.value("neorl_bridge_writes_total", result="ok") == 0
    )
    assert events[0] == "connected" and events[-1] == "stopped"
    for record in ticks:
        assert record["written"] is False
        assert all(math.isfinite(v) for v in record["observation"] + record["applied"])
        assert all(0.0 <= v <= 100.0 for v in record["action"])
    assert shield_keeps([r for r in ticks if not r["faults"]])
    header = read_tick_log(root / "shadow.jsonl")[0][0]
    assert header["mode"] == "shadow" and header["policy"]["signature"]["verified"]
    assert header["task"]["action_units"] == ["%", "%"]


def test_closed_loop_writes_shielded_values_and_audits_each(plans, plant, root):
    remote_steps = plant.plant.remote_steps
    (_bridge, summary, ticks, _), written = writes_during(
        plant, lambda: run(plans["closed"], plant, root, "closed", 12)
    )
    done = [r for r in ticks if r["written"]]
    assert len(done) == summary.writes >= 6
    # What the server received is what the log says was written, action by action.
    valve = [value for name, value, _ in written if name == "ValveSetpoint"]
    pump = [value for name, value, _ in written if name == "PumpSetpoint"]
    np.testing.assert_allclose(valve, [r["action"][0] for r in done])
    np.testing.assert_allclose(pump, [r["action"][1] for r in done])
    assert shield_keeps([r for r in done if not r["faults"]])
    # The plant ran on the bridge's setpoints (its watchdog hands back once they stop).
    assert plant.plant.remote_steps - remote_steps >= 3
    records = AuditLog.read(root / "closed-audit.jsonl")
    writes = [r for r in records if r["kind"] == "write"]
    assert len(writes) == len(done)
    assert {r["policy_version"] for r in writes} == {plans["closed"].loaded.version}
    assert [r["written"] for r in writes] == [r["action"] for r in done]
    assert {r["outcome"] for r in writes} == {"written"}
    assert check_chain(root / "closed-audit.jsonl").ok


def test_a_bad_quality_reading_gives_the_fallback_never_a_bad_write(plans, plant, root):
    plant.fault("Level", status="BadSensorFailure")
    try:
        (bridge, summary, ticks, _), written = writes_during(
            plant, lambda: run(plans["closed"], plant, root, "bad-quality", 6)
        )
    finally:
        plant.clear()
    faulty = [r for r in ticks if r["faults"]]
    assert faulty and summary.faulty == len(faulty)
    for record in faulty:
        assert record["faults"]["observations.level_m"].startswith("status BadSensorFailure")
        assert record["fallback"] and record["observation"][0] is None
        valve, pump = record["action"]
        # The level cannot be read: the high-level interlock counts as on (pump >= 60 %),
        # and the valve moves at most its rate limit from where it is.
        assert pump >= 60.0 - 1e-4
        assert abs(valve - record["applied"][0]) <= 15.0 + 1e-4
    assert all(math.isfinite(value) and 0.0 <= value <= 100.0 for _, value, _ in written)
    assert bridge.metrics.value("neorl_bridge_faults_total", kind="bad_quality") == len(faulty)
    assert bridge.metrics.value("neorl_bridge_fallbacks_total") >= len(faulty)


def test_stale_timestamps_hand_back_to_the_operators(plans, plant, root):
    plant.fault("Temperature", age=60.0)  # a historian replay, a frozen gateway
    try:
        (bridge, summary, ticks, events), written = writes_during(
            plant, lambda: run(plans["hand_back"], plant, root, "stale", 6)
        )
    finally:
        plant.clear()
    assert summary.handed_back and "handed_back" in events
    assert written == []  # the first tick is stale: the bridge never wrote
    assert all(not r["written"] and r["handed_back"] for r in ticks)
    assert "stale" in ticks[0]["faults"]["observations.temperature_c"]
    assert bridge.metrics.value("neorl_bridge_faults_total", kind="stale") == len(ticks)
    assert bridge.metrics.value("neorl_bridge_handed_back") == 1
    assert bridge.metrics.value("neorl_bridge_closed_loop") == 0


def test_killing_the_server_mid_run_reconnects_and_writes_nothing_meanwhile(plans, plant, root):
    outage = []

    def kill_after_three_writes(bridge):
        # The server goes down (every session with it) once the bridge has written three
        # times, and comes back 0.6 s later.
        if bridge.summary.writes >= 3 and not outage:
            outage.append(plant.outage(0.6, after=0.0))

    (bridge, summary, ticks, events), written = writes_during(
        plant,
        lambda: run(plans["closed"], plant, root, "outage", 25, on_tick=kill_after_three_writes),
    )
    outage[0].result(10)
    assert "disconnected" in events and "reconnected" in events
    assert summary.disconnections == 1 and summary.reconnects >= 1 and summary.missed >= 1
    assert bridge.metrics.value("neorl_bridge_faults_total", kind="disconnected") >= 1
    assert bridge.metrics.value("neorl_bridge_reconnects_total") == summary.reconnects
    # Every write the server took is a logged, shielded, finite write, and writing resumed
    # after the reconnection.
    done = [r for r in ticks if r["written"]]
    assert len(written) == 2 * len(done)
    assert all(math.isfinite(value) for _, value, _ in written)
    _, records = read_tick_log(root / "outage.jsonl")
    (lost,) = [r["tick"] for r in records if r.get("event") == "disconnected"]
    assert any(r["tick"] > lost for r in done)
    assert shield_keeps([r for r in done if not r["faults"]])


def test_a_refused_write_is_counted_audited_and_never_retried_as_is(plans, plant, root):
    plant.call(plant.plant.refuse_writes(True))
    try:
        bridge, summary, ticks, _events = run(plans["hand_back"], plant, root, "refused", 4)
    finally:
        plant.call(plant.plant.refuse_writes(False))
    assert summary.refused_writes == 1 and summary.handed_back  # then hands back
    first = ticks[0]
    assert not first["written"] and set(first["write_status"]) == {"BadUserAccessDenied"}
    assert all(not r.get("write_status") for r in ticks[1:])  # no write after the hand-back
    (refused,) = [r for r in AuditLog.read(root / "refused-audit.jsonl") if r["kind"] == "write"]
    assert refused["outcome"] == "refused"
    assert refused["refused"] == {
        "actions.valve_pct.write": "BadUserAccessDenied",
        "actions.pump_pct.write": "BadUserAccessDenied",
    }
    assert bridge.metrics.value("neorl_bridge_writes_total", result="refused") == 1


def test_a_node_the_server_lacks_is_named_before_the_first_tick(plans, plant, root):
    data = map_data(PERIOD)
    data["observations"]["inflow_m3h"]["node"] = "ns=2;s=Tank.Outflow"
    plan = with_map(plans["shadow"], write_map(root, "map-missing-node.yaml", data))
    with pytest.raises(NodeIdError, match=r"observations.inflow_m3h: node 'ns=2;s=Tank.Outflow'"):
        run(plan, plant, root, "missing-node", 3)
    _, records = read_tick_log(root / "missing-node.jsonl")
    assert not [r for r in records if r["kind"] == "tick"]


def test_a_node_whose_engineering_units_disagree_is_named(plans, plant, root):
    data = map_data(PERIOD)
    data["observations"]["level_m"]["node"] = "ns=2;s=Tank.Inflow"  # states m3/h
    data["observations"]["inflow_m3h"]["node"] = "ns=2;s=Tank.Level"
    plan = with_map(plans["shadow"], write_map(root, "map-wrong-node.yaml", data))
    with pytest.raises(
        UnitMismatchError,
        match=r"observations.level_m: node 'ns=2;s=Tank.Inflow' states EngineeringUnits "
        r"DisplayName 'm3/h', not 'm'",
    ):
        run(plan, plant, root, "wrong-node", 3)


def test_metrics_are_served_over_http(plans):
    metrics = BridgeMetrics(plans["shadow"].loaded.names)
    port = free_port()
    metrics.serve(port)
    try:
        metrics.faults.labels("stale").inc(2)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    finally:
        metrics.close()
    assert b'neorl_bridge_faults_total{kind="stale"} 2.0' in text
    assert b'neorl_bridge_overrides_total{constraint="pump-hard-when-level-high"}' in text


def test_the_shadow_report_tables_agreement_and_overrides(shadow_run, root, tmp_path):
    report = shadow_report(root / "shadow.jsonl", tmp_path / "report")
    _, records = read_tick_log(root / "shadow.jsonl")
    ticks = [r for r in records if r["kind"] == "tick"]
    assert report.ticks == len(ticks) and report.decided == len(ticks) - report.faulty
    valve = report.actions[0]
    assert valve.name == "valve_pct" and valve.unit == "%" and valve.tolerance == 5.0
    # Pairs: each decided tick's action with the operators' applied value one tick later.
    by_tick = {r["tick"]: r for r in ticks}
    expected = [
        by_tick[t]["action"][0] - by_tick[t + 1]["applied"][0]
        for t in sorted(by_tick)
        if t + 1 in by_tick and not by_tick[t]["faults"]
    ]
    assert valve.pairs == len(expected) > 0
    assert valve.mean == pytest.approx(np.mean(expected))
    assert valve.within_tolerance == pytest.approx(np.mean(np.abs(expected) <= 5.0))
    assert report.plant_effect == NO_PLANT_MODEL
    text = (tmp_path / "report" / "report.md").read_text()
    assert "| valve_pct | % |" in text and NO_PLANT_MODEL in text
    for name in ("report.json", "pairs.csv", "differences.png", "actions.png", "overrides.png"):
        assert (tmp_path / "report" / name).stat().st_size > 0
    saved = json.loads((tmp_path / "report" / "report.json").read_text())
    assert saved["actions"][1]["name"] == "pump_pct"


def test_the_report_counts_which_constraints_the_shield_would_override(tmp_path):
    from neorl_industrial.integration.plant_floor.report import build_report
    from neorl_industrial.integration.plant_floor.ticklog import TickLog

    header = {
        "mode": "shadow",
        "policy": {"version": "v1", "source": "p"},
        "task": {k: TASK[k] for k in ("action_names", "action_low", "action_high")}
        | {"action_units": ["%", "%"]},
        "constraints": ["valve-not-far-above-pump", "pump-hard-when-level-high"],
    }
    with TickLog(tmp_path / "log.jsonl", header) as log:
        for tick, violated in enumerate([[], ["pump-hard-when-level-high"], [], ["a", "b"]], 1):
            log.write(
                {"kind": "tick", "tick": tick, "faults": {}, "overridden": bool(violated),
                 "violated": violated, "action": [10.0, 20.0], "applied": [12.0, 20.0]}
            )  # fmt: skip
        log.write({"kind": "tick", "tick": 5, "faults": {"x": "stale"}, "action": [0, 0],
                   "applied": [None, 20.0]})  # fmt: skip
    report = build_report(tmp_path / "log.jsonl")
    assert (report.decided, report.faulty, report.overridden) == (4, 1, 2)
    assert report.override_rate == 0.5
    assert report.by_constraint == {"pump-hard-when-level-high": 1, "a": 1, "b": 1}
    # Tick 4 pairs with the faulty tick 5: its valve reading is unknown, its pump is not.
    assert [a.pairs for a in report.actions] == [3, 4]
    assert report.actions[0].mean == pytest.approx(-2.0)
    # A tolerance that would count every pair as agreeing is refused, with the range.
    with pytest.raises(ValueError, match=r"tolerance valve_pct=1e\+308: .* \[0, 100\]"):
        build_report(tmp_path / "log.jsonl", {"valve_pct": 1e308})


def test_the_report_is_logged_on_the_registered_version(shadow_run, root, tmp_path):
    import os
    import uuid

    from mlflow import MlflowClient

    from neorl_industrial.integration.plant_floor.report import log_to_mlflow

    # The suite's own store (tests/conftest.py), names of this test's own.
    store, name = os.environ["MLFLOW_TRACKING_URI"], f"mixing-tank-{uuid.uuid4().hex[:8]}"
    client = MlflowClient(tracking_uri=store, registry_uri=store)
    experiment = client.create_experiment(name, artifact_location=str(tmp_path / "artifacts"))
    run_id = client.create_run(experiment).info.run_id
    client.create_registered_model(name)
    version = client.create_model_version(name, str(root / "policy"), run_id)
    report = shadow_report(root / "shadow.jsonl", tmp_path / "report")
    logged = log_to_mlflow(report, tmp_path / "report", f"models:/{name}/{version.version}", store)
    assert (logged["name"], logged["run_id"]) == (name, run_id)
    tags = client.get_model_version(name, version.version).tags
    assert tags["shadow_report.plant_effect"] == NO_PLANT_MODEL
    assert tags["shadow_report.ticks"] == str(report.ticks)
    assert tags["shadow_report.artifacts"] == f"runs:/{run_id}/shadow_report/shadow"
    assert float(tags["shadow_report.within_tolerance.valve_pct"]) == pytest.approx(
        report.actions[0].within_tolerance, abs=1e-3
    )
    files = {f.path for f in client.list_artifacts(run_id, "shadow_report/shadow")}
    assert {"shadow_report/shadow/report.md", "shadow_report/shadow/actions.png"} <= files
    # A log of an unregistered policy, and no version named: said, not guessed.
    with pytest.raises(ValueError, match="not a registered version"):
        log_to_mlflow(report, tmp_path / "report", None, store)


def test_the_command_line_runs_the_bridge_and_the_report(plans, plant, root, capsys, monkeypatch):
    from neorl_industrial.cli.entry import main
    from neorl_industrial.integration.plant_floor import plan as plan_module

    # The checks and compilation are prepare's (tested above): the command hands it its
    # options and runs what it returns.
    given = {}

    def prepared(model, map_path, **options):
        given.update(options, model=model, map_path=map_path)
        return plans["shadow"]

    monkeypatch.setattr(plan_module, "prepare", prepared)
    key, log = str(root / "keys" / "policy-signing.pub"), root / "cli.jsonl"
    port = free_port()
    code = main(
        ["--no-cache", "bridge", "--model", str(root / "policy"), "--endpoint", plant.endpoint,
         "--map", str(root / "map.yaml"), "--trusted-key", key, "--log", str(log),
         "--ticks", "4", "--metrics-port", str(port),
         "--security-policy", "Basic256Sha256",
         "--certificate", str(root / "bridge-certificate.der"),
         "--private-key", str(root / "bridge-key.pem"),
         "--username-file", str(root / "username"), "--password-file", str(root / "password")]
    )  # fmt: skip
    assert code == 0
    assert given["mode"] == "shadow" and [str(k) for k in given["trusted_keys"]] == [key]
    assert not given["allow_unsigned"]
    assert "stopped after 4 ticks" in capsys.readouterr().err
    _, records = read_tick_log(log)
    decided = [r for r in records if r["kind"] == "tick"]
    missed = sum(r["count"] for r in records if r.get("event") == "missed_ticks")
    assert len(decided) + missed == 4 and decided
    assert main(["--no-cache", "shadow-report", str(log), "--out", str(root / "cli-report")]) == 0
    out = capsys.readouterr().out
    assert "agreement with the operators" in out and NO_PLANT_MODEL in out
    assert (root / "cli-report" / "report.md").is_file()


def test_a_policy_for_another_task_is_named_before_anything_connects(policies, map_file):
    with pytest.raises(PolicyTaskError, match=r"another task.*observation_names"):
        prepare(str(policies["other"]), map_file, mode="shadow", allow_unsigned=True)


def test_an_unsigned_policy_is_refused_closed_loop_whatever_the_flags(
    policies, map_file, tmp_path, monkeypatch
):
    keys = [policies["key"]]
    with pytest.raises(ClosedLoopRefused, match="unsigned"):
        prepare(
            str(policies["unsigned"]), map_file, mode="closed-loop",
            trusted_keys=keys, allow_unsigned=True,
        )  # fmt: skip
    # Shadow mode refuses it too, unless told (as serve does).
    with pytest.raises(PolicyArtifactError, match="unsigned"):
        prepare(str(policies["unsigned"]), map_file, mode="shadow", trusted_keys=keys)
    # Closed loop without any trusted key (none named, no keys/policy-signing.pub where it
    # runs): refused before the policy is read.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ClosedLoopRefused, match="no trusted key"):
        prepare(str(policies["signed"]), map_file, mode="closed-loop")


def test_a_server_that_requires_security_or_other_credentials_is_named(
    plans, plant, root, security
):
    with pytest.raises(
        SecurityError, match=r"requires a security policy \(it offers Basic256Sha256/Sign"
    ):
        run(plans["shadow"], plant, root, "no-security", 2, security=Security())
    (root / "wrong-password").write_text("not-the-password\n")
    wrong = dataclasses.replace(security, password_file=root / "wrong-password")
    with pytest.raises(SecurityError, match="refused the bridge's session: BadUserAccessDenied"):
        run(plans["shadow"], plant, root, "wrong-password", 2, security=wrong)
    wrong = dataclasses.replace(security, policy="Aes256Sha256RsaPss")
    with pytest.raises(SecurityError, match="no endpoint with security policy Aes256Sha256RsaPss"):
        run(plans["shadow"], plant, root, "wrong-policy", 2, security=wrong)


def test_a_value_that_is_not_finite_or_out_of_bounds_is_never_written(
    plans, plant, root, monkeypatch
):
    from neorl_industrial.integration.plant_floor.plan import BridgePlan

    # A fallback gone wrong (it cannot, from the shield: this checks the last guard).
    broken = iter([[np.nan, 50.0], [50.0, 101.0], [-0.5, 50.0]] * 3)
    monkeypatch.setattr(BridgePlan, "fallback", lambda self, o, p: np.asarray(next(broken)))
    plant.fault("Level", status="BadSensorFailure")
    try:
        (bridge, summary, ticks, _), written = writes_during(
            plant, lambda: run(plans["closed"], plant, root, "unsafe", 3)
        )
    finally:
        plant.clear()
    assert written == [] and summary.writes == 0
    assert summary.blocked_writes == len(ticks) > 0
    expected = [["valve_pct"], ["pump_pct"], ["valve_pct"]]  # NaN, above, below its bounds
    assert [r["blocked"] for r in ticks] == expected[: len(ticks)]
    assert bridge.metrics.value("neorl_bridge_faults_total", kind="unsafe_value") == len(ticks)


# ----- never jump an actuator; readings of the declared type and unit -------------------


def _record_real_positions(plant):
    """The plant's own valve position at each write the server takes (the server's
    post-write callback, beside the plant's own)."""
    from asyncua.common.callback import CallbackType

    real = []

    def written(event, _dispatcher):
        for write in event.request_params.NodesToWrite:
            if str(write.NodeId.Identifier) == "Tank.ValveSetpoint":
                real.append((float(write.Value.Value.Value), plant.plant.tank.valve))

    # A priority of its own: the plant's callback (priority 0) stays.
    service = plant.plant.server.iserver.callback_service
    service.addListener(CallbackType.PostWrite, written, 1)
    return real, lambda: service.removeListener(CallbackType.PostWrite, written)


def test_positions_unreadable_at_start_write_nothing_then_never_jump(plans, plant, root):
    # The actuators' positions cannot be read for the first ticks: there is nothing to
    # hold or to move from, so nothing is written (the plant's own control keeps them).
    # Once they are read, every write keeps the valve's rate limit (15 points) from the
    # position the plant reported.
    plant.fault("ValvePosition", status="BadSensorFailure")
    plant.fault("PumpSpeed", status="BadSensorFailure")
    real, stop_recording = _record_real_positions(plant)

    cleared = []

    def readable_after_three(bridge):
        if bridge.summary.ticks >= 3 and not cleared:
            cleared.append(bridge.summary.ticks)
            plant.clear()

    def closed_loop():
        return run(plans["closed"], plant, root, "unknown-positions", 10, readable_after_three)

    try:
        (bridge, summary, ticks, _), written = writes_during(plant, closed_loop)
    finally:
        plant.clear()
        plant.call(_stop(stop_recording))
    unknown = [r for r in ticks if "actions.valve_pct.applied" in r["faults"]]
    assert unknown and all(r["tick"] <= cleared[0] for r in unknown)
    for record in unknown:
        assert not record["written"] and record["applied"] == [None, None]
        assert record["withheld"]["reason"] == "position_unknown"
        assert record["withheld"]["actions"] == ["valve_pct", "pump_pct"]
    # Not one write reached the plant while its positions were unknown.
    assert summary.withheld_writes == len(unknown)
    withheld = bridge.metrics.value("neorl_bridge_withheld_writes_total", reason="position_unknown")
    assert withheld == len(unknown)
    audit = AuditLog.read(root / "unknown-positions-audit.jsonl")
    audit = [r for r in audit if r["kind"] == "write"]
    assert [r["outcome"] for r in audit[: len(unknown)]] == ["withheld"] * len(unknown)
    assert audit[0]["withheld"]["reason"] == "position_unknown"
    done = [r for r in ticks if r["written"]]
    assert len(written) == 2 * len(done) == 2 * summary.writes > 0
    assert min(r["tick"] for r in done) > max(r["tick"] for r in unknown)
    for record in done:
        # The rate limit from the position the plant reported at that tick.
        assert abs(record["action"][0] - record["applied"][0]) <= 15.0 + 1e-3
    assert len(real) == summary.writes
    # From where the valve really stood when the write arrived: within the rate limit,
    # and what the plant's own travel moved between the read and the write (<= 12).
    assert max(abs(value - position) for value, position in real) <= 15.0 + 12.0


async def _stop(stop):
    stop()


def test_a_reconnection_sets_the_request_timeout_within_its_range(plans, root):
    def bridge(timeout):
        return PlantBridge(
            plans["shadow"],
            "opc.tcp://127.0.0.1:9/plant",
            root / "unused.jsonl",
            reconnection=Reconnection(request_timeout=timeout),
        )

    assert bridge(2.5).request_timeout == 2.5
    assert bridge(None).request_timeout == plans["shadow"].plant_map.timeout(plans["shadow"].period)
    with pytest.raises(ValueError, match=r"request_timeout: 0\.0 is outside the allowed range"):
        bridge(0.0)


def test_a_position_last_reported_too_long_ago_is_unknown(plans, root):
    bridge = PlantBridge(
        plans["closed"],
        "opc.tcp://127.0.0.1:9/plant",
        root / "unused.jsonl",
        audit_path=root / "unused-audit.jsonl",
    )
    stale = plans["closed"].stale_after
    # Reported at t=0; written 50 since; unreadable at t=1: the last written stands in.
    assert bridge._previous(np.array([45.0, 50.0]), 0.0).tolist() == [45.0, 50.0]
    bridge._sent(np.array([55.0, 60.0]))
    prev = bridge._previous(np.array([np.nan, 52.0]), 1.0)
    assert prev.tolist() == [55.0, 52.0]
    # A value within 15 of both 45 (reported) and 55 (written) may be written; 61 may not.
    assert bridge._withhold(np.array([58.0, 52.0]), prev) is None
    beyond = bridge._withhold(np.array([61.0, 52.0]), prev)
    assert beyond["reason"] == "rate_limit" and beyond["actions"] == ["valve_pct"]
    # Unreadable for longer than a reading stays fresh: the valve's position is unknown.
    prev = bridge._previous(np.array([np.nan, 52.0]), stale + 0.5)
    assert math.isnan(prev[0]) and prev[1] == 52.0
    assert bridge._withhold(np.array([55.0, 52.0]), prev)["reason"] == "position_unknown"


def _published_with(plant, change):
    """The plant's publish, followed by ``change`` (a coroutine function) each time."""
    original = plant.plant.publish

    async def publish():
        await original()
        await change()

    plant.plant.publish = publish
    return original


def test_an_int32_on_a_double_node_is_a_faulty_tick_never_decided_on(plans, plant, root):
    from asyncua import ua

    level = plant.plant.nodes["Level"]

    def beneath(value):
        # asyncua's own server refuses a value of another type than the node's: it is set
        # beneath its checks.
        now = dt.datetime.now(dt.UTC)
        stored = plant.plant.server.iserver.aspace._nodes[level.nodeid]
        stored.attributes[ua.AttributeIds.Value].value = ua.DataValue(
            value, SourceTimestamp=now, ServerTimestamp=now
        )

    async def as_int32():
        # A gateway that serves the level rounded, as an Int32, on a node declared Double.
        beneath(ua.Variant(2, ua.VariantType.Int32))

    original = _published_with(plant, as_int32)
    plant.call(plant.plant.publish())
    try:
        bridge, summary, ticks, _ = run(plans["shadow"], plant, root, "int32", 4)
    finally:
        plant.plant.publish = original
        beneath(ua.Variant(plant.plant.tank.level, ua.VariantType.Double))
        plant.call(plant.plant.publish())
    assert summary.decided == 0 and summary.faulty == len(ticks) > 0
    for record in ticks:
        assert record["faults"] == {
            "observations.level_m": "data type: a Int32 value on a node declared Double"
        }
        assert record["observation"][0] is None and record["fallback"]
    assert bridge.metrics.value("neorl_bridge_faults_total", kind="data_type") == len(ticks)


def _set_units(plant, name, display, code=None):
    from asyncua import ua

    from neorl_industrial.core.units import UNECE_NAMESPACE, unit_id

    async def write():
        prop = await plant.plant.nodes[name].get_child("0:EngineeringUnits")
        await prop.write_value(
            ua.EUInformation(
                NamespaceUri=UNECE_NAMESPACE if code else None,
                UnitId=unit_id(code) if code else -1,
                DisplayName=ua.LocalizedText(display),
                Description=ua.LocalizedText(display),
            )
        )

    plant.call(write())


def test_a_server_stating_unece_display_names_connects(plans, plant, root):
    # What OPC UA servers send: UNECE display names and common codes, against the task's
    # degC and m3/h.
    _set_units(plant, "Temperature", "°C", "CEL")
    _set_units(plant, "Inflow", "m³/h", "MQH")
    _set_units(plant, "ValvePosition", "%", "P1")
    try:
        _, summary, ticks, _ = run(plans["shadow"], plant, root, "unece", 3)
        # The map may state the server's spelling too.
        data = map_data(PERIOD)
        data["observations"]["temperature_c"]["unit"] = "°C"
        data["observations"]["inflow_m3h"]["unit"] = "m³/h"
        plan = with_map(plans["shadow"], write_map(root, "map-unece.yaml", data))

        def fahrenheit_after_two(bridge):
            # The server's units change while the bridge runs: checked with every read.
            if bridge.summary.ticks == 2:
                _set_units(plant, "Temperature", "°F", "FAH")

        changed, again, later, _ = run(plan, plant, root, "unece-map", 4, fahrenheit_after_two)
        # Connecting again: refused by name.
        with pytest.raises(UnitMismatchError, match=r"DisplayName '°F', not '°C'"):
            run(plan, plant, root, "unece-refused", 2)
    finally:
        for name, unit in (("Temperature", "degC"), ("Inflow", "m3/h"), ("ValvePosition", "%")):
            _set_units(plant, name, unit)
    after = [r for r in later if r["tick"] > 2]
    assert after and all(not r["faults"] for r in later if r["tick"] <= 2)
    for record in after:
        assert record["faults"] == {
            "observations.temperature_c": "EngineeringUnits DisplayName '°F', not '°C'"
        }
    assert changed.metrics.value("neorl_bridge_faults_total", kind="unit") == len(after)
    assert summary.decided == len(ticks) > 0 and summary.faulty == 0
    assert again.decided == len(later) - len(after) > 0


def test_a_node_in_another_unit_is_converted_where_the_map_says_so(plans, plant, root):
    from asyncua import ua

    from neorl_industrial.integration.deployment.pin import ServedTask
    from neorl_industrial.integration.plant_floor.mapping import check_map

    temperature = plant.plant.nodes["Temperature"]
    served = []

    async def in_fahrenheit():
        # The server states the temperature in °F (its EngineeringUnits say so).
        value, now = plant.plant.tank.temperature, dt.datetime.now(dt.UTC)
        served.append(value)
        fahrenheit = ua.Variant(value * 1.8 + 32.0, ua.VariantType.Double)
        await plant.plant.server.write_attribute_value(
            temperature.nodeid, ua.DataValue(fahrenheit, SourceTimestamp=now, ServerTimestamp=now)
        )

    data = map_data(PERIOD)
    data["observations"]["temperature_c"] = {
        "node": "ns=2;s=Tank.Temperature",
        "unit": "degF",
        "convert": True,
    }
    path = write_map(root, "map-fahrenheit.yaml", data)
    plan = with_map(plans["shadow"], path)
    plan = dataclasses.replace(
        plan, conversions=check_map(plan.plant_map, ServedTask.of_task(Task.from_dict(TASK)), "m")
    )
    _set_units(plant, "Temperature", "°F", "FAH")
    original = _published_with(plant, in_fahrenheit)
    plant.call(plant.plant.publish())
    try:
        _, summary, ticks, _ = run(plan, plant, root, "fahrenheit", 3)
    finally:
        plant.plant.publish = original
        _set_units(plant, "Temperature", "degC")
        plant.call(plant.plant.publish())
    assert summary.decided == len(ticks) > 0
    # Logged (and decided on) in the task's degC: the plant's own temperature, not 118 °F.
    for record in ticks:
        assert min(abs(record["observation"][1] - value) for value in served) < 1e-6
    header = read_tick_log(root / "fahrenheit.jsonl")[0][0]
    assert header["conversions"]["observations.temperature_c"]["offset"] == pytest.approx(
        -160.0 / 9.0
    )


def test_a_policy_of_the_last_rows_is_fed_them_and_they_start_again_after_a_fault(plans, root):
    """A task whose observation stacks earlier rows (a log imported with ``history``): the
    map binds the newest row's features only, the bridge keeps the rows before, and a
    faulty or missed tick starts the history again from the row read, as an imported log
    starts an episode."""
    plan = plans["shadow"]
    task = plan.task
    frame = task.observation_names
    stacked = ServedTask(
        stacked_names(frame, 3),
        task.action_names,
        task.action_low,
        task.action_high,
        tuple(task.observation_low) * 3,
        tuple(task.observation_high) * 3,
        tuple(task.observation_units) * 3,
        task.action_units,
    )
    # The map of the plant's own features fits the task of its last three rows.
    assert check_map(plan.plant_map, stacked, "map") == check_map(plan.plant_map, task, "map")
    history = dataclasses.replace(plan, task=stacked)
    assert (history.read_names, history.history) == (frame, 3)
    assert history.header()["task"]["history"] == 3
    bridge = PlantBridge(history, "opc.tcp://127.0.0.1:9/plant", root / "history.jsonl")
    assert bridge._read_labels[: len(frame)] == [f"observations.{n}" for n in frame]
    assert len(bridge._read_ids) == len(frame) + len(task.action_names)
    rows = np.arange(6 * len(frame), dtype=np.float64).reshape(6, len(frame))
    r = list(rows)
    assert bridge._stacked(r[0], {}).tolist() == np.concatenate([r[0], r[0], r[0]]).tolist()
    assert bridge._stacked(r[1], {}).tolist() == np.concatenate([r[1], r[0], r[0]]).tolist()
    assert bridge._stacked(r[2], {}).tolist() == np.concatenate([r[2], r[1], r[0]]).tolist()
    faulty = bridge._stacked(r[3], {"observations.x": "status Bad"})
    assert faulty.tolist() == np.concatenate([r[3], r[2], r[1]]).tolist()
    # After the faulty tick: the row read, repeated.
    assert bridge._stacked(r[4], {}).tolist() == np.concatenate([r[4], r[4], r[4]]).tolist()
    bridge._log = TickLog(root / "history-missed.jsonl", {"kind": "header"})
    try:
        bridge._missed(1)
    finally:
        bridge._log.close()
    assert bridge._stacked(r[5], {}).tolist() == np.concatenate([r[5], r[5], r[5]]).tolist()
    # A map that binds an earlier row is refused: the bridge keeps those rows itself.
    earlier = map_data(PERIOD)
    earlier["observations"][f"{frame[0]}@t-1"] = {"node": "ns=2;s=Tank.LevelBefore", "unit": "m"}
    with pytest.raises(UnknownFeatureError, match=r"@t-1'? is not in the task"):
        check_map(load_map(write_map(root, "map-earlier.yaml", earlier)), stacked, "map")
