"""One run of the learning study: an algorithm on every dataset of a task, several seeds
at once, checkpointed after its chunks and resumable. Holds a task's generated data
(:class:`TaskData`), the settings that decide a run (:class:`RunSettings`), its orbax
checkpoints (:class:`RunCheckpoints`) and :func:`run_algorithm`, which trains, records
the learning curve and evaluates."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import progress, safe_filename_part
from benchmarks.learning_common import LABELS, MODEL_BASED
from benchmarks.learning_programs import (
    compiled_chunk,
    evaluation_program,
    init_states,
    make_algorithm,
    observation_normalizer,
    reward_scaling_kind,
    train_chunks,
)
from benchmarks.learning_progress import StudyProgress

#: Key of the final evaluation; a curve point's key folds the updates done into it, so
#: every evaluation depends on the updates alone and a resumed run repeats it exactly.
EVAL_SEED = 7


# ----- the study's compiled programs, one per setting ------------------------------------
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


def _model_based_evaluation(algorithm: Any, env_id: str, n_episodes: int) -> Callable:
    from neorl_industrial.core.environments import make
    from neorl_industrial.functional.state_management import with_action_scaling
    from neorl_industrial.functional.transformations import action_scaler_for

    env, env_params = make(env_id)
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
        model_updates: a model-based algorithm's plant-model fit, at most this many
            updates per dataset (0 for the others).
        model_hidden: the plant models' hidden layer widths (empty: the model's own).
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
    model_updates: int = 0
    model_hidden: tuple[int, ...] = ()

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
            model_updates=args.model_updates if name in MODEL_BASED else 0,
            model_hidden=tuple(args.model_hidden or ()) if name in MODEL_BASED else (),
        )

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON data (tuples as lists), as stored in a checkpoint (a
        model-free run's without the model's fields, as its checkpoints always were; the
        model's default widths left out, as before they could be chosen)."""
        model_fields = {"model_updates", "model_hidden"}
        return {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in dataclasses.asdict(self).items()
            if key not in model_fields
            or (self.algorithm in MODEL_BASED and (key != "model_hidden" or value))
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

        from neorl_industrial.functional.state_management import uncommitted

        manager = self._checkpoints()
        args = ocp.args.Composite(state=ocp.args.StandardRestore(template))
        return uncommitted(manager.restore(manager.latest_step(), args=args)["state"])

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
    if settings.algorithm in MODEL_BASED:
        from benchmarks.learning_models import fit_models, model_based_run, model_summary

        models, fit_s = fit_models(
            task, settings.model_updates, reporter.note, hidden=settings.model_hidden
        )
        record["models"] = model_summary(models)
        record["model_fit_s"] = record.get("model_fit_s", 0.0) + fit_s
        algorithm, states = model_based_run(
            settings.algorithm,
            task,
            settings.hidden,
            settings.updates,
            settings.seeds,
            scalings,
            models,
        )
        chunk = compiled_chunk(algorithm, settings.batch_size, settings.chunk)

        def evaluation(episodes: int) -> Callable:
            return _model_based_evaluation(algorithm, settings.task, episodes)
    else:
        chunk = _study_chunk(settings.algorithm, *key, settings.batch_size, settings.chunk)
        algorithm = _study_algorithm(settings.algorithm, *key)
        states = init_states(algorithm, task.normalizers, settings.seeds)

        def evaluation(episodes: int) -> Callable:
            return _study_evaluation(settings.algorithm, settings.task, *key, episodes)

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
            evaluate = evaluation(episodes)
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
