"""``run`` (the main job), ``train``, ``evaluate`` and ``export``, and their reports."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from neorl_industrial.cli.common import agent_dir, make_console, positive_int
from neorl_industrial.cli.run_report import (
    _estimates,
    _print_selection,
    _print_tracking,
    _side_by_side_table,
    _summary_table,
    _sweep_table,
    _warn_training_episodes,
    print_verdict,
)

if TYPE_CHECKING:
    from neorl_industrial.cli.run_glue import RunOutcome


def command_run(args: argparse.Namespace) -> int:
    from neorl_industrial.cli.run_glue import main_job_config

    overrides = list(args.set or [])
    if not any(item.startswith("name=") for item in overrides):
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        overrides.append(f"name=main-{stamp}")
    config = main_job_config(overrides)
    console = make_console()
    console.print(
        f"[bold]neorl_industrial[/bold] main job on {jax.default_backend()} "
        f"({len(jax.devices())} device(s)): {config.algorithm.name} on a generated "
        f"{config.env.id or 'IB-v0'} dataset, seeds {config.training.seeds}"
    )
    return _train_and_report(config, resume=False, console=console)


def command_train(args: argparse.Namespace) -> int:
    from neorl_industrial.wrappers.training import RunConfig

    config = RunConfig.from_files(list(args.config or []), list(args.set or []))
    mesh = None
    if args.distributed or args.data_parallel:
        from neorl_industrial.functional.transformations.data_parallel import data_mesh

        if args.distributed:
            from neorl_industrial.cli.runtime import initialize_distributed

            index, count = initialize_distributed()
        mesh = data_mesh()
        if args.distributed and index:
            from neorl_industrial.cli.run_glue import run_training

            run_training(config, resume=args.resume, mesh=mesh)
            print(f"process {index} of {count}: done; process 0 writes and logs the run")
            return 0
    console = make_console()
    task = config.env.id or ("the dataset's task" if config.data.path else "IB-v0")
    console.print(
        f"[bold]training[/bold] {config.algorithm.name} on {task} "
        f"({config.data.path or 'generated data'}), seeds {config.training.seeds} "
        f"-> {config.run_dir}"
    )
    if mesh is not None:
        console.print(
            f"data-parallel over {mesh.devices.size} devices in {jax.process_count()} processes"
        )
    return _train_and_report(
        config, resume=args.resume, console=console, mesh=mesh, plant_model=args.plant_model
    )


def command_sweep(args: argparse.Namespace) -> int:
    from neorl_industrial.cli.run_glue import run_sweep
    from neorl_industrial.wrappers.training import RunConfig

    config = RunConfig.from_files(list(args.config or []), list(args.set or []))
    config = config.with_grid(list(args.grid or []))
    mesh = None
    if args.distributed:
        from neorl_industrial.cli.runtime import initialize_distributed
        from neorl_industrial.functional.transformations.sweep import runs_mesh

        index, count = initialize_distributed()
        mesh = runs_mesh()
        if index:
            run_sweep(config, mesh=mesh)
            print(f"process {index} of {count}: done; process 0 writes and logs the sweep")
            return 0
    console = make_console()
    task = config.env.id or ("the dataset's task" if config.data.path else "IB-v0")
    grid = config.sweep.hyperparameter_grid()
    console.print(
        f"[bold]sweep[/bold] of {config.algorithm.name} on {task}: "
        + ", ".join(f"{name} in {values}" for name, values in grid.items())
        + f" x seeds {config.sweep.grid.get('training.seeds') or config.training.seeds}, "
        f"one program -> {config.run_dir}"
    )
    started = time.perf_counter()
    if mesh is not None:
        console.print(f"{len(mesh.devices.ravel())} devices in {jax.process_count()} processes")
    outcome = run_sweep(config, console=console, mesh=mesh, plant_model=args.plant_model)
    report = outcome.report
    sweep = report["sweep"]
    table_path = outcome.run_dir / "sweep.json"
    table = json.loads(table_path.read_text())
    console.print(_sweep_table(table, outcome.agent.name))
    console.print(
        escape(
            f"Chosen: configuration {sweep['selected']} {sweep['selected_values']} "
            f"({sweep['reason']}); {sweep['runs']} runs x {sweep['updates']:,} updates in "
            f"{sweep['seconds']:.1f} s."
        )
    )
    if table.get("verdict"):
        print_verdict(console, table["verdict"])
    _print_selection(console, outcome)
    hindsight = table.get("hindsight")
    if hindsight:
        console.print(
            f"In the simulator: best configuration {hindsight['best_in_hindsight']}, regret of "
            f"the offline choice {hindsight['regret']:.4g}, rank correlation "
            f"{hindsight['rank_correlation']}."
        )
    _print_outputs(
        console,
        outcome,
        [f"Table: {outcome.run_dir / 'sweep.md'}; report: {outcome.run_dir}/report.json"],
        started,
    )
    return 0


def _print_outputs(console: Console, outcome: RunOutcome, files: list[str], started: float) -> None:
    """The end of a run's or sweep's report: its saved agent and policy, the lines of
    ``files`` (its other outputs), its MLflow run and the time since ``started``."""
    console.print(f"Agent: {outcome.agent_dir}  (Agent.load)")
    if outcome.policy_dir:
        console.print(f"Policy: {outcome.policy_dir}  (served without training code)")
    for line in files:
        console.print(line)
    tracking = outcome.report.get("tracking")
    if tracking:
        _print_tracking(console, tracking)
    console.print(f"Done in {time.perf_counter() - started:.1f} s.")


def _train_and_report(
    config, *, resume: bool, console: Console, mesh: Any = None, plant_model: Any = None
) -> int:
    from neorl_industrial.cli.run_glue import run_training
    from neorl_industrial.wrappers.training import RichProgress

    started = time.perf_counter()
    outcome = run_training(
        config,
        resume=resume,
        callbacks=[RichProgress(console, metrics=("critic_loss",))],
        console=console,
        mesh=mesh,
        plant_model=plant_model,
    )
    report, result = outcome.report, outcome.result
    assert result is not None
    console.print(_summary_table(report, result))
    if result.ope:
        console.print(_side_by_side_table(result.ope))
    if result.verdict:
        print_verdict(console, result.verdict)
    _print_selection(console, outcome)
    data, training = report["data"], report["training"]
    rate = training["updates_per_s"]
    console.print(
        f"Data: {data['transitions']:,} transitions in {data['episodes']} episodes "
        f"({data['source']}), mean episode return {data['mean_episode_return']:,.0f}."
    )
    console.print(
        f"Training: {result.updates:,} updates x {len(result.seeds)} seeds in "
        f"{training['seconds']:.1f} s"
        + (f" ({rate:,.0f} updates/s over all seeds after compilation)" if rate else "")
        + (f", resumed from {result.resumed_from:,}" if result.resumed_from else "")
        + ("; stopped early" if result.stopped_early else "")
        + "."
    )
    checkpoints = outcome.plan.checkpoint_dir if outcome.plan is not None else None
    files = [] if checkpoints is None else [f"Checkpoints: {checkpoints}"]
    files.append(f"Report: {outcome.run_dir / 'report.json'}")
    _print_outputs(console, outcome, files, started)
    return 0


def command_evaluate(args: argparse.Namespace) -> int:
    from neorl_industrial.wrappers.agents import Agent

    agent = Agent.load(agent_dir(args.agent))
    console = make_console()
    estimates = None
    if args.ope is not None:
        estimates = _evaluate_offline(agent, args, console)
    elif not agent.task.has_simulator:
        console.print(
            f"[red]error:[/red] {args.agent}: task {agent.task.name!r} has no simulator; "
            "evaluate it off policy from logged data: --ope DATASET (episodes it was not "
            "trained on)"
        )
        return 2
    if not agent.task.has_simulator:
        if args.json:
            Path(args.json).write_text(json.dumps({"ope": estimates}, indent=2, default=str))
            console.print(f"Wrote {args.json}")
        return 0
    result = agent.evaluate(
        args.episodes, horizon=args.horizon, shield_actions=not args.no_shield, seed=args.seed
    )
    table = Table(title=f"{agent.name} from {args.agent}: {args.episodes} episodes per run")
    for column in (
        "run",
        "return",
        "normalized cost",
        "violations",
        "shield overrides",
        "hard violations",
    ):
        table.add_column(column, justify="right")
    for i, metrics in enumerate(result["runs"]):
        cost = metrics.get("normalized_cost")
        table.add_row(
            f"{i}{' *' if i == result['selected_run'] else ''}",
            f"{metrics['return']:,.0f}",
            "-" if cost is None else f"{cost:.2f}",
            f"{100 * metrics['violation_rate']:.0f} %",
            f"{100 * metrics['override_rate']:.1f} %",
            str(metrics["hard_violation_steps"]),
        )
    console.print(table)
    summary = result["summary"]["return"]
    ci = f" ± {summary['ci']:,.0f}" if summary["ci"] is not None else ""
    console.print(f"Mean return over runs: {summary['mean']:,.0f}{ci} (95 % CI)")
    if estimates is not None:
        result = {**result, "ope": estimates}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
        console.print(f"Wrote {args.json}")
    return 0


def _evaluate_offline(agent: Any, args: argparse.Namespace, console: Console) -> dict:
    """``evaluate --ope``: FQE's estimates from the logged data (and the verdict with a
    plant model), printed; returns them."""
    from neorl_industrial.integration.datasets import load_any
    from neorl_industrial.wrappers.agents.agent import OPESettings

    dataset, card = load_any(args.ope, schema=args.schema)
    model = None
    if args.plant_model is not None:
        from neorl_industrial.wrappers.models import PlantModel

        model = PlantModel.load(args.plant_model)  # checked against the data below
    else:
        console.print(
            "No --plant-model: FQE's estimates alone, and no recommendation (a verdict "
            "needs a plant model of this log: neorl-industrial model fit)"
        )
    estimates = agent.evaluate_offline(
        dataset,
        OPESettings(updates=args.ope_updates),
        plant_model=model,
        dataset_name=card.name,
    )
    _warn_training_episodes(console, estimates, args.ope)
    rows = [(i, agent.seeds[i], None, m) for i, m in enumerate(estimates["runs"])]
    console.print(
        _estimates(
            f"{agent.name} from {args.agent}: off-policy estimates (FQE) on {args.ope}",
            rows,
            estimates["selected_run"],
        )
    )
    if estimates.get("verdict"):
        print_verdict(console, estimates["verdict"])
    return estimates


def command_export(args: argparse.Namespace) -> int:
    from neorl_industrial.wrappers.agents import Agent
    from neorl_industrial.wrappers.agents.signing import PRIVATE_KEY

    agent = Agent.load(_saved_agent(args.agent))
    if args.candidate is not None:
        agent = agent.candidate(_own_candidate(args.agent, args.candidate))
    console = make_console()
    key = args.sign_key
    if key is None and (Path("keys") / PRIVATE_KEY).is_file():
        key = Path("keys") / PRIVATE_KEY  # the pair runs make here, which servers here trust
    # The ONNX graph only when asked for (the default export needs no onnx install).
    options = {"format": args.format} if args.format != "jax" else {}
    path = agent.export(args.out, overwrite=args.overwrite, signing_key=key, **options)
    signed = f"signed with {key}" if key is not None else "unsigned"
    graph = " with its ONNX graph (policy.onnx)" if args.format == "onnx" else ""
    console.print(
        f"Exported the policy of {args.agent} ({agent.name}, candidate "
        f"{agent.selected_candidate}) to {path}{graph}, {signed}"
    )
    if key is None:
        console.print(
            "[yellow]warning:[/yellow] no --sign-key and no keys/policy-signing.key here: "
            "servers that require signatures refuse it and the registry never promotes it"
        )
    return 0


def _saved_agent(value: str) -> Path:
    """A saved agent's directory from a run's directory, the agent's own or a registry
    URI."""
    path = agent_dir(value)
    if not (path / "agent.json").is_file() and (path / "agent" / "agent.json").is_file():
        return path / "agent"
    return path


def _own_candidate(run: str, candidate: str) -> str:
    """``candidate`` without its run's name (``heater-bc/seed1`` as a joint verdict names
    it); one of another run is refused by name."""
    owner, slash, name = candidate.rpartition("/")
    if not slash:
        return candidate
    path = Path(run)
    label = (path.parent if path.name == "agent" else path).absolute().name
    if owner != label:
        raise ValueError(
            f"--candidate {candidate}: a candidate of run {owner!r}, not of {label!r} ({run})"
        )
    return name


def command_verdict(args: argparse.Namespace) -> int:
    from neorl_industrial.cli.verdict_glue import LoggedData, run_verdict

    console = make_console()
    console.print(
        f"[bold]verdict[/bold] over every candidate of {len(args.runs)} run(s) with the plant "
        f"model {args.plant_model}"
    )
    started = time.perf_counter()
    outcome = run_verdict(
        list(args.runs),
        args.plant_model,
        data=None if args.data is None else LoggedData(args.data, args.schema),
        out=args.out,
        ope_updates=args.ope_updates,
        track=not args.no_tracking,
        console=console,
    )
    report = outcome.report
    heldout = report["heldout"]
    console.print(
        escape(
            f"{sum(len(run['candidates']) for run in report['runs'].values())} candidates of "
            f"{len(report['runs'])} run(s), judged on {heldout['episodes']} of the "
            f"{heldout['of']} episodes of {report['data']['name']} (those no candidate "
            "trained on and the plant model was not fitted on)."
        )
    )
    for label, run in report["runs"].items():
        for failed in run["failed"]:
            console.print(
                escape(f"  {label}/{failed['candidate']}: failed, not judged: {failed['reason']}")
            )
    print_verdict(console, report["verdict"])
    first = report["first"]
    console.print(
        escape(
            f"Ranked first: {first['run']}/{first['candidate']}. Export it with: {report['export']}"
        ),
        soft_wrap=True,
    )
    console.print(f"Report: {outcome.out_dir / 'report.json'}")
    tracking = report.get("tracking")
    if tracking:
        console.print(
            f"MLflow: run {tracking['run_id'] or 'not created (see the spool)'} in experiment "
            f"{tracking['experiment']!r} at {tracking['uri']}; {tracking['ui']}"
        )
    console.print(f"Done in {time.perf_counter() - started:.1f} s.")
    return 0


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """Adds ``run``, ``train``, ``sweep``, ``evaluate``, ``export`` and ``verdict`` to
    the command line."""
    _add_run_and_train(commands)
    _add_sweep(commands)
    _add_evaluate(commands)
    _add_export(commands)
    _add_verdict(commands)


def _add_run_and_train(commands: argparse._SubParsersAction) -> None:
    """Adds the ``run`` and ``train`` commands."""
    run = commands.add_parser(
        "run",
        help="the main job: generate data, train a safe agent, evaluate, save, export, report",
    )
    run.add_argument(
        "--set",
        action="append",
        metavar="FIELD=VALUE",
        help="override a field of the main job's configuration, e.g. training.updates=1000",
    )
    run.set_defaults(handler=command_run)

    train = commands.add_parser("train", help="train an agent from configuration files")
    train.add_argument(
        "--config",
        "-c",
        action="append",
        metavar="YAML",
        help="a configuration file; several are merged in order (e.g. an environment, "
        "then an algorithm)",
    )
    train.add_argument(
        "--set",
        action="append",
        metavar="FIELD=VALUE",
        help="override a field, e.g. training.seeds=[0,1,2] or algorithm.name=iql-lag",
    )
    train.add_argument(
        "--resume", action="store_true", help="continue the run from its newest checkpoint"
    )
    train.add_argument(
        "--data-parallel",
        action="store_true",
        help="train data-parallel over this process's devices: one shard of whole episodes "
        "per device, gradients averaged across them",
    )
    _add_distributed_and_model(
        train,
        "(as for sweep): the data is split over every process's devices and gradients "
        "averaged across them; process 0 writes the outputs and logs to MLflow",
        "every run is judged against the logged operation on the held-out episodes "
        "(report.json's verdict, MLflow)",
    )
    train.set_defaults(handler=command_train)


def _add_sweep(commands: argparse._SubParsersAction) -> None:
    """Adds the ``sweep`` command."""
    sweep = commands.add_parser(
        "sweep",
        help="train a grid of hyperparameters x seeds as one program and keep the best "
        "configuration, chosen without the plant",
    )
    sweep.add_argument(
        "--config",
        "-c",
        action="append",
        metavar="YAML",
        help="a configuration file (its sweep: grid: section is read too)",
    )
    sweep.add_argument(
        "--set", action="append", metavar="FIELD=VALUE", help="override a field, as for train"
    )
    sweep.add_argument(
        "--grid",
        action="append",
        metavar="KEY=[VALUES]",
        help="values of one swept setting, e.g. algorithm.hyperparameters.alpha=[1,2.5,5] "
        "or training.seeds=[0,1,2,3,4]; repeat for a grid",
    )
    _add_distributed_and_model(
        sweep,
        "(the coordinator from NEORL_INDUSTRIAL_COORDINATOR=host:port, "
        "NEORL_INDUSTRIAL_NUM_PROCESSES and NEORL_INDUSTRIAL_PROCESS_ID or "
        "JOB_COMPLETION_INDEX): the runs are laid over every process's devices; process 0 "
        "writes the outputs and logs to MLflow",
        "every configuration's runs are judged against the logged operation on the "
        "held-out episodes",
    )
    sweep.set_defaults(handler=command_sweep)


def _add_distributed_and_model(
    parser: argparse.ArgumentParser, distributed: str, judged: str
) -> None:
    """``--distributed`` (``distributed`` says how) and ``--plant-model`` (``judged``
    says what it judges) of ``train`` and ``sweep``."""
    parser.add_argument(
        "--distributed",
        action="store_true",
        help=f"one of several processes of JAX's distributed runtime {distributed}",
    )
    parser.add_argument(
        "--plant-model",
        metavar="DIR",
        help=f"a plant model of the run's log (model fit): {judged}",
    )


def _add_evaluate(commands: argparse._SubParsersAction) -> None:
    """Adds the ``evaluate`` command."""
    evaluate = commands.add_parser(
        "evaluate",
        help="evaluate a saved agent in its simulator, or off policy (FQE) from logged data",
    )
    evaluate.add_argument(
        "agent",
        help="a saved agent's directory, or a registered model (models:/ib-policy@champion)",
    )
    evaluate.add_argument("--episodes", type=positive_int, default=100)
    evaluate.add_argument("--horizon", type=positive_int, default=None)
    evaluate.add_argument("--no-shield", action="store_true", help="do not shield the actions")
    evaluate.add_argument("--seed", type=int, default=1)
    evaluate.add_argument("--json", help="also write the metrics to this JSON file")
    evaluate.add_argument(
        "--ope",
        metavar="DATASET",
        help="estimate return and costs by FQE from this logged dataset (episodes the "
        "agent was not trained on); beside the simulator's numbers when there is one",
    )
    evaluate.add_argument("--schema", help="the YAML schema of a plant log given to --ope")
    evaluate.add_argument(
        "--ope-updates", type=positive_int, default=2000, help="FQE updates per FQE seed"
    )
    evaluate.add_argument(
        "--plant-model",
        metavar="DIR",
        help="with --ope: a plant model of that log (model fit); the runs are judged against "
        "the logged operation by the model, FQE and both, and recommended only with the "
        "evidence (else: keep the current operation)",
    )
    evaluate.set_defaults(handler=command_evaluate)


def _add_export(commands: argparse._SubParsersAction) -> None:
    """Adds the ``export`` command."""
    export = commands.add_parser(
        "export", help="export a saved agent's policy as a self-contained artifact"
    )
    export.add_argument(
        "agent",
        help="a run's or sweep's directory, a saved agent's, or a registered model "
        "(models:/ib-policy@champion)",
    )
    export.add_argument("--out", required=True, help="the artifact's directory")
    export.add_argument(
        "--candidate",
        metavar="NAME",
        help="which policy: seed<s> of a training run, config<c>-seed<s> of a sweep (or the "
        "name a verdict gives it, e.g. 'run 1 (seed 1)' or 'iql-sweep/config3-seed0'); "
        "default: the one the run selected (with a plant model: the verdict's first)",
    )
    export.add_argument("--overwrite", action="store_true")
    export.add_argument(
        "--format", choices=("jax", "onnx"), default="jax",
        help="jax: the serialized JAX functions; onnx: those and policy.onnx, the same policy, "
        "normalizer, action scaling and shield as one ONNX graph (opset 18, any batch size) "
        "for ONNX Runtime and edge runtimes (needs the onnx extra)",
    )  # fmt: skip
    export.add_argument(
        "--sign-key", metavar="PATH",
        help="an Ed25519 private key (keys generate) to sign it with (default: "
        "keys/policy-signing.key if present)",
    )  # fmt: skip
    export.set_defaults(handler=command_export)


def _add_verdict(commands: argparse._SubParsersAction) -> None:
    """Adds the ``verdict`` command."""
    verdict = commands.add_parser(
        "verdict",
        help="one verdict over every candidate of several runs and sweeps (every saved seed "
        "and configuration) against the logged operation, with a plant model",
    )
    verdict.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="a directory train or sweep wrote (or its agent/); candidates are named "
        "<run>/seed<s> and <run>/config<c>-seed<s>",
    )
    verdict.add_argument(
        "--plant-model", required=True, metavar="DIR", help="a plant model of the runs' log"
    )
    verdict.add_argument(
        "--data", metavar="DATASET", help="the runs' log (default: the first run's data.path)"
    )
    verdict.add_argument("--schema", help="the YAML schema of a plant log given to --data")
    verdict.add_argument(
        "--out", metavar="DIR", help="where report.json goes (default: verdicts/verdict-<time>)"
    )
    verdict.add_argument(
        "--ope-updates", type=positive_int, default=None, help="FQE updates per FQE seed"
    )
    verdict.add_argument(
        "--no-tracking", action="store_true", help="no MLflow run, even if the first run is tracked"
    )
    verdict.set_defaults(handler=command_verdict)
