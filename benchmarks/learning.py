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

The run is saved like every benchmark (``benchmarks/results/learning-<tag>-<time>.json``),
the plots go to ``--images`` and the markdown page to ``--doc``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import (
    DEFAULT_RESULTS_DIR,
    BenchmarkResult,
    progress,
    safe_filename_part,
    save_study,
    utc_timestamp,
)

NAME = "learning"
ALGORITHMS = ("bc", "td3bc", "iql", "cql", "cql_alpha", "cql_bc", "cql_d3rlpy")
LABELS = {
    "bc": "BC",
    "td3bc": "TD3+BC",
    "iql": "IQL",
    "cql": "CQL",
    "cql_alpha": "CQL-α",
    "cql_bc": "CQL (BC warm start)",
    "cql_d3rlpy": "CQL (d3rlpy defaults)",
}
#: The registered algorithm whose defaults (reward scaling) a variant of the study shares.
REGISTRY_NAMES = {"cql_alpha": "cql", "cql_bc": "cql", "cql_d3rlpy": "cql"}
QUALITIES = ("low", "medium", "high")
#: Algorithms expected to reach the behaviour policy's return on these qualities.
IMPROVERS = ("td3bc", "iql", "cql", "cql_alpha", "cql_bc", "cql_d3rlpy")
MUST_MATCH_BEHAVIOUR = ("low", "medium")
#: Where the runs' checkpoints go (git-ignored), one directory per tag, task and algorithm.
DEFAULT_CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoints"
#: Key of the final evaluation; a curve point's key folds the updates done into it, so
#: every evaluation depends on the updates alone and a resumed run repeats it exactly.
EVAL_SEED = 7


