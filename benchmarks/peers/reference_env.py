"""The reference simulators' Python environment, outside the checkout: pc-gym 0.1.8 (with its
CasADi integrator) and NeoRL-2 0.0.1 for ``env_throughput``'s paired process rows.

    python -m benchmarks.peers.reference_env            # builds it at the default place
    python -m benchmarks.peers.reference_env /some/dir  # or there

NeoRL-2's wheel declares torch, onnxruntime and ``gymnasium[all]==0.29.1`` although its
Pipeline and DMSD need only numpy, gymnasium and matplotlib, which pc-gym brings: it is
installed without its dependencies. ``env_throughput`` finds the interpreter through
:func:`reference_python`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: the packages, pinned: pc-gym with its dependencies, NeoRL-2 without (see above)
PCGYM = "pcgym==0.1.8"
NEORL2 = "neorl2==0.0.1"
#: where it is built unless told otherwise
DEFAULT_DIR = Path.home() / ".cache" / "neorl-industrial" / "reference-env"
#: the checkout's own reference environment (``make reference-env``), used when it has both
CHECKOUT_DIR = Path(__file__).resolve().parents[2] / ".venv-reference"


def reference_python() -> Path | None:
    """The reference environment's interpreter: ``$NEORL_REFERENCE_PYTHON``, else the first
    of the default place and the checkout's ``.venv-reference`` that exists; None without."""
    named = os.environ.get("NEORL_REFERENCE_PYTHON")
    if named:
        return Path(named)
    for root in (DEFAULT_DIR, CHECKOUT_DIR):
        python = root / "bin" / "python"
        if python.exists():
            return python
    return None


def build(root: Path) -> Path:
    """Creates the environment at ``root`` (or completes it) and returns its interpreter."""
    python = root / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, PCGYM], check=True)
    subprocess.run([*pip, "--no-deps", NEORL2], check=True)
    return python


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print(__doc__, file=sys.stderr)
        return 2
    python = build(Path(argv[0]) if argv else DEFAULT_DIR)
    print(python)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
