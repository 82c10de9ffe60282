"""``keys generate``: the Ed25519 key pair that signs exported policies."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from neorl_industrial.cli.common import add_command_group, make_console


def command_keys_generate(args: argparse.Namespace) -> int:
    from neorl_industrial.wrappers.agents.signing import (
        PUBLIC_KEY,
        generate_key_pair,
        load_public_keys,
    )

    private = generate_key_pair(args.out, overwrite=args.overwrite)
    public = private.parent / PUBLIC_KEY
    (fingerprint,) = load_public_keys([public])
    console = make_console()
    console.print(f"Private key (keep it secret, mode 0600): {private}")
    console.print(
        f"Public key (give it to servers: serve --trusted-key, NEORL_SERVE_TRUSTED_KEYS; a "
        f"server started beside keys/ trusts keys/policy-signing.pub): {public}"
    )
    console.print(f"Fingerprint: {fingerprint}", soft_wrap=True)
    return 0


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """Adds ``keys generate`` to the command line."""
    actions = add_command_group(commands, "keys", "keys that sign exported policies")
    generate = actions.add_parser(
        "generate", help="write a new Ed25519 key pair (private key 0600, public key PEM)"
    )
    generate.add_argument("--out", required=True, help="the directory of the key pair")
    generate.add_argument("--overwrite", action="store_true", help="replace an existing pair")
    generate.set_defaults(handler=command_keys_generate)


def signing_key(config: Any, console: Any) -> Path | None:
    """The private key that signs a run's policy (``config.export``: made first when
    asked), or None.

    Raises:
        AgentError: for a key directory without a private key and ``create_keys`` off.
    """
    from neorl_industrial.wrappers.agents.agent import AgentError
    from neorl_industrial.wrappers.agents.signing import PRIVATE_KEY, generate_key_pair

    section = config.export
    if section.signing_keys is None:
        if console is not None:
            console.print(
                "[yellow]warning:[/yellow] export.signing_keys is null: the policy is exported "
                "unsigned; servers that require signatures refuse it and the registry never "
                "promotes it"
            )
        return None
    key = Path(section.signing_keys) / PRIVATE_KEY
    if not key.exists():
        if not section.create_keys:
            raise AgentError(
                f"export.signing_keys: no {PRIVATE_KEY} in {section.signing_keys}; make one "
                f"with `neorl-industrial keys generate --out {section.signing_keys}`"
            )
        try:
            generate_key_pair(section.signing_keys)
        except FileExistsError:
            return key  # another run made the pair meanwhile; it signs with that one
        if console is not None:
            console.print(
                f"Made a policy-signing key pair in {section.signing_keys}/ (the private key "
                "is readable by you only; servers trust the .pub)"
            )
    return key
