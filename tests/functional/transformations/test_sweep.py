"""Sweeps of traced hyperparameters × seeds as one program, on a plant's own log."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

from neorl_industrial.core.agents.registry import build_algorithm
from neorl_industrial.core.safety.contract import SafetyContract
from neorl_industrial.functional.state_management import ActionScaler
from neorl_industrial.functional.transformations.offline import Schedule, train_offline
from neorl_industrial.functional.transformations.sweep import (
    SweepError,
    check_sweep_fits,
    estimate_sweep_bytes,
    expand_grid,
    plan_sweep,
    plan_sweep_groups,
    train_sweep,
)
from tests.processes import run_shipped

HIDDEN = {"hidden": (8, 8)}


@pytest.fixture(scope="module")
def plant_data():
    return shipped_log()


def shipped_log():
    """The shipped mixing-tank log (no simulator behind it), actions scaled from the
    plant's percent to the policies' [-1, 1]."""
    from neorl_industrial.integration.datasets import load_plant_log

    example = Path(__file__).resolve().parents[3] / "examples" / "mixing-tank"
    dataset, card = load_plant_log(example / "mixing_tank.csv", example / "schema.yaml")
    task = card.task()
    scaler = ActionScaler.create(task.action_low, task.action_high)
    return dataset.replace(actions=scaler.scale(dataset.actions))


def test_a_grid_expands_to_every_combination_first_field_slowest():
    points = expand_grid({"alpha": [1.0, 2.5], "tau": [0.005, 0.01, 0.02]})
    assert len(points) == 6
    assert points[0] == {"alpha": 1.0, "tau": 0.005}
    assert points[3] == {"alpha": 2.5, "tau": 0.005}
    plan = plan_sweep(
        "td3bc", {"alpha": [1, 4]}, seeds=(0, 3), obs_size=3, action_size=2,
        hyperparameters=HIDDEN,
    )  # fmt: skip
    assert plan.runs() == [(0, 0), (0, 3), (1, 0), (1, 3)]  # configuration-major
    np.testing.assert_array_equal(plan.values()["alpha"], np.float32([1, 1, 4, 4]))


_ALONE: dict[tuple, list] = {}


def _alone(plant_data, point, seed):
    """The run's own ``train_offline``: one configuration, one seed, nothing traced
    (each trained once per module)."""
    key = (tuple(sorted(point.items())), seed)
    if key not in _ALONE:
        obs, act = plant_data.observation_size, plant_data.action_size
        algorithm, _ = build_algorithm("td3bc", obs, act, {**HIDDEN, **point})
        state, _ = train_offline(
            algorithm,
            plant_data,
            seeds=(seed,),
            schedule=Schedule(n_updates=40, chunk_updates=20, batch_size=32),
        )
        _ALONE[key] = jax.tree.leaves(jax.tree.map(lambda leaf: leaf[0], state.agent))
    return _ALONE[key]


def _distance(ours, theirs) -> float:
    """The largest relative distance over the state's leaves."""
    return max(
        float(np.linalg.norm(np.ravel(a - b)) / max(np.linalg.norm(np.ravel(b)), 1e-6))
        for a, b in zip(ours, theirs, strict=True)
    )


def one_run_sweep_and_its_training_run() -> tuple[list, list]:
    """The state of a one-run sweep and of that run's own ``train_offline``."""
    plant_data = shipped_log()
    obs, act = plant_data.observation_size, plant_data.action_size
    plan = plan_sweep(
        "td3bc",
        {"alpha": [4.0], "actor_lr": [1e-3]},
        seeds=(3,),
        obs_size=obs,
        action_size=act,
        hyperparameters=HIDDEN,
    )
    result = train_sweep(
        plan,
        plant_data,
        schedule=Schedule(n_updates=40, chunk_updates=20, batch_size=32),
    )
    ours = [np.asarray(leaf) for leaf in jax.tree.leaves(result.run_state(0))]
    alone = _alone(plant_data, {"alpha": 4.0, "actor_lr": 1e-3}, 3)
    return ours, [np.asarray(leaf) for leaf in alone]


