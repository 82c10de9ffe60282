"""Where a run's outputs go: :class:`RunFolder`, the one layout of ``<output>/<name>/``
that ``train``, ``sweep`` and ``run`` write (see :mod:`neorl_industrial.cli.run_glue`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from neorl_industrial.extras import MissingExtraError, require
from neorl_industrial.wrappers.agents.agent import AgentError
from neorl_industrial.wrappers.hostio import json_default, write_text_atomic
from neorl_industrial.wrappers.training import RunConfig
from neorl_industrial.wrappers.training.sweep_table import sweep_markdown
from neorl_industrial.wrappers.training.trainer import checkpoint_steps

__all__ = ["RunFolder"]


@dataclasses.dataclass(frozen=True)
class RunFolder:
    """Where a run's outputs go, under its directory ``root`` (:meth:`of`)."""

    root: Path
    agent: Path
    policy: Path
    checkpoints: Path
    plots: Path
    sweep_table: Path
    sweep_page: Path
    report: Path

    @classmethod
    def of(cls, root: Path) -> RunFolder:
        names = ("agent", "policy", "checkpoints", "plots", "sweep.json", "sweep.md")
        return cls(root, *(root / name for name in names), root / "report.json")

    def check_fresh(self, config: RunConfig, *, resume: bool, sweep: bool = False) -> None:
        """Refuses to write over an earlier run (unless resuming it), and a resume that
        has nothing to continue.

        Raises:
            AgentError: naming the directory and what to do; nothing is changed.
        """
        root = self.root
        if root.exists() and any(root.iterdir()) and not resume:
            resuming = "" if sweep else "continue it with --resume (resume=True from Python), or "
            raise AgentError(
                f"{root}: holds an earlier run; {resuming}give another name (--set name=...) "
                "or output directory (nothing was overwritten)"
            )
        if not resume:
            return
        # Resuming from nothing would train afresh over the run's files and MLflow runs.
        if not config.checkpoints.every:
            raise AgentError(
                f"{root}: --resume needs checkpoints (checkpoints.every is 0 in this "
                "configuration); resume with the run's own config.yaml (nothing was changed)"
            )
        if not checkpoint_steps(self.checkpoints):
            why = "it stopped before its first checkpoint" if root.exists() else "no such run"
            raise AgentError(
                f"{root}: nothing to resume: no checkpoint in {self.checkpoints} "
                f"({why}); train it again without --resume under another name "
                "(--set name=...), or remove the directory first (nothing was changed)"
            )

    def write_sweep(self, table: dict[str, Any], title: str, console: Any) -> None:
        """A sweep's table as ``sweep.json``, ``sweep.md`` and ``plots/sweep.png`` (the
        plot with the ``track`` extra)."""
        write_text_atomic(self.sweep_table, json.dumps(table, indent=2, default=json_default))
        write_text_atomic(self.sweep_page, sweep_markdown(table, title))
        try:
            require("track")  # matplotlib, which draws the plot, comes with tracking
        except MissingExtraError as missing:
            if console is not None:
                console.print(f"[yellow]warning:[/yellow] plots/sweep.png not drawn: {missing}")
        else:
            from neorl_industrial.integration.mlflow.plots import sweep_plot

            sweep_plot(table, self.plots / "sweep.png", title=title)

    def outputs(self, exported: Path | None, **more: Any) -> dict[str, Any]:
        """The report's ``outputs`` section."""
        return {
            "run": str(self.root),
            "agent": str(self.agent),
            "policy": None if exported is None else str(self.policy),
            **more,
        }
