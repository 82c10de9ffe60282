"""The Trainer: scan-fused chunks on the device, everything else on the host between them.

Every chunk is one compiled call of ``chunk`` updates for all seeds (``vmap`` over
separate parameters, the state donated). Between chunks the host receives the chunk's
mean metrics (one transfer), calls the callbacks, evaluates every ``eval_every``
updates, keeps each run's best policy by :func:`selection_key`, stops early when no run
improved for ``patience`` evaluations, and writes a checkpoint every
``checkpoint_every`` updates.

Checkpoints are orbax checkpoints, written atomically (a checkpoint exists only once it
is complete): the runs' :class:`TrainState` (parameters, optimizer moments, PRNG keys,
update counts), their best policies, and the host's record (history, evaluations, best
scores, the early-stopping count, a fingerprint of the configuration and data). A run
resumed from its latest checkpoint, even after ``kill -9``, ends with parameters
identical to an uninterrupted run: the chunks depend only on the state, and evaluation
keys only on the updates done.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from neorl_industrial.core.agents.types import Algorithm
from neorl_industrial.functional.state_management import (
    Dataset,
    TrainState,
    donatable,
    init_train_states,
    uncommitted,
)
from neorl_industrial.functional.transformations.data_parallel import (
    check_batch,
    data_parallel_chunk,
    localize,
    replicate,
    split_dataset,
)
from neorl_industrial.functional.transformations.offline import make_train_chunk
from neorl_industrial.functional.transformations.sweep import to_host
from neorl_industrial.wrappers.hostio import to_json_data
from neorl_industrial.wrappers.training.callbacks import Callback
from neorl_industrial.wrappers.training.config import (
    CheckpointSection,
    EvaluationSection,
    TrainingSection,
    check_updates,
)
from neorl_industrial.wrappers.training.evaluation import (
    Evaluator,
    selection_key,
    summarize_runs,
)

__all__ = [
    "CheckpointMismatchError",
    "TrainResult",
    "Trainer",
    "checkpoint_steps",
    "dataset_fingerprint",
]


class CheckpointMismatchError(ValueError):
    """A checkpoint written by a run of another configuration or dataset."""


@dataclasses.dataclass
class TrainResult:
    """What a training produced.

    Attributes:
        state: the runs' final state (leading run axis).
        best_policies: each run's best policy by the selection criterion (its final
            policy when it was never evaluated); leading run axis.
        history: per chunk: updates, seconds, updates per second, mean metrics per run.
        evaluations: per evaluation: updates and the metrics of every run.
        best: per run, the updates and metrics of its best evaluation (None if none).
        summary: mean and 95 % confidence interval over runs of the best evaluations'
            metrics (empty without evaluations).
        stopped_early: training stopped before ``n_updates`` (patience ran out).
        resumed_from: updates of the checkpoint this training resumed from, or None.
    """

    state: TrainState
    best_policies: Any
    history: list[dict[str, Any]]
    evaluations: list[dict[str, Any]]
    best: list[dict[str, Any] | None]
    summary: dict[str, Any]
    stopped_early: bool = False
    resumed_from: int | None = None

    @property
    def best_run(self) -> int:
        """Index of the run whose best evaluation ranks first (0 without evaluations)."""
        scored = [(selection_key(b["metrics"]), i) for i, b in enumerate(self.best) if b]
        return max(scored)[1] if scored else 0


def dataset_fingerprint(dataset: Dataset) -> str:
    """A short digest of the data's shapes, actions and rewards."""
    digest = hashlib.sha256()
    for leaf in (dataset.actions, dataset.rewards, dataset.costs):
        array = np.asarray(jax.device_get(leaf))
        digest.update(str((array.shape, array.dtype.str)).encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    digest.update(str((dataset.observations.shape, dataset.frame_stack)).encode())
    return digest.hexdigest()[:16]


class Trainer:
    """Trains one agent per seed on ``dataset``, all seeds in one vmapped program.

    Args:
        algorithm: the agent (its ``init`` fixes the networks).
        dataset: the training data, on the device.
        training: the training section: one run per ``seeds``, ``batch_size``
            transitions per update, ``chunk`` updates per compiled call, ``updates`` in
            all (unless ``fit`` is given another count).
        evaluation: the evaluation section: evaluate every ``every`` updates (a multiple
            of the chunk; 0: at the end only) and stop when no run improved for
            ``patience`` evaluations (None: never). None, or no ``evaluator``: the runs
            are not evaluated.
        checkpoints: the checkpoint section: a checkpoint every ``every`` updates (0:
            only at the end), the newest ``keep`` kept. Written only with
            ``checkpoint_dir``.
        evaluator: evaluates the runs' policies; None: no evaluation.
        checkpoint_dir: where checkpoints go (None: none).
        callbacks: called on the host between chunks.
        fingerprint: what identifies the run's configuration (JSON-serializable); a
            checkpoint of another configuration or dataset is refused on resume.
        mesh: train data-parallel over this ``"data"`` mesh (``data_mesh()``): the
            dataset in one shard of whole episodes per device, gradients averaged across
            devices and processes (``train_data_parallel``). None: one device. In a
            distributed run every process passes the whole dataset and keeps its shards;
            checkpoints then need a single process.
    """

    def __init__(
        self,
        algorithm: Algorithm,
        dataset: Dataset,
        training: TrainingSection | None = None,
        evaluation: EvaluationSection | None = None,
        checkpoints: CheckpointSection | None = None,
        *,
        evaluator: Evaluator | None = None,
        checkpoint_dir: str | Path | None = None,
        callbacks: Sequence[Callback] = (),
        fingerprint: dict[str, Any] | None = None,
        mesh: Any = None,
    ) -> None:
        training = training or TrainingSection()
        checkpoints = checkpoints or CheckpointSection()
        batch_size, chunk_updates = training.batch_size, training.chunk
        eval_every = 0 if evaluation is None else evaluation.every
        check_updates(
            eval_every, chunk_updates, "evaluation.every", "training.chunk", allow_zero=True
        )
        check_updates(
            checkpoints.every, chunk_updates, "checkpoints.every", "training.chunk", allow_zero=True
        )
        self.training = training
        self.n_updates = training.updates
        self.algorithm = algorithm
        self.dataset = dataset
        self.seeds = [int(seed) for seed in training.seeds]
        self.batch_size = batch_size
        self.chunk_updates = chunk_updates
        self.evaluator = evaluator
        self.eval_every = eval_every
        self.patience = None if evaluation is None else evaluation.patience
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir).absolute()
        self.checkpoint_every = checkpoints.every
        self.keep_checkpoints = checkpoints.keep
        self.callbacks = list(callbacks)
        self.fingerprint = {
            **(fingerprint or {}),
            "seeds": self.seeds,
            "batch_size": batch_size,
            "chunk_updates": chunk_updates,
            "dataset": dataset_fingerprint(dataset),
        }
        self.mesh = mesh
        if mesh is None:
            self._chunk = _compiled_chunk(algorithm, batch_size, chunk_updates)
            self._data: Any = dataset
        else:
            if checkpoint_dir is not None and jax.process_count() > 1:
                raise ValueError(
                    "checkpoint_dir: checkpoints of a data-parallel run need a single "
                    f"process, this run has {jax.process_count()}; train without checkpoints"
                )
            self._data = split_dataset(dataset, mesh=mesh)
            check_batch(batch_size, self._data.n_shards)
            self._chunk = data_parallel_chunk(algorithm, batch_size, chunk_updates, mesh)
        self._manager: Any = None

    # ----- checkpoints -----------------------------------------------------------------
    def _checkpoints(self) -> Any:
        if self._manager is None and self.checkpoint_dir is not None:
            import orbax.checkpoint as ocp

            options = ocp.CheckpointManagerOptions(
                max_to_keep=self.keep_checkpoints,
                create=True,
                enable_async_checkpointing=False,
            )
            self._manager = ocp.CheckpointManager(self.checkpoint_dir, options=options)
        return self._manager

    def latest_checkpoint(self) -> int | None:
        """Updates of the newest complete checkpoint, or None."""
        if self.checkpoint_dir is None or not self.checkpoint_dir.exists():
            return None
        return self._checkpoints().latest_step()

    def _save(self, state: TrainState, best_policies: Any, record: dict[str, Any]) -> None:
        import orbax.checkpoint as ocp

        manager = self._checkpoints()
        step = int(state.updates[0])
        if step in manager.all_steps():
            return
        manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                best=ocp.args.StandardSave(best_policies),
                record=ocp.args.JsonSave(to_json_data(record)),
            ),
        )
        manager.wait_until_finished()
        for callback in self.callbacks:
            callback.on_checkpoint(self, step, self.checkpoint_dir / str(step))

    def _restore(self, template: TrainState) -> tuple[TrainState, Any, dict[str, Any]]:
        import orbax.checkpoint as ocp

        manager = self._checkpoints()
        step = manager.latest_step()
        record = manager.restore(step, args=ocp.args.Composite(record=ocp.args.JsonRestore()))[
            "record"
        ]
        if record.get("fingerprint") != to_json_data(self.fingerprint):
            difference = _difference(record.get("fingerprint"), self.fingerprint)
            raise CheckpointMismatchError(
                f"{self.checkpoint_dir}: the checkpoint at {step} updates was written by a "
                f"run of another configuration or dataset ({difference}); "
                "start a fresh run in another directory, or resume with the same settings"
            )
        best_template = template.agent.policy
        restored = manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(template),
                best=ocp.args.StandardRestore(best_template),
            ),
        )
        return uncommitted(restored["state"]), uncommitted(restored["best"]), record

    # ----- training --------------------------------------------------------------------
    def fit(self, n_updates: int | None = None, *, resume: bool = False) -> TrainResult:
        """Trains every run to ``n_updates`` updates in total.

        Args:
            n_updates: total updates per run (a multiple of the chunk); None: the
                training section's ``updates``.
            resume: continue from the newest checkpoint in ``checkpoint_dir`` when there is
                one (otherwise start fresh).

        Raises:
            CheckpointMismatchError: when resuming from a checkpoint of another
                configuration or dataset.
        """
        n_updates = self.n_updates if n_updates is None else n_updates
        check_updates(n_updates, self.chunk_updates, "n_updates", "training.chunk")
        state, best_policies, record, resumed_from = self._begin(resume)
        for callback in self.callbacks:
            callback.on_train_begin(self, int(state.updates[0]), n_updates)

        stopped_early = False
        done = int(state.updates[0])
        while done < n_updates:
            started = time.perf_counter()
            state, metrics = self._chunk(state, self._data)
            metrics = to_host(metrics)  # the chunk's one transfer
            seconds = time.perf_counter() - started
            done = int(state.updates[0])
            entry = {
                "updates": done,
                "seconds": seconds,
                "updates_per_s": len(self.seeds) * self.chunk_updates / seconds,
                "metrics": {name: np.asarray(value).tolist() for name, value in metrics.items()},
            }
            record["history"].append(entry)
            for callback in self.callbacks:
                callback.on_chunk_end(self, done, entry)

            evaluate_now = self.evaluator is not None and (
                (self.eval_every and done % self.eval_every == 0) or done >= n_updates
            )
            if evaluate_now:
                best_policies, improved = self._evaluate(
                    self._local(state), best_policies, record, done
                )
                record["since_improvement"] = 0 if improved else record["since_improvement"] + 1
                if self.patience is not None and record["since_improvement"] >= self.patience:
                    stopped_early = done < n_updates
            if self.checkpoint_dir is not None and (
                (self.checkpoint_every and done % self.checkpoint_every == 0)
                or done >= n_updates
                or stopped_early
            ):
                self._save(self._local(state), best_policies, record)
            if stopped_early:
                break

        state = self._local(state)
        if self.evaluator is None or not record["evaluations"]:
            best_policies = state.agent.policy
        runs = [b["metrics"] for b in record["best"] if b is not None]
        result = TrainResult(
            state=state,
            best_policies=best_policies,
            history=record["history"],
            evaluations=record["evaluations"],
            best=record["best"],
            summary=summarize_runs(runs) if len(runs) == len(self.seeds) and runs else {},
            stopped_early=stopped_early,
            resumed_from=resumed_from,
        )
        for callback in self.callbacks:
            callback.on_train_end(self, result)
        return result

    def _begin(self, resume: bool) -> tuple[TrainState, Any, dict[str, Any], int | None]:
        """``(state, best policies, record, resumed from)`` a fit starts from: fresh, or
        the newest checkpoint's when resuming.

        Raises:
            CheckpointMismatchError: for a checkpoint of another configuration or dataset,
                or checkpoints of an earlier run when not resuming.
        """
        state = init_train_states(self.algorithm, self.seeds)
        best_policies = state.agent.policy
        record: dict[str, Any] = {
            "history": [],
            "evaluations": [],
            "best": [None] * len(self.seeds),
            "since_improvement": 0,
        }
        resumed_from = None
        if resume and self.latest_checkpoint() is not None:
            state, best_policies, saved = self._restore(state)
            record.update({key: saved[key] for key in record})
            resumed_from = int(state.updates[0])
        elif self.checkpoint_dir is not None and self.latest_checkpoint() is not None:
            raise CheckpointMismatchError(
                f"{self.checkpoint_dir}: holds checkpoints of an earlier run; resume it "
                "(--resume, or resume=True from Python) or choose an empty directory (nothing was "
                "overwritten)"
            )
        record["fingerprint"] = self.fingerprint
        # The chunk donates its input; a fresh state may hold one buffer twice (a target
        # network starts as its online network), so every leaf gets its own copy.
        state = donatable(state)
        best_policies = donatable(best_policies)
        if self.mesh is not None:
            state = replicate(state, self.mesh)
        return state, best_policies, record, resumed_from

    def _local(self, state: TrainState) -> TrainState:
        """The state on this process's device (a data-parallel run's is replicated over
        the mesh)."""
        return state if self.mesh is None else localize(state)

    def _evaluate(
        self, state: TrainState, best_policies: Any, record: dict[str, Any], done: int
    ) -> tuple[Any, bool]:
        assert self.evaluator is not None
        rows = self.evaluator(state.agent.policy, done)
        record["evaluations"].append({"updates": done, "runs": rows})
        improved = []
        for i, row in enumerate(rows):
            best = record["best"][i]
            better = best is None or selection_key(row) > selection_key(best["metrics"])
            if better:
                record["best"][i] = {"updates": done, "metrics": row}
            improved.append(better)
        mask = jnp.asarray(improved)
        best_policies = jax.tree.map(
            lambda new, old: jnp.where(mask.reshape((-1,) + (1,) * (new.ndim - 1)), new, old),
            state.agent.policy,
            best_policies,
        )
        for callback in self.callbacks:
            callback.on_evaluation(self, done, rows)
        return best_policies, any(improved)


@functools.lru_cache(maxsize=16)
def _compiled_chunk(algorithm: Algorithm, batch_size: int, chunk_updates: int) -> Any:
    """One jitted chunk per algorithm and shape: Trainers of the same agent (a resumed
    run, a second dataset of the same shapes) share its compilation."""
    return jax.jit(make_train_chunk(algorithm, batch_size, chunk_updates), donate_argnums=0)


def _difference(saved: Any, current: dict[str, Any]) -> str:
    current = to_json_data(current)
    if not isinstance(saved, dict):
        return "no fingerprint"
    keys = sorted(set(saved) | set(current))
    changed = [key for key in keys if saved.get(key) != current.get(key)]
    return "differs in " + ", ".join(changed) if changed else "same fingerprint"


def checkpoint_steps(checkpoint_dir: Path) -> list[int]:
    """The updates of the complete checkpoints in ``checkpoint_dir``, oldest first (orbax
    names a finished checkpoint by its step; one still being written has a temporary
    suffix)."""
    if not checkpoint_dir.is_dir():
        return []
    return sorted(int(entry.name) for entry in checkpoint_dir.iterdir() if entry.name.isdigit())
