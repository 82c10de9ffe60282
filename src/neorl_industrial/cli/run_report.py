"""What the training commands print: the runs' best evaluations or off-policy estimates,
FQE beside the simulator, a sweep's configurations, the verdict, the kept policy and the
MLflow run."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

__all__ = ["print_verdict"]


def _sweep_table(table: dict, algorithm: str) -> Table:
    estimate = "FQE estimate" if table["estimate"] == "fqe" else "simulator"
    out = Table(title=f"{algorithm}: every configuration ({estimate}, mean over seeds)")
    for column in ("#", *table["fields"], "return", "± 95 %", "normalized cost", "within limits"):
        out.add_column(column, justify="right")
    for index, configuration in enumerate(table["configurations"]):
        summary = configuration["summary"]
        cost = summary.get("normalized_cost")
        out.add_row(
            f"{index}{' *' if index == table['selected'] else ''}",
            *(str(configuration["values"][field]) for field in table["fields"]),
            f"{summary['return']['mean']:,.4g}",
            f"{summary['return']['ci'] or 0.0:,.3g}",
            "-" if cost is None else f"{cost['mean']:.3g}",
            "-" if cost is None else ("yes" if configuration["within_limits"] else "no"),
        )
    return out


def _print_selection(console: Console, outcome: Any) -> None:
    """The runs that failed (never selected or exported) and what was selected, how."""
    result, agent = outcome.result, outcome.agent
    for failed in result.failed_runs:
        console.print(
            escape(f"[failed] {failed['candidate']}: {failed['reason']}; never selected"),
            style="yellow",
        )
    selection = result.selection
    if selection.get("by") == "verdict":
        console.print(
            escape(
                f"Selected {agent.selected_candidate}: the verdict ranks it first "
                f"({selection['candidate']}); any other: export --candidate NAME "
                f"({', '.join(agent.candidates)})"
            )
        )


def _print_tracking(console: Console, tracking: dict) -> None:
    run = tracking.get("run_id") or "not created (see the spool)"
    console.print(
        f"MLflow: run {run} in experiment {tracking['experiment']!r} at {tracking['uri']}"
    )
    model = tracking.get("model")
    if model and model.get("version"):
        line = f"Model: {model['uri']} registered"
        if "promoted" in model:
            verdict = "promoted to @champion" if model["promoted"] else "not promoted"
            line += f"; {verdict}: {model['reason']}"
        console.print(escape(line))
    if tracking.get("spooled"):
        console.print(
            f"[yellow]{tracking['spooled']} MLflow call(s) could not be sent; they are in "
            f"{tracking['spool']}: replay with `neorl-industrial mlflow replay "
            f"{tracking['spool']}`[/yellow]"
        )
    console.print(f"Open the MLflow UI: {tracking['ui']}")
    links = tracking.get("links") or {}
    if links.get("runs"):
        console.print(f"  training runs: {links['runs']}", soft_wrap=True)
    if links.get("run"):
        console.print(f"  this run:      {links['run']}", soft_wrap=True)


def _summary_table(report: dict, result: Any) -> Table:
    if result.evaluation == "fqe":
        return _estimates_table(report, result)
    table = Table(title=f"{report['algorithm']} on {report['env']}: best evaluation of each run")
    for column in (
        "run",
        "seed",
        "updates",
        "return",
        "score",
        "normalized cost",
        "violations",
        "shield overrides",
        "hard violations",
    ):
        table.add_column(column, justify="right")
    references = report["data"].get("references")
    for i, best in enumerate(result.best):
        if best is None:
            continue
        metrics = best["metrics"]
        score = "-"
        if references:
            span = references["expert"] - references["random"]
            score = f"{100 * (metrics['return'] - references['random']) / span:.1f}"
        cost = metrics.get("normalized_cost")
        table.add_row(
            f"{i}{' *' if i == result.selected_run else ''}",
            str(result.seeds[i]),
            f"{best['updates']:,}",
            f"{metrics['return']:,.0f}",
            score,
            "-" if cost is None else f"{cost:.2f}",
            f"{100 * metrics['violation_rate']:.0f} %",
            f"{100 * metrics['override_rate']:.1f} %",
            str(metrics["hard_violation_steps"]),
        )
    table.caption = (
        "* the run the agent predicts with. Score: 100 (R - random) / (expert - random); "
        "normalized cost: mean episode cost / limit (<= 1 keeps the limit); hard "
        "violations: steps whose applied action broke a hard constraint."
    )
    return table


def _estimates_table(report: dict, result: Any) -> Table:
    """The best runs of a task without a simulator: off-policy estimates."""
    title = f"{report['algorithm']} on {report['task']['name']}: off-policy estimates (FQE)"
    rows = [
        (i, result.seeds[i], best["updates"], best["metrics"])
        for i, best in enumerate(result.best)
        if best is not None
    ]
    return _estimates(title, rows, result.selected_run)


def _estimates(title: str, rows: list, selected: int) -> Table:
    table = Table(title=title)
    for column in ("run", "seed", "updates", "est. return", "behaviour", "est. norm. cost"):
        table.add_column(column, justify="right")
    for i, seed, updates, metrics in rows:
        ci = metrics.get("return_ci")
        cost = metrics.get("normalized_cost")
        table.add_row(
            f"{i}{' *' if i == selected else ''}",
            str(seed),
            "-" if updates is None else f"{updates:,}",
            f"{metrics['return']:,.2f}" + (f" ± {ci:,.2f}" if ci is not None else ""),
            f"{metrics['behaviour_return']:,.2f}",
            "-" if cost is None else f"{cost:.2f}",
        )
    table.caption = (
        "Estimates from held-out logged episodes, not measurements: discounted return from "
        "an episode start (± 95 % interval over FQE seeds) beside the logged operation's "
        "own; estimated cost over what the episode limit allows (<= 1: within). "
        "* the run the agent predicts with."
    )
    return table


def _side_by_side_table(rows: list) -> Table:
    """FQE's estimates next to the simulator's truth for the same policies."""
    table = Table(title="off-policy estimates (FQE, held-out episodes) beside the simulator")
    for column in ("run", "FQE return", "simulated", "error", "FQE cost / limit"):
        table.add_column(column, justify="right")
    for i, row in enumerate(rows):
        ci = row.get("return_ci")
        cost = row.get("normalized_cost")
        table.add_row(
            str(i),
            f"{row['return']:,.1f}" + (f" ± {ci:,.1f}" if ci is not None else ""),
            f"{row['simulated_return']:,.1f}",
            f"{100 * row['relative_error']:+.1f} %",
            "-" if cost is None else f"{cost:.2f}",
        )
    table.caption = "Discounted returns from an episode start (γ of the FQE settings)."
    return table


def _warn_training_episodes(console: Console, estimates: dict, source: str) -> None:
    """Says loudly when episodes the agent trained on were given to evaluate it."""
    if estimates.get("on_training_episodes"):
        console.print(
            f"[bold red]WARNING: every episode of {escape(source)} trained this agent.[/bold red] "
            "The estimates below measure how well it remembers them, not how it would run "
            "the plant; give episodes it was not trained on."
        )
    elif estimates.get("left_out_training_episodes"):
        console.print(
            f"[bold yellow]warning:[/bold yellow] {estimates['left_out_training_episodes']} "
            f"episodes of {escape(source)} trained this agent and were left out; the estimates "
            f"are on the other {estimates['evaluated_episodes']}."
        )


def print_verdict(console: Console, verdict: dict) -> None:
    """The verdict as a person reads it: every candidate's improvement over the logged
    operation by every estimator, then the answer in one sentence."""
    from neorl_industrial.wrappers.training.verdict_results import interval_text

    table = Table(title="Is it better than the current operation? (estimates)")
    table.add_column("candidate")
    for estimator in verdict["estimators"]:
        deciding = " (decides)" if estimator in verdict["deciding"] else ""
        table.add_column(f"{estimator}{deciding}", justify="right")
    evidence = verdict["evidence"]
    selection = evidence.get("selection")
    if selection:
        table.add_column("selected")
    table.add_column("qualifies")
    level = f"{verdict['settings']['level']:.0%}"
    for candidate in verdict["candidates"]:
        cells = []
        for estimate in candidate["estimates"]:
            cells.append(interval_text(estimate["improvement"]))
        if selection:
            cells.append("yes" if (candidate.get("selection") or {}).get("selected") else "")
        table.add_row(
            escape(candidate["name"]),
            *cells,
            "yes" if candidate["qualifies"] else "no",
        )
    table.caption = (
        f"Improvement of the discounted return over the logged operation, by the same "
        f"estimator, with its {level} interval; {evidence['starts']} starts in "
        f"{evidence['start_episodes']} held-out episodes, {evidence['members']} model members, "
        f"up to {evidence['horizon']} steps. Costs with too few events held out: "
        + (
            ", ".join(
                f"{name} ({count})"
                for name, count in evidence["cost_events"].items()
                if count < verdict["settings"]["min_cost_events"]
            )
            or "none"
        )
        + "."
        + (
            f" One candidate was selected on {selection['episodes']} training episodes "
            "before the test; only it can qualify."
            if selection
            else ""
        )
    )
    console.print(table)
    for candidate in verdict["candidates"]:
        for line in [*candidate["reasons"], *candidate.get("warnings", [])]:
            console.print(f"  {escape(candidate['name'])}: {escape(line)}")
    style = "bold green" if verdict["decision"] == "recommend" else "bold"
    console.print(f"[{style}]{escape(verdict['statement'])}[/{style}]")
