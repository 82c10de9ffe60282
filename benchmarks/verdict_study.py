"""The verdict held against the truth: on every dataset of the suite, candidate policies
of several algorithms and hyperparameters are estimated from held-out episodes by every
estimator of the verdict (``model``, ``fqe``, ``model+fqe``), the verdict decides, and
the simulator says how good the estimates and the decision were.

For every dataset of ``--datasets`` (``ENV:QUALITY``, generated with the factory's
behaviour policies as the learning suite generates them):

1. **Plant model**: one :class:`~neorl_industrial.wrappers.models.PlantModel` fitted on
   the training episodes (``--holdout`` of the episodes held out with the split seed the
   agents use), the known reward and cost expressions of the dataset card computed, not
   learned. Its fidelity on the held-out episodes and against the simulator
   (``simulator_fidelity``: random actions, states the data rarely visits) is recorded.
2. **Candidates**: every configuration of :data:`CANDIDATES` (BC, TD3+BC's ``alpha``
   grid, IQL, CQL, and MOPO on the plant model) x ``--seeds``, each configuration's
   seeds trained as one program (``Agent.fit``) on the model's training episodes (MOPO
   on the whole log, holding out the same episodes, since it steps the model).
3. **Estimates**: the verdict (``model_verdict``, every estimator, pessimism and
   intervals as in ``docs/verdict.md``) of every candidate against the logged operation
   of the held-out episodes, all candidates in one program (:func:`mixture_act`: each
   candidate acts with its own algorithm's ``act``), so the decision is among all.
4. **Truth**: every candidate in the simulator (``--episodes`` episodes, shield on, as
   ``Agent.evaluate`` runs them, all candidates in one program); the behaviour's true
   return is the dataset's mean episode return.

Study plants (``--datasets fired-heater ph-neutraliser gas-compressor``,
:mod:`benchmarks.plants`): plants the product was not written for. Their operators'
controller writes the historian log, which is imported with its schema (a dataset with no
simulator behind it); the plant model, the candidates (:data:`PLANT_CANDIDATES`, the safe
algorithms of the plant journey) and the verdict as above; the truth
(:mod:`benchmarks.plants.truth`) runs every candidate, shield on, and the operators'
controller closed loop in the plant's simulator: whole episodes (return and cost with 95 %
intervals, the improvement paired episode by episode) and, from the verdict's own starts
over its horizon with its discount, the true improvement the verdict's intervals are held
against. Scored by the issue's targets: recommendations not truly better (the lower end of
the true improvement's interval at or below 0) or over a limit, power where a candidate is
clearly better, interval coverage, rank correlation.

Reported per estimator and dataset: Spearman's rank correlation between estimated and
true returns over the candidates, and regret@1 (the best true return minus that of the
candidate the estimator ranks first) as a share of the true spread (best minus worst);
for the verdict's recommendation: whether its true return is below the behaviour's or
its true mean episode cost over a limit. Estimates are discounted returns from held-out
states, the truth undiscounted returns from the simulator's reset distribution, so only
ranks compare.

Usage (from the repository root)::

    nice -n 10 python -m benchmarks.verdict_study              # the suite, docs/verdict_study.md
    python -m benchmarks.verdict_study --quick --no-save       # a minutes-long smoke run
    python -m benchmarks.verdict_study --page-from RESULT.json # the page of a saved result
    python -m benchmarks.verdict_study --datasets fired-heater ph-neutraliser gas-compressor
    python -m benchmarks.verdict_study --page-from SUITE.json PLANTS.json  # side by side
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from benchmarks.harness import (
    DEFAULT_RESULTS_DIR,
    BenchmarkResult,
    progress,
    require_positive,
    system_info,
    utc_timestamp,
    write_atomically,
)
from neorl_industrial.wrappers.agents.joint_verdict import mixture_act, mixture_params
from neorl_industrial.wrappers.training.verdict_selection import NOT_SELECTED

NAME = "verdict_study"
DESCRIPTION = "Verdict estimators against the simulator's truth over the learning suite"
DATASETS = (
    "IB-v0:low",
    "IB-v0:medium",
    "IB-v0:high",
    "CSTR-v0:medium",
    "FourTank-v0:medium",
    "DMSD-v0:medium",
    "Pipeline-v0:medium",
    "CSTR-stochastic-v0:medium",
)
#: (label, registered algorithm, hyperparameters): the configurations every dataset trains.
CANDIDATES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("BC", "bc", {}),
    ("TD3+BC a=1", "td3bc", {"alpha": 1.0}),
    ("TD3+BC a=2.5", "td3bc", {"alpha": 2.5}),
    ("TD3+BC a=10", "td3bc", {"alpha": 10.0}),
    ("IQL", "iql", {}),
    ("CQL", "cql", {}),
    ("MOPO", "mopo", {}),
)
#: The study plants' configurations (benchmarks/plants): the safe algorithms a plant's
#: engineer trains on its log (README: the plant journey), IQL-Lag's beta swept, and one
#: unconstrained TD3+BC.
PLANT_CANDIDATES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("BC-Safe", "bc-safe", {}),
    ("TD3BC-Lag", "td3bc-lag", {}),
    ("IQL-Lag b=1", "iql-lag", {"beta": 1.0}),
    ("IQL-Lag b=3", "iql-lag", {"beta": 3.0}),
    ("IQL-Lag b=10", "iql-lag", {"beta": 10.0}),
    ("TD3+BC a=2.5", "td3bc", {"alpha": 2.5}),
)
ESTIMATORS = ("model", "fqe", "model+fqe")
#: What the ``model`` estimate's improvement interval is made of (see docs/verdict.md,
#: "Reading an interval"), kept beside each candidate's estimate.
MODEL_PARTS = ("paired", "member_spread", "penalty", "allowance", "far_outside_share")
#: The issue's targets: mean and worst regret@1 (share of the spread), mean rank
#: correlation, datasets where the recommendation is worse than the operators or unsafe.
TARGETS = {"mean_regret": 0.10, "worst_regret": 0.25, "mean_correlation": 0.7, "bad": 0}


def _fidelity_summary(fidelity: dict[str, Any]) -> dict[str, Any]:
    """Mean over the predicted observation features of the relative error and the
    coverage per step (``fidelity_errors``, as the history check reads them), and the
    memory check's shares per feature (where the fidelity has them)."""
    from neorl_industrial.wrappers.models.history_check import fidelity_errors

    out: dict[str, Any] = {
        "horizon": fidelity["horizon"],
        "steps": {str(step): value for step, value in fidelity_errors(fidelity).items()},
    }
    if "outside_data_share" in fidelity:
        out["outside_data_share"] = fidelity["outside_data_share"]
    if fidelity.get("memory"):  # per feature: the one-step error earlier steps explain
        out["memory"] = {row["name"]: row["explained"] for row in fidelity["memory"]["rows"]}
    return out


def _ranking(estimates: np.ndarray, truth: np.ndarray) -> dict[str, Any]:
    """Spearman's correlation and regret@1 (share of the spread) of ``estimates``."""
    from scipy.stats import spearmanr

    spread = float(truth.max() - truth.min())
    first = int(np.argmax(estimates))
    correlation = None
    if np.ptp(estimates) > 0 and np.ptp(truth) > 0:
        correlation = float(spearmanr(estimates, truth).statistic)
    return {
        "chosen": first,
        "regret": float(truth.max() - truth[first]),
        "regret_share": float((truth.max() - truth[first]) / spread) if spread > 0 else 0.0,
        "rank_correlation": correlation,
    }


def _truth_ceiling(
    means: np.ndarray, errors: np.ndarray, draws: int = 2000, seed: int = 0
) -> dict[str, float] | None:
    """What the truth's own noise leaves of a rank correlation: Spearman's correlation of
    the candidates' measured true returns (``means``) with the same returns measured again
    (``means`` plus normal noise of their standard errors ``errors``), over ``draws``
    draws: its median and 95 % range. A perfect estimator would correlate with the
    measured truth about that well. None without an error for every candidate."""
    from scipy.stats import spearmanr

    means, errors = np.asarray(means, np.float64), np.asarray(errors, np.float64)
    if len(means) < 3 or not np.isfinite(errors).all():
        return None
    rng = np.random.default_rng(seed)
    again = means + rng.normal(size=(draws, len(means))) * errors
    values = np.asarray([spearmanr(means, draw).statistic for draw in again])
    low, median, high = np.percentile(values, [2.5, 50, 97.5])
    return {"median": float(median), "low": float(low), "high": float(high)}


