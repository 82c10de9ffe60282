"""The native format: round trips, atomic and refusing writes, integrity checks."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from neorl_industrial.integration.datasets import (
    DatasetCard,
    DatasetFormatError,
    load_native,
    save_native,
)
from neorl_industrial.integration.datasets import native as native_module
from tests.integration.datasets import assert_same_dataset, make_dataset


@pytest.mark.parametrize("mmap", [False, True])
def test_round_trip_is_exact(tmp_path, mmap):
    dataset = make_dataset()
    card = DatasetCard(
        name="boiler", cost_names=["heat", "wear"], cost_limits={"heat": 3.0}, seed=7
    )
    written = save_native(dataset, tmp_path / "boiler", card)
    loaded, loaded_card = load_native(tmp_path / "boiler", mmap=mmap)
    assert_same_dataset(loaded, dataset)
    assert loaded_card == written
    assert loaded_card.sizes.n_transitions == 15 and loaded_card.sizes.n_episodes == 3
    assert loaded_card.cost_limits == {"heat": 3.0} and loaded_card.seed == 7
    assert set(loaded_card.checksums) == {f"{name}.npy" for name in loaded_card.array_schema}
    assert loaded_card.array_schema["observations"].shape == [18, 4]


def test_discrete_actions_and_no_costs_round_trip(tmp_path):
    dataset = make_dataset((4, 6), discrete=True, n_costs=0)
    save_native(dataset, tmp_path / "d")
    loaded, card = load_native(tmp_path / "d")
    assert_same_dataset(loaded, dataset)
    assert loaded.discrete and card.sizes.discrete and card.cost_names == []


def test_card_file_spells_schema_and_checksums(tmp_path):
    save_native(make_dataset(), tmp_path / "d")
    document = json.loads((tmp_path / "d" / "dataset.json").read_text())
    assert document["schema"]["actions"] == {"dtype": "<f4", "shape": [15, 2]}
    assert len(document["checksums"]["rewards.npy"]) == 64
    assert document["created"].endswith("Z")


def test_refuses_to_overwrite_unless_asked(tmp_path):
    target = tmp_path / "d"
    save_native(make_dataset(seed=1), target)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_native(make_dataset(seed=2), target)
    replacement = make_dataset((2, 2), seed=2)
    save_native(replacement, target, overwrite=True)
    assert_same_dataset(load_native(target)[0], replacement)
    assert sorted(os.listdir(tmp_path)) == ["d"]


def test_overwrite_never_deletes_a_directory_that_is_not_a_dataset(tmp_path):
    target = tmp_path / "results"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="does not look like a dataset"):
        save_native(make_dataset(), target, overwrite=True)
    assert (target / "notes.txt").read_text() == "keep me"


def _fail_on_third_array(monkeypatch):
    calls = []
    real_save = np.save

    def failing_save(file, array, **kwargs):
        calls.append(array.shape)
        if len(calls) == 3:
            raise OSError("disk full")
        real_save(file, array, **kwargs)

    monkeypatch.setattr(native_module.np, "save", failing_save)


def test_failure_mid_save_leaves_nothing_behind(tmp_path, monkeypatch):
    _fail_on_third_array(monkeypatch)
    with pytest.raises(OSError, match="disk full"):
        save_native(make_dataset(), tmp_path / "d")
    assert os.listdir(tmp_path) == []


def test_failure_mid_overwrite_keeps_the_old_dataset(tmp_path, monkeypatch):
    original = make_dataset(seed=1)
    save_native(original, tmp_path / "d")
    _fail_on_third_array(monkeypatch)
    with pytest.raises(OSError, match="disk full"):
        save_native(make_dataset(seed=2), tmp_path / "d", overwrite=True)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["d"]
    assert_same_dataset(load_native(tmp_path / "d")[0], original)


def test_a_corrupted_byte_is_caught_by_its_checksum(tmp_path):
    save_native(make_dataset(), tmp_path / "d")
    path = tmp_path / "d" / "rewards.npy"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # a bit in the last reward
    path.write_bytes(bytes(data))
    with pytest.raises(DatasetFormatError, match=r"rewards\.npy: sha256 mismatch") as caught:
        load_native(tmp_path / "d")
    assert caught.value.path == str(path)
    # Without verification the (corrupt) data loads: the check is what catches it.
    loaded, _ = load_native(tmp_path / "d", verify=False)
    assert not np.array_equal(np.asarray(loaded.rewards), np.asarray(make_dataset().rewards))


def test_an_array_that_disagrees_with_the_card_is_named(tmp_path):
    save_native(make_dataset(), tmp_path / "d")
    np.save(tmp_path / "d" / "actions.npy", np.zeros((15, 3), np.float32))
    with pytest.raises(DatasetFormatError, match=r"actions\.npy: holds <f4 \[15, 3\]"):
        load_native(tmp_path / "d", verify=False)


def test_lengths_that_disagree_with_the_episodes_are_named(tmp_path):
    save_native(make_dataset(), tmp_path / "d")
    np.save(tmp_path / "d" / "episode_lengths.npy", np.asarray([5, 3, 6], np.int32))
    card_path = tmp_path / "d" / "dataset.json"
    document = json.loads(card_path.read_text())
    del document["schema"]
    card_path.write_text(json.dumps(document))
    with pytest.raises(DatasetFormatError, match="column 'observations': 18 rows") as caught:
        load_native(tmp_path / "d", verify=False)
    assert caught.value.column == "observations"


def test_missing_file_and_bad_card_are_named(tmp_path):
    save_native(make_dataset(), tmp_path / "d")
    (tmp_path / "d" / "timeouts.npy").unlink()
    with pytest.raises(DatasetFormatError, match=r"missing array file timeouts\.npy"):
        load_native(tmp_path / "d")
    (tmp_path / "d" / "dataset.json").write_text('{"name": 3, "sizes": {"n_episodes": "x"}}')
    with pytest.raises(DatasetFormatError, match=r"dataset\.json: invalid dataset card") as caught:
        load_native(tmp_path / "d")
    assert "sizes.n_episodes" in str(caught.value)


def test_cost_names_must_match_the_data(tmp_path):
    with pytest.raises(ValueError, match="has 1 entries but the data has 2 costs"):
        save_native(make_dataset(), tmp_path / "d", DatasetCard(cost_names=["heat"]))
    assert not (tmp_path / "d").exists()


def _staging(parent, name, age_s):
    """A staging directory like one a killed save leaves, ``age_s`` seconds old."""
    staging = parent / f".{name}.k1ll3d.tmp"
    staging.mkdir(parents=True)
    (staging / "observations.npy").write_bytes(b"\0" * 1024)
    stamp = os.stat(staging).st_mtime - age_s
    os.utime(staging, (stamp, stamp))
    return staging


def test_a_save_removes_stale_staging_of_killed_saves_and_keeps_fresh_ones(tmp_path):
    stale = _staging(tmp_path, "boiler", 2 * native_module.STALE_STAGING_AGE)
    fresh = _staging(tmp_path, "other", 60)  # a save still at work next door
    unrelated = tmp_path / "notes.tmp"
    unrelated.write_text("kept")
    with pytest.warns(UserWarning, match=r"removed 1 staging entry .* interrupted writes"):
        save_native(make_dataset(), tmp_path / "boiler")
    assert not stale.exists()
    assert fresh.is_dir() and unrelated.is_file()
    assert load_native(tmp_path / "boiler")[0].n_transitions == 15
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["boiler", fresh.name, "notes.tmp"])
