"""Things several test files build the same way (an exported policy, a fitted plant
model), built once per test run and read by every file that needs them.

The workers take whole files (``--dist loadfile``), so two files that need the same
thing are often on different workers: the first to ask builds it, under a lock, into the
run's shared directory, and the others wait for it and read it. The directory belongs to
one run (tests/conftest.py makes it and removes it at the end): nothing is carried over
from an earlier run or another version of the code.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

#: The run's shared directory (set by tests/conftest.py for the run and its workers).
SHARED_ENV = "NEORL_INDUSTRIAL_TEST_SHARED"


def built_once(name: str, build: Callable[[Path], object]) -> Path:
    """The directory ``name`` in the run's shared directory, made by ``build(directory)``
    on the first call of the run (in any worker); later calls wait for it and return it.
    Readers copy what they change: the directory is everyone's."""
    root = Path(os.environ[SHARED_ENV])
    root.mkdir(parents=True, exist_ok=True)
    target = root / name
    with (root / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.is_dir():
            partial = root / f"{name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            build(partial)
            partial.rename(target)
    return target


def copy_of(name: str, build: Callable[[Path], object], target: Path) -> Path:
    """A private copy, at ``target``, of what :func:`built_once` builds as ``name``."""
    shutil.copytree(built_once(name, build), target)
    return target


def mlflow_store(directory: Path, name: str = "mlflow.db") -> str:
    """``sqlite:///directory/name``, an MLflow store whose tables are made: a copy of an
    empty store made once per run (making the tables runs MLflow's schema migrations,
    about 1.7 CPU s a store; a copy reads as up to date). A file already there is kept."""

    def build(target: Path) -> None:
        from mlflow import MlflowClient

        MlflowClient(tracking_uri=f"sqlite:///{target / 'mlflow.db'}").search_experiments()

    path = Path(directory) / name
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built_once("mlflow-store", build) / "mlflow.db", path)
    return f"sqlite:///{path}"
