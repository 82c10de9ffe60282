"""``serve``: a policy over REST, every action through the shield."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
from typing import TYPE_CHECKING, Any

from neorl_industrial.cli.common import (
    add_log_level,
    add_signature_trust,
    add_tracking_uri,
    log_to_stderr,
    make_console,
    positive_int,
)

if TYPE_CHECKING:
    from neorl_industrial.integration.deployment import ServerSettings


def command_serve(args: argparse.Namespace) -> int:
    """Loads and checks the policy before uvicorn starts, so that settings, keys, pins or
    a policy the server cannot trust end the command with one line naming what to do
    (exit 2), not a server that fails while starting."""
    from neorl_industrial.integration.deployment import ServerSettings

    overrides: dict[str, Any] = {
        key: value
        for key, value in (
            ("model", args.model),
            ("tracking_uri", args.tracking_uri),
            ("api_keys_file", args.api_keys_file),
            ("audit_log", args.audit_log),
            ("trusted_keys", args.trusted_key or None),
            ("pinned_constraints", args.pinned_constraints),
            ("pinned_task", args.pinned_task),
            ("cpu", args.cpu),
        )
        if value is not None
    }
    if args.no_auth:
        overrides["auth"] = False
    if args.allow_unsigned:
        overrides["allow_unsigned"] = True
    # The server's own log (trust warnings, incidents, reloads).
    log_to_stderr("neorl_industrial.serve", args.log_level, "%(levelname)s: %(name)s: %(message)s")
    settings = _settings(ServerSettings, overrides)
    settings.keys()  # API keys first: the cheapest refusal
    if not settings.model:
        raise ValueError("model: no policy to serve; pass --model or set NEORL_SERVE_MODEL")
    trust = settings.trust()
    if settings.cpu is not None:
        pin_process(settings.cpu)  # before the policy loads: JAX's threads inherit it
    if settings.audit_log is not None:
        from neorl_industrial.integration.safety.audit import claim

        # The audit log's lock before the policy (a minute or more of loading): a log
        # another server holds is refused now, in one line.
        claim(settings.audit_log)
    try:
        return _load_and_serve(args, settings, trust)
    finally:
        if settings.audit_log is not None:
            from neorl_industrial.integration.safety.audit import release_claim

            release_claim(settings.audit_log)  # only if the server never opened the log


def pin_process(cpu: int) -> None:
    """Pins every thread of this process, and the threads they start, to CPU ``cpu``.

    Raises:
        SettingsError: naming the CPUs the process may use when ``cpu`` is not one.
    """
    from neorl_industrial.integration.deployment.errors import SettingsError

    allowed = sorted(os.sched_getaffinity(0))
    if cpu not in allowed:
        raise SettingsError(
            f"cpu: {cpu} is not a CPU this process may use; expected one of {allowed}"
        )
    for thread in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(thread), {cpu})


def _load_and_serve(args: argparse.Namespace, settings: ServerSettings, trust: Any) -> int:
    import uvicorn

    from neorl_industrial.integration.deployment import create_app
    from neorl_industrial.integration.deployment.policy import load_policy_source, padded_sizes

    console = make_console(stderr=True)
    if trust.allow_unsigned:
        console.print(
            "[yellow]warning:[/yellow] --allow-unsigned: policies without a signature by a "
            "trusted key are served (development only)"
        )
    loaded = load_policy_source(
        settings.model,
        settings.tracking_uri,
        padded_sizes(settings.max_batch, settings.batch_sizes),
        trust=trust,
    )
    app = create_app(settings, policy=loaded)
    console.print(
        f"serving {settings.model} on http://{args.host}:{args.port} "
        f"(docs at /docs, metrics at /metrics)"
    )
    uvicorn.run(app, **uvicorn_options(settings), host=args.host, port=args.port,
                log_level=args.log_level, access_log=False)  # fmt: skip
    return 0


def _settings(settings_class: type[ServerSettings], overrides: dict[str, Any]) -> Any:
    """The server's settings from flags, environment and ``.env``; a wrong one is one
    line naming the setting and its allowed range (pydantic's own message takes three
    lines per error)."""
    from pydantic import ValidationError

    from neorl_industrial.core.utils.messages import validation_lines
    from neorl_industrial.integration.deployment.settings import SettingsError

    try:
        return settings_class(tune_gc=True, **overrides)
    except ValidationError as error:
        lines = validation_lines(error, settings_class, "settings (NEORL_SERVE_*, flags)")
        raise SettingsError("; ".join(lines)) from None


def uvicorn_options(settings: ServerSettings) -> dict[str, Any]:
    """uvicorn's limits for slow and many clients, from the server's settings: the
    deadlines and the shedding connection cap live in the protocol class, which replaces
    uvicorn's ``limit_concurrency`` (that one refuses everyone, probes included, once slow
    clients hold the connections). The process's open-file limit is raised to hold the
    cap where the hard limit allows; where it does not, the cap is lowered to fit, with a
    warning (past the limit, accepting fails and every new client waits)."""
    from neorl_industrial.integration.deployment.middleware import guarded_protocol

    return {
        "http": guarded_protocol(
            header_timeout_s=settings.header_timeout_s,
            body_timeout_s=settings.body_timeout_s,
            body_min_rate=settings.body_min_rate,
            max_connections=_fit_open_files(settings.max_connections),
        ),
        "timeout_keep_alive": settings.keep_alive_s,
        "h11_max_incomplete_event_size": settings.max_header_bytes,
    }


#: Descriptors kept for what is not a client connection (the listening socket, the audit
#: log, the policy's files, JAX's and MLflow's own).
_RESERVED_FILES = 128


def _fit_open_files(connections: int) -> int:
    """The connection cap the open-file limit allows, raising the soft limit first."""
    try:
        import resource
    except ImportError:  # not a POSIX system: nothing to read or raise
        return connections
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + _RESERVED_FILES
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return connections
    fitted = max(1, soft - _RESERVED_FILES)
    logging.getLogger("neorl_industrial.serve").warning(
        "max_connections %d does not fit the open-file limit %d (ulimit -n, hard limit %s); "
        "serving at most %d connections: raise the limit to serve more",
        connections, soft, hard, fitted,
    )  # fmt: skip
    return fitted


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
    add_tracking_uri(serve, "the MLflow store of models:/ URIs")
    serve.add_argument("--api-keys-file", help="YAML/JSON: {act: [keys], admin: [keys]}")
    serve.add_argument("--audit-log", help="JSON Lines file of every override")
    serve.add_argument(
        "--no-auth", action="store_true", help="serve without API keys (closed networks only)"
    )
    add_signature_trust(
        serve,
        trusted="a public key (keys generate) whose signatures are trusted; repeatable "
        "(default: $NEORL_SERVE_TRUSTED_KEYS, else keys/policy-signing.pub if present)",
        unsigned="also serve policies without a trusted signature (development only; logged)",
    )
    serve.add_argument(
        "--pinned-constraints", metavar="YAML",
        help="the safety engineer's constraint spec: policies must enforce it, and every "
        "action is checked against it",
    )  # fmt: skip
    serve.add_argument(
        "--pinned-task", metavar="FILE",
        help="the task policies must be exported for (a dataset card such as a run's "
        "dataset.json, or a task file): names in order, units, bounds",
    )  # fmt: skip
    serve.add_argument(
        "--cpu", type=int, metavar="N",
        help="pin the server to CPU N (as taskset numbers them): the policy's small calls "
        "stop waiting on threads woken on other cores (default: $NEORL_SERVE_CPU, else "
        "not pinned)",
    )  # fmt: skip
    add_log_level(serve)
    serve.set_defaults(handler=command_serve)
