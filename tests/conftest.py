"""Shared test configuration."""

import os

# Tests run on the CPU with a fixed thread count so timings and memory stay predictable.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# The suite's programs are small and compiling them is much of its time: the tests compile
# at XLA:CPU's lowest backend optimization level (the main job's test: 134 s -> 48 s).
# Results are held to the same tolerances; users, the benchmarks, the studies and the
# plant journey's command lines compile at the default level. An XLA_FLAGS that sets a
# level wins.
from tests.compile_flags import with_fast_compile

os.environ["XLA_FLAGS"] = with_fast_compile(os.environ.get("XLA_FLAGS"))

from hypothesis import settings

# The suite is a gate: property tests draw the same examples on every run, so a run
# passes or fails on the code alone. `HYPOTHESIS_PROFILE=explore` draws fresh examples
# (and more of them) to hunt for new failures; found ones are pinned with `@example`.
settings.register_profile("gate", derandomize=True, print_blob=True)
settings.register_profile("explore", max_examples=1000, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "gate"))

# MLflow: runs of the tests go to a store of their own, never ./mlflow.db. A test that
# needs a store of its own passes tracking.uri (or its own MlflowClient).
if "MLFLOW_TRACKING_URI" not in os.environ:
    import tempfile

    _mlflow_dir = tempfile.mkdtemp(prefix="neorl-tests-mlflow-")
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{_mlflow_dir}/mlflow.db"
