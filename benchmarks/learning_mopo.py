"""MOPO's tuning study: model-based configurations against the behaviour policy on the
datasets where the model-free learners fail (Pipeline's 19-step delay, DMSD).

For every task (``--tasks``) one dataset of ``--quality`` is generated (the learning
study's data: ``--trajectories`` episodes, ``--data-seed``), one plant model is fitted to
it (the project's ``PlantModel`` with its defaults, at most ``--model-updates`` updates;
with ``--model-dir`` saved there and read back by a later run of the same data), and
every configuration (``--configs``) trains ``--seeds`` agents on that one model in one
compiled program, evaluated like the learning study (deterministic action, ``--episodes``
episodes of the simulator, the card's normalized score per seed).

A configuration is ``label:algorithm[,key=value...]``, the algorithm one of the
learning study's model-based ones and the values its hyperparameters, e.g.
``h1_l1:mopo,rollout_horizon=1,penalty_coef=1``. The table gives per configuration the
mean over seeds with its 95 % Student-t interval, the interval's lower bound against the
behaviour policy's score (the data's own operation, the peer every learner must beat) and
Welch's p of the difference from IQL's agents trained on the same data in the same run.

Usage (from the repository root)::

    python -m benchmarks.learning_mopo --tasks Pipeline-v0 --seeds 5 --updates 20000 \\
        --configs mopo:mopo h1_l1:mopo,rollout_horizon=1,penalty_coef=1 -t mopo_grid
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import (
    mean_confidence_interval,
    progress,
    require_positive,
    run_printed_study,
)
from benchmarks.learning_common import MODEL_BASED, QUALITIES
from benchmarks.learning_programs import (
    compiled_chunk,
    evaluate_all,
    init_states,
    make_algorithm,
    reward_scaling_kind,
    train_chunks,
)
from benchmarks.learning_runs import EVAL_SEED, prepare_task, scaled_datasets

NAME = "learning_mopo"
#: The model-free peer trained beside the configurations (the suite's best on Pipeline).
PEER = "iql"


def parse_config(text: str) -> tuple[str, str, dict[str, Any]]:
    """``label:algorithm[,key=value...]`` as ``(label, algorithm, overrides)``; values are
    Python literals (numbers, tuples), else strings.

    Raises:
        ValueError: naming the part that does not parse.
    """
    label, sep, spec = text.partition(":")
    if not sep or not label or not spec:
        raise ValueError(f"--configs {text!r}: expected label:algorithm[,key=value...]")
    # A comma starts the next pair only before ``key=`` (a value may be a tuple).
    name, _, values = spec.partition(",")
    pairs = re.split(r",(?=\s*\w+=)", values) if values else []
    if name not in MODEL_BASED:
        raise ValueError(f"--configs {text!r}: {name!r} is not one of {list(MODEL_BASED)}")
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--configs {text!r}: {pair!r} is not key=value")
        try:
            overrides[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            overrides[key] = value
    return label, name, overrides


def _models(task: Any, args: argparse.Namespace) -> list[Any]:
    """The task's plant models: read from ``--model-dir`` when saved there for the same
    data, else fitted (and saved there)."""
    from benchmarks.learning_models import fit_models
    from neorl_industrial.wrappers.models import PlantModel, PlantModelError

    if args.model_dir is not None:
        paths = [
            Path(args.model_dir) / f"{task.env_id}-{quality}-{args.data_seed}-{args.trajectories}"
            for quality in task.qualities
        ]
        try:
            models = [PlantModel.load(path) for path in paths]
        except PlantModelError:
            models = None
        if models is not None:
            progress(f"plant models read from {args.model_dir}")
            return models
    models, fit_s = fit_models(task, args.model_updates)
    progress(f"plant models fitted in {fit_s:.0f} s")
    if args.model_dir is not None:
        for model, path in zip(models, paths, strict=True):
            model.save(path, overwrite=True, plots=False)
    return models


def _scores(task: Any, returns: np.ndarray) -> dict[str, Any]:
    card = task.cards[0]
    per_seed = np.asarray(card.normalized_score(returns[0].mean(axis=-1)), np.float64)
    return {"score": mean_confidence_interval(per_seed), "per_seed_scores": per_seed.tolist()}


def study(args: argparse.Namespace) -> dict[str, Any]:
    """Every task: the behaviour's score, IQL's agents and every configuration's."""
    from scipy import stats

    from benchmarks.learning_models import model_based_run, model_summary
    from neorl_industrial.core.environments import make
    from neorl_industrial.functional.state_management import with_action_scaling
    from neorl_industrial.functional.transformations import action_scaler_for

    configs = [parse_config(text) for text in args.configs]
    results: dict[str, Any] = {}
    for env_id in args.tasks:
        env, env_params = make(env_id)
        task = prepare_task(env_id, [args.quality], args.trajectories, args.data_seed)
        card = task.cards[0]
        behaviour = float(card.normalized_score(card.behaviour_policy.mean_return))
        models = _models(task, args)
        row: dict[str, Any] = {
            "behaviour_score": behaviour,
            "models": model_summary(models),
            "configs": {},
        }
        scaler = action_scaler_for(env)
        runs = [(PEER, PEER, {})] if args.peer else []
        for label, name, overrides in runs + configs:
            datasets, scalings = scaled_datasets(task, reward_scaling_kind(name))
            started = time.perf_counter()
            if name in MODEL_BASED:
                algorithm, states = model_based_run(
                    name,
                    task,
                    args.hidden,
                    args.updates,
                    args.seeds,
                    scalings,
                    models,
                    overrides,
                )
            else:
                algorithm = make_algorithm(
                    name, task.obs_size, task.action_size, args.hidden, args.updates, overrides
                )
                states = init_states(algorithm, task.normalizers, args.seeds)
            chunk = compiled_chunk(algorithm, args.batch_size, args.chunk)
            metrics: dict[str, list[float]] = {}
            for trained, entry in train_chunks(chunk, states, datasets, args.updates):
                states = trained
                for key, value in entry["metrics"].items():
                    metrics.setdefault(key, []).append(float(np.mean(value)))
            train_s = time.perf_counter() - started
            acting = with_action_scaling(algorithm, scaler)
            returns = evaluate_all(
                acting, env, env_params, states.agent.policy, args.episodes, EVAL_SEED
            )
            entry = _scores(task, returns) | {
                "algorithm": name,
                "overrides": overrides,
                "train_s": train_s,
                "metrics": metrics,
            }
            score = entry["score"]
            entry["lower_bound"] = score["mean"] - score["ci"]
            entry["beats_behaviour"] = bool(entry["lower_bound"] > behaviour)
            row["configs"][label] = entry
            progress(
                f"{env_id}-{args.quality} {label}: {score['mean']:.1f} ± {score['ci']:.1f} "
                f"(lower bound {entry['lower_bound']:.1f}, behaviour {behaviour:.1f}; "
                f"{train_s:.0f} s)"
            )
        peer = row["configs"].get(PEER)
        if peer is not None:
            for label, entry in row["configs"].items():
                if label != PEER:
                    test = stats.ttest_ind(
                        entry["per_seed_scores"], peer["per_seed_scores"], equal_var=False
                    )
                    entry["welch_p_vs_peer"] = float(test.pvalue)
        results[f"{env_id}-{args.quality}"] = row
    return results


