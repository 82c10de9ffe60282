"""Host-side file I/O shared by every layer above the core: atomic writes, JSON
conversion and YAML that cannot blow up.

* Atomic writes: a directory or file appears complete under its name or not at all.
  Everything is written into a hidden temporary sibling of the target (same file system,
  so the final rename is atomic), flushed to disk, and renamed into place. On any error
  the temporary is removed, so an interrupted save leaves neither a half-written target
  nor litter next to it. :func:`remove_stale_staging` clears what a killed process left.
* JSON: :func:`json_default` is the ``default=`` hook that turns NumPy, tuples, paths and
  dataclasses into JSON data; :func:`to_json_data` does the same eagerly and, with
  ``strict``, refuses what JSON cannot hold (NaN, infinity, objects), naming the entry.
* YAML: :func:`load_yaml_text` and :func:`read_yaml` parse with PyYAML's safe loader,
  refuse anchors and aliases (a few hundred bytes of nested aliases expand to gigabytes)
  and documents above a size cap, and name the file in every error.

The core never reads or writes files (``tests/test_architecture.py``); everything that
does goes through here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml

__all__ = [
    "MAX_YAML_BYTES",
    "YamlError",
    "atomic_directory",
    "atomic_file",
    "dump_yaml",
    "file_kind",
    "fsync_path",
    "json_default",
    "load_yaml_text",
    "read_saved_json",
    "read_saved_tree",
    "read_yaml",
    "remove_stale_staging",
    "to_json_data",
    "write_bytes_atomic",
    "write_directory_atomic",
    "write_json_atomic",
    "write_text_atomic",
]

#: The largest YAML document read (configs, schemas and constraint specs are a few KiB).
MAX_YAML_BYTES = 1 << 20

STAGING_SUFFIX = ".tmp"


# ----- atomic writes -------------------------------------------------------------------
def fsync_path(path: Path) -> None:
    """Flushes a file's or a directory's entry to disk.

    Directories are flushed where the platform allows it (POSIX); Windows cannot open
    them, and there a rename is durable once the files in it are.
    """
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        if Path(path).is_dir():
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
    refusal: str = "is not a directory this writer owns",
) -> Iterator[Path]:
    """Yields an empty temporary directory that becomes ``target`` when the block ends.

    Args:
        target: the directory to create.
        overwrite: replace an existing ``target``. The old directory is moved aside, the
            new one renamed into place, and only then the old one deleted, so ``target``
            is never half written (it is briefly absent between the two renames).
        replaceable: with ``overwrite``, a check that an existing non-empty directory is
            one this writer may delete (e.g. it holds a dataset card), so a mistyped path
            cannot wipe unrelated files.
        refusal: why an existing directory is refused, for the error message.

    Raises:
        FileExistsError: if ``target`` exists and may not be replaced.
    """
    target = Path(target).absolute()
    _check_replaceable(target, overwrite, replaceable, refusal)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(
        tempfile.mkdtemp(prefix=f".{target.name}.", suffix=STAGING_SUFFIX, dir=target.parent)
    )
    try:
        yield staging
        _fsync_tree(staging)
        # Checked again: another writer may have created the target meanwhile.
        _check_replaceable(target, overwrite, replaceable, refusal)
        if target.exists():
            _swap_into_place(staging, target)
        else:
            os.rename(staging, target)
        fsync_path(target.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _check_replaceable(
    target: Path, overwrite: bool, replaceable: Callable[[Path], bool] | None, refusal: str
) -> None:
    if not target.exists():
        return
    if not overwrite:
        raise _exists(target)
    if not target.is_dir():
        raise FileExistsError(f"{target}: exists and is not a directory; refusing to replace it")
    empty = not any(target.iterdir())
    if not empty and replaceable is not None and not replaceable(target):
        raise FileExistsError(f"{target}: exists and {refusal}; refusing to replace it")


def _swap_into_place(staging: Path, target: Path) -> None:
    retired = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}{STAGING_SUFFIX}")
    os.rename(target, retired)
    try:
        os.rename(staging, target)
    except BaseException:
        os.rename(retired, target)
        raise
    shutil.rmtree(retired, ignore_errors=True)


@contextlib.contextmanager
def atomic_file(target: str | os.PathLike[str], *, overwrite: bool = True) -> Iterator[Path]:
    """Yields a temporary path in ``target``'s directory that becomes ``target`` when the
    block ends (flushed to disk, then renamed over it).

    Raises:
        FileExistsError: if ``target`` exists and ``overwrite`` is false.
    """
    target = Path(target)
    if target.exists() and not overwrite:
        raise _exists(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    descriptor, name = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=STAGING_SUFFIX, dir=target.parent
    )
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


def write_directory_atomic(
    target: str | os.PathLike[str],
    files: Mapping[str, bytes],
    *,
    marker: str,
    what: str,
    overwrite: bool = False,
    refused: type[Exception] = FileExistsError,
) -> Path:
    """Writes ``files`` (name -> bytes) as the directory ``target``, all or nothing. An
    existing directory is replaced only with ``overwrite`` and only if it holds ``marker``
    (it is ``what``, e.g. a saved agent), so a mistyped path cannot wipe other files.
    Staging directories of writes killed beside it (an hour old or more) go first.

    Raises:
        FileExistsError: (or ``refused``, with the same message) naming ``target`` when it
            exists and may not be replaced.
    """
    remove_stale_staging(Path(target).absolute().parent)
    try:
        with atomic_directory(
            target,
            overwrite=overwrite,
            replaceable=lambda existing: (existing / marker).is_file(),
            refusal=f"is not {what} (no {marker})",
        ) as staging:
            for name, data in files.items():
                (staging / name).write_bytes(data)
    except FileExistsError as error:
        if refused is FileExistsError:
            raise
        raise refused(str(error)) from None
    return Path(target).absolute()


def read_saved_json(
    directory: Path, marker: str, *, what: str, expected_format: str, refused: type[Exception]
) -> dict[str, Any]:
    """The JSON object in ``directory / marker`` of a directory written as ``what`` (e.g.
    a saved agent) whose ``"format"`` is ``expected_format``.

    Raises:
        refused: naming the file when it is missing, not JSON, or of another format.
    """
    file = directory / marker
    try:
        saved = json.loads(file.read_text())
    except FileNotFoundError:
        raise refused(f"{file}: missing; {directory} is not {what}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise refused(f"{file}: not valid JSON ({error})") from None
    if not isinstance(saved, dict) or saved.get("format") != expected_format:
        found = saved.get("format") if isinstance(saved, dict) else None
        raise refused(f"{file}: format {found!r}; this version reads {expected_format!r}")
    return saved


def read_saved_tree(file: Path, restore: Callable[[bytes], Any], refused: type[Exception]) -> Any:
    """``restore(bytes of file)``: arrays saved beside a JSON record, read back into the
    structure the record describes.

    Raises:
        refused: naming ``file`` when it is missing or does not fit the structure.
    """
    try:
        return restore(file.read_bytes())
    except FileNotFoundError:
        raise refused(f"{file}: missing") from None
    except (ValueError, KeyError, TypeError) as error:
        raise refused(f"{file}: does not match the saved configuration ({error})") from None


def write_bytes_atomic(
    target: str | os.PathLike[str], data: bytes, *, overwrite: bool = True
) -> Path:
    """Writes ``data`` to ``target`` atomically (readers see the old or the new file)."""
    with atomic_file(target, overwrite=overwrite) as staging:
        staging.write_bytes(data)
    return Path(target)


def _exists(target: Path) -> FileExistsError:
    return FileExistsError(
        f"{target}: already exists; pass --overwrite (overwrite=True from Python) to replace it"
    )


def write_text_atomic(target: str | os.PathLike[str], text: str, *, overwrite: bool = True) -> Path:
    """Writes ``text`` (UTF-8) to ``target`` atomically."""
    return write_bytes_atomic(target, text.encode("utf-8"), overwrite=overwrite)


def write_json_atomic(
    target: str | os.PathLike[str], value: Any, *, overwrite: bool = True, indent: int = 2
) -> Path:
    """Writes ``value`` as JSON to ``target`` atomically (NumPy and paths converted)."""
    return write_text_atomic(
        target, json.dumps(value, indent=indent, default=json_default) + "\n", overwrite=overwrite
    )


def remove_stale_staging(directory: str | os.PathLike[str], *, older_than: float = 3600.0) -> int:
    """Removes the hidden staging siblings (``.<name>.*.tmp``) that a process killed in
    the middle of an atomic write left in ``directory``, if older than ``older_than``
    seconds (a younger one may belong to a writer that is still running).

    Returns:
        How many were removed.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return 0
    removed = 0
    now = time.time()
    for entry in directory.iterdir():
        if not (entry.name.startswith(".") and entry.name.endswith(STAGING_SUFFIX)):
            continue
        try:
            if now - entry.lstat().st_mtime < older_than:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed += 1
        except FileNotFoundError:
            continue
    return removed


