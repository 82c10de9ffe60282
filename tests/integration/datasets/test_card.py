"""The dataset card: validation, normalized scores, JSON round trip."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

import neorl_industrial
from neorl_industrial.integration.datasets import (
    DatasetCard,
    DatasetFormatError,
    normalized_score,
)
from tests.integration.datasets import make_dataset


def test_normalized_score_is_d4rl_style():
    np.testing.assert_allclose(normalized_score([-10.0, 0.0, 30.0], -10.0, 30.0), [0, 25, 100])
    card = DatasetCard(random_return=100.0, expert_return=300.0)
    assert float(card.normalized_score(250.0)) == pytest.approx(75.0)


def test_normalized_score_needs_both_references():
    with pytest.raises(ValueError, match="needs random_return and expert_return"):
        DatasetCard(name="x", random_return=1.0).normalized_score(2.0)
    with pytest.raises(ValueError, match="undefined"):
        normalized_score(1.0, 5.0, 5.0)


def test_cost_limits_must_name_known_costs():
    with pytest.raises(ValidationError, match="not in cost_names"):
        DatasetCard(cost_names=["heat"], cost_limits={"noise": 1.0})


def test_defaults_record_version_and_utc_time():
    card = DatasetCard()
    assert card.package_version == neorl_industrial.__version__
    assert card.created.utcoffset().total_seconds() == 0


def test_with_sizes_fills_sizes_and_default_cost_names():
    card = DatasetCard().with_sizes(make_dataset((2, 3), n_costs=2))
    assert card.sizes.n_transitions == 5 and card.sizes.n_episodes == 2
    assert card.cost_names == ["cost_0", "cost_1"]


def test_json_round_trip_keeps_unknown_fields(tmp_path):
    card = DatasetCard.model_validate(
        {"name": "x", "schema": {"rewards": {"dtype": "<f4", "shape": [3]}}, "future_field": 1}
    )
    path = tmp_path / "card.json"
    path.write_text(card.to_json())
    loaded = DatasetCard.read(path)
    assert loaded == card
    assert loaded.array_schema["rewards"].shape == [3]
    assert loaded.model_extra == {"future_field": 1}
    assert '"schema"' in path.read_text()


def test_read_names_the_file_and_field(tmp_path):
    path = tmp_path / "card.json"
    path.write_text('{"behaviour_policy": {"mean_return": "high"}}')
    with pytest.raises(DatasetFormatError, match=r"card\.json: invalid dataset card") as caught:
        DatasetCard.read(path)
    assert "behaviour_policy.mean_return" in str(caught.value)


def test_reward_row_is_optional_and_checked(tmp_path):
    # A card written before the field existed (or of data that is not a plant log) loads.
    path = tmp_path / "card.json"
    path.write_text('{"name": "old", "definitions": {"reward": "-abs(t)"}}')
    assert DatasetCard.read(path).reward_row is None
    path.write_text(DatasetCard(name="new", reward_row="next").to_json())
    assert DatasetCard.read(path).reward_row == "next"
    path.write_text('{"name": "bad", "reward_row": "previous"}')
    with pytest.raises(DatasetFormatError, match=r"invalid dataset card") as caught:
        DatasetCard.read(path)
    assert "reward_row" in str(caught.value) and "'current' or 'next'" in str(caught.value)
