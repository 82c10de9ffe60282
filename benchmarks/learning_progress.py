"""The learning study's progress display: rich progress bars on a terminal, plain lines
in a log file or a pipe."""

from __future__ import annotations

from typing import Any

from benchmarks.harness import progress


class StudyProgress:
    """The study's progress on standard error: on a terminal a rich progress bar over the
    whole study and one per (task, algorithm) run, with the updates, elapsed time, time
    left and the last curve point's scores; elsewhere (a log file, a pipe) plain lines.

    Args:
        total: updates of the whole study (every task, algorithm and agent counted once).
        done: of which done in earlier sessions.
        rich: draw the bars; None: when the console is a terminal.
        console: where the bars go; standard error by default.
    """

    def __init__(
        self,
        total: int = 0,
        done: int = 0,
        *,
        rich: bool | None = None,
        console: Any = None,
    ) -> None:
        from rich.console import Console

        self.console = console if console is not None else Console(stderr=True)
        self.rich = self.console.is_terminal if rich is None else rich
        self.total = total
        self.done_before = done
        self._progress: Any = None
        self._study: Any = None
        self._run: Any = None
        self._label = ""
        self._run_total = 0
        self._run_done = 0

    def __enter__(self) -> StudyProgress:
        if self.rich:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("updates"),
                TimeElapsedColumn(),
                TextColumn("left"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[score]}"),
                console=self.console,
                # A chunk takes minutes: the rate is estimated over the last hour.
                speed_estimate_period=3600.0,
            )
            self._progress.start()
            self._study = self._progress.add_task(
                "[bold]study", total=self.total, completed=self.done_before, score=""
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def note(self, message: str) -> None:
        """One line above the bars (or a plain progress line)."""
        if self._progress is not None:
            self._progress.console.print(f"  {message}")
        else:
            progress(message)

    def run_begin(self, label: str, done: int, total: int) -> None:
        self._label, self._run_done, self._run_total = label, done, total
        if self._progress is not None:
            self._run = self._progress.add_task(label, total=total, completed=done, score="")
        else:
            start = f"resumed at {done:,}" if done else "from the start"
            progress(f"{label}: {total:,} updates, {start}")

    def run_skipped(self, label: str, total: int) -> None:
        self.note(f"{label}: finished in an earlier session, read back from its checkpoint")
        if self._progress is not None:
            row = self._progress.add_task(label, total=total, completed=total, score="read back")
            self._progress.stop_task(row)

    def chunk_done(self, done: int, seconds: float) -> None:
        advance, self._run_done = done - self._run_done, done
        if self._progress is not None:
            self._progress.update(self._run, completed=done)
            self._progress.update(self._study, advance=advance)
        else:
            progress(
                f"  {self._label}: {done:>7,} / {self._run_total:,} updates, "
                f"{seconds:.1f} s for the chunk"
            )

    def evaluated(self, done: int, scores: dict[str, float], final: bool) -> None:
        text = ("final " if final else "") + ", ".join(f"{q} {s:.1f}" for q, s in scores.items())
        if self._progress is not None:
            self._progress.update(self._run, score=text)
            self._progress.update(self._study, score=f"{self._label}: {text}")
        else:
            progress(f"  {self._label} at {done:,} updates: score {text}")

    def run_end(self) -> None:
        if self._progress is not None and self._run is not None:
            self._progress.stop_task(self._run)  # its elapsed time stays the run's own
        self._run = None
