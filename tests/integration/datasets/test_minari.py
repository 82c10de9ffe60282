"""Minari datasets read from an HDF5 file laid out as Minari writes it."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from neorl_industrial.integration.datasets import DatasetFormatError, load_any, load_minari


def _write_minari(
    root, lengths=(4, 2, 3), *, discrete=False, cost=True, metadata_next_to_data=False
):
    """A Minari dataset directory: one HDF5 group per episode (with the reset's info
    included in ``infos``, as Minari records it) and ``metadata.json``."""
    rng = np.random.default_rng(0)
    (root / "data").mkdir(parents=True)
    episodes = []
    with h5py.File(root / "data" / "main_data.hdf5", "w") as file:
        # Written out of order: ids, not file order, define the episode order.
        for episode_id in reversed(range(len(lengths))):
            steps = lengths[episode_id]
            group = file.create_group(f"episode_{episode_id}")
            episode = {
                "observations": rng.normal(size=(steps + 1, 3)).astype(np.float32),
                "actions": (
                    rng.integers(0, 4, steps)
                    if discrete
                    else rng.normal(size=(steps, 2)).astype(np.float32)
                ),
                "rewards": rng.normal(size=steps),
                "terminations": np.arange(steps) == steps - 1
                if episode_id == 0
                else np.zeros(steps, bool),
                "truncations": np.zeros(steps, bool)
                if episode_id == 0
                else np.arange(steps) == steps - 1,
            }
            for key, value in episode.items():
                group.create_dataset(key, data=value)
            if cost:
                episode["cost"] = rng.random(steps + 1)
                group.create_group("infos").create_dataset("cost", data=episode["cost"])
            episodes.insert(0, episode)
    metadata = {
        "dataset_id": "plant/valve-expert-v0",
        "total_episodes": len(lengths),
        "total_steps": sum(lengths),
        "data_format": "hdf5",
        "env_spec": json.dumps({"id": "neorl_industrial/IB-v0", "max_episode_steps": 100}),
        "algorithm_name": "TD3",
        "ref_min_score": -100.0,
        "ref_max_score": 50.0,
    }
    metadata_dir = root if metadata_next_to_data else root / "data"
    (metadata_dir / "metadata.json").write_text(json.dumps(metadata))
    return episodes


def test_reads_episodes_costs_and_card(tmp_path):
    episodes = _write_minari(tmp_path / "minari")
    dataset, card = load_minari(tmp_path / "minari")
    assert dataset.episode_lengths.tolist() == [4, 2, 3]
    np.testing.assert_allclose(
        dataset.observations[:5], episodes[0]["observations"], rtol=0, atol=0
    )
    np.testing.assert_allclose(dataset.actions[4:6], episodes[1]["actions"])
    np.testing.assert_allclose(dataset.rewards[6:], episodes[2]["rewards"], rtol=1e-6)
    # The reset's info is dropped: step t's cost is info t + 1.
    np.testing.assert_allclose(dataset.costs[:4, 0], episodes[0]["cost"][1:], rtol=1e-6)
    assert dataset.terminals.tolist()[:4] == [False, False, False, True]
    assert dataset.timeouts.tolist()[4:] == [False, True, False, False, True]
    assert card.name == "plant/valve-expert-v0" and card.env_id == "neorl_industrial/IB-v0"
    assert card.source == "minari" and card.behaviour_policy.name == "TD3"
    assert (card.random_return, card.expert_return) == (-100.0, 50.0)
    assert card.cost_names == ["cost"] and card.sizes.n_transitions == 9


def test_discrete_actions_without_costs_and_metadata_next_to_data(tmp_path):
    _write_minari(tmp_path / "m", discrete=True, cost=False, metadata_next_to_data=True)
    dataset, card = load_any(tmp_path / "m")
    assert dataset.discrete and dataset.actions.dtype == np.int32
    assert dataset.n_costs == 0 and card.cost_names == []
    assert card.expert_return == 50.0


def test_lengths_that_disagree_name_the_group_and_array(tmp_path):
    _write_minari(tmp_path / "m")
    with h5py.File(tmp_path / "m" / "data" / "main_data.hdf5", "a") as file:
        del file["episode_1/actions"]
        file["episode_1"].create_dataset("actions", data=np.zeros((3, 2), np.float32))
    with pytest.raises(DatasetFormatError, match="column 'episode_1/actions': 3 rows") as caught:
        load_minari(tmp_path / "m")
    assert caught.value.path.endswith("main_data.hdf5")


def test_nan_names_the_group_array_and_row(tmp_path):
    _write_minari(tmp_path / "m")
    with h5py.File(tmp_path / "m" / "data" / "main_data.hdf5", "a") as file:
        file["episode_2/observations"][2, 1] = np.nan
    with pytest.raises(
        DatasetFormatError, match="column 'episode_2/observations', row 2: NaN or infinite"
    ):
        load_minari(tmp_path / "m")


def test_nested_observation_groups_are_rejected_clearly(tmp_path):
    _write_minari(tmp_path / "m")
    with h5py.File(tmp_path / "m" / "data" / "main_data.hdf5", "a") as file:
        del file["episode_0/observations"]
        file["episode_0"].create_group("observations").create_dataset("pos", data=np.zeros(5))
    with pytest.raises(DatasetFormatError, match="'episode_0/observations': is a group"):
        load_minari(tmp_path / "m")


def test_not_a_minari_directory(tmp_path):
    with pytest.raises(DatasetFormatError, match=r"no data/main_data\.hdf5"):
        load_minari(tmp_path)
