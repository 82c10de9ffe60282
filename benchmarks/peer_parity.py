"""Peer parity: our offline agents side by side with d3rlpy 2.8's on the same data.

For every algorithm d3rlpy also has - BC, TD3+BC, IQL, CQL (continuous, on ``--task``,
``IB-v0`` by default, or any task of the suite) and discrete BC, discrete CQL (on
``--discrete-task``, ``IB-discrete-v0``) - both libraries train on the SAME
generated dataset (``--trajectories`` episodes of each quality, deterministic given
``--data-seed``) with matched hyperparameters, network widths, preprocessing, batch size
and number of gradient updates, ``--seeds`` seeds each, and both are evaluated by the same
function (:func:`benchmarks.peers.evaluation.evaluate_policy`) on the same ``--episodes``
episodes of the same simulator.

* Ours: the registry's algorithm (``build_algorithm``), its defaults with the network
  widths and the dataset's observation statistics set, trained with every seed in one
  compiled program (``train_offline``: ``make_seeded_chunk`` over ``init_seeds``).
* d3rlpy: a child process in d3rlpy's own environment (``make peer-env``) runs
  ``benchmarks.peers.d3rlpy_worker`` on a JSON job: the dataset written once in the
  project's native format, d3rlpy's config mapped field by field from ours
  (:func:`d3rlpy_spec`), the same observation statistics and the same fitted reward scaling.
  Each seed is trained with ``fit`` for exactly the same number of updates.

Preprocessing, identical for both: a task whose actions are not in [-1, 1] (CSTR,
FourTank, ...) has the data's actions scaled to [-1, 1] by its actuator bounds (the task's
``ActionScaler``), and both libraries' policies are evaluated through the same bounds
back in the plant's units; observations standardized with the dataset's
per-feature mean and spread (our ``ObservationNormalizer``; d3rlpy's
``StandardObservationScaler`` given the same numbers); rewards scaled for training by the
algorithm's own ``RewardScaling`` (the registry's ``reward_scaling``), fitted once per
dataset and handed to d3rlpy as the equivalent scaler with the fitted numbers.

Everything d3rlpy cannot express of our configuration is listed per algorithm as a known
difference (in the result and on the page). Scores are D4RL-style normalized returns from
the dataset card, per seed the mean over its episodes; the table gives the mean over
seeds with a 95 % Student-t interval. The verdict of a row: our mean reaches d3rlpy's lower
95 % bound.

Usage (from the repository root; ``make peer-env`` first)::

    python -m benchmarks.peer_parity                       # the study, writes docs/peer_parity.md
    python -m benchmarks.peer_parity --quick --no-save     # a smoke run of a few minutes
    python -m benchmarks.peer_parity --algorithms td3bc --qualities medium --seeds 2
    python -m benchmarks.peer_parity --task CSTR-v0 --rows td3bc:medium iql:medium
    python -m benchmarks.peer_parity --rows cql:low --base RESULT.json  # one row again
    python -m benchmarks.peer_parity --page-from RESULT.json  # the page of a saved study

With ``--base`` a saved study is the starting point: its rows that are not run again are
carried over unchanged, and d3rlpy's side of a row that is run again is read back from it
when d3rlpy would run exactly the same job (its configuration, reward scaling, dataset and
evaluation), which saves the peer's hours when only our side changed (``--rerun-peer``
trains d3rlpy again anyway). The page says which rows were carried or reused.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from benchmarks.harness import (
    DEFAULT_RESULTS_DIR,
    BenchmarkResult,
    progress,
    publish_study,
    require_positive,
    utc_timestamp,
    write_atomically,
)
from benchmarks.learning import mean_confidence_interval, observation_normalizer

NAME = "peer_parity"
REPO_ROOT = Path(__file__).resolve().parent.parent
#: d3rlpy's environment, made by ``make peer-env``.
PEER_PYTHON = Path(".venv-d3rlpy") / "bin" / "python"
WORKER_MODULE = "benchmarks.peers.d3rlpy_worker"

#: Registry names of the algorithms both libraries have.
ALGORITHMS = ("bc", "td3bc", "iql", "cql", "discrete-bc", "discrete-cql")
LABELS = {
    "bc": "BC",
    "td3bc": "TD3+BC",
    "iql": "IQL",
    "cql": "CQL",
    "discrete-bc": "discrete BC",
    "discrete-cql": "discrete CQL",
}
QUALITIES = ("low", "medium", "high")
#: One dataset per algorithm, where the first side-by-side found each algorithm's gap:
#: TD3+BC on medium, IQL on high, CQL on low; BC and the discrete ones on medium.
HEADLINE_ROWS = (
    "bc:medium",
    "td3bc:medium",
    "iql:high",
    "cql:low",
    "discrete-bc:medium",
    "discrete-cql:medium",
)
#: The environment of the continuous and of the discrete algorithms (the same generator
#: and behaviour policies; the discrete one takes the nearest of its 27 actions).
CONTINUOUS_ENV = "IB-v0"
DISCRETE_ENV = "IB-discrete-v0"
EVALUATION_SEED = 7

DEFAULTS = {
    "qualities": list(QUALITIES),
    "trajectories": 100,
    "seeds": 5,
    "updates": 10_000,
    "chunk": 1_000,
    "episodes": 100,
}
QUICK = {
    "qualities": ["medium"],
    "trajectories": 10,
    "seeds": 2,
    "updates": 200,
    "chunk": 100,
    "episodes": 4,
}

#: What no algorithm can match between the two libraries.
COMMON_DIFFERENCES = (
    "Batches: d3rlpy draws them on the host with NumPy's generator, ours inside the "
    "compiled program with JAX's; both uniformly over the same transitions.",
)


def _discount() -> float:
    """The discount our one-step sampler bootstraps with (its default), which d3rlpy's
    ``gamma`` is set to."""
    from neorl_industrial.functional.state_management import sample

    return float(inspect.signature(sample).parameters["gamma"].default)


@dataclasses.dataclass(frozen=True)
class PeerSpec:
    """d3rlpy's configuration of one of our algorithms.

    Attributes:
        config: the class in ``d3rlpy.algos``.
        kwargs: its keyword arguments, plain values (scalers and encoders aside).
        encoder_fields: the config's encoder fields, each given
            ``VectorEncoderFactory(hidden_units)``.
        hidden_units: the hidden layer widths.
        differences: what d3rlpy cannot match of our configuration, in words.
    """

    config: str
    kwargs: dict[str, Any]
    encoder_fields: tuple[str, ...]
    hidden_units: tuple[int, ...]
    differences: tuple[str, ...]

    def to_job(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "kwargs": self.kwargs,
            "encoder_fields": list(self.encoder_fields),
            "hidden_units": list(self.hidden_units),
        }


#: d3rlpy's config class and encoder fields of each algorithm.
D3RLPY_CONFIGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "bc": ("BCConfig", ("encoder_factory",)),
    "td3bc": ("TD3PlusBCConfig", ("actor_encoder_factory", "critic_encoder_factory")),
    "iql": (
        "IQLConfig",
        ("actor_encoder_factory", "critic_encoder_factory", "value_encoder_factory"),
    ),
    "cql": ("CQLConfig", ("actor_encoder_factory", "critic_encoder_factory")),
    "discrete-bc": ("DiscreteBCConfig", ("encoder_factory",)),
    "discrete-cql": ("DiscreteCQLConfig", ("encoder_factory",)),
}

#: Our config fields that are d3rlpy's under another name, one to one.
RENAMED: dict[str, dict[str, str]] = {
    "bc": {"learning_rate": "learning_rate"},
    "td3bc": {
        "actor_lr": "actor_learning_rate",
        "critic_lr": "critic_learning_rate",
        "tau": "tau",
        "policy_noise": "target_smoothing_sigma",
        "noise_clip": "target_smoothing_clip",
        "policy_freq": "update_actor_interval",
        "alpha": "alpha",
    },
    "iql": {
        "actor_lr": "actor_learning_rate",
        "critic_lr": "critic_learning_rate",
        "tau": "tau",
        "expectile": "expectile",
        "beta": "weight_temp",
        "max_exp_advantage": "max_weight",
    },
    "cql": {
        "actor_lr": "actor_learning_rate",
        "critic_lr": "critic_learning_rate",
        "alpha_lr": "temp_learning_rate",
        "tau": "tau",
        "n_actions": "n_action_samples",
        "cql_alpha": "conservative_weight",
    },
    "discrete-bc": {"learning_rate": "learning_rate"},
    "discrete-cql": {"learning_rate": "learning_rate", "cql_alpha": "alpha"},
}

#: Our fields mapped by more than a rename (in :func:`d3rlpy_spec`), besides ``hidden``
#: (the encoders), ``obs_mean``/``obs_std`` (the observation scaler), ``critic`` (the
#: critic's kind) and ``weight_init`` (the initialization).
DERIVED: dict[str, frozenset[str]] = {
    "bc": frozenset(),
    "td3bc": frozenset(),
    "iql": frozenset({"value_lr"}),
    "cql": frozenset(
        {
            "lagrange",
            "target_action_gap",
            "alpha_prime_lr",
            "temperature",
            "bc_steps",
        }
    ),
    "discrete-bc": frozenset(),
    "discrete-cql": frozenset({"tau", "double_q", "td_loss"}),
}
SHARED_FIELDS = frozenset({"hidden", "obs_mean", "obs_std", "critic", "weight_init"})

#: d3rlpy's settings with no field of ours, fixed to what our agents do.
FIXED: dict[str, dict[str, Any]] = {
    "bc": {"policy_type": "deterministic"},
    "td3bc": {"n_critics": 2},
    "iql": {"n_critics": 2},
    "cql": {
        "n_critics": 2,
        "initial_temperature": 1.0,  # ours: log alpha starts at 0
        "initial_alpha": 1.0,  # ours: log alpha' starts at 0
        "soft_q_backup": False,  # ours: no entropy term in the target
        "max_q_backup": False,
    },
    # d3rlpy's beta penalizes squared logits; ours has no such term.
    "discrete-bc": {"beta": 0.0},
    "discrete-cql": {"n_critics": 1},
}

#: What d3rlpy cannot match of an algorithm whatever its hyperparameters.
ALGORITHM_DIFFERENCES: dict[str, tuple[str, ...]] = {
    "iql": (
        "Policy spread: d3rlpy's log-std is a state-independent parameter mapped by a "
        "sigmoid into [-5, 2] (it starts at -1.5); ours is one clipped to [-5, 2] (it "
        "starts at 0).",
        "Update order: d3rlpy steps Q and V on one summed loss with one optimizer (Q's "
        "target from V before the step) and weights the actor by the advantage under the "
        "updated V; ours steps V, then Q towards the updated V, and weights the actor by "
        "the advantage under V before its step.",
    ),
    "cql": (
        "Bellman target: d3rlpy bootstraps from the policy's mean action tanh(mu) at the "
        "next state (soft_q_backup off); ours from an action sampled from the policy, "
        "without the entropy term (CORL).",
        "Policy spread: d3rlpy's log-std is a linear head clipped to [-20, 2]; ours is "
        "bounded smoothly (tanh) to [-5, 2].",
        "Temperature loss: d3rlpy weights the entropy error by the temperature, ours by "
        "its logarithm (the gradients differ by the factor alpha).",
        "Update order: d3rlpy steps the critics first (the penalty weight alpha updated "
        "just before), then the actor and the temperature; ours steps the actor and "
        "temperature first and the critics against the updated actor.",
    ),
}


def initialization_differences(weight_init: str) -> list[str]:
    """What differs in the initialization for our ``weight_init`` (every agent's config
    has the field, ``networks.WeightInitConfig``)."""
    if weight_init == "uniform":
        return []
    return [
        "Initialization: d3rlpy's weights and biases start from PyTorch's default, uniform "
        f"in ±1/sqrt(fan_in); ours from weight_init {weight_init!r} (flax's LeCun normal, "
        "three times the variance, and zero biases)."
    ]


def d3rlpy_spec(name: str, config: Any, batch_size: int) -> PeerSpec:
    """d3rlpy 2.8's config of our algorithm ``name`` with hyperparameters ``config`` (its
    config dataclass), field by field.

    Raises:
        ValueError: for an algorithm d3rlpy does not have, or a field of ``config`` that
            this mapping does not know (it must be mapped or listed as a difference).
    """
    if name not in D3RLPY_CONFIGS:
        raise ValueError(
            f"algorithm: d3rlpy has no counterpart of {name!r}; expected one of {ALGORITHMS}"
        )
    fields = {field.name for field in dataclasses.fields(config)}
    unknown = sorted(fields - set(RENAMED[name]) - DERIVED[name] - SHARED_FIELDS)
    if unknown:
        raise ValueError(
            f"{name}: no d3rlpy mapping for config field(s) {', '.join(unknown)}; map them "
            "in benchmarks/peer_parity.py or list them as known differences"
        )
    kwargs: dict[str, Any] = {"batch_size": int(batch_size), "gamma": _discount()}
    kwargs |= {theirs: getattr(config, ours) for ours, theirs in RENAMED[name].items()}
    kwargs |= FIXED[name]
    differences = initialization_differences(getattr(config, "weight_init", "lecun"))
    critic = getattr(config, "critic", None)
    if critic is not None and critic.kind != "mean":
        differences.append(
            f"critic.kind {critic.kind!r} (risk {critic.risk!r}): d3rlpy's critics here are "
            "mean critics."
        )
    if name == "iql" and config.value_lr != config.critic_lr:
        differences.append(
            f"value_lr {config.value_lr:g}: d3rlpy trains the value with the critics' "
            f"optimizer, at critic_learning_rate {config.critic_lr:g}."
        )
    if name == "cql":
        if config.lagrange:
            # d3rlpy's penalty is alpha * weight * (gap - threshold), alpha tuned from 1.
            kwargs |= {
                "alpha_learning_rate": config.alpha_prime_lr,
                "alpha_threshold": config.target_action_gap,
            }
        else:
            # A learning rate of 0 holds alpha at 1: the penalty is weight * gap, ours.
            kwargs |= {"alpha_learning_rate": 0.0, "alpha_threshold": 0.0}
        if config.temperature != 1.0:
            differences.append(
                f"temperature {config.temperature:g}: d3rlpy's soft maximum over the "
                "sampled actions has temperature 1."
            )
        if config.bc_steps:
            differences.append(
                f"bc_steps {config.bc_steps}: d3rlpy has no behaviour-cloning warm start."
            )
    if name == "discrete-cql":
        kwargs["target_update_interval"] = max(1, round(1.0 / config.tau))
        differences.append(
            "Target network: d3rlpy copies the Q-network every target_update_interval "
            f"updates ({kwargs['target_update_interval']}, set to 1 / tau); ours moves it "
            f"by Polyak averaging (tau {config.tau:g})."
        )
        if config.td_loss != "huber":
            differences.append(
                f"td_loss {config.td_loss!r}: d3rlpy's is the Huber loss (0.5 d^2 within 1, "
                "linear beyond); ours the squared error d^2, which weighs twice as much "
                "against the penalty near zero and grows quadratically beyond."
            )
        if not config.double_q:
            differences.append(
                "double_q off: d3rlpy's DiscreteCQL always picks the next action with the "
                "online network (double DQN)."
            )
    differences += ALGORITHM_DIFFERENCES.get(name, ())
    config_type, encoder_fields = D3RLPY_CONFIGS[name]
    return PeerSpec(config_type, kwargs, encoder_fields, tuple(config.hidden), tuple(differences))


def d3rlpy_observation_scaler(normalizer: Any) -> dict[str, Any]:
    """d3rlpy's ``StandardObservationScaler`` arguments giving exactly our normalizer's
    ``(x - mean) / std`` (``eps`` 0: our spread already has its floor)."""
    return {
        "mean": np.asarray(normalizer.mean, np.float32).tolist(),
        "std": np.asarray(normalizer.std, np.float32).tolist(),
        "eps": 0.0,
    }


def d3rlpy_reward_scaler(scaling: Any) -> dict[str, Any] | None:
    """d3rlpy's reward scaler doing what our fitted ``RewardScaling`` does,
    ``r -> (r + shift) * scale``, with the same numbers (None: rewards as stored)."""
    if scaling.kind == "none":
        return None
    if scaling.shift == 0.0:
        # ``std`` and ``return_range``: d3rlpy's StandardRewardScaler would also shift and
        # its ReturnBasedRewardScaler refit the range; the fitted factor is the same map.
        return {"type": "multiply", "multiplier": float(scaling.scale)}
    return {
        "type": "standard",
        "mean": -float(scaling.shift),
        "std": 1.0 / float(scaling.scale),
        "eps": 0.0,
        "multiplier": 1.0,
    }


# --------------------------------------------------------------------------- peer process


class PeerWorkerError(RuntimeError):
    """The d3rlpy worker failed: names the job and holds the end of its output."""


def check_peer_python(python: Path) -> Path:
    """``python`` if it exists, else a FileNotFoundError saying how to make it."""
    if not python.exists():
        raise FileNotFoundError(
            f"d3rlpy's environment is missing: {python} does not exist; run `make peer-env` "
            "(a virtual environment with d3rlpy 2.8, torch 2.13 and this package)"
        )
    return python


def run_peer_job(job: dict[str, Any], work_dir: Path, python: Path) -> dict[str, Any]:
    """Runs the d3rlpy worker on ``job`` and returns its result.

    The job is written to ``work_dir/<label>.job.json``, the worker runs from the
    repository root, and its ``peer:`` lines are shown as progress.

    Raises:
        PeerWorkerError: when the worker exits with an error or writes no result, with the
            job's file and the last lines of its output.
    """
    label = job["label"]
    job_path = work_dir / f"{label}.job.json"
    output = work_dir / f"{label}.result.json"
    job = {**job, "output": str(output)}
    job_path.write_text(json.dumps(job), encoding="utf-8")
    command = [str(python), "-m", WORKER_MODULE, str(job_path)]
    environment = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    tail: collections.deque[str] = collections.deque(maxlen=40)
    with subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            tail.append(line.rstrip("\n"))
            if line.startswith("peer: "):
                progress(f"  d3rlpy {line[6:].rstrip()}")
        code = process.wait()
    if code != 0 or not output.is_file():
        what = f"exited with status {code}" if code != 0 else "wrote no result"
        raise PeerWorkerError(
            f"d3rlpy worker {what} on job {label} ({job_path}); the end of its output:\n"
            + "\n".join(tail)
        )
    return json.loads(output.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- ours


def train_ours(
    name: str, dataset: Any, num_actions: int | None, normalizer: Any, args: argparse.Namespace
) -> tuple[Any, Any, Any, dict[str, Any]]:
    """Our algorithm ``name`` trained with every seed at once on the scaled ``dataset``.

    Returns ``(algorithm, its config, policies with a leading seed axis, timing)``.
    """
    from neorl_industrial.core.agents.registry import build_algorithm
    from neorl_industrial.functional.transformations.offline import Schedule, train_offline

    hyperparameters = {
        **args.overrides,
        "hidden": list(args.hidden),
        "obs_mean": np.asarray(normalizer.mean, np.float32).tolist(),
        "obs_std": np.asarray(normalizer.std, np.float32).tolist(),
    }
    action_size = num_actions if num_actions is not None else dataset.action_size
    algorithm, config = build_algorithm(
        name, dataset.observation_size, action_size, hyperparameters
    )
    started = time.perf_counter()
    state, history = train_offline(
        algorithm,
        dataset,
        seeds=list(range(args.seeds)),
        schedule=Schedule(
            n_updates=args.updates, chunk_updates=args.chunk, batch_size=args.batch_size
        ),
    )
    train_s = time.perf_counter() - started
    # The first chunk compiles; the later ones give the running rate.
    steady = [entry["updates_per_s"] for entry in history[1:]]
    timing = {
        "train_s": train_s,
        "updates_per_s": args.seeds * args.updates / train_s,
        "steady_updates_per_s": float(np.mean(steady)) if steady else None,
        "first_chunk_s": history[0]["seconds"],
    }
    return algorithm, config, state.agent.policy, timing


def evaluate_ours(
    algorithm: Any, policies: Any, n_seeds: int, evaluation: Mapping[str, Any]
) -> tuple[list[np.ndarray], str, float]:
    """Every seed's deterministic policy through the shared evaluation.

    Returns ``(returns per seed, episodes digest, seconds)``."""
    import jax

    from benchmarks.peers.evaluation import evaluate_policy

    act = jax.jit(lambda params, obs: algorithm.act(params, obs, None, deterministic=True))
    started = time.perf_counter()
    returns, digest = [], ""
    for seed in range(n_seeds):
        params = jax.tree.map(lambda leaf, i=seed: leaf[i], policies)
        episodes = evaluate_policy(
            lambda obs, p=params: act(p, obs),
            evaluation["env_id"],
            evaluation["episodes"],
            evaluation["seed"],
            horizon=evaluation.get("horizon"),
            action_bounds=evaluation.get("action_bounds"),
        )
        returns.append(episodes.returns)
        digest = episodes.digest
    return returns, digest, time.perf_counter() - started


# --------------------------------------------------------------------------- statistics


def library_summary(card: Any, returns: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Scores and returns of one library: per seed the mean over its episodes, then the
    mean over seeds with its 95 % interval."""
    per_seed_returns = np.asarray([np.mean(r) for r in returns], np.float64)
    per_seed_scores = np.asarray(card.normalized_score(per_seed_returns), np.float64)
    return {
        "score": mean_confidence_interval(per_seed_scores),
        "return": mean_confidence_interval(per_seed_returns),
        "per_seed_scores": per_seed_scores.tolist(),
        "per_seed_returns": per_seed_returns.tolist(),
        "episode_returns": [np.asarray(r, np.float64).tolist() for r in returns],
    }


