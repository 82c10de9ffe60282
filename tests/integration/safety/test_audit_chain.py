"""The audit log as one chain across files (each way of losing history is detected), the
anchor beside it, gaps found on reopening, and how repeated overrides are aggregated and
rate-limited per key without dropping a row."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import shutil

import numpy as np
import pytest

from neorl_industrial.core.environments import make
from neorl_industrial.core.safety import shield
from neorl_industrial.integration.safety import AuditLog, audit
from neorl_industrial.integration.safety.audit import check_chain, rows_digest_update

ENV, _ = make("IB-v0")
CONSTRAINTS = ENV.compile_constraints()
NAMES = CONSTRAINTS.names
OBSERVATIONS = np.zeros((4, ENV.observation_size), np.float32)
# Overridden: row 0 (projected) and row 2 (NaN, fallback); rows 1 and 3 pass.
PROPOSED = np.array([[2, 0, 0], [0, 0, 0], [np.nan, 0, 0], [-1, 1, 0]], np.float32)
ROWS = 256


@functools.cache
def _shielded():
    return shield(CONSTRAINTS, OBSERVATIONS, PROPOSED, np.zeros((4, 3), np.float32))


@functools.cache
def _big_batch():
    """256 rows that all break the same constraints (a key flooding the audit)."""
    observations = np.zeros((ROWS, ENV.observation_size), np.float32)
    proposed = np.tile(np.asarray([[2.0, 0.0, 0.0]], np.float32), (ROWS, 1))
    applied, report = shield(CONSTRAINTS, observations, proposed, np.zeros((ROWS, 3), np.float32))
    assert bool(np.all(report.status & 1))  # every row overridden
    return observations, proposed, np.asarray(applied), report


def _write(log, request_ids=("a", "b", "c", "d"), **kwargs) -> int:
    applied, report = _shielded()
    return log.write_overrides(
        OBSERVATIONS, PROPOSED, applied, report, NAMES, list(request_ids), **kwargs
    )


@pytest.fixture
def rotated(tmp_path):
    """A log of eight files (current, .1 .. .7), nothing archived."""
    path = tmp_path / "audit.jsonl"
    # A header and one batch (two records of ~1.1 kB) fill a file.
    with AuditLog(path, policy_version="v", max_bytes=3000, backups=20) as log:
        for _ in range(8):
            _write(log)
    assert {p.name for p in tmp_path.glob("audit.jsonl.[0-9]*")} == {
        f"audit.jsonl.{index}" for index in range(1, 8)
    }
    assert check_chain(path).ok
    return path


def _rotated(path, index):
    return path.with_name(f"{path.name}.{index}")


def _failure(path, **kwargs) -> str:
    result = check_chain(path, **kwargs)
    assert not result.ok, result
    return result.message


def test_an_intact_log_passes_and_names_its_head(rotated):
    result = check_chain(rotated)
    assert result.ok and result.message is None and result.notes == ()
    assert result.head == AuditLog.read(rotated)[-1]["hash"]
    assert len(result.files) == 8 and result.files[-1] == str(rotated)
    assert check_chain(rotated, anchor=result.head).ok
    assert check_chain(rotated, anchor=AuditLog.read(_rotated(rotated, 5))[2]["hash"]).ok


def test_a_middle_file_deleted_is_detected(rotated):
    _rotated(rotated, 3).unlink()
    assert _failure(rotated).startswith(
        "audit.jsonl.2: is file 5, expected file 4: file 4 is missing (deleted, or renamed"
    )


def test_a_middle_file_deleted_and_the_names_closed_up_is_detected(rotated):
    _rotated(rotated, 3).unlink()
    for index in range(4, 8):
        _rotated(rotated, index).rename(_rotated(rotated, index - 1))
    assert "file 4 is missing" in _failure(rotated)


def test_every_rotated_file_deleted_is_detected(rotated):
    for index in range(1, 8):
        _rotated(rotated, index).unlink()
    message = _failure(rotated)
    assert message.startswith("audit.jsonl: is file 7, expected file 0: files 0 to 6 are")
    # Files shipped elsewhere on purpose: checked from the oldest that must be here.
    assert check_chain(rotated, since_file=7).ok


def test_a_cut_head_is_detected(rotated):
    oldest = _rotated(rotated, 7)
    lines = oldest.read_text().splitlines(keepends=True)
    oldest.write_text("".join(lines[1:]))
    assert _failure(rotated).startswith("audit.jsonl.7: line 1: not a file header")
    oldest.write_text("".join(lines[2:]))
    assert "not a file header" in _failure(rotated)


def test_a_cut_tail_of_the_current_file_is_detected(rotated):
    lines = rotated.read_text().splitlines(keepends=True)
    rotated.write_text("".join(lines[:-1]))
    message = _failure(rotated)
    assert "records were cut from the end" in message and message.startswith("audit.jsonl:")


def test_a_cut_tail_of_a_rotated_file_is_detected(rotated):
    middle = _rotated(rotated, 4)
    lines = middle.read_text().splitlines(keepends=True)
    middle.write_text("".join(lines[:-1]))
    assert _failure(rotated) == (
        "audit.jsonl.3: line 1: the previous file held 3 records, 2 were found in it"
    )


def test_an_edited_record_is_detected(rotated):
    middle = _rotated(rotated, 2)
    lines = middle.read_text().splitlines(keepends=True)
    record = json.loads(lines[1])
    record["applied"][0] = 0.0
    lines[1] = json.dumps(record, separators=(",", ":")) + "\n"
    middle.write_text("".join(lines))
    assert _failure(rotated) == "audit.jsonl.2: line 2: the content does not match its hash"


def test_reordered_files_are_detected(rotated):
    first, second = _rotated(rotated, 1), _rotated(rotated, 2)
    first.rename(rotated.with_name("swap"))
    second.rename(first)
    rotated.with_name("swap").rename(second)
    assert "audit.jsonl.2: is file 6, expected file 5" in _failure(rotated)


def test_a_deleted_anchor_or_an_anchor_of_another_file_is_detected(rotated):
    anchor = rotated.with_name("audit.jsonl.anchor")
    saved = anchor.read_bytes()
    anchor.unlink()
    assert "anchor: missing" in _failure(rotated)
    anchor.write_bytes(saved.replace(b'"file":7', b'"file":9'))
    assert "anchor: names file 9 and sequence" in _failure(rotated)
    assert "the anchor was edited, or files were removed or renamed" in _failure(rotated)


def test_a_rewritten_log_passes_alone_but_not_against_a_kept_anchor(rotated, tmp_path):
    head = check_chain(rotated).head
    forged = tmp_path / "forged" / "audit.jsonl"
    with AuditLog(forged, policy_version="v") as log:
        log.record(observation=[0.0], proposed=[0.0], applied=[0.0], violated=[])
    for file in tmp_path.glob("audit.jsonl*"):
        file.unlink()
    for file in forged.parent.glob("audit.jsonl*"):
        if file.suffix != ".lock":
            shutil.copy(file, tmp_path / file.name)
    assert check_chain(rotated).ok  # consistent in itself
    assert "is not a record of this log" in _failure(rotated, anchor=head)


def test_records_after_the_anchor_are_a_note_not_a_failure(tmp_path):
    path = tmp_path / "audit.jsonl"
    anchor = tmp_path / "audit.jsonl.anchor"
    with AuditLog(path, policy_version="v") as log:
        _write(log)
        before = anchor.read_bytes()
        _write(log)
        log._write_anchor = lambda: None  # stops as a crash would, before the update
    anchor.write_bytes(before)
    result = check_chain(path)
    assert result.ok and result.notes == (
        "2 records after the anchor (written when the process stopped before updating it)",
    )
    with AuditLog(path, policy_version="v") as log:  # reopening brings the anchor up
        assert log.stats()["gaps"] == 0
    assert check_chain(path).notes == ()


def test_a_stop_between_a_rotation_and_the_anchor_is_a_note(tmp_path):
    path = tmp_path / "audit.jsonl"
    anchor = tmp_path / "audit.jsonl.anchor"
    with AuditLog(path, policy_version="v", max_bytes=3000, backups=5) as log:
        _write(log)
        before = anchor.read_bytes()
        _write(log)  # rotates: a new file with its header and two records
        assert log.file_number == 1
    anchor.write_bytes(before)  # the anchor still names file 0
    result = check_chain(path)
    assert result.ok, result.message
    assert result.notes == (
        "3 records after the anchor (written when the process stopped before updating it)",
    )


def test_a_log_cut_while_stopped_gets_a_gap_record_on_reopening(tmp_path, caplog):
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, policy_version="v") as log:
        for _ in range(3):
            _write(log)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-2]))
    with (
        caplog.at_level(logging.ERROR, "neorl_industrial.audit"),
        AuditLog(path, policy_version="v") as log,
    ):
        assert log.stats()["gaps"] == 1
        _write(log)
    (message,) = [r.getMessage() for r in caplog.records]
    assert "ends at sequence 5, its anchor at 7" in message
    gap = AuditLog.read(path)[5]
    assert gap["kind"] == "gap" and gap["anchor"]["sequence"] == 7
    assert check_chain(path).message.startswith("audit.jsonl: line 6: records were lost")


# ----- aggregation and the rate per key ----------------------------------------------------
class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(audit, "_clock", fake)
    return fake


def _batch(log, prefix, **kwargs) -> int:
    observations, proposed, applied, report = _big_batch()
    ids = [f"{prefix}/{row}" for row in range(ROWS)]
    return log.write_overrides(observations, proposed, applied, report, NAMES, ids, **kwargs)


def test_repeated_overrides_become_one_record_and_one_aggregate(tmp_path, clock):
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, policy_version="v", window_s=10.0) as log:
        assert _batch(log, "r", key="k1") == ROWS
        assert _batch(log, "s", key="k2") == ROWS  # another key: its own records
        clock.now += 5.0
        _batch(log, "t", key="k1")  # same window
        assert log.stats()["folded_rows"] == 3 * ROWS - 2
    _, full_1, full_2, *aggregates = AuditLog.read(path)
    assert (full_1["kind"], full_1["key"], full_1["request_id"]) == ("override", "k1", "r/0")
    assert (full_2["key"], full_2["request_id"]) == ("k2", "s/0")
    by_key = {record["key"]: record for record in aggregates}
    assert set(by_key) == {"k1", "k2"} and all(r["kind"] == "aggregate" for r in aggregates)
    first = by_key["k1"]
    assert first["count"] == 2 * ROWS - 1 and first["rate_limited"] == 0
    assert (first["first_request_id"], first["last_request_id"]) == ("r/1", f"t/{ROWS - 1}")
    assert first["detailed"] == full_1["sequence"] and first["violated"] == full_1["violated"]
    assert first["first_time"] <= first["last_time"] and first["projected"] is True
    # The digest is what anyone holding the rows computes.
    observations, proposed, applied, _ = _big_batch()
    digest = hashlib.sha256()
    for prefix, rows in (("r", range(1, ROWS)), ("t", range(ROWS))):
        for row in rows:
            obs, prop, app = observations[row], proposed[row], applied[row]
            rows_digest_update(digest, f"{prefix}/{row}", obs, prop, app)
    assert first["rows_sha256"] == digest.hexdigest()
    assert check_chain(path).ok


def test_a_new_window_starts_with_a_full_record(tmp_path, clock):
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, policy_version="v", window_s=1.0) as log:
        _batch(log, "r", key="k")
        clock.now += 1.5
        _batch(log, "s", key="k")  # writes the first window's aggregate, opens another
    kinds = [(r["kind"], r.get("request_id"), r.get("count")) for r in AuditLog.read(path)[1:]]
    assert kinds == [
        ("override", "r/0", None),
        ("aggregate", None, ROWS - 1),
        ("override", "s/0", None),
        ("aggregate", None, ROWS - 1),
    ]


def test_a_flooding_key_cannot_flush_history_and_no_row_is_lost(tmp_path, clock, caplog):
    """The finding: one act key writing 256-row overridden batches filled the default
    retention in about 1.4 minutes. Now 200 such batches over 100 s of one key make a few
    hundred records, every row counted."""
    path = tmp_path / "audit.jsonl"
    with (
        caplog.at_level(logging.WARNING, "neorl_industrial.audit"),
        AuditLog(path, policy_version="v", window_s=1.0, key_rate=2.0) as log,
    ):
        for batch in range(200):
            _batch(log, f"b{batch}", key="flood")
            clock.now += 0.5
    stats = log.stats()  # after closing: the last window's aggregate included
    records = AuditLog.read(path)[1:]
    full = [r for r in records if r["kind"] == "override"]
    aggregates = [r for r in records if r["kind"] == "aggregate"]
    assert len(records) <= 2 * 100 + 2
    assert len(full) + sum(r["count"] for r in aggregates) == 200 * ROWS
    # Every row in full would take 200 * 256 lines of the first record's size (~60 MB).
    line = len(path.read_text().splitlines()[1].encode()) + 1
    assert path.stat().st_size < 200 * ROWS * line / 200
    assert stats["records"] == len(records) + 1
    assert stats["folded_rows"] == 200 * ROWS - len(full)
    assert not caplog.records  # one full record per window: within 2 a second


def test_past_its_rate_a_key_is_folded_counted_and_logged(tmp_path, clock, caplog):
    path = tmp_path / "audit.jsonl"
    with (
        caplog.at_level(logging.WARNING, "neorl_industrial.audit"),
        AuditLog(path, policy_version="v", window_s=0.1, key_rate=1.0) as log,
    ):
        for step in range(40):
            _write(log, [f"{step}/{row}" for row in range(4)], key="fast")
            _write(log, [f"{step}/{row}" for row in range(4)], key="calm") if step % 10 == 0 else 0
            clock.now += 0.2  # every write in a new window: a full record each, if allowed
        stats = log.stats()
    records = AuditLog.read(path)[1:]
    fast = [r for r in records if r["key"] == "fast"]
    full = [r for r in fast if r["kind"] == "override"]
    folded = sum(r["count"] for r in fast if r["kind"] == "aggregate")
    assert len(full) + folded == 40 * 2  # every overridden row: in full or counted
    # A burst of ten, then one per second (two classes share it).
    assert 10 <= len(full) <= 10 + 8 * 1 + 2
    assert stats["rate_limited_rows"] == sum(
        r["rate_limited"] for r in records if "rate_limited" in r
    )
    assert stats["rate_limited_rows"] > 0
    calm = [r for r in records if r["key"] == "calm" and r["kind"] == "override"]
    assert len(calm) == 8  # another key keeps its own rate
    messages = [r.getMessage() for r in caplog.records]
    assert messages and all("key fast over 1 full records per second" in m for m in messages)
    assert check_chain(path).ok
