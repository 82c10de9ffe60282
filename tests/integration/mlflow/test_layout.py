"""The package's layout: the sender is a transport that imports nothing above it, the
tracker and the registry hand it operations, a run's record sits above them all, and
registered model names."""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

import pytest

import neorl_industrial.integration.mlflow as package
from neorl_industrial.integration.mlflow import registered_model_name, registry, runs
from neorl_industrial.integration.mlflow.sender import (
    BufferedSender,
    registered_operations,
)

PACKAGE = package.__name__
ROOT = Path(package.__file__).parent
MODULES = sorted(path.stem for path in ROOT.glob("*.py"))


def _imports(module: str) -> set[str]:
    """Every module ``module`` imports, at the top, in functions or for type checking."""
    tree = ast.parse((ROOT / f"{module}.py").read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = PACKAGE.split(".")
                base = ".".join([*parts[: len(parts) + 1 - node.level], base]).rstrip(".")
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _siblings(module: str) -> set[str]:
    prefix = f"{PACKAGE}."
    return {
        name[len(prefix) :].split(".")[0]
        for name in _imports(module)
        if name.startswith(prefix) and name[len(prefix) :].split(".")[0] in MODULES
    }


def _strings(module: str) -> set[str]:
    """String constants of ``module``, docstrings left out."""
    tree = ast.parse((ROOT / f"{module}.py").read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in docstrings
    }


def test_the_sender_imports_no_module_of_the_package_and_only_host_io_of_the_project():
    assert _siblings("sender") == set()
    project = {name for name in _imports("sender") if name.startswith("neorl_industrial.")}
    hostio = "neorl_industrial.wrappers.hostio"
    assert hostio in project
    assert all(name == hostio or name.startswith(f"{hostio}.") for name in project), project


def test_tracking_and_registry_import_the_sender_and_nothing_imports_back_up():
    graph = {module: _siblings(module) for module in MODULES if module != "__init__"}
    assert "sender" in graph["tracking"] and "sender" in graph["registry"]
    assert "sender" in graph["runs"]
    # A run's record (run_logging) uses the tracker and sits above it; nothing imports
    # either back.
    assert "run_logging" not in set().union(*graph.values())
    below = {module: imported for module, imported in graph.items() if module != "run_logging"}
    assert "tracking" not in set().union(*below.values())
    assert "registry" not in graph["tracking"] | graph["runs"] | graph["pyfunc"]
    # No circle anywhere: the modules have an import order.
    order = list(graphlib.TopologicalSorter(graph).static_order())
    assert order.index("sender") < order.index("tracking")
    assert order.index("sender") < order.index("registry")


def test_the_sender_knows_no_operation_by_name():
    operations = set(runs.OPERATIONS) | set(registry.OPERATIONS)
    assert operations == set(registered_operations())
    assert not operations & _strings("sender")


def test_importing_only_the_sender_can_deliver_every_operation():
    # What `neorl-industrial mlflow replay` does: it imports the sender and nothing else.
    code = (
        "from neorl_industrial.integration.mlflow.sender import registered_operations\n"
        "print(' '.join(registered_operations()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split() == sorted(set(runs.OPERATIONS) | set(registry.OPERATIONS))


def test_an_unknown_operation_is_refused_when_submitted(tmp_path):
    sender = BufferedSender(lambda: None, spool_path=tmp_path / "spool.jsonl")
    try:
        with pytest.raises(ValueError, match=r"unknown operation 'log_metric'.*log_batch"):
            sender.submit("log_metric", "parent", value=1.0)
    finally:
        summary = sender.close(timeout=1)
    assert summary.sent == 0 and summary.spooled == 0


@pytest.mark.parametrize(
    ("task", "expected"),
    [
        ("IB-v0", "ib-policy"),
        ("IB-classic-v0", "ib-policy"),
        ("IB-nonstationary-v0", "ib-policy"),
        ("heat-exchanger", "heat-exchanger-policy"),
        ("boiler-3", "boiler-3-policy"),
        ("Boiler 3", "boiler-3-policy"),
        ("plant/line:2@north", "plant-line-2-north-policy"),
        ("cooling_tower.v2", "cooling_tower-v2-policy"),
        ("MyPlant-v1", "myplant-v1-policy"),  # not a registered simulator
    ],
)
def test_registered_model_names_for_simulators_and_plants(task, expected):
    assert registered_model_name(task) == expected
    assert registered_model_name(task, "team-policy") == "team-policy"


def test_a_task_name_without_letters_or_digits_names_no_model():
    with pytest.raises(ValueError, match=r"'#!'.*tracking\.registered_model"):
        registered_model_name("#!")
