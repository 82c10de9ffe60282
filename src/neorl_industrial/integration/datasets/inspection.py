"""One entry point for every format: detect it from the path, load it, or summarize it.

Detection: a directory with ``dataset.json`` is native; a directory with
``data/main_data.hdf5`` is Minari; a ``.npz`` file is NeoRL; a ``.csv`` or ``.parquet``
file is a plant log and needs its schema.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import jax
import numpy as np

from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.integration.datasets.arrays import episode_bounds
from neorl_industrial.integration.datasets.card import DatasetCard
from neorl_industrial.integration.datasets.errors import DatasetFormatError
from neorl_industrial.integration.datasets.native import is_native, load_native, read_native_arrays
from neorl_industrial.integration.datasets.neorl import load_neorl_npz

DatasetFormat = Literal["native", "neorl", "minari", "plant-log"]


def detect_format(path: str | os.PathLike[str]) -> DatasetFormat:
    """The format of the dataset at ``path``, judged by its layout and suffix.

    Raises:
        DatasetFormatError: if ``path`` is none of the supported formats.
    """
    path = Path(path)
    if path.is_dir():
        if is_native(path):
            return "native"
        # Minari and plant logs need the 'plant' extra: imported only for their formats.
        from neorl_industrial.integration.datasets.minari import is_minari

        if is_minari(path):
            return "minari"
        raise DatasetFormatError(
            "a directory with neither dataset.json (native) nor data/main_data.hdf5 (Minari)",
            path=path,
        )
    if not path.exists():
        raise DatasetFormatError("no such file or directory", path=path)
    if path.suffix.lower() == ".npz":
        return "neorl"
    from neorl_industrial.integration.datasets.plant_log import is_table

    if is_table(path):
        return "plant-log"
    raise DatasetFormatError(
        "unknown format; expected a native or Minari directory, a NeoRL .npz, or a "
        ".csv / .parquet plant log with a schema",
        path=path,
    )


def load_any(
    path: str | os.PathLike[str],
    schema: str | os.PathLike[str] | None = None,
    *,
    missing: str | None = None,
) -> tuple[Dataset, DatasetCard]:
    """Loads a dataset of any supported format.

    Args:
        path: the dataset (see :func:`detect_format`).
        schema: the YAML schema; required for plant logs, ignored otherwise.
        missing: a plant log's rows with missing values: ``error``, ``drop`` or ``split``
            (None: the schema's ``missing``).

    Returns:
        ``(dataset, card)``; for NeoRL files the card holds only the name and sizes.

    Raises:
        DatasetFormatError: for an unknown format, a plant log without schema, or bad input.
    """
    kind = detect_format(path)
    if kind == "native":
        return load_native(path)
    if kind == "minari":
        from neorl_industrial.integration.datasets.minari import load_minari

        return load_minari(path)
    if kind == "neorl":
        dataset = load_neorl_npz(path)
        return dataset, DatasetCard(name=Path(path).stem, source="neorl").with_sizes(dataset)
    if schema is None:
        raise DatasetFormatError(
            "a plant log needs its YAML schema (schema=...) to say which columns are "
            "observations, actions, reward and costs",
            path=path,
        )
    from neorl_industrial.integration.datasets.plant_log import load_plant_log

    return load_plant_log(path, schema, missing=missing)


def inspect_dataset(
    path: str | os.PathLike[str], schema: str | os.PathLike[str] | None = None
) -> dict[str, Any]:
    """A JSON-ready summary: format, sizes, episode lengths, returns, costs, card fields.

    A native dataset is summarized from memory-mapped files without loading (or
    verifying) its observations; other formats are loaded first.

    Raises:
        DatasetFormatError: as :func:`load_any`.
    """
    kind = detect_format(path)
    if kind == "native":
        arrays, card = read_native_arrays(path, verify=False, mmap=True)
        rewards, costs = arrays["rewards"], arrays["costs"]
        terminals, lengths = arrays["terminals"], arrays["episode_lengths"]
    else:
        dataset, card = load_any(path, schema)
        host = jax.device_get(dataset)
        rewards, costs = host.rewards, host.costs
        terminals, lengths = host.terminals, host.episode_lengths
    sizes = card.sizes.model_dump() if card.sizes is not None else {}
    summary: dict[str, Any] = {"path": str(path), "format": kind, **sizes}
    summary.update(_statistics(rewards, costs, terminals, lengths, card))
    summary["card"] = card.model_dump(mode="json", by_alias=True, exclude={"checksums"})
    return summary


def _stats(values: np.ndarray) -> dict[str, float]:
    return {
        "mean": float(np.mean(values)),
        "std": float(np.std(values)),
        "min": float(np.min(values)),
        "max": float(np.max(values)),
    }


def _statistics(
    rewards: np.ndarray,
    costs: np.ndarray,
    terminals: np.ndarray,
    lengths: np.ndarray,
    card: DatasetCard,
) -> dict[str, Any]:
    lengths = np.asarray(lengths, np.int64)
    starts, ends = episode_bounds(lengths)
    returns = np.add.reduceat(np.asarray(rewards, np.float64), starts)
    statistics: dict[str, Any] = {
        "episode_length": _stats(lengths),
        "terminated_episodes": int(np.asarray(terminals)[ends - 1].sum()),
        "returns": _stats(returns),
    }
    if card.random_return is not None and card.expert_return is not None:
        statistics["normalized_score"] = _stats(card.normalized_score(returns))
    costs = np.asarray(costs, np.float64)
    if costs.shape[1]:
        episode_costs = np.add.reduceat(costs, starts, axis=0)
        names = card.cost_names or [f"cost_{i}" for i in range(costs.shape[1])]
        statistics["costs"] = {}
        for column, name in enumerate(names):
            entry: dict[str, Any] = {"episode_cost": _stats(episode_costs[:, column])}
            limit = card.cost_limits.get(name)
            if limit is not None:
                entry["limit"] = limit
                entry["episodes_over_limit"] = int((episode_costs[:, column] > limit).sum())
            statistics["costs"][name] = entry
    return statistics
