"""``audit verify``: check a policy server's audit log as one hash chain.

Exit status: 0 intact, 1 broken (the first bad file and line named), 2 bad usage (no such
log, an anchor that is not a SHA-256). An intact log prints its head hash: keep it
somewhere the server cannot write (a ticket, another machine) and pass it back with
``--anchor`` next time, which also catches a log rewritten whole with fresh hashes.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from rich.markup import escape

from neorl_industrial.cli.common import add_command_group, make_console, non_negative_int

_SHA256 = re.compile(r"[0-9a-f]{64}")


def _sha256(text: str) -> str:
    """An argparse type: a SHA-256 in hex (64 lowercase hex digits)."""
    value = text.strip().lower()
    if not _SHA256.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"expected a head hash as printed by 'audit verify' (64 hex digits), got {text!r}"
        )
    return value


def command_audit_verify(args: argparse.Namespace) -> int:
    from neorl_industrial.integration.safety.audit import check_chain

    log = Path(args.log)
    if not log.is_file():
        raise FileNotFoundError(f"{log}: no such audit log (the file the server writes)")
    result = check_chain(log, anchor=args.anchor, since_file=args.since_file)
    console = make_console()
    files = len(result.files)
    if not result.ok:
        console.print(f"[red]broken:[/red] {escape(result.message or '')}", soft_wrap=True)
        console.print(f"{result.records} records verified before it, in {files} files")
        return 1
    console.print(f"intact: {result.records} records in {files} files", soft_wrap=True)
    for note in result.notes:
        console.print(f"note: {escape(note)}", soft_wrap=True)
    console.print(f"head (keep it elsewhere, pass it as --anchor): {result.head}", soft_wrap=True)
    return 0


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """Adds ``audit verify`` to the command line."""
    actions = add_command_group(commands, "audit", "the policy server's audit log of overrides")
    verify = actions.add_parser(
        "verify",
        help="check the log, its rotated and archived files and its anchor as one hash "
        "chain; exit 0 intact, 1 broken, 2 bad usage",
    )
    verify.add_argument("log", help="the audit log the server writes (e.g. audit.jsonl)")
    verify.add_argument(
        "--anchor",
        type=_sha256,
        help="a head hash printed by an earlier verification: it must still be in the chain",
    )
    verify.add_argument(
        "--since-file",
        type=non_negative_int,
        default=0,
        help="the oldest file that must be present (older ones were shipped elsewhere)",
    )
    verify.set_defaults(handler=command_audit_verify)