@pytest.mark.slow
def test_a_one_run_sweep_is_bit_identical_to_its_training_run():
    # Bit for bit as users' programs compile (the suite's fast-compile code generator
    # fuses the two programs differently). Slow: four programs compiled at the users'
    # optimization level, 35 CPU s; the test after it checks every run of a sweep against
    # its own training run on every `make test`.
    ours, alone = run_shipped(
        "from tests.functional.transformations.test_sweep import "
        "one_run_sweep_and_its_training_run\n"
        "result = one_run_sweep_and_its_training_run()\n"
    )
    assert len(ours) == len(alone) > 0
    for mine, reference in zip(ours, alone, strict=True):
        np.testing.assert_array_equal(mine, reference)


def test_every_run_of_a_sweep_ends_where_its_own_training_run_ends(plant_data):
    """Configurations × seeds in one program: each run's state matches its configuration's
    own ``train_offline`` of that seed up to the reassociation of batched products (the
    traced alpha and learning rate are the values a separate program compiles in), and
    is far from the other configuration's."""
    obs, act = plant_data.observation_size, plant_data.action_size
    grid = {"alpha": [1.0, 4.0], "actor_lr": [1e-3]}
    plan = plan_sweep(
        "td3bc", grid, seeds=(3,), obs_size=obs, action_size=act, hyperparameters=HIDDEN
    )
    assert plan.n_runs == 2 and plan.runs() == [(0, 3), (1, 3)]
    result = train_sweep(
        plan,
        plant_data,
        schedule=Schedule(n_updates=40, chunk_updates=20, batch_size=32),
    )
    assert [entry["updates"] for entry in result.history] == [20, 40]
    assert np.asarray(result.history[-1]["metrics"]["critic_loss"]).shape == (2,)
    for index, (point, seed) in enumerate(plan.runs()):
        ours = jax.tree.leaves(result.run_state(index))
        assert _distance(ours, _alone(plant_data, plan.points[point], seed)) < 2e-3
        other = plan.points[1 - point]
        assert _distance(ours, _alone(plant_data, other, seed)) > 0.05


def test_iql_and_cql_hyperparameters_trace_and_shapes_do_not(plant_data):
    obs, act = plant_data.observation_size, plant_data.action_size
    plan = plan_sweep(
        "iql",
        {"expectile": [0.7, 0.9], "beta": [3.0, 10.0]},
        obs_size=obs,
        action_size=act,
        hyperparameters=HIDDEN,
    )
    assert plan.n_runs == 4
    with pytest.raises(SweepError, match=r"grid\.n_actions: cannot be traced"):
        plan_sweep(
            "cql", {"n_actions": [5, 10]}, obs_size=obs, action_size=act, hyperparameters=HIDDEN
        )


def test_values_no_program_can_trace_split_the_grid_into_groups(plant_data):
    obs, act = plant_data.observation_size, plant_data.action_size
    grid = {"hidden": [[8], [4, 4]], "cql_alpha": [1.0, 4.0], "n_actions": [5, 10]}
    groups = plan_sweep_groups("cql", grid, seeds=(0, 1), obs_size=obs, action_size=act)
    # hidden and n_actions set shapes: each pair of their values is a group (a program);
    # cql_alpha is traced inside each.
    points = expand_grid(grid)
    assert len(groups) == 4
    assert sorted(i for g in groups for i in g.indices) == list(range(len(points)))
    for group in groups:
        assert group.plan.fields == ("cql_alpha",) and group.plan.n_runs == 4
        assert set(group.fixed) == {"hidden", "n_actions"}
        for index, point in zip(group.indices, group.plan.points, strict=True):
            assert points[index] == {**group.fixed, **point}
        assert tuple(group.plan.configs[0].hidden) == tuple(group.fixed["hidden"])
    # A grid of traced fields only is one group, plan_sweep's plan.
    (one,) = plan_sweep_groups("td3bc", {"alpha": [1.0, 2.0]}, obs_size=obs, action_size=act)
    assert one.fixed == {} and one.indices == (0, 1) and one.plan.fields == ("alpha",)
    # Only untraceable fields: one configuration per group, its seeds.
    groups = plan_sweep_groups("td3bc", {"hidden": [[8], [16]]}, obs_size=obs, action_size=act)
    assert [g.plan.fields for g in groups] == [(), ()] and [g.plan.n_runs for g in groups] == [1, 1]
    with pytest.raises(SweepError, match="did you mean 'alpha'"):
        plan_sweep_groups("td3bc", {"alfa": [1.0]}, obs_size=obs, action_size=act)


