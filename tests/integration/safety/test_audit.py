"""AuditLog: override records, the hash chain, file headers, crash recovery, resumption,
rotation into the archive, the writer's lock and the check a reload runs."""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import logging
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from neorl_industrial.core.environments import make
from neorl_industrial.core.safety import shield
from neorl_industrial.integration.safety import GENESIS, AuditLog, AuditLogError, ShieldOutcome
from neorl_industrial.integration.safety.audit import check_chain
from neorl_industrial.integration.safety.audit_records import FLAGS

ENV, _ = make("IB-v0")
CONSTRAINTS = ENV.compile_constraints()
NAMES = CONSTRAINTS.names
OBSERVATIONS = np.zeros((4, ENV.observation_size), np.float32)
# Overridden: row 0 (projected) and row 2 (NaN, fallback); rows 1 and 3 pass.
PROPOSED = np.array([[2, 0, 0], [0, 0, 0], [np.nan, 0, 0], [-1, 1, 0]], np.float32)


def _strict(line: str):
    def reject(constant: str):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(line, parse_constant=reject)


@functools.cache
def _shielded():
    return shield(CONSTRAINTS, OBSERVATIONS, PROPOSED, np.zeros((4, 3), np.float32))


def _write(log: AuditLog, request_ids=("a", "b", "c", "d")) -> int:
    applied, report = _shielded()
    return log.write_overrides(
        OBSERVATIONS, PROPOSED, applied, report, NAMES, request_ids=list(request_ids)
    )


def _overrides(path) -> list[dict]:
    return [r for r in AuditLog.read(path) if r["kind"] == "override"]


def _log_with_lines(path, batches: int = 2) -> list[str]:
    with AuditLog(path, policy_version="v") as log:
        for _ in range(batches):
            _write(log)
    return path.read_text().splitlines(keepends=True)


def test_only_overridden_rows_are_written(tmp_path):
    path = tmp_path / "audit" / "overrides.jsonl"
    with AuditLog(path, policy_version="ib-policy@3") as log:
        assert _write(log) == 2
    header, *records = [_strict(line) for line in path.read_text().splitlines()]
    assert (header["kind"], header["file"], header["sequence"]) == ("file", 0, 0)
    assert header["prev_hash"] == GENESIS
    assert [r["request_id"] for r in records] == ["a", "c"]
    assert [r["sequence"] for r in records] == [1, 2]
    first, second = records
    assert first["policy_version"] == "ib-policy@3" and first["kind"] == "override"
    assert first["violated"] == [
        "bounds/velocity",
        "rate/velocity",
        "limit-joint-velocity-gain-push",
    ]
    assert first["proposed"] == [2.0, 0.0, 0.0] and first["applied"][0] == pytest.approx(1.0)
    assert (first["projected"], first["fallback"], first["infeasible"]) == (True, False, False)
    # The projection keeps every constraint; the fallback for a NaN proposal too.
    assert first["violated_after"] == [] and second["violated_after"] == []
    assert first["out_of_distribution"] is False
    assert first["observation"] == [0.0] * ENV.observation_size
    assert first["timestamp"].endswith("+00:00")
    assert first["prev_hash"] == header["hash"] and second["prev_hash"] == first["hash"]
    assert len(first["hash"]) == 64
    assert (second["fallback"], second["invalid"]) == (True, True)
    assert AuditLog.read(path)[1:] == records
    assert AuditLog.verify(path) == (True, 3, None)
    assert check_chain(path).ok


def test_the_deciding_version_and_the_key_are_written(tmp_path):
    path = tmp_path / "log.jsonl"
    applied, report = _shielded()
    with AuditLog(path, policy_version="at-open") as log:
        log.write_overrides(
            OBSERVATIONS,
            PROPOSED,
            applied,
            report,
            NAMES,
            ["r0", "r1", "r2", "r3"],
            policy_version="v2",
            key="k1",
        )
    records = _overrides(path)
    assert {(r["policy_version"], r["key"]) for r in records} == {("v2", "k1")}


def test_another_writer_s_record_is_chained_and_may_not_set_the_chain_s_fields(tmp_path):
    path = tmp_path / "log.jsonl"
    with AuditLog(path, policy_version="at-open") as log:
        written = log.append({"kind": "write", "nodes": ["ns=2;s=valve"]}, "v3")
        with pytest.raises(AuditLogError, match=r"chain's fields \['hash', 'sequence'\]"):
            log.append({"kind": "write", "sequence": 0, "hash": "x"})
        with pytest.raises(AuditLogError, match="needs a 'kind'"):
            log.append({"nodes": []})
        assert log.last_hash == written["hash"]
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["kind"] for r in records][-1] == "write"
    assert records[-1]["policy_version"] == "v3" and records[-1]["nodes"] == ["ns=2;s=valve"]
    assert check_chain(path).ok


