"""The layer rule (ADR-0002): imports only point downwards, and no two modules import
each other, even through an import inside a function.

Every module under ``src/neorl_industrial`` has a layer, read from its path: the four
layers' packages are theirs; the modules beside them state theirs in ``TOP_LEVEL``. A
new top-level module fails here until its layer is stated.
"""

from __future__ import annotations

import ast
import graphlib
import json
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "neorl_industrial"
ROOT = "neorl_industrial"
#: Lowest first; a module may import its own layer and the ones before it.
LAYERS = ["core", "functional", "wrappers", "integration", "application"]
#: The layer of each module (or package) beside the four layers' packages.
TOP_LEVEL = {
    # Imported before any submodule: it may not pull in more than the core.
    "__init__": "core",
    # The distribution's version and its extras: read by every layer, import none.
    "version": "core",
    "extras": "core",
    # The command line, with the commands' glue around the run functions.
    "cli": "application",
    "__main__": "application",
}
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
#: Modules that reach outside the process: the runtime's and the wrappers' business (``os``
#: is allowed for what it tells of the machine; its environment is checked below).
PURE_FORBIDDEN = {"socket", "subprocess", "threading", "multiprocessing", "signal"}
#: Calls that read or write files: the core takes and returns data, never paths.
FILE_CALLS = {"open", "read_text", "write_text", "read_bytes", "write_bytes", "mkdir", "unlink"}
LAYER_PACKAGES = {
    "core": ["agents", "environments", "safety", "optimizers", "utils"],
    "functional": ["state_management", "transformations"],
    "wrappers": ["agents", "environments", "training"],
    "integration": ["mlflow", "safety", "deployment", "datasets"],
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([ROOT, *parts])


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _layer(module: str) -> str:
    """The layer of a module of the package, from its dotted name."""
    parts = module.split(".")[1:] or ["__init__"]
    if parts[0] in LAYERS[:4]:
        return parts[0]
    assert parts[0] in TOP_LEVEL, (
        f"{module}: state the layer of the top-level module {parts[0]!r} in TOP_LEVEL"
    )
    return TOP_LEVEL[parts[0]]


def _resolve(module: str, node: ast.ImportFrom) -> str:
    """The absolute name a ``from`` import names (relative imports resolved)."""
    if node.level == 0:
        return node.module or ""
    is_package = MODULES[module].name == "__init__.py"
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _type_checking_only(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return isinstance(test, ast.Name | ast.Attribute) and ast.unparse(test).endswith(
        "TYPE_CHECKING"
    )


def _assigned(tree: ast.Module) -> dict[str, ast.AST]:
    """The values of the names a module assigns at its top."""
    values: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            values.update((t.id, node.value) for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            values[node.target.id] = node.value
    return values


def _dynamic(module: str, call: ast.Call, tree: ast.Module) -> list[str]:
    """The modules a call imports by name: ``import_module("...")``, and the modules of a
    ``lazy_exports(__name__, {module: names})`` table (imported on first use)."""
    function = call.func
    called = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
    strings: list[ast.AST] = []
    if called == "import_module" and call.args:
        strings = [call.args[0]]
    elif called == "lazy_exports" and len(call.args) > 1:
        table = call.args[1]
        if isinstance(table, ast.Name):  # a table assigned at the top of the module
            table = _assigned(tree).get(table.id, table)
        strings = list(table.keys) if isinstance(table, ast.Dict) else []
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    names = []
    for node in strings:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value
            names.append(package + name if name.startswith(".") else name)
    return names


@cache
def _imports(module: str) -> frozenset[tuple[str, int, bool]]:
    """``(imported name, line, runs)`` of every import in the module, wherever it stands:
    at the top, inside a function, or under ``if TYPE_CHECKING:`` (``runs`` false: it
    never runs), and of the modules it imports by name (:func:`_dynamic`). ``from a
    import b`` names ``a.b`` when that is a module of the package, else ``a``."""
    found = set()
    tree = ast.parse(MODULES[module].read_text())

    def visit(node: ast.AST, runs: bool) -> None:
        if isinstance(node, ast.Call):
            found.update((name, node.lineno, runs) for name in _dynamic(module, node, tree))
        if isinstance(node, ast.Import):
            found.update((alias.name, node.lineno, runs) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.add((submodule if submodule in MODULES else source, node.lineno, runs))
        if _type_checking_only(node):
            for child in node.body:
                visit(child, False)
            for child in node.orelse:
                visit(child, runs)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, runs)

    visit(tree, True)
    return frozenset(found)


def _runs(module: str) -> set[str]:
    """The package's modules that importing ``module`` runs directly: the ones it imports
    (from anywhere in it, a function included), and the packages above those that are
    not above ``module`` too (their ``__init__`` runs first)."""
    own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
    edges = set()
    for name, _, runs in _imports(module):
        if not runs or name.split(".")[0] != ROOT:
            continue
        edges.add(name)
        parts = name.split(".")
        for i in range(1, len(parts)):
            ancestor = ".".join(parts[:i])
            if ancestor not in own:
                edges.add(ancestor)
    return (edges & set(MODULES)) - {module}


def test_every_module_has_a_layer():
    for module in MODULES:
        assert _layer(module) in LAYERS


def test_the_layers_and_their_packages_exist():
    for layer, packages in LAYER_PACKAGES.items():
        for package in packages:
            init = PACKAGE / layer / package / "__init__.py"
            assert init.is_file(), f"missing {init.relative_to(PACKAGE)}"
            assert ast.get_docstring(ast.parse(init.read_text())), f"{init} needs a docstring"


@pytest.mark.parametrize("module", list(MODULES))
def test_imports_point_downwards(module):
    layer = _layer(module)
    allowed = LAYERS[: LAYERS.index(layer) + 1]
    for name, line, _ in sorted(_imports(module)):
        top = name.split(".")[0]
        where = f"{MODULES[module].relative_to(PACKAGE)}:{line}"
        if top == ROOT:
            assert name in MODULES, f"{where}: {name} is not a module of the package"
            assert _layer(name) in allowed, f"{where}: {layer} must not import {name}"
        if layer == "core":
            assert top not in CORE_FORBIDDEN, f"{where}: core must not import {name}"
        if layer in ("core", "functional"):
            assert top not in PURE_FORBIDDEN, f"{where}: {layer} must not import {name}"


def test_no_import_cycles():
    """Modules that import each other, even from inside a function (an import put there
    to dodge the cycle is still one), fail with the cycle named. Only an import under
    ``if TYPE_CHECKING:`` (for annotations; it never runs) is not an edge."""
    graph = graphlib.TopologicalSorter({module: _runs(module) for module in MODULES})
    try:
        graph.prepare()
    except graphlib.CycleError as error:
        pytest.fail("import cycle: " + " -> ".join(error.args[1]))


def _package(module: str) -> str:
    """The package a module belongs to (a package's ``__init__`` is the package)."""
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def test_no_import_cycles_between_packages():
    """Packages do not import each other either (``core.environments`` and ``core.safety``,
    say), even when no two of their modules do: one of the two must sit below the
    other. A subpackage's imports of the packages above it are not edges (it is part of
    them)."""
    graph: dict[str, set[str]] = {_package(module): set() for module in MODULES}
    for module in MODULES:
        source = _package(module)
        for imported in _runs(module):
            target = _package(imported)
            if target != source and not source.startswith(target + "."):
                graph[source].add(target)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        pytest.fail("import cycle between packages: " + " -> ".join(error.args[1]))


def _pure_modules():
    return [module for module in MODULES if _layer(module) in ("core", "functional")]


@pytest.mark.parametrize("module", _pure_modules())
def test_the_pure_layers_touch_no_process_state(module):
    """No environment variables and no global JAX settings below the wrappers: those are
    the process's, set by its entry point (``neorl_industrial.cli.runtime``)."""
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        where = f"{MODULES[module].relative_to(PACKAGE)}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute):
            assert node.attr not in ("environ", "getenv", "putenv"), f"{where}: os.{node.attr}"
            base = node.value
            assert not (
                isinstance(base, ast.Name) and base.id == "jax" and node.attr == "config"
            ), f"{where}: jax.config"
        if isinstance(node, ast.ImportFrom) and node.module == "jax":
            names = {alias.name for alias in node.names}
            assert "config" not in names, f"{where}: from jax import config"


@pytest.mark.parametrize(
    "module", [module for module in MODULES if _layer(module) == "core"], ids=str
)
def test_the_core_reads_and_writes_no_files(module):
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Call):
            function = node.func
            name = (
                function.attr
                if isinstance(function, ast.Attribute)
                else getattr(function, "id", None)
            )
            assert name not in FILE_CALLS, f"{module}:{node.lineno}: core calls {name}()"


IMPORT_EACH = textwrap.dedent(
    """
    import importlib, json, sys

    modules, forbidden = json.loads(sys.argv[1])
    loaded = {}
    for module, layer in modules:
        importlib.import_module(module)
        found = sorted(
            name for name in sys.modules
            if any(name == f or name.startswith(f + ".") for f in forbidden[layer])
        )
        if found:
            loaded[module] = found
            break
    print(json.dumps(loaded))
    """
)


def test_importing_the_pure_layers_loads_nothing_above_them():
    """Each module of the core and of the functional layer, imported one after the other
    in a fresh interpreter: none loads Gymnasium, MLflow or a higher layer. (What one
    loads stays loaded, so the first module that loads something is the one named.)"""
    above = {
        "core": [f"{ROOT}.{name}" for name in ("functional", "wrappers", "integration")],
        "functional": [f"{ROOT}.{name}" for name in ("wrappers", "integration")],
    }
    # flax.linen loads yaml itself; the core only must not import it.
    libraries = CORE_FORBIDDEN - {"yaml"}
    forbidden = {
        layer: sorted(
            {*names, *libraries}
            | {f"{ROOT}.{name}" for name, at in TOP_LEVEL.items() if at not in ("core", layer)}
        )
        for layer, names in above.items()
    }
    modules = [(m, _layer(m)) for m in MODULES if _layer(m) == "core"]
    modules += [(m, _layer(m)) for m in MODULES if _layer(m) == "functional"]
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_EACH, json.dumps([modules, forbidden])],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {}