# ----- JSON ----------------------------------------------------------------------------
def json_default(value: Any) -> Any:
    """``json.dumps(..., default=json_default)``: NumPy arrays and scalars, tuples,
    sets, paths and dataclasses as JSON data; anything else by its ``str``."""
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "shape") and hasattr(value, "tolist"):  # JAX arrays
        return np.asarray(value).tolist()
    return str(value)


def to_json_data(value: Any, *, where: str = "value", strict: bool = False) -> Any:
    """``value`` as plain JSON data (dicts, lists, str, int, float, bool, None).

    Args:
        value: nested mappings, sequences, NumPy/JAX values, paths, dataclasses.
        where: the name used in error messages (``metadata``).
        strict: refuse NaN and infinity, non-string keys and objects that are not data
            (instead of converting them), naming the entry.

    Raises:
        ValueError: with ``strict``, naming the offending entry.
    """
    if isinstance(value, np.generic) and value.ndim == 0:
        value = value.item()
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        if strict and not math.isfinite(value):
            raise ValueError(f"{where}: {value} is not valid JSON; store null or a string instead")
        return value
    if isinstance(value, Mapping):
        plain = {}
        for key, item in value.items():
            if not isinstance(key, str):
                if strict:
                    raise ValueError(f"{where}: keys must be strings, got {key!r}")
                key = str(key)
            plain[key] = to_json_data(item, where=f"{where}[{key!r}]", strict=strict)
        return plain
    if isinstance(value, list | tuple):
        return [
            to_json_data(item, where=f"{where}[{i}]", strict=strict) for i, item in enumerate(value)
        ]
    if isinstance(value, np.ndarray) and not strict:
        return to_json_data(value.tolist(), where=where)
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and not strict:
        return to_json_data(dataclasses.asdict(value), where=where)
    if isinstance(value, os.PathLike) and not strict:
        return os.fspath(value)
    if strict:
        hint = " (convert arrays with .tolist())" if hasattr(value, "shape") else ""
        if dataclasses.is_dataclass(value):
            hint = " (convert dataclasses with dataclasses.asdict)"
        raise ValueError(f"{where}: {type(value).__name__} is not JSON data{hint}")
    return to_json_data(json_default(value), where=where)


