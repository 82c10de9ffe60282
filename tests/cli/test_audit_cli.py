"""``audit verify``: exit 0 with the head hash for an intact log, 1 naming the first bad
place, 2 for bad usage."""

from __future__ import annotations

import json

import pytest

from neorl_industrial import cli
from neorl_industrial.integration.safety import AuditLog


def _log(tmp_path, records: int = 6):
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, policy_version="v", max_bytes=600, backups=10) as log:
        for index in range(records):
            log.record(
                observation=[float(index)],
                proposed=[1.0],
                applied=[0.5],
                violated=["limit"],
                request_id=f"r{index}",
            )
        head = log.last_hash
    return path, head


def _verify(capsys, *args: str) -> tuple[int, str]:
    status = cli.main(["--no-cache", "audit", "verify", *args])
    captured = capsys.readouterr()
    return status, " ".join((captured.out + captured.err).split())


def test_an_intact_log_prints_its_head_and_passes_its_anchor(tmp_path, capsys):
    path, head = _log(tmp_path)
    status, out = _verify(capsys, str(path))
    assert status == 0, out
    files = 1 + len(list(tmp_path.glob("audit.jsonl.[0-9]*")))
    assert files > 1 and f"intact: {6 + files} records in {files} files" in out  # + headers
    assert f"head (keep it elsewhere, pass it as --anchor): {head}" in out
    status, out = _verify(capsys, str(path), "--anchor", head.upper())
    assert status == 0, out


def test_a_broken_log_exits_1_naming_the_first_bad_place(tmp_path, capsys):
    path, head = _log(tmp_path)
    lines = path.read_text().splitlines(keepends=True)
    record = json.loads(lines[-1])
    record["applied"] = [0.9]
    path.write_text("".join(lines[:-1]) + json.dumps(record) + "\n")
    status, out = _verify(capsys, str(path))
    assert status == 1
    assert f"broken: audit.jsonl: line {len(lines)}: the content does not match its hash" in out
    path.write_text("".join(lines[:-1]))  # the last record cut off
    status, out = _verify(capsys, str(path), "--anchor", head)
    assert status == 1 and "records were cut from the end" in out


def test_a_kept_anchor_catches_a_log_replaced_whole(tmp_path, capsys):
    _, head = _log(tmp_path / "real")
    forged, _ = _log(tmp_path / "forged", records=2)
    status, out = _verify(capsys, str(forged), "--anchor", head)
    assert status == 1 and f"anchor {head[:16]}... is not a record of this log" in out


def test_every_rotated_file_deleted_exits_1_unless_shipped_on_purpose(tmp_path, capsys):
    path, _ = _log(tmp_path)
    rotated = sorted(tmp_path.glob("audit.jsonl.[0-9]*"))
    assert rotated
    newest = json.loads(path.read_text().splitlines()[0])["file"]
    for file in rotated:
        file.unlink()
    status, out = _verify(capsys, str(path))
    assert status == 1 and f"is file {newest}, expected file 0" in out
    assert _verify(capsys, str(path), "--since-file", str(newest))[0] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--anchor", "abc"], "expected a head hash"),
        (["--since-file", "-1"], "expected an integer >= 0"),
    ],
)
def test_bad_usage_exits_2(tmp_path, capsys, args, message):
    path, _ = _log(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--no-cache", "audit", "verify", str(path), *args])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_a_missing_log_exits_2(tmp_path, capsys):
    status, out = _verify(capsys, str(tmp_path / "nowhere.jsonl"))
    assert status == 2 and "nowhere.jsonl: no such audit log" in out