def make_algorithm(
    name: str,
    obs_size: int,
    action_size: int,
    hidden: Sequence[int] = (256, 256),
    n_updates: int = 100_000,
) -> Any:
    """Algorithm ``name`` with its defaults (but ``hidden`` layer widths) and no
    observation statistics (the normalizer is set per dataset in the state).

    ``cql_bc`` is CQL with CORL's behaviour-cloning warm start over the first tenth of
    ``n_updates`` (CORL: 100 k of 1 M)."""
    from neorl_industrial.core.agents import (
        BCConfig,
        CQLConfig,
        IQLConfig,
        TD3BCConfig,
        make_bc,
        make_cql,
        make_iql,
        make_td3bc,
    )

    factories = {
        "bc": (make_bc, BCConfig),
        "td3bc": (make_td3bc, TD3BCConfig),
        "iql": (make_iql, IQLConfig),
        "cql": (make_cql, CQLConfig),
        "cql_alpha": (make_cql, lambda **kw: CQLConfig(lagrange=True, **kw)),
        "cql_bc": (make_cql, lambda **kw: CQLConfig(bc_steps=n_updates // 10, **kw)),
        # d3rlpy 2.8's CQL defaults: actor and temperature lr 1e-4, penalty weight 5 tuned
        # by a Lagrange multiplier (lr 1e-4, from 1) towards a gap of 10.
        "cql_d3rlpy": (
            make_cql,
            lambda **kw: CQLConfig(
                actor_lr=1e-4,
                alpha_lr=1e-4,
                cql_alpha=5.0,
                lagrange=True,
                target_action_gap=10.0,
                alpha_prime_lr=1e-4,
                **kw,
            ),
        ),
    }
    if name not in factories:
        raise ValueError(f"algorithm: unknown {name!r}; expected one of {sorted(factories)}")
    factory, config = factories[name]
    return factory(config(hidden=tuple(hidden)), obs_size, action_size)


def reward_scaling_kind(name: str, override: str | None = None) -> str:
    """The reward scaling algorithm ``name`` trains with: ``override`` when given, else
    the algorithm registry's for it (the CQL variants use CQL's)."""
    if override is not None:
        return override
    from neorl_industrial.core.agents.registry import algorithm_entry

    return algorithm_entry(REGISTRY_NAMES.get(name, name)).reward_scaling


def observation_normalizer(dataset: Any) -> Any:
    """The dataset's per-feature observation normalizer."""
    from neorl_industrial.core.agents import ObservationNormalizer

    observations = np.asarray(dataset.observations, np.float64)
    return ObservationNormalizer.create(observations.mean(0), observations.std(0))


def mean_confidence_interval(values: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """Mean of ``values`` with the half-width of a Student-t confidence interval."""
    from scipy import stats

    data = np.asarray(values, np.float64)
    mean = float(data.mean())
    if data.size < 2:
        return {"mean": mean, "ci": None, "n": int(data.size)}
    half = stats.t.ppf(0.5 + level / 2, data.size - 1) * data.std(ddof=1) / np.sqrt(data.size)
    return {"mean": mean, "ci": float(half), "n": int(data.size)}


# ----- training and evaluation programs ---------------------------------------------------
def init_states(algorithm: Any, normalizers: Any, n_seeds: int) -> Any:
    """Fresh runs of ``n_seeds`` seeds on each dataset: a ``TrainState`` with leading axes
    ``[dataset, seed]``, each dataset's observation normalizer in its policies.

    Seed ``i`` initializes the same networks on every dataset; the sampling keys are
    independent across datasets and seeds."""
    import jax

    # One compiled program instead of hundreds of dispatched operations (minutes on a
    # busy CPU); jax's cache keys on the module-level function and the static arguments.
    return jax.jit(_build_states, static_argnums=(0, 2))(algorithm, normalizers, n_seeds)


def _build_states(algorithm: Any, normalizers: Any, n_seeds: int) -> Any:
    import jax
    import jax.numpy as jnp

    from neorl_industrial.functional.state_management import TrainState
    from neorl_industrial.functional.transformations.offline import init_seeds

    n_datasets = int(normalizers.mean.shape[0])

    def init_for(normalizer: Any) -> Any:
        agents = init_seeds(algorithm, jnp.arange(n_seeds))
        repeated = jax.tree.map(
            lambda leaf: jnp.broadcast_to(leaf, (n_seeds, *leaf.shape)), normalizer
        )
        return agents.replace(policy=agents.policy.replace(normalizer=repeated))

    keys = jax.random.split(jax.random.PRNGKey(1), n_datasets * n_seeds)
    return TrainState(
        agent=jax.vmap(init_for)(normalizers),
        key=keys.reshape(n_datasets, n_seeds, -1),
        updates=jnp.zeros((n_datasets, n_seeds), jnp.int32),
    )


def compiled_chunk(algorithm: Any, batch_size: int, chunk_updates: int) -> Callable:
    """``chunk(states, datasets) -> (states, mean metrics)``: ``chunk_updates`` updates of
    every agent (leading axes ``[dataset, seed]``) in one compiled call, the states
    donated. Each chunk's randomness is split from the agents' own keys, so the result
    depends on the states alone."""
    import jax

    from neorl_industrial.functional.transformations.offline import make_train_chunk

    per_dataset = make_train_chunk(algorithm, batch_size, chunk_updates)
    return jax.jit(jax.vmap(per_dataset, in_axes=(0, 0)), donate_argnums=0)


def train_chunks(
    chunk: Callable, states: Any, datasets: Any, n_updates: int
) -> Iterator[tuple[Any, dict[str, Any]]]:
    """Runs ``chunk`` until the agents have done ``n_updates`` updates; after every chunk
    yields the states and the chunk's entry (updates done in total, seconds, CPU seconds
    of the process, mean metrics per agent). The states are donated to the next chunk:
    use them before."""
    import jax
    import jax.numpy as jnp

    # A fresh state may hold one buffer twice (a target network starts as its online
    # network) and a restored one is the caller's: every leaf gets its own copy before
    # the first donation.
    states = jax.tree.map(jnp.copy, states)
    done = int(np.asarray(states.updates).reshape(-1)[0])
    while done < n_updates:
        started, started_cpu = time.perf_counter(), time.process_time()
        states, metrics = chunk(states, datasets)
        metrics = jax.device_get(metrics)  # the chunk's one transfer
        seconds = time.perf_counter() - started
        done = int(np.asarray(states.updates).reshape(-1)[0])
        yield (
            states,
            {
                "updates": done,
                "seconds": seconds,
                # On a shared machine the wall time says little about the cost alone.
                "cpu_s": time.process_time() - started_cpu,
                "metrics": {name: np.asarray(value).tolist() for name, value in metrics.items()},
            },
        )


def train_all(
    algorithm: Any,
    datasets: Any,
    normalizers: Any,
    n_seeds: int,
    n_updates: int,
    chunk_updates: int,
    batch_size: int,
) -> tuple[Any, list[dict[str, Any]]]:
    """Trains ``n_seeds`` agents on each of the stacked ``datasets`` in one program,
    without checkpoints or evaluations (the safety study's training).

    Returns the final algorithm states (leading axes ``[dataset, seed]``) and, per chunk,
    the updates done, seconds and mean metrics.
    """
    chunk = compiled_chunk(algorithm, batch_size, chunk_updates)
    states = init_states(algorithm, normalizers, n_seeds)
    history = []
    for trained, entry in train_chunks(chunk, states, datasets, n_updates):
        states = trained
        history.append(entry)
        progress(f"  {entry['updates']:>7} updates, {entry['seconds']:.1f} s for the chunk")
    return states.agent, history


def evaluation_program(
    algorithm: Any, env: Any, env_params: Any, n_episodes: int
) -> Callable[[Any, Any], Any]:
    """``evaluate(policies, key) -> returns [dataset, seed, episode]``: every policy
    (leading axes ``[dataset, seed]``) over ``n_episodes`` whole episodes with its
    deterministic action, all at once in one compiled program."""
    import jax

    from neorl_industrial.core.environments import rollout

    horizon = int(env_params.horizon)

    def policy(policy_params: Any, observation: Any, key: Any) -> Any:
        return algorithm.act(policy_params, observation, key, deterministic=True)

    def one(policy_params: Any, key: Any) -> Any:
        result = rollout(
            key, env, env_params, policy, n_episodes, horizon, policy_params=policy_params
        )
        return result.episode_return_sum / result.episodes  # [n_episodes]

    def evaluate(policies: Any, key: Any) -> Any:
        leading = jax.tree.leaves(policies)[0].shape[:2]
        keys = jax.random.split(key, leading[0] * leading[1]).reshape(*leading, -1)
        return jax.vmap(jax.vmap(one))(policies, keys)

    return jax.jit(evaluate)


def evaluate_all(
    algorithm: Any, env: Any, env_params: Any, policies: Any, n_episodes: int, seed: int
) -> np.ndarray:
    """Mean episode return of every policy (leading axes ``[dataset, seed]``) over
    ``n_episodes`` whole episodes, its deterministic action, all policies at once."""
    import jax

    evaluate = evaluation_program(algorithm, env, env_params, n_episodes)
    return np.asarray(jax.device_get(evaluate(policies, jax.random.PRNGKey(seed))))


@functools.cache
def _study_algorithm(
    name: str, obs_size: int, action_size: int, hidden: tuple[int, ...], n_updates: int
) -> Any:
    # One algorithm object per setting, so that its compiled programs are reused within a
    # process (the jit caches key on the function).
    return make_algorithm(name, obs_size, action_size, hidden, n_updates)


@functools.cache
def _study_chunk(
    name: str,
    obs_size: int,
    action_size: int,
    hidden: tuple[int, ...],
    n_updates: int,
    batch_size: int,
    chunk_updates: int,
) -> Callable:
    algorithm = _study_algorithm(name, obs_size, action_size, hidden, n_updates)
    return compiled_chunk(algorithm, batch_size, chunk_updates)


@functools.cache
def _study_evaluation(
    name: str,
    env_id: str,
    obs_size: int,
    action_size: int,
    hidden: tuple[int, ...],
    n_updates: int,
    n_episodes: int,
) -> Callable:
    from neorl_industrial.core.environments import make
    from neorl_industrial.functional.state_management import with_action_scaling
    from neorl_industrial.functional.transformations import action_scaler_for

    env, env_params = make(env_id)
    algorithm = _study_algorithm(name, obs_size, action_size, hidden, n_updates)
    acting = with_action_scaling(algorithm, action_scaler_for(env))
    return evaluation_program(acting, env, env_params, n_episodes)


# ----- one task's data --------------------------------------------------------------------
@dataclasses.dataclass
class TaskData:
    """One task's generated datasets, ready for every algorithm.

    Attributes:
        env_id: the task.
        horizon: steps per episode.
        action_scaling: actions were scaled from plant units to [-1, 1].
        qualities: one per dataset, in order.
        datasets: actions in [-1, 1], rewards as generated (each algorithm scales them).
        cards: the datasets' cards (reference returns of the normalized score).
        normalizers: the datasets' observation normalizers, stacked.
        fingerprints: a digest of each dataset, so a checkpoint of other data is refused.
        data_s: seconds spent generating the data.
    """

    env_id: str
    horizon: int
    action_scaling: bool
    qualities: list[str]
    datasets: list[Any]
    cards: list[Any]
    normalizers: Any
    fingerprints: list[str]
    data_s: float

    @classmethod
    def of(
        cls,
        env_id: str,
        horizon: int,
        action_scaling: bool,
        qualities: Sequence[str],
        datasets: Sequence[Any],
        cards: Sequence[Any],
        data_s: float = 0.0,
    ) -> TaskData:
        """The task's data with the normalizers and fingerprints computed from it."""
        from neorl_industrial.wrappers.training.trainer import dataset_fingerprint

        return cls(
            env_id=env_id,
            horizon=horizon,
            action_scaling=action_scaling,
            qualities=list(qualities),
            datasets=list(datasets),
            cards=list(cards),
            normalizers=stacked([observation_normalizer(d) for d in datasets]),
            fingerprints=[dataset_fingerprint(d) for d in datasets],
            data_s=data_s,
        )

    @property
    def obs_size(self) -> int:
        return int(self.datasets[0].observation_size)

    @property
    def action_size(self) -> int:
        return int(self.datasets[0].action_size)


def prepare_task(
    env_id: str,
    qualities: Sequence[str],
    trajectories: int,
    data_seed: int,
    note: Callable[[str], None] = progress,
) -> TaskData:
    """Generates the datasets of ``env_id`` (one per quality), actions scaled to [-1, 1]."""
    from neorl_industrial.core.environments import make
    from neorl_industrial.functional.transformations import action_scaler_for
    from neorl_industrial.integration.datasets import generate_dataset

    started = time.perf_counter()
    env, env_params = make(env_id)
    scaler = action_scaler_for(env)
    datasets, cards = [], []
    for quality in qualities:
        note(f"dataset {env_id}-{quality}: {trajectories} trajectories")
        dataset, card = generate_dataset(env_id, quality, trajectories, seed=data_seed)
        if scaler is not None:
            dataset = dataset.replace(actions=scaler.scale(dataset.actions))
        datasets.append(dataset)
        cards.append(card)
    return TaskData.of(
        env_id,
        int(env_params.horizon),
        scaler is not None,
        qualities,
        datasets,
        cards,
        data_s=time.perf_counter() - started,
    )


def scaled_datasets(task: TaskData, kind: str) -> tuple[Any, list[Any]]:
    """The task's datasets with rewards scaled by ``kind``, fitted on each dataset, stacked
    on a leading axis, and the scalings (one per dataset)."""
    from neorl_industrial.functional.state_management import RewardScaling

    scalings = [RewardScaling.fit(dataset, kind) for dataset in task.datasets]
    scaled = [scaling.apply(d) for scaling, d in zip(scalings, task.datasets, strict=True)]
    return stacked(scaled), scalings


def stacked(trees: Sequence[Any]) -> Any:
    """PyTrees of equal structure and shapes stacked leaf by leaf on a new leading axis."""
    import jax
    import jax.numpy as jnp

    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


# ----- one run: an algorithm on a task's datasets, checkpointed ---------------------------
@dataclasses.dataclass(frozen=True)
class RunSettings:
    """Everything that decides what a (task, algorithm) run computes: a checkpoint is
    resumed only under the same settings. Fields are named as the command line's flags.

    Attributes:
        task: the environment id.
        algorithm: one of :data:`ALGORITHMS`.
        updates: updates per agent.
        seeds: agents per dataset.
        hidden: hidden layer widths.
        data_seed: the data generation's seed.
        trajectories: episodes per dataset.
        qualities: the datasets.
        batch_size: transitions per update.
        chunk: updates per compiled call (the chunks split the agents' keys).
        eval_every: updates between curve points (0: the final evaluation only).
        curve_episodes: evaluation episodes per agent of a curve point.
        episodes: evaluation episodes per agent of the final evaluation.
        reward_scaling: the reward scaling kind it trains with.
    """

    task: str
    algorithm: str
    updates: int
    seeds: int
    hidden: tuple[int, ...]
    data_seed: int
    trajectories: int
    qualities: tuple[str, ...]
    batch_size: int
    chunk: int
    eval_every: int
    curve_episodes: int
    episodes: int
    reward_scaling: str

    @classmethod
    def of(cls, args: argparse.Namespace, env_id: str, name: str) -> RunSettings:
        """The settings of algorithm ``name`` on ``env_id`` under the command line ``args``."""
        return cls(
            task=env_id,
            algorithm=name,
            updates=args.updates,
            seeds=args.seeds,
            hidden=tuple(args.hidden),
            data_seed=args.data_seed,
            trajectories=args.trajectories,
            qualities=tuple(args.qualities),
            batch_size=args.batch_size,
            chunk=args.chunk,
            eval_every=args.eval_every,
            curve_episodes=args.curve_episodes,
            episodes=args.episodes,
            reward_scaling=reward_scaling_kind(name, args.reward_scaling),
        )

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON data (tuples as lists), as stored in a checkpoint."""
        return {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in dataclasses.asdict(self).items()
        }


def settings_difference(saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """The settings that differ between a checkpoint's and this run's, each with both
    values (``--updates 400 here, 200 in the checkpoint``); None when they agree."""
    keys = list(current) + [key for key in saved if key not in current]
    differing = []
    for key in keys:
        if saved.get(key) == current.get(key):
            continue
        flag = key if key in ("task", "algorithm", "datasets") else f"--{key.replace('_', '-')}"
        differing.append(f"{flag} {current.get(key)} here, {saved.get(key)} in the checkpoint")
    return "; ".join(differing) or None


def checkpoint_directory(root: str | Path, tag: str, env_id: str, name: str) -> Path:
    """``<root>/<tag>/<task>/<algorithm>``."""
    return Path(root) / safe_filename_part(tag, "untagged") / env_id / name


class RunCheckpoints:
    """A run's orbax checkpoints (one per saved chunk, the newest two kept): the agents'
    ``TrainState`` and the host's JSON record. Orbax writes each into a temporary sibling
    and renames it into place, so a checkpoint exists only once it is complete."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory).absolute()
        self._manager: Any = None

    def _checkpoints(self) -> Any:
        if self._manager is None:
            import orbax.checkpoint as ocp

            options = ocp.CheckpointManagerOptions(
                max_to_keep=2, create=True, enable_async_checkpointing=False
            )
            self._manager = ocp.CheckpointManager(self.directory, options=options)
        return self._manager

    def latest(self) -> int | None:
        """Updates of the newest complete checkpoint, or None (none, or no directory)."""
        if not self.directory.is_dir():
            return None
        return self._checkpoints().latest_step()

    def record(self) -> dict[str, Any]:
        """The newest checkpoint's record (settings, updates, history, curve, timing)."""
        import orbax.checkpoint as ocp

        manager = self._checkpoints()
        args = ocp.args.Composite(record=ocp.args.JsonRestore())
        return manager.restore(manager.latest_step(), args=args)["record"]

    def restore(self, template: Any) -> Any:
        """The newest checkpoint's ``TrainState``, shaped like ``template``."""
        import orbax.checkpoint as ocp

        manager = self._checkpoints()
        args = ocp.args.Composite(state=ocp.args.StandardRestore(template))
        return manager.restore(manager.latest_step(), args=args)["state"]

    def save(self, updates: int, states: Any, record: dict[str, Any]) -> None:
        """Writes the checkpoint of ``updates`` updates, complete or not at all."""
        import orbax.checkpoint as ocp

        from neorl_industrial.wrappers.hostio import to_json_data

        manager = self._checkpoints()
        manager.save(
            updates,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(states),
                record=ocp.args.JsonSave(to_json_data(record)),
            ),
        )
        manager.wait_until_finished()


@dataclasses.dataclass
class RunOutcome:
    """What a run produced.

    Attributes:
        record: settings, updates done, per-chunk history, curve points (per dataset and
            seed the normalized score), ``final_returns`` (per dataset and seed the mean
            return of the final evaluation), the reward scaling per dataset, seconds of
            training and evaluation and the sessions they took (over resumes).
        states: the agents' final ``TrainState``; None for a run finished in an earlier
            session and read back from its checkpoint.
    """

    record: dict[str, Any]
    states: Any | None


def run_algorithm(
    task: TaskData,
    settings: RunSettings,
    checkpoint_dir: str | Path | None = None,
    *,
    resume: bool = False,
    checkpoint_every: int = 0,
    reporter: StudyProgress | None = None,
) -> RunOutcome:
    """Trains ``settings.seeds`` agents of ``settings.algorithm`` on every dataset of
    ``task`` in one program, with the curve points and the final evaluation.

    Args:
        task: the datasets.
        settings: the run (its ``qualities`` must be the task's).
        checkpoint_dir: where its checkpoints go; None: none.
        resume: continue from the checkpoint in ``checkpoint_dir`` (a finished run is
            read back, not run again).
        checkpoint_every: updates between checkpoints, a multiple of ``settings.chunk``
            (0: after every chunk); the last one is always written.
        reporter: told about the progress (plain lines when None).

    Raises:
        FileExistsError: when ``checkpoint_dir`` holds a checkpoint and ``resume`` is
            false (nothing is overwritten).
        CheckpointMismatchError: when the checkpoint was written with other settings or
            data, naming the settings.
    """
    import jax

    from neorl_industrial.wrappers.training.trainer import CheckpointMismatchError

    if list(settings.qualities) != task.qualities:
        raise ValueError(
            f"settings.qualities: {list(settings.qualities)} for a task of {task.qualities}"
        )
    reporter = reporter if reporter is not None else StudyProgress(rich=False)
    datasets, scalings = scaled_datasets(task, settings.reward_scaling)
    fingerprint = {**settings.to_dict(), "datasets": task.fingerprints}
    record: dict[str, Any] = {
        "settings": fingerprint,
        "updates": 0,
        "train_s": 0.0,
        "eval_s": 0.0,
        "sessions": 0,
        "reward_scaling": [scaling.to_dict() for scaling in scalings],
        "history": [],
        "curve": [],
        "final_returns": None,
    }
    checkpoints = RunCheckpoints(checkpoint_dir) if checkpoint_dir is not None else None
    latest = checkpoints.latest() if checkpoints is not None else None
    if checkpoints is not None and latest is not None:
        if not resume:
            raise FileExistsError(
                f"{checkpoints.directory}: holds a checkpoint at {latest} of "
                f"{settings.updates} updates of an earlier run; pass --resume to continue "
                "it, or delete the directory (or choose another --tag) to start afresh"
            )
        saved = checkpoints.record()
        difference = settings_difference(saved.get("settings", {}), fingerprint)
        if difference:
            raise CheckpointMismatchError(
                f"{checkpoints.directory}: the checkpoint at {latest} updates was written "
                f"with other settings ({difference}); resume with its settings, or start "
                "afresh with another --tag"
            )
        record = saved
    label = f"{settings.task} {LABELS[settings.algorithm]}"
    if record["final_returns"] is not None:
        reporter.run_skipped(label, settings.updates)
        return RunOutcome(record=record, states=None)

    key = (task.obs_size, task.action_size, settings.hidden, settings.updates)
    chunk = _study_chunk(settings.algorithm, *key, settings.batch_size, settings.chunk)
    algorithm = _study_algorithm(settings.algorithm, *key)
    states = init_states(algorithm, task.normalizers, settings.seeds)
    if checkpoints is not None and latest is not None:
        states = checkpoints.restore(states)
    record["sessions"] += 1
    reporter.run_begin(label, record["updates"], settings.updates)
    for trained, entry in train_chunks(chunk, states, datasets, settings.updates):
        states = trained
        done = entry["updates"]
        record["history"].append(entry)
        record["updates"] = done
        record["train_s"] += entry["seconds"]
        final = done >= settings.updates
        if final or (settings.eval_every and done % settings.eval_every == 0):
            episodes = settings.episodes if final else settings.curve_episodes
            evaluate = _study_evaluation(settings.algorithm, settings.task, *key, episodes)
            eval_key = jax.random.PRNGKey(EVAL_SEED)
            if not final:
                eval_key = jax.random.fold_in(eval_key, done)
            started = time.perf_counter()
            returns = np.asarray(jax.device_get(evaluate(states.agent.policy, eval_key)))
            record["eval_s"] += time.perf_counter() - started
            per_agent = returns.mean(axis=-1)  # [dataset, seed]
            scores = [
                np.asarray(card.normalized_score(per_agent[index]), np.float64).tolist()
                for index, card in enumerate(task.cards)
            ]
            record["curve"].append({"updates": done, "episodes": episodes, "scores": scores})
            if final:
                record["final_returns"] = per_agent.tolist()
            means = {q: float(np.mean(s)) for q, s in zip(task.qualities, scores, strict=True)}
            reporter.evaluated(done, means, final)
        if checkpoints is not None and (
            final or not checkpoint_every or done % checkpoint_every == 0
        ):
            checkpoints.save(done, states, record)
        reporter.chunk_done(done, entry["seconds"])
    reporter.run_end()
    return RunOutcome(record=record, states=states)


# ----- progress -----------------------------------------------------------------------------
class StudyProgress:
    """The study's progress on standard error: on a terminal a rich progress bar over the
    whole study and one per (task, algorithm) run, with the updates, elapsed time, time
    left and the last curve point's scores; elsewhere (a log file, a pipe) plain lines.

    Args:
        total: updates of the whole study (every task, algorithm and agent counted once).
        done: of which done in earlier sessions.
        rich: draw the bars; None: when the console is a terminal.
        console: where the bars go; standard error by default.
    """

    def __init__(
        self,
        total: int = 0,
        done: int = 0,
        *,
        rich: bool | None = None,
        console: Any = None,
    ) -> None:
        from rich.console import Console

        self.console = console if console is not None else Console(stderr=True)
        self.rich = self.console.is_terminal if rich is None else rich
        self.total = total
        self.done_before = done
        self._progress: Any = None
        self._study: Any = None
        self._run: Any = None
        self._label = ""
        self._run_total = 0
        self._run_done = 0

    def __enter__(self) -> StudyProgress:
        if self.rich:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("updates"),
                TimeElapsedColumn(),
                TextColumn("left"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[score]}"),
                console=self.console,
                # A chunk takes minutes: the rate is estimated over the last hour.
                speed_estimate_period=3600.0,
            )
            self._progress.start()
            self._study = self._progress.add_task(
                "[bold]study", total=self.total, completed=self.done_before, score=""
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def note(self, message: str) -> None:
        """One line above the bars (or a plain progress line)."""
        if self._progress is not None:
            self._progress.console.print(f"  {message}")
        else:
            progress(message)

    def run_begin(self, label: str, done: int, total: int) -> None:
        self._label, self._run_done, self._run_total = label, done, total
        if self._progress is not None:
            self._run = self._progress.add_task(label, total=total, completed=done, score="")
        else:
            start = f"resumed at {done:,}" if done else "from the start"
            progress(f"{label}: {total:,} updates, {start}")

    def run_skipped(self, label: str, total: int) -> None:
        self.note(f"{label}: finished in an earlier session, read back from its checkpoint")
        if self._progress is not None:
            row = self._progress.add_task(label, total=total, completed=total, score="read back")
            self._progress.stop_task(row)

    def chunk_done(self, done: int, seconds: float) -> None:
        advance, self._run_done = done - self._run_done, done
        if self._progress is not None:
            self._progress.update(self._run, completed=done)
            self._progress.update(self._study, advance=advance)
        else:
            progress(
                f"  {self._label}: {done:>7,} / {self._run_total:,} updates, "
                f"{seconds:.1f} s for the chunk"
            )

    def evaluated(self, done: int, scores: dict[str, float], final: bool) -> None:
        text = ("final " if final else "") + ", ".join(f"{q} {s:.1f}" for q, s in scores.items())
        if self._progress is not None:
            self._progress.update(self._run, score=text)
            self._progress.update(self._study, score=f"{self._label}: {text}")
        else:
            progress(f"  {self._label} at {done:,} updates: score {text}")

    def run_end(self) -> None:
        if self._progress is not None and self._run is not None:
            self._progress.stop_task(self._run)  # its elapsed time stays the run's own
        self._run = None


#: NeoRL-2's published offline results (Gao et al., 2025, "NeoRL-2: Near Real-World
#: Benchmarks for Offline Reinforcement Learning with Extended Realistic Scenarios",
#: Table 3): normalized scores on the one dataset of each task; "data" is the dataset's own.
NEORL2_PUBLISHED: dict[str, dict[str, float]] = {
    "Pipeline-v0": {"data": 69.25, "bc": 68.61, "cql": 81.08, "td3bc": 81.95},
    "DMSD-v0": {"data": 56.64, "bc": 65.09, "cql": 70.24, "td3bc": 60.01},
}


def neorl2_normalization(env_id: str) -> Any:
    """NeoRL-2's normalized score of an episode return for a task it published."""
    if env_id == "Pipeline-v0":
        from neorl_industrial.core.environments.pipeline import normalized_score
    elif env_id == "DMSD-v0":
        from neorl_industrial.core.environments.dmsd import normalized_score
    else:
        raise ValueError(f"env_id: NeoRL-2 publishes no normalization for {env_id!r}")
    return normalized_score


def _cell(summary: dict[str, Any] | None) -> str:
    if summary is None:
        return "—"
    if summary.get("ci") is None:
        return f"{summary['mean']:.1f}"
    return f"{summary['mean']:.1f} ± {summary['ci']:.1f}"


def as_suite(config: dict[str, Any], results: dict[str, Any]) -> tuple[dict, dict]:
    """A study in the suite's layout (``results["tasks"][env_id]``); a saved run of one
    task in the earlier layout (``config["env_id"]``, ``results["datasets"]``) is
    converted."""
    if "tasks" in results:
        return config, results
    env_id = config["env_id"]
    task = {
        "datasets": results["datasets"],
        "timing": results.get("timing", {}),
        "history": results.get("history", {}),
        "curves": results.get("curves", {}),
        "checks": results.get("checks", {}),
        "horizon": config.get("horizon"),
    }
    suite_config = {k: v for k, v in config.items() if k not in ("env_id", "horizon")}
    suite_config["tasks"] = [env_id]
    return suite_config, {"tasks": {env_id: task}}


def _updates_text(config: dict[str, Any], task: dict[str, Any]) -> str:
    counts = {
        name: task["timing"][name].get("n_updates", config.get("n_updates"))
        for name in config["algorithms"]
        if name in task.get("timing", {})
    }
    if isinstance(config.get("n_updates"), dict):
        counts = {name: config["n_updates"].get(name, n) for name, n in counts.items()}
    if len(set(counts.values())) == 1:
        return f"{next(iter(counts.values())):,} updates"
    return "updates " + ", ".join(f"{LABELS[n]} {u:,}" for n, u in counts.items())


def summary(config: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
    """Per algorithm, over every task and dataset it ran on: on how many its mean score
    beats the behaviour policy's, and on how many the lower end of the 95 % interval does."""
    out: dict[str, Any] = {}
    for name in config["algorithms"]:
        beats = significantly = total = 0
        for task in results["tasks"].values():
            for entry in task["datasets"].values():
                score = entry["scores"].get(name)
                if score is None:
                    continue
                total += 1
                beats += score["mean"] > entry["behaviour_score"]
                significantly += score["mean"] - (score["ci"] or 0.0) > entry["behaviour_score"]
        out[name] = {"beats": beats, "significantly": significantly, "datasets": total}
    return out


def task_markdown(
    env_id: str, config: dict[str, Any], task: dict[str, Any], images: str | None = None
) -> list[str]:
    """One task's tables: normalized scores (with the learning curves' plots under
    ``images``, a path relative to the page, when given), returns, reward scaling, checks,
    NeoRL-2's published scores and wall time."""
    labels = [LABELS[name] for name in config["algorithms"]]
    qualities = [q for q in config["qualities"] if q in task["datasets"]]
    horizon = task.get("horizon")
    lines = [
        f"## {env_id}",
        "",
        f"{_updates_text(config, task)}; datasets of {config['trajectories']} trajectories"
        + (f" of {horizon} steps" if horizon else "")
        + ".",
        "",
        "| dataset | behaviour | " + " | ".join(labels) + " |",
        "|---|---|" + "---|" * len(labels),
    ]
    for quality in qualities:
        entry = task["datasets"][quality]
        row = [f"{env_id}-{quality}", f"{entry['behaviour_score']:.1f}"]
        row += [_cell(entry["scores"].get(name)) for name in config["algorithms"]]
        lines.append("| " + " | ".join(row) + " |")
    plotted = curve_datasets(config, task)
    if images and plotted:
        every = config.get("eval_every")
        lines += [
            "",
            "Learning curves: normalized score against updates, mean over seeds with its 95 % "
            "interval; dashed, the behaviour policy. "
            + (
                f"A point every {every:,} updates over {config.get('curve_episodes')} "
                "episodes per seed; "
                if every
                else ""
            )
            + f"the last point is the final evaluation ({config['n_episodes']} episodes).",
            "",
        ]
        for quality in plotted:  # a paragraph each: one plot under the other
            lines += [f"![{env_id}-{quality}]({images}/{env_id}-{quality}.png)", ""]
        lines.pop()
    lines += [
        "",
        "Mean episode returns (environment reward per episode):",
        "",
        "| dataset | random | expert | behaviour | " + " | ".join(labels) + " |",
        "|---|---|---|---|" + "---|" * len(labels),
    ]
    for quality in qualities:
        entry = task["datasets"][quality]
        row = [
            f"{env_id}-{quality}",
            f"{entry['random_return']:.4g}",
            f"{entry['expert_return']:.4g}",
            f"{entry['behaviour_return']:.4g}",
        ]
        row += [_cell(entry["returns"].get(name)) for name in config["algorithms"]]
        lines.append("| " + " | ".join(row) + " |")
    published = NEORL2_PUBLISHED.get(env_id)
    if published:
        names = [name for name in ("bc", "cql", "td3bc") if name in published]
        lines += [
            "",
            "NeoRL-2's published normalized scores on its own dataset of this task, for "
            "comparison only: their data (one dataset from their behaviour policy), "
            "normalization (their random and expert returns) and budgets are not ours, "
            "so the numbers are not on the same scale as the table above.",
            "",
            "| NeoRL-2 | data | " + " | ".join(LABELS[n] for n in names) + " |",
            "|---|---|" + "---|" * len(names),
            f"| {env_id} (published) | {published['data']:.2f} | "
            + " | ".join(f"{published[n]:.2f}" for n in names)
            + " |",
        ]
        rescore = neorl2_normalization(env_id)
        for quality in qualities:
            entry = task["datasets"][quality]
            cells = [
                "—"
                if entry["returns"].get(n) is None
                else f"{rescore(entry['returns'][n]['mean']):.2f}"
                for n in names
            ]
            behaviour = rescore(entry["behaviour_return"])
            lines.append(
                f"| {env_id}-{quality} (ours, rescored) | {behaviour:.2f} | "
                + " | ".join(cells)
                + " |"
            )
        lines += [
            "",
            "*Rescored*: our mean episode returns put on NeoRL-2's scale with its own "
            "normalization (its random and expert returns for this task), so the rows compare "
            "returns in the same environment; the datasets, behaviour policies and budgets "
            "still differ.",
        ]
    scaled = [
        n
        for n in config["algorithms"]
        if any(n in e.get("reward_scaling", {}) for e in (task["datasets"][q] for q in qualities))
    ]
    if scaled:
        lines += [
            "",
            "Reward scaling for training, `r -> (r + shift) * scale`, fitted on each dataset:",
            "",
            "| dataset | " + " | ".join(LABELS[n] for n in scaled) + " |",
            "|---|" + "---|" * len(scaled),
        ]
        for quality in qualities:
            scalings = task["datasets"][quality].get("reward_scaling", {})
            cells = [_scaling_cell(scalings.get(n)) for n in scaled]
            lines.append(f"| {env_id}-{quality} | " + " | ".join(cells) + " |")
    task_checks = task.get("checks", {})
    if task_checks:
        lines += ["", "Checks (mean score over seeds against the behaviour score):", ""]
        for check in task_checks.values():
            verdict = "met" if check["passed"] else "**not met**"
            lines.append(f"- {check['what']}: {verdict} ({check['detail']})")
    timing = task.get("timing", {})
    if timing:
        lines += [
            "",
            "Wall time per algorithm, training + evaluation (all datasets and seeds in one "
            "program, summed over resumed sessions): "
            + ", ".join(
                f"{LABELS[name]} {duration(timing[name]['train_s'])} + "
                f"{duration(timing[name].get('eval_s', 0.0))}"
                for name in config["algorithms"]
                if name in timing
            )
            + ".",
        ]
    return [*lines, ""]


def _scaling_cell(scaling: dict[str, Any] | None) -> str:
    if scaling is None:
        return "—"
    shift = f", shift {scaling['shift']:.4g}" if scaling["shift"] else ""
    return f"{scaling['kind']} (scale {scaling['scale']:.3g}{shift})"


def duration(seconds: float) -> str:
    """``42 s``, ``17 min``, ``5 h 03 min``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def wall_time(results: dict[str, Any]) -> dict[str, float]:
    """Seconds of training and of evaluation over every task and algorithm (summed over
    resumed sessions), and their total."""
    timings = [t for task in results["tasks"].values() for t in task.get("timing", {}).values()]
    train = float(sum(t.get("train_s", 0.0) for t in timings))
    evaluation = float(sum(t.get("eval_s", 0.0) for t in timings))
    return {"train_s": train, "eval_s": evaluation, "total_s": train + evaluation}


def _preprocessing(config: dict[str, Any]) -> str:
    scaling = config.get("reward_scaling")
    if scaling is None:  # runs from before the per-algorithm scaling
        return "rewards standardized with the dataset's mean and spread for training only"
    if scaling == PER_ALGORITHM:
        return (
            "rewards scaled for training only, per algorithm as the algorithm registry "
            "says (IQL: `return_range`, times 1000 / (max - min episode return), the IQL "
            "paper's; the others: `std`, divided by the rewards' spread; the CQL variants "
            "as CQL), fitted on each dataset (the tables give kind and scale)"
        )
    return f"rewards scaled for training only with `{scaling}` for every algorithm"


def markdown(config: dict[str, Any], results: dict[str, Any], images: str | None = None) -> str:
    """The study as a markdown page: a suite summary, then one section per task (with the
    plots under ``images``, a path relative to the page, when given)."""
    config, results = as_suite(config, results)
    tasks = list(results["tasks"])
    spent = wall_time(results)
    lines = [
        "# Learning study: offline agents on the task suite",
        "",
        "Generated by `python -m benchmarks.learning` "
        f"(batch {config['batch_size']}, networks {tuple(config.get('hidden', (256, 256)))}, "
        f"{config['n_seeds']} seeds per dataset trained in one vmapped program, "
        f"{config['n_episodes']} evaluation episodes per seed; tasks: "
        + ", ".join(f"`{t}`" for t in tasks)
        + "). Do not edit by hand; rerun the script.",
        "",
        "Normalized scores, D4RL-style from the dataset card: "
        "`100 * (R - random) / (expert - random)`; mean over seeds ± the half-width of a "
        "95 % confidence interval (Student's t over seeds). *Behaviour* is the dataset's "
        "own mean return.",
        "",
        f"Wall time of the study: {duration(spent['total_s'])} (training "
        f"{duration(spent['train_s'])}, evaluation {duration(spent['eval_s'])}; every task "
        "and algorithm, summed over resumed sessions).",
        "",
    ]
    if len(tasks) > 1 or config.get("summary_always"):
        counts = summary(config, results)
        lines += [
            "## Suite summary",
            "",
            "On how many datasets each algorithm's mean score beats the behaviour policy's "
            "(and on how many the lower end of its 95 % interval does):",
            "",
            "| algorithm | beats the behaviour policy | of which significantly |",
            "|---|---|---|",
        ]
        for name, count in counts.items():
            lines.append(
                f"| {LABELS[name]} | {count['beats']} of {count['datasets']} | "
                f"{count['significantly']} of {count['datasets']} |"
            )
        lines.append("")
    for env_id in tasks:
        lines += task_markdown(env_id, config, results["tasks"][env_id], images)
    lines += [
        f"Device: {config.get('device', 'unknown')}. Preprocessing: "
        "observations standardized with the dataset's per-feature statistics (the "
        f"normalizer is part of the policy); {_preprocessing(config)}; "
        "actions in plant units scaled to [-1, 1] by the "
        "actuator bounds (the policy scales back). Hyperparameters are the algorithms' "
        "defaults (CORL's) except the network widths given above.",
        "",
    ]
    return "\n".join(lines)


def checks(config: dict[str, Any], results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """One task's expectations, each with the numbers behind its verdict.

    * TD3+BC, IQL and CQL reach the behaviour policy on ``low`` and ``medium``: the mean
      score over seeds is at least the behaviour score (the interval is reported beside
      it, not used to widen the check).
    * BC is close to the behaviour policy: within 10 points of its score.
    """
    out: dict[str, dict[str, Any]] = {}
    for quality in config["qualities"]:
        entry = results["datasets"].get(quality)
        if entry is None:
            continue
        behaviour = entry["behaviour_score"]
        for name in config["algorithms"]:
            score = entry["scores"].get(name)
            if score is None:
                continue
            half = score["ci"] or 0.0
            if name in IMPROVERS and quality in MUST_MATCH_BEHAVIOUR:
                out[f"{name}_{quality}_reaches_behaviour"] = {
                    "what": f"{LABELS[name]} reaches the behaviour score on {quality}",
                    "passed": bool(score["mean"] >= behaviour),
                    "detail": f"{score['mean']:.1f} ± {half:.1f} vs {behaviour:.1f}",
                }
            if name == "bc":
                out[f"bc_{quality}_close_to_behaviour"] = {
                    "what": f"BC within 10 points of the behaviour score on {quality}",
                    "passed": bool(abs(score["mean"] - behaviour) <= 10.0),
                    "detail": f"{score['mean']:.1f} ± {half:.1f} vs {behaviour:.1f}",
                }
    return out


# ----- learning curves ----------------------------------------------------------------------
def curve_datasets(config: dict[str, Any], task: dict[str, Any]) -> list[str]:
    """The qualities of ``task`` with a learning curve of some algorithm (one plot each)."""
    curves = task.get("curves") or {}
    return [
        quality
        for quality in config["qualities"]
        if quality in task["datasets"]
        and any(quality in curve["scores"] for curve in curves.values())
    ]


def plot_curves(
    config: dict[str, Any], results: dict[str, Any], directory: str | Path
) -> list[Path]:
    """``<directory>/<task>-<quality>.png`` per dataset with curves: normalized score
    against updates per algorithm, mean over seeds with its 95 % interval as a band, and
    the behaviour policy's score dashed. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib import pyplot as plt

    from neorl_industrial.wrappers.hostio import atomic_file

    config, results = as_suite(config, results)
    written = []
    for env_id, task in results["tasks"].items():
        curves = task.get("curves") or {}
        for quality in curve_datasets(config, task):
            entry = task["datasets"][quality]
            figure, axis = plt.subplots(figsize=(7.0, 4.4))
            for name in config["algorithms"]:
                curve = curves.get(name)
                if curve is None or quality not in curve["scores"]:
                    continue
                updates = np.asarray(curve["updates"])
                stats = [mean_confidence_interval(s) for s in curve["scores"][quality]]
                mean = np.asarray([s["mean"] for s in stats])
                half = np.asarray([s["ci"] or 0.0 for s in stats])
                # One colour per algorithm on every plot of the page.
                color = f"C{ALGORITHMS.index(name) % 10}"
                axis.plot(updates, mean, color=color, marker="o", ms=3, label=LABELS[name])
                axis.fill_between(updates, mean - half, mean + half, color=color, alpha=0.18)
            axis.axhline(
                entry["behaviour_score"], color="black", ls="--", lw=1.2, label="behaviour policy"
            )
            axis.set_xlabel("updates")
            axis.set_ylabel("normalized score")
            axis.set_title(f"{env_id}-{quality}: mean over seeds, 95 % interval")
            axis.grid(alpha=0.3)
            axis.legend(fontsize=8, loc="best")
            figure.tight_layout()
            target = Path(directory) / f"{env_id}-{quality}.png"
            with atomic_file(target) as staging:
                figure.savefig(staging, dpi=110, format="png")
            plt.close(figure)
            written.append(target)
    return written


# ----- the study ----------------------------------------------------------------------------
#: ``config["reward_scaling"]`` of a study that scales as the algorithm registry says.
PER_ALGORITHM = "per_algorithm"


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
PER_RUN = ("algorithms", "qualities", "n_updates", "chunk_updates", "tasks")


def merge(paths: Sequence[str | Path]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One study from several saved runs of the same settings with different algorithms
    or tasks (e.g. one run per algorithm, each within a time limit); curves, reward
    scalings and timing travel with their algorithm.

    Raises:
        ValueError: when the runs' settings (other than algorithms, tasks, qualities and
            updates) differ, or two runs hold the same algorithm on the same task.
    """
    if not paths:
        raise ValueError("merge: expected at least one result file")
    runs = []
    for path in paths:
        run = BenchmarkResult.load(path)
        if run.name != NAME:
            raise ValueError(f"{path}: not a learning study (benchmark {run.name!r})")
        runs.append(as_suite(run.config, run.results))
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
            for name in run_config["algorithms"]:
                if name in merged["timing"]:
                    raise ValueError(f"{path}: algorithm {name!r} on {env_id} appears in two runs")
                if name not in algorithms:
                    algorithms.append(name)
                merged["timing"][name] = {
                    "n_updates": run_config["n_updates"],
                    **task["timing"][name],
                }
                merged["history"][name] = task["history"][name]
                if name in task.get("curves", {}):
                    merged["curves"][name] = task["curves"][name]
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
    config["merged_from"] = [Path(path).name for path in paths]
    for task in results["tasks"].values():
        task["checks"] = checks(config, task)
    results["summary"] = summary(config, results)
    results["wall_time"] = wall_time(results)
    return config, results


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
        help="write the page (and a combined result) from saved runs instead of running",
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
        args.eval_every = 100
    if min(args.hidden) < 1:
        parser.error("--hidden: expected positive layer widths")
    for name in (
        "trajectories",
        "seeds",
        "updates",
        "chunk",
        "batch_size",
        "episodes",
        "curve_episodes",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected a positive integer")
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
    except (FileExistsError, CheckpointMismatchError) as error:
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
