"""Host callbacks of the Trainer: called between compiled chunks, never inside them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

if TYPE_CHECKING:
    from neorl_industrial.wrappers.training.trainer import Trainer, TrainResult

__all__ = ["Callback", "History", "RichProgress"]


class Callback:
    """Base class: override what you need. Every method runs on the host."""

    def on_train_begin(self, trainer: Trainer, updates: int, n_updates: int) -> None:
        """Before the first chunk; ``updates`` is non-zero when resuming."""

    def on_chunk_end(self, trainer: Trainer, updates: int, entry: dict[str, Any]) -> None:
        """After every chunk: ``entry`` has updates, seconds, updates_per_s and the mean
        metrics per run (lists)."""

    def on_evaluation(self, trainer: Trainer, updates: int, runs: list[dict[str, Any]]) -> None:
        """After every evaluation: the metrics of every run."""

    def on_checkpoint(self, trainer: Trainer, updates: int, path: Path) -> None:
        """After a checkpoint was written (completely) to ``path``."""

    def on_train_end(self, trainer: Trainer, result: TrainResult) -> None:
        """After the last chunk."""


class History(Callback):
    """Keeps what it is told, for tests and notebooks."""

    def __init__(self) -> None:
        self.chunks: list[tuple[int, dict[str, Any]]] = []
        self.evaluations: list[tuple[int, list[dict[str, Any]]]] = []
        self.checkpoints: list[int] = []

    def on_chunk_end(self, trainer: Trainer, updates: int, entry: dict[str, Any]) -> None:
        self.chunks.append((updates, entry))

    def on_evaluation(self, trainer: Trainer, updates: int, runs: list[dict[str, Any]]) -> None:
        self.evaluations.append((updates, runs))

    def on_checkpoint(self, trainer: Trainer, updates: int, path: Path) -> None:
        self.checkpoints.append(updates)


class RichProgress(Callback):
    """A progress bar with the updates per second, and a line per evaluation."""

    def __init__(self, console: Console | None = None, metrics: tuple[str, ...] = ()) -> None:
        self.console = console or Console(stderr=True)
        self.metrics = metrics
        self._progress: Progress | None = None
        self._task: Any = None

    def on_train_begin(self, trainer: Trainer, updates: int, n_updates: int) -> None:
        self._progress = Progress(
            TextColumn("[bold]training"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task("train", total=n_updates, completed=updates, rate="")

    def on_chunk_end(self, trainer: Trainer, updates: int, entry: dict[str, Any]) -> None:
        if self._progress is None:
            return
        shown = [
            f"{name} {np.mean(entry['metrics'][name]):.3g}"
            for name in self.metrics
            if name in entry["metrics"]
        ]
        rate = f"{entry['updates_per_s']:.0f} updates/s " + " ".join(shown)
        self._progress.update(self._task, completed=updates, rate=rate)

    def on_evaluation(self, trainer: Trainer, updates: int, runs: list[dict[str, Any]]) -> None:
        returns = np.mean([run["return"] for run in runs])
        costs = [run["normalized_cost"] for run in runs if run.get("normalized_cost") is not None]
        cost = f", normalized cost {np.mean(costs):.2f}" if costs else ""
        overrides = np.mean([run["override_rate"] for run in runs])
        if runs and runs[0].get("estimate") == "fqe":
            self.console.print(
                f"  off-policy estimates (FQE, held-out episodes) at {updates}: discounted "
                f"return {returns:.2f} (logged operation {runs[0]['behaviour_return']:.2f})"
                f"{cost}, shield overrides {100 * overrides:.1f} % of held-out states"
            )
            return
        self.console.print(
            f"  evaluation at {updates}: return {returns:.1f}{cost}, "
            f"shield overrides {100 * overrides:.1f} % of steps"
        )

    def on_train_end(self, trainer: Trainer, result: TrainResult) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
