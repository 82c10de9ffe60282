"""The ``neorl-industrial`` command line.

``run`` is the main job: it generates a small Industrial Benchmark dataset, trains a safe
agent (TD3BC-Lag, three seeds at once), evaluates it with the shield, saves and exports
the policy and prints what happened and where the results are. ``train`` runs any
configuration (``configs/``), ``evaluate`` and ``export`` work on saved agents,
``datasets`` generates, inspects and imports data, ``envs`` and ``rollout`` show the
environments, ``bench`` runs a benchmark of ``benchmarks/``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from neorl_industrial.core.environments import (
    constant_policy,
    make,
    registered_envs,
    rollout,
    uniform_random_policy,
)
from neorl_industrial.runtime import enable_compilation_cache

POLICIES = ("random", "hold")


@dataclass
class RolloutReport:
    env_id: str
    policy: str
    n_envs: int
    n_steps: int
    episodes: int
    mean_return: float
    mean_episode_cost: np.ndarray
    invalid_actions: int
    compile_seconds: float
    run_seconds: float

    @property
    def steps_per_second(self) -> float:
        return self.n_envs * self.n_steps / self.run_seconds


def _policy(env, name: str):
    if name == "random":
        return uniform_random_policy(env)
    if name == "hold":
        hold = jnp.asarray(13) if env.discrete else jnp.zeros(env.action_size)
        return constant_policy(hold)
    raise ValueError(f"policy: unknown policy {name!r}; expected one of {POLICIES}")


def run_rollouts(
    env_id: str, policy_name: str, n_envs: int, n_steps: int, seed: int, **overrides
) -> RolloutReport:
    """Runs a batched rollout and measures it (compile and run separately)."""
    env, params = make(env_id, **overrides)
    policy = _policy(env, policy_name)
    run = jax.jit(lambda key: rollout(key, env, params, policy, n_envs, n_steps))
    key = jax.random.PRNGKey(seed)
    started = time.perf_counter()
    compiled = run.lower(key).compile()
    compiled_at = time.perf_counter()
    result = jax.block_until_ready(compiled(key))
    finished = time.perf_counter()
    return RolloutReport(
        env_id=env_id,
        policy=policy_name,
        n_envs=n_envs,
        n_steps=n_steps,
        episodes=int(result.episodes.sum()),
        mean_return=float(result.mean_episode_return()),
        mean_episode_cost=np.asarray(result.mean_episode_cost()),
        invalid_actions=int(result.invalid_actions.sum()),
        compile_seconds=compiled_at - started,
        run_seconds=finished - compiled_at,
    )


def _console(stderr: bool = False) -> Console:
    # Reports are wider than the 80 columns rich assumes when output is not a terminal.
    return Console(stderr=stderr, width=max(Console().width, 132))


def _report_table(reports: Sequence[RolloutReport], cost_names: Sequence[str]) -> Table:
    table = Table(title="Industrial Benchmark rollouts")
    for column in ("environment", "policy", "episodes", "mean return"):
        table.add_column(column, justify="left" if column in ("environment", "policy") else "right")
    for name in cost_names:
        table.add_column(f"{name} cost / episode", justify="right")
    table.add_column("steps/s", justify="right")
    table.add_column("compile s", justify="right")
    for r in reports:
        table.add_row(
            r.env_id,
            r.policy,
            str(r.episodes),
            f"{r.mean_return:,.0f}",
            *(f"{c:.1f}" for c in r.mean_episode_cost),
            f"{r.steps_per_second:,.0f}",
            f"{r.compile_seconds:.2f}",
        )
    return table


def command_run(args: argparse.Namespace) -> int:
    from neorl_industrial.pipeline import main_job_config

    overrides = list(args.set or [])
    if not any(item.startswith("name=") for item in overrides):
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        overrides.append(f"name=main-{stamp}")
    config = main_job_config(overrides)
    console = _console()
    console.print(
        f"[bold]neorl_industrial[/bold] main job on {jax.default_backend()} "
        f"({len(jax.devices())} device(s)): {config.algorithm.name} on a generated "
        f"{config.env.id} dataset, seeds {config.training.seeds}"
    )
    return _train_and_report(config, resume=False, console=console)


def command_train(args: argparse.Namespace) -> int:
    from neorl_industrial.wrappers.training import RunConfig

    config = RunConfig.from_files(list(args.config or []), list(args.set or []))
    console = _console()
    console.print(
        f"[bold]training[/bold] {config.algorithm.name} on {config.env.id} "
        f"({config.data.path or 'generated data'}), seeds {config.training.seeds} "
        f"-> {config.run_dir}"
    )
    return _train_and_report(config, resume=args.resume, console=console)


def _train_and_report(config, *, resume: bool, console: Console) -> int:
    from neorl_industrial.pipeline import run_training
    from neorl_industrial.wrappers.training import RichProgress

    started = time.perf_counter()
    outcome = run_training(
        config,
        resume=resume,
        callbacks=[RichProgress(console, metrics=("critic_loss",))],
        console=console,
    )
    report = outcome.report
    console.print(_summary_table(report))
    data, training = report["data"], report["training"]
    rate = training["updates_per_s"]
    console.print(
        f"Data: {data['transitions']:,} transitions in {data['episodes']} episodes "
        f"({data['source']}), mean episode return {data['mean_episode_return']:,.0f}."
    )
    console.print(
        f"Training: {training['updates']:,} updates x {len(training['seeds'])} seeds in "
        f"{training['seconds']:.1f} s"
        + (f" ({rate:,.0f} updates/s over all seeds after compilation)" if rate else "")
        + (f", resumed from {training['resumed_from']:,}" if training["resumed_from"] else "")
        + ("; stopped early" if training["stopped_early"] else "")
        + "."
    )
    outputs = report["outputs"]
    console.print(f"Agent: {outputs['agent']}  (Agent.load)")
    if outputs["policy"]:
        console.print(f"Policy: {outputs['policy']}  (served without training code)")
    if outputs["checkpoints"]:
        console.print(f"Checkpoints: {outputs['checkpoints']}")
    console.print(f"Report: {outcome.run_dir / 'report.json'}")
    tracking = report.get("tracking")
    if tracking:
        _print_tracking(console, tracking)
    console.print(f"Done in {time.perf_counter() - started:.1f} s.")
    return 0


def _print_tracking(console: Console, tracking: dict) -> None:
    run = tracking.get("run_id") or "not created (see the spool)"
    console.print(
        f"MLflow: run {run} in experiment {tracking['experiment']!r} at {tracking['uri']}"
    )
    model = tracking.get("model")
    if model and model.get("version"):
        line = f"Model: {model['uri']} registered"
        if "promoted" in model:
            verdict = "promoted to @champion" if model["promoted"] else "not promoted"
            line += f"; {verdict}: {model['reason']}"
        console.print(escape(line))
    if tracking.get("spooled"):
        console.print(
            f"[yellow]{tracking['spooled']} MLflow call(s) could not be sent; they are in "
            f"{tracking['spool']}: replay with `neorl-industrial mlflow replay "
            f"{tracking['spool']}`[/yellow]"
        )
    console.print(f"Open the MLflow UI: {tracking['ui']}")


def _summary_table(report: dict) -> Table:
    table = Table(title=f"{report['algorithm']} on {report['env']}: best evaluation of each run")
    for column in (
        "run",
        "seed",
        "updates",
        "return",
        "score",
        "normalized cost",
        "violations",
        "shield overrides",
        "hard violations",
    ):
        table.add_column(column, justify="right")
    references = report["data"].get("references")
    for i, best in enumerate(report["best"]):
        if best is None:
            continue
        metrics = best["metrics"]
        score = "-"
        if references:
            span = references["expert"] - references["random"]
            score = f"{100 * (metrics['return'] - references['random']) / span:.1f}"
        cost = metrics.get("normalized_cost")
        table.add_row(
            f"{i}{' *' if i == report['selected_run'] else ''}",
            str(report["training"]["seeds"][i]),
            f"{best['updates']:,}",
            f"{metrics['return']:,.0f}",
            score,
            "-" if cost is None else f"{cost:.2f}",
            f"{100 * metrics['violation_rate']:.0f} %",
            f"{100 * metrics['override_rate']:.1f} %",
            str(metrics["hard_violation_steps"]),
        )
    table.caption = (
        "* the run the agent predicts with. Score: 100 (R - random) / (expert - random); "
        "normalized cost: mean episode cost / limit (<= 1 keeps the limit); hard "
        "violations: steps whose applied action broke a hard constraint."
    )
    return table


def _agent_dir(value: str) -> Path:
    """A saved agent's directory, or the agent inside a registered model's URI."""
    from neorl_industrial.integration.mlflow.registry import is_model_uri, resolve_agent_dir

    if not is_model_uri(value):
        return Path(value)
    from neorl_industrial.integration.mlflow.tracking import resolve_tracking_uri

    return resolve_agent_dir(value, resolve_tracking_uri())


def command_evaluate(args: argparse.Namespace) -> int:
    from neorl_industrial.wrappers.agents import Agent

    agent = Agent.load(_agent_dir(args.agent))
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
    console = _console()
    console.print(table)
    summary = result["summary"]["return"]
    ci = f" ± {summary['ci']:,.0f}" if summary["ci"] is not None else ""
    console.print(f"Mean return over runs: {summary['mean']:,.0f}{ci} (95 % CI)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
        console.print(f"Wrote {args.json}")
    return 0


def command_export(args: argparse.Namespace) -> int:
    from neorl_industrial.wrappers.agents import Agent

    agent = Agent.load(_agent_dir(args.agent))
    path = agent.export(args.out, overwrite=args.overwrite)
    _console().print(f"Exported the policy of {args.agent} ({agent.name}) to {path}")
    return 0


def _registry_client(uri: str | None):
    from mlflow import MlflowClient

    from neorl_industrial.integration.mlflow.sender import quiet_http_retries
    from neorl_industrial.integration.mlflow.tracking import resolve_tracking_uri

    quiet_http_retries()
    uri = resolve_tracking_uri(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri), uri


def command_models_list(args: argparse.Namespace) -> int:
    from neorl_industrial.integration.mlflow.registry import list_versions

    client, uri = _registry_client(args.tracking_uri)
    names = [args.name] if args.name else sorted(m.name for m in client.search_registered_models())
    console = _console()
    if not names:
        console.print(f"No registered models at {uri}.")
        return 0
    for name in names:
        table = Table(title=f"{name} at {uri}")
        for column in (
            "version",
            "aliases",
            "env",
            "algorithm",
            "return",
            "normalized cost",
            "safe",
            "run",
            "promotion",
        ):
            table.add_column(column)
        for version in list_versions(client, name):
            cost = version.metrics.get("normalized_cost")
            ret = version.ret
            tags = client.get_model_version(name, version.version).tags or {}
            table.add_row(
                version.version,
                ", ".join(version.aliases),
                version.env or "-",
                version.algorithm or "-",
                "-" if ret is None else f"{ret:,.0f}",
                "-" if cost is None else f"{cost:.2f}",
                "yes" if version.safe else "no",
                (version.run_id or "-")[:8],
                escape(tags.get("promotion.reason", "")),
            )
        console.print(table)
    return 0


def command_models_promote(args: argparse.Namespace) -> int:
    from neorl_industrial.integration.mlflow.registry import promote

    client, _ = _registry_client(args.tracking_uri)
    decision = promote(client, args.name, args.version, force=args.force)
    verdict = (
        f"promoted version {decision.candidate.version} to @champion"
        if decision.promoted
        else f"kept the champion; version {decision.candidate.version} not promoted"
    )
    _console().print(escape(f"{args.name}: {verdict}: {decision.reason}"))
    return 0 if decision.promoted or not args.check else 1


def command_models_export(args: argparse.Namespace) -> int:
    import shutil

    from neorl_industrial.integration.mlflow.registry import resolve_policy_dir
    from neorl_industrial.wrappers.agents.artifact import PolicyArtifact

    _, uri = _registry_client(args.tracking_uri)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.overwrite:
        raise FileExistsError(f"{out}: already exists; pass --overwrite to replace it")
    source = resolve_policy_dir(args.model, uri)
    artifact = PolicyArtifact.load(source)  # verified before it is copied
    staging = out.with_name(f".{out.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging)
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    _console().print(f"Exported {args.model} ({artifact!r}) to {out}")
    return 0


def command_mlflow_replay(args: argparse.Namespace) -> int:
    from neorl_industrial.integration.mlflow.sender import quiet_http_retries, replay

    quiet_http_retries()
    summary = replay(args.spool, args.tracking_uri)
    _console().print(
        f"Replayed {summary.sent} MLflow call(s) from {args.spool} "
        f"(runs: {', '.join(summary.run_ids.values()) or 'none'})"
    )
    return 0


def command_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from neorl_industrial.integration.deployment import ServerSettings, create_app

    overrides = {
        key: value
        for key, value in (
            ("model", args.model),
            ("tracking_uri", args.tracking_uri),
            ("api_keys_file", args.api_keys_file),
            ("audit_log", args.audit_log),
        )
        if value is not None
    }
    if args.no_auth:
        overrides["auth"] = False
    settings = ServerSettings(tune_gc=True, **overrides)
    app = create_app(settings)
    _console(stderr=True).print(
        f"serving {settings.model} on http://{args.host}:{args.port} "
        f"(docs at /docs, metrics at /metrics)"
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    return 0


def command_bench(args: argparse.Namespace) -> int:
    try:
        from benchmarks.run import main as bench_main
    except ImportError:
        raise ValueError(
            "bench: the benchmarks live in the source tree's benchmarks/ folder; run this "
            "command from the repository root"
        ) from None
    return int(bench_main([args.name, *args.args]) or 0)


def command_envs(_args: argparse.Namespace) -> int:
    table = Table(title="Registered environments")
    for column in ("id", "observation", "action", "costs", "description"):
        table.add_column(column)
    for env_id, spec in registered_envs().items():
        env, _ = make(env_id)
        action = f"discrete({env.num_actions})" if env.discrete else f"box({env.action_size})"
        table.add_row(
            env_id, str(env.observation_size), action, ", ".join(env.cost_names), spec.description
        )
    _console().print(table)
    return 0


def command_rollout(args: argparse.Namespace) -> int:
    overrides = {}
    if args.setpoint is not None:
        overrides["setpoint"] = args.setpoint
    report = run_rollouts(args.env, args.policy, args.n_envs, args.n_steps, args.seed, **overrides)
    env, _ = make(args.env)
    _console().print(_report_table([report], env.cost_names))
    return 0


def command_datasets_generate(args: argparse.Namespace) -> int:
    from neorl_industrial.integration.datasets import SIZES, generate_dataset, save_native

    n_trajectories = args.trajectories or SIZES[args.size]
    if args.out and Path(args.out).exists() and not args.overwrite:
        raise FileExistsError(f"{args.out}: already exists; pass --overwrite to replace it")
    started = time.perf_counter()
    dataset, card = generate_dataset(args.env, args.quality, n_trajectories, seed=args.seed)
    elapsed = time.perf_counter() - started
    out = args.out or f"datasets/{card.name}-seed{args.seed}"
    card = save_native(dataset, out, card, overwrite=args.overwrite)
    console = _console()
    console.print(
        f"Wrote {dataset.n_transitions:,} transitions ({dataset.n_episodes} episodes) to {out} "
        f"in {elapsed:.1f} s; mean episode return {card.behaviour_policy.mean_return:,.0f}"
    )
    return 0


def command_datasets_inspect(args: argparse.Namespace) -> int:
    from neorl_industrial.integration.datasets import inspect_dataset

    summary = inspect_dataset(args.path, schema=args.schema)
    table = Table(title=str(args.path), show_header=False)
    for name, value in _flatten(summary):
        table.add_row(name, str(value))
    _console().print(table)
    return 0


def command_datasets_import(args: argparse.Namespace) -> int:
    from neorl_industrial.integration.datasets import load_any, save_native

    dataset, card = load_any(args.path, schema=args.schema)
    save_native(dataset, args.out, card, overwrite=args.overwrite)
    _console().print(
        f"Imported {dataset.n_transitions:,} transitions ({dataset.n_episodes} episodes) "
        f"from {args.path} into {args.out}"
    )
    return 0


def command_datasets_train_policies(args: argparse.Namespace) -> int:
    from neorl_industrial.functional.transformations.online import OnlineConfig
    from neorl_industrial.integration.datasets import train_behaviour_policies
    from neorl_industrial.integration.datasets.factory import POLICY_ROOT

    console = _console()

    def progress(chunk: int, metrics: dict[str, float]) -> None:
        shown = ", ".join(f"{k} {v:,.3g}" for k, v in metrics.items() if isinstance(v, float))
        console.print(f"chunk {chunk}: {shown}")

    online = OnlineConfig(
        total_env_steps=args.env_steps, eval_every=args.eval_every, seed=args.seed
    )
    policies = train_behaviour_policies(
        args.env, version=args.version, seed=args.seed, online=online, progress=progress
    )
    path = policies.save(args.out or POLICY_ROOT, overwrite=args.overwrite)
    for quality, value in policies.returns_per_step.items():
        console.print(f"{quality:>7}: {value:,.1f} per step")
    console.print(f"Saved behaviour policies to {path}")
    return 0


def _flatten(mapping: dict, prefix: str = ""):
    for key, value in mapping.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="neorl-industrial",
        description="Safe offline reinforcement learning for industrial control.",
    )
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="do not keep compiled programs on disk (see NEORL_INDUSTRIAL_JAX_CACHE)",
    )
    commands = parser.add_subparsers(dest="command", required=True)

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
    train.set_defaults(handler=command_train)

    evaluate = commands.add_parser("evaluate", help="evaluate a saved agent in its simulator")
    evaluate.add_argument(
        "agent",
        help="a saved agent's directory, or a registered model (models:/ib-policy@champion)",
    )
    evaluate.add_argument("--episodes", type=_positive_int, default=100)
    evaluate.add_argument("--horizon", type=_positive_int, default=None)
    evaluate.add_argument("--no-shield", action="store_true", help="do not shield the actions")
    evaluate.add_argument("--seed", type=int, default=1)
    evaluate.add_argument("--json", help="also write the metrics to this JSON file")
    evaluate.set_defaults(handler=command_evaluate)

    export = commands.add_parser(
        "export", help="export a saved agent's policy as a self-contained artifact"
    )
    export.add_argument(
        "agent",
        help="a saved agent's directory, or a registered model (models:/ib-policy@champion)",
    )
    export.add_argument("--out", required=True, help="the artifact's directory")
    export.add_argument("--overwrite", action="store_true")
    export.set_defaults(handler=command_export)

    bench = commands.add_parser(
        "bench", help="run a benchmark of benchmarks/ (from the repository root)"
    )
    bench.add_argument("name", help="the benchmark, e.g. env_throughput or shield_overhead")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="its own options")
    bench.set_defaults(handler=command_bench)

    models = commands.add_parser("models", help="registered policies in MLflow's registry")
    models_commands = models.add_subparsers(dest="models_command", required=True)
    tracking_help = "the MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)"
    listing = models_commands.add_parser("list", help="versions, aliases and evaluations")
    listing.add_argument("name", nargs="?", help="a registered model (default: all)")
    listing.add_argument("--tracking-uri", help=tracking_help)
    listing.set_defaults(handler=command_models_list)
    promoting = models_commands.add_parser(
        "promote",
        help="make a version the champion if it is safe and beats the champion's return",
    )
    promoting.add_argument("name", help="the registered model, e.g. ib-policy")
    promoting.add_argument("--version", help="the candidate (default: @challenger, else newest)")
    promoting.add_argument("--force", action="store_true", help="promote regardless of the rule")
    promoting.add_argument(
        "--check", action="store_true", help="exit with 1 when the candidate is not promoted"
    )
    promoting.add_argument("--tracking-uri", help=tracking_help)
    promoting.set_defaults(handler=command_models_promote)
    exporting = models_commands.add_parser(
        "export", help="copy a registered policy (models:/name@alias) to a directory"
    )
    exporting.add_argument("model", help="models:/ib-policy@champion, models:/ib-policy/3, ...")
    exporting.add_argument("--out", required=True, help="the policy artifact's directory")
    exporting.add_argument("--overwrite", action="store_true")
    exporting.add_argument("--tracking-uri", help=tracking_help)
    exporting.set_defaults(handler=command_models_export)

    serve = commands.add_parser(
        "serve", help="serve a policy over REST, every action through the shield"
    )
    serve.add_argument(
        "--model", help="an exported policy directory or models:/ib-policy@champion "
        "(default: $NEORL_SERVE_MODEL)",
    )  # fmt: skip
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=_positive_int, default=8000)
    serve.add_argument("--tracking-uri", help="the MLflow store of models:/ URIs")
    serve.add_argument("--api-keys-file", help="YAML/JSON: {act: [keys], admin: [keys]}")
    serve.add_argument("--audit-log", help="JSON Lines file of every override")
    serve.add_argument(
        "--no-auth", action="store_true", help="serve without API keys (closed networks only)"
    )
    serve.add_argument("--log-level", default="info", choices=("debug", "info", "warning"))
    serve.set_defaults(handler=command_serve)

    mlflow_parser = commands.add_parser("mlflow", help="MLflow tracking helpers")
    mlflow_commands = mlflow_parser.add_subparsers(dest="mlflow_command", required=True)
    replaying = mlflow_commands.add_parser(
        "replay", help="send the MLflow calls a run could not send (its spool file)"
    )
    replaying.add_argument("spool", help="a run's mlflow-spool.jsonl")
    replaying.add_argument("--tracking-uri", help="send them here instead of where they were for")
    replaying.set_defaults(handler=command_mlflow_replay)

    envs = commands.add_parser("envs", help="list the registered environments")
    envs.set_defaults(handler=command_envs)

    roll = commands.add_parser("rollout", help="batched rollouts of one environment")
    roll.add_argument("--env", default="IB-v0", choices=sorted(registered_envs()))
    roll.add_argument("--policy", default="random", choices=POLICIES)
    roll.add_argument("--n-envs", type=_positive_int, default=1024)
    roll.add_argument("--n-steps", type=_positive_int, default=1000)
    roll.add_argument("--setpoint", type=float, default=None)
    roll.add_argument("--seed", type=int, default=0)
    roll.set_defaults(handler=command_rollout)
    datasets = commands.add_parser("datasets", help="generate, inspect and import datasets")
    datasets_commands = datasets.add_subparsers(dest="datasets_command", required=True)
    generate = datasets_commands.add_parser(
        "generate", help="generate a NeoRL-style dataset with a behaviour policy"
    )
    generate.add_argument("--env", default="IB-v0", choices=sorted(registered_envs()))
    generate.add_argument(
        "--quality", default="medium", choices=("random", "low", "medium", "high", "expert")
    )
    size = generate.add_mutually_exclusive_group()
    size.add_argument(
        "--size",
        default="small",
        choices=("small", "medium", "large"),
        help="100, 1 000 or 10 000 trajectories",
    )
    size.add_argument("--trajectories", type=_positive_int, help="number of trajectories")
    generate.add_argument("--seed", type=int, default=0)
    generate.add_argument("--out", help="output directory (native format)")
    generate.add_argument("--overwrite", action="store_true")
    generate.set_defaults(handler=command_datasets_generate)

    inspect = datasets_commands.add_parser("inspect", help="summarize a dataset in any format")
    inspect.add_argument("path")
    inspect.add_argument("--schema", help="YAML schema of a CSV/Parquet plant log")
    inspect.set_defaults(handler=command_datasets_inspect)

    convert = datasets_commands.add_parser(
        "import", help="import NeoRL .npz, Minari or a plant log into the native format"
    )
    convert.add_argument("path")
    convert.add_argument("--schema", help="YAML schema of a CSV/Parquet plant log")
    convert.add_argument("--out", required=True, help="output directory (native format)")
    convert.add_argument("--overwrite", action="store_true")
    convert.set_defaults(handler=command_datasets_import)

    train = datasets_commands.add_parser(
        "train-policies", help="train versioned behaviour policies with SAC"
    )
    train.add_argument("--env", default="IB-v0", choices=sorted(registered_envs()))
    train.add_argument("--version", default="v1")
    train.add_argument("--env-steps", type=_positive_int, default=200_000)
    train.add_argument(
        "--eval-every",
        type=_positive_int,
        default=2400,
        help="env steps between evaluations (snapshots to pick qualities from)",
    )
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--out", help="root directory (default: the package's own)")
    train.add_argument("--overwrite", action="store_true")
    train.set_defaults(handler=command_datasets_train_policies)
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.no_cache:
        enable_compilation_cache()
    try:
        return args.handler(args)
    except (ValueError, FileExistsError, FileNotFoundError) as error:
        # Every error of ours is one of these (pydantic's, the registry's and the spool's
        # are ValueErrors); its message names what is wrong.
        _console(stderr=True).print(f"[red]error:[/red] {escape(str(error))}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