def _rankings(candidates: Sequence[dict[str, Any]], truth: np.ndarray) -> dict[str, Any]:
    """Per estimator every candidate has: :func:`_ranking` of its estimates, and the
    rank correlation over the candidates it answers for (``answered_rank_correlation``:
    those with a lower bound; the verdict ranks the others last whatever their estimate)."""
    rankings = {}
    for name in ESTIMATORS:
        if not all(name in c["estimates"] for c in candidates):
            continue
        values = np.asarray([c["estimates"][name]["value"] for c in candidates])
        answered = np.asarray(
            [
                (c["estimates"][name].get("improvement") or {}).get("lower") is not None
                for c in candidates
            ]
        )
        rankings[name] = _ranking(values, truth) | {
            "answered": int(answered.sum()),
            "answered_rank_correlation": _ranking(values[answered], truth[answered])[
                "rank_correlation"
            ]
            if answered.sum() > 2
            else None,
        }
    return rankings


def _fitted_model(label: str, task: Any, dataset: Any, card: Any, args: argparse.Namespace) -> Any:
    """The study's plant model of ``dataset``, fitted with the study's settings."""
    from neorl_industrial.core.models import DynamicsConfig
    from neorl_industrial.wrappers.models import PlantModel

    model = PlantModel(
        task,
        DynamicsConfig(**({"hidden": tuple(args.model_hidden)} if args.model_hidden else {})),
        definitions=card.definitions,
    )
    progress(f"{label}: plant model, at most {args.model_updates} updates")
    model.fit(dataset, _fit_settings(args), dataset_name=card.name)
    return model


def _fit_settings(args: argparse.Namespace) -> Any:
    """The study's plant-model fit settings."""
    from neorl_industrial.wrappers.models import FitSettings

    return FitSettings(
        max_updates=args.model_updates,
        holdout=args.holdout,
        split_seed=args.split_seed,
        window_steps=getattr(args, "model_window", 1),
    )


def study_dataset(spec: str, args: argparse.Namespace) -> dict[str, Any]:
    """One dataset: the plant model, the candidates, their verdict and their truth."""
    import jax

    from neorl_industrial.core.environments import Task
    from neorl_industrial.integration.datasets import generate_dataset
    from neorl_industrial.wrappers.agents import Agent, OPESettings
    from neorl_industrial.wrappers.training.evaluation import Evaluator
    from neorl_industrial.wrappers.training.verdict import (
        PlantRules,
        VerdictCandidates,
        VerdictSettings,
        model_verdict,
    )

    env_id, quality = spec.split(":")
    started = time.perf_counter()
    progress(f"{spec}: {args.trajectories} trajectories")
    dataset, card = generate_dataset(env_id, quality, args.trajectories, seed=args.data_seed)
    task = Task.from_env(env_id)
    model_started = time.perf_counter()
    model = _fitted_model(spec, task, dataset, card, args)
    simulator = model.simulator_fidelity(episodes=args.fidelity_episodes)
    model_seconds = time.perf_counter() - model_started
    heldout = dataset.select_episodes(np.asarray(model.card["dataset"]["holdout_episodes"]))
    returns = np.asarray(jax.device_get(dataset.episode_returns()), np.float64)
    episode_costs = np.asarray(jax.device_get(dataset.episode_costs()), np.float64)

    ope = OPESettings(
        always=True, holdout=args.holdout, split_seed=args.split_seed, updates=50, seeds=(0, 1)
    )
    settings = _verdict_settings(args)
    train_ids = np.asarray(model.card["dataset"]["train_episodes"])
    training = dataset.select_episodes(train_ids)
    trained: list[tuple[str, Any, float]] = []
    for label, algorithm, hyperparameters in CANDIDATES:
        if algorithm not in args.algorithms:
            continue
        updates = args.cql_updates if algorithm == "cql" else args.updates
        progress(f"{spec}: {label} x {args.seeds} seeds, {updates} updates")
        fit_started = time.perf_counter()
        agent = Agent(algorithm, env_id, hidden=tuple(args.hidden), **hyperparameters)
        common = dict(
            updates=updates, seeds=tuple(range(args.seeds)), chunk=min(args.chunk, updates)
        )
        if agent.entry.model_based:
            # Trains on the plant model, which must see the whole log (its fingerprint);
            # the agent holds out the same episodes as the model (same share and seed).
            agent.fit(
                dataset,
                **common,
                eval_episodes=1,
                ope=ope,
                card=card,
                plant_model=model,
                verdict=VerdictSettings(horizon=1, bootstrap=10, fqe=False),
            )
        else:
            agent.fit(training, **common, evaluate=False)
        trained.append((label, agent, time.perf_counter() - fit_started))

    # Every candidate of every algorithm in one verdict program and one simulator program.
    agents = [agent for _, agent, _ in trained]
    first = agents[0]
    names = [f"{label}, seed {seed}" for label, agent, _ in trained for seed in agent.seeds]
    policies = mixture_params([agent.policies for agent in agents])
    data = first.training_data(heldout)
    if first.scaler is not None:
        data = data.replace(actions=first.scaler.scale(data.actions))
    limits = list(first.cost_limits or [])
    progress(f"{spec}: verdict on {len(names)} candidates")
    judge_started = time.perf_counter()
    merged = model_verdict(
        VerdictCandidates(names, mixture_act([agent.policy_algorithm.act for agent in agents]),
                          policies),
        data,
        model,
        PlantRules(first.scaler, first.constraints,
                   limits if len(limits) == data.n_costs else None, first.cost_names,
                   first.task.episode_length),
        settings,
        selection=first.training_data(training),
    )  # fmt: skip
    judge_seconds = time.perf_counter() - judge_started
    progress(f"{spec}: the truth, {args.episodes} simulator episodes per candidate")
    env, env_params = first.simulator
    simulator_limits = limits if len(limits) == env.n_costs else None

    def truth_over(horizon: int) -> list[dict[str, Any]]:
        evaluator = Evaluator(
            SimpleNamespace(act=mixture_act([agent.algorithm.act for agent in agents])),
            env,
            env_params,
            episodes=args.episodes,
            horizon=horizon,
            constraints=first.constraints,
            shield=True,
            cost_limits=simulator_limits,
            cost_names=env.cost_names,
            seed=args.eval_seed,
        )
        return evaluator(policies, 0)

    runs = truth_over(int(env_params.horizon))
    # The same episodes cut short: how the first steps rank the candidates against the
    # whole episode (the verdict's estimates read a horizon, discounted, not the episode).
    first_steps = {
        steps: [run["return"] for run in truth_over(steps)]
        for steps in sorted({min(100, settings.horizon), settings.horizon})
        if steps < int(env_params.horizon)
    }
    candidates = []
    rows = iter(zip(merged.to_dict()["candidates"], runs, strict=True))
    for label, agent, seconds in trained:
        for seed in agent.seeds:
            row, run = next(rows)
            estimates = {e["estimator"]: e for e in row["estimates"]}
            candidates.append(
                {
                    "name": row["name"],
                    "configuration": label,
                    "algorithm": agent.entry.name,
                    "seed": seed,
                    "qualifies": row["qualifies"],
                    "reasons": row["reasons"],
                    "estimates": {
                        name: {
                            "value": estimates[name]["discounted_return"]["value"],
                            "improvement": estimates[name]["improvement"],
                        }
                        for name in ESTIMATORS
                        if name in estimates
                    },
                    "true_return": run["return"],
                    "true_return_error": run["return_std"] / np.sqrt(run["episodes"]),
                    "true_normalized_cost": run["normalized_cost"],
                    "true_episode_cost": run["episode_cost"],
                    "fit_seconds": seconds / len(agent.seeds),
                }
            )
    truth = np.asarray([c["true_return"] for c in candidates])
    behaviour_return = float(returns.mean())
    per_channel = episode_costs.mean(axis=0) / np.asarray(limits) if limits else np.zeros(0)
    ranking = _rankings(candidates, truth)
    ceiling = _truth_ceiling(truth, [c["true_return_error"] for c in candidates])
    if ceiling is not None:
        ceiling["first_steps"] = {
            str(steps): _ranking(np.asarray(values), truth)["rank_correlation"]
            for steps, values in first_steps.items()
        }
    names = [c["name"] for c in candidates]
    recommended = names.index(merged.recommended) if merged.recommended else None
    outcome: dict[str, Any] = {"decision": merged.decision, "recommended": merged.recommended}
    if recommended is not None:
        chosen = candidates[recommended]
        outcome |= {
            "true_return": chosen["true_return"],
            "improvement_over_behaviour": chosen["true_return"] - behaviour_return,
            "worse_than_behaviour": bool(chosen["true_return"] < behaviour_return),
            "over_cost_limit": bool((chosen["true_normalized_cost"] or 0.0) > 1.0),
            "regret_share": float((truth.max() - chosen["true_return"]) / np.ptp(truth))
            if np.ptp(truth) > 0
            else 0.0,
        }
    else:
        outcome |= {"worse_than_behaviour": False, "over_cost_limit": False}
    outcome["bad"] = bool(outcome["worse_than_behaviour"] or outcome["over_cost_limit"])
    outcome["every_tested"] = _every_tested(merged, candidates, behaviour_return)
    better = truth > behaviour_return
    return {
        "dataset": spec,
        "seconds": time.perf_counter() - started,
        "model_seconds": model_seconds,
        "verdict_seconds": judge_seconds,
        "transitions": int(dataset.n_transitions),
        "heldout_episodes": int(heldout.n_episodes),
        "behaviour": {
            "true_return": behaviour_return,
            "normalized_cost": float(per_channel.max()) if per_channel.size else None,
        },
        "fidelity": {
            "heldout": _fidelity_summary(model.card["fidelity"]),
            "simulator": _fidelity_summary(simulator),
            "model_updates": model.card["fit"]["updates"],
        },
        "candidates": candidates,
        "ranking": ranking,
        "truth_ceiling": ceiling,
        "verdict": outcome,
        "statement": merged.statement,
        "calibration": merged.to_dict()["calibration"],
        "truly_better_than_behaviour": int(better.sum()),
        "truly_better_and_safe": sum(_truly_better(c, behaviour_return) for c in candidates),
    }


