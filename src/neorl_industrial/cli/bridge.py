"""``bridge``: a policy against a plant over OPC UA (shadow or closed loop);
``shadow-report``: what a shadow run says about the policy."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import signal
from pathlib import Path
from typing import Any

from neorl_industrial.cli.common import (
    add_log_level,
    add_signature_trust,
    add_tracking_uri,
    log_to_stderr,
    make_console,
    non_negative_int,
    positive_int,
)


def _log_to_stderr(level: str) -> None:
    """The bridge's own log on stderr at ``level``, each line with its time."""
    log_to_stderr(
        "neorl_industrial.bridge", level, "%(asctime)s %(levelname)s: %(name)s: %(message)s"
    )
    # asyncua's own chatter (session timeouts, missing policies) only when it matters.
    logging.getLogger("asyncua").setLevel(logging.ERROR)


def _security(args: argparse.Namespace) -> Any:
    """The OPC UA security the options name (certificates and credentials from files),
    checked."""
    from neorl_industrial.integration.plant_floor.opcua import Security

    security = Security(
        policy=args.security_policy,
        mode=args.security_mode,
        certificate=args.certificate,
        private_key=args.private_key,
        private_key_password_file=args.private_key_password_file,
        server_certificate=args.server_certificate,
        username_file=args.username_file,
        password_file=args.password_file,
    )
    security.check()
    return security


def _prepare(args: argparse.Namespace) -> Any:
    """The checked plan of the map, the task and the policy the options name."""
    from neorl_industrial.integration.plant_floor.plan import prepare

    return prepare(
        args.model,
        args.map,
        mode=args.mode,
        trusted_keys=args.trusted_key,
        allow_unsigned=args.allow_unsigned,
        task_file=args.task,
        pinned_constraints=args.pinned_constraints,
        tracking_uri=args.tracking_uri,
    )


def _run_until_stopped(bridge: Any, ticks: int | None, console: Any) -> None:
    """Runs ``bridge`` until SIGINT or SIGTERM (or ``ticks``) and prints its summary."""

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            # Where the loop cannot take signal handlers (another platform, not the main
            # thread), Ctrl-C still stops the run through KeyboardInterrupt.
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, stop.set)
        summary = await bridge.run(stop, ticks=ticks)
        console.print(
            f"stopped after {summary.ticks} ticks: {summary.decided} decided, "
            f"{summary.faulty} faulty, {summary.missed} missed, {summary.writes} written, "
            f"{summary.refused_writes} refused, {summary.withheld_writes} withheld, "
            f"{summary.disconnections} lost connection(s), "
            f"{summary.reconnects} reconnection(s)"
            + (", handed back to the operators" if summary.handed_back else "")
        )

    asyncio.run(run())


def command_bridge(args: argparse.Namespace) -> int:
    """Checks the map, the task and the policy (named errors, exit 2) before connecting;
    then runs until interrupted (or ``--ticks``)."""
    from neorl_industrial.integration.plant_floor.bridge import PlantBridge
    from neorl_industrial.integration.plant_floor.metrics import BridgeMetrics

    _log_to_stderr(args.log_level)
    console = make_console(stderr=True)
    security = _security(args)
    closed_loop = args.mode == "closed-loop"
    if args.allow_unsigned and not closed_loop:
        console.print(
            "[yellow]warning:[/yellow] --allow-unsigned: an unsigned policy may run in shadow "
            "mode (development only; closed loop never runs one)"
        )
    plan = _prepare(args)
    metrics = BridgeMetrics(plan.loaded.names)
    if args.metrics_port:
        metrics.serve(args.metrics_port, args.metrics_host)
    audit = args.audit_log or (Path("bridge-audit.jsonl") if closed_loop else None)
    bridge = PlantBridge(
        plan,
        args.endpoint,
        args.log,
        security=security,
        audit_path=audit,
        metrics=metrics,
        fsync=args.fsync,
    )
    console.print(
        f"{args.mode}: {plan.loaded.version} on {args.endpoint} every {plan.period:g} s "
        f"(on fault: {plan.plant_map.on_fault}); log {args.log}"
        + (f", audit {audit}" if audit else "")
        + (
            f", metrics on http://{args.metrics_host}:{args.metrics_port}/metrics"
            if args.metrics_port
            else ""
        )
    )
    try:
        _run_until_stopped(bridge, args.ticks, console)
    finally:
        metrics.close()
    return 0


