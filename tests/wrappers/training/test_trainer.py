"""The Trainer: chunks, callbacks, evaluation, best policies, early stopping, checkpoints
and exact resume (also after ``kill -9``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from neorl_industrial.core.agents.registry import build_algorithm
from neorl_industrial.core.environments import make
from neorl_industrial.wrappers.training import (
    CheckpointMismatchError,
    CheckpointSection,
    EvaluationSection,
    Evaluator,
    History,
    Trainer,
    TrainingSection,
    selection_key,
)
from neorl_industrial.wrappers.training.trainer import _compiled_chunk

REPO = Path(__file__).resolve().parents[3]


def _algorithm(name: str = "td3bc-lag", **hyperparameters):
    hyperparameters = {"hidden": [16, 16], **hyperparameters}
    if name.endswith("-lag"):
        hyperparameters.setdefault("cost_limits", [5.0, 5.0])
        hyperparameters.setdefault("episode_length", 50)
    return build_algorithm(name, 180, 3, hyperparameters)[0]


def _evaluator(algorithm, episodes: int = 2, horizon: int = 20):
    env, params = make("IB-v0")
    return Evaluator(
        algorithm,
        env,
        params,
        episodes=episodes,
        horizon=horizon,
        constraints=env.compile_constraints(),
        cost_limits=[5.0, 5.0],
    )


def _same(a, b) -> bool:
    leaves = jax.tree.leaves(jax.tree.map(lambda x, y: np.array_equal(x, y), a, b))
    return all(bool(leaf) for leaf in leaves)


def test_selection_prefers_any_policy_within_the_limits():
    safe_poor = {"return": -300.0, "normalized_cost": 0.9}
    safe_good = {"return": -100.0, "normalized_cost": 1.0}
    unsafe_rich = {"return": 0.0, "normalized_cost": 1.2}
    unsafe_worse = {"return": 0.0, "normalized_cost": 3.0}
    ranked = sorted([unsafe_worse, safe_poor, unsafe_rich, safe_good], key=selection_key)
    assert ranked == [unsafe_worse, unsafe_rich, safe_poor, safe_good]
    assert selection_key({"return": 5.0, "normalized_cost": None}) == (0.0, 5.0)


def test_callbacks_evaluations_and_best_policies(ib_data):
    algorithm = _algorithm()
    history = History()
    trainer = Trainer(
        algorithm,
        ib_data,
        TrainingSection(seeds=[3, 4], batch_size=32, chunk=50),
        EvaluationSection(every=100),
        evaluator=_evaluator(algorithm),
        callbacks=[history],
    )
    result = trainer.fit(200)
    assert [updates for updates, _ in history.chunks] == [50, 100, 150, 200]
    assert [updates for updates, _ in history.evaluations] == [100, 200]
    assert len(result.evaluations) == 2 and len(result.evaluations[0]["runs"]) == 2
    assert np.asarray(result.state.updates).tolist() == [200, 200]
    for run, best in enumerate(result.best):
        scores = [selection_key(e["runs"][run]) for e in result.evaluations]
        assert selection_key(best["metrics"]) == max(scores)
        # The kept policy is the one evaluated at the best evaluation's update count.
        assert best["updates"] in (100, 200)
    # Every evaluation keeps the hard constraints (the shield is on).
    assert all(r["hard_violation_steps"] == 0 for e in result.evaluations for r in e["runs"])
    assert set(result.summary) >= {"return", "normalized_cost", "override_rate"}
    assert result.summary["return"]["n"] == 2 and result.summary["return"]["ci"] is not None
    final = result.state.agent.policy
    changed = [
        not _same(
            jax.tree.map(lambda x, i=i: x[i], final),
            jax.tree.map(lambda x, i=i: x[i], result.best_policies),
        )
        for i in range(2)
    ]
    assert changed == [b["updates"] != 200 for b in result.best]


def test_early_stopping_after_patience_evaluations_without_improvement(ib_data):
    algorithm = _algorithm("bc")

    class NeverBetter(Evaluator):
        def __call__(self, policies, updates):
            rows = super().__call__(policies, updates)
            for row in rows:  # every evaluation scores worse than the first
                row["return"] = -float(updates)
            return rows

    env, params = make("IB-v0")
    evaluator = NeverBetter(algorithm, env, params, episodes=1, horizon=5)
    trainer = Trainer(
        algorithm,
        ib_data,
        TrainingSection(batch_size=16, chunk=10),
        EvaluationSection(every=10, patience=2),
        evaluator=evaluator,
    )
    result = trainer.fit(100)
    assert result.stopped_early
    assert int(result.state.updates[0]) == 30  # improved at 10, then two without
    assert result.best[0]["updates"] == 10


def test_checkpoints_resume_exactly_and_refuse_other_runs(ib_data, tmp_path):
    algorithm = _algorithm()
    kwargs = dict(
        training=TrainingSection(seeds=[0, 1], batch_size=32, chunk=50),
        evaluation=EvaluationSection(every=100),
        evaluator=_evaluator(algorithm),
    )
    uninterrupted = Trainer(algorithm, ib_data, **kwargs).fit(300)

    every_100 = CheckpointSection(every=100)
    first = Trainer(algorithm, ib_data, checkpoints=every_100, checkpoint_dir=tmp_path, **kwargs)
    partial = first.fit(200)
    assert first.latest_checkpoint() == 200 and int(partial.state.updates[0]) == 200
    resumed = Trainer(
        algorithm, ib_data, checkpoints=every_100, checkpoint_dir=tmp_path, **kwargs
    ).fit(300, resume=True)
    assert resumed.resumed_from == 200
    assert _same(resumed.state, uninterrupted.state)
    assert _same(resumed.best_policies, uninterrupted.best_policies)
    assert resumed.best == uninterrupted.best
    assert len(resumed.history) == 6 and len(resumed.evaluations) == 3
    # ... with the uninterrupted run's programs: the restored arrays are placed as a run
    # computes them (arrays committed to a device would make other programs).
    assert _compiled_chunk(algorithm, 32, 50)._cache_size() == 1
    assert kwargs["evaluator"]._run._cache_size() == 1

    # Starting afresh over an earlier run's checkpoints, or resuming with other settings,
    # is refused and leaves the checkpoints as they were.
    with pytest.raises(CheckpointMismatchError, match="earlier run"):
        Trainer(algorithm, ib_data, checkpoint_dir=tmp_path, **kwargs).fit(300)
    other = {**kwargs, "training": TrainingSection(seeds=[0, 1, 2], batch_size=32, chunk=50)}
    with pytest.raises(CheckpointMismatchError, match="differs in seeds"):
        Trainer(algorithm, ib_data, checkpoint_dir=tmp_path, **other).fit(400, resume=True)
    assert Trainer(algorithm, ib_data, checkpoint_dir=tmp_path, **kwargs).latest_checkpoint() == 300


def test_bad_settings_are_named(ib_data):
    algorithm = _algorithm("bc")
    with pytest.raises(ValueError, match=r"evaluation\.every"):
        Trainer(algorithm, ib_data, TrainingSection(chunk=50), EvaluationSection(every=70))
    with pytest.raises(ValueError, match="seeds"):
        Trainer(algorithm, ib_data, TrainingSection(seeds=[1, 1]))
    with pytest.raises(ValueError, match="n_updates"):
        Trainer(algorithm, ib_data, TrainingSection(chunk=50)).fit(120)


TRAIN_SCRIPT = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {tests!r})
    from tests.wrappers.conftest import ib_shaped_dataset
    from tests.wrappers.training.test_trainer import _algorithm
    from neorl_industrial.wrappers.training import (
        Callback, CheckpointSection, Trainer, TrainingSection,
    )

    class Slow(Callback):
        def on_checkpoint(self, trainer, updates, path):
            print("checkpoint", updates, flush=True)
            time.sleep(0.5)  # leave time to be killed mid-run

    trainer = Trainer(_algorithm(), ib_shaped_dataset(),
                      TrainingSection(seeds=[0, 1], batch_size=32, chunk=50),
                      checkpoints=CheckpointSection(every=50),
                      checkpoint_dir={directory!r}, callbacks=[Slow()])
    trainer.fit(400, resume=True)
    print("finished", flush=True)
    """
)


@pytest.mark.slow
def test_resume_after_kill_9_ends_identical_to_an_uninterrupted_run(tmp_path):
    from tests.wrappers.conftest import ib_shaped_dataset

    script = TRAIN_SCRIPT.format(tests=str(REPO), directory=str(tmp_path / "ckpt"))
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        deadline = time.monotonic() + 240
        for line in process.stdout:
            if line.startswith("checkpoint") and int(line.split()[1]) >= 100:
                break
            assert time.monotonic() < deadline, "no checkpoint in time"
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == -signal.SIGKILL

    data = ib_shaped_dataset()
    algorithm = _algorithm()
    kwargs = dict(training=TrainingSection(seeds=[0, 1], batch_size=32, chunk=50))
    survivor = Trainer(algorithm, data, checkpoint_dir=tmp_path / "ckpt", **kwargs)
    killed_at = survivor.latest_checkpoint()
    assert killed_at is not None and 100 <= killed_at < 400
    resumed = survivor.fit(400, resume=True)
    assert resumed.resumed_from == killed_at
    uninterrupted = Trainer(algorithm, data, **kwargs).fit(400)
    assert _same(resumed.state, uninterrupted.state)