def _verdict_settings(args: argparse.Namespace) -> Any:
    """The verdict's settings of a study run."""
    from neorl_industrial.wrappers.training.verdict import VerdictSettings

    return VerdictSettings(
        horizon=args.horizon,
        max_starts=args.starts,
        bootstrap=args.bootstrap,
        fqe_updates=args.fqe_updates,
        bc_updates=args.fqe_updates,
        fqe_hidden=tuple(args.hidden),
        replay_residuals=bool(getattr(args, "replay_residuals", False)),
    )


def _window_text(config: dict[str, Any]) -> str:
    """How the plant model trained, where not one step ahead (older results: one step)."""
    steps = int(config.get("model_window", 1) or 1)
    return f" on {steps}-step windows of its own predictions" if steps > 1 else ""


def _history_option(text: str) -> int | tuple[int, ...]:
    """``--history``: rows per observation, or ``check:1,3,10`` (the histories the
    product's check compares)."""
    try:
        if text.startswith("check:"):
            histories = tuple(int(part) for part in text[len("check:") :].split(","))
            if len(histories) >= 2 and min(histories) >= 1:
                return histories
        elif int(text) >= 1:
            return int(text)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected rows such as 3, or check:1,3,10, got {text!r}")


def _plant_model_with_history(
    name: str, folder: Any, args: argparse.Namespace
) -> tuple[Any, Any, Any, dict[str, Any] | None]:
    """The plant's log written and imported, and its plant model: with a fixed
    ``--history``, that history; with ``check:...``, the one the product's history check
    chooses (``compare_histories``, the study's fit settings), its model reused.
    Returns ``(dataset, card, model, check report or None)``."""
    from benchmarks.plants import write_plant
    from neorl_industrial.core.models import DynamicsConfig
    from neorl_industrial.integration.datasets import load_plant_log
    from neorl_industrial.wrappers.models.history_check import compare_histories

    progress(f"{name}: the operators' log, {args.plant_episodes} episodes")
    if isinstance(args.history, int):
        csv = write_plant(
            name, folder, seed=args.data_seed, episodes=args.plant_episodes, history=args.history
        )
        dataset, card = load_plant_log(csv, folder / "schema.yaml")
        model = _fitted_model(name, card.task(dataset), dataset, card, args)
        return dataset, card, model, None
    csv = write_plant(name, folder, seed=args.data_seed, episodes=args.plant_episodes)

    def load(history: int) -> tuple[Any, Any, Any, Any]:
        dataset, card = load_plant_log(csv, folder / "schema.yaml", history=history)
        return dataset, card.task(dataset), card.definitions, card.reward_row

    report = compare_histories(
        load,
        args.history,
        _fit_settings(args),
        DynamicsConfig(**({"hidden": tuple(args.model_hidden)} if args.model_hidden else {})),
        dataset_name=name,
        progress=lambda message: progress(f"{name}: {message}"),
        keep_models=True,
    )
    models = report.pop("models")
    choice = report["choice"]
    progress(f"{name}: the history check chose {choice} rows")
    # The same log (the same seed), its schema and run files now with the chosen history.
    csv = write_plant(
        name, folder, seed=args.data_seed, episodes=args.plant_episodes, history=choice
    )
    dataset, card = load_plant_log(csv, folder / "schema.yaml")
    model = models[choice]
    model.check_same_data(dataset)
    return dataset, card, model, report


def _plant_candidates(args: argparse.Namespace) -> list[tuple[str, str, dict[str, Any]]]:
    return [entry for entry in PLANT_CANDIDATES if entry[1] in args.algorithms]


