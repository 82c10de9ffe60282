"""Trains and evaluates one d3rlpy 2.8 algorithm from a JSON job, in d3rlpy's environment.

Run by ``benchmarks/peer_parity.py`` from the repository root::

    .venv-d3rlpy/bin/python -m benchmarks.peers.d3rlpy_worker JOB.json

The job names the dataset (the project's native format), d3rlpy's config class with its
keyword arguments (already mapped from ours by ``peer_parity.d3rlpy_spec``), the encoder
fields that get ``VectorEncoderFactory(hidden_units)``, the observation statistics and the
reward scaling fitted by the main process, the seeds, the number of gradient updates,
the evaluation (environment, episodes, seed) and optionally PyTorch's thread count. For
every seed the worker trains a fresh agent with ``fit`` for exactly ``updates`` updates of
``batch_size`` transitions, then evaluates its greedy action (``predict``) with
:func:`benchmarks.peers.evaluation.evaluate_policy`. The result (per-seed episode returns,
training seconds, the digest of the evaluation episodes, d3rlpy's own serialized config)
is written atomically to the job's ``output``.

Progress goes to standard error as lines starting with ``peer:``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.peers.evaluation import evaluate_policy


def say(message: str) -> None:
    """A progress line the main process shows."""
    print(f"peer: {message}", file=sys.stderr, flush=True)


def d3rlpy_arrays(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The native dataset's arrays in d3rlpy's flat episode layout, with the same
    transitions.

    Ours stores every episode's final next-observation; d3rlpy's flat layout has one
    observation per row and takes the next observation from the following row. An episode
    that timed out therefore gets one extra row (its final observation, a zero action and
    reward, flagged as the timeout): d3rlpy never samples the last row of an episode that
    did not terminate, so its transitions are exactly ours, including the last. A
    terminated episode keeps its rows (d3rlpy bootstraps nothing after a terminal).

    Returns:
        ``observations``, ``actions``, ``rewards``, ``terminals`` and ``timeouts`` (float32
        flags), one row per d3rlpy step.
    """
    lengths = np.asarray(arrays["episode_lengths"], np.int64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    observations = np.asarray(arrays["observations"], np.float32)
    actions = np.asarray(arrays["actions"])
    rewards = np.asarray(arrays["rewards"], np.float32)
    terminals = np.asarray(arrays["terminals"], bool)
    columns: dict[str, list[np.ndarray]] = {
        "observations": [],
        "actions": [],
        "rewards": [],
        "terminals": [],
        "timeouts": [],
    }
    for episode, (start, end) in enumerate(zip(starts, ends, strict=True)):
        length = int(end - start)
        first_row = int(start) + episode  # each earlier episode stored one final observation
        terminated = bool(terminals[end - 1])
        rows = length if terminated else length + 1
        flags = np.zeros(rows, np.float32)
        flags[-1] = 1.0
        padding = rows - length
        columns["observations"].append(observations[first_row : first_row + rows])
        columns["actions"].append(
            np.concatenate(
                [actions[start:end], np.zeros((padding, *actions.shape[1:]), actions.dtype)]
            )
        )
        columns["rewards"].append(
            np.concatenate([rewards[start:end], np.zeros(padding, np.float32)])
        )
        columns["terminals"].append(flags if terminated else np.zeros(rows, np.float32))
        columns["timeouts"].append(np.zeros(rows, np.float32) if terminated else flags)
    return {name: np.concatenate(parts) for name, parts in columns.items()}


def observation_scaler(spec: Mapping[str, Any]) -> Any:
    """d3rlpy's ``StandardObservationScaler`` with the main process's statistics; ``eps``
    0, since the standard deviations already have ours' floor for constant features."""
    from d3rlpy.preprocessing import StandardObservationScaler

    return StandardObservationScaler(
        mean=np.asarray(spec["mean"], np.float32),
        std=np.asarray(spec["std"], np.float32),
        eps=float(spec["eps"]),
    )


def reward_scaler(spec: Mapping[str, Any] | None) -> Any:
    """d3rlpy's reward scaler of a spec from ``peer_parity.d3rlpy_reward_scaler``."""
    if spec is None:
        return None
    from d3rlpy.preprocessing import MultiplyRewardScaler, StandardRewardScaler

    kinds = {"multiply": MultiplyRewardScaler, "standard": StandardRewardScaler}
    if spec["type"] not in kinds:
        raise ValueError(f"reward_scaler: unknown type {spec['type']!r}; expected {list(kinds)}")
    return kinds[spec["type"]](**{k: v for k, v in spec.items() if k != "type"})


def build_algorithm(job: Mapping[str, Any]) -> Any:
    """A fresh d3rlpy algorithm of the job's spec (CPU)."""
    import d3rlpy
    from d3rlpy.models.encoders import VectorEncoderFactory

    spec = job["d3rlpy"]
    config_type = getattr(d3rlpy.algos, spec["config"])
    kwargs = dict(spec["kwargs"])
    for field in spec["encoder_fields"]:
        kwargs[field] = VectorEncoderFactory(hidden_units=list(spec["hidden_units"]))
    kwargs["observation_scaler"] = observation_scaler(job["observation_scaler"])
    kwargs["reward_scaler"] = reward_scaler(job["reward_scaler"])
    return config_type(**kwargs).create(device="cpu:0")


def run(job: Mapping[str, Any]) -> dict[str, Any]:
    """Trains and evaluates every seed of ``job``; returns the result."""
    import d3rlpy
    import torch
    from d3rlpy.constants import ActionSpace
    from d3rlpy.dataset import MDPDataset
    from d3rlpy.logging import NoopAdapterFactory

    from neorl_industrial.integration.datasets.arrays import dataset_arrays
    from neorl_industrial.integration.datasets.native import load_native

    if job.get("torch_threads"):
        torch.set_num_threads(int(job["torch_threads"]))
    ours, _ = load_native(job["dataset"])
    flat = d3rlpy_arrays(dataset_arrays(ours, frames=False))
    discrete = job["num_actions"] is not None
    dataset = MDPDataset(
        **flat,
        action_space=ActionSpace.DISCRETE if discrete else ActionSpace.CONTINUOUS,
        action_size=job["num_actions"] if discrete else flat["actions"].shape[1],
    )
    updates = int(job["updates"])
    evaluation = job["evaluation"]
    seeds: list[dict[str, Any]] = []
    digest = None
    serialized = None
    for seed in job["seeds"]:
        d3rlpy.seed(int(seed))
        algo = build_algorithm(job)
        started = time.perf_counter()
        algo.fit(
            dataset,
            n_steps=updates,
            n_steps_per_epoch=updates,
            logger_adapter=NoopAdapterFactory(),
            show_progress=False,
            save_interval=updates + 1,
        )
        train_s = time.perf_counter() - started
        if algo.grad_step != updates:
            raise RuntimeError(f"d3rlpy made {algo.grad_step} gradient updates, not {updates}")
        started = time.perf_counter()
        episodes = evaluate_policy(
            algo.predict,
            evaluation["env_id"],
            int(evaluation["episodes"]),
            int(evaluation["seed"]),
            horizon=evaluation.get("horizon"),
            action_bounds=evaluation.get("action_bounds"),
        )
        eval_s = time.perf_counter() - started
        digest = episodes.digest
        serialized = json.loads(algo.config.serialize())
        seeds.append(
            {
                "seed": int(seed),
                "train_s": train_s,
                "updates_per_s": updates / train_s,
                "eval_s": eval_s,
                "returns": episodes.returns.tolist(),
            }
        )
        say(
            f"{job['label']} seed {seed}: {updates} updates in {train_s:.1f} s "
            f"({updates / train_s:.0f}/s), mean return {episodes.returns.mean():.5g}"
        )
    return {
        "label": job["label"],
        "algorithm": job["algorithm"],
        "seeds": seeds,
        "episodes_digest": digest,
        "d3rlpy_config": serialized,
        "versions": {
            "d3rlpy": d3rlpy.__version__,
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
        },
        "n_transitions": int(dataset.transition_count),
    }


def write_json(path: Path, value: Any) -> None:
    """Writes ``value`` as JSON, atomically (a reader never sees half a file)."""
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    staging.write_text(json.dumps(value), encoding="utf-8")
    os.replace(staging, path)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m benchmarks.peers.d3rlpy_worker JOB.json", file=sys.stderr)
        return 2
    job = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    write_json(Path(job["output"]), run(job))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
