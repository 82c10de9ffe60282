"""What several command groups share: the console, argument types, saved agents."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console


def make_console(stderr: bool = False) -> Console:
    # Reports are wider than the 80 columns rich assumes when output is not a terminal.
    return Console(stderr=stderr, width=max(Console().width, 132))


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def agent_dir(value: str) -> Path:
    """A saved agent's directory, or the agent inside a registered model's URI."""
    from neorl_industrial.integration.mlflow.registry import is_model_uri, resolve_agent_dir

    if not is_model_uri(value):
        return Path(value)
    from neorl_industrial.integration.mlflow.tracking import resolve_tracking_uri

    return resolve_agent_dir(value, resolve_tracking_uri())
