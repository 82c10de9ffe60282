"""Every Python snippet of the README runs as printed (in order, one namespace, from a
fresh working directory that sees the repository's examples/ and configs/), and every
command line of it parses. The plant journey's shell block runs as printed in
tests/test_plant_journey.py."""

from __future__ import annotations

import shlex

import pytest

from neorl_industrial.cli import build_parser
from tests.readme import ROOT, blocks, link_repository, plant_journey


def test_the_python_snippets_run_as_printed(tmp_path, monkeypatch):
    link_repository(tmp_path)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "readme"}
    snippets = blocks("python")
    assert len(snippets) >= 7
    for number, code in enumerate(snippets):
        try:
            exec(compile(code, f"README.md python block {number}", "exec"), namespace)
        except Exception as error:  # pragma: no cover - the message is the point
            pytest.fail(f"README python block {number} failed: {error!r}\n{code}")
    # The plant snippet acted in plant units through the plant's shield.
    assert 0.0 <= namespace["valve"] <= 100.0 and namespace["pump"] >= 60.0 - 1e-3
    assert namespace["agent"].task.name == "IB-v0"


def test_the_task_page_runs_as_printed(tmp_path, monkeypatch):
    """docs/tasks.md: its Python block runs and its command lines parse."""
    monkeypatch.chdir(tmp_path)
    page = ROOT / "docs" / "tasks.md"
    namespace: dict = {"__name__": "tasks_page"}
    (code,) = blocks("python", page)
    exec(compile(code, "docs/tasks.md python block", "exec"), namespace)
    assert namespace["result"].total_cost.shape == (16, 8)  # 16 episodes, 8 channels
    commands = _commands(page)
    assert commands and all(line.startswith("neorl-industrial ") for line in commands)
    for line in commands:
        build_parser().parse_args(shlex.split(line)[1:])


def _commands(page=None) -> list[str]:
    pages = blocks("bash") if page is None else blocks("bash", page)
    return [line for block in pages for line in _lines(block)]


def _lines(block: str) -> list[str]:
    """A shell block's command lines: continuations joined, comments and blanks dropped."""
    lines = (line.split("#")[0].strip() for line in block.replace("\\\n", " ").splitlines())
    return [line for line in lines if line]


def test_the_readmes_plant_journey_is_the_plant_pages_in_order():
    """Every command of the README's plant block is one of docs/plants.md's (which a test
    runs as printed), in the same order."""
    readme = _lines(plant_journey())
    page = iter(_commands(ROOT / "docs" / "plants.md"))
    assert len(readme) >= 8
    for line in readme:
        assert line in page, f"README's plant command is not plants.md's, in order: {line}"


def test_every_command_line_of_the_readme_parses():
    parser = build_parser()
    makefile = (ROOT / "Makefile").read_text()
    checked = 0
    for line in _commands():
        words = shlex.split(line.rstrip("&").strip())
        if words[0] == "neorl-industrial":
            parser.parse_args(words[1:])
            checked += 1
        elif words[0] == "make":
            assert f"\n{words[1]}:" in makefile, f"README: no make target {words[1]!r}"
            checked += 1
    assert checked >= 15