# ----- YAML ----------------------------------------------------------------------------
class YamlError(ValueError):
    """A YAML document that cannot be read: names the source and, where known, the line."""


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader without anchors and aliases.

    Aliases are what makes a "billion laughs" document: nested aliases that expand to
    gigabytes from a few hundred bytes. Configuration files do not need them.
    """

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None,
                None,
                "aliases (*name) are not accepted; write the value out",
                event.start_mark,
            )
        event = self.peek_event()
        if getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None,
                None,
                "anchors (&name) are not accepted; write the value out",
                event.start_mark,
            )
        return super().compose_node(parent, index)


def load_yaml_text(text: str, source: str = "YAML") -> Any:
    """Parses one YAML document safely (no Python objects, no aliases, at most
    :data:`MAX_YAML_BYTES`).

    Raises:
        YamlError: naming ``source`` and the line, for invalid YAML, aliases, a document
            too large or too deeply nested.
    """
    if len(text.encode("utf-8", errors="replace")) > MAX_YAML_BYTES:
        raise YamlError(f"{source}: larger than {MAX_YAML_BYTES} bytes; not read")
    try:
        return yaml.load(text, Loader=_NoAliasLoader)
    except yaml.YAMLError as error:
        raise YamlError(f"{source}: not valid YAML: {error}") from None
    except RecursionError:
        raise YamlError(f"{source}: nested too deeply to read") from None


def read_yaml(path: str | os.PathLike[str], *, what: str = "file") -> Any:
    """Reads and parses a YAML file (see :func:`load_yaml_text`).

    Raises:
        YamlError: naming the file, for a missing or unreadable file or bad YAML.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_YAML_BYTES:
            raise YamlError(f"{path}: larger than {MAX_YAML_BYTES} bytes; not read")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise YamlError(f"{path}: cannot read the {what}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise YamlError(f"{path}: cannot read the {what}: {error}") from None
    return load_yaml_text(text, str(path))


def dump_yaml(value: Any) -> str:
    """``value`` as block-style YAML, keys in their order."""
    return yaml.safe_dump(to_json_data(value), sort_keys=False)


def file_kind(mode: int) -> str:
    """What a ``st_mode`` that is not a regular file names, in words (``FIFO``,
    ``directory``, ``symbolic link``, ...): the one wording of every "not a regular file"
    refusal."""
    for test, name in (
        (stat.S_ISLNK, "symbolic link"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return name
    return "special file"
