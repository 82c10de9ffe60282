"""Learning study: BC, TD3+BC, IQL and CQL on the generated datasets of one or more
tasks (the Industrial Benchmark, the process suite), several seeds at once, evaluated in
the JAX environment, with learning curves, checkpoints and resume.

For each task (``--tasks``, default ``IB-v0``) and quality (``low``, ``medium``, ``high``
by default) a dataset of ``--trajectories`` whole episodes is generated from the shipped
behaviour policies (deterministic given ``--data-seed``). Every algorithm, with its CORL
defaults, trains ``--seeds`` independent agents on every dataset of a task in **one**
compiled program: seeds and datasets are two ``vmap`` axes over separate parameters (a
task's datasets have equal shapes). Every ``--eval-every`` updates all agents are
evaluated at once with their deterministic action over ``--curve-episodes`` episodes of
the environment (the learning curves); the last point of every curve is the final
evaluation over ``--episodes`` episodes, which gives the tables.

Preprocessing: observations are standardized with the dataset's per-feature mean and
spread (the normalizer travels with the policy); rewards are scaled for training only,
per algorithm, as the algorithm registry says
(``algorithm_entry(name).reward_scaling``: IQL the IQL paper's ``return_range``,
rewards times 1000 / (max - min episode return); the others ``std``, divided by the
rewards' spread; the CQL variants as CQL), fitted on each dataset
(``RewardScaling.fit``) and recorded with the result; ``--reward-scaling KIND`` uses one
kind for every algorithm. Actions in plant units are scaled to [-1, 1] with the task's
actuator bounds (the policy scales back, so it is evaluated in plant units). Evaluation
uses the environment's own reward.

Scores are D4RL-style normalized returns from the dataset card,
``100 * (R - random) / (expert - random)``, per seed the mean over its episodes; the table
gives the mean over seeds and a 95 % confidence interval (Student's t over seeds). The
behaviour policy's score is the dataset's own mean return.

The page has one table per task with a plot of the learning curves per dataset
(``--images``) and a suite summary: per algorithm, on how many of the datasets its mean
score beats the behaviour policy's. For tasks with published NeoRL-2 offline scores
(Pipeline, DMSD) those are shown beside ours; their data and budgets are not ours (one
dataset per task, their own behaviour policy and normalization, 1 M updates).

Checkpoints: after every chunk (``--checkpoint-every``) each (task, algorithm) run writes
its whole state (every agent's parameters and optimizer state, PRNG keys, updates done,
history, curve points, seconds spent) to
``<--checkpoint-dir>/<tag>/<task>/<algorithm>/`` (orbax, written atomically).
``--resume`` continues every run from its last checkpoint and reads finished ones back,
so a study stopped at any point loses at most one chunk; a checkpoint written with other
settings is refused, naming the setting. A run resumed from a checkpoint ends with the
same parameters and scores as an uninterrupted one. A ``--quick`` run keeps its
checkpoints apart (``quick-<tag>``) and starts afresh unless ``--resume`` is given.

Usage (from the repository root)::

    # the headline study: 100 k updates, 5 seeds, 3 qualities, hours in the background
    nohup nice -n 5 python -m benchmarks.learning --tasks IB-v0 CSTR-v0 FourTank-v0 \\
        DMSD-v0 Pipeline-v0 --algorithms bc td3bc iql cql --hidden 64 64 \\
        -t headline_100k > learning-headline.log 2>&1 &
    # after a stop (a reboot, a kill): the same command with --resume
    python -m benchmarks.learning --quick --no-save    # a minutes-long smoke run
    python -m benchmarks.learning --algorithms cql -t cql   # one algorithm per run ...
    python -m benchmarks.learning --merge benchmarks/results/learning-*.json  # ... merged
    # a row re-run on one dataset: the other datasets from the earlier run
    python -m benchmarks.learning --merge OLD.json:medium,high NEW_LOW.json

The run is saved like every benchmark (``benchmarks/results/learning-<tag>-<time>.json``),
the plots go to ``--images`` and the markdown page to ``--doc``.

This module holds the study's orchestration and command line; its parts are
``learning_programs`` (the agents and their compiled training and evaluation programs),
``learning_runs`` (a task's data and one checkpointed run), ``learning_progress`` (the
progress display), ``learning_page`` (the page and plots) and ``learning_common`` (the
names they share).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import (
    DEFAULT_RESULTS_DIR,
    BenchmarkResult,
    mean_confidence_interval,
    require_positive,
    save_study,
    utc_timestamp,
)
from benchmarks.learning_common import ALGORITHMS, PER_ALGORITHM, QUALITIES
from benchmarks.learning_page import as_suite, checks, markdown, plot_curves, summary, wall_time

# The safety, risk and peer-parity studies import these (and
# mean_confidence_interval) from here.
from benchmarks.learning_programs import observation_normalizer, train_all  # noqa: F401
from benchmarks.learning_progress import StudyProgress
from benchmarks.learning_runs import (
    RunCheckpoints,
    RunSettings,
    TaskData,
    checkpoint_directory,
    prepare_task,
    run_algorithm,
)

NAME = "learning"
#: Where the runs' checkpoints go (git-ignored), one directory per tag, task and algorithm.
DEFAULT_CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoints"


# ----- the study ------------------------------------------------------------------------
def add_run(task: dict[str, Any], data: TaskData, name: str, record: dict[str, Any]) -> None:
    """Puts a finished run's ``record`` into the task's results: timing, history, curve,
    and per dataset the reward scaling and the final scores and returns."""
    task["timing"][name] = {
        "train_s": record["train_s"],
        "eval_s": record["eval_s"],
        "n_updates": record["updates"],
        "sessions": record["sessions"],
    }
    task["history"][name] = record["history"]
    if "models" in record:  # a model-based run: its plant models' fits
        task["timing"][name]["model_fit_s"] = record["model_fit_s"]
        task.setdefault("models", {})[name] = dict(
            zip(data.qualities, record["models"], strict=True)
        )
    task["curves"][name] = {
        "updates": [point["updates"] for point in record["curve"]],
        "episodes": [point["episodes"] for point in record["curve"]],
        "scores": {
            quality: [point["scores"][index] for point in record["curve"]]
            for index, quality in enumerate(data.qualities)
        },
    }
    final = np.asarray(record["final_returns"], np.float64)
    for index, (quality, card) in enumerate(zip(data.qualities, data.cards, strict=True)):
        per_seed_scores = card.normalized_score(final[index])
        entry = task["datasets"][quality]
        entry["reward_scaling"][name] = record["reward_scaling"][index]
        entry["scores"][name] = mean_confidence_interval(per_seed_scores)
        entry["returns"][name] = mean_confidence_interval(final[index])
        entry["per_seed_scores"][name] = np.asarray(per_seed_scores).tolist()


def study_task(
    env_id: str, args: argparse.Namespace, reporter: StudyProgress | None = None
) -> dict[str, Any]:
    """Generates one task's datasets, trains and evaluates every algorithm on them (or
    reads finished runs back from their checkpoints with ``args.resume``)."""
    reporter = reporter if reporter is not None else StudyProgress(rich=False)
    data = prepare_task(env_id, args.qualities, args.trajectories, args.data_seed, reporter.note)
    task: dict[str, Any] = {
        "datasets": {},
        "timing": {},
        "history": {},
        "curves": {},
        "horizon": data.horizon,
        "action_scaling": data.action_scaling,
        "data_s": data.data_s,
    }
    for quality, card in zip(data.qualities, data.cards, strict=True):
        behaviour_return = float(card.behaviour_policy.mean_return)
        task["datasets"][quality] = {
            "behaviour_return": behaviour_return,
            "behaviour_score": float(card.normalized_score(behaviour_return)),
            "random_return": float(card.random_return),
            "expert_return": float(card.expert_return),
            "reward_scaling": {},
            "scores": {},
            "returns": {},
            "per_seed_scores": {},
        }
    for name in args.algorithms:
        outcome = run_algorithm(
            data,
            RunSettings.of(args, env_id, name),
            checkpoint_directory(args.checkpoint_dir, checkpoint_tag(args), env_id, name),
            resume=args.resume,
            checkpoint_every=args.checkpoint_every,
            reporter=reporter,
        )
        add_run(task, data, name, outcome.record)
    return task


def checkpoint_tag(args: argparse.Namespace) -> str:
    """The checkpoints' tag: ``--tag``, and ``quick-<tag>`` for a ``--quick`` run, whose
    checkpoints never meet a real study's."""
    return f"quick-{args.tag}" if args.quick else args.tag


