"""One meaning for unusual readings at every entry point: ``Agent.predict``, the policy
server, the OPC UA bridge and the ONNX graph (docs/constraints.md, "Unusual readings").

A subnormal reading or previous action decides exactly as zero does (no broken sensor, no
incident); a NaN or infinite reading is refused by name by the three hosts, never decided
on, and the graph, which cannot refuse, applies the shield's broken-sensor fallback to it;
a NaN previous action is unknown, as an omitted one is (JSON has no NaN: the server's
unknown previous action is left out; the bridge counts a NaN position as a faulty reading
and writes nothing to it)."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import json

import numpy as np
import pytest

onnxruntime = pytest.importorskip("onnxruntime")

from fastapi.testclient import TestClient  # noqa: E402

from neorl_industrial.core.environments import Task  # noqa: E402
from neorl_industrial.core.safety.shield import FALLBACK, INVALID_OBSERVATION  # noqa: E402
from neorl_industrial.functional.state_management.train_state import (  # noqa: E402
    init_train_states,
)
from neorl_industrial.integration.deployment import create_app  # noqa: E402
from neorl_industrial.integration.plant_floor import PlantBridge, prepare  # noqa: E402
from neorl_industrial.integration.plant_floor.ticklog import TickLog, read_tick_log  # noqa: E402
from neorl_industrial.wrappers.agents import Agent, AgentError  # noqa: E402
from neorl_industrial.wrappers.agents.onnx_export import ONNX_FILE, runtime_session  # noqa: E402
from neorl_industrial.wrappers.agents.readings import decision_inputs  # noqa: E402
from neorl_industrial.wrappers.agents.signing import generate_key_pair  # noqa: E402
from neorl_industrial.wrappers.constraint_files import load_constraint_spec  # noqa: E402
from tests.integration.deployment.test_server import AS_ACT, _settings  # noqa: E402
from tests.integration.plant_floor.plant_fixtures import TASK, map_data, write_map  # noqa: E402
from tests.wrappers.agents.test_export_report import EXAMPLE, export_plant_policy  # noqa: E402

SUBNORMAL = float(np.float32(-1.4e-45))  # the smallest negative float32, on a bound of 0
ENTRIES = ("predict", "server", "bridge", "onnx")
_LOGS = itertools.count()
CASES = ("subnormal_reading", "subnormal_prev_action", "nan_reading", "inf_reading", "nan_prev")


class _Plant:
    """What the bridge reads from the plant: fixed values, fresh, good, of no declared type."""

    def __init__(self, values: list[float]):
        self.values = values
        self.read_types = [None] * len(values)
        self.units = [None] * len(values)

    async def read_with_units(self, nodes):
        from asyncua import ua

        now = dt.datetime.now(dt.UTC)
        read = [
            ua.DataValue(ua.Variant(v, ua.VariantType.Double), SourceTimestamp=now)
            for v in self.values
        ]
        return read, [None] * len(read)


class Entries:
    """The four entry points, each built on first use (one signed ONNX-format export of
    the mixing tank's policy serves the server, the bridge and the graph)."""

    def __init__(self, root):
        self.root = root
        self._built: dict[str, object] = {}

    def get(self, name):
        if name not in self._built:
            self._built[name] = getattr(self, f"_build_{name}")()
        return self._built[name]

    def _build_policy(self):
        task = Task.from_dict(TASK)
        (self.root / "task.json").write_text(json.dumps(TASK))
        key = generate_key_pair(self.root / "keys")
        path = export_plant_policy(
            self.root / "policy",
            task,
            load_constraint_spec(EXAMPLE / "constraints.yaml"),
            signing_key=key,
            observation_units=task.observation_units,
            action_units=task.action_units,
            format="onnx",
        )
        return path, key.parent / "policy-signing.pub"

    def _build_predict(self):
        # An agent with its initial policy: how it reads its inputs needs no training.
        agent = Agent("td3bc", "IB-v0", hidden=(8,))
        agent.seeds, agent.selected = [0], 0
        agent.policies = init_train_states(agent.policy_algorithm, agent.seeds).agent.policy
        return agent

    def _build_server(self):
        path, _ = self.get("policy")
        client = TestClient(create_app(_settings(self.root, path, batch_sizes=[1, 2], max_batch=2)))
        client.__enter__()
        return client

    def _build_bridge(self):
        path, public = self.get("policy")
        map_file = write_map(self.root, "map.yaml", map_data(0.1))
        return prepare(str(path), map_file, mode="shadow", trusted_keys=[public])

    def _build_onnx(self):
        path, _ = self.get("policy")
        return runtime_session((path / ONNX_FILE).read_bytes())

    def close(self):
        if "server" in self._built:
            self._built["server"].__exit__(None, None, None)


@pytest.fixture(scope="module")
def entries(tmp_path_factory):
    built = Entries(tmp_path_factory.mktemp("readings"))
    yield built
    built.close()


def _inputs(entries: Entries, entry: str) -> tuple[np.ndarray, np.ndarray, str]:
    """A typical reading and previous action of the entry's task, and the name of its
    first feature (bounded below by 0, as the first action is)."""
    if entry == "predict":  # the IB: readings within their bounds, actions in [-1, 1]
        task = entries.get("predict").task
        name = task.observation_names[0]
        return np.full(task.observation_size, 50.0), np.zeros(task.action_size), name
    return np.asarray([1.5, 50.0, 20.0]), np.asarray([40.0, 50.0]), "level_m"


def _decide(entries: Entries, entry: str, observation, prev, tick: int = 1):
    """``("decided", action, flags)`` or ``("refused", why)`` of one entry point."""
    observation = np.asarray(observation, np.float64)
    prev = np.asarray(prev, np.float64)
    if entry == "predict":
        agent = entries.get("predict")
        try:
            action, report = agent.decide(observation.astype(np.float32), prev.astype(np.float32))
        except AgentError as error:
            return "refused", str(error)
        return "decided", np.asarray(action), int(report.status)
    if entry == "server":
        client = entries.get("server")
        body = json.dumps({"observation": observation.tolist(), "prev_action": prev.tolist()})
        headers = {**AS_ACT, "content-type": "application/json"}
        response = client.post("/v1/act", content=body, headers=headers)
        if response.status_code == 422:
            return "refused", response.text
        assert response.status_code == 200, response.text
        answer = response.json()
        return "decided", np.asarray(answer["action"]), answer["report"]["status"]
    if entry == "bridge":
        plan = entries.get("bridge")
        root = entries.root
        log = root / f"ticks-{next(_LOGS)}.jsonl"
        bridge = PlantBridge(plan, "opc.tcp://127.0.0.1:9/plant", log)
        bridge.connection = _Plant([*observation.tolist(), *prev.tolist()])
        bridge._read_nodes = [None] * (len(observation) + len(prev))
        bridge._log = TickLog(bridge.log_path, plan.header())
        asyncio.run(bridge._tick(tick))
        bridge._log.close()
        (record,) = [r for r in read_tick_log(bridge.log_path)[1] if r["kind"] == "tick"]
        if record["faults"]:
            return "refused", json.dumps(record)
        flags = record["flags"]
        status = (FALLBACK if flags["fallback"] else 0) | (
            INVALID_OBSERVATION if flags["invalid_observation"] else 0
        )
        assert not flags["incident"], record
        return "decided", np.asarray(record["action"]), status
    session = entries.get("onnx")
    action, _, status, _ = session.run(
        None,
        {
            "observations": observation.astype(np.float32)[None],
            "prev_actions": prev.astype(np.float32)[None],
        },
    )
    return "decided", action[0], int(status[0])


PAIRS = [(entry, case) for entry in ENTRIES for case in CASES]


@pytest.mark.parametrize(("entry", "case"), PAIRS)
def test_unusual_readings_mean_the_same_at_every_entry_point(entries, entry, case):
    observation, prev, feature = _inputs(entries, entry)
    if case.startswith("subnormal"):
        # Read as zero: decided exactly as zero is, never a broken sensor.
        which = 0 if case == "subnormal_reading" else 1
        unusual, zero = [observation.copy(), prev.copy()], [observation.copy(), prev.copy()]
        unusual[which][0], zero[which][0] = SUBNORMAL, 0.0
        got = _decide(entries, entry, *unusual, tick=1)
        expected = _decide(entries, entry, *zero, tick=2)
        assert got[0] == expected[0] == "decided", got
        np.testing.assert_array_equal(got[1], expected[1])
        assert got[2] == expected[2] and not got[2] & INVALID_OBSERVATION
        if entry == "server":
            trust = entries.get("server").get("/v1/policy", headers=AS_ACT).json()["trust"]
            assert trust["incidents"] == 0
        return
    if case == "nan_prev":
        prev = np.full_like(prev, np.nan)
    else:
        observation = observation.copy()
        observation[0] = np.nan if case == "nan_reading" else np.inf
    got = _decide(entries, entry, observation, prev)
    if case == "nan_prev" and entry in ("predict", "onnx"):
        # Unknown: the rate limits are left out, as for an omitted previous action.
        assert got[0] == "decided" and np.isfinite(got[1]).all(), got
        if entry == "predict":
            omitted = entries.get("predict").decide(observation.astype(np.float32), None)
            np.testing.assert_array_equal(got[1], omitted[0])
        return
    if entry == "onnx":
        # The graph refuses nothing: a broken reading gets the shield's fallback, a NaN
        # previous action is unknown (how the hosts hand it an omitted one).
        assert got[0] == "decided" and got[2] & FALLBACK and got[2] & INVALID_OBSERVATION
        return
    assert got[0] == "refused", got
    why = got[1]
    if entry == "bridge":  # a faulty tick: never decided on, nothing written
        record = json.loads(why)
        assert record["fallback"] and record["proposed"] == [None, None]
        if case == "nan_prev":
            assert record["withheld"]["reason"] == "position_unknown"
        else:
            assert f"observations.{feature}" in record["faults"]
        return
    if entry == "predict":
        assert f"{feature!r} is {'inf' if case == 'inf_reading' else 'nan'}" in why, why
        return
    assert "body" in why  # the server: a 422 naming where in the body (NaN is no JSON)


def test_the_shared_function_names_what_it_refuses_and_flushes_only_subnormals():
    names, actions = ["a", "b"], ["u"]
    rows, prev, single = decision_inputs([SUBNORMAL, 2e-38], None, names, actions)
    assert single and rows.tolist() == [[0.0, np.float32(2e-38)]] and np.isnan(prev).all()
    with pytest.raises(ValueError, match=r"observation: row 1 'b' is inf; expected a finite"):
        decision_inputs([[1.0, 2.0], [1.0, 1e39]], [[0.0], [0.0]], names, actions)
    with pytest.raises(ValueError, match=r"prev_action: 'u' is -inf; .* or NaN where unknown"):
        decision_inputs([1.0, 2.0], [-np.inf], names, actions)
    _, prev, _ = decision_inputs([1.0, 2.0], [np.nan], names, actions)
    assert np.isnan(prev).all()
    with pytest.raises(ValueError, match=r"prev_action: expected the shape \[1\]"):
        decision_inputs([1.0, 2.0], [[0.0]], names, actions)
