"""AuditLog: override records, the hash chain, crash recovery and resumption."""

from __future__ import annotations

import functools
import json
import threading

import numpy as np
import pytest

from neorl_industrial.core.environments import make
from neorl_industrial.core.safety import shield
from neorl_industrial.integration.safety import GENESIS, AuditLog, AuditLogError

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


def _log_with_lines(path, batches: int = 2) -> list[str]:
    with AuditLog(path, policy_version="v") as log:
        for _ in range(batches):
            _write(log)
    return path.read_text().splitlines(keepends=True)


def test_only_overridden_rows_are_written(tmp_path):
    path = tmp_path / "audit" / "overrides.jsonl"
    with AuditLog(path, policy_version="ib-policy@3") as log:
        assert _write(log) == 2
    records = [_strict(line) for line in path.read_text().splitlines()]
    assert [r["request_id"] for r in records] == ["a", "c"]
    assert [r["sequence"] for r in records] == [0, 1]
    first, second = records
    assert first["policy_version"] == "ib-policy@3"
    assert first["violated"] == [
        "bounds/velocity",
        "rate/velocity",
        "limit-joint-velocity-gain-push",
    ]
    assert first["proposed"] == [2.0, 0.0, 0.0] and first["applied"][0] == pytest.approx(1.0)
    assert (first["projected"], first["fallback"], first["infeasible"]) == (True, False, False)
    assert first["observation"] == [0.0] * ENV.observation_size
    assert first["timestamp"].endswith("+00:00")
    assert first["prev_hash"] == GENESIS and second["prev_hash"] == first["hash"]
    assert len(first["hash"]) == 64
    assert (second["fallback"], second["invalid"]) == (True, True)
    assert AuditLog.read(path) == records
    assert AuditLog.verify(path) == (True, 2, None)


def test_non_finite_numbers_are_strings(tmp_path):
    path = tmp_path / "log.jsonl"
    with AuditLog(path, policy_version="v") as log:
        log.record(
            observation=[np.inf, -np.inf, 1.5],
            proposed=np.array([np.nan, 0.0], np.float32),
            applied=[0.0, 0.0],
            violated=["bounds/velocity"],
            request_id="r",
            fallback=True,
        )
    (line,) = path.read_text().splitlines()
    record = _strict(line)
    assert record["observation"] == ["inf", "-inf", 1.5]
    assert record["proposed"] == ["nan", 0.0]
    assert AuditLog.verify(path) == (True, 1, None)


def test_an_edited_field_is_found_by_line(tmp_path):
    path = tmp_path / "log.jsonl"
    lines = _log_with_lines(path)
    edited = json.loads(lines[2])
    edited["applied"][0] = 0.5
    lines[2] = json.dumps(edited) + "\n"
    path.write_text("".join(lines))
    ok, checked, message = AuditLog.verify(path)
    assert (ok, checked) == (False, 2)
    assert message.startswith("line 3:") and "hash" in message


def test_a_deleted_line_is_found(tmp_path):
    path = tmp_path / "log.jsonl"
    lines = _log_with_lines(path)
    path.write_text("".join(lines[:1] + lines[2:]))
    ok, checked, message = AuditLog.verify(path)
    assert (ok, checked) == (False, 1)
    assert message.startswith("line 2: breaks the chain")
    path.write_text("".join(lines[1:]))  # the first record removed
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
        assert log.recovered_bytes == 0 and log.next_sequence == 2
        _write(log)
    records = AuditLog.read(path)
    assert [r["sequence"] for r in records] == [0, 1, 2, 3]
    assert records[2]["prev_hash"] == last
    assert [r["policy_version"] for r in records] == ["v1", "v1", "v2", "v2"]
    assert AuditLog.verify(path) == (True, 4, None)


@pytest.mark.parametrize(
    "torn",
    ['{"sequence":2,"timest', '{"sequence": 2, "broken\n'],
    ids=["no-newline", "invalid-json"],
)
def test_a_torn_tail_is_cut_and_the_chain_continues(tmp_path, torn):
    path = tmp_path / "log.jsonl"
    _log_with_lines(path, batches=1)
    with open(path, "a") as handle:
        handle.write(torn)
    assert not AuditLog.verify(path)[0]
    with AuditLog(path, policy_version="v") as log:
        assert log.recovered_bytes == len(torn.encode())
        assert log.next_sequence == 2
        _write(log)
    assert AuditLog.verify(path) == (True, 4, None)
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
        assert log.recovered_bytes == len('{"torn": ') and log.next_sequence == 2
        log.record(observation=[0.0], proposed=[1.0], applied=[0.0], violated=[])
    assert AuditLog.verify(path) == (True, 3, None)


