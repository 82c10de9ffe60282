"""``models list|promote|export|register`` over MLflow's registry and ``mlflow replay``."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from neorl_industrial.cli.common import (
    add_command_group,
    add_signature_trust,
    add_tracking_uri,
    make_console,
)


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
    console = make_console()
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
    make_console().print(escape(f"{args.name}: {verdict}: {decision.reason}"))
    return 0 if decision.promoted or not args.check else 1


def command_models_export(args: argparse.Namespace) -> int:
    from neorl_industrial.integration.mlflow.registry import downloaded_policy_dir
    from neorl_industrial.wrappers.agents.artifact import MANIFEST, PolicyArtifact
    from neorl_industrial.wrappers.hostio import atomic_directory

    _, uri = _registry_client(args.tracking_uri)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.overwrite:
        raise FileExistsError(f"{out}: already exists; pass --overwrite to replace it")
    with downloaded_policy_dir(args.model, uri) as source:
        artifact = PolicyArtifact.load(source)  # verified before it is copied
        # All or nothing: the staging directory is removed on error too.
        with atomic_directory(
            out,
            overwrite=args.overwrite,
            replaceable=lambda existing: (existing / MANIFEST).is_file(),
            refusal=f"is not a policy artifact (no {MANIFEST})",
        ) as staging:
            for file in sorted(source.iterdir()):
                (staging / file.name).write_bytes(file.read_bytes())
    make_console().print(f"Exported {args.model} ({artifact!r}) to {out}")
    return 0


def command_models_register(args: argparse.Namespace) -> int:
    from neorl_industrial.integration.mlflow.registry import register_policy

    metrics: dict[str, float] = {}
    for item in args.metric or []:
        key, _, value = item.partition("=")
        try:
            metrics[key.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--metric {item!r}: expected NAME=NUMBER, e.g. return=42.5") from None
    _, uri = _registry_client(args.tracking_uri)
    result = register_policy(
        args.policy,
        args.name,
        uri,
        trusted_keys=args.trusted_key,
        allow_unsigned=args.allow_unsigned,
        metrics=metrics,
        promote_now=args.promote,
    )
    line = f"Registered {args.policy} as {result['uri']} (signature: {result['signature']})"
    if "promoted" in result:
        verdict = "promoted to @champion" if result["promoted"] else "not promoted"
        line += f"; {verdict}: {result['reason']}"
    make_console().print(escape(line), soft_wrap=True)
    return 0


def command_mlflow_replay(args: argparse.Namespace) -> int:
    from neorl_industrial.integration.mlflow.sender import (
        quiet_http_retries,
        replay,
        resolve_tracking_uri,
    )

    quiet_http_retries()
    # The store is the user's choice; a URI written in the spool (data) is never used.
    uri = resolve_tracking_uri(args.tracking_uri)
    summary = replay(args.spool, uri)
    make_console().print(
        escape(
            f"Replayed {summary.sent} MLflow call(s) from {args.spool} to {uri} "
            f"(runs: {', '.join(summary.run_ids.values()) or 'none'})"
        )
    )
    return 0


def add_model_parsers(commands: argparse._SubParsersAction) -> None:
    """Adds ``models list|promote|export|register`` to the command line."""
    models_commands = add_command_group(
        commands, "models", "registered policies in MLflow's registry"
    )
    listing = models_commands.add_parser("list", help="versions, aliases and evaluations")
    listing.add_argument("name", nargs="?", help="a registered model (default: all)")
    add_tracking_uri(listing)
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
    add_tracking_uri(promoting)
    promoting.set_defaults(handler=command_models_promote)
    exporting = models_commands.add_parser(
        "export", help="copy a registered policy (models:/name@alias) to a directory"
    )
    exporting.add_argument("model", help="models:/ib-policy@champion, models:/ib-policy/3, ...")
    exporting.add_argument("--out", required=True, help="the policy artifact's directory")
    exporting.add_argument("--overwrite", action="store_true")
    add_tracking_uri(exporting)
    exporting.set_defaults(handler=command_models_export)
    registering = models_commands.add_parser(
        "register",
        help="register an exported (signed) policy directory as a new version of a model",
    )
    registering.add_argument("policy", help="the policy artifact's directory")
    registering.add_argument("--name", required=True, help="the registered model, e.g. ib-policy")
    add_signature_trust(
        registering,
        trusted="a public key its signature must verify against (repeatable)",
        unsigned="register an unsigned policy too (it can never be promoted)",
    )
    registering.add_argument(
        "--metric", action="append", metavar="NAME=VALUE",
        help="its evaluation for the promotion rule (return, normalized_cost, ...; repeatable)",
    )  # fmt: skip
    registering.add_argument(
        "--promote", action="store_true", help="apply the promotion rule to it right away"
    )
    add_tracking_uri(registering)
    registering.set_defaults(handler=command_models_register)


def add_mlflow_parsers(commands: argparse._SubParsersAction) -> None:
    """Adds ``mlflow replay`` to the command line."""
    mlflow_commands = add_command_group(commands, "mlflow", "MLflow tracking helpers")
    replaying = mlflow_commands.add_parser(
        "replay", help="send the MLflow calls a run could not send (its spool file)"
    )
    replaying.add_argument("spool", help="a run's mlflow-spool.jsonl")
    add_tracking_uri(
        replaying,
        "the MLflow store to send them to (default: $MLFLOW_TRACKING_URI, else "
        "sqlite:///mlflow.db; never a URI written in the spool file)",
    )
    replaying.set_defaults(handler=command_mlflow_replay)
