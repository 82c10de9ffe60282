"""A training run from a :class:`RunConfig`, end to end: data, agent, training with
evaluation and checkpoints, the saved agent, the exported policy and a report.

A run writes everything under ``<output>/<name>/``::

    config.yaml        the configuration, as run
    checkpoints/       orbax checkpoints (resume with ``resume=True``)
    agent/             the saved agent (``Agent.load``)
    policy/            the exported, self-contained policy (the server loads it)
    report.json        what happened: data, training speed, evaluations, best runs
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from neorl_industrial.wrappers.agents.agent import Agent, AgentError
from neorl_industrial.wrappers.training import Callback, RunConfig

__all__ = ["MAIN_JOB", "RunOutcome", "load_data", "main_job_config", "run_training"]

#: The main job (``neorl-industrial run``, ``make run``): TD3BC-Lag on a small generated
#: IB dataset, three seeds at once, evaluated with the shield; a few minutes on 2 cores.
MAIN_JOB: dict[str, Any] = {
    "name": "main",
    "env": {"id": "IB-v0"},
    "data": {"quality": "medium", "trajectories": 20, "seed": 0},
    "algorithm": {"name": "td3bc-lag", "hyperparameters": {"hidden": [64, 64]}},
    "training": {"updates": 3000, "chunk": 500, "batch_size": 256, "seeds": [0, 1, 2]},
    "evaluation": {"every": 1000, "episodes": 10},
    "checkpoints": {"every": 1000, "keep": 2},
    "output": "runs",
}


def main_job_config(overrides: list[str] | None = None) -> RunConfig:
    return RunConfig.from_dict(MAIN_JOB, source="main job").with_overrides(overrides or [])


@dataclasses.dataclass
class RunOutcome:
    """What a run produced and where."""

    config: RunConfig
    agent: Agent
    report: dict[str, Any]
    run_dir: Path
    agent_dir: Path
    policy_dir: Path | None


def load_data(config: RunConfig) -> tuple[Any, dict[str, Any]]:
    """The run's dataset (read or generated) and facts about it, including the
    normalized-score references when the dataset card has them."""
    from neorl_industrial.integration.datasets import generate_dataset, load_any

    data = config.data
    started = time.perf_counter()
    if data.path is not None:
        dataset, card = load_any(data.path, schema=data.schema_path)
        source = data.path
    else:
        dataset, card = generate_dataset(
            config.env.id, data.quality, data.trajectories, seed=data.seed
        )
        source = f"generated: {config.env.id} {data.quality}, {data.trajectories} episodes"
    facts: dict[str, Any] = {
        "source": source,
        "name": card.name,
        "transitions": dataset.n_transitions,
        "episodes": dataset.n_episodes,
        "seconds": time.perf_counter() - started,
        "mean_episode_return": float(np.asarray(dataset.episode_returns()).mean()),
        "mean_episode_cost": np.asarray(dataset.episode_costs()).mean(0).tolist(),
    }
    if card.random_return is not None and card.expert_return is not None:
        facts["references"] = {"random": card.random_return, "expert": card.expert_return}
    return dataset, facts


def run_training(
    config: RunConfig,
    *,
    resume: bool = False,
    callbacks: list[Callback] | None = None,
    export: bool = True,
) -> RunOutcome:
    """Runs ``config`` end to end and writes its outputs under ``config.run_dir``.

    Raises:
        AgentError: for an output directory of an earlier run (without ``resume``), data
            that does not fit, or bad settings; nothing of the earlier run is overwritten.
    """
    run_dir = config.run_dir
    agent_dir, policy_dir = run_dir / "agent", run_dir / "policy"
    if run_dir.exists() and any(run_dir.iterdir()) and not resume:
        raise AgentError(
            f"{run_dir}: holds an earlier run; pass resume to continue it, or another "
            "name (name=...) or output directory (nothing was overwritten)"
        )
    agent = Agent.from_config(config)
    started = time.perf_counter()
    dataset, data_facts = load_data(config)
    agent.check_dataset(dataset)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(config.to_yaml())
    training, evaluation, checkpoints = config.training, config.evaluation, config.checkpoints
    fit_started = time.perf_counter()
    result = agent.fit(
        dataset,
        updates=training.updates,
        seeds=training.seeds,
        batch_size=training.batch_size,
        chunk=training.chunk,
        eval_every=evaluation.every,
        eval_episodes=evaluation.episodes,
        eval_horizon=evaluation.horizon,
        eval_shield=evaluation.shield,
        eval_seed=evaluation.seed,
        patience=evaluation.patience,
        checkpoint_dir=run_dir / "checkpoints" if checkpoints.every else None,
        checkpoint_every=checkpoints.every,
        keep_checkpoints=checkpoints.keep,
        resume=resume,
        callbacks=callbacks or [],
        normalize_observations=training.normalize_observations,
        reward_scaling=training.reward_scaling,
    )
    fit_seconds = time.perf_counter() - fit_started
    agent.save(agent_dir, overwrite=resume)
    exported = None
    if export and not agent.entry.discrete:
        exported = agent.export(policy_dir, overwrite=resume)
    chunks = [entry for entry in result.history if entry["updates"] > (result.resumed_from or 0)]
    # The first chunk of a process includes compilation.
    steady = chunks[1:] or chunks
    report = {
        "name": config.name,
        "algorithm": agent.name,
        "env": config.env.id,
        "backend": jax.default_backend(),
        "data": data_facts,
        "training": {
            "updates": int(result.state.updates[0]),
            "seeds": list(training.seeds),
            "seconds": fit_seconds,
            "first_chunk_seconds": chunks[0]["seconds"] if chunks else None,
            "updates_per_s": float(np.mean([entry["updates_per_s"] for entry in steady]))
            if steady
            else None,
            "resumed_from": result.resumed_from,
            "stopped_early": result.stopped_early,
        },
        "evaluations": result.evaluations,
        "best": result.best,
        "summary": result.summary,
        "selected_run": agent.selected,
        "cost_limits": agent.cost_limits,
        "constraints": list(agent.constraints.names),
        "outputs": {
            "run": str(run_dir),
            "agent": str(agent_dir),
            "policy": None if exported is None else str(policy_dir),
            "checkpoints": str(run_dir / "checkpoints") if checkpoints.every else None,
        },
        "seconds": time.perf_counter() - started,
    }
    (run_dir / "report.json").write_text(json.dumps(report, indent=2, default=_jsonable))
    return RunOutcome(config, agent, report, run_dir, agent_dir, exported)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    return str(value)
