"""The selection study's page: regret against a random choice, rank correlation, and the
true and estimated returns of every configuration (the study itself runs with
``python -m benchmarks.selection_study``)."""

from __future__ import annotations

from benchmarks import selection_study


def _row(dataset, truth, estimates, selected, correlation):
    best = max(range(len(truth)), key=truth.__getitem__)
    spread = max(truth) - min(truth)
    return {
        "dataset": dataset,
        "selected": selected,
        "best_in_hindsight": best,
        "regret": truth[best] - truth[selected],
        "regret_fraction": (truth[best] - truth[selected]) / spread,
        "random_regret": sum(truth[best] - t for t in truth) / len(truth),
        "rank_correlation": correlation,
        "true_returns": truth,
        "estimated_returns": estimates,
        "values": [{"alpha": a} for a in (1.0, 10.0, 40.0)],
    }


def test_the_page_says_how_the_offline_choice_compares_with_a_random_one():
    args = selection_study.parse_args(["--quick"])
    config = {
        key: getattr(args, key)
        for key in (
            "grid",
            "seeds",
            "algorithm",
            "updates",
            "hidden",
            "holdout",
            "fqe_updates",
            "episodes",
        )
    }
    rows = [
        _row("IB-v0:low", [-300.0, -200.0, -400.0], [-310.0, -250.0, -380.0], 1, 1.0),
        _row("CSTR-v0:medium", [10.0, 30.0, 20.0], [5.0, 4.0, 6.0], 2, -0.5),
    ]
    text = selection_study.page(config, rows, 120.0)
    assert "| IB-v0:low | {'alpha': 10.0} | {'alpha': 10.0} | 0.0 | 0.00 |" in text
    # CSTR: chose 20 where 30 was best, spread 20 -> half the spread; random: 10.
    assert (
        "| CSTR-v0:medium | {'alpha': 40.0} | {'alpha': 10.0} | 10.0 | 0.50 | 10.0 | -0.50 |"
        in (text)
    )
    assert "regret is 0.25 of the spread on average" in text
    assert "picked the best configuration on 1 of 2" in text
    assert args.datasets == ["IB-v0:low"] and args.updates == 20
