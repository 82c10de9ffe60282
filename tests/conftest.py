"""Shared test configuration."""

import os

# Tests run on the CPU with a fixed thread count so timings and memory stay predictable.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
