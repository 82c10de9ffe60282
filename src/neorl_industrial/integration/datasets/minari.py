"""Minari datasets from a local directory, read with h5py (no dependency on ``minari``).

Layout::

    <dataset_dir>/
      data/
        main_data.hdf5      groups episode_<id>: observations [T+1, ...], actions [T, ...],
                            rewards [T], terminations [T], truncations [T], infos (optional)
        metadata.json       dataset_id, env_spec, ref_min_score, ref_max_score, ...

Minari itself keeps ``metadata.json`` inside ``data/``; one next to ``data/`` is read too.
Observations and actions must be plain arrays (Minari flattens ``Dict``/``Tuple`` spaces
only when asked to; nested groups are rejected with the path of the group). A per-step
cost is taken from ``infos/cost`` when present.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from neorl_industrial.extras import optional_imports

with optional_imports():  # the 'plant' extra
    import h5py

from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.integration.datasets.card import BehaviourPolicy, DatasetCard
from neorl_industrial.integration.datasets.errors import DatasetFormatError

DATA_FILE = Path("data", "main_data.hdf5")


def is_minari(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory laid out as a Minari HDF5 dataset."""
    return Path(path, DATA_FILE).is_file()


def load_minari(path: str | os.PathLike[str]) -> tuple[Dataset, DatasetCard]:
    """Reads a Minari dataset directory (HDF5 storage).

    Returns:
        ``(dataset, card)``; the card carries the dataset id, the environment id, the
        reference scores (as random and expert returns) and the algorithm name.

    Raises:
        DatasetFormatError: naming the file and the episode group's array when the layout
            or the lengths are wrong, or a value is NaN or infinite.
    """
    root = Path(path)
    data_file = root / DATA_FILE
    if not data_file.is_file():
        raise DatasetFormatError(f"no {DATA_FILE} (not a Minari HDF5 dataset)", path=root)
    metadata = _read_metadata(root)
    if metadata.get("data_format", "hdf5") != "hdf5":
        raise DatasetFormatError(
            f"data_format is {metadata['data_format']!r}; only Minari's hdf5 storage is read",
            path=root / "data" / "metadata.json",
        )
    try:
        file = h5py.File(data_file, "r")
    except OSError as error:
        raise DatasetFormatError(f"not a readable HDF5 file: {error}", path=data_file) from error
    with file:
        names = _episode_names(file, data_file)
        episodes = [_read_episode(file[name], name, data_file) for name in names]
    try:
        dataset = Dataset.from_episodes(episodes, name=str(data_file))
    except ValueError as error:
        raise DatasetFormatError(str(error)) from error
    return dataset, _card(root, metadata, dataset)


def _read_metadata(root: Path) -> dict[str, Any]:
    for candidate in (root / "data" / "metadata.json", root / "metadata.json"):
        if candidate.is_file():
            try:
                return json.loads(candidate.read_text(encoding="utf-8"))
            except json.JSONDecodeError as error:
                raise DatasetFormatError(f"invalid JSON: {error}", path=candidate) from error
    return {}


def _episode_names(file: h5py.File, data_file: Path) -> list[str]:
    numbered = []
    for name in file:
        prefix, _, number = name.partition("_")
        if prefix == "episode" and number.isdigit():
            numbered.append((int(number), name))
    if not numbered:
        raise DatasetFormatError(
            f"no episode_<id> groups; the file holds {sorted(file)[:10]}", path=data_file
        )
    return [name for _, name in sorted(numbered)]


def _array(group: h5py.Group, key: str, name: str, data_file: Path) -> np.ndarray:
    if key not in group:
        raise DatasetFormatError(
            f"missing; the group holds {sorted(group)}", path=data_file, column=f"{name}/{key}"
        )
    item = group[key]
    if not isinstance(item, h5py.Dataset):
        raise DatasetFormatError(
            "is a group (a Dict or Tuple space); flatten it to one array when creating the "
            "Minari dataset",
            path=data_file,
            column=f"{name}/{key}",
        )
    return item[()]


def _read_episode(group: Any, name: str, data_file: Path) -> dict[str, Any]:
    observations = _array(group, "observations", name, data_file)
    actions = _array(group, "actions", name, data_file)
    rewards = _array(group, "rewards", name, data_file).reshape(-1)
    terminations = _array(group, "terminations", name, data_file).reshape(-1)
    steps = len(rewards)
    expected = {"observations": steps + 1, "actions": steps, "terminations": steps}
    arrays = {"observations": observations, "actions": actions, "terminations": terminations}
    if "truncations" in group:
        arrays["truncations"] = _array(group, "truncations", name, data_file).reshape(-1)
        expected["truncations"] = steps
    for key, rows in expected.items():
        if len(arrays[key]) != rows:
            raise DatasetFormatError(
                f"{len(arrays[key])} rows, but {name}/rewards has {steps} steps, so {rows} "
                "are needed",
                path=data_file,
                column=f"{name}/{key}",
            )
    for key, array in (("observations", observations), ("actions", actions), ("rewards", rewards)):
        if array.dtype.kind == "f":
            finite = np.isfinite(array).reshape(len(array), -1).all(axis=1)
            if not finite.all():
                raise DatasetFormatError(
                    "NaN or infinite value",
                    path=data_file,
                    column=f"{name}/{key}",
                    row=int(np.argmin(finite)),
                )
    discrete = np.issubdtype(actions.dtype, np.integer) and actions.ndim == 1
    return {
        "observations": observations.reshape(steps + 1, -1),
        "actions": actions if discrete else actions.reshape(steps, -1),
        "rewards": rewards,
        "costs": _costs(group, name, steps, data_file),
        "terminated": bool(terminations[-1]),
    }


def _costs(group: Any, name: str, steps: int, data_file: Path) -> np.ndarray | None:
    infos = group.get("infos")
    if isinstance(infos, h5py.Group) and isinstance(infos.get("cost"), h5py.Dataset):
        cost = np.asarray(infos["cost"][()], np.float32)
    elif isinstance(infos, h5py.Dataset) and infos.dtype.kind in "OS":
        # Newer Minari writes infos as one JSON document per step.
        records = [json.loads(item) for item in infos[()]]
        if not records or not all("cost" in record for record in records):
            return None
        cost = np.asarray([record["cost"] for record in records], np.float32)
    else:
        return None
    # Minari records the reset's info too: T + 1 entries, the first before any step.
    if len(cost) == steps + 1:
        cost = cost[1:]
    if len(cost) != steps:
        raise DatasetFormatError(
            f"{len(cost)} rows for {steps} steps (expected {steps} or {steps + 1})",
            path=data_file,
            column=f"{name}/infos/cost",
        )
    return cost.reshape(steps, -1)


def _card(root: Path, metadata: dict[str, Any], dataset: Dataset) -> DatasetCard:
    env_id = None
    spec = metadata.get("env_spec")
    if isinstance(spec, str):
        try:
            env_id = json.loads(spec).get("id")
        except (json.JSONDecodeError, AttributeError):
            env_id = None
    algorithm = metadata.get("algorithm_name")
    card = DatasetCard(
        name=str(metadata.get("dataset_id") or root.name),
        description=metadata.get("description"),
        source="minari",
        env_id=env_id,
        behaviour_policy=BehaviourPolicy(name=algorithm) if algorithm else None,
        random_return=metadata.get("ref_min_score"),
        expert_return=metadata.get("ref_max_score"),
        cost_names=["cost"] if dataset.n_costs == 1 else [],
    )
    return card.with_sizes(dataset)
