"""``neorl-industrial model fit|history|inspect``: a learned model of the plant from its
logs."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from neorl_industrial.cli.common import (
    add_command_group,
    add_tracking_uri,
    make_console,
    positive_int,
)
from neorl_industrial.functional.transformations.dynamics_memory import REMEMBERED

#: ``FitSettings`` fields ``model fit`` takes as options of the same name (``--batch-size``
#: is ``batch_size``); ``--updates`` and ``--chunk`` set ``max_updates`` and ``chunk_updates``.
SAME_NAMED_FIT_OPTIONS = (
    "seeds", "batch_size", "patience", "holdout", "split_seed", "horizon", "windows",
    "window_steps",
)  # fmt: skip


def _numbers(text: str, example: str) -> tuple[int, ...]:
    """Comma-separated whole numbers (an argparse type's first step)."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {example}, got {text!r}") from None


def _widths(text: str) -> tuple[int, ...]:
    """An argparse type: layer widths such as ``200,200,200``."""
    widths = _numbers(text, "comma-separated layer widths such as 200,200")
    if not widths or any(width < 1 for width in widths):
        raise argparse.ArgumentTypeError(f"expected positive layer widths, got {text!r}")
    return widths


def _share(text: str) -> float:
    """An argparse type: a share strictly between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {value}")
    return value


def _seeds(text: str) -> tuple[int, ...]:
    """An argparse type: seeds such as ``0,1,2``."""
    seeds = _numbers(text, "seeds such as 0,1,2")
    if not seeds:
        raise argparse.ArgumentTypeError("expected at least one seed")
    return seeds


def _histories(text: str) -> tuple[int, ...]:
    """An argparse type: histories such as ``1,3,10``."""
    histories = _numbers(text, "histories such as 1,3,10")
    if len(histories) < 2 or any(history < 1 for history in histories):
        raise argparse.ArgumentTypeError(
            f"expected at least two histories >= 1 such as 1,3,10, got {text!r}"
        )
    return histories


def _load_data(args: argparse.Namespace) -> tuple[Any, Any, str | None]:
    """The dataset, its card and the row its reward is read on (a plant log's card records
    its schema's ``reward_row``; None for other data)."""
    from neorl_industrial.integration.datasets import load_any

    dataset, card = load_any(args.data, schema=args.schema, missing=args.missing)
    return dataset, card, card.reward_row


def _add_fit_options(parser: argparse.ArgumentParser) -> None:
    """The options of how a model is fitted (``model fit`` and ``model history``)."""
    parser.add_argument("--members", type=positive_int, default=7, help="ensemble members")
    parser.add_argument("--elites", type=positive_int, default=5, help="best members kept")
    parser.add_argument("--hidden", type=_widths, default=(128, 128), help="e.g. 200,200,200")
    parser.add_argument("--updates", type=positive_int, default=10_000, help="at most, per member")
    parser.add_argument("--chunk", type=positive_int, default=500, help="updates per compiled call")
    parser.add_argument("--batch-size", type=positive_int, default=256)
    parser.add_argument(
        "--patience", type=positive_int, default=4, help="chunks without progress before stopping"
    )
    parser.add_argument("--holdout", type=_share, default=0.2, help="share of episodes held out")
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--seeds", type=_seeds, default=(0,), help="e.g. 0,1,2 (one ensemble each)")
    parser.add_argument("--horizon", type=positive_int, default=100, help="open-loop steps")
    parser.add_argument("--windows", type=positive_int, default=128, help="held-out windows")
    parser.add_argument(
        "--window-steps",
        type=positive_int,
        default=1,
        help="train each member over this many steps rolled forward on its own predictions "
        "(a multi-step loss; 1: one step ahead)",
    )


def _fit_setup(args: argparse.Namespace) -> tuple[Any, Any]:
    """``(DynamicsConfig, FitSettings)`` of the fit options."""
    from neorl_industrial.core.models import DynamicsConfig
    from neorl_industrial.wrappers.models import FitSettings

    config = DynamicsConfig.create(
        hidden=args.hidden,
        n_members=args.members,
        n_elites=min(args.elites, args.members),
    )
    settings = FitSettings(
        max_updates=args.updates,
        chunk_updates=args.chunk,
        **{name: getattr(args, name) for name in SAME_NAMED_FIT_OPTIONS},
    )
    return config, settings


def _definitions(card: Any, task: Any) -> dict[str, str]:
    """The reward and cost definitions of a dataset's card that the task's channels use."""
    return {
        channel: source
        for channel, source in card.definitions.items()
        if channel == "reward" or channel in task.cost_names
    }


def command_fit(args: argparse.Namespace) -> int:
    from neorl_industrial.wrappers.models import PlantModel

    console = make_console()
    dataset, card, reward_row = _load_data(args)
    task = card.task(dataset)
    config, settings = _fit_setup(args)
    model = PlantModel(task, config, definitions=_definitions(card, task), reward_row=reward_row)
    console.print(
        f"Fitting {config.n_members} members × {len(settings.seeds)} seed(s) on {args.data}: "
        f"{dataset.n_transitions:,} transitions in {dataset.n_episodes} episodes, "
        f"{settings.holdout:.0%} of the episodes held out"
        + (
            f"; each member trained on {settings.window_steps}-step windows of its own predictions."
            if settings.window_steps > 1
            else "."
        )
    )
    model_card = model.fit(dataset, settings, dataset_name=card.name)
    if args.simulator is not None:
        if not task.has_simulator:
            console.print(
                f"[yellow]warning:[/yellow] --simulator: task {task.name!r} has no simulator; "
                "the fidelity is that of the held-out episodes only"
            )
        else:
            model.simulator_fidelity(episodes=args.simulator)
    path = model.save(args.out, overwrite=args.overwrite, plots=not args.no_plots)
    _report(console, model_card, str(path))
    if args.track:
        _track(args, model_card, path, console)
    if args.json:
        Path(args.json).write_text(json.dumps(model_card, indent=2, default=str))
        console.print(f"Wrote {args.json}")
    return 0


def _track(args: argparse.Namespace, card: dict[str, Any], path: Path, console: Console) -> None:
    """The fit as an MLflow run: settings as params, the fidelity table as metrics
    (``fidelity/<feature>/rmse_<steps>``, ``.../relative_rmse_<steps>``,
    ``.../coverage_<steps>``), the model's directory as artifacts. Delivered by the
    project's sender: a store that is down costs a warning and a spool file to replay
    (``neorl-industrial mlflow replay``), never the saved model."""
    import time

    from neorl_industrial.integration.mlflow.sender import (
        BufferedSender,
        quiet_http_retries,
        resolve_tracking_uri,
    )
    from neorl_industrial.integration.mlflow.tracking import flatten, system_tags

    quiet_http_retries()
    uri = resolve_tracking_uri(args.tracking_uri)

    def client() -> Any:
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=uri, registry_uri=uri)

    experiment = args.experiment or f"plant-model/{card['task']['name']}"
    sender = BufferedSender(
        client,
        spool_path=path / "mlflow-spool.jsonl",
        header={"tracking_uri": uri, "experiment": experiment, "run": path.name},
        warn=lambda message: console.print(f"[yellow]warning:[/yellow] {message}"),
    )
    now = int(time.time() * 1000)
    data = card["dataset"]
    tags = {
        **system_tags(),
        "kind": "plant-model",
        "task": card["task"]["name"],
        "dataset": data["name"],
        "dataset_fingerprint": data["fingerprint"],
    }
    sender.submit("create_run", "model", experiment=experiment, name=path.name, tags=tags, time=now)
    params = flatten({"config": card["config"], "settings": card["settings"]})
    metrics = [["fit/seconds", card["fit"]["seconds"], 0, now]]
    metrics.append(["fit/updates", card["fit"]["updates"], 0, now])
    for row in card["fidelity"]["rows"]:
        for key in ("rmse", "relative_rmse", "coverage"):
            if row[key] is not None:
                feature = re.sub(r"[^\w\-. ]", "_", row["name"])  # what MLflow accepts
                name = f"fidelity/{feature}/{key}_{row['step']}"
                metrics.append([name, row[key], row["step"], now])
    sender.submit("log_batch", "model", params=params, metrics=metrics)
    sender.submit("log_artifact", "model", path=str(path), artifact_path="plant_model")
    sender.submit("end_run", "model", status="FINISHED", time=int(time.time() * 1000))
    summary = sender.close(60.0)
    run_id = sender.run_ids.get("model")
    if run_id is not None and summary.complete:
        console.print(f"Tracked in MLflow ({uri}): experiment {experiment!r}, run {run_id}")
    else:
        console.print(
            f"[yellow]warning:[/yellow] MLflow ({uri}) did not take the run; it waits in "
            f"{summary.spool_path} (neorl-industrial mlflow replay {summary.spool_path})"
        )


def command_history(args: argparse.Namespace) -> int:
    from neorl_industrial.integration.datasets import DatasetFormatError, load_plant_log
    from neorl_industrial.integration.datasets.plant_log import is_table
    from neorl_industrial.wrappers.models.history_check import compare_histories

    console = make_console()
    if not is_table(args.data):  # --schema is required by the parser
        raise DatasetFormatError(
            "model history: expects a plant log (.csv or .parquet) and its --schema: the "
            "history is the schema's setting; other data has its history fixed",
            path=args.data,
        )
    config, settings = _fit_setup(args)

    def load(history: int) -> tuple[Any, Any, dict[str, str], str | None]:
        dataset, card = load_plant_log(
            args.data, args.schema, missing=args.missing, history=history
        )
        task = card.task(dataset)
        return dataset, task, _definitions(card, task), card.reward_row

    console.print(
        f"Fitting one plant model per history ({', '.join(map(str, args.histories))} rows) on "
        f"{args.data}, {settings.holdout:.0%} of the episodes held out; each judged open loop "
        f"over {settings.horizon} steps on the held-out episodes."
    )
    report = compare_histories(
        load,
        args.histories,
        settings,
        config,
        dataset_name=Path(args.data).name,
        progress=lambda message: console.print(f"  {message}"),
    )
    horizon = report["horizon"]
    table = Table(
        title=f"Held-out open-loop error, relative to each feature's spread "
        f"({len(report['heldout_episodes'])} held-out episodes)"
    )
    steps = sorted(int(step) for step in report["rows"][0]["errors"])  # 1, 10, the horizon
    table.add_column("history", justify="right")
    for step in steps:
        table.add_column(f"{step} step" + ("s" if step > 1 else ""), justify="right")
    for column in (f"inside the 90 % interval at {horizon}", "updates", "seconds"):
        table.add_column(column, justify="right")
    for row in report["rows"]:
        errors = row["errors"]

        def cell(step: int, key: str = "relative_rmse", errors: dict = errors) -> str:
            value = errors.get(str(step), {}).get(key)
            return "-" if value is None else f"{value:.3g}"

        table.add_row(
            str(row["history"]) + (" ←" if row["history"] == report["choice"] else ""),
            *(cell(step) for step in steps),
            cell(horizon, "coverage"),
            str(row["updates"]),
            f"{row['seconds']:.1f}",
        )
    console.print(table)
    console.print(
        f"Choose history: {report['choice']} ({report['rule']}). Set [bold]history: "
        f"{report['choice']}[/bold] in {escape(str(args.schema))} and import the log again."
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
        console.print(f"Wrote {args.json}")
    return 0


def command_inspect(args: argparse.Namespace) -> int:
    from neorl_industrial.wrappers.models import PlantModel

    console = make_console()
    if args.data is None:
        model = PlantModel.load(args.model)
        _report(console, model.card, args.model)
        return 0
    dataset, card, _ = _load_data(args)
    model = PlantModel.load(
        args.model, dataset=dataset, task=card.task(dataset), dataset_name=args.data
    )
    fidelity = model.fidelity(dataset)
    _report(console, model.card | {"fidelity": fidelity}, args.model, measured_now=True)
    return 0


def _report(console: Console, card: dict[str, Any], where: str, measured_now: bool = False) -> None:
    data, fit, config = card["dataset"], card["fit"], card["config"]
    stop = "stopped early" if fit["stopped_early"] else "ran to the last update"
    console.print(
        f"Plant model of {card['task']['name']!r} at {where}: {config['n_members']} members "
        f"(the {config['n_elites']} best kept) fitted on {data['name']!r} "
        f"({data['n_transitions']:,} transitions, {data['n_episodes']} episodes, "
        f"fingerprint {data['fingerprint'][:19]}...) in {fit['seconds']:.1f} s, "
        f"{fit['updates']:,} updates per member ({stop})."
    )
    for channel, how in card["signals"].items():
        console.print(f"  {channel}: {how}")
    note = (card.get("physics") or {}).get("note")
    if note:  # a model saved before predictions were held to physical ranges has none
        console.print(f"  [yellow]physics:[/yellow] {escape(note)}")
    fidelity = card["fidelity"]
    when = "measured now" if measured_now else "as fitted"
    table = Table(
        title=(
            f"Open-loop fidelity on {len(fidelity['episodes'])} held-out episodes, "
            f"{fidelity['windows']} windows ({when}): error in the plant's units, "
            f"share inside the ensemble's {fidelity['level']:.0%} interval"
        )
    )
    columns = (
        "feature",
        "unit",
        "steps ahead",
        "windows",
        "RMSE",
        "MAE",
        "RMSE / spread",
        "inside",
    )
    for column in columns:
        table.add_column(column, justify="left" if column in ("feature", "unit") else "right")
    for row in fidelity["rows"]:
        relative, coverage = row["relative_rmse"], row["coverage"]
        name = row["name"] if row["kind"] == "observation" else f"{row['name']} (per step)"
        table.add_row(
            f"{name} (given: from the log)" if row.get("given") else name,
            row.get("unit") or "",
            str(row["step"]),
            str(row["windows"]),
            "-" if row["rmse"] is None else f"{row['rmse']:.4g}",
            "-" if row["mae"] is None else f"{row['mae']:.4g}",
            "-" if relative is None else f"{relative:.3f}",
            "-" if coverage is None else f"{100 * coverage:.0f} %",
        )
    console.print(table)
    memory = _memory_line(fidelity.get("memory"))
    if memory:
        console.print(memory)
    simulator = card.get("simulator_fidelity")
    if simulator is not None:
        rows = [row for row in simulator["rows"] if row["kind"] == "observation"]
        table = Table(
            title=(
                f"Against the {simulator['source']} ({simulator['windows']} windows, "
                f"{100 * simulator['outside_data_share']:.0f} % of their states outside the "
                "data's range)"
            )
        )
        for column in ("feature", "unit", "steps", "RMSE", "RMSE / spread", "inside"):
            table.add_column(column, justify="left" if column in ("feature", "unit") else "right")
        for row in rows:
            relative, coverage = row["relative_rmse"], row["coverage"]
            table.add_row(
                row["name"],
                row.get("unit") or "",
                str(row["step"]),
                "-" if row["rmse"] is None else f"{row['rmse']:.4g}",
                "-" if relative is None else f"{relative:.3f}",
                "-" if coverage is None else f"{100 * coverage:.0f} %",
            )
        console.print(table)


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """The ``model`` command group."""
    actions = add_command_group(
        commands, "model", "a learned model of the plant from its logs: fit, history, inspect"
    )

    fit = actions.add_parser(
        "fit",
        help="fit an ensemble dynamics model on a dataset and measure its fidelity on "
        "held-out episodes",
    )
    fit.add_argument("--data", required=True, help="the dataset (any format, or a plant log)")
    fit.add_argument("--schema", help="the YAML schema of a plant log given to --data")
    fit.add_argument(
        "--missing", choices=("error", "drop", "split"), help="a plant log's missing values"
    )
    fit.add_argument("--out", required=True, help="the saved model's directory")
    fit.add_argument("--overwrite", action="store_true")
    _add_fit_options(fit)
    fit.add_argument(
        "--simulator",
        type=positive_int,
        metavar="EPISODES",
        help="where the task has a simulator, also measure the fidelity against it on this "
        "many episodes of random actions (states the data rarely visited)",
    )
    fit.add_argument("--no-plots", action="store_true", help="do not draw trajectories.png")
    fit.add_argument("--json", help="also write the model's card to this JSON file")
    fit.add_argument("--track", action="store_true", help="also log the fit as an MLflow run")
    add_tracking_uri(fit)
    fit.add_argument("--experiment", help="the MLflow experiment (default: plant-model/<task>)")
    fit.set_defaults(handler=command_fit)

    history = actions.add_parser(
        "history",
        help="compare the histories (rows per observation) a plant log could be imported "
        "with: one model each, judged by its held-out error over the long horizon",
    )
    history.add_argument("--data", required=True, help="the plant log (.csv or .parquet)")
    history.add_argument("--schema", required=True, help="its YAML schema")
    history.add_argument(
        "--missing", choices=("error", "drop", "split"), help="the log's missing values"
    )
    history.add_argument(
        "--histories",
        type=_histories,
        default=(1, 3, 10),
        help="the histories to compare (default 1,3,10)",
    )
    _add_fit_options(history)
    history.add_argument("--json", help="also write the comparison to this JSON file")
    history.set_defaults(handler=command_history)

    inspect = actions.add_parser(
        "inspect",
        help="show a saved model's card and fidelity; with --data, check it was fitted on "
        "that dataset and measure its fidelity again",
    )
    inspect.add_argument("model", help="a saved plant model's directory")
    inspect.add_argument("--data", help="the dataset it was fitted on")
    inspect.add_argument("--schema", help="the YAML schema of a plant log given to --data")
    inspect.add_argument(
        "--missing", choices=("error", "drop", "split"), help="a plant log's missing values"
    )
    inspect.set_defaults(handler=command_inspect)


def _memory_line(memory: dict | None) -> str | None:
    """The memory check in one line: the share of each predicted feature's one-step
    error the earlier steps explain, and a warning when one is large (None without a
    check: a model saved before it, or too few held-out episodes)."""
    if not memory:
        return None
    shares = [(row["name"], row["explained"]) for row in memory["rows"]]
    shares = [(name, share) for name, share in shares if share is not None]
    if not shares:
        return None
    text = (
        f"Share of the model's one-step error the earlier steps (1 to {memory['lags']} back) "
        f"explain, out of sample on {memory['episodes']} held-out episodes: "
        + ", ".join(f"{escape(name)} {100 * share:.0f} %" for name, share in shares)
    )
    remembered = [name for name, share in shares if share >= REMEMBERED]
    if remembered:
        text += (
            f"\n  [yellow]memory:[/yellow] the plant answers to earlier steps the model does "
            f"not see ({', '.join(escape(name) for name in remembered)}): a transport delay, "
            "a slow hidden drift or an unrecorded state. Estimates for policies that act "
            "unlike the logged operation may miss part of the plant's response. For a plant "
            "log, the schema's history: H gives the model and the policies the last H rows; "
            "`neorl-industrial model history` compares the histories (docs/plant_model.md)."
        )
    return text
