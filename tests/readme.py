"""The README's code blocks, for the tests that run them as printed."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: What a README block may refer to relative to the repository root.
LINKED = ("examples", "configs")

_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(language: str, page: Path = README) -> list[str]:
    """Every fenced block of ``language`` in the README (or another page), in order."""
    return [code for lang, code in _BLOCK.findall(page.read_text()) if lang == language]


def plant_journey() -> str:
    """The bash block of the plant section (import, model, train, answer, serve, curl)."""
    (block,) = [code for code in blocks("bash") if "datasets import examples/mixing-tank" in code]
    return block


def link_repository(directory: Path) -> None:
    """Makes the repository's example and configuration folders visible from
    ``directory``, as they are from the repository root."""
    for name in LINKED:
        (directory / name).symlink_to(ROOT / name, target_is_directory=True)
