"""Atomic writes: a dataset appears complete under its name or not at all.

Everything is written into a hidden temporary sibling of the target (same file system,
so the final rename is atomic), flushed to disk, and renamed into place. On any error the
temporary is removed, so an interrupted save leaves neither a half-written dataset nor
litter next to it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path


def fsync_path(path: Path) -> None:
    """Flushes a file's or a directory's entry to disk.

    Directories are flushed where the platform allows it (POSIX); Windows cannot open
    them, and there a rename is durable once the files in it are.
    """
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        if path.is_dir():
            return
        raise
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _fsync_tree(root: Path) -> None:
    for directory, _, files in os.walk(root):
        for name in files:
            fsync_path(Path(directory, name))
        fsync_path(Path(directory))


@contextlib.contextmanager
def atomic_directory(
    target: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    replaceable: Callable[[Path], bool] | None = None,
) -> Iterator[Path]:
    """Yields an empty temporary directory that becomes ``target`` when the block ends.

    Args:
        target: the directory to create.
        overwrite: replace an existing ``target``. The old directory is moved aside, the
            new one renamed into place, and only then the old one deleted, so ``target``
            is never half written (it is briefly absent between the two renames).
        replaceable: with ``overwrite``, a check that the existing directory is one this
            writer may delete (e.g. it holds a dataset card), so a mistyped path cannot
            wipe unrelated files.

    Raises:
        FileExistsError: if ``target`` exists and may not be replaced.
    """
    target = Path(target)
    _check_replaceable(target, overwrite, replaceable)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield staging
        _fsync_tree(staging)
        # Checked again: another writer may have created the target meanwhile.
        _check_replaceable(target, overwrite, replaceable)
        if target.exists():
            _swap_into_place(staging, target)
        else:
            os.rename(staging, target)
        fsync_path(target.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _check_replaceable(
    target: Path, overwrite: bool, replaceable: Callable[[Path], bool] | None
) -> None:
    if not target.exists():
        return
    if not overwrite:
        raise FileExistsError(f"{target}: already exists; pass overwrite=True to replace it")
    if not target.is_dir():
        raise FileExistsError(f"{target}: exists and is not a directory; refusing to replace it")
    empty = not any(target.iterdir())
    if not empty and replaceable is not None and not replaceable(target):
        raise FileExistsError(
            f"{target}: exists and does not look like a dataset; refusing to replace it"
        )


def _swap_into_place(staging: Path, target: Path) -> None:
    retired = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
    os.rename(target, retired)
    try:
        os.rename(staging, target)
    except BaseException:
        os.rename(retired, target)
        raise
    shutil.rmtree(retired, ignore_errors=True)


@contextlib.contextmanager
def atomic_file(target: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[Path]:
    """Yields a temporary path in ``target``'s directory that becomes ``target`` when the
    block ends (flushed to disk, then renamed over it).

    Raises:
        FileExistsError: if ``target`` exists and ``overwrite`` is false.
    """
    target = Path(target)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target}: already exists; pass overwrite=True to replace it")
    target.parent.mkdir(parents=True, exist_ok=True)
    descriptor, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(descriptor)
    staging = Path(name)
    try:
        yield staging
        fsync_path(staging)
        os.replace(staging, target)
        fsync_path(target.parent)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