def study_plant(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One study plant (:mod:`benchmarks.plants`): its operators' log written, imported
    with its schema (no simulator behind the dataset), the plant model, the candidates,
    their verdict and, from the plant's own simulator, the truth: whole episodes from the
    plant's start distribution and the improvement over the operators' closed loop from
    the verdict's own starts, horizon and discount (:mod:`benchmarks.plants.truth`)."""
    import tempfile
    from pathlib import Path

    import jax

    from benchmarks.plants import make_plant
    from benchmarks.plants.truth import PlantTruth, mean_interval, verdict_starts
    from neorl_industrial.wrappers.agents import Agent
    from neorl_industrial.wrappers.training.verdict import (
        PlantRules,
        VerdictCandidates,
        model_verdict,
    )

    started = time.perf_counter()
    plant = make_plant(name)
    folder = Path(args.plant_dir or tempfile.mkdtemp(prefix="verdict-study-")) / name
    model_started = time.perf_counter()
    dataset, card, model, history_check = _plant_model_with_history(name, folder, args)
    model_seconds = time.perf_counter() - model_started
    task = card.task(dataset)
    constraints = folder / "constraints.yaml"
    holdout_ids = np.asarray(model.card["dataset"]["holdout_episodes"])
    heldout = dataset.select_episodes(holdout_ids)
    training = dataset.select_episodes(np.asarray(model.card["dataset"]["train_episodes"]))
    logged = np.asarray(jax.device_get(dataset.episode_returns()), np.float64)
    settings = _verdict_settings(args)
    trained: list[tuple[str, Any, float]] = []
    for label, algorithm, hyperparameters in _plant_candidates(args):
        progress(f"{name}: {label} x {args.seeds} seeds, {args.updates} updates")
        fit_started = time.perf_counter()
        agent = Agent(
            algorithm,
            task=task,
            constraints=constraints,
            hidden=tuple(args.hidden),
            **hyperparameters,
        )
        agent.fit(
            training,
            updates=args.updates,
            seeds=tuple(range(args.seeds)),
            chunk=min(args.chunk, args.updates),
            evaluate=False,
        )
        trained.append((label, agent, time.perf_counter() - fit_started))
    agents = [agent for _, agent, _ in trained]
    first = agents[0]
    names = [f"{label}, seed {seed}" for label, agent, _ in trained for seed in agent.seeds]
    policies = mixture_params([agent.policies for agent in agents])
    data = first.training_data(heldout)
    if first.scaler is not None:
        data = data.replace(actions=first.scaler.scale(data.actions))
    limits = [cost.limit for cost in plant.costs]
    progress(f"{name}: verdict on {len(names)} candidates")
    judge_started = time.perf_counter()
    merged = model_verdict(
        VerdictCandidates(names, mixture_act([agent.policy_algorithm.act for agent in agents]),
                          policies),
        data,
        model,
        PlantRules(first.scaler, first.constraints, limits, first.cost_names,
                   first.task.episode_length),
        settings,
        selection=first.training_data(training),
    )  # fmt: skip
    judge_seconds = time.perf_counter() - judge_started

    progress(f"{name}: the truth, {args.truth_episodes} episodes and the verdict's starts")
    truth = PlantTruth(plant, folder)
    starts = verdict_starts(
        data, holdout_ids, max_starts=settings.max_starts, horizon=settings.horizon
    )
    truth_options = dict(
        discount=settings.discount, replicates=args.replicates, seed=args.eval_seed
    )
    operators = truth.episodes(truth.operators(), episodes=args.truth_episodes, seed=args.eval_seed)
    baseline = truth.at_starts(truth.operators(), starts, **truth_options)
    candidates = []
    rows = iter(merged.to_dict()["candidates"])  # a side no data bounds: None
    for label, agent, seconds in trained:
        for run, seed in enumerate(agent.seeds):
            row = next(rows)
            controller = truth.controller(
                lambda observations, previous, agent=agent, run=run: agent.predict(
                    observations, previous, run=run
                )
            )
            whole = truth.episodes(controller, episodes=args.truth_episodes, seed=args.eval_seed)
            gain = mean_interval(whole["_runs"].returns - operators["_runs"].returns)
            at_starts = truth.improvement(controller, starts, baseline=baseline, **truth_options)
            estimates = {e["estimator"]: e for e in row["estimates"]}
            true_gain = at_starts["improvement"]["value"]
            candidates.append(
                {
                    "name": row["name"],
                    "configuration": label,
                    "algorithm": agent.entry.name,
                    "seed": seed,
                    "qualifies": row["qualifies"],
                    "reasons": row["reasons"],
                    "estimates": {
                        key: {
                            "value": estimates[key]["discounted_return"]["value"],
                            "improvement": estimates[key]["improvement"],
                            "covers": covers(estimates[key]["improvement"], true_gain),
                            "costs": [_cost_reading(cost) for cost in estimates[key]["costs"]],
                        }
                        | {
                            part: estimates[key][part]
                            for part in MODEL_PARTS
                            if estimates[key].get(part) is not None
                        }
                        for key in ESTIMATORS
                        if key in estimates
                    },
                    "true_return": whole["return"]["value"],
                    "true_return_interval": whole["return"],
                    "true_return_error": float(
                        np.std(whole["_runs"].returns, ddof=1)
                        / np.sqrt(len(whole["_runs"].returns))
                    ),
                    "true_normalized_cost": whole["normalized_cost"],
                    "true_episode_cost": [c["value"] for c in whole["cost"]],
                    "true_improvement": gain.to_dict(),
                    "true_improvement_at_starts": at_starts["improvement"],
                    "true_cost_rate_at_starts": at_starts["cost_rate"],
                    "true_value_at_starts": at_starts["value"],
                    "fit_seconds": seconds / len(agent.seeds),
                }
            )
    truth_values = np.asarray([c["true_return"] for c in candidates])
    ranking = _rankings(candidates, truth_values)
    ceiling = _truth_ceiling(truth_values, [c["true_return_error"] for c in candidates])
    behaviour_return = operators["return"]["value"]
    outcome: dict[str, Any] = {"decision": merged.decision, "recommended": merged.recommended}
    if merged.recommended:
        chosen = next(c for c in candidates if c["name"] == merged.recommended)
        outcome |= {
            "true_return": chosen["true_return"],
            "improvement_over_behaviour": chosen["true_improvement"]["value"],
            "worse_than_behaviour": bool(chosen["true_return"] < behaviour_return),
            "not_truly_better": bool(chosen["true_improvement"]["lower"] <= 0.0),
            "over_cost_limit": bool(chosen["true_normalized_cost"] > 1.0),
            "regret_share": float(
                (truth_values.max() - chosen["true_return"]) / np.ptp(truth_values)
            )
            if np.ptp(truth_values) > 0
            else 0.0,
        }
    else:
        outcome |= {
            "worse_than_behaviour": False,
            "not_truly_better": False,
            "over_cost_limit": False,
        }
    outcome["bad"] = bool(outcome["not_truly_better"] or outcome["over_cost_limit"])
    outcome["every_tested"] = _every_tested(merged, candidates, behaviour_return)
    return {
        "dataset": name,
        "plant": True,
        "operators_kind": plant.operators_kind,
        "seconds": time.perf_counter() - started,
        "model_seconds": model_seconds,
        "verdict_seconds": judge_seconds,
        "transitions": int(dataset.n_transitions),
        "heldout_episodes": int(heldout.n_episodes),
        "starts": {
            "count": len(starts.row),
            "horizon": int(starts.length.max()),
            "discount": settings.discount,
            "replicates": args.replicates,
        },
        "behaviour": {
            "true_return": behaviour_return,
            "true_return_interval": operators["return"],
            "logged_return": float(logged.mean()),
            "normalized_cost": operators["normalized_cost"],
            "true_value_at_starts": mean_interval(baseline.mean(axis=1)).to_dict(),
            "logged_value_at_starts": _logged_at_starts(data, starts, settings.discount),
        },
        "fidelity": {
            "heldout": _fidelity_summary(model.card["fidelity"]),
            "simulator": None,
            "model_updates": model.card["fit"]["updates"],
        },
        "history": int(dataset.frame_stack),
        "history_check": history_check,
        "candidates": candidates,
        "ranking": ranking,
        "truth_ceiling": ceiling,
        "verdict": outcome,
        "statement": merged.statement,
        "calibration": merged.to_dict()["calibration"],
        "truly_better_than_behaviour": int(
            sum(c["true_improvement"]["lower"] > 0 for c in candidates)
        ),
        "truly_better_and_safe": sum(_truly_better(c, behaviour_return) for c in candidates),
        "clearly_better": int(sum(_clearly_better(c, behaviour_return) for c in candidates)),
    }


def _cost_check(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """How the ``model`` cost reading held against the truth at the verdict's starts:
    of the candidates truly over a limit there, how many it read as within every limit
    (``missed``: the side that lets a wrong recommendation through), and of those truly
    within, how many it read as over (``refused``: lost power). None without costs."""
    judged = [
        c | {"name": f"{row['dataset']}: {c['name']}"}
        for row in rows
        for c in row["candidates"]
        if c.get("true_cost_rate_at_starts") and c["estimates"].get("model", {}).get("costs")
    ]
    if not judged:
        return None

    def truly_over(c: dict[str, Any]) -> bool:
        return any(rate is not None and rate > 1.0 for rate in c["true_cost_rate_at_starts"])

    def read_within(c: dict[str, Any]) -> bool:
        return all(cost["within"] is not False for cost in c["estimates"]["model"]["costs"])

    over = [c for c in judged if truly_over(c)]
    within = [c for c in judged if not truly_over(c)]
    return {
        "truly_over": len(over),
        "missed": [c["name"] for c in over if read_within(c)],
        "truly_within": len(within),
        "refused": [c["name"] for c in within if not read_within(c)],
    }


def _cost_reading(cost: dict[str, Any]) -> dict[str, Any]:
    """One channel of an estimator's cost: its estimate and upper bound in limits (None
    where not limited) and whether the verdict read it as within the limit."""
    value = cost.get("value") or {}
    return {
        "channel": cost["channel"],
        "value": value.get("value"),
        "upper": value.get("upper"),
        "within": cost.get("within_limit"),
        "evidence": cost.get("evidence"),
    }


def _logged_at_starts(heldout: Any, starts: Any, discount: float) -> float:
    """The logged operation's mean discounted return from the verdict's starts (data)."""
    import jax

    rewards = np.asarray(jax.device_get(heldout.rewards), np.float64)
    first = np.asarray(jax.device_get(heldout.episode_starts), np.int64)[starts.group]
    values = [
        rewards[begin + row : begin + row + length] @ discount ** np.arange(length)
        for begin, row, length in zip(first, starts.row, starts.length, strict=True)
    ]
    return float(np.mean(values))


def _clearly_better(candidate: dict[str, Any], behaviour_return: float) -> bool:
    """The issue's "clearly better": a true improvement of at least a quarter of the
    operators' |return| at a true cost within half of every limit. On a study plant the
    improvement's interval must be above 0; on a suite dataset, whose truth is the mean
    of a few simulator episodes, that mean decides."""
    gain = candidate.get("true_improvement") or {
        "value": candidate["true_return"] - behaviour_return,
        "lower": candidate["true_return"] - behaviour_return,
    }
    return bool(
        gain["lower"] > 0.0
        and gain["value"] >= 0.25 * abs(behaviour_return)
        and (candidate["true_normalized_cost"] or 0.0) <= 0.5
    )


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Across datasets: per estimator the mean and worst regret@1 and the mean rank
    correlation, the verdict's record, and which targets were met."""
    per_estimator = {}
    for name in ESTIMATORS:
        own = [row["ranking"][name] for row in rows if name in row["ranking"]]
        if not own:
            continue
        regrets = [r["regret_share"] for r in own]
        correlations = [r["rank_correlation"] for r in own if r["rank_correlation"] is not None]
        per_estimator[name] = {
            "mean_regret": float(np.mean(regrets)),
            "worst_regret": float(np.max(regrets)),
            "mean_correlation": float(np.mean(correlations)) if correlations else None,
            "targets_met": {
                "mean_regret": bool(np.mean(regrets) <= TARGETS["mean_regret"]),
                "worst_regret": bool(np.max(regrets) <= TARGETS["worst_regret"]),
                "mean_correlation": bool(
                    correlations and np.mean(correlations) >= TARGETS["mean_correlation"]
                ),
            },
        }
    bad = sum(row["verdict"]["bad"] for row in rows)
    random_regret = [
        float(
            np.mean(
                (max(t) - np.asarray(t)) / max(max(t) - min(t), 1e-12)
                if (t := [c["true_return"] for c in row["candidates"]])
                else [0.0]
            )
        )
        for row in rows
    ]
    powered = [row for row in rows if _has_clearly_better(row)]
    found = [row for row in powered if _found(row)]
    return {
        "estimators": per_estimator,
        "plants": _plant_summary([row for row in rows if row.get("plant")]),
        "random_regret": float(np.mean(random_regret)),
        "recommended": sum(row["verdict"]["decision"] == "recommend" for row in rows),
        "bad_recommendations": int(bad),
        "bad_target_met": bool(bad <= TARGETS["bad"]),
        "power": {
            "datasets": [row["dataset"] for row in powered],
            "found": [row["dataset"] for row in found],
            "met": (len(found) / len(powered) >= PLANT_TARGETS["power"]) if powered else None,
        },
    }


def _power_sentence(total: dict[str, Any]) -> list[str]:
    """The power target's sentence (results written before it was summarised: none)."""
    power = total.get("power")
    if not power or not power["datasets"]:
        return []
    missed = [name for name in power["datasets"] if name not in power["found"]]
    return [
        f"Power: of the {len(power['datasets'])} datasets with a clearly better candidate "
        "(a true gain of at least 25 % of the behaviour's |return|, cost within half of "
        f"every limit), a truly better candidate was recommended on {len(power['found'])} "
        f"(target 80 %: {'met' if power['met'] else 'missed'})"
        + (f"; not on {', '.join(missed)}." if missed else ".")
    ]


def _has_clearly_better(row: dict[str, Any]) -> bool:
    """Whether a dataset has a clearly better candidate (:func:`_clearly_better`)."""
    behaviour = row["behaviour"]["true_return"]
    return any(_clearly_better(c, behaviour) for c in row["candidates"])


def _found(row: dict[str, Any]) -> bool:
    """Whether the verdict recommended a candidate that is truly better and within the
    limits (the power target's success)."""
    return row["verdict"]["decision"] == "recommend" and not row["verdict"]["bad"]


def _every_tested_text(row: dict[str, Any]) -> str:
    """One sentence: what testing every candidate would have recommended (results
    without it: nothing)."""
    every = row["verdict"].get("every_tested")
    if every is None:
        return ""
    if every["recommended"] is None:
        return " Had every candidate been tested, none would have been recommended."
    truth = "truly worse or over a limit" if every["bad"] else "truly better, within the limits"
    return (
        f" Had every candidate been tested, {every['recommended']} would have been "
        f"recommended ({truth})."
    )


def _every_tested(
    verdict: Any, candidates: Sequence[dict[str, Any]], behaviour_return: float
) -> dict[str, Any]:
    """What the verdict would have recommended had every candidate been tested on the
    held-out episodes (no selection on the training episodes first), and whether that
    one is truly worse than the operators (or, on a plant, not truly better) or over a
    limit."""

    def lower(row: dict[str, Any]) -> float:
        model = next(e for e in row["estimates"] if e["estimator"] == "model")
        return float(model["improvement"]["lower"])

    passing = [
        row
        for row in verdict.candidates
        if all(reason.startswith(NOT_SELECTED) for reason in row["reasons"])
    ]
    if not passing:
        return {"recommended": None, "bad": False}
    name = max(passing, key=lower)["name"]
    chosen = next(c for c in candidates if c["name"] == name)
    improvement = chosen.get("true_improvement")
    worse = (
        improvement["lower"] <= 0.0
        if isinstance(improvement, dict)
        else chosen["true_return"] < behaviour_return
    )
    over = (chosen["true_normalized_cost"] or 0.0) > 1.0
    return {"recommended": name, "bad": bool(worse or over)}


#: The issue's targets on the study plants, against the truth at the verdict's starts:
#: recommendations not truly better or over a limit, the share of datasets with a clearly
#: better candidate where a truly better one is recommended, the share of candidates whose
#: deciding estimator's interval holds the true improvement, the rank correlation.
PLANT_TARGETS = {"bad": 0, "power": 0.8, "coverage": 0.9, "correlation": 0.7}


def _plant_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The issue's targets over the study plants' rows (None without any)."""
    if not rows:
        return None
    candidates = [c for row in rows for c in row["candidates"]]
    coverage = {
        name: float(np.mean([c["estimates"][name]["covers"] for c in candidates]))
        for name in ESTIMATORS
        if candidates and all(name in c["estimates"] for c in candidates)
    }
    # The candidates the verdict answers for (not refused as far outside the data).
    answered = [c for c in candidates if not any(_answers_not(r) for r in c["reasons"])]
    answered_coverage = (
        {"of": len(answered), "held": int(sum(c["estimates"]["model"]["covers"] for c in answered))}
        if candidates and all("model" in c["estimates"] for c in candidates)
        else None
    )
    correlations = {
        name: [row["ranking"].get(name, {}).get("rank_correlation") for row in rows]
        for name in ESTIMATORS
    }
    answered_correlations = [
        row["ranking"].get("model", {}).get("answered_rank_correlation") for row in rows
    ]
    powered = [row for row in rows if row["clearly_better"] > 0]
    found = [row for row in powered if _found(row)]
    bad = int(sum(row["verdict"]["bad"] for row in rows))
    cost_check = _cost_check(rows)
    deciding = [name for name in ("model", "model+fqe") if name in coverage]
    worst_coverage = min((coverage[name] for name in deciding), default=None)
    return {
        "datasets": [row["dataset"] for row in rows],
        "bad_recommendations": bad,
        "power": {"datasets": len(powered), "found": len(found)},
        "coverage": coverage,
        "answered_coverage": answered_coverage,
        "cost_check": cost_check,
        "rank_correlation": correlations,
        "answered_rank_correlation": answered_correlations,
        "targets_met": {
            "bad": bad <= PLANT_TARGETS["bad"],
            "power": (len(found) / len(powered) >= PLANT_TARGETS["power"]) if powered else None,
            "coverage": None
            if worst_coverage is None
            else bool(worst_coverage >= PLANT_TARGETS["coverage"]),
            "correlation": all(
                value is not None and value >= PLANT_TARGETS["correlation"]
                for value in correlations["model"]
            ),
        },
    }


def _answers_not(reason: str) -> bool:
    """Whether a verdict's reason says the data cannot answer for the candidate."""
    return reason.endswith("the data cannot answer for it")


def _number(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _truly_better(candidate: dict[str, Any], behaviour_return: float) -> bool:
    """The simulator's truth: above the behaviour's return and within every cost limit."""
    return bool(
        candidate["true_return"] > behaviour_return
        and (candidate["true_normalized_cost"] or 0.0) <= 1.0
    )


#: What kept a candidate out, read from the verdict's reasons (wrappers/training/verdict.py).
KEPT_BY = {
    "model bound": "model: lower bound <= 0",
    "model+fqe bound": "model+fqe: lower bound <= 0",
    "cost limit": "a cost may exceed its limit",
    "cost evidence": "too few cost events held out",
    "episodes": "too few held-out episodes",
    "calibration": "the model does not reproduce the operators",
    "far outside": "far outside the data",
    "not selected": "not selected on the training episodes",
}


def _reason_kind(reason: str) -> str:
    """The kind (a key of :data:`KEPT_BY`) of one of the verdict's reasons."""
    if reason.startswith("insufficient evidence"):
        return "episodes"
    if reason.startswith(NOT_SELECTED):
        # Another candidate was selected on the training episodes: only it was tested.
        return "not selected"
    if reason.startswith("calibration: "):
        # The plant model misses the operators' own logged returns or costs (or too few
        # held-out episodes to check it): nothing it estimates is trusted.
        return "calibration"
    estimator, _, rest = reason.partition(": ")
    if rest.endswith("the data cannot answer for it"):
        return "far outside"
    if rest.startswith("cost "):
        return "cost evidence" if "insufficient evidence" in rest else "cost limit"
    kind = f"{estimator} bound"
    if not rest.startswith("the lower") or kind not in KEPT_BY:
        raise ValueError(f"a reason of the verdict this page does not know: {reason!r}")
    return kind


def _kept_section(rows: list[dict[str, Any]]) -> list[str]:
    """Why candidates that were truly better than the behaviour, and within its limits,
    were kept out: per dataset, how many each kind of reason held back (one candidate may
    have several), and how many the model estimator alone would have let through."""
    lines = [
        "",
        "### Why truly better candidates were kept",
        "",
        "Candidates whose true return was above the behaviour's and within the cost limits "
        "but that did not qualify, by what held them back (a candidate may count under "
        "several), and how many would qualify if the model estimator alone decided.",
        "",
        "| dataset | kept | " + " | ".join(KEPT_BY.values()) + " | model alone would pass |",
        "|---|---|" + "---|" * len(KEPT_BY) + "---|",
    ]
    for row in rows:
        behaviour = row["behaviour"]["true_return"]
        kept = [c for c in row["candidates"] if _truly_better(c, behaviour) and not c["qualifies"]]
        kinds = [{_reason_kind(reason) for reason in c["reasons"]} for c in kept]
        counts = [sum(kind in own for own in kinds) for kind in KEPT_BY]
        alone = sum(not own - {"model+fqe bound"} for own in kinds)
        lines.append(
            f"| {row['dataset']} | {len(kept)} | {' | '.join(map(str, counts))} | {alone} |"
        )
    return lines


def covers(interval: dict[str, Any], truth: float) -> bool:
    """The interval (a report's: a side no data bounds is None) holds ``truth``."""
    lower, upper = interval["lower"], interval["upper"]
    return bool((lower is None or lower <= truth) and (upper is None or truth <= upper))


def _bound(value: float | None, spec: str = ",.4g") -> str:
    return "no bound" if value is None else f"{value:{spec}}"


def _interval_text(interval: dict[str, float] | None) -> str:
    if interval is None:
        return "-"
    return f"{interval['value']:,.4g} [{interval['lower']:,.4g}, {interval['upper']:,.4g}]"


def _correlation_text(ranking: dict[str, Any], candidates: int) -> str:
    """The rank correlation, and over the candidates the verdict answers for when it
    does not answer for all of them."""
    text = _number(ranking["rank_correlation"])
    answered = ranking.get("answered")
    if answered is not None and answered < candidates:
        text += f" ({_number(ranking.get('answered_rank_correlation'))} of the {answered} answered)"
    return text


def _cost_check_text(check: dict[str, Any] | None) -> str:
    """The ``model`` cost reading against the truth at the starts, in one sentence."""
    if not check:
        return ""
    missed = check["missed"]
    return (
        f" The model's cost reading (every limited cost within its limit by its upper "
        f"bound) against the truth at the verdict's starts: of {check['truly_over']} "
        f"candidates truly over a limit there, {len(missed)} read as within"
        + (f" ({', '.join(missed)})" if missed else "")
        + f"; of {check['truly_within']} truly within, {len(check['refused'])} read as over."
    )


def _plants_section(rows: list[dict[str, Any]], total: dict[str, Any] | None) -> list[str]:
    """The study plants against their truth: the operators' closed loop, every
    candidate's true improvement over it (whole episodes, and from the verdict's starts
    with its horizon and discount) and whether the estimators' intervals held it."""
    plants = [row for row in rows if row.get("plant")]
    if not plants or total is None:
        return []
    met = total["targets_met"]

    def verdict_of(flag: bool | None) -> str:
        return "-" if flag is None else ("met" if flag else "missed")

    coverage = ", ".join(f"{name} {share:.0%}" for name, share in total["coverage"].items())
    answered = ""
    counted = total.get("answered_coverage")
    if counted and counted["of"]:
        answered = (
            f"; of the {counted['of']} candidates the verdict answers for (not refused as far "
            f"outside the data), the model's interval holds the truth for {counted['held']} "
            f"({counted['held'] / counted['of']:.0%})"
        )
    lines = [
        "",
        "## The study plants against their truth",
        "",
        "Plants the product was not written for ([benchmarks/plants](../benchmarks/plants)): "
        "each log written by its operators' controller and imported with its schema (no "
        "simulator behind the dataset); the truth runs every candidate (its shield on) and "
        "the operators' controller closed loop in the plant's simulator: whole episodes "
        "from the plant's start distribution, and from the verdict's own starts over its "
        "horizon with its discount, each start with its disturbance replicates, paired.",
        "",
        f"Targets: recommendations not truly better than the operators (the lower end of "
        f"the true improvement's 95 % interval at or below 0) or over a cost limit: "
        f"**{total['bad_recommendations']}** (target 0: {verdict_of(met['bad'])}); power: "
        f"a truly better candidate recommended on {total['power']['found']} of the "
        f"{total['power']['datasets']} plants with a clearly better candidate (>= 25 % of "
        f"the operators' |return|, cost within half its limit; target 80 %: "
        f"{verdict_of(met['power'])}); the estimators' improvement interval holds the true "
        f"improvement at the verdict's starts for: {coverage} of the candidates (deciding "
        f"estimators' target 90 %: {verdict_of(met['coverage'])}){answered}; model rank "
        f"correlation >= 0.7 on every plant: {verdict_of(met['correlation'])}."
        + _cost_check_text(total.get("cost_check")),
        "",
        "| plant | operators | operators' true return [95 %] (logged) | clearly better | "
        "best candidate within the limits: true improvement [95 %], cost / limit | "
        "decision | recommended: true improvement [95 %] | model / model+fqe interval holds "
        "the truth | rank correlation (model) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in plants:
        # The best the candidates truly did within the limits (over them, if none is).
        safe = [c for c in row["candidates"] if (c["true_normalized_cost"] or 0.0) <= 1.0]
        best = max(safe or row["candidates"], key=lambda c: c["true_improvement"]["value"])
        outcome = row["verdict"]
        recommended = "-"
        if outcome["decision"] == "recommend":
            chosen = next(c for c in row["candidates"] if c["name"] == outcome["recommended"])
            recommended = f"{chosen['name']}: {_interval_text(chosen['true_improvement'])}"
        held = " / ".join(
            f"{sum(c['estimates'][name]['covers'] for c in row['candidates'])} of "
            f"{len(row['candidates'])}"
            if all(name in c["estimates"] for c in row["candidates"])
            else "-"
            for name in ("model", "model+fqe")
        )
        behaviour = row["behaviour"]
        lines.append(
            f"| {row['dataset']} | {row['operators_kind']} | "
            f"{_interval_text(behaviour['true_return_interval'])} "
            f"({behaviour['logged_return']:,.4g}) | {row['clearly_better']} of "
            f"{len(row['candidates'])} | {best['name']}: "
            f"{_interval_text(best['true_improvement'])}, "
            f"{_number(best['true_normalized_cost'])} | {outcome['decision']} | {recommended} | "
            f"{held} | {_correlation_text(row['ranking']['model'], len(row['candidates']))} |"
        )
    for row in plants:
        starts = row["starts"]
        lines += [
            "",
            f"### {row['dataset']}: every candidate",
            "",
            f"From the verdict's {starts['count']} starts (horizon {starts['horizon']}, "
            f"discount {starts['discount']}, {starts['replicates']} replicates each): the "
            f"operators' true value "
            f"{_interval_text(row['behaviour']['true_value_at_starts'])}, logged "
            f"{row['behaviour']['logged_value_at_starts']:,.4g}. {row['statement']}"
            f"{_every_tested_text(row)}",
            "",
            "| candidate | true return [95 %] | true cost / limit | true improvement, whole "
            "episodes | true improvement at the starts | model's interval | model+fqe's "
            "interval | qualifies |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for c in row["candidates"]:
            cells = []
            for name in ("model", "model+fqe"):
                own = c["estimates"].get(name)
                if own is None:
                    cells.append("-")
                    continue
                gain = own["improvement"]
                cells.append(
                    f"{_bound(gain['lower'])} to {_bound(gain['upper'])} "
                    f"({'holds' if own['covers'] else 'misses'})"
                )
            lines.append(
                f"| {c['name']} | {_interval_text(c['true_return_interval'])} | "
                f"{_number(c['true_normalized_cost'])} | "
                f"{_interval_text(c['true_improvement'])} | "
                f"{_interval_text(c['true_improvement_at_starts'])} | {' | '.join(cells)} | "
                f"{'yes' if c['qualifies'] else 'no'} |"
            )
    return lines


def _ceiling_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Where the truth was measured with its errors: how well a perfect estimator would
    rank against it (:func:`_truth_ceiling`), beside the model's correlation."""
    measured = [row for row in rows if row.get("truth_ceiling")]
    if not measured:
        return []
    cells = []
    for row in measured:
        ceiling = row["truth_ceiling"]
        model = (row["ranking"].get("model") or {}).get("rank_correlation")
        first = "".join(
            f"first {steps} steps {_number(value)}, "
            for steps, value in (ceiling.get("first_steps") or {}).items()
        )
        cells.append(
            f"{row['dataset']} {_number(ceiling['median'])} [{_number(ceiling['low'])}, "
            f"{_number(ceiling['high'])}] ({first}model {_number(model)})"
        )
    return [
        "",
        "The truth's own noise bounds a rank correlation: the candidates' true returns are "
        "means over the simulator episodes, and measured again they would rank differently. "
        "Spearman's correlation of the measured truth with itself measured again (normal "
        "noise of each mean's standard error; median [95 % range] over 2,000 draws), what "
        "a perfect estimator would reach (and, where measured, the correlation of the truth "
        "over an episode's first steps, from the same resets, with the whole episode's): "
        + "; ".join(cells)
        + ".",
    ]


def _history_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Where the product's history check chose a plant log's history: its errors."""
    checked = [row for row in rows if row.get("history_check")]
    if not checked:
        return []
    lines = [
        "",
        "The history check (`neorl-industrial model history`) chose each plant log's rows "
        "per observation: the shortest history whose open-loop error at "
        f"{checked[0]['history_check']['horizon']} steps on the held-out episodes is within "
        f"{checked[0]['history_check']['margin'] * 100:.0f} % of the lowest. That error, "
        "relative to each feature's spread:",
        "",
    ]
    for row in checked:
        check = row["history_check"]
        errors = ", ".join(
            f"{entry['history']} row{'s' if entry['history'] > 1 else ''} "
            f"{_number(entry['long_horizon_error'])}"
            for entry in check["rows"]
        )
        lines.append(f"- {row['dataset']}: {errors}; chosen: **{check['choice']}**")
    return lines


def page(config: dict[str, Any], results: dict[str, Any]) -> str:
    """The markdown page of a study's result."""
    rows, total = results["datasets"], results["summary"]
    present = {c["configuration"] for row in rows for c in row["candidates"]}
    labels = [label for label, _, _ in CANDIDATES if label in present]
    lines = [
        "# The verdict against the truth",
        "",
        "Generated by `python -m benchmarks.verdict_study` (do not edit by hand). On every",
        "dataset a plant model was fitted on the training episodes, candidate policies were",
        "trained on the same episodes, every candidate was estimated against the logged",
        "operation on the held-out episodes by every estimator of the verdict",
        "([verdict.md](verdict.md)), the verdict decided among all of them, and the",
        "simulator gave the truth.",
        "",
        f"Settings: {config['trajectories']} trajectories per dataset (data seed "
        f"{config['data_seed']}), {config['holdout']:.0%} of the episodes held out; "
        f"candidates {', '.join(labels)} x {config['seeds']} seeds, "
        f"({', '.join(map(str, config['hidden']))}) networks, {config['updates']:,} updates "
        f"(CQL {config['cql_updates']:,}); plant model at most {config['model_updates']:,} "
        f"updates{_window_text(config)}; verdict with {config['starts']} starts at most, horizon "
        f"{config['horizon']}, FQE {config['fqe_updates']:,} updates x 2 seeds, "
        f"{config['bootstrap']} bootstrap draws; truth {config['episodes']} simulator "
        f"episodes per candidate, shield on. Wall time {results['seconds'] / 60:.1f} min"
        + (
            f" summed over {len(results['merged_from'])} runs (some side by side)"
            if results.get("merged_from")
            else ""
        )
        + " "
        f"on {results.get('cpu_count', '?')} cores shared with other work (load average "
        f"up to {results.get('load_average', float('nan')):.1f} at the end of a run).",
        "",
    ]
    for part in results.get("plant_parts", []):
        own = part["config"]
        lines += [
            f"Study plants ({', '.join(own['datasets'])}; [benchmarks/plants]"
            f"(../benchmarks/plants)), with their own settings: {own['plant_episodes']} "
            f"episodes of the operators' log (data seed {own['data_seed']}), "
            f"{own['holdout']:.0%} held out; candidates "
            f"{', '.join(label for label, _, _ in PLANT_CANDIDATES)} x {own['seeds']} seeds, "
            f"({', '.join(map(str, own['hidden']))}) networks, {own['updates']:,} updates; "
            f"plant model at most {own['model_updates']:,} updates{_window_text(own)}; "
            f"verdict with "
            f"{own['starts']} starts at most, horizon {own['horizon']}, FQE "
            f"{own['fqe_updates']:,} updates x 2 seeds, {own['bootstrap']} bootstrap draws; "
            f"truth {own['truth_episodes']} episodes per candidate and {own['replicates']} "
            f"disturbance replicates per verdict start, shield on. Wall time "
            f"{part['seconds'] / 60:.1f} min.",
            "",
        ]
    missing = [spec for spec in DATASETS if spec not in {row["dataset"] for row in rows}]
    if missing:
        lines += [
            f"Not in this result (not run): {', '.join(missing)}; the targets below are "
            f"over the {len(rows)} datasets that were.",
            "",
        ]
    lines += [
        "## Targets",
        "",
        "| estimator | mean regret@1 / spread (target <= 0.10) | worst regret@1 / spread "
        "(<= 0.25) | mean rank correlation (>= 0.7) |",
        "|---|---|---|---|",
    ]
    for name, own in total["estimators"].items():
        met = own["targets_met"]
        lines.append(
            f"| {name} | {own['mean_regret']:.2f} ({'met' if met['mean_regret'] else 'missed'})"
            f" | {own['worst_regret']:.2f} ({'met' if met['worst_regret'] else 'missed'}) | "
            f"{_number(own['mean_correlation'])} "
            f"({'met' if met['mean_correlation'] else 'missed'}) |"
        )
    lines += [
        "",
        f"A random choice's regret is {total['random_regret']:.2f} of the spread on average.",
        f"The verdict recommended a candidate on {total['recommended']} of {len(rows)} "
        "datasets and kept the current operation on the others; its recommendation was "
        f"worse than the operators or over a cost limit on **{total['bad_recommendations']}** "
        f"of {len(rows)} datasets (target 0: "
        f"{'met' if total['bad_target_met'] else 'missed'}).",
        *_power_sentence(total),
        "",
        "## Per dataset",
        "",
        "Regret@1 as a share of the true spread over the candidates, and Spearman's rank "
        "correlation with the true returns, per estimator (in brackets: over the candidates "
        "the estimator answers for, where it does not for all); the verdict's decision and, for a "
        "recommendation, its true return against the behaviour's.",
        "",
        "| dataset | model | fqe | model+fqe | decision | recommended: true return "
        "(behaviour) | truly better than the behaviour |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cells = []
        for name in ESTIMATORS:
            own = row["ranking"].get(name)
            cells.append(
                "-"
                if own is None
                else f"{own['regret_share']:.2f} / {_correlation_text(own, len(row['candidates']))}"
            )
        outcome = row["verdict"]
        if outcome["decision"] == "recommend":
            flags = [
                flag
                for flag, on in (
                    ("worse than the operators", outcome["worse_than_behaviour"]),
                    ("not truly better", outcome.get("not_truly_better", False)),
                    ("over a cost limit", outcome["over_cost_limit"]),
                )
                if on
            ]
            decided = f"{outcome['recommended']}: {outcome['true_return']:,.4g} " + (
                f"({row['behaviour']['true_return']:,.4g}"
                + (f"; {', '.join(flags)})" if flags else ")")
            )
        else:
            decided = f"- ({row['behaviour']['true_return']:,.4g})"
        lines.append(
            f"| {row['dataset']} | {' | '.join(cells)} | {outcome['decision']} | {decided} | "
            f"{row['truly_better_and_safe']} of {len(row['candidates'])} (within limits) |"
        )
    lines += _ceiling_lines(rows)
    lines += _kept_section(rows)
    lines += _plants_section(rows, total.get("plants"))
    lines += [
        "",
        "## Model fidelity",
        "",
        "Open-loop error of the plant model relative to each feature's spread (mean over the "
        "observed features) and the share of true values inside its 90 % interval: on the "
        "held-out episodes, and against the simulator under uniformly random actions (with "
        "the share of those states outside the data's range).",
        "",
        "| dataset | updates | held out: 1 step | 10 steps | H steps (coverage) | simulator: "
        "1 step | 10 steps | H steps (coverage) | outside the data |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cells = []
        for kind in ("heldout", "simulator"):
            fidelity = row["fidelity"][kind]
            if fidelity is None:  # a study plant: its simulator is the truth's alone
                cells += ["-", "-", "-"]
                continue
            steps = list(fidelity["steps"].values())
            last = steps[-1]
            cells += [
                _number(steps[0]["relative_rmse"]),
                _number(steps[1]["relative_rmse"]) if len(steps) > 2 else "-",
                f"{_number(last['relative_rmse'])} ({_number(last['coverage'])}), "
                f"H={fidelity['horizon']}",
            ]
        outside = (row["fidelity"]["simulator"] or {}).get("outside_data_share")
        lines.append(
            f"| {row['dataset']} | {row['fidelity']['model_updates']} | {' | '.join(cells)} | "
            f"{_number(outside)} |"
        )
    lines += _history_lines(rows)
    lines += [
        "",
        "## Candidates",
        "",
        "Per dataset and candidate: the true mean episode return (simulator), the estimates "
        "(discounted, from the held-out starts) and whether the verdict let it qualify.",
        "",
    ]
    for row in rows:
        lines += [
            f"### {row['dataset']}",
            "",
            f"Behaviour: true return {row['behaviour']['true_return']:,.4g}. {row['statement']}"
            f"{_every_tested_text(row)}",
            "",
            "| candidate | true return | true cost / limit | model | fqe | model+fqe | "
            "model improvement (95 % interval) | qualifies |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for c in row["candidates"]:
            estimates = c["estimates"]
            gain = estimates["model"]["improvement"]
            lines.append(
                f"| {c['name']} | {c['true_return']:,.4g} | "
                f"{_number(c['true_normalized_cost'])} | "
                + " | ".join(
                    f"{estimates[name]['value']:,.4g}" if name in estimates else "-"
                    for name in ESTIMATORS
                )
                + f" | {gain['value']:,.3g} ({_bound(gain['lower'], '.3g')} to "
                f"{_bound(gain['upper'], '.3g')}) | "
                f"{'yes' if c['qualifies'] else 'no'} |"
            )
        lines.append("")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.verdict_study", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS))
    parser.add_argument(
        "--algorithms",
        nargs="+",
        default=sorted({algorithm for _, algorithm, _ in CANDIDATES + PLANT_CANDIDATES}),
        help="which of the candidates' algorithms train",
    )
    parser.add_argument(
        "--plant-episodes", type=int, default=16, help="episodes of a study plant's log"
    )
    parser.add_argument(
        "--history",
        type=_history_option,
        default=1,
        help="rows per observation of a study plant's log (its schema's history); or "
        "'check:1,3,10': the product's history check (model history) chooses among them",
    )
    parser.add_argument(
        "--truth-episodes", type=int, default=100, help="a study plant's truth: episodes"
    )
    parser.add_argument(
        "--replicates",
        type=int,
        default=20,
        help="a study plant's truth at the verdict's starts: disturbance replicates per start",
    )
    parser.add_argument(
        "--plant-dir", default=None, help="where the study plants' logs are written (a temp dir)"
    )
    parser.add_argument("--trajectories", type=int, default=100)
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--updates", type=int, default=3_000)
    parser.add_argument("--cql-updates", type=int, default=1_000)
    parser.add_argument("--chunk", type=int, default=1_500)
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--holdout", type=float, default=0.2)
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--model-updates", type=int, default=1_500)
    parser.add_argument("--model-hidden", type=int, nargs="*", default=None)
    parser.add_argument(
        "--model-window", type=int, default=1, help="the plant model's training window steps"
    )
    parser.add_argument(
        "--replay-residuals",
        action="store_true",
        help="today's operation in the model: the clone with the operators' own deviations "
        "from it replayed along the logged steps (VerdictSettings.replay_residuals)",
    )
    parser.add_argument("--fidelity-episodes", type=int, default=16)
    parser.add_argument("--horizon", type=int, default=300, help="verdict model steps")
    parser.add_argument("--starts", type=int, default=50, help="verdict starts at most")
    parser.add_argument("--fqe-updates", type=int, default=1_000)
    parser.add_argument("--bootstrap", type=int, default=1_000)
    parser.add_argument("--episodes", type=int, default=10, help="simulator episodes")
    parser.add_argument("--eval-seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="a minutes-long smoke run")
    parser.add_argument("--doc", default="docs/verdict_study.md")
    parser.add_argument("--results-dir", default=str(DEFAULT_RESULTS_DIR))
    parser.add_argument("-d", "--description", default=DESCRIPTION)
    parser.add_argument("-t", "--tag", default="untagged")
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument(
        "--page-from",
        nargs="+",
        metavar="RESULT.json",
        help="rewrite the page of a saved result (further results: study plants run with "
        "their own settings, added beside it)",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="RESULT.json",
        help="one result and page from the datasets of several saved results (same settings)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.datasets = args.datasets[:1] if argv and "--datasets" in argv else ["CSTR-v0:medium"]
        args.trajectories, args.seeds, args.updates, args.cql_updates = 20, 2, 300, 100
        args.chunk, args.model_updates, args.model_hidden = 300, 300, [32]
        args.fidelity_episodes, args.horizon, args.starts = 4, 30, 20
        args.fqe_updates, args.bootstrap, args.episodes, args.hidden = 200, 200, 4, [16, 16]
        args.plant_episodes, args.truth_episodes, args.replicates = 8, 20, 4
    known = sorted({algorithm for _, algorithm, _ in CANDIDATES + PLANT_CANDIDATES})
    unknown = sorted(set(args.algorithms) - set(known))
    if unknown:
        parser.error(f"--algorithms: unknown {unknown}; the study's are {known}")
    require_positive(
        parser,
        args,
        (
            "trajectories",
            "seeds",
            "updates",
            "cql_updates",
            "chunk",
            "model_updates",
            "model_window",
            "fidelity_episodes",
            "horizon",
            "starts",
            "fqe_updates",
            "bootstrap",
            "episodes",
            "truth_episodes",
            "replicates",
        ),
    )
    from benchmarks.plants import PLANTS

    if args.plant_episodes < 4:
        parser.error(f"--plant-episodes: expected at least 4, got {args.plant_episodes}")
    for spec in args.datasets:
        if spec not in PLANTS and spec.count(":") != 1:
            parser.error(
                f"--datasets: {spec!r} is neither ENV:QUALITY (e.g. CSTR-v0:medium) nor a "
                f"study plant ({', '.join(PLANTS)})"
            )
    return args


CONFIG_KEYS = (
    "datasets",
    "algorithms",
    "trajectories",
    "data_seed",
    "seeds",
    "updates",
    "cql_updates",
    "chunk",
    "hidden",
    "holdout",
    "split_seed",
    "model_updates",
    "model_window",
    "replay_residuals",
    "model_hidden",
    "fidelity_episodes",
    "horizon",
    "starts",
    "fqe_updates",
    "bootstrap",
    "episodes",
    "eval_seed",
    "quick",
    "plant_episodes",
    "truth_episodes",
    "replicates",
)


def run_study(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    import os

    clock = time.perf_counter()
    rows = []
    from benchmarks.plants import PLANTS

    for spec in args.datasets:
        row = study_plant(spec, args) if spec in PLANTS else study_dataset(spec, args)
        progress(
            f"{spec}: {row['verdict']['decision']} ({row['seconds']:.0f} s); regret@1 "
            + ", ".join(f"{k} {v['regret_share']:.2f}" for k, v in row["ranking"].items())
        )
        rows.append(row)
    config = {key: getattr(args, key) for key in CONFIG_KEYS}
    config["candidates"] = [list(entry) for entry in CANDIDATES]
    config["plant_candidates"] = [list(entry) for entry in PLANT_CANDIDATES]
    results = {
        "datasets": rows,
        "summary": summary(rows),
        "seconds": time.perf_counter() - clock,
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg()[0],
    }
    return config, results


def merge(paths: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One study from the datasets of several saved results of the same settings (a
    study run one dataset at a time): their rows in order, the summary recomputed, the
    wall times summed.

    Raises:
        ValueError: for results of other settings (naming the first that differs).
    """
    saved = [BenchmarkResult.load(path) for path in paths]
    first = saved[0].config
    ignored = {"datasets"}
    for path, other in zip(paths, saved, strict=True):
        differs = sorted(
            key
            for key in set(first) | set(other.config)
            if key not in ignored and first.get(key) != other.config.get(key)
        )
        if differs:
            raise ValueError(f"{path}: other settings than {paths[0]} ({', '.join(differs)})")
    rows = [row for result in saved for row in result.results["datasets"]]
    config = {**first, "datasets": [row["dataset"] for row in rows]}
    results = {
        "datasets": rows,
        "summary": summary(rows),
        "seconds": float(sum(result.results["seconds"] for result in saved)),
        "cpu_count": saved[-1].results.get("cpu_count"),
        "load_average": max(result.results.get("load_average", 0.0) for result in saved),
        "merged_from": [str(path) for path in paths],
    }
    return config, results


def beside(paths: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The first saved result with the study plants' rows of the others (run with their
    own settings, which the page states apart); the summary over all rows.

    Raises:
        ValueError: for a further result with a row that is not a study plant's.
    """
    first = BenchmarkResult.load(paths[0])
    config, results = dict(first.config), dict(first.results)
    rows = list(results["datasets"])
    parts = []
    for path in paths[1:]:
        other = BenchmarkResult.load(path)
        own = other.results["datasets"]
        suite = [row["dataset"] for row in own if not row.get("plant")]
        if suite:
            raise ValueError(f"{path}: {suite} are not study plants; merge them with --merge")
        rows += own
        parts.append({"config": other.config, "seconds": other.results["seconds"]})
    results |= {"datasets": rows, "summary": summary(rows), "plant_parts": parts}
    return config, results


def run(quick: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """The study with its default settings, for ``python -m benchmarks.run verdict_study``."""
    return run_study(parse_args(["--quick"] if quick else []))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.page_from:
        config, results = beside(args.page_from)
        write_atomically(args.doc, page(config, results))
        print(f"Wrote {args.doc}")
        return 0
    started = utc_timestamp()
    if args.merge:
        config, results = merge(args.merge)
    else:
        config, results = run_study(args)
    path = None
    if not args.no_save:  # the result first: a long run is never lost to its page
        path = BenchmarkResult(
            name=NAME,
            description=args.description,
            tag=args.tag,
            timestamp=started,
            system=system_info(),
            config=config,
            results=results,
        ).save(args.results_dir)
    text = page(config, results)
    print(text)
    if path is not None:
        write_atomically(args.doc, text)
        print(f"Wrote {path} and {args.doc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
