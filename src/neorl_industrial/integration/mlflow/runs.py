"""MLflow runs as operations for the sender: create or bind a run, log a batch of
params, metrics and tags, log an artifact, log the run's dataset input (the data it trained
on, the UI's *Datasets*), end the run.

A run is named by a key of the caller's (``parent``, ``seed-0``); creating or binding it
binds the key to the store's run id, so later operations, and a replay of the spool into
this store or another, find it. A run created with a ``parent`` key is nested under it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from neorl_industrial.integration.mlflow.sender import Delivery, Handler

__all__ = ["MAX_PARAM_LENGTH", "OPERATIONS"]

# MLflow's limits per log_batch call and on a parameter's value.
_MAX_METRICS, _MAX_PARAMS, _MAX_TAGS = 1000, 100, 100
MAX_PARAM_LENGTH = 6000


def _run_id(delivery: Delivery, op: str, key: str | None) -> str:
    if key not in delivery.ids:
        raise KeyError(f"operation {op!r} names the run {key!r}, which was never created")
    return delivery.ids[key]


def _experiment_id(client: Any, name: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage == "deleted":
            client.restore_experiment(experiment.experiment_id)
        return experiment.experiment_id
    try:
        return client.create_experiment(name)
    except Exception:
        # Created by another process in the meantime.
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def create_run(delivery: Delivery, key: str | None, args: dict[str, Any]) -> None:
    """Creates the run ``key`` in the experiment ``args["experiment"]`` (with ``name``,
    ``tags``, start ``time`` and, nested under it, the ``parent`` run's key)."""
    client = delivery.client
    tags = dict(args.get("tags", {}))
    parent = args.get("parent")
    if parent is not None:
        if parent not in delivery.ids:
            raise KeyError(f"run {key!r}: its parent run {parent!r} was never created")
        tags["mlflow.parentRunId"] = delivery.ids[parent]
    run = client.create_run(
        _experiment_id(client, args["experiment"]),
        start_time=args.get("time"),
        tags=tags,
        run_name=args.get("name"),
    )
    _bind(delivery, key, run.info.run_id, args)


def bind(delivery: Delivery, key: str | None, args: dict[str, Any]) -> None:
    """Binds ``key`` to the existing run ``args["run_id"]`` (set ``RUNNING`` again with
    ``reopen``), or creates it as :func:`create_run` does when this store lacks it."""
    from mlflow.exceptions import MlflowException

    client = delivery.client
    if args.get("run_id"):
        try:
            run = client.get_run(args["run_id"])
        except MlflowException:
            run = None  # not in this store: create it again below
        if run is not None:
            if args.get("reopen") and run.info.status != "RUNNING":
                client.update_run(run.info.run_id, status="RUNNING")
            _bind(delivery, key, run.info.run_id, args)
            return
    create_run(delivery, key, args)


def _bind(delivery: Delivery, key: str | None, run_id: str, args: dict[str, Any]) -> None:
    if key is None:
        raise KeyError("a run needs a key to be created or bound")
    delivery.bind(key, run_id, {"op": "bind", "run": key, "args": {**args, "run_id": run_id}})


def log_batch(delivery: Delivery, key: str | None, args: dict[str, Any]) -> None:
    """Logs ``metrics`` (``[name, value, step, time]`` rows), ``params`` and ``tags`` to
    the run ``key``, in as many calls as MLflow's limits per call need."""
    from mlflow.entities import Metric, Param, RunTag

    run_id = _run_id(delivery, "log_batch", key)
    metrics = [Metric(k, float(v), int(t), int(s)) for k, v, s, t in args.get("metrics", [])]
    params = [
        Param(k, str(v)[:MAX_PARAM_LENGTH]) for k, v in sorted(args.get("params", {}).items())
    ]
    tags = [RunTag(k, str(v)) for k, v in sorted(args.get("tags", {}).items())]
    while metrics or params or tags:
        delivery.client.log_batch(
            run_id,
            metrics=metrics[:_MAX_METRICS],
            params=params[:_MAX_PARAMS],
            tags=tags[:_MAX_TAGS],
        )
        metrics, params, tags = (
            metrics[_MAX_METRICS:],
            params[_MAX_PARAMS:],
            tags[_MAX_TAGS:],
        )


def log_artifact(delivery: Delivery, key: str | None, args: dict[str, Any]) -> None:
    """Logs the file or directory ``args["path"]`` to the run ``key`` (under
    ``artifact_path``)."""
    run_id = _run_id(delivery, "log_artifact", key)
    path = Path(args["path"])
    if not path.exists():
        raise FileNotFoundError(f"{path}: the artifact to log no longer exists")
    if path.is_dir():
        delivery.client.log_artifacts(run_id, str(path), args.get("artifact_path"))
    else:
        delivery.client.log_artifact(run_id, str(path), args.get("artifact_path"))


def end_run(delivery: Delivery, key: str | None, args: dict[str, Any]) -> None:
    """Ends the run ``key`` with ``status`` (default ``FINISHED``) at ``time``."""
    run_id = _run_id(delivery, "end_run", key)
    delivery.client.set_terminated(
        run_id, args.get("status", "FINISHED"), end_time=args.get("time")
    )


def log_dataset(delivery: Delivery, key: str | None, args: dict[str, Any]) -> dict[str, Any]:
    """Logs the dataset described by ``args`` as an input of the run ``key``, built with
    :mod:`mlflow.data` (a :class:`~mlflow.data.meta_dataset.MetaDataset`: metadata, not
    the arrays): ``name``; ``digest`` (the data's fingerprint); ``source`` and
    ``source_type`` (``local``: the stored dataset's directory; ``code``: a description of
    how it was generated); ``columns`` (``[[name, type], ...]``, the schema); ``profile``
    (sizes) and ``context`` (``training``). Logging the same dataset again (a resumed run)
    adds nothing. Returns the run's and its experiment's ids, the name and the digest."""
    from mlflow.data.dataset_source_registry import get_dataset_source_from_json
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.types import ColSpec, Schema

    client = delivery.client
    run_id = _run_id(delivery, "log_dataset", key)
    source_type = args["source_type"]
    if source_type == "local":
        source_json = json.dumps({"uri": args["source"]})
    elif source_type == "code":
        source_json = json.dumps({"tags": {"mlflow.source.name": args["source"]}})
    else:
        raise KeyError(f"log_dataset: unknown source type {source_type!r} (local or code)")
    columns = [ColSpec(kind, name) for name, kind in args.get("columns") or []]
    described = MetaDataset(
        get_dataset_source_from_json(source_json, source_type),
        name=args["name"],
        digest=args["digest"],
        schema=Schema(columns) if columns else None,
    ).to_dict()
    profile = args.get("profile")
    dataset = Dataset(
        name=described["name"],
        digest=described["digest"],
        source_type=described["source_type"],
        source=described["source"],
        schema=described.get("schema"),
        profile=None if profile is None else json.dumps(profile, sort_keys=True),
    )
    context = InputTag("mlflow.data.context", args.get("context", "training"))
    client.log_inputs(run_id, datasets=[DatasetInput(dataset, tags=[context])])
    experiment_id = client.get_run(run_id).info.experiment_id
    return {
        "run_id": run_id,
        "experiment_id": experiment_id,
        "name": dataset.name,
        "digest": dataset.digest,
    }


#: The run operations by name, registered with the sender by the package.
OPERATIONS: dict[str, Handler] = {
    "create_run": create_run,
    "bind": bind,
    "log_batch": log_batch,
    "log_artifact": log_artifact,
    "end_run": end_run,
    "log_dataset": log_dataset,
}
