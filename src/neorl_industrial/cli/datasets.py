"""``datasets generate|inspect|import|train-policies``."""

from __future__ import annotations

import argparse
import os
import stat
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from neorl_industrial.cli.common import add_command_group, make_console, positive_int
from neorl_industrial.core.environments import registered_envs

#: Where ``datasets generate`` writes without ``--out``.
DEFAULT_ROOT = "datasets"


def command_datasets_generate(args: argparse.Namespace) -> int:
    from neorl_industrial.integration.datasets import SIZES, generate_dataset, save_native

    n_trajectories = args.trajectories or SIZES[args.size]
    if args.out and Path(args.out).exists() and not args.overwrite:
        raise FileExistsError(f"{args.out}: already exists; pass --overwrite to replace it")
    console = make_console()
    # Before generating (minutes): what earlier runs killed while writing left behind.
    _clear_stale_staging(Path(args.out).parent if args.out else Path(DEFAULT_ROOT), console)
    started = time.perf_counter()
    dataset, card = generate_dataset(args.env, args.quality, n_trajectories, seed=args.seed)
    elapsed = time.perf_counter() - started
    out = args.out or f"{DEFAULT_ROOT}/{card.name}-seed{args.seed}"
    card = save_native(dataset, out, card, overwrite=args.overwrite)
    console.print(
        f"Wrote {dataset.n_transitions:,} transitions ({dataset.n_episodes} episodes) to {out} "
        f"in {elapsed:.1f} s; mean episode return {card.behaviour_policy.mean_return:,.6g}"
    )
    return 0


def _require_readable(path: str, schema: str | None) -> None:
    """Refuses at once a dataset that is neither a regular file nor a directory, and a
    schema that is not a regular file: reading a FIFO or a device would block (or never
    end) instead of failing."""
    from neorl_industrial.integration.datasets import DatasetFormatError
    from neorl_industrial.integration.datasets.plant_schema import require_regular_file
    from neorl_industrial.wrappers.hostio import file_kind

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise DatasetFormatError("no such dataset file or directory", path=path) from None
    except OSError as error:
        raise DatasetFormatError(f"cannot read the dataset: {error.strerror}", path=path) from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise DatasetFormatError(
            f"a {file_kind(mode)}, not a regular file or directory; a dataset is read from one "
            "(nothing was read)",
            path=path,
        )
    if schema is not None:
        require_regular_file(schema, "plant-log schema")


def command_datasets_inspect(args: argparse.Namespace) -> int:
    from neorl_industrial.integration.datasets import inspect_dataset

    _require_readable(args.path, args.schema)
    summary = inspect_dataset(args.path, schema=args.schema)
    table = Table(title=str(args.path), show_header=False)
    for name, value in _flatten(summary):
        table.add_row(name, str(value))
    make_console().print(table)
    return 0


def command_datasets_import(args: argparse.Namespace) -> int:
    from neorl_industrial.integration.datasets import load_any, save_native

    _require_readable(args.path, args.schema)
    console = make_console()
    _clear_stale_staging(Path(args.out).parent, console)
    dataset, card = load_any(args.path, schema=args.schema, missing=args.missing)
    save_native(dataset, args.out, card, overwrite=args.overwrite)
    console.print(
        f"Imported {dataset.n_transitions:,} transitions ({dataset.n_episodes} episodes) "
        f"from {args.path} into {args.out}"
    )
    return 0


def command_datasets_train_policies(args: argparse.Namespace) -> int:
    from neorl_industrial.functional.transformations.online import OnlineConfig
    from neorl_industrial.integration.datasets import train_behaviour_policies
    from neorl_industrial.integration.datasets.factory import POLICY_ROOT, TRAINING_PLANS

    console = make_console()

    def progress(chunk: int, metrics: dict[str, float]) -> None:
        shown = ", ".join(f"{k} {v:,.3g}" for k, v in metrics.items() if isinstance(v, float))
        console.print(f"chunk {chunk}: {shown}")

    # Flags override the budget the id's shipped policies were trained with.
    flags = {"total_env_steps": args.env_steps, "eval_every": args.eval_every}
    budget = dict(TRAINING_PLANS.get(args.env, {}))
    budget.update({name: value for name, value in flags.items() if value is not None})
    online = OnlineConfig(**budget, seed=args.seed)
    policies = train_behaviour_policies(
        args.env, version=args.version, seed=args.seed, online=online, progress=progress
    )
    path = policies.save(args.out or POLICY_ROOT, overwrite=args.overwrite)
    for quality, value in policies.returns_per_step.items():
        console.print(f"{quality:>7}: {value:,.4g} per step")
    console.print(f"Saved behaviour policies to {path}")
    return 0


def _clear_stale_staging(directory: Path, console: Console) -> None:
    from neorl_industrial.integration.datasets.native import (
        clear_stale_staging,
        stale_staging_message,
    )

    removed = clear_stale_staging(directory, warn=False)
    if removed:
        console.print(escape(stale_staging_message(directory.absolute(), removed)))


def _flatten(mapping: dict, prefix: str = ""):
    for key, value in mapping.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """Adds ``datasets`` and its commands to the command line."""
    datasets_commands = add_command_group(
        commands, "datasets", "generate, inspect and import datasets"
    )
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
    size.add_argument("--trajectories", type=positive_int, help="number of trajectories")
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
    convert.add_argument(
        "--missing",
        choices=("error", "drop", "split"),
        default=None,
        help="rows of a plant log with a missing or infinite value: refuse the file "
        "(error), drop them (drop), or drop them and start a new episode there (split); "
        "default: the schema's 'missing' (error)",
    )
    convert.set_defaults(handler=command_datasets_import)

    train = datasets_commands.add_parser(
        "train-policies", help="train versioned behaviour policies with SAC"
    )
    train.add_argument("--env", default="IB-v0", choices=sorted(registered_envs()))
    train.add_argument("--version", default="v1")
    train.add_argument(
        "--env-steps",
        type=positive_int,
        help="environment steps of training (default: the budget of the shipped policies)",
    )
    train.add_argument(
        "--eval-every",
        type=positive_int,
        help="env steps between evaluations (snapshots to pick qualities from); default: "
        "as for the shipped policies",
    )
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--out", help="root directory (default: the package's own)")
    train.add_argument("--overwrite", action="store_true")
    train.set_defaults(handler=command_datasets_train_policies)
