"""Model-based off-policy evaluation at the issue's size: how long fitting a plant model
and evaluating 50 candidate policies x 5 members x 100 starts over a 1000-step horizon
takes on this machine, and what share of the machine's matrix-product peak it reaches.

One run, in order:

1. Data: ``--trajectories`` episodes of the ``--quality`` behaviour policy of ``--env``
   (IB-v0: 1000 steps, 30 stacked frames of 6 features).
2. Fit: a ``PlantModel`` with its defaults (7 members, 5 elites, (128, 128), early
   stopping on the 20 % held-out episodes), timed end to end (its fidelity included).
3. Candidates: ``--policies`` TD3+BC policies of the task's sizes (freshly initialized,
   one per seed: their values do not matter here, their cost does), stacked.
4. Evaluation: ``make_policy_rollouts`` with the task's shield, every candidate in every
   elite member from ``--starts`` held-out states for ``--horizon`` steps each, the
   members' disagreement measured every ``--disagreement-every`` steps (the verdict's
   default), as one compiled program, the training split's starts the verdict selects
   candidates on riding along (``--selection-starts``, half the test's by default);
   then the logged replay of the test's starts. Compile
   and run are timed apart (best of ``--repeats`` runs).
5. Peak: chains of dependent 256 x 256 and 1024 x 1024 matrix products, in the same run.

FLOPs are counted from the networks' matrix products alone (2 x in x out per layer,
per evaluation): every step evaluates one policy and one member, and on measured steps
every member; the shield, sampling and bookkeeping are not counted, so the fraction of
peak is a lower bound of the machine's use.

Run: ``python -m benchmarks.model_ope`` (``--quick --no-save`` for a smoke run).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.agent_speed import matmul_peak
from benchmarks.harness import (
    DEFAULT_RESULTS_DIR,
    BenchmarkResult,
    progress,
    require_positive,
    system_info,
    time_best,
    utc_timestamp,
)

NAME = "model_ope"
#: The issue's target: fit and evaluation together, seconds.
TARGET_SECONDS = 120.0


def mlp_flops(sizes: Sequence[int]) -> int:
    """FLOPs of one evaluation of a dense network with layer widths ``sizes``."""
    return int(sum(2 * a * b for a, b in itertools.pairwise(sizes)))


def run_study(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    import jax
    import jax.numpy as jnp

    from neorl_industrial.core.agents.registry import build_algorithm
    from neorl_industrial.core.environments import Task
    from neorl_industrial.core.models import DynamicsConfig
    from neorl_industrial.core.safety import resolve_safety
    from neorl_industrial.functional.state_management import init_train_states
    from neorl_industrial.functional.transformations.model_evaluation import (
        make_logged_replay,
        make_policy_rollouts,
    )
    from neorl_industrial.integration.datasets import generate_dataset
    from neorl_industrial.wrappers.models import FitSettings, PlantModel
    from neorl_industrial.wrappers.training.verdict_model import _starts_of
    from neorl_industrial.wrappers.training.verdict_results import VerdictSettings

    progress(f"data: {args.trajectories} {args.quality} episodes of {args.env}")
    dataset, card = generate_dataset(args.env, args.quality, args.trajectories, seed=0)
    task = Task.from_env(args.env)

    progress("fit: the plant model with its defaults")
    model = PlantModel(task, DynamicsConfig(**({"hidden": (32,)} if args.quick else {})))
    settings = FitSettings(max_updates=args.max_updates, horizon=min(100, args.horizon))
    started, cpu_started = time.perf_counter(), time.process_time()
    fitted = model.fit(dataset, settings, dataset_name=card.name)
    fit_seconds = time.perf_counter() - started
    fit_cpu_seconds = time.process_time() - cpu_started

    params = model.params(0)
    holdout = np.asarray(fitted["dataset"]["holdout_episodes"])
    heldout = dataset.select_episodes(holdout)
    if model.scaler is not None:
        heldout = heldout.replace(actions=model.scaler.scale(heldout.actions))
    # The verdict's own starts: the features no action moves (IB's setpoint) are taken
    # from the log step by step, as the verdict takes them.
    given_features = model.dynamics.layout.given
    test = _starts_of(
        heldout, VerdictSettings(max_starts=args.starts, horizon=args.horizon), given_features
    )
    rows, starts, given = test.rows, test.first, test.given
    horizon = test.horizon  # the requested one, at most the longest start's episode rest
    n_test = int(starts.shape[0])
    # The verdict's candidate selection: the training split's starts (half the test's by
    # default) in the same program call.
    n_selection = -(-n_test // 2) if args.selection_starts < 0 else args.selection_starts
    if n_selection:
        training = dataset.select_episodes(np.asarray(fitted["dataset"]["train_episodes"]))
        extra = _starts_of(
            training,
            VerdictSettings(max_starts=n_selection, horizon=horizon),
            given_features,
            width=test.horizon,
        )
        starts = jnp.concatenate([starts, extra.first])
        if given is not None:
            given = np.concatenate([given, extra.given])
        n_selection = len(extra.rows)
    n_starts = int(starts.shape[0])
    # Every start runs the whole horizon (the program's cost does not depend on where a
    # start's episode ends).
    lengths = jnp.full((n_starts,), horizon, jnp.int32)
    given = None if given is None else jnp.asarray(given)

    obs_mean, obs_std = dataset.observation_moments()
    hyperparameters = {"obs_mean": obs_mean.tolist(), "obs_std": obs_std.tolist()}
    algorithm, config = build_algorithm(
        "td3bc", task.observation_size, task.action_size, hyperparameters
    )
    policies = init_train_states(algorithm, list(range(args.policies))).agent.policy
    constraints = resolve_safety(task).constraints

    progress(
        f"evaluation: {args.policies} policies x {params.n_members} members x {n_starts} "
        f"starts x {horizon} steps"
    )
    options = {
        "horizon": horizon,
        "discount": 0.99,
        "close_after": 20,
        "disagreement_every": args.disagreement_every,
    }
    rollouts = jax.jit(
        make_policy_rollouts(
            model.dynamics,
            algorithm.act,
            constraints=constraints,
            scaler=model.scaler,
            **options,
        )
    )
    key = jax.random.PRNGKey(0)
    compile_started, cpu_started = time.perf_counter(), time.process_time()
    compiled = rollouts.lower(policies, params, starts, lengths, key, given).compile()
    compile_seconds = time.perf_counter() - compile_started
    compile_cpu_seconds = time.process_time() - cpu_started
    outputs: list[Any] = []

    def evaluate() -> None:
        outputs.append(
            jax.block_until_ready(compiled(policies, params, starts, lengths, key, given))
        )

    # Compiled ahead of time: no warm-up call; the last call's sums are kept.
    cpu_started = time.process_time()
    run_seconds, run_times = time_best(evaluate, repeats=args.repeats, warmup=0)
    run_cpu_seconds = (time.process_time() - cpu_started) / args.repeats
    sums = jax.device_get(outputs[-1])

    steps = np.minimum(np.asarray(rows)[:, None] + np.arange(horizon), heldout.n_transitions - 1)
    logged = jnp.asarray(heldout.actions)[jnp.asarray(steps)].reshape(n_test, horizon, -1)
    replay = jax.jit(make_logged_replay(model.dynamics, **options))
    replay_started = time.perf_counter()
    jax.block_until_ready(replay(params, starts[:n_test], logged, lengths[:n_test], key))
    replay_seconds = time.perf_counter() - replay_started

    progress("peak: chains of matrix products")
    peaks = [matmul_peak(size) for size in (256, 1024)]
    peak = max(entry["flop_per_s"] for entry in peaks)

    layout = model.dynamics.layout
    member_sizes = [layout.input_size, *model.config.hidden, 2 * layout.target_size + 1]
    policy_sizes = [task.observation_size, *config.hidden, task.action_size]
    member, policy = mlp_flops(member_sizes), mlp_flops(policy_sizes)
    every = max(args.disagreement_every, 1)
    per_step = policy + member * (1 + (params.n_members - 1) / every)
    rollout_steps = args.policies * params.n_members * n_starts * horizon
    flops = per_step * rollout_steps
    config_out = {
        "env": args.env,
        "quality": args.quality,
        "trajectories": args.trajectories,
        "policies": args.policies,
        "members": int(params.n_members),
        "starts": n_starts,
        "test_starts": n_test,
        "selection_starts": n_selection,
        "horizon": horizon,
        "disagreement_every": args.disagreement_every,
        "model": model.config.to_dict(),
        "fit_settings": settings.to_dict(),
        "policy_hidden": list(config.hidden),
        "shield": list(constraints.names),
        "given_features": [int(i) for i in given_features],
        "quick": bool(args.quick),
    }
    total = fit_seconds + compile_seconds + run_seconds + replay_seconds
    results = {
        "fit_seconds": fit_seconds,
        "fit_updates": fitted["fit"]["updates"],
        "fit_stopped_early": fitted["fit"]["stopped_early"],
        "evaluation_compile_seconds": compile_seconds,
        "evaluation_run_seconds": run_seconds,
        "evaluation_run_seconds_all": run_times,
        "replay_seconds_with_compile": replay_seconds,
        "total_seconds": total,
        # CPU time of this process (all threads): on a machine shared with other work the
        # wall time stretches, the CPU time much less; on an idle machine of C cores the
        # wall time lies between CPU time / C and CPU time.
        "fit_cpu_seconds": fit_cpu_seconds,
        "evaluation_compile_cpu_seconds": compile_cpu_seconds,
        "evaluation_run_cpu_seconds": run_cpu_seconds,
        "load_average_1min": os.getloadavg()[0],
        "cpu_count": os.cpu_count(),
        "target_seconds": TARGET_SECONDS,
        "target_met": bool(total <= TARGET_SECONDS),
        "rollout_steps": rollout_steps,
        "rollout_steps_per_s": rollout_steps / run_seconds,
        "flop_per_rollout_step": per_step,
        "evaluation_flop": flops,
        "evaluation_flop_per_s": flops / run_seconds,
        "matmul_peak": peaks,
        "fraction_of_peak": flops / run_seconds / peak,
        "finite_share": float(np.mean(np.isfinite(sums.discounted_return))),
        "outside_data_share": float(
            sums.outside_data_steps.sum() / max(float(sums.steps.sum()), 1.0)
        ),
    }
    return config_out, results


def page(config: dict[str, Any], results: dict[str, Any]) -> str:
    peak = max(entry["flop_per_s"] for entry in results["matmul_peak"])
    return "\n".join(
        [
            f"Model-based OPE at {config['policies']} policies x {config['members']} members x "
            f"{config['starts']} starts ({config.get('selection_starts', 0)} of them the "
            f"selection's) x {config['horizon']} steps ({config['env']}):",
            f"  fit {results['fit_seconds']:.1f} s ({results['fit_updates']} updates), "
            f"compile {results['evaluation_compile_seconds']:.1f} s, "
            f"run {results['evaluation_run_seconds']:.1f} s, "
            f"logged replay {results['replay_seconds_with_compile']:.1f} s; "
            f"total {results['total_seconds']:.1f} s (target {TARGET_SECONDS:.0f} s: "
            f"{'met' if results['target_met'] else 'not met'}); CPU time: fit "
            f"{results['fit_cpu_seconds']:.0f} s, compile "
            f"{results['evaluation_compile_cpu_seconds']:.0f} s, run "
            f"{results['evaluation_run_cpu_seconds']:.0f} s on {results['cpu_count']} cores "
            f"(load average {results['load_average_1min']:.1f})",
            f"  {results['rollout_steps_per_s']:,.0f} rollout steps/s, "
            f"{results['evaluation_flop_per_s'] / 1e9:.1f} GFLOP/s of a "
            f"{peak / 1e9:.1f} GFLOP/s matmul peak ({100 * results['fraction_of_peak']:.0f} %)",
        ]
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.model_ope", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--env", default="IB-v0")
    parser.add_argument("--quality", default="medium")
    parser.add_argument("--trajectories", type=int, default=25)
    parser.add_argument("--policies", type=int, default=50)
    parser.add_argument("--starts", type=int, default=100, help="the test's starts")
    parser.add_argument(
        "--selection-starts",
        type=int,
        default=-1,
        help="the training split's starts the verdict selects on, in the same call "
        "(-1: half the test's, as the verdict; 0: none)",
    )
    parser.add_argument("--horizon", type=int, default=1000)
    parser.add_argument("--disagreement-every", type=int, default=10)
    parser.add_argument("--max-updates", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=1, help="timed evaluation runs")
    parser.add_argument("--results-dir", default=str(DEFAULT_RESULTS_DIR))
    parser.add_argument("-d", "--description", default="model-based OPE at the issue's size")
    parser.add_argument("-t", "--tag", default="untagged")
    parser.add_argument("--no-save", action="store_true", help="write no JSON result")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 5 trajectories, 4 policies, 8 starts, 50 steps, a small model",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.trajectories, args.policies, args.starts, args.horizon = 5, 4, 8, 50
        args.max_updates, args.repeats = 500, 1
    require_positive(
        parser, args, ("trajectories", "policies", "starts", "horizon", "max_updates", "repeats")
    )
    return args


def run(quick: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """The study with its default settings, for ``python -m benchmarks.run model_ope``."""
    return run_study(parse_args(["--quick"] if quick else []))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = utc_timestamp()
    config, results = run_study(args)
    print(page(config, results))
    if not args.no_save:
        result = BenchmarkResult(
            name=NAME,
            description=args.description,
            tag=args.tag,
            timestamp=started,
            system=system_info(),
            config=config,
            results=results,
        )
        path = result.save(args.results_dir)
        print(f"Wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
