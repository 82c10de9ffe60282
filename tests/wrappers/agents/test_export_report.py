"""What an exported policy reports beyond the action: the applied action's margins (what it
still breaks), the data-range flag, on a plant log's task with no simulator behind it; and
artifacts of the previous format, which do not say what the applied action breaks."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.agents.td3bc import TD3BCConfig, make_td3bc
from neorl_industrial.core.safety import ConstraintSpec, margins, shield
from neorl_industrial.integration.datasets import load_plant_log
from neorl_industrial.wrappers.agents import Agent, PolicyArtifact, export_policy
from neorl_industrial.wrappers.agents.artifact import _digest
from neorl_industrial.wrappers.constraint_files import load_constraint_spec

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "mixing-tank"

# The mixing tank's constraints and one that contradicts the high-level rule: with the
# level above 2.52 m, valve + pump <= 600 - 250 * level leaves the pump below the 60 %
# that the level above 2.6 m asks for (infeasible at 2.7 m), and binds nowhere below 1.6 m.
CONFLICT = {
    "name": "mixing-tank-conflicting",
    "linear": [
        {
            "name": "outflow-budget",
            "observation": {"level_m": 250.0},
            "action": {"valve_pct": 1.0, "pump_pct": 1.0},
            "bound": 600.0,
        }
    ],
}
INSIDE = [2.0, 50.0, 30.0]  # every feature within the log's range
HOTTER = [1.5, 70.0, 30.0]  # 70 degC: above the log's 55 degC, below the sensor's 100
HIGH = [2.7, 50.0, 30.0]  # within the log's range; the constraints contradict each other


def plant_task():
    dataset, card = load_plant_log(EXAMPLE / "mixing_tank.csv", EXAMPLE / "schema.yaml")
    return dataset, card, card.task(dataset)


def conflicting_spec() -> ConstraintSpec:
    spec = load_constraint_spec(EXAMPLE / "constraints.yaml").to_dict()
    spec["linear"] = [*spec["linear"], *CONFLICT["linear"]]
    return ConstraintSpec.from_dict({**spec, "name": CONFLICT["name"]}, "conflict")


def export_plant_policy(path: Path, task, spec: ConstraintSpec, **overrides) -> Path:
    """A small random TD3+BC actor for the plant's task (tanh-squashed, scaled to the
    plant's percent), exported with the task's data range."""
    algorithm = make_td3bc(TD3BCConfig(hidden=(8,)), 3, 2)
    params = algorithm.init(jax.random.key(3)).policy
    low = jnp.asarray(task.action_low, jnp.float32)
    high = jnp.asarray(task.action_high, jnp.float32)

    def act(policy, observation):
        unit = algorithm.act(policy, observation / 100.0)
        return low + (unit + 1.0) * 0.5 * (high - low)

    arguments = dict(
        act=act,
        policy_params=params,
        observation_size=3,
        action_size=2,
        action_low=task.action_low,
        action_high=task.action_high,
        constraints_spec=spec,
        observation_names=task.observation_names,
        action_names=task.action_names,
        observation_bounds=(task.observation_low, task.observation_high),
        data_bounds=(task.data_low, task.data_high),
        platforms=("cpu",),
    )
    from neorl_industrial.wrappers.agents.export import PolicyExport

    return export_policy(path, PolicyExport.from_arguments(**{**arguments, **overrides}))


@pytest.fixture(scope="module")
def plant(tmp_path_factory):
    _, _, task = plant_task()
    spec = conflicting_spec()
    path = export_plant_policy(tmp_path_factory.mktemp("plant") / "policy", task, spec)
    return task, spec, PolicyArtifact.load(path)


def _reference(task, spec, observations, proposed, prev):
    compiled = task.compile_constraints(spec)
    safe, report = jax.jit(lambda o, a, p: shield(compiled, o, a, p))(observations, proposed, prev)
    return np.asarray(safe), report


def test_the_artifact_flags_observations_outside_the_data_and_decides_as_without(plant):
    task, spec, artifact = plant
    assert artifact.manifest["data_low"] == pytest.approx(list(task.data_low))
    low, high = artifact.data_range
    np.testing.assert_allclose(low, task.data_low)
    np.testing.assert_allclose(high, task.data_high)
    observations = np.asarray([INSIDE, HOTTER], np.float32)
    decision = artifact.predict(observations)
    proposal = decision.proposed.copy()
    prev = proposal.copy()  # no rate limit binds
    decision = artifact.predict(observations, prev)
    assert decision.out_of_distribution.tolist() == [False, True]
    # The flag changes nothing else: the same decision as the shield without the range.
    without_range = ConstraintSpec.from_dict(spec.to_dict(), "spec").compile(
        3,
        2,
        task.observation_names,
        task.action_names,
        observation_bounds=(task.observation_low, task.observation_high),
    )
    safe, report = jax.jit(lambda o, a, p: shield(without_range, o, a, p))(
        observations, jnp.asarray(proposal), prev
    )
    np.testing.assert_allclose(decision.action, np.asarray(safe), atol=1e-5)
    np.testing.assert_array_equal(
        decision.status, np.asarray(report.status) | np.asarray([0, 64], np.int32)
    )
    np.testing.assert_array_equal(decision.overridden, np.asarray(report.overridden))
    # One observation: unbatched, the flag with it.
    single = artifact.predict(np.asarray(HOTTER, np.float32), prev[1])
    assert bool(single.out_of_distribution) and single.applied_margin.shape == (6,)


def test_a_conflict_reports_what_the_applied_action_still_breaks(plant):
    task, spec, artifact = plant
    observations = np.asarray([HIGH, INSIDE], np.float32)
    prev = np.asarray([[50.0, 50.0], [50.0, 50.0]], np.float32)
    decision = artifact.predict(observations, prev)
    assert decision.infeasible.tolist() == [True, False]
    # The high-level rule (a state limit, priority above the linear ones) is kept; the
    # budget it contradicts is what the applied action breaks.
    assert decision.violated_after[0] == ("outflow-budget",)
    assert decision.violated_after[1] == ()
    assert float(decision.action[0, 1]) >= 60.0 - 1e-4
    safe, report = _reference(task, spec, observations, decision.proposed, prev)
    np.testing.assert_allclose(decision.action, safe, atol=1e-4)
    np.testing.assert_allclose(
        decision.applied_margin, np.asarray(report.applied_margin), rtol=1e-5, atol=1e-4
    )
    np.testing.assert_allclose(decision.margin, np.asarray(report.margin), rtol=1e-5, atol=1e-4)
    # The large-batch function (64 rows and more) says the same for the same rows.
    rows = np.tile(observations, (40, 1))
    large = artifact.predict(rows, np.tile(prev, (40, 1)))
    np.testing.assert_allclose(large.applied_margin[:2], decision.applied_margin, atol=1e-4)
    assert large.violated_after[78] == ("outflow-budget",) and large.violated_after[79] == ()


def test_without_a_data_range_nothing_is_flagged(tmp_path):
    _, _, task = plant_task()
    path = export_plant_policy(tmp_path / "policy", task, conflicting_spec(), data_bounds=None)
    artifact = PolicyArtifact.load(path)
    assert artifact.manifest["data_low"] is None and artifact.data_range is None
    decision = artifact.predict(np.asarray([HOTTER, HIGH], np.float32))
    assert not decision.out_of_distribution.any()
    assert decision.violated_after[1] == ("outflow-budget",)


def _as_format_1(path: Path, target: Path) -> Path:
    """The artifact at ``path`` as the previous format wrote it: its functions return the
    proposal's margins alone, its manifest lists no data range and no data-range bit."""
    target.mkdir()
    manifest = json.loads((path / "manifest.json").read_text())
    with np.load(path / "params.npz", allow_pickle=False) as archive:
        parameters = tuple(archive[f"leaf_{i}"] for i in range(len(archive.files)))
    for entry in manifest["functions"]:
        exported = jax.export.deserialize(bytearray((path / entry["file"]).read_bytes()))

        def old(observations, prev_actions, exported=exported):
            # The previous formats' functions held their parameters.
            outputs = exported.call(parameters, observations, prev_actions)
            action, proposed, status, margins = outputs
            # The previous shield had no data-range bit.
            return action, proposed, status & ~64, margins[:, 0]

        constraints = () if entry["min_batch"] == 1 else (f"batch >= {entry['min_batch']}",)
        (batch,) = jax.export.symbolic_shape("batch", constraints=constraints)
        data = bytes(
            jax.export.export(jax.jit(old), platforms=manifest["platforms"])(
                jax.ShapeDtypeStruct((batch, 3), jnp.float32),
                jax.ShapeDtypeStruct((batch, 2), jnp.float32),
            ).serialize()
        )
        (target / entry["file"]).write_bytes(data)
        manifest["files"][entry["file"]] = hashlib.sha256(data).hexdigest()
    for name in ("constraints.yaml", "params.msgpack"):
        (target / name).write_bytes((path / name).read_bytes())
    for key in ("data_low", "data_high"):
        del manifest[key]
    del manifest["check"], manifest["files"]["check.jaxexport"]  # the previous had none
    del manifest["files"]["params.npz"]
    del manifest["status_bits"]["out_of_distribution"]
    manifest.update(format_version=1, outputs=["action", "proposed", "status", "margin"])
    manifest["manifest_sha256"] = _digest(manifest)
    (target / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return target


def test_an_artifact_of_the_previous_format_still_serves(plant, tmp_path):
    _, _, artifact = plant
    old = PolicyArtifact.load(_as_format_1(artifact.path, tmp_path / "old"))
    observations = np.asarray([HIGH, INSIDE, HOTTER], np.float32)
    prev = np.full((3, 2), 50.0, np.float32)
    for rows in (3, 70):  # both functions
        batch = np.resize(observations, (rows, 3)), np.resize(prev, (rows, 2))
        then, now = old.predict(*batch), artifact.predict(*batch)
        np.testing.assert_array_equal(then.action, now.action)
        np.testing.assert_array_equal(then.margin, now.margin)
        np.testing.assert_array_equal(then.status, now.status & ~64)
        assert then.violated == now.violated
        assert then.applied_margin is None and then.violated_after is None
        assert then.violated_after_mask is None
        assert not then.out_of_distribution.any()
    assert old.data_range is None


def test_agent_export_carries_a_plant_log_s_data_range(tmp_path):
    dataset, card, task = plant_task()
    agent = Agent("bc", task=task, hidden=(8,))
    agent.fit(dataset, updates=2, chunk=2, evaluate=False, card=card)
    artifact = PolicyArtifact.load(agent.export(tmp_path / "policy"))
    low, high = artifact.data_range
    np.testing.assert_allclose(low, task.data_low)
    np.testing.assert_allclose(high, task.data_high)
    decision = artifact.predict(np.asarray([INSIDE, HOTTER], np.float32))
    assert decision.out_of_distribution.tolist() == [False, True]


@pytest.mark.slow
def test_the_serving_cost_of_the_applied_margins(plant, tmp_path):
    """The format-2 artifact against the same policy in format 1, same process: batch 1
    and 256 (printed; run with -s to read them). Fails only if the extra output more than
    doubles a call."""
    _, _, artifact = plant
    old = PolicyArtifact.load(_as_format_1(artifact.path, tmp_path / "old"))
    rng = np.random.default_rng(0)
    timings = {}
    for rows in (1, 256):
        observations = rng.uniform([1.4, 44, 8], [2.7, 55, 58], (rows, 3)).astype(np.float32)
        prev = rng.uniform(10, 90, (rows, 2)).astype(np.float32)
        for which in (old, artifact):  # compiled before the clock starts
            which.predict(observations, prev)
        best = {"format 1": [], "format 2": []}
        for _ in range(7):
            for name, which in (("format 1", old), ("format 2", artifact)):
                start = time.perf_counter()
                for _ in range(50):
                    which.predict(observations, prev)
                best[name].append((time.perf_counter() - start) / 50)
        timings[rows] = {name: float(np.median(values)) * 1e6 for name, values in best.items()}
        print(f"batch {rows}: " + ", ".join(f"{k} {v:.0f} us" for k, v in timings[rows].items()))
    for rows, pair in timings.items():
        assert pair["format 2"] < 2 * pair["format 1"], (rows, pair)


def test_the_mlflow_model_returns_every_flag_of_the_artifact():
    from neorl_industrial.integration.mlflow.pyfunc import FLAGS
    from neorl_industrial.wrappers.agents.artifact import STATUS_BITS

    assert tuple(STATUS_BITS) == FLAGS


class _ReplacingGuard:
    """A loader's check that accepts no row and serves the valve shut, the pump at 10 %."""

    def accepts(self, observations, prev_actions, action):
        return jnp.zeros(observations.shape[0], bool)

    def repair(self, observations, prev_actions, action):
        safe = np.broadcast_to(np.asarray([0.0, 10.0], np.float32), action.shape).copy()
        return safe, np.ones(len(action), bool)


def test_an_action_the_loader_replaced_reports_its_own_margins(plant):
    task, spec, artifact = plant
    guarded = artifact.with_guard(_ReplacingGuard())
    observations = np.asarray([HIGH, INSIDE, HOTTER], np.float32)
    prev = np.full((3, 2), 5.0, np.float32)
    decision = guarded.predict(observations, prev)
    assert decision.incident.all()
    np.testing.assert_array_equal(decision.action, np.tile([0.0, 10.0], (3, 1)))
    compiled = task.compile_constraints(spec)
    expected = np.asarray(margins(compiled, observations, decision.action, prev))
    np.testing.assert_allclose(decision.applied_margin, expected, rtol=1e-6, atol=1e-5)
    # At 2.7 m the pump at 10 % breaks the high-level rule and 10 % in all is over the
    # budget (-75 %); below 1.6 m nothing breaks. The artifact's own action kept the rule.
    assert decision.violated_after == (("pump-hard-when-level-high", "outflow-budget"), (), ())
    assert artifact.predict(observations, prev).violated_after[0] == ("outflow-budget",)