def _port(text: str) -> int:
    """An argparse type: a TCP port, 0 (none) to 65535."""
    port = non_negative_int(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port from 0 to 65535, got {port}")
    return port


def _tolerance(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not sep or not name or not (math.isfinite(number) and number >= 0):
        raise argparse.ArgumentTypeError(
            f"expected ACTION=VALUE (a finite number >= 0, in its unit), got {text!r}"
        )
    return name, number


def _agreement_table(report: Any) -> Any:
    """The report's agreement with the operators, per action, as a table."""
    from rich.table import Table

    from neorl_industrial.integration.plant_floor.effect import format_cell

    table = Table(title=f"agreement with the operators ({report.decided} decided ticks)")
    for column in (
        "action",
        "unit",
        "pairs",
        "mean",
        "median",
        "p5",
        "p95",
        "mean abs",
        "within tolerance",
    ):
        table.add_column(column, justify="left" if column in ("action", "unit") else "right")
    for a in report.actions:
        cells = [format_cell(v) for v in (a.mean, a.median, a.p05, a.p95, a.mean_absolute)]
        share = "-" if a.within_tolerance is None else f"{100 * a.within_tolerance:.1f} %"
        table.add_row(a.name, a.unit or "-", str(a.pairs), *cells, f"{share} (±{a.tolerance:g})")
    return table


def _print_overrides(console: Any, report: Any) -> None:
    """What the shield would have overridden: per constraint, then the totals."""
    from rich.table import Table

    overrides = Table(title="what the shield would have overridden")
    overrides.add_column("constraint the proposal broke")
    overrides.add_column("ticks", justify="right")
    for name, count in report.by_constraint.items():
        overrides.add_row(name, str(count))
    console.print(overrides)
    rate = "-" if report.override_rate is None else f"{100 * report.override_rate:.1f} %"
    console.print(
        f"overridden: {report.overridden} of {report.decided} decided ticks ({rate}); "
        f"faulty ticks: {report.faulty}; missed: {report.missed}"
    )


def _print_effect(console: Any, report: Any) -> None:
    """The estimated effect of following the policy (or why there is none)."""
    from rich.markup import escape
    from rich.table import Table

    from neorl_industrial.integration.plant_floor.effect import format_interval

    effect = report.effect
    if effect is None:
        console.print(f"estimated effect of following the policy: {escape(report.plant_effect)}")
        return
    level = f"{100 * effect.confidence:g} %"
    estimate = Table(
        title=escape(
            f"estimated effect of following the policy ({effect.estimator}; "
            f"{effect.model}, {effect.ticks} ticks, {effect.members} members)"
        )
    )
    for column in ("channel", "operators", "policy", "policy - operators"):
        estimate.add_column(column, justify="left" if column == "channel" else "right")
    estimate.add_column(f"{level} interval (ticks)", justify="right")
    estimate.add_column("member range", justify="right")
    estimate.add_column("reading")
    for c in effect.channels:
        cells = (
            c.name,
            f"{c.operators:.4g}",
            f"{c.policy:.4g}",
            f"{c.difference:+.4g}",
            format_interval(c.interval),
            format_interval(c.member_range),
            c.reading,
        )
        estimate.add_row(*map(escape, cells))
    console.print(estimate)
    share = f"{100 * effect.out_of_distribution:.1f} %"
    console.print(
        f"out of the model's data: {share} of the ticks"
        + ("" if effect.reliable else "; the estimate is unreliable")
    )


def command_shadow_report(args: argparse.Namespace) -> int:
    from neorl_industrial.integration.plant_floor.report import log_to_mlflow, shadow_report

    out = args.out or args.log.with_name(f"{args.log.stem}-report")
    report = shadow_report(args.log, out, dict(args.tolerance or []), args.plant_model)
    console = make_console()
    console.print(_agreement_table(report))
    _print_overrides(console, report)
    _print_effect(console, report)
    console.print(f"wrote {out}/report.md, report.json, pairs.csv and plots")
    if args.model or (report.policy.get("registry") or {}).get("version"):
        logged = log_to_mlflow(report, out, args.model, args.tracking_uri)
        console.print(
            f"logged on {logged['name']} version {logged['version']}"
            + (f" ({logged['artifacts']})" if logged["artifacts"] else "")
        )
    return 0


def _add_policy_options(bridge: argparse.ArgumentParser) -> None:
    """What the bridge runs and where it logs: the policy, the plant, the map, the mode,
    the task, the trust and the logs."""
    bridge.add_argument(
        "--model", required=True, help="an exported policy directory or models:/name@alias"
    )
    bridge.add_argument("--endpoint", required=True, help="opc.tcp://host:port/path")
    bridge.add_argument(
        "--map",
        required=True,
        type=Path,
        help="YAML: observations and actions to node ids, units, period",
    )
    bridge.add_argument(
        "--mode",
        choices=("shadow", "closed-loop"),
        default="shadow",
        help="shadow: read, decide and log, write nothing (default); closed-loop: write the "
        "shielded action (a policy signed by a trusted key only)",
    )
    bridge.add_argument(
        "--log",
        type=Path,
        default=Path("bridge-log.jsonl"),
        help="the tick log (JSON Lines; default bridge-log.jsonl)",
    )
    bridge.add_argument(
        "--audit-log",
        type=Path,
        help="closed loop: the audit log of writes (default bridge-audit.jsonl)",
    )
    bridge.add_argument(
        "--task",
        type=Path,
        help="the dataset card or task file the map is for (default: the map's)",
    )
    bridge.add_argument(
        "--pinned-constraints",
        type=Path,
        metavar="YAML",
        help="the constraint spec the policy must enforce (needs the task)",
    )
    add_signature_trust(
        bridge,
        trusted="a public key whose signatures are trusted; repeatable (default "
        "keys/policy-signing.pub if present)",
        unsigned="shadow mode only: run an unsigned policy (development only)",
        key_type=Path,
    )
    add_tracking_uri(bridge, "the MLflow store of models:/ URIs")


def _add_loop_options(bridge: argparse.ArgumentParser) -> None:
    """The metrics endpoint and how long the bridge runs."""
    bridge.add_argument(
        "--metrics-port",
        type=_port,
        default=0,
        help="serve Prometheus metrics on this port (0: none)",
    )
    bridge.add_argument("--metrics-host", default="127.0.0.1")
    bridge.add_argument("--ticks", type=positive_int, help="stop after this many ticks")


def _add_security_options(bridge: argparse.ArgumentParser) -> None:
    """OPC UA security: the policy and mode, certificates and credentials (from files)."""
    security = bridge.add_argument_group("security (secrets from files, never this line)")
    security.add_argument(
        "--security-policy", choices=("Basic256Sha256", "Aes128Sha256RsaOaep", "Aes256Sha256RsaPss")
    )
    security.add_argument(
        "--security-mode", choices=("Sign", "SignAndEncrypt"), default="SignAndEncrypt"
    )
    security.add_argument("--certificate", type=Path, help="the bridge's certificate (PEM/DER)")
    security.add_argument("--private-key", type=Path, help="its private key (PEM/DER)")
    security.add_argument("--private-key-password-file", type=Path)
    security.add_argument(
        "--server-certificate",
        type=Path,
        help="the server's certificate (default: from its endpoints)",
    )
    security.add_argument("--username-file", type=Path)
    security.add_argument("--password-file", type=Path)


def _add_bridge_parser(commands: argparse._SubParsersAction) -> None:
    bridge = commands.add_parser(
        "bridge",
        help="run a policy against a plant over OPC UA, in shadow or closed loop",
        # No abbreviations: --password would be taken for --password-file.
        allow_abbrev=False,
    )
    _add_policy_options(bridge)
    _add_loop_options(bridge)
    _add_security_options(bridge)
    bridge.add_argument("--fsync", action="store_true", help="sync the tick log every tick")
    add_log_level(bridge)
    bridge.set_defaults(handler=command_bridge)


def _add_report_parser(commands: argparse._SubParsersAction) -> None:
    report = commands.add_parser(
        "shadow-report",
        help="agreement with the operators and the shield's overrides of a "
        "bridge log (table, plots; logged on the policy's registered version)",
    )
    report.add_argument("log", type=Path, help="a bridge's tick log")
    report.add_argument("--out", type=Path, help="directory (default: <log>-report)")
    report.add_argument(
        "--tolerance",
        action="append",
        type=_tolerance,
        metavar="ACTION=VALUE",
        help="agreement tolerance in the action's unit (default 5 %% of its range); repeatable",
    )
    report.add_argument(
        "--model",
        help="models:/name/version to log the report on (default: "
        "the version the log names, if any)",
    )
    report.add_argument(
        "--plant-model",
        type=Path,
        metavar="DIR",
        help="a saved plant model of the same task (neorl-industrial model fit): estimate "
        "the effect of following the policy, one step ahead",
    )
    add_tracking_uri(report)
    report.set_defaults(handler=command_shadow_report)


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """Adds ``bridge`` and ``shadow-report`` to the command line."""
    _add_bridge_parser(commands)
    _add_report_parser(commands)
