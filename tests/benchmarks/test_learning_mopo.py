"""The MOPO tuning study's command line and page: configurations parse or are refused by
name, and the table says which configuration's lower bound clears the behaviour's score."""

from __future__ import annotations

import pytest

from benchmarks import learning_mopo


def test_a_configuration_is_a_label_a_model_based_algorithm_and_its_values():
    label, name, overrides = learning_mopo.parse_config(
        "h1:mopo,rollout_horizon=1,penalty_coef=0.5,hidden=(32, 32)"
    )
    assert (label, name) == ("h1", "mopo")
    assert overrides == {"rollout_horizon": 1, "penalty_coef": 0.5, "hidden": (32, 32)}
    assert learning_mopo.parse_config("bc:mopo_bc") == ("bc", "mopo_bc", {})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mopo", "expected label:algorithm"),
        ("a:td3bc", "'td3bc' is not one of"),
        ("a:mopo,penalty_coef", "'penalty_coef' is not key=value"),
    ],
)
def test_a_bad_configuration_is_named(text, message, capsys):
    with pytest.raises(ValueError, match=message):
        learning_mopo.parse_config(text)
    with pytest.raises(SystemExit):
        learning_mopo.parse_args(["--configs", text])
    assert message in capsys.readouterr().err


def test_the_page_flags_a_lower_bound_above_the_behaviour():
    def entry(mean: float, ci: float, **extra) -> dict:
        score = {"mean": mean, "ci": ci, "n": 5}
        return {
            "score": score,
            "lower_bound": mean - ci,
            "beats_behaviour": mean - ci > 60.0,
            "algorithm": extra.pop("algorithm", "mopo"),
            "overrides": extra.pop("overrides", {}),
            **extra,
        }

    results = {
        "Pipeline-v0-medium": {
            "behaviour_score": 60.0,
            "configs": {
                "iql": entry(70.0, 5.0, algorithm="iql"),
                "bc": entry(66.0, 2.0, algorithm="mopo_bc", welch_p_vs_peer=0.04),
                "h1": entry(62.0, 9.0, overrides={"rollout_horizon": 1}, welch_p_vs_peer=0.2),
            },
        }
    }
    lines = learning_mopo.markdown(results).splitlines()
    assert len(lines) == 5
    assert lines[2] == "| Pipeline-v0-medium | iql (iql) | 70.0 ± 5.0 | 65.0 | 60.0 | yes | - |"
    assert lines[3].endswith("| 64.0 | 60.0 | yes | 0.040 |")
    assert "h1 (mopo: rollout_horizon=1)" in lines[4] and "| 53.0 | 60.0 | no |" in lines[4]
