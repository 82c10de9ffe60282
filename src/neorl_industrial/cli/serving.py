"""``serve``: a policy over REST, every action through the shield."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from neorl_industrial.cli.common import make_console, positive_int

if TYPE_CHECKING:
    from neorl_industrial.integration.deployment import ServerSettings


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
    make_console(stderr=True).print(
        f"serving {settings.model} on http://{args.host}:{args.port} "
        f"(docs at /docs, metrics at /metrics)"
    )
    uvicorn.run(app, **uvicorn_options(settings), host=args.host, port=args.port,
                log_level=args.log_level, access_log=False)  # fmt: skip
    return 0


def uvicorn_options(settings: ServerSettings) -> dict[str, Any]:
    """uvicorn's limits for slow and many clients, from the server's settings: the
    deadlines and the shedding connection cap live in the protocol class, which replaces
    uvicorn's ``limit_concurrency`` (that one refuses everyone, probes included, once slow
    clients hold the connections)."""
    from neorl_industrial.integration.deployment.middleware import guarded_protocol

    return {
        "http": guarded_protocol(
            header_timeout_s=settings.header_timeout_s,
            body_timeout_s=settings.body_timeout_s,
            body_min_rate=settings.body_min_rate,
            max_connections=settings.max_connections,
        ),
        "timeout_keep_alive": settings.keep_alive_s,
        "h11_max_incomplete_event_size": settings.max_header_bytes,
    }


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """Adds ``serve`` to the command line."""
    serve = commands.add_parser(
        "serve", help="serve a policy over REST, every action through the shield"
    )
    serve.add_argument(
        "--model", help="an exported policy directory or models:/ib-policy@champion "
        "(default: $NEORL_SERVE_MODEL)",
    )  # fmt: skip
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=positive_int, default=8000)
    serve.add_argument("--tracking-uri", help="the MLflow store of models:/ URIs")
    serve.add_argument("--api-keys-file", help="YAML/JSON: {act: [keys], admin: [keys]}")
    serve.add_argument("--audit-log", help="JSON Lines file of every override")
    serve.add_argument(
        "--no-auth", action="store_true", help="serve without API keys (closed networks only)"
    )
    serve.add_argument("--log-level", default="info", choices=("debug", "info", "warning"))
    serve.set_defaults(handler=command_serve)
