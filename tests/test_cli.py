"""The neorl-industrial command line."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from neorl_industrial import cli
from neorl_industrial.cli.environments import run_rollouts
from tests.shared import mlflow_store


def test_envs_lists_every_registered_environment(capsys):
    assert cli.main(["--no-cache", "envs"]) == 0
    out = capsys.readouterr().out
    for env_id in ("IB-v0", "IB-classic-v0", "IB-discrete-v0", "IB-nonstationary-v0"):
        assert env_id in out


def test_rollout_reports_returns_and_costs(capsys):
    code = cli.main(
        [
            "--no-cache",
            "rollout",
            "--env",
            "IB-classic-v0",
            "--policy",
            "hold",
            "--n-envs",
            "4",
            "--n-steps",
            "1000",
            "--setpoint",
            "40",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "IB-classic-v0" in out and "hold" in out
    # Four environments, one full episode each, and holding the setting is safe.
    row = next(line for line in out.splitlines() if "IB-classic-v0" in line)
    cells = [cell.strip() for cell in row.split("│") if cell.strip()]
    assert cells[:3] == ["IB-classic-v0", "hold", "4"]
    assert cells[4:6] == ["0.0", "0.0"]


def test_run_rollouts_measures_a_rollout():
    report = run_rollouts("IB-classic-v0", "random", n_envs=3, n_steps=1000, seed=0)
    assert report.episodes == 3
    assert report.mean_return < 0
    assert report.mean_episode_cost.shape == (2,)
    assert report.steps_per_second > 0 and report.compile_seconds > 0


def test_bad_input_is_a_clear_error(capsys):
    assert cli.main(["--no-cache", "rollout", "--setpoint", "120"]) == 2
    assert "setpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["rollout", "--n-envs", "0"])
    with pytest.raises(SystemExit):
        cli.main(["rollout", "--env", "IB-v9"])


@pytest.mark.parametrize(
    ("error", "named"),
    [
        (IsADirectoryError(21, "Is a directory", "runs/x/policy/.."), "runs/x/policy/.."),
        (PermissionError(13, "Permission denied", "keys/policy-signing.key"), "keys/policy"),
        (RecursionError("maximum recursion depth exceeded"), "nested too deeply"),
    ],
)
def test_an_unreadable_or_too_deeply_nested_input_is_one_line_and_exit_2(
    error, named, monkeypatch, capsys
):
    from neorl_industrial.cli import environments

    def broken(_args):
        raise error

    monkeypatch.setattr(environments, "command_envs", broken)
    assert cli.main(["--no-cache", "envs"]) == 2
    printed = capsys.readouterr().err.strip()
    assert named in printed and len(printed.splitlines()) == 1 and "Traceback" not in printed


def test_compilation_cache_goes_where_asked(tmp_path, monkeypatch):
    import jax

    from neorl_industrial.cli.runtime import CACHE_ENV, default_cache_dir, enable_compilation_cache

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    assert default_cache_dir() == tmp_path / "cache"
    names = (
        "jax_compilation_cache_dir",
        "jax_persistent_cache_min_compile_time_secs",
        "jax_persistent_cache_min_entry_size_bytes",
    )
    previous = {name: getattr(jax.config, name) for name in names}
    try:
        path = enable_compilation_cache()
        assert path.is_dir()
        assert jax.config.jax_compilation_cache_dir == str(path)
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.5
        # Every program, however small (the test suite's own cache).
        every = enable_compilation_cache(tmp_path / "every", min_compile_seconds=0.0)
        assert jax.config.jax_compilation_cache_dir == str(every)
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
        assert jax.config.jax_persistent_cache_min_entry_size_bytes == 0
    finally:
        for name, value in previous.items():
            jax.config.update(name, value)


def test_datasets_generate_inspect_and_import(tmp_path, capsys):
    out = tmp_path / "random"
    args = ["--no-cache", "datasets", "generate", "--env", "IB-classic-v0", "--quality", "random"]
    assert cli.main([*args, "--trajectories", "2", "--out", str(out)]) == 0
    assert "2,000 transitions" in capsys.readouterr().out
    # Nothing is overwritten without being asked.
    assert cli.main([*args, "--trajectories", "2", "--out", str(out)]) == 2
    assert cli.main(["--no-cache", "datasets", "inspect", str(out)]) == 0
    summary = capsys.readouterr().out
    assert "n_transitions" in summary and "2000" in summary
    from neorl_industrial.integration.datasets import load_native, save_neorl_npz

    dataset, _ = load_native(out)
    save_neorl_npz(dataset, tmp_path / "data.npz")
    imported = tmp_path / "imported"
    assert cli.main(["datasets", "import", str(tmp_path / "data.npz"), "--out", str(imported)]) == 0
    again, _ = load_native(imported)
    assert again.n_transitions == 2000


def _sets(items):
    return [arg for item in items for arg in ("--set", item)]


# The main job (`run`, its refusals, `train --resume`, `evaluate` and `export` of it) runs
# once, tracked, in tests/integration/mlflow/test_tracking.py.
def test_train_errors_are_named_without_a_traceback(tmp_path, capsys):
    code = cli.main(["--no-cache", "train", "--set", "algorithm.name=td3-bc"])
    assert code == 2
    assert "did you mean 'td3bc'" in capsys.readouterr().err
    code = cli.main(["--no-cache", "train", "-c", str(tmp_path / "none.yaml")])
    assert code == 2 and "no such config file" in capsys.readouterr().err


#: Every command and sub-command (test_the_help_test_lists_every_command checks).
HELP_COMMANDS = [
    [],
    ["run"],
    ["train"],
    ["sweep"],
    ["evaluate"],
    ["export"],
    ["verdict"],
    ["bench"],
    ["envs"],
    ["rollout"],
    ["datasets"],
    ["datasets", "generate"],
    ["datasets", "inspect"],
    ["datasets", "import"],
    ["datasets", "train-policies"],
    ["model"],
    ["model", "fit"],
    ["model", "history"],
    ["model", "inspect"],
    ["models"],
    ["models", "list"],
    ["models", "promote"],
    ["models", "export"],
    ["models", "register"],
    ["mlflow"],
    ["mlflow", "replay"],
    ["serve"],
    ["audit"],
    ["audit", "verify"],
    ["keys"],
    ["keys", "generate"],
    ["bridge"],
    ["shadow-report"],
]


@pytest.mark.parametrize("command", HELP_COMMANDS)
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*command, "--help"])
    assert exit_info.value.code == 0
    assert f"usage: neorl-industrial {' '.join(command)}".strip() in capsys.readouterr().out


def _command_paths(parser, prefix=()):
    """Every command and sub-command of ``parser``, as argument lists."""
    paths = [list(prefix)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths += _command_paths(sub, (*prefix, name))
    return paths


def test_the_help_test_lists_every_command():
    missing = [path for path in _command_paths(cli.build_parser()) if path not in HELP_COMMANDS]
    assert not missing, f"add these commands to test_every_command_has_help: {missing}"


def test_the_command_line_does_not_import_the_benchmarks():
    # The benchmarks are not installed with the package; `bench` runs them in a process.
    package = Path(cli.__file__).parent
    modules = sorted(package.glob("*.py"))
    assert len(modules) > 5
    for module in modules:
        for node in ast.walk(ast.parse(module.read_text(), filename=str(module))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] != "benchmarks", f"{module.name} imports {name}"


def test_bench_outside_a_source_tree_says_where_to_run_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--no-cache", "bench", "env_throughput", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "benchmarks/" in err and "repository root" in err


def test_bench_runs_the_benchmark_runner_in_its_own_process(monkeypatch, capfd):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    assert cli.main(["--no-cache", "bench", "env_throughput", "--help"]) == 0
    assert "usage: python -m benchmarks.run" in capfd.readouterr().out


def _mixing_tank_sweep(tmp_path, name, grid):
    """``sweep`` of TD3BC-Lag on the imported mixing-tank log (no simulator), tracked
    in a store of its own."""
    root = Path(__file__).resolve().parents[1] / "examples" / "mixing-tank"
    data = tmp_path / "mixing-tank"
    if not data.exists():
        assert (
            cli.main(
                [
                    "--no-cache",
                    "datasets",
                    "import",
                    str(root / "mixing_tank.csv"),
                    "--schema",
                    str(root / "schema.yaml"),
                    "--out",
                    str(data),
                ]
            )
            == 0
        )
    overrides = [
        f"data.path={data}",
        f"output={tmp_path}",
        f"name={name}",
        f"safety.constraints={root / 'constraints.yaml'}",
        "algorithm.name=td3bc-lag",
        "algorithm.hyperparameters={hidden: [8]}",
        "training.updates=20",
        "training.chunk=10",
        "training.batch_size=32",
        "evaluation.ope={holdout: 0.25, updates: 20, seeds: [0, 1], hidden: [8]}",
        f"tracking.uri={mlflow_store(tmp_path)}",
        "tracking.registered_model=mixing-tank-sweep",
        "tracking.flush_timeout=120",
    ]
    args = ["--no-cache", "sweep", "-c", str(root / "run.yaml"), *_sets(overrides)]
    return cli.main([*args, *[a for g in grid for a in ("--grid", g)]])


def test_sweep_on_a_plant_log_is_one_program_tracked_as_parent_and_configurations(tmp_path, capsys):
    import json

    from mlflow import MlflowClient

    grid = ["algorithm.hyperparameters.alpha=[1.0, 4.0]", "training.seeds=[0, 1]"]
    assert _mixing_tank_sweep(tmp_path, "swept", grid) == 0
    out = capsys.readouterr().out
    assert "every configuration (FQE estimate" in out and "Chosen: configuration" in out
    run = tmp_path / "swept"
    table = json.loads((run / "sweep.json").read_text())
    assert [c["values"] for c in table["configurations"]] == [{"alpha": 1.0}, {"alpha": 4.0}]
    assert table["estimate"] == "fqe" and table["seeds"] == [0, 1]
    assert "**" in (run / "sweep.md").read_text()
    for part in ("agent/agent.json", "policy/manifest.json", "report.json"):
        assert (run / part).is_file(), part
    report = json.loads((run / "report.json").read_text())
    tracking = report["tracking"]
    client = MlflowClient(tracking_uri=tracking["uri"])
    parent = client.get_run(tracking["run_id"])
    assert parent.data.tags["sweep"] == "true" and parent.info.status == "FINISHED"
    assert parent.data.tags["selected_configuration"] == str(table["selected"])
    assert parent.data.tags["selection_reason"] == table["reason"]
    children = [client.get_run(i) for i in tracking["configuration_run_ids"].values()]
    assert len(children) == 2
    for index, child in enumerate(children):
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.params["algorithm.hyperparameters.alpha"] == str(
            table["configurations"][index]["values"]["alpha"]
        )
        assert "ope/return_mean" in child.data.metrics
        # the estimator's settings are params; only its results are metrics
        assert child.data.params["ope.fqe_updates"] == "20"
        assert "ope/fqe_updates_mean" not in child.data.metrics
        assert [d.dataset.digest for d in child.inputs.dataset_inputs] == [
            d.dataset.digest for d in parent.inputs.dataset_inputs
        ]
        assert len(child.inputs.dataset_inputs) == 1
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"sweep.json", "sweep.md", "plots"} <= artifacts
    assert (run / "plots" / "sweep.png").stat().st_size > 0
    version = tracking["model"]
    tags = client.get_model_version(version["name"], version["version"]).tags
    assert tags["sweep_reason"] == table["reason"]


def test_a_sweep_that_cannot_run_is_named_and_its_parent_run_marked_failed(tmp_path, capsys):
    from mlflow import MlflowClient

    grid = ["algorithm.hyperparameters.actor_lr=[0.001, -1.0]"]
    assert _mixing_tank_sweep(tmp_path, "unsweepable", grid) == 2
    assert "grid configuration 1 {'actor_lr': -1.0}" in capsys.readouterr().err
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    (parent,) = client.search_runs(
        [client.get_experiment_by_name("neorl-industrial").experiment_id]
    )
    assert parent.data.tags["sweep"] == "true" and parent.info.status == "FAILED"
    # a key that cannot be swept in one program is refused before anything runs
    bad = ["training.batch_size=[32, 64]"]
    assert _mixing_tank_sweep(tmp_path, "other", bad) == 2
    assert "only algorithm.hyperparameters.<name> and training.seeds" in capsys.readouterr().err


def _small_tank_run(tmp_path, name):
    """The mixing-tank log imported under ``tmp_path`` and the overrides of a small,
    untracked TD3BC-Lag run of it named ``name``: ``(example folder, overrides)``."""
    root = Path(__file__).resolve().parents[1] / "examples" / "mixing-tank"
    data = tmp_path / "mixing-tank"
    assert cli.main(
        ["--no-cache", "datasets", "import", str(root / "mixing_tank.csv"),
         "--schema", str(root / "schema.yaml"), "--out", str(data)]
    ) == 0  # fmt: skip
    overrides = [
        f"data.path={data}", f"output={tmp_path}", f"name={name}",
        f"safety.constraints={root / 'constraints.yaml'}", "algorithm.name=td3bc-lag",
        "algorithm.hyperparameters={hidden: [8]}", "training.updates=20", "training.chunk=10",
        "training.batch_size=32", "evaluation.ope={holdout: 0.25, updates: 20, seeds: [0, 1]}",
        "tracking.enabled=false",
    ]  # fmt: skip
    return root, overrides


@pytest.mark.slow
def test_a_distributed_train_is_data_parallel_over_two_processes(tmp_path):
    """``train --distributed`` as two local processes: one run, its data split over both
    and its gradients averaged; process 0 alone writes the run."""
    import json
    import sys

    from tests.processes import run_distributed

    root, overrides = _small_tank_run(tmp_path, "parallel")
    overrides.append("training.seeds=[0]")
    command = [sys.executable, "-m", "neorl_industrial", "--no-cache", "train", "--distributed",
               "-c", str(root / "run.yaml"), *_sets(overrides)]  # fmt: skip
    outputs = run_distributed(command, timeout=900)
    assert "data-parallel over 2 devices in 2 processes" in outputs[0][0]
    assert "process 1 of 2: done" in outputs[1][0]
    report = json.loads((tmp_path / "parallel" / "report.json").read_text())
    assert report["devices"] == 2 and report["processes"] == 2
    assert report["training"]["updates"] == 20


@pytest.mark.slow
def test_a_distributed_sweep_runs_over_two_processes_and_process_0_writes(tmp_path):
    """``sweep --distributed`` as two local processes (gloo on loopback): both train their
    runs, process 0 alone writes the outputs."""
    import json
    import sys

    from tests.processes import run_distributed

    root, overrides = _small_tank_run(tmp_path, "distributed")
    command = [sys.executable, "-m", "neorl_industrial", "--no-cache", "sweep", "--distributed",
               "-c", str(root / "run.yaml"), *_sets(overrides),
               "--grid", "algorithm.hyperparameters.alpha=[1.0, 4.0]"]  # fmt: skip
    outputs = run_distributed(command, id_variable="JOB_COMPLETION_INDEX", timeout=900)
    assert "2 devices in 2 processes" in outputs[0][0]
    assert "process 1 of 2: done" in outputs[1][0]
    table = json.loads((tmp_path / "distributed" / "sweep.json").read_text())
    assert len(table["configurations"]) == 2 and table["seeds"] == [0, 1, 2]