def _updates_done_before(args: argparse.Namespace) -> int:
    """Updates the study's checkpoints hold (every agent counted once); a checkpoint
    without ``--resume`` fails here, before any data is generated."""
    done = 0
    for env_id in args.tasks:
        for name in args.algorithms:
            directory = checkpoint_directory(
                args.checkpoint_dir, checkpoint_tag(args), env_id, name
            )
            latest = RunCheckpoints(directory).latest()
            if latest is None:
                continue
            if not args.resume:
                raise FileExistsError(
                    f"{directory}: holds a checkpoint at {latest} of {args.updates} updates "
                    "of an earlier run; pass --resume to continue it, or delete the "
                    "directory (or choose another --tag) to start afresh"
                )
            done += min(latest, args.updates)
    return done


def run_study(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every task of ``args.tasks``: datasets, training, curves and evaluation."""
    import jax

    config = {
        "tasks": list(args.tasks),
        "qualities": list(args.qualities),
        "algorithms": list(args.algorithms),
        "trajectories": args.trajectories,
        "data_seed": args.data_seed,
        "n_seeds": args.seeds,
        "n_updates": args.updates,
        "chunk_updates": args.chunk,
        "batch_size": args.batch_size,
        "hidden": list(args.hidden),
        "n_episodes": args.episodes,
        "eval_every": args.eval_every,
        "curve_episodes": args.curve_episodes,
        "reward_scaling": args.reward_scaling or PER_ALGORITHM,
        "device": str(jax.devices()[0].device_kind),
        "jax_backend": jax.default_backend(),
    }
    if args.quick and not args.resume:
        for env_id in args.tasks:
            for name in args.algorithms:
                shutil.rmtree(
                    checkpoint_directory(args.checkpoint_dir, checkpoint_tag(args), env_id, name),
                    ignore_errors=True,
                )
    total = len(args.tasks) * len(args.algorithms) * args.updates
    results: dict[str, Any] = {"tasks": {}}
    with StudyProgress(total, _updates_done_before(args)) as reporter:
        for env_id in args.tasks:
            task = study_task(env_id, args, reporter)
            task["checks"] = checks(config, task)
            results["tasks"][env_id] = task
    results["summary"] = summary(config, results)
    results["wall_time"] = wall_time(results)
    return config, results


#: Settings that may differ between the runs of one merged study.
PER_RUN = (
    "algorithms",
    "qualities",
    "n_updates",
    "chunk_updates",
    "tasks",
    "device",
    "jax_backend",
    "merged_from",
    "sources",
)


def merge(paths: Sequence[str | Path]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One study from several saved runs of the same settings with different algorithms,
    tasks or qualities (e.g. one run per algorithm, each within a time limit); curves,
    reward scalings and timing travel with their algorithm.

    ``RESULT:QUALITY,...`` takes only those datasets of a run: an algorithm's row may be
    joined from runs on disjoint qualities (CQL on ``low`` re-run on its own beside
    ``medium`` and ``high`` from an earlier run). Such an algorithm's timing sums its parts
    and keeps them (``parts``: qualities, device, seconds; a selected run's seconds are the
    whole run's, whose datasets trained in one program), and its device names the
    qualities run on each. ``config["sources"]`` names every run behind the merge (file,
    description, commit, time), which the page lists.

    Raises:
        ValueError: when the runs' settings (other than algorithms, tasks, qualities and
            updates) differ, two runs hold the same algorithm on the same dataset, the
            parts of one algorithm differ in updates or curve points, or a selection names
            a quality the run does not hold.
    """
    if not paths:
        raise ValueError("merge: expected at least one result file")
    runs = []
    sources: list[dict[str, str]] = []
    for spec in paths:
        path, selected = _merge_spec(spec)
        run = BenchmarkResult.load(path)
        if run.name != NAME:
            raise ValueError(f"{path}: not a learning study (benchmark {run.name!r})")
        runs.append(_select_qualities(spec, *as_suite(run.config, run.results), selected))
        sources.extend(
            run.config.get("sources")
            or [
                {
                    "file": _spec_name(spec),
                    "description": run.description,
                    "commit": str(run.system.get("git_commit") or "")[:7],
                    "timestamp": run.timestamp,
                }
            ]
        )
    base = dict(runs[0][0])
    algorithms: list[str] = []
    tasks: list[str] = []
    results: dict[str, Any] = {"tasks": {}}
    for path, (run_config, run_results) in zip(paths, runs, strict=True):
        differing = sorted(
            key
            for key in set(base) | set(run_config)
            if key not in PER_RUN and base.get(key) != run_config.get(key)
        )
        if differing:
            raise ValueError(f"{path}: settings differ from {paths[0]}: {', '.join(differing)}")
        for env_id, task in run_results["tasks"].items():
            if env_id not in tasks:
                tasks.append(env_id)
            merged = results["tasks"].setdefault(
                env_id,
                {
                    "datasets": {},
                    "timing": {},
                    "history": {},
                    "curves": {},
                    "horizon": task.get("horizon"),
                },
            )
            # A merged run may hold an algorithm on some of its tasks only.
            for name in (n for n in run_config["algorithms"] if n in task["timing"]):
                if name not in algorithms:
                    algorithms.append(name)
                held = [
                    q for q in QUALITIES if name in task["datasets"].get(q, {}).get("scores", {})
                ]
                part = {
                    "n_updates": run_config["n_updates"],
                    "device": run_config.get("device", "unknown"),
                    **task["timing"][name],
                    "qualities": held,
                }
                if name not in merged["timing"]:
                    merged["timing"][name] = part
                    merged["history"][name] = task["history"][name]
                    if name in task.get("curves", {}):
                        merged["curves"][name] = task["curves"][name]
                    continue
                _join_part(f"{path}: algorithm {name!r} on {env_id}", merged, task, name, part)
            for quality, entry in task["datasets"].items():
                target = merged["datasets"].setdefault(
                    quality,
                    {**entry, **{field: {} for field in _PER_ALGORITHM_FIELDS}},
                )
                for field in _PER_ALGORITHM_FIELDS:
                    target[field].update(entry.get(field, {}))
    updates: dict[str, int] = {}
    for task in results["tasks"].values():
        for name, timing in task["timing"].items():
            updates.setdefault(name, timing["n_updates"])
    config = {**base}
    config["algorithms"] = [name for name in ALGORITHMS if name in algorithms]
    config["tasks"] = tasks
    config["qualities"] = [
        q for q in QUALITIES if any(q in t["datasets"] for t in results["tasks"].values())
    ]
    config["n_updates"] = (
        updates if len(set(updates.values())) > 1 else next(iter(updates.values()))
    )
    config.pop("chunk_updates", None)
    devices = {
        name: timing["device"]
        for task in results["tasks"].values()
        for name, timing in task["timing"].items()
    }
    if len(set(devices.values())) > 1:
        config["device"] = {name: devices[name] for name in config["algorithms"]}
        config.pop("jax_backend", None)
    config["merged_from"] = [_spec_name(spec) for spec in paths]
    # The runs behind the page (a merge of merges keeps the original runs).
    config["sources"] = sources
    for task in results["tasks"].values():
        task["checks"] = checks(config, task)
    results["summary"] = summary(config, results)
    results["wall_time"] = wall_time(results)
    return config, results


def _spec_name(spec: str | Path) -> str:
    """A merged run's file name, with its selection (``RESULT:QUALITY,...``) if any."""
    path, selected = _merge_spec(spec)
    return Path(path).name + (f":{','.join(selected)}" if selected else "")


def _merge_spec(spec: str | Path) -> tuple[str, tuple[str, ...] | None]:
    """``RESULT`` or ``RESULT:QUALITY,...`` as (path, selected qualities or None)."""
    path, colon, tail = str(spec).rpartition(":")
    if not colon or "/" in tail or tail.endswith(".json"):
        return str(spec), None
    qualities = tuple(tail.split(","))
    unknown = [q for q in qualities if q not in QUALITIES]
    if unknown:
        raise ValueError(
            f"{spec}: unknown quality {', '.join(map(repr, unknown))} after the colon "
            f"(expected RESULT:QUALITY,... with qualities among {', '.join(QUALITIES)})"
        )
    return path, qualities


def _select_qualities(
    spec: str | Path,
    config: dict[str, Any],
    results: dict[str, Any],
    selected: tuple[str, ...] | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run with only the ``selected`` datasets (and their curves) of every task."""
    if selected is None:
        return config, results
    for quality in selected:
        if not any(quality in task["datasets"] for task in results["tasks"].values()):
            raise ValueError(f"{spec}: the run holds no {quality} dataset")
    tasks = {}
    for env_id, task in results["tasks"].items():
        curves = {
            name: {**curve, "scores": {q: s for q, s in curve["scores"].items() if q in selected}}
            for name, curve in task.get("curves", {}).items()
        }
        datasets = {q: e for q, e in task["datasets"].items() if q in selected}
        tasks[env_id] = {**task, "datasets": datasets, "curves": curves}
    config = {**config, "qualities": [q for q in config["qualities"] if q in selected]}
    return config, {**results, "tasks": tasks}


def _join_part(
    where: str, merged: dict[str, Any], task: dict[str, Any], name: str, part: dict[str, Any]
) -> None:
    """Joins another run's ``part`` of algorithm ``name`` (other qualities of the same
    task) to the merged task: timing summed with the parts kept, curves and history
    joined."""
    timing = merged["timing"][name]
    parts = timing.get("parts", [timing])
    overlap = [q for q in part["qualities"] if any(q in p["qualities"] for p in parts)]
    if overlap:
        raise ValueError(
            f"{where} appears in two runs (on {', '.join(overlap)}); take each dataset "
            "from one run with RESULT:QUALITY,..."
        )
    if part["n_updates"] != timing["n_updates"]:
        raise ValueError(
            f"{where}: {part['n_updates']:,} updates, where its other datasets had "
            f"{timing['n_updates']:,}; one row is one budget"
        )
    curve, other = merged["curves"].get(name), task.get("curves", {}).get(name)
    if (curve is None) != (other is None) or (
        curve is not None
        and (curve["updates"], curve["episodes"]) != (other["updates"], other["episodes"])
    ):
        raise ValueError(f"{where}: its learning curve has other points than its other datasets")
    if curve is not None:
        curve["scores"] = {**curve["scores"], **other["scores"]}
    parts = [*parts, part]
    devices: dict[str, list[str]] = {}
    for p in parts:
        devices.setdefault(p["device"], []).extend(p["qualities"])
    merged["timing"][name] = {
        "n_updates": timing["n_updates"],
        "device": next(iter(devices))
        if len(devices) == 1
        else "; ".join(f"{device} ({', '.join(qs)})" for device, qs in devices.items()),
        "train_s": sum(p.get("train_s", 0.0) for p in parts),
        "eval_s": sum(p.get("eval_s", 0.0) for p in parts),
        "sessions": sum(p.get("sessions", 1) for p in parts),
        "qualities": [q for q in QUALITIES if any(q in p["qualities"] for p in parts)],
        "parts": [{k: v for k, v in p.items() if k != "parts"} for p in parts],
    }
    earlier = merged["history"][name]
    if "parts" not in timing:  # the first join: the first part's chunks say their datasets
        earlier = [{**entry, "qualities": timing["qualities"]} for entry in earlier]
    merged["history"][name] = [
        *earlier,
        *({**entry, "qualities": part["qualities"]} for entry in task["history"][name]),
    ]


#: A dataset's results kept per algorithm (merged algorithm by algorithm).
_PER_ALGORITHM_FIELDS = ("scores", "returns", "per_seed_scores", "reward_scaling")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    from neorl_industrial.functional.state_management import REWARD_SCALINGS

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.learning", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--tasks", nargs="+", default=["IB-v0"], help="environment ids (default IB-v0)"
    )
    parser.add_argument("--qualities", nargs="+", default=list(QUALITIES), choices=QUALITIES)
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    parser.add_argument("--trajectories", type=int, default=100, help="episodes per dataset")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=5, help="agents per dataset (default 5)")
    parser.add_argument("--updates", type=int, default=100_000, help="updates per agent")
    parser.add_argument(
        "--chunk", type=int, default=5_000, help="updates per compiled call (default 5,000)"
    )
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument(
        "--model-updates",
        type=int,
        default=10_000,
        help="a model-based algorithm's plant-model fit per dataset: at most this many "
        "updates (default 10,000, the model's own; it stops earlier when held-out error "
        "stalls)",
    )
    parser.add_argument(
        "--model-hidden",
        type=int,
        nargs="+",
        default=None,
        help="the plant models' hidden layer widths (default: the model's own)",
    )
    parser.add_argument(
        "--hidden", type=int, nargs="+", default=[256, 256], help="hidden layer widths"
    )
    parser.add_argument(
        "--episodes", type=int, default=100, help="final evaluation episodes per agent"
    )
    parser.add_argument(
        "--eval-every",
        type=int,
        default=10_000,
        help="updates between learning-curve points, a multiple of --chunk (0: the final "
        "evaluation only; default 10,000)",
    )
    parser.add_argument(
        "--curve-episodes",
        type=int,
        default=10,
        help="evaluation episodes per agent of a learning-curve point (default 10)",
    )
    parser.add_argument(
        "--reward-scaling",
        choices=REWARD_SCALINGS,
        help="one reward scaling for every algorithm (default: each algorithm's own, from "
        "the algorithm registry)",
    )
    parser.add_argument(
        "--checkpoint-dir",
        default=str(DEFAULT_CHECKPOINT_DIR),
        help="checkpoints go to <dir>/<tag>/<task>/<algorithm> (default benchmarks/checkpoints)",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        help="updates between checkpoints, a multiple of --chunk (0: after every chunk)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue every task and algorithm from its checkpoint of this --tag; "
        "finished ones are read back",
    )
    parser.add_argument("--doc", default="docs/learning.md", help="markdown page to write")
    parser.add_argument(
        "--images",
        default="docs/images/learning",
        help="directory of the learning-curve plots (default docs/images/learning)",
    )
    parser.add_argument("--results-dir", default=str(DEFAULT_RESULTS_DIR))
    parser.add_argument("-d", "--description", default="Learning study on the task suite")
    parser.add_argument("-t", "--tag", default="untagged")
    parser.add_argument(
        "--no-save", action="store_true", help="write neither JSON nor page nor plots"
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="RESULT",
        help="write the page (and a combined result) from saved runs instead of running; "
        "RESULT:QUALITY,... takes only those datasets of a run",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 10 trajectories, 2 seeds, 200 updates in chunks of 100, a curve "
        "point every 100, 4 episodes; checkpoints under quick-<tag>, started afresh "
        "unless --resume",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.trajectories, args.seeds, args.updates, args.chunk = 10, 2, 200, 100
        args.episodes = args.curve_episodes = 4
        args.model_updates = min(args.model_updates, 200)
        args.eval_every = 100
    if min(args.hidden) < 1:
        parser.error("--hidden: expected positive layer widths")
    if args.model_hidden is not None and min(args.model_hidden) < 1:
        parser.error("--model-hidden: expected positive layer widths")
    require_positive(
        parser,
        args,
        (
            "trajectories",
            "seeds",
            "updates",
            "chunk",
            "batch_size",
            "episodes",
            "curve_episodes",
            "model_updates",
        ),
    )
    args.chunk = min(args.chunk, args.updates)
    for name in ("updates", "eval_every", "checkpoint_every"):
        value = getattr(args, name)
        if value < 0 or value % args.chunk:
            parser.error(
                f"--{name.replace('_', '-')} {value}: expected a multiple of --chunk ({args.chunk})"
            )
    if not args.merge:
        from neorl_industrial.core.environments import registered_envs

        unknown = [t for t in args.tasks if t not in registered_envs()]
        if unknown:
            parser.error(
                f"--tasks: unknown environment {unknown[0]!r}; "
                f"registered: {sorted(registered_envs())}"
            )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    from neorl_industrial.wrappers.training.trainer import CheckpointMismatchError

    args = parse_args(argv)
    started = utc_timestamp()
    try:
        config, results = merge(args.merge) if args.merge else run_study(args)
    except (FileExistsError, CheckpointMismatchError, ValueError) as error:
        # A merge's ValueError names bad input (its files); a study's is a defect.
        study_defect = not isinstance(error, (FileExistsError, CheckpointMismatchError))
        if study_defect and not args.merge:
            raise
        print(f"python -m benchmarks.learning: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "Interrupted: every run is checkpointed up to its last chunk; continue with the "
            "same command and --resume",
            file=sys.stderr,
        )
        return 130
    images = None
    if not args.no_save and plot_curves(config, results, args.images):
        images = Path(os.path.relpath(args.images, Path(args.doc).parent)).as_posix()
    page = markdown(config, results, images)
    print(page)
    if not args.no_save:
        path = save_study(NAME, args, started, config, results, page)
        print(f"Wrote {path}, {args.doc} and the plots in {args.images}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
