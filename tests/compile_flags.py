"""The XLA flags the suite compiles with (set in conftest.py), and a user's environment
without them for the tests that run the command line as a user would."""

from __future__ import annotations

import os

#: XLA:CPU's lowest backend optimization: the suite's small programs compile faster.
FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true")


def with_fast_compile(flags: str | None) -> str:
    """``flags`` with the fast-compile flags added, unless they set a level already."""
    if flags and "xla_backend_optimization_level" in flags:
        return flags
    return " ".join(filter(None, (flags, *FAST_COMPILE)))


def user_environment() -> dict[str, str]:
    """This process's environment without the fast-compile flags."""
    environment = dict(os.environ)
    flags = [f for f in environment.get("XLA_FLAGS", "").split() if f not in FAST_COMPILE]
    if flags:
        environment["XLA_FLAGS"] = " ".join(flags)
    else:
        environment.pop("XLA_FLAGS", None)
    return environment
