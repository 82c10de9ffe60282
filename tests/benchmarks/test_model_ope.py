"""The model-based OPE benchmark's pieces: the FLOP count of a network, its settings, and
(slow) a smoke run that measures and writes a result."""

from __future__ import annotations

import json

import pytest

from benchmarks import model_ope


def test_flops_of_a_dense_network_count_every_layer():
    # 180 -> 256 -> 256 -> 3: 2 x (180 x 256 + 256 x 256 + 256 x 3)
    assert model_ope.mlp_flops([180, 256, 256, 3]) == 2 * (46_080 + 65_536 + 768)
    assert model_ope.mlp_flops([4]) == 0


def test_the_default_size_is_the_issues_and_quick_is_small():
    args = model_ope.parse_args([])
    assert (args.policies, args.starts, args.horizon) == (50, 100, 1000)
    quick = model_ope.parse_args(["--quick"])
    assert quick.policies * quick.starts * quick.horizon < 5_000
    with pytest.raises(SystemExit):
        model_ope.parse_args(["--horizon", "0"])


@pytest.mark.slow
def test_a_quick_run_measures_and_writes_its_result(tmp_path):
    assert model_ope.main(["--quick", "--results-dir", str(tmp_path), "-t", "smoke"]) == 0
    (path,) = tmp_path.glob("model_ope-smoke-*.json")
    written = json.loads(path.read_text())
    results = written["results"]
    # 8 test starts and the 4 the verdict selects on, in the same program.
    assert (written["config"]["test_starts"], written["config"]["selection_starts"]) == (8, 4)
    assert results["rollout_steps"] == 4 * 5 * (8 + 4) * 50
    assert results["finite_share"] == 1.0
    assert 0 < results["fraction_of_peak"] < 1.5
    assert results["fit_cpu_seconds"] > 0 and results["evaluation_run_seconds"] > 0