def test_non_finite_numbers_are_strings(tmp_path):
    path = tmp_path / "log.jsonl"
    with AuditLog(path, policy_version="v") as log:
        log.record(
            observation=[np.inf, -np.inf, 1.5],
            proposed=np.array([np.nan, 0.0], np.float32),
            applied=[0.0, 0.0],
            violated=["bounds/velocity"],
            request_id="r",
            outcome=ShieldOutcome(fallback=True),
        )
    _, line = path.read_text().splitlines()
    record = _strict(line)
    assert record["observation"] == ["inf", "-inf", 1.5]
    assert record["proposed"] == ["nan", 0.0]
    assert record["fallback"] is True and record["violated_after"] is None
    assert not any(record[flag] for flag in FLAGS if flag != "fallback")
    assert AuditLog.verify(path) == (True, 2, None)


def test_a_single_record_holds_the_shields_outcome_as_override_rows_do(tmp_path):
    path = tmp_path / "log.jsonl"
    outcome = ShieldOutcome(violated_after=("bounds/velocity",), projected=True, infeasible=True)
    with AuditLog(path, policy_version="v") as log:
        written = log.record(
            observation=[0.0],
            proposed=[1.0],
            applied=[0.5],
            violated=["bounds/velocity", "rate"],
            outcome=outcome,
            key="k",
        )
    assert {field.name for field in dataclasses.fields(ShieldOutcome)} == {
        "violated_after",
        *FLAGS,
    }
    assert written["violated_after"] == ["bounds/velocity"]
    assert {flag: written[flag] for flag in FLAGS} == {
        flag: flag in ("projected", "infeasible") for flag in FLAGS
    }
    assert AuditLog.read(path)[-1] == written


def test_an_edited_field_is_found_by_line(tmp_path):
    path = tmp_path / "log.jsonl"
    lines = _log_with_lines(path)
    edited = json.loads(lines[3])
    edited["applied"][0] = 0.5
    lines[3] = json.dumps(edited) + "\n"
    path.write_text("".join(lines))
    ok, checked, message = AuditLog.verify(path)
    assert (ok, checked) == (False, 3)
    assert message.startswith("line 4:") and "hash" in message


def test_a_deleted_line_is_found(tmp_path):
    path = tmp_path / "log.jsonl"
    lines = _log_with_lines(path)
    path.write_text("".join(lines[:2] + lines[3:]))
    ok, checked, message = AuditLog.verify(path)
    assert (ok, checked) == (False, 2)
    assert message.startswith("line 3: breaks the chain")
    path.write_text("".join(lines[1:]))  # the header removed
    assert AuditLog.verify(path)[:2] == (False, 0)


def test_reordered_lines_are_found(tmp_path):
    path = tmp_path / "log.jsonl"
    lines = _log_with_lines(path)
    lines[1], lines[2] = lines[2], lines[1]
    path.write_text("".join(lines))
    ok, checked, message = AuditLog.verify(path)
    assert (ok, checked) == (False, 1) and message.startswith("line 2")


def test_reopening_continues_sequence_and_chain(tmp_path):
    path = tmp_path / "log.jsonl"
    with AuditLog(path, policy_version="v1") as log:
        _write(log)
        last = log.last_hash
    with AuditLog(path, policy_version="v2") as log:
        assert log.recovered_bytes == 0 and log.next_sequence == 3 and log.file_number == 0
        _write(log)
    records = AuditLog.read(path)
    assert [r["sequence"] for r in records] == [0, 1, 2, 3, 4]
    assert records[3]["prev_hash"] == last
    assert [r["policy_version"] for r in records[1:]] == ["v1", "v1", "v2", "v2"]
    assert AuditLog.verify(path) == (True, 5, None)
    assert check_chain(path).ok


@pytest.mark.parametrize(
    "torn",
    ['{"sequence":3,"timest', '{"sequence": 3, "broken\n'],
    ids=["no-newline", "invalid-json"],
)
def test_a_torn_tail_is_cut_logged_and_kept_aside(tmp_path, torn, caplog):
    path = tmp_path / "log.jsonl"
    _log_with_lines(path, batches=1)
    size = path.stat().st_size
    with open(path, "a") as handle:
        handle.write(torn)
    assert not AuditLog.verify(path)[0]
    with (
        caplog.at_level(logging.WARNING, "neorl_industrial.audit"),
        AuditLog(path, policy_version="v") as log,
    ):
        assert log.recovered_bytes == len(torn.encode())
        assert log.stats()["torn_bytes"] == len(torn.encode())
        assert log.next_sequence == 3
        _write(log)
    (message,) = [r.getMessage() for r in caplog.records]
    assert str(path) in message and f"{len(torn.encode())} bytes at offset {size}" in message
    assert "log.jsonl.torn" in message
    (kept,) = [json.loads(line) for line in (tmp_path / "log.jsonl.torn").read_text().splitlines()]
    assert base64.b64decode(kept["base64"]) == torn.encode()
    assert (kept["file"], kept["offset"], kept["bytes"]) == ("log.jsonl", size, len(torn))
    assert (tmp_path / "log.jsonl.torn").stat().st_mode & 0o777 == 0o600
    assert AuditLog.verify(path) == (True, 5, None)
    assert check_chain(path).ok
    for line in path.read_text().splitlines():
        _strict(line)


