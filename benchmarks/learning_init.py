"""Initialization study: each agent trained from flax's LeCun-normal weights (zero biases)
and from PyTorch's uniform ``±1/sqrt(fan_in)`` weights and biases, on the same data, the
same seeds and the same evaluation, the evidence for each agent's ``weight_init`` default.

For every task (``--tasks``) and quality, one dataset of ``--trajectories`` episodes is
generated (deterministic given ``--data-seed``; actions scaled to [-1, 1] through the
task's actuator bounds); for every algorithm and initialization ``--seeds`` agents train
``--updates`` updates in one compiled program (the learning study's programs) and are
evaluated with their deterministic action over ``--episodes`` episodes of the simulator.
Scores are the dataset card's normalized returns, per seed the mean over its episodes;
the table gives the mean over seeds with a 95 % Student-t interval and Welch's t-test
of the two initializations.

Usage (from the repository root)::

    python -m benchmarks.learning_init --tasks CSTR-v0 FourTank-v0 --algorithms td3bc iql \\
        --seeds 5 --updates 10000 --data-seed 17 -t init
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.harness import (
    mean_confidence_interval,
    progress,
    require_positive,
    run_printed_study,
)
from benchmarks.learning_common import QUALITIES
from benchmarks.learning_programs import (
    compiled_chunk,
    evaluate_all,
    init_states,
    make_algorithm,
    reward_scaling_kind,
    train_chunks,
)
from benchmarks.learning_runs import prepare_task, scaled_datasets

NAME = "learning_init"
INITS = ("lecun", "uniform")


def study(args: argparse.Namespace) -> dict[str, Any]:
    """Every (task, quality, algorithm, initialization): per-seed scores and their
    summaries."""
    from scipy import stats

    from neorl_industrial.core.environments import make
    from neorl_industrial.functional.state_management import with_action_scaling
    from neorl_industrial.functional.transformations import action_scaler_for

    results: dict[str, Any] = {}
    for env_id in args.tasks:
        env, env_params = make(env_id)
        task = prepare_task(env_id, args.qualities, args.trajectories, args.data_seed)
        for name in args.algorithms:
            datasets, _ = scaled_datasets(task, reward_scaling_kind(name))
            rows: dict[str, Any] = {}
            for weight_init in INITS:
                algorithm = make_algorithm(
                    name,
                    task.obs_size,
                    task.action_size,
                    args.hidden,
                    args.updates,
                    {"weight_init": weight_init},
                )
                started = time.perf_counter()
                chunk = compiled_chunk(algorithm, args.batch_size, args.chunk)
                fresh = init_states(algorithm, task.normalizers, args.seeds)
                for trained, _ in train_chunks(chunk, fresh, datasets, args.updates):
                    policies = trained.agent.policy
                train_s = time.perf_counter() - started
                # The policies act in [-1, 1]; the task takes plant units.
                acting = with_action_scaling(algorithm, action_scaler_for(env))
                returns = evaluate_all(
                    acting, env, env_params, policies, args.episodes, args.eval_seed
                )  # [dataset, seed, episode]
                for index, quality in enumerate(task.qualities):
                    card = task.cards[index]
                    per_seed = np.asarray(card.normalized_score(returns[index].mean(axis=-1)))
                    rows.setdefault(quality, {})[weight_init] = {
                        "score": mean_confidence_interval(per_seed),
                        "per_seed_scores": per_seed.tolist(),
                        "behaviour_score": float(
                            card.normalized_score(card.behaviour_policy.mean_return)
                        ),
                        "train_s": train_s,
                    }
                    progress(
                        f"{env_id}-{quality} {name} {weight_init}: "
                        f"{per_seed.mean():.1f} ± {per_seed.std(ddof=1):.1f} ({train_s:.0f} s)"
                    )
            for quality, row in rows.items():
                test = stats.ttest_ind(
                    row["uniform"]["per_seed_scores"],
                    row["lecun"]["per_seed_scores"],
                    equal_var=False,
                )
                row["welch_p"] = float(test.pvalue)
                results.setdefault(f"{env_id}-{quality}", {})[name] = row
    return results


def markdown(results: dict[str, Any]) -> str:
    """The study's table: mean ± sample standard deviation over seeds per initialization."""
    lines = [
        "| dataset | algorithm | lecun | uniform | Welch p | behaviour |",
        "|---|---|---|---|---|---|",
    ]
    for dataset, algorithms in results.items():
        for name, row in algorithms.items():
            cells = []
            for weight_init in INITS:
                scores = np.asarray(row[weight_init]["per_seed_scores"])
                cells.append(f"{scores.mean():.1f} ± {scores.std(ddof=1):.1f}")
            behaviour = row["lecun"]["behaviour_score"]
            lines.append(
                f"| {dataset} | {name} | {cells[0]} | {cells[1]} | {row['welch_p']:.3f} "
                f"| {behaviour:.1f} |"
            )
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.learning_init", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--tasks", nargs="+", default=["CSTR-v0", "FourTank-v0"])
    parser.add_argument("--qualities", nargs="+", default=["medium"], choices=QUALITIES)
    parser.add_argument("--algorithms", nargs="+", default=["td3bc", "iql"])
    parser.add_argument("--trajectories", type=int, default=100)
    parser.add_argument("--data-seed", type=int, default=17)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--updates", type=int, default=10_000)
    parser.add_argument("--chunk", type=int, default=2_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--eval-seed", type=int, default=7)
    parser.add_argument("-d", "--description", default="Initialization study")
    parser.add_argument("-t", "--tag", default="untagged")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    require_positive(
        parser, args, ("trajectories", "seeds", "updates", "chunk", "batch_size", "episodes")
    )
    if args.seeds < 2:
        parser.error("--seeds: expected at least 2 (the test compares spreads over seeds)")
    args.chunk = min(args.chunk, args.updates)
    if args.updates % args.chunk:
        parser.error(f"--updates {args.updates}: expected a multiple of --chunk ({args.chunk})")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return run_printed_study(NAME, parse_args(argv), study, markdown)


if __name__ == "__main__":
    sys.exit(main())
