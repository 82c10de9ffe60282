"""The files of an audit log on disk: the writer lock beside the log (and claims on it
taken before the log is opened), and reading a file's first and last lines, its line count
and the anchor without reading records whole."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from pathlib import Path
from typing import Any

from neorl_industrial.integration.safety.audit_records import AuditLogError, parse_json

TAIL_CHUNK = 1 << 16

#: Writer locks this process took before opening their logs (:func:`claim`), by the lock
#: file's resolved path; the :class:`AuditLog` opened on the log takes its claim over.
_claims: dict[str, int] = {}
_claims_guard = threading.Lock()


def lock_file(path: Path) -> Path:
    return path.with_name(f"{path.name}.lock")


def take_lock(path: Path) -> int:
    """The writer lock of the log at ``path``, held by this process from now on.

    Raises:
        AuditLogError: another process holds it (naming its pid).
    """
    lock = lock_file(path)
    descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(descriptor, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(descriptor)
        raise AuditLogError(
            f"audit log {path}: held by another process (pid {holder}, lock {lock}); "
            "two writers would interleave and break the hash chain: stop that process "
            "or give this one another audit log"
        ) from None
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
    return descriptor


def claim(path: str | os.PathLike[str]) -> None:
    """Takes the writer lock of the log at ``path`` now, before a long start (a server
    loads and compiles its policy for a minute or more): a log another process holds is
    refused at once, not after the loading. The :class:`AuditLog` this process opens on
    ``path`` later takes the claim over; claiming a log twice is claiming it once.

    Raises:
        AuditLogError: another process holds the log.
        OSError: its directory or lock file cannot be created.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = str(lock_file(path).resolve())
    with _claims_guard:
        if key not in _claims:
            _claims[key] = take_lock(path)


def release_claim(path: str | os.PathLike[str]) -> bool:
    """Releases a :func:`claim` no :class:`AuditLog` took over (a start that failed);
    whether there was one."""
    key = str(lock_file(Path(path)).resolve())
    with _claims_guard:
        descriptor = _claims.pop(key, None)
    if descriptor is None:
        return False
    release_lock(descriptor)
    return True


def take_over_claim(path: Path) -> int:
    """The writer lock of the log at ``path``: the :func:`claim` this process took on it,
    or a lock taken now.

    Raises:
        AuditLogError: another process holds it.
    """
    key = str(lock_file(path).resolve())
    with _claims_guard:
        claimed = _claims.pop(key, None)
    return claimed if claimed is not None else take_lock(path)


def release_lock(descriptor: int) -> None:
    """Releases a writer lock and closes its descriptor (errors ignored)."""
    with contextlib.suppress(OSError):
        fcntl.flock(descriptor, fcntl.LOCK_UN)
        os.close(descriptor)


def last_line(handle: Any, size: int) -> tuple[int, bytes]:
    """The offset and bytes of the file's last line (with its newline, if any)."""
    end = size
    if end and (handle.seek(end - 1), handle.read(1))[1] == b"\n":
        end -= 1  # the newline that ends the last line belongs to it
    position, tail = end, b""
    while position > 0:
        step = min(TAIL_CHUNK, position)
        position -= step
        handle.seek(position)
        tail = handle.read(step) + tail
        cut = tail.rfind(b"\n")
        if cut >= 0:
            start = position + cut + 1
            break
    else:
        start = 0
    handle.seek(start)
    return start, handle.read(size - start)


def first_record(path: Path) -> dict[str, Any] | None:
    """The file's first line as a record (``None``: empty, missing or not a record)."""
    try:
        with open(path, "rb") as handle:
            line = handle.readline()
        record = parse_json(line) if line.strip() else None
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def count_lines(path: Path) -> int:
    count = 0
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            count += block.count(b"\n")
    return count


def read_anchor(path: Path) -> dict[str, Any] | None:
    try:
        anchor = parse_json(path.read_bytes() or b"null")
    except (OSError, ValueError):
        return None
    return anchor if isinstance(anchor, dict) else None