def test_resuming_after_a_line_longer_than_the_read_chunk(tmp_path):
    path = tmp_path / "log.jsonl"
    long_observation = np.linspace(0.0, 1.0, 20_000)  # ~400 kB on one line
    with AuditLog(path, policy_version="v") as log:
        for _ in range(2):
            log.record(observation=long_observation, proposed=[1.0], applied=[0.0], violated=[])
    with open(path, "a") as handle:
        handle.write('{"torn": ')
    with AuditLog(path, policy_version="v") as log:
        assert log.recovered_bytes == len('{"torn": ') and log.next_sequence == 3
        log.record(observation=[0.0], proposed=[1.0], applied=[0.0], violated=[])
    assert AuditLog.verify(path) == (True, 4, None)


def test_a_corrupt_last_record_refuses_to_continue(tmp_path):
    path = tmp_path / "log.jsonl"
    lines = _log_with_lines(path, batches=1)
    record = json.loads(lines[-1])
    record["violated"] = []
    path.write_text("".join(lines[:-1]) + json.dumps(record) + "\n")
    with pytest.raises(AuditLogError, match="hash does not match"):
        AuditLog(path, policy_version="v")
    # The failed open released the lock: the log can be opened once it is repaired.
    path.write_text("".join(lines))
    AuditLog(path, policy_version="v").close()


def test_misaligned_arguments_are_rejected(tmp_path):
    applied, report = _shielded()
    with AuditLog(tmp_path / "log.jsonl", policy_version="v") as log:
        with pytest.raises(ValueError, match="observations"):
            log.write_overrides(OBSERVATIONS[:2], PROPOSED, applied, report, NAMES)
        with pytest.raises(ValueError, match="2 ids for 4 rows"):
            log.write_overrides(OBSERVATIONS, PROPOSED, applied, report, NAMES, ["a", "b"])
        with pytest.raises(ValueError, match="7 constraint columns"):
            log.write_overrides(OBSERVATIONS, PROPOSED, applied, report, NAMES[:2])
    assert [r["kind"] for r in AuditLog.read(tmp_path / "log.jsonl")] == ["file"]