def test_a_corrupt_last_record_refuses_to_continue(tmp_path):
    path = tmp_path / "log.jsonl"
    lines = _log_with_lines(path, batches=1)
    record = json.loads(lines[-1])
    record["violated"] = []
    path.write_text(lines[0] + json.dumps(record) + "\n")
    with pytest.raises(AuditLogError, match="hash does not match"):
        AuditLog(path, policy_version="v")


def test_misaligned_arguments_are_rejected(tmp_path):
    applied, report = _shielded()
    with AuditLog(tmp_path / "log.jsonl", policy_version="v") as log:
        with pytest.raises(ValueError, match="observations"):
            log.write_overrides(OBSERVATIONS[:2], PROPOSED, applied, report, NAMES)
        with pytest.raises(ValueError, match="2 ids for 4 rows"):
            log.write_overrides(OBSERVATIONS, PROPOSED, applied, report, NAMES, ["a", "b"])
        with pytest.raises(ValueError, match="7 constraint columns"):
            log.write_overrides(OBSERVATIONS, PROPOSED, applied, report, NAMES[:2])
    assert (tmp_path / "log.jsonl").read_text() == ""


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
    records = AuditLog.read(path)
    assert AuditLog.verify(path) == (True, 6 * 20 * 2, None)
    # A batch's records stay together.
    assert all(records[i]["request_id"] == "a" for i in range(0, len(records), 2))


def test_rotation_by_size_keeps_the_chain_verifiable(tmp_path):
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, policy_version="v", max_bytes=2000, backups=3) as log:
        for _ in range(10):
            _write(log)  # two records per batch, ~600 bytes each
        last = log.last_hash
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2", "audit.jsonl.3"]
    assert all((tmp_path / name).stat().st_size <= 2000 for name in files)
    assert all((tmp_path / name).stat().st_mode & 0o777 == 0o600 for name in files)
    ok, checked, message = AuditLog.verify_rotated(path)
    assert ok and message is None
    kept = [r for name in reversed(files[1:]) for r in AuditLog.read(tmp_path / name)]
    kept += AuditLog.read(path)
    assert checked == len(kept) and kept[-1]["hash"] == last and kept[-1]["sequence"] == 19
    # Each file starts where the one before ended; the current one alone needs that anchor.
    first = AuditLog.read(path)[0]
    assert first["prev_hash"] == AuditLog.read(tmp_path / "audit.jsonl.1")[-1]["hash"]
    assert AuditLog.verify(path)[0] is False
    assert AuditLog.verify(path, previous_hash=first["prev_hash"])[0] is True
    # Reopening continues the chain in the current file.
    with AuditLog(path, policy_version="v", max_bytes=2000, backups=3) as log:
        assert log.next_sequence == 20 and log.last_hash == last
        _write(log)
    assert AuditLog.verify_rotated(path)[0] is True


def test_a_changed_record_in_a_rotated_file_is_named(tmp_path):
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, policy_version="v", max_bytes=2000, backups=2) as log:
        for _ in range(6):
            _write(log)
    older = tmp_path / "audit.jsonl.1"
    lines = older.read_text().splitlines(keepends=True)
    lines[0] = lines[0].replace('"request_id":"a"', '"request_id":"z"')
    older.write_text("".join(lines))
    ok, _, message = AuditLog.verify_rotated(path)
    assert not ok and message.startswith("audit.jsonl.1: line 1")
    # A whole rotated file removed from the middle breaks the chain too.
    (tmp_path / "audit.jsonl.1").unlink()
    (tmp_path / "audit.jsonl.2").rename(tmp_path / "audit.jsonl.1")
    assert AuditLog.verify_rotated(path)[0] is False


def test_restart_right_after_rotation_chains_on_from_the_rotated_file(tmp_path):
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, policy_version="v") as log:
        _write(log)
        last = log.last_hash
    path.rename(tmp_path / "audit.jsonl.1")
    path.touch()
    with AuditLog(path, policy_version="v", max_bytes=2000, backups=2) as log:
        assert log.next_sequence == 2 and log.last_hash == last
        _write(log)
    assert AuditLog.verify_rotated(path) == (True, 4, None)
