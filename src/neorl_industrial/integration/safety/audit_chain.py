"""Verifying an audit log whole: every kept file (the archive, the rotated files, the
current one) as one hash chain, their headers in order with no file missing, and the
chain's end against the anchor beside the log (and a head hash kept elsewhere)."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from neorl_industrial.integration.safety.audit_files import first_record, read_anchor
from neorl_industrial.integration.safety.audit_records import (
    GENESIS,
    AuditLogError,
    is_header,
    parse_json,
    record_hash,
)


@dataclasses.dataclass(frozen=True)
class ChainCheck:
    """What :func:`check_chain` found.

    Attributes:
        ok: the whole log is intact.
        records: records checked before the first bad one (all of them when intact).
        head: the hash of the last record checked (the chain's head when intact).
        message: the first bad place (file and line) and what is wrong; ``None`` if ok.
        files: the files checked, oldest first.
        notes: facts that are not failures (records written after the anchor's update).
    """

    ok: bool
    records: int
    head: str
    message: str | None
    files: tuple[str, ...]
    notes: tuple[str, ...] = ()


@dataclasses.dataclass
class ChainState:
    previous: str | None
    sequence: int | None
    records: int = 0
    file: int | None = None
    file_records: int = 0
    previous_file_records: int | None = None  # None: the first file checked
    seen_anchor: bool = False
    # Where the beside-the-log anchor's head was found: (file, records up to it, sequence).
    seen_head_at: tuple[int | None, int, int] | None = None


def chain_files(path: Path) -> list[Path]:
    """The archive (by file number), the rotated files (oldest first), the current file."""
    archive = path.with_name(f"{path.name}.archive")
    numbered = re.compile(re.escape(path.name) + r"\.(\d+)")
    archived = []
    if archive.is_dir():
        archived = sorted(
            (int(m.group(1)), p) for p in archive.iterdir() if (m := numbered.fullmatch(p.name))
        )
    rotated = sorted(
        ((int(m.group(1)), p) for p in path.parent.iterdir() if (m := numbered.fullmatch(p.name))),
        reverse=True,
    )
    files = [p for _, p in archived] + [p for _, p in rotated]
    if path.exists():
        files.append(path)
    return files


def numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    with open(path, encoding="utf-8", errors="surrogateescape") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                yield number, line


def _header_problem(
    record: dict[str, Any], number: int, expected: int, state: ChainState
) -> str | None:
    """What is wrong with a file's first record as its header (None: a header declaring
    file ``expected`` that counts the previous file's records right)."""
    if not is_header(record):
        return (
            f"line {number}: not a file header (the head of the file was cut, or it "
            "was written by another program)"
        )
    declared = record["file"]
    if declared != expected:
        if declared > expected:
            missing = (
                f"file {expected} is"
                if declared == expected + 1
                else f"files {expected} to {declared - 1} are"
            )
            return (
                f"is file {declared}, expected file {expected}: {missing} missing "
                "(deleted, or renamed out of order)"
            )
        return f"is file {declared}, expected file {expected}: files out of order"
    held = state.previous_file_records
    if held is not None and record.get("previous_records") != held:
        return (
            f"line {number}: the previous file held {record.get('previous_records')} "
            f"records, {held} were found in it"
        )
    return None


def verify_file(
    path: Path,
    state: ChainState,
    *,
    expect_header: int | None,
    anchor: str | None = None,
    head: str | None = None,
) -> str | None:
    """Checks one file, continuing ``state``; the message of the first bad line or None.

    ``expect_header``: the file number its first record must declare (None: no header
    needed). ``anchor``: a hash to look for; ``head``: the beside-the-log anchor's head."""
    first = True
    state.file_records = 0
    for number, line in numbered_lines(path):
        try:
            record = parse_json(line)
        except ValueError as error:
            return f"line {number}: not valid JSON ({error})"
        if not isinstance(record, dict):
            return f"line {number}: not a record"
        if first and expect_header is not None:
            problem = _header_problem(record, number, expect_header, state)
            if problem is not None:
                return problem
        first = False
        if state.previous is not None and record.get("prev_hash") != state.previous:
            return (
                f"line {number}: breaks the chain (a record before it was changed, removed or "
                "moved, or the end of the previous file was cut)"
            )
        try:
            matches = record_hash(record) == record.get("hash")
        except (RecursionError, ValueError, TypeError):
            matches = False  # nested too deeply to hash: no record the log wrote
        if not matches:
            return f"line {number}: the content does not match its hash"
        sequence = record.get("sequence")
        if not isinstance(sequence, int) or state.sequence not in (None, sequence):
            return f"line {number}: sequence {sequence!r}, expected {state.sequence}"
        if record.get("kind") == "gap":
            return f"line {number}: records were lost before it ({record.get('reason')})"
        state.sequence = sequence + 1
        state.previous = record["hash"]
        state.records += 1
        state.file_records += 1
        if anchor is not None and record["hash"] == anchor:
            state.seen_anchor = True
        if head is not None and record["hash"] == head:
            state.seen_head_at = (expect_header, state.records, sequence)
    if first and expect_header is not None:
        return "empty: no file header"
    return None


def _files_from(files: list[Path], since_file: int) -> list[Path]:
    """The files numbered ``since_file`` or later (files without a header included).

    Raises:
        AuditLogError: none is (a usage error, not a broken log: nothing was checked).
    """
    kept, numbers = [], []
    for file in files:
        header = first_record(file)
        if is_header(header):
            numbers.append(header["file"])
        if since_file and is_header(header) and header["file"] < since_file:
            continue  # shipped off on purpose: only files from since_file on are checked
        kept.append(file)
    if not kept:
        held = f"files {min(numbers)} to {max(numbers)}" if numbers else "no numbered file"
        raise AuditLogError(
            f"since_file {since_file}: the log holds {held}, none from file {since_file} on; "
            "pass the number of the oldest file kept (0 when none was shipped elsewhere)"
        )
    return kept


def _anchor_problem(
    path: Path, state: ChainState, beside: dict[str, Any] | None, anchor: str | None
) -> str | None:
    """What is wrong with the checked chain's end against the anchor beside the log
    (``beside``) and the head hash kept elsewhere (``anchor``); None: nothing."""
    if beside is None:
        return (
            f"{path.name}.anchor: missing or unreadable; without it records cut from the end "
            "cannot be detected"
        )
    if state.seen_head_at is None:
        return (
            f"{path.name}: ends at sequence {state.sequence} (head {(state.previous or '')[:16]}), "
            f"its anchor at sequence {beside.get('sequence')} (head "
            f"{str(beside.get('head'))[:16]}): records were cut from the end or rewritten"
        )
    head_file, _, head_sequence = state.seen_head_at
    if beside.get("file") != head_file or beside.get("sequence") != head_sequence + 1:
        return (
            f"{path.name}.anchor: names file {beside.get('file')} and sequence "
            f"{beside.get('sequence')}, its head is record {head_sequence} of file "
            f"{head_file}: the anchor was edited, or files were removed or renamed"
        )
    if anchor is not None and not state.seen_anchor:
        return (
            f"anchor {anchor[:16]}... is not a record of this log: it was cut before that "
            "record or rewritten"
        )
    return None


def check_chain(
    path: str | os.PathLike[str], *, anchor: str | None = None, since_file: int = 0
) -> ChainCheck:
    """Verifies an audit log whole: every kept file (archive, rotated, current), their
    headers in order with no file missing, the chain across them, and its end against the
    anchor beside the log.

    Args:
        path: the log (``audit.jsonl``).
        anchor: a head hash kept elsewhere (printed by an earlier verification): it must be
            a record of the chain, or the log was cut before it or rewritten.
        since_file: the oldest file that must be present (files before it were shipped
            elsewhere and deleted on purpose); its first record may continue any chain.

    Returns:
        the :class:`ChainCheck`.
    """
    path = Path(path)
    files = chain_files(path)
    names = tuple(str(file) for file in files)
    if since_file < 0:
        raise ValueError(f"since_file: expected a file number >= 0, got {since_file}")
    state = ChainState(GENESIS if since_file == 0 else None, 0 if since_file == 0 else None)
    beside = read_anchor(path.with_name(f"{path.name}.anchor"))

    def failed(message: str) -> ChainCheck:
        return ChainCheck(False, state.records, state.previous or GENESIS, message, names)

    if not path.exists():
        return failed(f"{path}: no such audit log")
    kept = _files_from(files, since_file)
    expected = since_file
    head = beside.get("head") if beside else None
    for index, file in enumerate(kept):
        state.previous_file_records = state.file_records if index else None
        message = verify_file(file, state, expect_header=expected, anchor=anchor, head=head)
        if message is not None:
            return failed(f"{file.name}: {message}")
        state.file = expected
        expected += 1
    problem = _anchor_problem(path, state, beside, anchor)
    if problem is not None:
        return failed(problem)
    notes = []
    head_records = state.seen_head_at[1]
    if head_records < state.records:
        # A process stopped between a write and the anchor's update (a rotation included).
        notes.append(
            f"{state.records - head_records} records after the anchor (written when the "
            "process stopped before updating it)"
        )
    return ChainCheck(True, state.records, state.previous or GENESIS, None, names, tuple(notes))
