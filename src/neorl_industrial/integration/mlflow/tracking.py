"""Every training run tracked in MLflow: a Trainer callback.

A run of several seeds is a *parent* MLflow run with a nested run per seed. The parent
holds the run's settings as it used them (params; the caller decides which), the tags
(environment, dataset and its checksum, algorithm, versions, git commit), the metrics
averaged over seeds and, at the end, the mean and 95 % confidence interval over seeds of
the best evaluations (``best/return_mean``, ``best/return_ci95``, ...); each seed's run
holds its own metrics. Every run has the training data as its MLflow dataset input (the
UI's *Datasets*). Artifacts (configuration, dataset card, learning-curve and safety
plots, the report, the final checkpoint, the saved agent) and the shielded policy model
go to the parent.

Nothing here blocks training: the tracker hands every call to a :class:`BufferedSender`
(see :mod:`.sender`) as an operation by name: the run operations of :mod:`.runs`
(``create_run``, ``bind``, ``log_batch``, ``log_artifact``, ``end_run``) and the
registry's (``log_model``, ``register``). A tracking server that is down or slow costs a
warning and a spool file to replay, never the run.

The store is ``tracking.uri`` of the run's configuration, else ``$MLFLOW_TRACKING_URI``,
else MLflow's embedded store ``sqlite:///mlflow.db`` in the working directory.
:func:`ui_links` gives the addresses of a run's pages in the MLflow UI.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from neorl_industrial.integration.mlflow.sender import (
    DEFAULT_TRACKING_URI,
    BufferedSender,
    SendSummary,
    quiet_http_retries,
    resolve_tracking_uri,
)
from neorl_industrial.wrappers.hostio import json_default, write_json_atomic
from neorl_industrial.wrappers.training.callbacks import Callback

if TYPE_CHECKING:
    from neorl_industrial.wrappers.training.trainer import Trainer, TrainResult

# The store's default and its resolution are the sender's; named here too, where the
# command line reads them.
__all__ = [
    "DEFAULT_TRACKING_URI",
    "MlflowTracker",
    "RunMetadata",
    "flatten",
    "resolve_tracking_uri",
    "summary_entries",
    "system_tags",
    "ui_command",
    "ui_links",
]

PARENT = "parent"
RUNS_FILE = "mlflow.json"
SPOOL_FILE = "mlflow-spool.jsonl"
# Per-seed evaluation metrics that are logged (the rest stay in the report).
EVAL_METRICS = (
    "return",
    "normalized_return",
    "normalized_cost",
    "violation_rate",
    "override_rate",
    "fallback_rate",
    "hard_violation_steps",
    "proposed_violations",
    "return_cvar",
    "normalized_return_cvar",
    "normalized_cost_cvar",
)
#: Entries of an evaluation summary that are settings of the evaluation, not results:
#: never metrics; an off-policy estimate's are params (``ope.heldout_episodes``, ...).
SETTINGS = ("episodes", "heldout_episodes", "fqe_updates", "fqe_seeds", "discount")
#: The port :func:`ui_command` opens the UI on.
UI_PORT = 5000
#: MLflow 3's UI opens an experiment on its GenAI pages (traces, token usage); this query
#: opens its machine-learning pages instead (the training runs, models, the registry).
UI_WORKFLOW = "workflowType=machine_learning"


def ui_command(tracking_uri: str) -> str:
    """The command that opens the MLflow UI on ``tracking_uri``."""
    if tracking_uri.startswith(("http://", "https://")):
        return f"open {tracking_uri.rstrip('/')} in a browser"
    return f"{_mlflow_command()} ui --backend-store-uri {tracking_uri} --port {UI_PORT}"


def ui_links(
    tracking_uri: str, experiment_id: str | None, run_id: str | None = None
) -> dict[str, str]:
    """The MLflow UI's pages of an experiment's training runs (``runs``) and of one run
    (``run``), on the server at ``tracking_uri`` or, for a local store, on the UI that
    :func:`ui_command` starts. Empty without an experiment id (nothing reached the store)."""
    if experiment_id is None:
        return {}
    if tracking_uri.startswith(("http://", "https://")):
        base = tracking_uri.rstrip("/")
    else:
        base = f"http://127.0.0.1:{UI_PORT}"
    experiment = f"{base}/#/experiments/{experiment_id}/runs"
    links = {"runs": f"{experiment}?{UI_WORKFLOW}"}
    if run_id is not None:
        links["run"] = f"{experiment}/{run_id}?{UI_WORKFLOW}"
    return links


def _mlflow_command() -> str:
    """``mlflow``, or the path of this environment's ``mlflow`` relative to the working
    directory when the environment lives there (``.venv/bin/mlflow``)."""
    import sys

    script = Path(sys.executable).parent / "mlflow"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return "mlflow"


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested mappings as dotted keys; lists and other leaves as JSON text."""
    flat: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = (
                value if isinstance(value, str) else json.dumps(value, default=json_default)
            )
    return flat


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and len(commit) == 40 else None