def test_a_safe_sweep_takes_its_cost_limits_from_the_runs_contract_only():
    contract = SafetyContract(
        constraints=None, cost_limits=np.asarray([3.0], np.float32), cost_names=("alarm",)
    )
    shape = {"obs_size": 4, "action_size": 2, "contract": contract}
    groups = plan_sweep_groups("td3bc-lag", {"hidden": [[8], [16]]}, **shape)
    assert [tuple(g.plan.configs[0].cost_limits) for g in groups] == [(3.0,), (3.0,)]
    # A limit from anywhere else beside the contract is refused by name.
    with pytest.raises(SweepError, match="safety contract holds its cost limits"):
        plan_sweep_groups("td3bc-lag", {"cost_limits": [[1.0], [2.0]]}, **shape)
    with pytest.raises(SweepError, match="safety contract holds its cost limits"):
        plan_sweep_groups(
            "td3bc-lag", {"alpha": [1.0]}, hyperparameters={"cost_limits": [1.0]}, **shape
        )
    # An algorithm without costs ignores the contract.
    (plain,) = plan_sweep_groups("td3bc", {"alpha": [1.0, 2.0]}, **shape)
    assert not hasattr(plain.plan.configs[0], "cost_limits")


@pytest.mark.parametrize(
    ("grid", "seeds", "message"),
    [
        ({}, (0,), "grid: expected at least one hyperparameter"),
        ({"alpha": []}, (0,), "grid.alpha: expected at least one value"),
        ({"alpha": 2.5}, (0,), "grid.alpha: expected a list of values"),
        ({"alfa": [1.0]}, (0,), "no such hyperparameter (did you mean 'alpha'?)"),
        ({"actor_lr": [1e-3, -1.0]}, (0,), "grid configuration 1 {'actor_lr': -1.0}"),
        ({"hidden": [[8], [16]]}, (0,), "grid.hidden: a tuple hyperparameter cannot be traced"),
        ({"alpha": [1.0]}, (), "seeds: expected at least one seed"),
        ({"alpha": [1.0]}, (1, 1), "repeats a seed"),
    ],
)
def test_bad_sweeps_are_refused_by_name(grid, seeds, message):
    with pytest.raises(SweepError) as error:
        plan_sweep("td3bc", grid, seeds=seeds, obs_size=3, action_size=2, hyperparameters=HIDDEN)
    assert message in str(error.value)


def test_a_sweep_larger_than_memory_is_refused_before_compiling():
    plan = plan_sweep(
        "td3bc",
        {"alpha": [1.0, 2.5, 5.0, 7.5]},
        seeds=(0, 1),
        obs_size=180,
        action_size=3,
        hyperparameters={"hidden": (256, 256)},
    )
    needed = estimate_sweep_bytes(plan, 256)
    one_run = estimate_sweep_bytes(
        plan_sweep(
            "td3bc",
            {"alpha": [1.0]},
            obs_size=180,
            action_size=3,
            hyperparameters={"hidden": (256, 256)},
        ),
        256,
    )
    assert needed == 8 * one_run
    # TD3+BC at (256, 256): actor, two critics, their targets, Adam's two moments each
    assert 8 * 2**20 < one_run < 64 * 2**20
    assert check_sweep_fits(plan, 256, available=needed) == needed
    with pytest.raises(SweepError, match=r"sweep: 8 runs need at least [\d,]+ MiB .* 1 MiB"):
        check_sweep_fits(plan, 256, available=2**20)
