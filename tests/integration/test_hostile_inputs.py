"""Hostile files and flags: each is refused with one line naming what is wrong, exit 2, and
nothing written; no number in a schema, spec or configuration can switch a check off."""

from __future__ import annotations

import json
import os
import textwrap
import threading

import pytest

from neorl_industrial import cli
from neorl_industrial.core.safety import ConstraintSpec, ConstraintSpecError
from neorl_industrial.wrappers.training.config import ConfigError, RunConfig

SCHEMA = """\
timestamp: time
sampling_period: 60
observations:
  - {column: temperature, unit: degC, physical: [0, 500]}
actions:
  - {column: valve, unit: "%", bounds: [0, 100]}
reward: -temperature
"""
LOG = """\
time,temperature,valve
2024-03-01T08:00:00,340,10
2024-03-01T08:01:00,341,11
2024-03-01T08:02:00,342,12
"""


def refusal(capsys, argv: list[str]) -> str:
    """Runs the command line; asserts exit 2, no traceback, and one error line on stderr,
    the last (after any warning the command gave on its way)."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    return errors[0]


def _import(tmp_path, capsys, schema: str = SCHEMA, log: str = LOG) -> tuple[str, object]:
    (tmp_path / "log.csv").write_text(log)
    (tmp_path / "schema.yaml").write_text(textwrap.dedent(schema))
    out = tmp_path / "out"
    line = refusal(
        capsys,
        [
            "--no-cache",
            "datasets",
            "import",
            str(tmp_path / "log.csv"),
            "--schema",
            str(tmp_path / "schema.yaml"),
            "--out",
            str(out),
        ],
    )
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.csv", "schema.yaml"]
    return line, tmp_path


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (("sampling_period: 60", "sampling_period: .inf"), "sampling_period: inf s is outside"),
        (("sampling_period: 60", "sampling_period: 0.0"), "allowed range [1e-06, 604800] s"),
        (("sampling_period: 60", "sampling_period: 60\ngap_factor: 1e300"), "gap_factor: 1e+300"),
        (("physical: [0, 500]", "physical: [-1e308, 1e308]"), "observations[0].physical: -1e+308"),
        (("bounds: [0, 100]", "bounds: [-1e308, 1e308]"), "actions[0].bounds"),
        (("unit: degC", 'unit: "deg\\e[31mC"'), "observations[0].unit: control character U+001B"),
        (("unit: degC", 'unit: "deg\\nC"'), "observations[0].unit: control character U+000A"),
        (("reward: -temperature", "reward: -temperature\ncosts: [{name: c, limit: 1e308}]"),
         "costs[0].limit: must be a finite number in [0, 1e+12]"),
    ],
)  # fmt: skip
def test_a_schema_cannot_switch_a_check_off(tmp_path, capsys, change, named):
    line, _ = _import(tmp_path, capsys, SCHEMA.replace(*change))
    assert "schema.yaml: invalid plant-log schema: " in line and named in line, line
    assert "allowed range" in line or "finite number" in line or "control character" in line


@pytest.mark.parametrize(("stamp", "row"), [("9999-12-31T23:59:00", 2), ("0001-01-01T00:00:00", 0)])
def test_timestamps_nanoseconds_cannot_hold_name_file_column_and_row(tmp_path, capsys, stamp, row):
    lines = LOG.splitlines()
    lines[row + 1] = stamp + lines[row + 1][len(stamp) :]
    line, _ = _import(tmp_path, capsys, log="\n".join(lines) + "\n")
    assert f"log.csv: column 'time', row {row}: timestamp {stamp[:4]}" in line, line
    assert "1678-01-01 to 2261-12-31" in line


def test_numeric_seconds_beyond_the_range_name_the_row(tmp_path, capsys):
    log = "time,temperature,valve\n0,340,10\n60,341,11\n1e300,342,12\n"
    line, _ = _import(tmp_path, capsys, log=log)
    assert "column 'time', row 2: 1e+300 s is outside the allowed range" in line, line


@pytest.mark.parametrize("which", ["log", "schema", "npz"])
def test_a_fifo_is_refused_at_once_not_read(tmp_path, capsys, which):
    (tmp_path / "schema.yaml").write_text(SCHEMA)
    (tmp_path / "log.csv").write_text(LOG)
    fifo = tmp_path / {"log": "fifo.csv", "schema": "fifo.yaml", "npz": "fifo.npz"}[which]
    os.mkfifo(fifo)
    data = fifo if which != "schema" else tmp_path / "log.csv"
    argv = ["--no-cache", "datasets", "import", str(data), "--out", str(tmp_path / "out")]
    if which != "npz":
        argv += ["--schema", str(fifo if which == "schema" else tmp_path / "schema.yaml")]
    # A reader that opens the FIFO blocks until a writer comes: this one comes after 20 s,
    # so a hang fails the test instead of stopping the suite.
    rescue = threading.Timer(20.0, lambda: open(fifo, "w").close())
    rescue.start()
    try:
        line = refusal(capsys, argv)
    finally:
        rescue.cancel()
    assert f"{fifo}: a FIFO, not a regular file" in line and "nothing was read" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ({"rate_limits": {"a": 1e308}}, "rate_limits.a: must be a finite number in [0, 1e+12]"),
        ({"action_bounds": {"a": [-1e308, 1e308]}}, "action_bounds.a: low: -1e+308"),
        ({"linear": [{"name": "r", "action": {"a": 1.0}, "bound": 1e308}]}, "bound: 1e+308"),
        ({"linear": [{"name": "r", "action": {"a": 1e-300}, "bound": 1}]},
         "coefficient of 'a': 1e-300 is too small to keep in float32"),
        ({"state_limits": [{"name": "s", "when": {"feature": "x", "above": 1e308},
                            "action": "a", "max": 5}]}, "the threshold: 1e+308"),
        ({"costs": [{"name": "c", "feature": "x", "above": 1, "cost_limit": 1e308}]},
         "cost_limit: 1e+308"),
        ({"linear": [{"name": "r\n[ok]", "action": {"a": 1}, "bound": 1}]},
         "control character U+000A"),
    ],
)  # fmt: skip
def test_a_constraint_spec_cannot_switch_a_rule_off(spec, named):
    with pytest.raises(ConstraintSpecError) as caught:
        ConstraintSpec.from_dict({"action_bounds": {"a": [0, 100]}, **spec}, "plant.yaml")
    message = str(caught.value)
    assert message.startswith("plant.yaml: ") and named in message and "\n" not in message


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("safety.cost_limits=[1e308]", "safety.cost_limits: [0]: 1e+308 is outside"),
        ("tracking.flush_timeout=1e308", "tracking.flush_timeout: Input should be less than"),
        ("tracking.flush_timeout=.inf", "tracking.flush_timeout: Input should be a finite"),
    ],
)
def test_a_run_configuration_cannot_switch_a_limit_off(override, named):
    with pytest.raises(ConfigError) as caught:
        RunConfig().with_overrides([override])
    assert named in str(caught.value) and "\n" not in str(caught.value)


def test_strong_schemas_and_specs_still_load():
    spec = ConstraintSpec.from_dict(
        {
            "action_bounds": {"a": [-1e12, 1e12]},
            "rate_limits": {"a": 1e12},
            "linear": [{"name": "r", "action": {"a": 1e-12}, "bound": 0.0}],
        }
    )
    assert spec.hard_names == ("bounds/a", "rate/a", "r")
    assert RunConfig().with_overrides(["safety.cost_limits=[1e12]"]).safety.cost_limits == [1e12]


# -- API keys --------------------------------------------------------------------------
#: Patterned keys of the families a red team found accepted: keyboard walks, the printable
#: ASCII run, counting in base 10 and 16, interleaved sequences, a famous passphrase.
PATTERNED_KEYS = [
    "1qaz2wsx3edc4rfv5tgb6yhn7ujm8ik9ol0p",
    "1qaz2wsx3edc4rfv5tgb6yhn7ujm8ik9ol0p!QAZ@WSX",
    "".join(chr(c) for c in range(33, 127)),
    "".join(chr(c) for c in range(33, 80)),
    "".join(chr(c) for c in range(126, 80, -1)),
    "0123456789abcdef" + "".join(str(n) for n in range(10, 30)),
    "".join(str(n) for n in range(1, 40)),
    "".join(format(n, "x") for n in range(100, 130)),
    "".join(f"{c}{n % 10}" for n, c in enumerate("abcdefghijklmnopqrstuvwxyz", 1))[:40],
    "".join(f"{c}{C}" for c, C in zip("abcdefghij", "ABCDEFGHIJ", strict=True)) * 2,
    "acegikmoqsuwyacegikmoqsuwyacegikmoqsuw",
    "CorrectHorseBatteryStapleCorrectHorseBattery",
    "CorrectHorseBatteryStaple1234567890",
    "correct-horse-battery-staple-correct-horse",
    "CorrectHorseBatteryStaple!NeorlIndustrial",
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "qwertyuiopasdfghjklzxcvbnmQWERTYUIOPASDFGHJKL",
    "zaq12wsxcde34rfvbgt56yhnmju78ik,.lo90p;/",
]


@pytest.mark.parametrize("key", PATTERNED_KEYS)
def test_patterned_api_keys_are_refused_as_low_entropy(key):
    from neorl_industrial.integration.deployment.settings import SettingsError, check_api_key

    with pytest.raises(SettingsError, match="low-entropy") as refused:
        check_api_key(key, "act")
    assert key not in str(refused.value) and "secrets.token_urlsafe(32)" in str(refused.value)


def test_random_api_keys_are_accepted():
    import secrets

    from neorl_industrial.integration.deployment.settings import check_api_key

    for _ in range(20):
        check_api_key(secrets.token_urlsafe(32), "act")
        check_api_key(secrets.token_urlsafe(24), "admin")  # the 32 characters at least


# -- policy artifacts ------------------------------------------------------------------
@pytest.fixture(scope="module")
def artifact_dir(tmp_path_factory):
    """An artifact's files as far as the loader reads before it deserializes anything: a
    manifest whose own sha256 matches (anyone can recompute it) and the files it lists.
    Every refusal below comes before a function is deserialized, so no export is needed."""
    import hashlib
    import json

    from neorl_industrial.wrappers.agents.artifact import FORMAT, FORMAT_VERSION, _digest

    directory = tmp_path_factory.mktemp("artifact") / "policy"
    directory.mkdir()
    files = {}
    for name, data in (("serve.jaxexport", b"function"), ("constraints.yaml", b"{}\n")):
        (directory / name).write_bytes(data)
        files[name] = hashlib.sha256(data).hexdigest()
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "files": files,
        "functions": [{"file": "serve.jaxexport", "min_batch": 1}],
    }
    manifest["manifest_sha256"] = _digest(manifest)
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


def _tampered(artifact_dir, tmp_path, change) -> object:
    import json
    import shutil

    from neorl_industrial.wrappers.agents.artifact import _digest

    copy = tmp_path / "tampered"
    shutil.copytree(artifact_dir, copy)
    manifest_file = copy / "manifest.json"
    if isinstance(change, tuple):  # (file, text): written as is
        (copy / change[0]).write_text(change[1])
    else:  # an edit of the manifest, its sha256 recomputed (anyone can)
        manifest = json.loads(manifest_file.read_text())
        change(manifest)
        manifest["manifest_sha256"] = _digest(manifest)
        manifest_file.write_text(json.dumps(manifest))
    return copy


NESTED = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (("manifest.json", NESTED), "manifest.json: JSON nested too deeply"),
        (("manifest.json", '{"a":' * 200 + "1" + "}" * 200), "manifest.json: JSON nested deeper"),
        (("signature.json", NESTED), "signature.json: JSON nested too deeply"),
        (lambda m: m["files"].update({"..": "0" * 64}), "files lists '..', which is not a file"),
        (lambda m: m["files"].update({".": "0" * 64}), "files lists '.', which is not a file"),
        (lambda m: m["files"].update({"/etc/passwd": "0" * 64}), "files lists '/etc/passwd'"),
        (lambda m: m["files"].update({"../policy/x": "0" * 64}), "files lists '../policy/x'"),
        (lambda m: m.update(functions={"serve.jaxexport": 1}), "'functions' must list"),
        (lambda m: m.update(check=5), "'check' must be {'file': name, 'max_batch': positive"),
        (lambda m: m.update(check={"file": "check.jaxexport", "max_batch": 0}), "'check' must"),
        (lambda m: m.update(check={"file": "check.jaxexport", "max_batch": 3}),
         "lists no sha256 for check.jaxexport"),
        (lambda m: m["files"].update({"serve.jaxexport": "f" * 63}), "not 64 hex digits"),
    ],
)  # fmt: skip
def test_a_tampered_artifact_is_refused_by_name(artifact_dir, tmp_path, change, named):
    from neorl_industrial.wrappers.agents import PolicyArtifact, PolicyArtifactError

    copy = _tampered(artifact_dir, tmp_path, change)
    with pytest.raises(PolicyArtifactError) as caught:
        PolicyArtifact.load(copy)
    message = str(caught.value)
    assert named in message and "\n" not in message, message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tampered"]  # nothing written


def test_serve_refuses_a_nested_manifest_in_one_line(artifact_dir, tmp_path, capsys):
    copy = _tampered(artifact_dir, tmp_path, ("manifest.json", NESTED))
    line = refusal(
        capsys, ["--no-cache", "serve", "--model", str(copy), "--no-auth", "--allow-unsigned"]
    )
    assert "manifest.json: JSON nested too deeply" in line


# -- audit log -------------------------------------------------------------------------
def test_a_second_server_on_a_held_audit_log_is_refused_before_loading(tmp_path, capsys):
    from neorl_industrial.integration.safety import AuditLog

    log = tmp_path / "audit.jsonl"
    with AuditLog(log, policy_version="v1"):
        # No policy is at --model: a server that loaded before locking would say so.
        argv = ["--no-cache", "serve", "--model", str(tmp_path / "no-such-policy"),
                "--audit-log", str(log), "--no-auth", "--allow-unsigned"]  # fmt: skip
        line = refusal(capsys, argv)
    assert f"audit log {log}: held by another process (pid {os.getpid()}" in line


def test_a_claimed_audit_log_is_taken_over_by_the_log_this_process_opens(tmp_path):
    from neorl_industrial.integration.safety import AuditLog, AuditLogError
    from neorl_industrial.integration.safety.audit import claim, release_claim

    log = tmp_path / "audit.jsonl"
    claim(log)
    claim(log)  # twice is once
    with pytest.raises(AuditLogError, match="held by another process"):
        # Another open of the lock (as another process's) is refused while claimed.
        from neorl_industrial.integration.safety.audit import _take_lock

        _take_lock(log)
    with AuditLog(log, policy_version="v1") as audit:
        audit.append({"kind": "note"})
        assert release_claim(log) is False  # the log took the claim over
    claim(log)  # free again once the log is closed
    assert release_claim(log) is True


def test_audit_verify_names_a_nested_line_and_a_since_file_beyond_the_log(tmp_path, capsys):
    from neorl_industrial.integration.safety import AuditLog

    log = tmp_path / "audit.jsonl"
    with AuditLog(log, policy_version="v1") as audit:
        audit.append({"kind": "note"})
    with open(log, "a") as handle:
        handle.write(NESTED + "\n")
    assert cli.main(["--no-cache", "audit", "verify", str(log)]) == 1
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    assert "broken: audit.jsonl: line 3: not valid JSON (JSON nested too deeply to read)" in (
        " ".join(out.out.split())
    )
    line = refusal(capsys, ["--no-cache", "audit", "verify", str(log), "--since-file", "99"])
    assert "since_file 99: the log holds files 0 to 0, none from file 99 on" in line
    assert "None" not in line


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("NEORL_SERVE_HEADER_TIMEOUT_S", "1e308", "header_timeout_s: Input should be less than"),
        ("NEORL_SERVE_BODY_TIMEOUT_S", "inf", "body_timeout_s: Input should be less than"),
        ("NEORL_SERVE_KEEP_ALIVE_S", "1e308", "keep_alive_s: Input should be less than"),
        ("NEORL_SERVE_AUDIT_WINDOW_S", "1e308", "audit_window_s: Input should be less than"),
        ("NEORL_SERVE_MAX_BODY_BYTES", "1099511627776", "max_body_bytes: Input should be less"),
        ("NEORL_SERVE_MAX_CONNECTIONS", "10000000", "max_connections: Input should be less"),
    ],
)
def test_a_server_setting_cannot_switch_a_limit_off(tmp_path, capsys, monkeypatch, variable,
                                                    value, named):  # fmt: skip
    monkeypatch.chdir(tmp_path)  # no .env of the working directory
    monkeypatch.setenv(variable, value)
    line = refusal(capsys, ["--no-cache", "serve", "--model", "x", "--no-auth"])
    assert line.startswith("error: settings (NEORL_SERVE_*, flags): ") and named in line, line


TASK = """\
name: tank
observation_names: [level]
action_names: [valve]
action_low: [0]
action_high: [100]
observation_low: [0]
observation_high: [10]
observation_units: [m]
action_units: ["%"]
"""


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (("action_high: [100]", "action_high: [1e308]"), "action_high of 'valve': 1e+308 is"),
        (("observation_low: [0]", "observation_low: [-1e300]"), "observation_low of 'level'"),
        (("[m]", '["m\\e[2J"]'), "the unit of 'level': control character U+001B"),
        (None, "not a regular file (nothing was read)"),
    ],
)
def test_a_pinned_task_cannot_switch_a_bound_off(tmp_path, change, named):
    from neorl_industrial.integration.deployment.pin import load_pinned_task

    path = tmp_path / "task.yaml"
    if change is None:
        os.mkfifo(path)
    else:
        path.write_text(TASK.replace(*change))
    with pytest.raises(ValueError) as caught:
        load_pinned_task(path)
    assert named in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
    assert load_pinned_task(_written(tmp_path / "good.yaml", TASK))[0].action_high == (100.0,)


def _written(path, text):
    path.write_text(text)
    return path


# -- pinning the server to a CPU --------------------------------------------------------
@pytest.mark.parametrize(
    ("cpu", "named"),
    [
        ("9999", "cpu: 9999 is not a CPU this process may use; expected one of ["),
        ("-1", "cpu: Input should be greater than or equal to 0"),
    ],
)
def test_serve_refuses_a_cpu_it_may_not_use_before_loading(tmp_path, capsys, cpu, named):
    # No policy is at --model: a server that loaded before pinning would say so.
    argv = ["--no-cache", "serve", "--model", str(tmp_path / "no-such-policy"), "--cpu", cpu,
            "--no-auth", "--allow-unsigned"]  # fmt: skip
    before = os.sched_getaffinity(0)
    line = refusal(capsys, argv)
    assert named in line and "no-such-policy" not in line, line
    assert os.sched_getaffinity(0) == before  # nothing pinned


def test_a_pinned_server_process_runs_every_thread_on_its_cpu():
    """Every thread the process has, and those it starts afterwards (JAX's, the
    batcher's), run on the CPU given; in a child process, so the suite stays unpinned."""
    import subprocess
    import sys

    code = (
        "import os, threading, json, time\n"
        "from neorl_industrial.cli.serving import pin_process\n"
        "before = threading.Thread(target=time.sleep, args=(2,)); before.start()\n"
        "cpu = max(os.sched_getaffinity(0))\n"
        "pin_process(cpu)\n"
        "seen = []\n"
        "after = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0))))\n"
        "after.start(); after.join()\n"
        "threads = {int(t): sorted(os.sched_getaffinity(int(t)))\n"
        "           for t in os.listdir('/proc/self/task')}\n"
        "print(json.dumps({'cpu': cpu, 'threads': list(threads.values()), 'new': seen[0]}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    cpu = result["cpu"]
    assert len(result["threads"]) >= 2  # the main thread and the one started before
    assert all(cpus == [cpu] for cpus in result["threads"]), result
    assert result["new"] == [cpu]
