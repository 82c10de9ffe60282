"""The NeoRL .npz layout: what we write reads back, and NeoRL's own files read."""

from __future__ import annotations

import os

import numpy as np
import pytest

from neorl_industrial.integration.datasets import (
    DatasetFormatError,
    load_neorl_npz,
    save_neorl_npz,
)
from tests.integration.datasets import assert_same_dataset, make_dataset


def test_round_trip(tmp_path):
    dataset = make_dataset((5, 3, 7))
    save_neorl_npz(dataset, tmp_path / "d.npz")
    assert_same_dataset(load_neorl_npz(tmp_path / "d.npz"), dataset)
    with np.load(tmp_path / "d.npz") as archive:
        assert archive["reward"].shape == (15, 1) and archive["done"].shape == (15, 1)
        assert archive["index"].tolist() == [0, 5, 8]
        assert archive["cost"].shape == (15, 2)


def test_round_trip_discrete_without_costs(tmp_path):
    dataset = make_dataset((4, 2), discrete=True, n_costs=0)
    save_neorl_npz(dataset, tmp_path / "d.npz")
    with np.load(tmp_path / "d.npz") as archive:
        assert "cost" not in archive.files
    assert_same_dataset(load_neorl_npz(tmp_path / "d.npz"), dataset)


def _neorl_arrays(lengths=(4, 3), obs_size=3):
    """Trajectories laid out as NeoRL writes them: flat rows, [N, 1] rewards and dones,
    and the start row of every trajectory in ``index``."""
    rng = np.random.default_rng(0)
    obs, next_obs = [], []
    for length in lengths:
        states = rng.normal(size=(length + 1, obs_size)).astype(np.float32)
        obs.append(states[:-1])
        next_obs.append(states[1:])
    n = sum(lengths)
    done = np.zeros((n, 1), np.float32)
    done[lengths[0] - 1] = 1.0  # the first trajectory ends in a terminal state
    return {
        "obs": np.concatenate(obs),
        "next_obs": np.concatenate(next_obs),
        "action": rng.normal(size=(n, 2)).astype(np.float32),
        "reward": rng.normal(size=(n, 1)).astype(np.float32),
        "done": done,
        "index": np.asarray(np.cumsum((0, *lengths[:-1])), np.int64),
    }


def test_reads_a_hand_built_neorl_file(tmp_path):
    arrays = _neorl_arrays()
    np.savez(tmp_path / "neorl.npz", **arrays)
    dataset = load_neorl_npz(tmp_path / "neorl.npz")
    assert dataset.n_episodes == 2 and dataset.episode_lengths.tolist() == [4, 3]
    np.testing.assert_array_equal(dataset.rewards, arrays["reward"][:, 0])
    np.testing.assert_array_equal(dataset.to_flat()["next_observations"], arrays["next_obs"])
    assert dataset.terminals.tolist() == [False] * 3 + [True] + [False] * 3
    assert dataset.timeouts.tolist() == [False] * 6 + [True]
    assert dataset.n_costs == 0


def test_index_splits_trajectories_even_when_observations_continue(tmp_path):
    arrays = _neorl_arrays((3, 3))
    arrays["obs"][3] = arrays["next_obs"][2]  # continuous across the boundary
    arrays["done"][:] = 0
    np.savez(tmp_path / "neorl.npz", **arrays)
    assert load_neorl_npz(tmp_path / "neorl.npz").episode_lengths.tolist() == [3, 3]


def test_optional_cost_key_is_read(tmp_path):
    arrays = _neorl_arrays()
    arrays["cost"] = np.arange(7, dtype=np.float32)
    np.savez(tmp_path / "neorl.npz", **arrays)
    dataset = load_neorl_npz(tmp_path / "neorl.npz")
    assert dataset.costs.shape == (7, 1)
    np.testing.assert_array_equal(dataset.costs[:, 0], arrays["cost"])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: a.pop("reward"), r"missing key\(s\) \['reward'\]"),
        (lambda a: a.update(action=a["action"][:-1]), "column 'action': 6 rows, but 'obs' has 7"),
        (lambda a: a["next_obs"].__setitem__((5, 1), np.nan), "column 'next_obs', row 5: NaN"),
        (lambda a: a["reward"].__setitem__((2, 0), np.inf), "column 'reward', row 2: NaN or inf"),
        (
            lambda a: a.update(index=np.asarray([0, 9])),
            "column 'index', row 1: start row 9 is past",
        ),
        (lambda a: a.update(index=np.asarray([1, 4])), "column 'index', row 0: the first"),
        (lambda a: a.update(index=np.asarray([0, 4, 4])), "column 'index', row 2: start row 4"),
    ],
)
def test_bad_files_name_the_key_and_row(tmp_path, change, message):
    arrays = _neorl_arrays()
    change(arrays)
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DatasetFormatError, match=message) as caught:
        load_neorl_npz(tmp_path / "bad.npz")
    assert str(caught.value).startswith(str(tmp_path / "bad.npz"))


def test_not_an_npz_is_named(tmp_path):
    (tmp_path / "bad.npz").write_text("hello")
    with pytest.raises(DatasetFormatError, match=r"bad\.npz: not a readable \.npz file"):
        load_neorl_npz(tmp_path / "bad.npz")


def test_save_is_atomic_and_refuses_to_overwrite(tmp_path, monkeypatch):
    dataset = make_dataset()
    save_neorl_npz(dataset, tmp_path / "d.npz")
    with pytest.raises(FileExistsError):
        save_neorl_npz(dataset, tmp_path / "d.npz")
    before = (tmp_path / "d.npz").read_bytes()

    def failing_savez(file, **arrays):
        file.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", failing_savez)
    with pytest.raises(OSError, match="disk full"):
        save_neorl_npz(make_dataset(seed=5), tmp_path / "d.npz", overwrite=True)
    assert os.listdir(tmp_path) == ["d.npz"]
    assert (tmp_path / "d.npz").read_bytes() == before