def markdown(results: dict[str, Any]) -> str:
    """The study's table: mean ± 95 % interval over seeds, the lower bound against the
    behaviour's score, and Welch's p against IQL's agents of the same run."""
    lines = [
        "| dataset | configuration | score | lower bound | behaviour | beats it | p vs IQL |",
        "|---|---|---|---|---|---|---|",
    ]
    for dataset, row in results.items():
        for label, entry in row["configs"].items():
            score = entry["score"]
            overrides = ", ".join(f"{k}={v}" for k, v in entry["overrides"].items())
            name = f"{label} ({entry['algorithm']}{': ' + overrides if overrides else ''})"
            p = entry.get("welch_p_vs_peer")
            lines.append(
                f"| {dataset} | {name} | {score['mean']:.1f} ± {score['ci']:.1f} "
                f"| {entry['lower_bound']:.1f} | {row['behaviour_score']:.1f} "
                f"| {'yes' if entry['beats_behaviour'] else 'no'} "
                f"| {'-' if p is None else f'{p:.3f}'} |"
            )
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.learning_mopo", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--tasks", nargs="+", default=["Pipeline-v0"])
    parser.add_argument("--quality", default="medium", choices=QUALITIES)
    parser.add_argument("--configs", nargs="+", default=["mopo:mopo"])
    parser.add_argument(
        "--no-peer", dest="peer", action="store_false", help="train no IQL agents beside"
    )
    parser.add_argument("--trajectories", type=int, default=100)
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--updates", type=int, default=20_000)
    parser.add_argument("--chunk", type=int, default=2_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--model-updates", type=int, default=10_000)
    parser.add_argument("--model-dir", default=None, help="where fitted plant models are kept")
    parser.add_argument("-d", "--description", default="MOPO tuning study")
    parser.add_argument("-t", "--tag", default="untagged")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    require_positive(
        parser,
        args,
        ("trajectories", "seeds", "updates", "chunk", "batch_size", "episodes", "model_updates"),
    )
    if args.seeds < 2:
        parser.error("--seeds: expected at least 2 (the interval needs a spread over seeds)")
    args.chunk = min(args.chunk, args.updates)
    if args.updates % args.chunk:
        parser.error(f"--updates {args.updates}: expected a multiple of --chunk ({args.chunk})")
    for text in args.configs:
        try:
            parse_config(text)
        except ValueError as error:
            parser.error(str(error))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return run_printed_study(NAME, parse_args(argv), study, markdown)


if __name__ == "__main__":
    sys.exit(main())