def system_tags() -> dict[str, str]:
    """Package and JAX versions, the backend and, when available, the git commit."""
    from importlib import metadata

    import jax

    tags = {"jax.backend": jax.default_backend()}
    for package in ("neorl-industrial", "jax", "jaxlib", "flax", "optax", "mlflow"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            tags[f"version.{package}"] = metadata.version(package)
    commit = _git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
        tags["git.commit"] = commit
    return tags


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float | np.integer | np.floating):
        value = float(value)
        return value if np.isfinite(value) else None
    return None


def summary_entries(
    summary: Mapping[str, Mapping[str, Any]], prefix: str, *, estimated: bool
) -> tuple[dict[str, float], dict[str, str]]:
    """An evaluation summary (mean and 95 % interval over runs, per entry) as MLflow
    metrics and params: every result as ``<prefix><name>_mean`` and ``_ci95`` metrics; the
    evaluation's settings (:data:`SETTINGS`) never as metrics: an off-policy estimate's as
    ``ope.<name>`` params (``ope.heldout_episodes: 3``, ``ope.fqe_updates: 2000``), a
    simulator's not at all (its episodes are the run's ``evaluation.episodes``)."""
    metrics: dict[str, float] = {}
    params: dict[str, str] = {}
    for name, stats in summary.items():
        mean = _number(stats.get("mean"))
        if name in SETTINGS:
            if estimated and mean is not None:
                params[f"ope.{name}"] = str(int(mean)) if mean.is_integer() else repr(mean)
            continue
        if mean is not None:
            metrics[f"{prefix}{name}_mean"] = mean
        ci = _number(stats.get("ci"))
        if ci is not None:
            metrics[f"{prefix}{name}_ci95"] = ci
    return metrics, params


@dataclasses.dataclass(frozen=True)
class RunMetadata:
    """What every MLflow run of a fit is logged with, beside its metrics.

    Attributes:
        params: the parent's params (the settings the run used, flattened); every seed
            run gets them too, with its ``seed``.
        tags: the parent's tags; every seed run gets them too, with its ``seed``.
        dataset: the training data, logged as every run's dataset input: the arguments
            of the ``log_dataset`` operation (``name``, ``digest``, ``source``,
            ``source_type``, ``columns``, ``profile``; see :mod:`.registry`). None: none.
        references: the dataset's random and expert returns, which normalize an
            evaluation's return where the evaluation did not (None: not known).
    """

    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tags: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    dataset: Mapping[str, Any] | None = None
    references: tuple[float, float] | None = None


