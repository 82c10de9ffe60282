"""What today's operation costs the verdict in time: the operators' clone trained and run
closed loop in the plant model, against the open-loop replay of their logged actions it
replaced, in the same run, on ``benchmarks.model_ope``'s setting (IB-v0 medium, 25
episodes, the model's default networks, 100 starts × 1000 steps, the task's shield, the
members' disagreement every 10 steps).

    python -m benchmarks.verdict_baseline_speed [--repeats 3]

Each contender is timed ``repeats`` times, alternating (compilation included, as the
verdict pays it on every call); wall and CPU seconds. Writes
``benchmarks/results/verdict_baseline_speed-<stamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fit-updates", type=int, default=500)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np

    from neorl_industrial.core.environments import Task
    from neorl_industrial.core.safety import resolve_safety
    from neorl_industrial.functional.transformations.model_evaluation import (
        make_logged_replay,
        make_policy_rollouts,
    )
    from neorl_industrial.integration.datasets import generate_dataset
    from neorl_industrial.wrappers.models import FitSettings, PlantModel
    from neorl_industrial.wrappers.training.verdict import VerdictSettings, evaluation_starts
    from neorl_industrial.wrappers.training.verdict_fqe import (
        _behaviour_clone,
        _operators_policy,
        clone_residuals,
    )

    dataset, card = generate_dataset("IB-v0", "medium", 25, seed=0)
    task = Task.from_env("IB-v0")
    model = PlantModel(task)
    model.fit(dataset, FitSettings(max_updates=args.fit_updates), dataset_name=card.name)
    params = model.params(0)
    holdout = np.asarray(model.card["dataset"]["holdout_episodes"])
    heldout = dataset.select_episodes(holdout)
    if model.scaler is not None:
        heldout = heldout.replace(actions=model.scaler.scale(heldout.actions))
    rows, _ = evaluation_starts(heldout, 100)
    starts = heldout.observations_at(heldout.observation_index[jnp.asarray(rows)])
    n = int(starts.shape[0])
    horizon = 1000
    lengths = jnp.full((n,), horizon, jnp.int32)
    constraints = resolve_safety(task).constraints
    options = {"horizon": horizon, "discount": 0.99, "close_after": 20, "disagreement_every": 10}
    key = jax.random.PRNGKey(0)
    settings = VerdictSettings()

    def replay() -> None:
        steps = np.minimum(
            np.asarray(rows)[:, None] + np.arange(horizon), heldout.n_transitions - 1
        )
        logged = jnp.asarray(heldout.actions)[jnp.asarray(steps)].reshape(n, horizon, -1)
        program = jax.jit(make_logged_replay(model.dynamics, **options))
        jax.block_until_ready(program(params, starts, logged, lengths, key))

    def clone() -> None:
        cloned = _behaviour_clone(heldout, settings)
        operators = _operators_policy(cloned, heldout.action_size, clone_residuals(cloned, heldout))
        program = jax.jit(
            make_policy_rollouts(
                model.dynamics,
                operators.act,
                constraints=constraints,
                scaler=model.scaler,
                stochastic_policy=True,
                **options,
            )
        )
        jax.block_until_ready(program(operators.params, params, starts, lengths, key))

    times: dict[str, list[tuple[float, float]]] = {"replay": [], "clone": []}
    for _ in range(args.repeats):
        for name, run in (("replay", replay), ("clone", clone)):
            wall, cpu = time.perf_counter(), time.process_time()
            run()
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    best = {name: min(t[0] for t in values) for name, values in times.items()}
    result = {
        "setting": "IB-v0 medium, 25 episodes, 100 starts x 1000 steps, shield, disagreement 10",
        "members": int(params.n_members),
        "starts": n,
        "seconds": {k: [list(t) for t in v] for k, v in times.items()},
        "best_wall_seconds": best,
        "clone_minus_replay_wall_seconds": best["clone"] - best["replay"],
        "load_average_1min": os.getloadavg()[0],
    }
    print(json.dumps(result, indent=1))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.out) / f"verdict_baseline_speed-{stamp}.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
