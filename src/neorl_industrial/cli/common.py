"""What several command groups share: the console, argument types, saved agents, a
service's log on stderr."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console


def make_console(stderr: bool = False) -> Console:
    # Reports are wider than the 80 columns rich assumes when output is not a terminal.
    return Console(stderr=stderr, width=max(Console().width, 132))


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    return _int_at_least(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """An argparse type: an integer of at least 0."""
    return _int_at_least(text, 0, "an integer >= 0")


def _int_at_least(text: str, minimum: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
    return value


def agent_dir(value: str) -> Path:
    """A saved agent's directory, or the agent inside a registered model's URI."""
    from neorl_industrial.integration.mlflow.registry import is_model_uri, resolve_agent_dir

    if not is_model_uri(value):
        return Path(value)
    from neorl_industrial.integration.mlflow.tracking import resolve_tracking_uri

    return resolve_agent_dir(value, resolve_tracking_uri())


class StderrHandler(logging.StreamHandler):
    """A log handler that writes to whatever ``sys.stderr`` is when it writes: a process
    that runs commands more than once, or replaces its stderr (a test's capture, a
    service manager), keeps its messages instead of writing to a closed stream."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def add_command_group(
    commands: argparse._SubParsersAction, name: str, help: str
) -> argparse._SubParsersAction:
    """The command ``name`` whose own subcommand is required (``neorl-industrial <name>
    <subcommand>``, the one chosen in ``args.<name>_command``); its subcommands are added
    to what this returns."""
    group = commands.add_parser(name, help=help)
    return group.add_subparsers(dest=f"{name}_command", required=True)


#: ``--tracking-uri``'s help where a command has nothing to add to it.
TRACKING_URI_HELP = "the MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)"


def add_tracking_uri(parser: argparse.ArgumentParser, help: str = TRACKING_URI_HELP) -> None:
    """``--tracking-uri``: the MLflow store a command reads or writes (``help`` says
    which, and its default)."""
    parser.add_argument("--tracking-uri", help=help)


def add_signature_trust(
    parser: argparse.ArgumentParser,
    *,
    trusted: str,
    unsigned: str,
    key_type: Callable[[str], Any] = str,
) -> None:
    """``--trusted-key`` (repeatable: the public keys whose signatures a policy's must
    verify against, as ``trusted`` says) and ``--allow-unsigned`` (what ``unsigned`` says
    a policy without a trusted signature may still do), read as ``key_type``."""
    parser.add_argument(
        "--trusted-key", action="append", type=key_type, metavar="PUB", help=trusted
    )
    parser.add_argument("--allow-unsigned", action="store_true", help=unsigned)


def add_log_level(parser: argparse.ArgumentParser) -> None:
    """``--log-level``: how much of its own log a long-running command writes (the level
    ``log_to_stderr`` is given)."""
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning"))


def log_to_stderr(name: str, level: str, line_format: str) -> None:
    """The logger ``name`` on stderr at ``level`` (a ``--log-level`` choice), its lines in
    ``line_format``; the handler is added once, however often a command runs in this
    process, and the lines do not reach the root logger's handlers too."""
    log = logging.getLogger(name)
    if not log.handlers:
        handler = StderrHandler()
        handler.setFormatter(logging.Formatter(line_format))
        log.addHandler(handler)
        log.propagate = False
    log.setLevel(level.upper())