def test_threads_share_one_log(tmp_path):
    path = tmp_path / "log.jsonl"
    with AuditLog(path, policy_version="v") as log:
        start = threading.Barrier(6)

        def work() -> None:
            start.wait()
            for _ in range(20):
                _write(log)

        threads = [threading.Thread(target=work) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    records = AuditLog.read(path)[1:]
    assert AuditLog.verify(path) == (True, 1 + 6 * 20 * 2, None)
    # A batch's records stay together.
    assert all(records[i]["request_id"] == "a" for i in range(0, len(records), 2))


# ----- the writer's lock -------------------------------------------------------------------
def test_a_second_writer_in_the_same_process_is_refused(tmp_path):
    path = tmp_path / "log.jsonl"
    with AuditLog(path, policy_version="v") as log:
        with pytest.raises(AuditLogError) as refused:
            AuditLog(path, policy_version="v")
        message = str(refused.value)
        assert str(path) in message and f"pid {os.getpid()}" in message
        assert "break the hash chain" in message
        _write(log)  # the holder goes on
    AuditLog(path, policy_version="v").close()  # released on close
    assert check_chain(path).ok


def test_a_log_held_by_another_process_is_refused_naming_its_pid(tmp_path):
    path = tmp_path / "log.jsonl"
    lock = tmp_path / "log.jsonl.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "os.write(fd, f'{os.getpid()}\\n'.encode())\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(AuditLogError, match=f"pid {holder.pid}, lock {lock}"):
            AuditLog(path, policy_version="v")
        assert not path.exists() or path.stat().st_size == 0  # nothing written
    finally:
        holder.stdin.close()
        holder.wait(10)
    AuditLog(path, policy_version="v").close()  # the holder exited: free


# ----- the check a reload runs --------------------------------------------------------------
def test_check_finds_a_moved_or_changed_log(tmp_path):
    path = tmp_path / "log.jsonl"
    with AuditLog(path, policy_version="v") as log:
        log.check()
        _write(log)
        log.check()
        with open(path, "a") as handle:
            handle.write("{}\n")
        with pytest.raises(AuditLogError, match="another writer changed it"):
            log.check()
    with AuditLog(tmp_path / "other.jsonl", policy_version="v") as log:
        (tmp_path / "other.jsonl").rename(tmp_path / "moved.jsonl")
        with pytest.raises(AuditLogError, match="moved, replaced or deleted"):
            log.check()


# ----- rotation and the archive -------------------------------------------------------------
def test_rotation_keeps_the_chain_and_archives_instead_of_deleting(tmp_path, caplog):
    path = tmp_path / "audit.jsonl"
    with (
        caplog.at_level(logging.WARNING, "neorl_industrial.audit"),
        AuditLog(path, policy_version="v", max_bytes=2000, backups=3) as log,
    ):
        for _ in range(10):
            _write(log)  # two records per batch, ~600 bytes each
        last = log.last_hash
        stats = log.stats()
    rotated = sorted(p.name for p in tmp_path.glob("audit.jsonl.[0-9]*"))
    assert rotated == ["audit.jsonl.1", "audit.jsonl.2", "audit.jsonl.3"]
    archived = sorted(p.name for p in (tmp_path / "audit.jsonl.archive").iterdir())
    assert archived and archived[0] == "audit.jsonl.000000"
    assert stats["archived_files"] == len(archived) and stats["archived_records"] > 0
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == len(archived) and "moved file 0 (" in warnings[0]
    every = [path, *(tmp_path / n for n in rotated)]
    every += [tmp_path / "audit.jsonl.archive" / n for n in archived]
    assert all(p.stat().st_size <= 2000 for p in every)
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in every)
    check = check_chain(path)
    assert check.ok and check.message is None and check.head == last
    headers = [
        AuditLog.read(p)[0] for p in sorted(every, key=lambda p: AuditLog.read(p)[0]["file"])
    ]
    assert [h["file"] for h in headers] == list(range(len(every)))
    overrides = sum(len(_overrides(p)) for p in every)
    assert overrides == 20 and check.records == overrides + len(every)
    # Each file starts where the one before ended.
    first = AuditLog.read(path)[0]
    assert first["prev_hash"] == AuditLog.read(tmp_path / "audit.jsonl.1")[-1]["hash"]
    assert first["previous_records"] == len(AuditLog.read(tmp_path / "audit.jsonl.1"))
    assert AuditLog.verify(path)[0] is False
    assert AuditLog.verify(path, previous_hash=first["prev_hash"])[0] is True
    # Reopening continues the chain in the current file.
    with AuditLog(path, policy_version="v", max_bytes=2000, backups=3) as log:
        assert log.last_hash == last and log.file_number == first["file"]
        _write(log)
    assert check_chain(path).ok


def test_restart_right_after_rotation_chains_on_from_the_rotated_file(tmp_path):
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, policy_version="v") as log:
        _write(log)
        last = log.last_hash
    path.rename(tmp_path / "audit.jsonl.1")  # stopped between the rename and the header
    path.touch()
    with AuditLog(path, policy_version="v", max_bytes=100_000, backups=2) as log:
        assert log.file_number == 1 and log.next_sequence == 4
        _write(log)
    header = AuditLog.read(path)[0]
    assert (header["file"], header["prev_hash"], header["previous_records"]) == (1, last, 3)
    assert check_chain(path).ok and check_chain(path).records == 6


def test_a_rate_limit_without_a_window_is_refused(tmp_path):
    with pytest.raises(ValueError, match="needs an aggregation window"):
        AuditLog(tmp_path / "log.jsonl", policy_version="v", key_rate=5.0)


def test_archiving_never_replaces_a_file_the_archive_holds(tmp_path, caplog):
    path = tmp_path / "audit.jsonl"
    archive = tmp_path / "audit.jsonl.archive"
    archive.mkdir()
    (archive / "audit.jsonl.000000").write_text("kept\n")
    with (
        caplog.at_level(logging.ERROR, "neorl_industrial.audit"),
        AuditLog(path, policy_version="v", max_bytes=3000, backups=1) as log,
    ):
        for _ in range(3):
            _write(log)  # file 0 goes to the archive at the second rotation
    assert (archive / "audit.jsonl.000000").read_text() == "kept\n"
    (moved,) = archive.glob("audit.jsonl.000000.duplicate-*")
    assert AuditLog.read(moved)[0]["file"] == 0
    assert "already holds file 0" in caplog.records[0].getMessage()
