"""The four-layer import rule (ADR-0002): imports only point downwards."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "neorl_industrial"
LAYERS = ["core", "functional", "wrappers", "integration"]
CORE_FORBIDDEN = {
    "gymnasium",
    "gym",
    "mlflow",
    "fastapi",
    "uvicorn",
    "starlette",
    "requests",
    "yaml",
    "pyarrow",
    "h5py",
    "orbax",
}
#: Calls that read or write files: the core takes and returns data, never paths.
FILE_CALLS = {"open", "read_text", "write_text", "read_bytes", "write_bytes", "mkdir", "unlink"}
LAYER_PACKAGES = {
    "core": ["agents", "environments", "safety", "utils"],
    "functional": ["state_management", "transformations", "optimizers"],
    "wrappers": ["agents", "environments", "training"],
    "integration": ["mlflow", "safety", "deployment", "datasets"],
}


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).parts
        if relative[0] in LAYERS:
            yield relative[0], path


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_layers_and_their_packages_exist():
    for layer, packages in LAYER_PACKAGES.items():
        for package in packages:
            init = PACKAGE / layer / package / "__init__.py"
            assert init.is_file(), f"missing {init.relative_to(PACKAGE)}"
            assert ast.get_docstring(ast.parse(init.read_text())), f"{init} needs a docstring"


@pytest.mark.parametrize(("layer", "path"), list(_modules()), ids=lambda v: str(v))
def test_imports_point_downwards(layer, path):
    allowed = set(LAYERS[: LAYERS.index(layer) + 1])
    for name in _imports(path):
        parts = name.split(".")
        if parts[0] == "neorl_industrial" and len(parts) > 1:
            assert parts[1] in allowed, f"{path.name}: {layer} must not import {name}"
        if layer == "core":
            assert parts[0] not in CORE_FORBIDDEN, f"{path.name}: core must not import {name}"


@pytest.mark.parametrize(
    "path", [path for layer, path in _modules() if layer == "core"], ids=lambda v: v.name
)
def test_the_core_reads_and_writes_no_files(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            function = node.func
            name = (
                function.attr
                if isinstance(function, ast.Attribute)
                else getattr(function, "id", None)
            )
            assert name not in FILE_CALLS, f"{path.name}:{node.lineno}: core calls {name}()"
