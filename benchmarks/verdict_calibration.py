"""Does the verdict's plant model reproduce today's operation, and do its improvement
intervals hold the truth? On the study plants (``benchmarks.plants``: simulators the
product was not written for, their logs written by their operators' controllers) and the
mixing tank's log.

Per plant: its log (16 episodes, seed 0) imported with its schema; a plant model fitted
with a held-out quarter; candidates near the data: a behaviour clone of the training
episodes with its actions shifted by fixed offsets (in the policy's [-1, 1]); one
verdict (model estimator) over them. Reported:

* the calibration check: the model's estimate of the operators' clone against their
  logged discounted return from the same starts (and the true operators' return from
  those starts, their controller run in the simulator);
* per candidate its model improvement interval against the true improvement over the
  operators from the verdict's own starts, horizon and discount (``truth.improvement``):
  coverage (the share of candidates whose interval holds the truth) and the rank
  correlation of the estimate with the truth;
* the recommendation, and whether it is truly better.

With ``--trained LABEL,...`` the candidates are instead the study's trained policies
(``benchmarks.verdict_study.PLANT_CANDIDATES`` by label, two seeds each, trained on the
training episodes as the study does), and every row carries the diagnosis of its
interval: the plain paired difference from the operators' clone (bootstrapped, before
pessimism and allowance), the members' spread of that difference, the candidate's and
the operators' pessimism (their uncertainty along their own rollouts), the calibration
allowance, and how often the candidate and the operators left the data's range.

    python -m benchmarks.verdict_calibration [--plants fired-heater,...] [--out DIR]
    python -m benchmarks.verdict_calibration --plants fired-heater --no-mixing-tank \
        --trained "BC-Safe,TD3BC-Lag,IQL-Lag b=1" --updates 1000 --bc-updates 500

Writes ``benchmarks/results/verdict_calibration-<stamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats

from benchmarks.harness import BenchmarkResult, system_info, utc_timestamp
from benchmarks.verdict_study import covers

OFFSETS = (-0.3, -0.15, -0.05, 0.0, 0.05, 0.15, 0.3)
DESCRIPTION = (
    "the verdict's calibration check and its improvement intervals against the study "
    "plants' truth, with the diagnosis of each interval"
)


def _clone(dataset, updates: int, seed: int = 0):
    """A behaviour clone of ``dataset`` (actions in [-1, 1]): ``(act, params)``."""
    from neorl_industrial.core.agents.bc import BCConfig, make_bc
    from neorl_industrial.functional.transformations.offline import Schedule, train_offline

    mean, std = dataset.observation_moments()
    config = BCConfig(
        hidden=(64, 64),
        obs_mean=tuple(float(x) for x in mean),
        obs_std=tuple(float(x) for x in std),
    )
    bc = make_bc(config, dataset.observation_size, dataset.action_size)
    state, _ = train_offline(
        bc,
        dataset,
        seeds=(seed,),
        schedule=Schedule(n_updates=updates, chunk_updates=1000, batch_size=256),
    )
    return bc.act, jax.tree.map(lambda leaf: leaf[0], state.agent.policy)


def _candidates(bc_act, bc_params, action_size: int):
    """The clone shifted by each offset: ``(act, stacked params, names)``."""
    offsets = jnp.asarray([[o] * action_size for o in OFFSETS], jnp.float32)
    params = {
        "bc": jax.tree.map(
            lambda leaf: jnp.broadcast_to(leaf, (len(OFFSETS), *leaf.shape)), bc_params
        ),
        "offset": offsets,
    }

    def act(params, observation, key=None, deterministic=True):
        del key, deterministic
        action = bc_act(params["bc"], observation, None, deterministic=True)
        return jnp.clip(action + params["offset"], -1.0, 1.0)

    return act, params, [f"clone{o:+.2f}" for o in OFFSETS]


def _fit(dataset, card, hidden, updates):
    from neorl_industrial.core.models import DynamicsConfig
    from neorl_industrial.wrappers.models import FitSettings, PlantModel

    task = card.task(dataset)
    model = PlantModel(
        task,
        DynamicsConfig(hidden=hidden),
        definitions=card.definitions,
        reward_row=getattr(card, "reward_row", None),
    )
    model.fit(
        dataset,
        FitSettings(holdout=0.25, max_updates=updates, chunk_updates=500, windows=32),
        dataset_name=card.name,
    )
    return task, model


def _split(dataset, model, task):
    from neorl_industrial.functional.state_management import ActionScaler

    scaler = ActionScaler.create(task.action_low, task.action_high, task.action_names)
    held_ids = np.asarray(model.card["dataset"]["holdout_episodes"])
    train_ids = np.asarray(model.card["dataset"]["train_episodes"])

    def unit(ids):
        part = dataset.select_episodes(ids)
        return part.replace(actions=scaler.scale(part.actions))

    return scaler, held_ids, unit(train_ids), unit(held_ids)


def _calibration(verdict) -> dict:
    c = verdict.calibration
    return {
        "status": c.status,
        "estimated": c.estimated.value,
        "estimated_interval": [c.estimated.lower, c.estimated.upper],
        "logged": c.logged.value,
        "error": [c.error.value, c.error.lower, c.error.upper],
        "tolerance": c.tolerance,
        "costs": list(c.costs),
    }


def study_plant(name: str, root: Path, args) -> dict:
    from benchmarks.plants import make_plant, write_plant
    from benchmarks.plants.truth import PlantTruth, verdict_starts
    from neorl_industrial.integration.datasets import load_any
    from neorl_industrial.wrappers.training.verdict import (
        PlantRules,
        VerdictCandidates,
        VerdictSettings,
        model_verdict,
    )

    folder = root / name
    csv = write_plant(name, folder, seed=args.seed, episodes=args.episodes)
    dataset, card = load_any(csv, schema=folder / "schema.yaml")
    started = time.perf_counter()
    task, model = _fit(dataset, card, tuple(args.hidden), args.updates)
    fit_seconds = time.perf_counter() - started
    scaler, held_ids, train, heldout = _split(dataset, model, task)
    plant = make_plant(name)
    truth = PlantTruth(plant, folder)
    limits = [task.cost_limits.get(c, np.inf) for c in task.cost_names]
    if args.trained:
        settings = VerdictSettings(
            fqe=False, bootstrap=1000, horizon=300, max_starts=50, bc_updates=args.bc_updates
        )
        raw = dataset.select_episodes(np.asarray(model.card["dataset"]["train_episodes"]))
        act, params, names, controllers, first = _trained(
            [label for label in args.trained.split(",") if label], task, folder, raw, args
        )
        # As the study judges them: the held-out part as the agents' contract sees it.
        heldout = first.training_data(dataset.select_episodes(held_ids))
        heldout = heldout.replace(actions=scaler.scale(heldout.actions))
        constraints = first.constraints
    else:
        settings = VerdictSettings(fqe=False, bootstrap=1000)
        bc_act, bc_params = _clone(train, args.bc_updates)
        act, params, names = _candidates(bc_act, bc_params, task.action_size)
        controllers, constraints = None, None
    started = time.perf_counter()
    verdict = model_verdict(
        VerdictCandidates(names, act, params),
        heldout,
        model,
        PlantRules(scaler, constraints, limits, task.cost_names),
        settings,
    )
    verdict_seconds = time.perf_counter() - started

    starts = verdict_starts(
        heldout, held_ids, max_starts=settings.max_starts, horizon=settings.horizon
    )
    operators = truth.at_starts(
        truth.operators(), starts, discount=settings.discount, replicates=args.replicates
    )
    operators_model = verdict.behaviour["estimates"][0]
    rows = []
    for p, candidate in enumerate(names):
        own = jax.tree.map(lambda leaf, p=p: leaf[p], params)
        policy = jax.jit(jax.vmap(lambda o, own=own: act(own, o)))

        def controller(observations, previous, policy=policy):
            del previous
            return np.asarray(scaler.unscale(policy(jnp.asarray(observations))))

        if controllers is not None:
            controller = truth.controller(controllers[p])
        true = truth.improvement(
            controller,
            starts,
            discount=settings.discount,
            replicates=args.replicates,
            baseline=operators,
        )
        # The report's form: a side no data bounds is None.
        entry = next(c for c in verdict.to_dict()["candidates"] if c["name"] == candidate)
        estimate = entry["estimates"][0]["improvement"]
        rows.append(
            {
                "name": candidate,
                "estimate": estimate,
                "true": true["improvement"],
                "inside": covers(estimate, true["improvement"]["value"]),
                "qualifies": entry["qualifies"],
                "outside_data_share": entry["estimates"][0]["outside_data_share"],
                "outside_physics_share": entry["estimates"][0]["outside_physics_share"],
                # What took the interval where it is (the diagnosis).
                "paired": entry["estimates"][0].get("paired"),
                "paired_inside": bool(
                    entry["estimates"][0]["paired"]["lower"]
                    <= true["improvement"]["value"]
                    <= entry["estimates"][0]["paired"]["upper"]
                ),
                "member_spread": entry["estimates"][0].get("member_spread"),
                "pessimism": entry["estimates"][0]["penalty"],
                "operators_pessimism": -operators_model["penalty"],
                "operators_outside_data_share": operators_model["outside_data_share"],
                "allowance": entry["estimates"][0].get("allowance"),
                "truly_better": bool(true["improvement"]["lower"] > 0),
            }
        )
    estimates = [r["estimate"]["value"] for r in rows]
    trues = [r["true"]["value"] for r in rows]
    recommended = next((r for r in rows if r["name"] == verdict.recommended), None)
    return {
        "plant": name,
        "episodes": args.episodes,
        "fit_seconds": fit_seconds,
        "verdict_seconds": verdict_seconds,
        "calibration": _calibration(verdict),
        "true_operators_at_starts": float(operators.mean()),
        "candidates": rows,
        "coverage": float(np.mean([r["inside"] for r in rows])),
        "rank_correlation": float(scipy.stats.spearmanr(estimates, trues).statistic),
        "decision": verdict.decision,
        "recommended": verdict.recommended,
        "recommended_truly_better": (
            None if recommended is None else bool(recommended["true"]["lower"] > 0)
        ),
        "statement": verdict.statement,
        "physics_note": verdict.evidence["physics"]["note"],
    }


def _trained(labels, task, folder, train, args):
    """The study's candidates (``PLANT_CANDIDATES`` by label, seeds 0 and 1) trained on
    the training episodes ``train`` (plant units): ``(act, stacked params, names,
    controllers, first agent)``, each controller ``(observations, previous) -> plant
    actions`` with its shield."""
    from benchmarks.verdict_study import PLANT_CANDIDATES, mixture_act, mixture_params
    from neorl_industrial.wrappers.agents import Agent

    known = {label: (algorithm, extra) for label, algorithm, extra in PLANT_CANDIDATES}
    unknown = [label for label in labels if label not in known]
    if unknown:
        raise SystemExit(f"--trained: unknown candidates {unknown}; known: {sorted(known)}")
    agents, names, controllers = [], [], []
    for label in labels:
        algorithm, extra = known[label]
        agent = Agent(
            algorithm, task=task, constraints=folder / "constraints.yaml", hidden=(64, 64), **extra
        )
        agent.fit(
            train,
            updates=args.updates,
            seeds=(0, 1),
            chunk=min(1000, args.updates),
            evaluate=False,
        )
        agents.append(agent)
        for run, seed in enumerate(agent.seeds):
            names.append(f"{label}, seed {seed}")
            controllers.append(
                lambda observations, previous, agent=agent, run=run: agent.predict(
                    observations, previous, run=run
                )
            )
    act = mixture_act([agent.policy_algorithm.act for agent in agents])
    params = mixture_params([agent.policies for agent in agents])
    return act, params, names, controllers, agents[0]


def study_mixing_tank(args) -> dict:
    """The mixing tank's log: the calibration check alone (no simulator behind it)."""
    from neorl_industrial.integration.datasets import load_any
    from neorl_industrial.wrappers.training.verdict import (
        PlantRules,
        VerdictCandidates,
        VerdictSettings,
        model_verdict,
    )

    root = Path(__file__).resolve().parents[1] / "examples" / "mixing-tank"
    dataset, card = load_any(root / "mixing_tank.csv", schema=root / "schema.yaml")
    task, model = _fit(dataset, card, tuple(args.hidden), args.updates)
    scaler, _, train, heldout = _split(dataset, model, task)
    bc_act, bc_params = _clone(train, args.bc_updates)
    act, params, names = _candidates(bc_act, bc_params, task.action_size)
    limits = [task.cost_limits.get(c, np.inf) for c in task.cost_names]
    verdict = model_verdict(
        VerdictCandidates(names, act, params),
        heldout,
        model,
        PlantRules(scaler, cost_limits=limits, cost_names=task.cost_names),
        VerdictSettings(fqe=False, bootstrap=1000),
    )
    return {
        "plant": "mixing-tank",
        "calibration": _calibration(verdict),
        "decision": verdict.decision,
        "statement": verdict.statement,
        "physics_note": verdict.evidence["physics"]["note"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plants", default="fired-heater,ph-neutraliser,gas-compressor")
    parser.add_argument("--mixing-tank", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--updates", type=int, default=3000)
    parser.add_argument("--bc-updates", type=int, default=2000)
    parser.add_argument(
        "--hidden", type=lambda s: [int(x) for x in s.split(",")], default=[128, 128]
    )
    parser.add_argument("--replicates", type=int, default=10)
    parser.add_argument(
        "--trained",
        default="",
        help="comma-separated study candidates (verdict_study's labels) instead of the "
        "clone offsets; --updates also sets their training updates",
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("-d", "--description", default=DESCRIPTION)
    parser.add_argument("-t", "--tag", default="untagged")
    args = parser.parse_args(argv)
    started = utc_timestamp()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in [p for p in args.plants.split(",") if p]:
            result = study_plant(name, Path(tmp), args)
            results.append(result)
            print(json.dumps({k: v for k, v in result.items() if k != "candidates"}, indent=1))
            for row in result["candidates"]:
                print(
                    f"  {row['name']:>11}: estimate {row['estimate']['value']:+9.2f} "
                    f"[{row['estimate']['lower']:+9.2f}, {row['estimate']['upper']:+9.2f}]  "
                    f"true {row['true']['value']:+9.2f}  inside {row['inside']}  "
                    f"paired [{row['paired']['lower']:+9.2f}, {row['paired']['upper']:+9.2f}] "
                    f"(inside {row['paired_inside']}), member spread "
                    f"{row['member_spread']:.3g}, pessimism {row['pessimism']:.3g} "
                    f"(operators {row['operators_pessimism']:.3g}), allowance "
                    f"{row['allowance']:.3g}, outside the data {row['outside_data_share']:.2f} "
                    f"(operators {row['operators_outside_data_share']:.2f})"
                )
    if args.mixing_tank:
        result = study_mixing_tank(args)
        results.append(result)
        print(json.dumps(result, indent=1))
    config = {key: value for key, value in vars(args).items() if key not in ("out",)}
    result = BenchmarkResult(
        name="verdict_calibration",
        description=args.description,
        tag=args.tag,
        timestamp=started,
        system=system_info(),
        config=config,
        results={"plants": results},
    )
    print(f"wrote {result.save(args.out)}")


if __name__ == "__main__":
    main()
