"""Shared test configuration."""

import gc
import json
import os
import shutil
import statistics
from pathlib import Path

# Tests run on the CPU with a fixed thread count so timings and memory stay predictable.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# No Python source locations in the compiled programs (JAX keeps ten frames of each
# operation's traceback by default): they only name lines in XLA's own messages, and
# building them costs CPU in tracing and lowering (initialising and training TD3+BC for a
# chunk: 2.17 -> 1.96 CPU s, the mean of four alternating runs; IQL's the same); set
# before JAX is imported, for the command lines the tests start too. Python's own
# tracebacks keep every frame.
os.environ.setdefault("JAX_TRACEBACK_IN_LOCATIONS_LIMIT", "0")

# The suite's programs are small and compiling them is much of its time: the tests compile
# at XLA:CPU's lowest backend optimization level (the main job's test: 134 s -> 48 s), with
# its older fusion emitters (tests/compile_flags.py).
# Results are held to the same tolerances; users, the benchmarks and the studies compile at
# the default level. The command lines a test runs as a user would (the plant journey)
# compile as the suite does, into the suite's cache. An XLA_FLAGS that sets a level wins.
from tests.compile_flags import with_fast_compile

os.environ["XLA_FLAGS"] = with_fast_compile(os.environ.get("XLA_FLAGS"))

# Compiling is most of the suite's time, and its programs are the same from one run to the
# next: they are kept in a compilation cache of the suite's own, so a later run on the
# machine loads them (the agent tests: 4:25 -> 1:53). The workers share it (an entry read
# while another worker writes it is JAX's warning and a fresh compile, nothing worse); the
# run that finds it over 2 GiB empties it first. NEORL_INDUSTRIAL_TEST_JAX_CACHE names
# another directory, or "off" compiles everything afresh. The command lines the tests start
# (servers, the plant journey) keep their programs there too, never in the user's cache:
# an empty suite cache is an empty cache for everything the suite runs.
import tempfile

from hypothesis import settings

from neorl_industrial.cli.runtime import CACHE_ENV, enable_compilation_cache
from tests.compile_flags import suite_cache_dir
from tests.shared import SHARED_ENV

_cache_dir = suite_cache_dir()
os.environ[CACHE_ENV] = str(_cache_dir or tempfile.mkdtemp(prefix="neorl-tests-jax-"))
if _cache_dir is not None:
    os.environ["NEORL_INDUSTRIAL_TEST_JAX_CACHE"] = str(_cache_dir)  # the workers' too
    controller = "PYTEST_XDIST_WORKER" not in os.environ
    if (
        controller
        and _cache_dir.is_dir()
        and sum(f.stat().st_size for f in _cache_dir.iterdir() if f.is_file()) > 2 * 2**30
    ):
        shutil.rmtree(_cache_dir)
    enable_compilation_cache(_cache_dir, min_compile_seconds=0.0)

# The suite is a gate: property tests draw the same examples on every run, so a run
# passes or fails on the code alone. `HYPOTHESIS_PROFILE=explore` draws fresh examples
# (and more of them) to hunt for new failures; found ones are pinned with `@example`.
settings.register_profile("gate", derandomize=True, print_blob=True)
settings.register_profile("explore", max_examples=1000, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "gate"))

# MLflow: runs of the tests go to a store of their own, never ./mlflow.db. A test that
# needs a store of its own passes tracking.uri (or its own MlflowClient).
if "MLFLOW_TRACKING_URI" not in os.environ:
    _mlflow_dir = tempfile.mkdtemp(prefix="neorl-tests-mlflow-")
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{_mlflow_dir}/mlflow.db"


# Things several test files build the same way (tests/shared.py) go to one directory for
# the run, its workers' too; the process that made it removes it when the run ends.
_shared_dir = None
if SHARED_ENV not in os.environ:
    _shared_dir = tempfile.mkdtemp(prefix="neorl-tests-shared-")
    os.environ[SHARED_ENV] = _shared_dir


def pytest_unconfigure(config):
    if _shared_dir is not None:
        shutil.rmtree(_shared_dir, ignore_errors=True)


# Tracing programs allocates millions of short-lived objects, and Python's cyclic garbage
# collector, at its default thresholds, went through the whole heap thousands of times a
# file (the agent and safe-agent files: 3,650 collections, 7.5 of 89 CPU s; 2.5 s at these
# thresholds, a server's with ``tune_gc``). What the imports and the tests' collection made
# is frozen out of the collections; a test that counts live objects unfreezes and collects.
gc.set_threshold(50_000, 50, 100)


def pytest_collection_finish(session):
    gc.freeze()


# The workers take whole files (`--dist loadfile`), and a file that starts last decides
# when the run ends: the heaviest files go first (the longest-first rule), by the seconds
# each file took in a recorded run (tests/file_seconds.json; a file not in it counts as
# the median). `make test` passes --no-loadscope-reorder, or xdist would order the files
# by their number of tests instead (the README and plant-journey files, few tests and the
# longest, ran last). `pytest --record-file-seconds` rewrites the file from a full run.
FILE_SECONDS = Path(__file__).with_name("file_seconds.json")


def pytest_addoption(parser):
    parser.addoption(
        "--record-file-seconds",
        action="store_true",
        help=f"write each test file's seconds (setup, call, teardown) to {FILE_SECONDS.name}",
    )


def pytest_collection_modifyitems(config, items):
    seconds = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.is_file() else {}
    if not seconds:
        return
    typical = statistics.median(seconds.values())
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], typical))


_recorded: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if "PYTEST_XDIST_WORKER" not in os.environ:
        path = report.nodeid.split("::")[0]
        _recorded[path] = _recorded.get(path, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    if session.config.getoption("--record-file-seconds") and _recorded:
        ordered = dict(sorted(((k, round(v, 1)) for k, v in _recorded.items())))
        FILE_SECONDS.write_text(json.dumps(ordered, indent=1) + "\n")
