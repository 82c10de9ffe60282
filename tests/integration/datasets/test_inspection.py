"""Format detection, load_any and inspect_dataset across formats."""

from __future__ import annotations

import json

import numpy as np
import pytest

from neorl_industrial.integration.datasets import (
    DatasetCard,
    DatasetFormatError,
    detect_format,
    inspect_dataset,
    load_any,
    save_native,
    save_neorl_npz,
)
from tests.integration.datasets import assert_same_dataset, make_dataset


@pytest.fixture
def dataset():
    return make_dataset((5, 3, 7))


def test_detects_and_loads_native_and_neorl(tmp_path, dataset):
    save_native(dataset, tmp_path / "native")
    save_neorl_npz(dataset, tmp_path / "d.npz")
    assert detect_format(tmp_path / "native") == "native"
    assert detect_format(tmp_path / "d.npz") == "neorl"
    for path in (tmp_path / "native", tmp_path / "d.npz"):
        loaded, card = load_any(path)
        assert_same_dataset(loaded, dataset)
        assert card.sizes.n_transitions == 15
    assert load_any(tmp_path / "d.npz")[1].source == "neorl"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("missing", "no such file or directory"),
        ("empty_dir", "neither dataset.json"),
        ("data.txt", "unknown format"),
    ],
)
def test_unknown_paths_are_named(tmp_path, name, message):
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "data.txt").write_text("x")
    with pytest.raises(DatasetFormatError, match=message) as caught:
        detect_format(tmp_path / name)
    assert caught.value.path == str(tmp_path / name)


def test_inspect_summarizes_returns_costs_and_card(tmp_path, dataset):
    card = DatasetCard(
        name="boiler",
        cost_names=["heat", "wear"],
        cost_limits={"heat": 2.5},
        random_return=-10.0,
        expert_return=10.0,
    )
    save_native(dataset, tmp_path / "native", card)
    summary = inspect_dataset(tmp_path / "native")
    json.dumps(summary)  # JSON-ready
    returns = np.asarray(dataset.episode_returns(), np.float64)
    episode_costs = np.asarray(dataset.episode_costs(), np.float64)
    assert summary["format"] == "native" and summary["n_transitions"] == 15
    assert summary["n_episodes"] == 3 and summary["terminated_episodes"] == 1
    assert summary["episode_length"] == {
        "mean": 5.0,
        "std": pytest.approx(1.633, abs=1e-3),
        "min": 3.0,
        "max": 7.0,
    }
    assert summary["returns"]["mean"] == pytest.approx(returns.mean(), rel=1e-5)
    assert summary["returns"]["max"] == pytest.approx(returns.max(), rel=1e-5)
    assert summary["normalized_score"]["mean"] == pytest.approx(5 * (returns.mean() + 10))
    heat = summary["costs"]["heat"]
    assert heat["episode_cost"]["mean"] == pytest.approx(episode_costs[:, 0].mean(), rel=1e-5)
    assert heat["limit"] == 2.5
    assert heat["episodes_over_limit"] == int((episode_costs[:, 0] > 2.5).sum())
    assert "limit" not in summary["costs"]["wear"]
    assert summary["card"]["name"] == "boiler" and "checksums" not in summary["card"]


def test_inspect_gives_the_same_numbers_for_every_format(tmp_path, dataset):
    save_native(dataset, tmp_path / "native")
    save_neorl_npz(dataset, tmp_path / "d.npz")
    native, neorl = inspect_dataset(tmp_path / "native"), inspect_dataset(tmp_path / "d.npz")
    for key in ("n_transitions", "n_episodes", "episode_length", "returns", "terminated_episodes"):
        assert native[key] == neorl[key], key
