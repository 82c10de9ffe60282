"""Messages that quote untrusted input: cut short, with a "did you mean" for a misspelled
key at any depth of a pydantic model."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from neorl_industrial.core.utils.messages import quote, shorten, unknown_key, validation_lines


def test_quote_cuts_long_values_and_says_their_length():
    assert quote("short") == "'short'"
    quoted = quote("x" * 20_000_000)
    assert len(quoted) < 120 and quoted.endswith("… (20000000 characters)")
    assert quote(b"\x00" * 1000).endswith("(1000 bytes)")
    assert shorten("y" * 10_000).endswith("… (10000 characters)")
    assert shorten("fine") == "fine"


def test_unknown_key_names_the_closest_fields_or_all_of_them():
    assert unknown_key("limt", ["limit", "name"]) == "unknown field 'limt'; did you mean 'limit'?"
    assert unknown_key("zzz", ["limit", "name"]) == (
        "unknown field 'zzz'; expected one of ['limit', 'name']"
    )


class _Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    above: float | None = None
    below: float | None = None


class _Item(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    when: _Inner | None = None


class _Outer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[_Item] = []
    by_name: dict[str, _Item] = {}


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"itemz": []}, "spec.yaml: itemz: unknown field 'itemz'; did you mean 'items'?"),
        (
            {"items": [{"name": "a", "when": {"abov": 1}}]},
            "spec.yaml: items[0].when.abov: unknown field 'abov'; did you mean 'above'?",
        ),
        (
            {"by_name": {"k": {"nmae": "a"}}},
            "spec.yaml: by_name.k.nmae: unknown field 'nmae'; did you mean 'name'?",
        ),
    ],
)
def test_validation_lines_suggest_fields_at_any_depth(data, expected):
    with pytest.raises(ValidationError) as caught:
        _Outer.model_validate(data)
    assert expected in validation_lines(caught.value, _Outer, "spec.yaml")


def test_validation_lines_cut_a_huge_value():
    with pytest.raises(ValidationError) as caught:
        _Item.model_validate({"name": 1, "when": {"above": "9" * 100_000 + "x"}})
    lines = validation_lines(caught.value, _Item, "")
    assert lines[0].startswith("name: ")
    assert all(len(line) < 500 for line in lines)
