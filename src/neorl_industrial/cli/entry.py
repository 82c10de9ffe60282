"""The root parser, assembled from the command groups, and ``main``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from rich.markup import escape

from neorl_industrial.cli import (
    audit,
    bench,
    bridge,
    datasets,
    environments,
    keys,
    models,
    plant_model,
    serving,
    training,
)
from neorl_industrial.cli.common import make_console
from neorl_industrial.cli.runtime import enable_compilation_cache
from neorl_industrial.extras import MissingExtraError

# In the order the help lists the commands.
_COMMAND_GROUPS = (
    training.add_parsers,
    bench.add_parsers,
    models.add_model_parsers,
    plant_model.add_parsers,
    serving.add_parsers,
    bridge.add_parsers,
    models.add_mlflow_parsers,
    environments.add_parsers,
    datasets.add_parsers,
    keys.add_parsers,
    audit.add_parsers,
)


def build_parser() -> argparse.ArgumentParser:
    """The ``neorl-industrial`` parser with every command."""
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
    for add_parsers in _COMMAND_GROUPS:
        add_parsers(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status (2 for an error of the input)."""
    args = build_parser().parse_args(argv)
    if not args.no_cache:
        enable_compilation_cache()
    try:
        return args.handler(args)
    except (ValueError, FileExistsError, FileNotFoundError) as error:
        # Every error of ours is one of these (pydantic's, the registry's and the spool's
        # are ValueErrors); its message names what is wrong.
        # One line, unwrapped: what is wrong and what to do, greppable in a service's log.
        make_console(stderr=True).print(f"[red]error:[/red] {escape(str(error))}", soft_wrap=True)
        return 2
    except (PermissionError, IsADirectoryError, NotADirectoryError) as error:
        # A path given that cannot be read or written as asked: its name and why, one line.
        make_console(stderr=True).print(f"[red]error:[/red] {escape(str(error))}", soft_wrap=True)
        return 2
    except RecursionError:
        # A file nested deeper than any this project writes (JSON, YAML): refused, one line.
        # The readers of manifests, signatures and logs bound their depth by name; this is
        # the net under any other reader.
        make_console(stderr=True).print(
            "[red]error:[/red] an input is nested too deeply to read (a hostile or broken file)",
            soft_wrap=True,
        )
        return 2
    except ModuleNotFoundError as error:
        # A package of an extra the install lacks: one line naming the extra to install.
        missing = MissingExtraError.from_error(error)
        if missing is None:
            raise
        make_console(stderr=True).print(f"[red]error:[/red] {escape(str(missing))}", soft_wrap=True)
        return 2