def verdict(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> dict[str, Any]:
    """Whether our mean score reaches the lower end of d3rlpy's 95 % interval (its mean
    when it has no interval, i.e. one seed)."""
    bound = theirs["mean"] - (theirs["ci"] or 0.0)
    return {
        "met": bool(ours["mean"] >= bound),
        "ours_mean": ours["mean"],
        "d3rlpy_lower_bound": bound,
    }


def train_ratio(ours_s: float | None, theirs_s: float | None) -> float | None:
    """d3rlpy's training seconds over ours (above 1: ours is faster)."""
    if not ours_s or theirs_s is None:
        return None
    return theirs_s / ours_s


# --------------------------------------------------------------------------- the study


def study_dataset(
    env_id: str,
    quality: str,
    names: Sequence[str],
    args: argparse.Namespace,
    work_dir: Path,
) -> dict[str, Any]:
    """One dataset: generated once, written once, every algorithm of ``names`` trained
    and evaluated by both libraries."""
    from neorl_industrial.core.agents.registry import algorithm_entry
    from neorl_industrial.core.environments import make
    from neorl_industrial.functional.state_management import RewardScaling
    from neorl_industrial.functional.transformations import action_scaler_for
    from neorl_industrial.integration.datasets import generate_dataset, save_native

    env, _ = make(env_id)
    scaler = None if env.discrete else action_scaler_for(env)
    num_actions = env.num_actions if env.discrete else None
    progress(f"dataset {env_id}-{quality}: {args.trajectories} trajectories")
    dataset, card = generate_dataset(env_id, quality, args.trajectories, seed=args.data_seed)
    evaluation: dict[str, Any] = {
        "env_id": env_id,
        "episodes": args.episodes,
        "seed": args.eval_seed,
    }
    if scaler is not None:
        # Both libraries learn in [-1, 1] (their tanh policies' range): the data's actions
        # are scaled by the task's actuator bounds, and both are evaluated through them.
        dataset = dataset.replace(actions=scaler.scale(dataset.actions))
        evaluation["action_bounds"] = [
            np.asarray(scaler.low, np.float64).tolist(),
            np.asarray(scaler.high, np.float64).tolist(),
        ]
    path = work_dir / f"{env_id}-{quality}"
    save_native(dataset, path, card)
    normalizer = observation_normalizer(dataset)
    behaviour_return = float(card.behaviour_policy.mean_return)
    entry: dict[str, Any] = {
        "env_id": env_id,
        "quality": quality,
        "data_seed": args.data_seed,
        "n_transitions": dataset.n_transitions,
        "action_scaling": scaler is not None,
        "behaviour_return": behaviour_return,
        "behaviour_score": float(card.normalized_score(behaviour_return)),
        "random_return": card.random_return,
        "expert_return": card.expert_return,
        "algorithms": {},
    }
    for name in names:
        label = f"{env_id}-{quality}-{name}"
        registry_entry = algorithm_entry(name)
        scaling = RewardScaling.fit(dataset, registry_entry.reward_scaling)
        progress(f"{label}: ours, {args.seeds} seeds x {args.updates} updates")
        algorithm, config, policies, ours_timing = train_ours(
            name, scaling.apply(dataset), num_actions, normalizer, args
        )
        ours_returns, ours_digest, ours_eval_s = evaluate_ours(
            algorithm, policies, args.seeds, evaluation
        )
        spec = d3rlpy_spec(name, config, args.batch_size)
        job = {
            "label": label,
            "algorithm": name,
            "dataset": str(path),
            "num_actions": num_actions,
            "d3rlpy": spec.to_job(),
            "observation_scaler": d3rlpy_observation_scaler(normalizer),
            "reward_scaler": d3rlpy_reward_scaler(scaling),
            "seeds": list(range(args.seeds)),
            "updates": args.updates,
            "evaluation": evaluation,
            "torch_threads": args.torch_threads,
        }
        hyperparameters = {"ours": _plain_config(config), "d3rlpy": _plain(spec.to_job())}
        theirs = reusable_peer(args, entry, name, hyperparameters["d3rlpy"], scaling.to_dict())
        if theirs is None:
            progress(f"{label}: d3rlpy, {args.seeds} seeds x {args.updates} updates")
            theirs = peer_summary(card, run_peer_job(job, work_dir, args.peer_python), args)
        else:
            progress(f"{label}: d3rlpy's seeds read back from {theirs['reused_from']}")
        if theirs.get("episodes_digest", ours_digest) != ours_digest:
            raise RuntimeError(
                f"{label}: d3rlpy's evaluation episodes differ from ours (digest "
                f"{theirs['episodes_digest']} against {ours_digest}); the two environments "
                "must run the same JAX and package versions"
            )
        theirs_train_s = theirs["train_s"]
        ours = library_summary(card, ours_returns)
        ours.update(ours_timing, eval_s=ours_eval_s)
        entry["algorithms"][name] = {
            "reward_scaling": scaling.to_dict(),
            "hyperparameters": hyperparameters,
            "differences": list(spec.differences),
            "ours": ours,
            "d3rlpy": theirs,
            "verdict": verdict(ours["score"], theirs["score"]),
            "train_ratio": train_ratio(ours["train_s"], theirs_train_s),
        }
        progress(
            f"{label}: ours {ours['score']['mean']:.1f} ({ours['train_s']:.0f} s), d3rlpy "
            f"{theirs['score']['mean']:.1f} ({theirs_train_s:.0f} s), behaviour "
            f"{entry['behaviour_score']:.1f}"
        )
    return entry


def _plain(values: Any) -> Any:
    """``values`` as it reads back from a result file (tuples as lists, ...)."""
    return json.loads(json.dumps(values))


def _plain_config(config: Any) -> dict[str, Any]:
    values = dataclasses.asdict(config)
    values.pop("obs_mean", None)
    values.pop("obs_std", None)
    return _plain(values)


def peer_summary(card: Any, peer: Mapping[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """d3rlpy's side of a row from its worker's result: scores, timing, versions."""
    theirs = library_summary(card, [seed["returns"] for seed in peer["seeds"]])
    train_s = float(sum(seed["train_s"] for seed in peer["seeds"]))
    theirs.update(
        train_s=train_s,
        updates_per_s=args.seeds * args.updates / train_s,
        per_seed_train_s=[seed["train_s"] for seed in peer["seeds"]],
        eval_s=float(sum(seed["eval_s"] for seed in peer["seeds"])),
        episodes_digest=peer["episodes_digest"],
        versions=peer["versions"],
        config=peer["d3rlpy_config"],
    )
    return theirs


#: Settings a ``--base`` study must share with this one (the rest may differ: rows,
#: algorithms, qualities, our chunk size, and the data seed of another dataset's rows).
BASE_SETTINGS = (
    "trajectories",
    "n_seeds",
    "n_updates",
    "batch_size",
    "hidden",
    "n_episodes",
    "evaluation_seed",
    "torch_threads",
)


def load_base(path: Path, args: argparse.Namespace) -> BenchmarkResult:
    """The saved study ``path`` that ``args`` continues.

    Raises:
        ValueError: when it is not a peer-parity result or its settings differ from
            ``args`` (naming the settings).
    """
    base = BenchmarkResult.load(path)
    if base.name != NAME:
        raise ValueError(f"--base {path}: not a peer-parity result (benchmark {base.name!r})")
    ours = settings_of(args)
    differing = [
        f"{key} {base.config.get(key)!r} (here {ours[key]!r})"
        for key in BASE_SETTINGS
        if _plain(base.config.get(key)) != _plain(ours[key])
    ]
    if differing:
        raise ValueError(f"--base {path}: settings differ: {'; '.join(differing)}")
    return base


def reusable_peer(
    args: argparse.Namespace,
    entry: Mapping[str, Any],
    name: str,
    job: Mapping[str, Any],
    reward_scaling: Mapping[str, Any],
) -> dict[str, Any] | None:
    """d3rlpy's side of row ``name`` of dataset ``entry`` read back from ``args.base``
    when d3rlpy ran exactly this job there (same configuration, reward scaling, dataset);
    ``None`` when it must run (no base, ``--rerun-peer``, no such row, any difference)."""
    base = getattr(args, "base_result", None)
    if base is None or args.rerun_peer:
        return None
    key = f"{entry['env_id']}-{entry['quality']}"
    base_entry = base.results["datasets"].get(key)
    if base_entry is None or name not in base_entry["algorithms"]:
        return None
    row = base_entry["algorithms"][name]
    same = (
        data_seed_of(base_entry, base.config) == data_seed_of(entry, vars(args))
        and row["hyperparameters"]["d3rlpy"] == job
        and row["reward_scaling"] == _plain(dict(reward_scaling))
        and base_entry["n_transitions"] == entry["n_transitions"]
        and base_entry["behaviour_return"] == entry["behaviour_return"]
    )
    if not same:
        return None
    return {"reused_from": args.base.name, **row["d3rlpy"]}


def data_seed_of(entry: Mapping[str, Any], config: Mapping[str, Any]) -> int:
    """The data seed of a dataset's rows (a study from before the seed was recorded per
    dataset generated all its datasets with its configuration's)."""
    return int(entry.get("data_seed", config["data_seed"]))


def with_base(
    config: dict[str, Any], results: dict[str, Any], base: BenchmarkResult, base_name: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """This study's rows and the ``base`` study's rows it did not run again (marked
    ``carried_from``), in the base's order, with the summary recomputed.

    Raises:
        ValueError: when a dataset of both studies was generated with another data seed
            (its rows would mix two datasets under one name).
    """
    datasets: dict[str, Any] = {}
    differences = dict(base.results["differences"])
    for key, base_entry in base.results["datasets"].items():
        entry = results["datasets"].get(key)
        base_entry = {**base_entry, "data_seed": data_seed_of(base_entry, base.config)}
        seed = None if entry is None else data_seed_of(entry, config)
        if seed is not None and seed != base_entry["data_seed"]:
            raise ValueError(
                f"--base {base_name}: {key} was generated with data seed "
                f"{base_entry['data_seed']} there and {seed} here; run it with "
                "the base's seed or without --base"
            )
        carried = {}
        for name, row in base_entry["algorithms"].items():
            if entry is not None and name in entry["algorithms"]:
                continue
            # Rows of a study from before the initialization was an algorithm's own
            # setting: it is named per algorithm now, from the configuration it ran.
            weight_init = row["hyperparameters"]["ours"].get("weight_init", "lecun")
            notes = [
                text
                for text in initialization_differences(weight_init)
                if text not in row["differences"]
            ] + list(row["differences"])
            carried[name] = {
                **row,
                "differences": notes,
                "carried_from": row.get("carried_from", base_name),
            }
            differences[name] = notes
        if entry is None:
            datasets[key] = {**base_entry, "algorithms": carried}
        else:
            datasets[key] = {**entry, "algorithms": {**carried, **entry["algorithms"]}}
    for key, entry in results["datasets"].items():
        datasets.setdefault(key, entry)
    rows = list(dict.fromkeys([*base.config["rows"], *config["rows"]]))
    merged_config = {
        **config,
        "rows": rows,
        "algorithms": [n for n in ALGORITHMS if any(r.split(":")[0] == n for r in rows)],
        "qualities": [q for q in QUALITIES if any(r.split(":")[1] == q for r in rows)],
        "env_ids": {**base.config["env_ids"], **config["env_ids"]},
        "base": base_name,
    }
    merged = {
        **results,
        "datasets": datasets,
        "differences": {**differences, **results["differences"]},
        "summary": summary(datasets),
    }
    return merged_config, merged


def run_study(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every dataset of ``args.qualities`` for the continuous and the discrete algorithms."""
    import jax

    from neorl_industrial.core.agents.registry import algorithm_entry

    plan: dict[str, dict[str, list[str]]] = {}  # env -> quality -> algorithms
    for name, quality in study_rows(args):
        env_id = args.discrete_task if algorithm_entry(name).discrete else args.task
        plan.setdefault(env_id, {}).setdefault(quality, []).append(name)
    config = {
        "algorithms": list(args.algorithms),
        "qualities": list(args.qualities),
        "rows": [f"{name}:{quality}" for name, quality in study_rows(args)],
        "env_ids": {
            name: env
            for env, by_quality in plan.items()
            for names in by_quality.values()
            for name in names
        },
        **settings_of(args),
        "chunk_updates": args.chunk,
        "overrides": dict(args.overrides),
        "quick": args.quick,
        "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "device": str(jax.devices()[0].device_kind),
    }
    datasets: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="peer-parity-") as work:
        for env_id, by_quality in plan.items():
            for quality in QUALITIES:
                if quality in by_quality:
                    datasets[f"{env_id}-{quality}"] = study_dataset(
                        env_id, quality, by_quality[quality], args, Path(work)
                    )
    differences = {
        name: next(
            entry["algorithms"][name]["differences"]
            for entry in datasets.values()
            if name in entry["algorithms"]
        )
        for name in args.algorithms
    }
    results = {
        "datasets": datasets,
        "differences": differences,
        "common_differences": list(COMMON_DIFFERENCES),
        "summary": summary(datasets),
    }
    return config, results


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """The settings that decide every row's numbers (what a ``--base`` must share)."""
    return {
        "trajectories": args.trajectories,
        "data_seed": args.data_seed,
        "n_seeds": args.seeds,
        "n_updates": args.updates,
        "batch_size": args.batch_size,
        "hidden": list(args.hidden),
        "n_episodes": args.episodes,
        "evaluation_seed": args.eval_seed,
        "torch_threads": args.torch_threads,
    }


def study_rows(args: argparse.Namespace) -> list[tuple[str, str]]:
    """``(algorithm, quality)`` of every row: ``--rows`` when given, else every algorithm
    on every quality."""
    if args.rows:
        return list(args.rows)
    return [(name, quality) for name in args.algorithms for quality in args.qualities]


def summary(datasets: Mapping[str, Any]) -> dict[str, Any]:
    """How many rows meet the verdict, and the rows that do not."""
    rows = [
        (key, name, algorithm["verdict"]["met"])
        for key, entry in datasets.items()
        for name, algorithm in entry["algorithms"].items()
    ]
    return {
        "rows": len(rows),
        "met": sum(met for _, _, met in rows),
        "not_met": [f"{key} {name}" for key, name, met in rows if not met],
    }


# --------------------------------------------------------------------------- the page


def _cell(stats: Mapping[str, Any]) -> str:
    if stats.get("ci") is None:
        return f"{stats['mean']:.1f}"
    return f"{stats['mean']:.1f} ± {stats['ci']:.1f}"


def _whole(value: float | None) -> str:
    """A number (seconds, a rate) to the unit, ``—`` when missing."""
    return "—" if value is None else f"{value:,.0f}"


def table_rows(config: Mapping[str, Any], results: Mapping[str, Any]) -> list[list[str]]:
    """One row per dataset and algorithm: dataset, algorithm, behaviour score, d3rlpy's
    and our score, the verdict, both libraries' training seconds and their ratio."""
    rows = []
    for key, entry in results["datasets"].items():
        for name in config["algorithms"]:
            algorithm = entry["algorithms"].get(name)
            if algorithm is None:
                continue
            ratio = algorithm["train_ratio"]
            rows.append(
                [
                    key,
                    LABELS[name],
                    f"{entry['behaviour_score']:.1f}",
                    _cell(algorithm["d3rlpy"]["score"]),
                    _cell(algorithm["ours"]["score"]),
                    "met" if algorithm["verdict"]["met"] else "**not met**",
                    _whole(algorithm["d3rlpy"]["train_s"]),
                    _whole(algorithm["ours"]["train_s"]),
                    "—" if ratio is None else f"{ratio:.1f}",
                ]
            )
    return rows


def rate_rows(config: Mapping[str, Any], results: Mapping[str, Any]) -> list[list[str]]:
    """One row per dataset and algorithm: both libraries' updates per second."""
    rows = []
    for key, entry in results["datasets"].items():
        for name in config["algorithms"]:
            algorithm = entry["algorithms"].get(name)
            if algorithm is None:
                continue
            rows.append(
                [
                    key,
                    LABELS[name],
                    _whole(algorithm["d3rlpy"].get("updates_per_s")),
                    _whole(algorithm["ours"].get("updates_per_s")),
                    _whole(algorithm["ours"].get("steady_updates_per_s")),
                ]
            )
    return rows


def whole_study(results: Mapping[str, Any]) -> list[str]:
    """A paragraph with the whole study's seconds, training and evaluation of every row,
    for each library (what a user waits for), and their ratio."""
    totals = {"ours": 0.0, "d3rlpy": 0.0}
    for entry in results["datasets"].values():
        for row in entry["algorithms"].values():
            for library in totals:
                side = row[library]
                if side.get("train_s") is None or side.get("eval_s") is None:
                    return []
                totals[library] += side["train_s"] + side["eval_s"]
    return [
        f"The whole study, training and evaluating every row's seeds: d3rlpy "
        f"{totals['d3rlpy']:,.0f} s, ours {totals['ours']:,.0f} s, "
        f"{totals['d3rlpy'] / totals['ours']:.1f}× less wall time for ours.",
        "",
    ]


def provenance(config: Mapping[str, Any], results: Mapping[str, Any]) -> list[str]:
    """Paragraphs naming the rows carried over from earlier studies and the rows whose
    d3rlpy side was read back from one (none for a study run whole)."""
    carried: dict[str, list[str]] = {}
    reused: dict[str, list[str]] = {}
    for key, entry in results["datasets"].items():
        for name, row in entry["algorithms"].items():
            label = f"{key} {LABELS[name]}"
            if "carried_from" in row:
                carried.setdefault(row["carried_from"], []).append(label)
            elif "reused_from" in row["d3rlpy"]:
                reused.setdefault(row["d3rlpy"]["reused_from"], []).append(label)
    lines = []
    for source, labels in carried.items():
        lines += [
            f"Carried over unchanged from `{source}` (both libraries as run there): "
            f"{', '.join(labels)}.",
            "",
        ]
    for source, labels in reused.items():
        lines += [
            f"Ours run again, d3rlpy's seeds read back from `{source}` (the same d3rlpy job: "
            f"configuration, reward scaling, dataset and evaluation): {', '.join(labels)}. "
            "Its training seconds are that run's.",
            "",
        ]
    return lines


def data_seeds(config: Mapping[str, Any], results: Mapping[str, Any]) -> str:
    """``data seed 0``, or the seed of most datasets and the others by name."""
    seeds = {key: data_seed_of(entry, config) for key, entry in results["datasets"].items()}
    common = max(set(seeds.values()), key=list(seeds.values()).count)
    others = [f"{key} {seed}" for key, seed in seeds.items() if seed != common]
    return f"data seed {common}" + (f"; {', '.join(others)}" if others else "")


def markdown(config: Mapping[str, Any], results: Mapping[str, Any]) -> str:
    """The page: settings, the table, the known differences."""
    hidden = ", ".join(str(width) for width in config["hidden"])
    counts = results["summary"]
    kinds = {
        name: algorithm["reward_scaling"]["kind"]
        for entry in results["datasets"].values()
        for name, algorithm in entry["algorithms"].items()
    }
    scalings = ", ".join(f"{LABELS[name]} `{kind}`" for name, kind in kinds.items())
    lines = [
        "# Peer parity: our agents beside d3rlpy 2.8",
        "",
        "Generated by `python -m benchmarks.peer_parity` (see `benchmarks/peer_parity.py`); "
        "do not edit by hand.",
        "",
        f"Both libraries train on the same generated datasets ({config['trajectories']} "
        f"trajectories each, {data_seeds(config, results)}) with matched hyperparameters, "
        f"({hidden}) networks, batch {config['batch_size']}, {config['n_updates']:,} gradient "
        f"updates and {config['n_seeds']} seeds, and are evaluated by the same function on "
        f"the same {config['n_episodes']} episodes (evaluation seed "
        f"{config['evaluation_seed']}; checked by a digest of the initial observations). "
        "Scores are normalized returns (100 · (R − random) / (expert − random) from the "
        "dataset card), per seed the mean over its episodes; cells give the mean over seeds "
        "± the half-width of a 95 % Student-t interval. The verdict: our mean reaches the "
        "lower end of d3rlpy's interval.",
        "",
        f"{counts['met']} of {counts['rows']} rows meet it"
        + (f"; not met: {', '.join(counts['not_met'])}." if counts["not_met"] else "."),
        "",
        *provenance(config, results),
        *(
            [
                "Our hyperparameters changed from the defaults for this study: "
                + ", ".join(f"`{k}={v}`" for k, v in config["overrides"].items())
                + ".",
                "",
            ]
            if config.get("overrides")
            else []
        ),
        "| dataset | algorithm | behaviour | d3rlpy | ours | ours ≥ d3rlpy's lower 95 % bound "
        "| d3rlpy train s | ours train s | d3rlpy / ours |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(config, results)]
    versions = next(
        (
            algorithm["d3rlpy"].get("versions")
            for entry in results["datasets"].values()
            for algorithm in entry["algorithms"].values()
        ),
        None,
    )
    cores = config.get("cpu_cores")
    lines += [
        "",
        "Training seconds: d3rlpy's `fit` summed over its seeds (one after the other); "
        "ours all seeds in one compiled program, compilation included."
        + (
            f" d3rlpy {versions['d3rlpy']}, torch {versions['torch']} with "
            f"{versions['torch_threads']} thread(s); device {config['device']}"
            + (f", {cores} CPU cores available." if cores else ".")
            if versions
            else ""
        ),
        "",
        *whole_study(results),
        "Gradient updates per second, over all seeds (ours also without its first chunk, "
        "which compiles):",
        "",
        "| dataset | algorithm | d3rlpy | ours | ours after compiling |",
        "|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rate_rows(config, results)]
    lines += [
        "",
        "Preprocessing, the same for both: observations standardized with the dataset's "
        "per-feature mean and spread (d3rlpy's `StandardObservationScaler` given our "
        "numbers, `eps` 0); rewards scaled for training by each algorithm's own "
        f"`RewardScaling` (the registry's `reward_scaling`: {scalings}), fitted once per "
        "dataset and given to d3rlpy as the scaler of the same map with the fitted numbers "
        "(`MultiplyRewardScaler` for a pure factor).",
        "",
        "## Known differences",
        "",
        "Every hyperparameter of ours is mapped to d3rlpy's (the result file holds both "
        "configurations, d3rlpy's as it serialized it). What d3rlpy cannot match:",
        "",
        "All algorithms:",
        "",
    ]
    lines += [f"- {text}" for text in results["common_differences"]]
    for name in config["algorithms"]:
        notes = results["differences"].get(name) or []
        lines += ["", f"{LABELS[name]}:", ""]
        lines += [f"- {text}" for text in notes] if notes else ["- none beyond the above."]
    lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.peer_parity", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    parser.add_argument(
        "--task",
        default=CONTINUOUS_ENV,
        help=f"the continuous algorithms' task, any of the suite's (default {CONTINUOUS_ENV}); "
        "actions outside [-1, 1] are scaled by the task's actuator bounds for both libraries",
    )
    parser.add_argument(
        "--discrete-task",
        default=DISCRETE_ENV,
        help=f"the discrete algorithms' task (default {DISCRETE_ENV})",
    )
    parser.add_argument(
        "--qualities", nargs="+", choices=QUALITIES, help="default: low medium high"
    )
    parser.add_argument(
        "--rows",
        nargs="+",
        metavar="ALGORITHM:QUALITY",
        help="only these rows, e.g. td3bc:medium iql:high (instead of --algorithms x "
        f"--qualities); the headline: {' '.join(HEADLINE_ROWS)}",
    )
    parser.add_argument("--trajectories", type=int, help="episodes per dataset (default 100)")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, help="agents per library and dataset (default 5)")
    parser.add_argument("--updates", type=int, help="gradient updates per agent (default 10000)")
    parser.add_argument("--chunk", type=int, help="our updates per compiled call (default 1000)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64], help="layer widths")
    parser.add_argument("--episodes", type=int, help="evaluation episodes per agent (default 100)")
    parser.add_argument("--eval-seed", type=int, default=EVALUATION_SEED)
    parser.add_argument(
        "--torch-threads",
        type=int,
        help="d3rlpy's PyTorch threads (default: PyTorch's own choice, every core)",
    )
    parser.add_argument(
        "--peer-python",
        type=Path,
        default=PEER_PYTHON,
        help="the interpreter of d3rlpy's environment (default .venv-d3rlpy/bin/python)",
    )
    parser.add_argument(
        "--base",
        type=Path,
        metavar="RESULT",
        help="a saved peer-parity result this study continues: its other rows are carried "
        "over, and d3rlpy's side of a row run again is read back when its job is the same",
    )
    parser.add_argument(
        "--rerun-peer",
        action="store_true",
        help="with --base: train d3rlpy again even where its job is the one saved",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="one of our hyperparameters for every row (a YAML value, e.g. "
        "weight_init=uniform); d3rlpy gets it where it maps",
    )
    parser.add_argument(
        "--page-from",
        type=Path,
        metavar="RESULT",
        help="write the page of a saved result and stop (nothing is trained)",
    )
    parser.add_argument("--doc", default="docs/peer_parity.md", help="markdown page to write")
    parser.add_argument("--results-dir", default=str(DEFAULT_RESULTS_DIR))
    parser.add_argument("-d", "--description", default="Peer parity against d3rlpy 2.8")
    parser.add_argument("-t", "--tag", default="untagged")
    parser.add_argument("--no-save", action="store_true", help="write neither JSON nor page")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: medium only, 10 trajectories, 2 seeds, 200 updates, 4 episodes",
    )
    args = parser.parse_args(argv)
    for field, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, field) is None:
            setattr(args, field, value)
    args.chunk = min(args.chunk, args.updates) if args.updates > 0 else args.chunk
    require_positive(
        parser, args, ("trajectories", "seeds", "updates", "chunk", "batch_size", "episodes")
    )
    if min(args.hidden) < 1:
        parser.error("--hidden: expected positive layer widths")
    if args.torch_threads is not None and args.torch_threads < 1:
        parser.error("--torch-threads: expected a positive integer")
    if args.updates % args.chunk:
        parser.error(
            f"--updates {args.updates}: expected a multiple of --chunk {args.chunk}, so that "
            "both libraries make exactly the same number of updates"
        )
    if args.rows:
        rows = []
        for text in args.rows:
            name, _, quality = text.partition(":")
            if name not in ALGORITHMS or quality not in QUALITIES:
                parser.error(
                    f"--rows {text!r}: expected ALGORITHM:QUALITY with an algorithm of "
                    f"{', '.join(ALGORITHMS)} and a quality of {', '.join(QUALITIES)}"
                )
            rows.append((name, quality))
        args.rows = list(dict.fromkeys(rows))
        args.algorithms = list(dict.fromkeys(name for name, _ in args.rows))
        args.qualities = [q for q in QUALITIES if any(q == row[1] for row in args.rows)]
    args.algorithms = list(dict.fromkeys(args.algorithms))
    args.qualities = list(dict.fromkeys(args.qualities))
    problem = task_problem(args.task, discrete=False) or task_problem(
        args.discrete_task, discrete=True
    )
    if problem:
        parser.error(problem)
    python = args.peer_python if args.peer_python.is_absolute() else REPO_ROOT / args.peer_python
    try:
        args.peer_python = check_peer_python(python)
    except FileNotFoundError as error:
        parser.error(str(error))
    overrides: dict[str, Any] = {}
    for text in args.overrides:
        field, sep, value = text.partition("=")
        if not sep or not field.strip() or field.strip() in {"hidden", "obs_mean", "obs_std"}:
            parser.error(
                f"--set {text!r}: expected FIELD=VALUE with a hyperparameter other than "
                "hidden (--hidden) and the observation statistics"
            )
        overrides[field.strip()] = yaml.safe_load(value)
    args.overrides = overrides
    args.base_result = None
    if args.base is not None:
        try:
            args.base_result = load_base(args.base, args)
        except (OSError, ValueError) as error:
            parser.error(str(error))
    elif args.rerun_peer:
        parser.error("--rerun-peer: only with --base")
    return args


def task_problem(env_id: str, *, discrete: bool) -> str | None:
    """What is wrong with ``env_id`` as the continuous (or discrete) algorithms' task, or
    None: it must be a registered environment with actions of that kind."""
    from neorl_industrial.core.environments import make, registered_envs

    flag = "--discrete-task" if discrete else "--task"
    if env_id not in registered_envs():
        return f"{flag}: unknown environment {env_id!r}; registered: {sorted(registered_envs())}"
    env, _ = make(env_id)
    if bool(env.discrete) != discrete:
        found, wanted = ("continuous", "discrete") if discrete else ("discrete", "continuous")
        return f"{flag}: {env_id} has {found} actions; expected a task with {wanted} ones"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.page_from is not None:
        saved = BenchmarkResult.load(args.page_from)
        if saved.name != NAME:
            print(f"error: {args.page_from}: not a peer-parity result", file=sys.stderr)
            return 2
        write_atomically(args.doc, markdown(saved.config, saved.results))
        print(f"Wrote {args.doc}", file=sys.stderr)
        return 0
    started = utc_timestamp()
    try:
        config, results = run_study(args)
    except PeerWorkerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.base_result is not None:
        config, results = with_base(config, results, args.base_result, args.base.name)
    page = markdown(config, results)
    publish_study(NAME, args, started, config, results, page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
