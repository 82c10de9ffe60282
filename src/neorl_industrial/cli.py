"""The ``neorl-industrial`` command line.

``neorl-industrial run`` is the main job: it exercises the platform end to end on its
built-in defaults and prints a short report. ``envs`` lists the registered environments
and ``rollout`` runs batched rollouts of one of them.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from rich.console import Console
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
    console = _console()
    console.print(
        f"[bold]neorl_industrial[/bold] main job on {jax.default_backend()} "
        f"({len(jax.devices())} device(s))"
    )
    reports = [
        run_rollouts(env_id, policy, args.n_envs, args.n_steps, args.seed)
        for env_id in ("IB-v0", "IB-nonstationary-v0", "IB-discrete-v0")
        for policy in POLICIES
    ]
    env, _ = make("IB-v0")
    console.print(_report_table(reports, env.cost_names))
    hold = next(r for r in reports if r.env_id == "IB-v0" and r.policy == "hold")
    rand = next(r for r in reports if r.env_id == "IB-v0" and r.policy == "random")
    console.print(
        f"Holding the initial setting earns {hold.mean_return:,.0f} per episode against "
        f"{rand.mean_return:,.0f} for random actions; random actions break the default "
        f"limits on {rand.mean_episode_cost.sum():.0f} steps per episode, holding on "
        f"{hold.mean_episode_cost.sum():.0f}."
    )
    total_steps = sum(r.n_envs * r.n_steps for r in reports)
    console.print(f"{total_steps:,} environment steps simulated.")
    return 0


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

    run = commands.add_parser("run", help="run the main job end to end and print a report")
    run.add_argument("--n-envs", type=_positive_int, default=256, help="environments per rollout")
    run.add_argument("--n-steps", type=_positive_int, default=2000, help="steps per environment")
    run.add_argument("--seed", type=int, default=0)
    run.set_defaults(handler=command_run)

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
        _console(stderr=True).print(f"[red]error:[/red] {error}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