class MlflowTracker(Callback):
    """Logs a Trainer's runs to MLflow (see the module).

    Args:
        tracking_uri: the store (see :func:`resolve_tracking_uri`).
        experiment: the MLflow experiment's name.
        run_name: the parent run's name (the seeds' runs are ``<run_name>/seed-<s>``).
        run_dir: the run's local directory: the spool file and the MLflow run ids
            (``mlflow.json``, so a resumed run continues its MLflow runs) go there.
        metadata: the params, tags, dataset input and score references of every run
            (default: none).
        flush_timeout: seconds :meth:`close` waits for unsent calls before spooling them.
        retry_interval: seconds between retries while the server is unreachable.
        console: a rich console for the warning (default: a Python warning).
    """

    def __init__(
        self,
        tracking_uri: str,
        *,
        experiment: str,
        run_name: str,
        run_dir: str | Path,
        metadata: RunMetadata | None = None,
        flush_timeout: float = 60.0,
        retry_interval: float = 5.0,
        console: Any = None,
    ) -> None:
        quiet_http_retries()
        metadata = metadata or RunMetadata()
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.run_name = run_name
        self.run_dir = Path(run_dir)
        self.params = {k: str(v) for k, v in metadata.params.items()}
        self.tags = {k: str(v) for k, v in metadata.tags.items() if v is not None}
        self.flush_timeout = flush_timeout
        self.console = console
        self.references = metadata.references
        self.dataset = None if metadata.dataset is None else dict(metadata.dataset)
        self.seeds: list[int] = []
        self.chunk_log: list[dict[str, Any]] = []
        self.eval_log: list[dict[str, Any]] = []
        self.summary: SendSummary | None = None
        self._written = 0
        warn = None
        if console is not None:
            warn = lambda message: console.print(f"[yellow]warning:[/yellow] {message}")  # noqa: E731
        self.sender = BufferedSender(
            self._client,
            spool_path=self.run_dir / SPOOL_FILE,
            header={"tracking_uri": tracking_uri, "experiment": experiment, "run": run_name},
            retry_interval=retry_interval,
            warn=warn,
        )

    def _client(self) -> Any:
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)

    @staticmethod
    def seed_key(seed: int) -> str:
        return f"seed-{seed}"

    # ----- callback --------------------------------------------------------------------
    def on_train_begin(self, trainer: Trainer, updates: int, n_updates: int) -> None:
        self.seeds = list(trainer.seeds)
        now = int(time.time() * 1000)
        known = self._known_runs() if updates > 0 else {}
        base = {"experiment": self.experiment, "time": now}
        parent_tags = {**self.tags, "seeds": json.dumps(self.seeds)}
        if PARENT in known:
            self.sender.submit(
                "bind",
                PARENT,
                run_id=known[PARENT],
                reopen=True,
                **base,
                name=self.run_name,
                tags=parent_tags,
            )
        else:
            self.sender.submit("create_run", PARENT, name=self.run_name, tags=parent_tags, **base)
            self.sender.submit(
                "log_batch",
                PARENT,
                params={**self.params, "n_updates": n_updates},
            )
        self.log_dataset(PARENT)
        for seed in self.seeds:
            key = self.seed_key(seed)
            args = {
                **base,
                "name": f"{self.run_name}/seed-{seed}",
                "tags": {**self.tags, "seed": str(seed)},
                "parent": PARENT,
            }
            if key in known:
                self.sender.submit("bind", key, run_id=known[key], reopen=True, **args)
            else:
                self.sender.submit("create_run", key, **args)
                self.sender.submit("log_batch", key, params={**self.params, "seed": seed})
            self.log_dataset(key)
        if updates > 0:
            self.sender.submit("log_batch", PARENT, tags={"resumed_from": str(updates)})

    def on_chunk_end(self, trainer: Trainer, updates: int, entry: dict[str, Any]) -> None:
        now = int(time.time() * 1000)
        self.chunk_log.append(entry)
        parent = [("train/updates_per_s", entry["updates_per_s"], updates, now)]
        parent.append(("train/chunk_seconds", entry["seconds"], updates, now))
        per_seed: list[list[tuple[str, float, int, int]]] = [[] for _ in self.seeds]
        for name, values in entry["metrics"].items():
            values = np.asarray(values, np.float64).reshape(len(self.seeds), -1).mean(1)
            if np.all(np.isfinite(values)):
                parent.append((f"train/{name}", float(values.mean()), updates, now))
            for i, value in enumerate(values):
                if np.isfinite(value):
                    per_seed[i].append((f"train/{name}", float(value), updates, now))
        self.sender.submit("log_batch", PARENT, metrics=parent)
        for seed, metrics in zip(self.seeds, per_seed, strict=True):
            self.sender.submit("log_batch", self.seed_key(seed), metrics=metrics)
        if len(self.sender.run_ids) != self._written:
            self._write_known_runs()  # so a run resumed after kill -9 continues its runs

    def on_evaluation(self, trainer: Trainer, updates: int, runs: list[dict[str, Any]]) -> None:
        now = int(time.time() * 1000)
        self.eval_log.append({"updates": updates, "runs": runs})
        rows = [self._eval_metrics(run) for run in runs]
        for seed, row in zip(self.seeds, rows, strict=True):
            metrics = [(name, value, updates, now) for name, value in row.items()]
            self.sender.submit("log_batch", self.seed_key(seed), metrics=metrics)
        names = sorted(set().union(*rows)) if rows else []
        parent = []
        for name in names:
            values = [row[name] for row in rows if name in row]
            parent.append((name, float(np.mean(values)), updates, now))
        self.sender.submit("log_batch", PARENT, metrics=parent)

    def _eval_metrics(self, run: dict[str, Any]) -> dict[str, float]:
        if run.get("estimate") is not None:
            return _estimate_metrics(run)
        row = {}
        for name in EVAL_METRICS:
            value = _number(run.get(name))
            if value is not None:
                row[f"eval/{name}"] = value
        if "eval/normalized_return" not in row and self.references is not None:
            random_return, expert_return = self.references
            if "eval/return" in row and expert_return != random_return:
                normalized = (row["eval/return"] - random_return) / (expert_return - random_return)
                row["eval/normalized_return"] = normalized
        if "eval/normalized_return" in row:
            row["eval/normalized_score"] = 100.0 * row["eval/normalized_return"]
        for channel, value in (run.get("normalized_cost_per_channel") or {}).items():
            if _number(value) is not None:
                row[f"eval/normalized_cost/{channel}"] = float(value)
        for channel, value in (run.get("episode_cost") or {}).items():
            if _number(value) is not None:
                row[f"eval/episode_cost/{channel}"] = float(value)
        return row

    def on_train_end(self, trainer: Trainer, result: TrainResult) -> None:
        now = int(time.time() * 1000)
        step = int(np.asarray(result.state.updates)[0])
        estimated = any(b and b["metrics"].get("estimate") for b in result.best)
        prefix = "best/ope_" if estimated else "best/"
        values, settings = summary_entries(result.summary, prefix, estimated=estimated)
        parent = [(name, value, step, now) for name, value in values.items()]
        tags = {"best_run_seed": str(self.seeds[result.best_run])} if self.seeds else {}
        tags["stopped_early"] = str(result.stopped_early).lower()
        self.sender.submit("log_batch", PARENT, metrics=parent, params=settings, tags=tags)
        for seed, best in zip(self.seeds, result.best, strict=True):
            if best is None:
                continue
            row = self._eval_metrics(best["metrics"])
            metrics = [
                (name.replace("eval/", "best/"), value, step, now) for name, value in row.items()
            ]
            metrics.append(("best/updates", float(best["updates"]), step, now))
            self.sender.submit("log_batch", self.seed_key(seed), metrics=metrics)
            self.sender.submit("end_run", self.seed_key(seed), status="FINISHED", time=now)
        self._write_known_runs()

    # ----- after training --------------------------------------------------------------
    def log_dataset(self, key: str) -> None:
        """Logs the training data as the dataset input of the run ``key`` (if given)."""
        if self.dataset is not None:
            self.sender.submit("log_dataset", key, **self.dataset)

    @property
    def experiment_id(self) -> str | None:
        """The experiment's id in the store, once a dataset input reached it."""
        return (self.sender.results.get("log_dataset") or {}).get("experiment_id")

    def links(self) -> dict[str, str]:
        """The UI's pages of the experiment's training runs and of the parent run
        (:func:`ui_links`); empty while nothing reached the store."""
        return ui_links(self.tracking_uri, self.experiment_id, self.parent_run_id)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.sender.submit("log_artifact", PARENT, path=str(path), artifact_path=artifact_path)

    def log_model(
        self,
        policy_dir: str | Path,
        *,
        agent_dir: str | Path | None,
        dataset_card: dict[str, Any] | None,
        input_example: list[list[float]] | None,
        registered_model: str | None,
        version_metrics: dict[str, Any],
        version_tags: dict[str, Any],
        promote: bool,
    ) -> None:
        """Logs the shielded policy as a pyfunc model, registers it and applies the
        promotion rule (all in the background, in this order)."""
        self.sender.submit(
            "log_model",
            PARENT,
            policy_dir=str(policy_dir),
            agent_dir=None if agent_dir is None else str(agent_dir),
            dataset_card=dataset_card,
            input_example=input_example,
            registered_model=registered_model,
        )
        if registered_model is not None:
            self.sender.submit(
                "register",
                None,
                name=registered_model,
                version=None,
                metrics=version_metrics,
                tags=version_tags,
                promote_now=promote,
            )

    def close(self, status: str = "FINISHED") -> SendSummary:
        """Ends the parent run and waits (at most ``flush_timeout`` s) for every call."""
        self.sender.submit("end_run", PARENT, status=status, time=int(time.time() * 1000))
        self.summary = self.sender.close(self.flush_timeout)
        self._write_known_runs()
        return self.summary

    @property
    def parent_run_id(self) -> str | None:
        return self.sender.run_ids.get(PARENT)

    def _known_runs(self) -> dict[str, str]:
        path = self.run_dir / RUNS_FILE
        if not path.exists():
            return {}
        try:
            saved = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return {}
        if saved.get("tracking_uri") != self.tracking_uri:
            return {}
        return dict(saved.get("runs", {}))

    def _write_known_runs(self) -> None:
        runs = dict(self.sender.run_ids)
        if not runs:
            return
        self._written = len(runs)
        write_json_atomic(
            self.run_dir / RUNS_FILE, {"tracking_uri": self.tracking_uri, "runs": runs}
        )


#: Off-policy estimates, logged under ``ope/`` so they are never read as measurements.
OPE_METRICS = ("return", "return_ci", "behaviour_return", "normalized_cost", "override_rate")


def _estimate_metrics(run: dict[str, Any]) -> dict[str, float]:
    row = {}
    for name in OPE_METRICS:
        value = _number(run.get(name))
        if value is not None:
            row[f"ope/{name}"] = value
    for group in ("normalized_cost_per_channel", "cost_value"):
        for channel, value in (run.get(group) or {}).items():
            number = _number(value)
            if number is not None:
                name = "normalized_cost" if group == "normalized_cost_per_channel" else group
                row[f"ope/{name}/{channel}"] = number
    return row
