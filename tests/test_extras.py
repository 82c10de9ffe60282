"""Installs that fit the use: the core install trains, evaluates, saves and exports from
Python; everything else is an extra, and a missing extra is named in one line.

The core install is simulated in a child interpreter whose import system refuses every
module an extra provides (a ``sys.meta_path`` finder that raises ``ModuleNotFoundError``),
so the suite's own environment, which has every extra, can check it.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
import tomllib
from functools import cache
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from neorl_industrial.cli.runtime import default_cache_dir
from neorl_industrial.extras import (
    EXTRAS,
    MissingExtraError,
    extra_of,
    missing_extra_message,
    optional_imports,
    require,
)
from tests.compile_flags import with_fast_compile

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
OPTIONAL = PROJECT["optional-dependencies"]
NAME = canonicalize_name(PROJECT["name"])
#: Every module an extra provides: what the child interpreter refuses.
BLOCKED = sorted({module for extra in EXTRAS.values() for module in extra.modules})


@cache
def _providers() -> dict[str, list[str]]:
    """Top-level module -> the installed distributions that provide it."""
    return packages_distributions()


def closure(requirements: list[str]) -> set[str]:
    """The distributions ``requirements`` install, dependencies included (as installed
    here); this project's own requirements (core and extras) read from pyproject.toml."""
    return set(_closure(tuple(requirements)))


@cache
def _closure(requirements: tuple[str, ...]) -> frozenset[str]:
    seen: set[str] = set()
    pending = [(Requirement(text), ()) for text in requirements]
    while pending:
        requirement, extras = pending.pop()
        name = canonicalize_name(requirement.name)
        if requirement.marker and not any(
            requirement.marker.evaluate({"extra": extra}) for extra in extras or ("",)
        ):
            continue
        if name == NAME:
            pending += [(Requirement(text), ()) for text in PROJECT["dependencies"]]
            for extra in requirement.extras:
                pending += [(Requirement(text), ()) for text in OPTIONAL[extra]]
            continue
        key = f"{name}[{','.join(sorted(requirement.extras))}]"
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            continue
        pending += [(Requirement(text), tuple(requirement.extras)) for text in requires]
    return frozenset(key.split("[")[0] for key in seen)


def test_the_table_names_every_extra_of_pyproject_and_only_those():
    assert set(EXTRAS) == set(OPTIONAL) - {"all", "dev", "bench"}
    assert modules_outside([PROJECT["name"]]) == BLOCKED  # the core has none of them
    assert {Requirement(text).name for text in OPTIONAL["all"]} == {PROJECT["name"]}
    assert set(Requirement(OPTIONAL["all"][0]).extras) == set(EXTRAS)
    # The test suite's install has every extra.
    dev = [Requirement(text) for text in OPTIONAL["dev"]]
    assert any(r.name == PROJECT["name"] and "all" in r.extras for r in dev)


def test_each_module_of_the_table_comes_with_its_extra_and_none_with_the_core():
    providers = _providers()
    core = closure(PROJECT["dependencies"])
    for name, extra in EXTRAS.items():
        installed = closure([f"{PROJECT['name']}[{name}]"])
        for module in extra.modules:
            distributions = {canonicalize_name(d) for d in providers.get(module, [])}
            assert distributions, f"{module} ({name}) is not installed here"
            assert distributions & installed, f"{module}: not installed by the {name!r} extra"
            assert not distributions & core, f"{module}: the core install has it already"


@cache
def _module_level_imports(path: Path) -> frozenset[tuple[str, bool]]:
    """``(top-level name, guarded)`` of the modules ``path`` imports outside its functions;
    guarded: inside ``with optional_imports():`` (the module needs that extra as a whole)."""
    found: set[tuple[str, bool]] = set()
    pending = [(node, False) for node in ast.parse(path.read_text()).body]
    while pending:
        node, guarded = pending.pop()
        if isinstance(node, ast.Import):
            found.update((alias.name.partition(".")[0], guarded) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.module.partition(".")[0], guarded))
        elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            guards = isinstance(node, ast.With) and any(
                isinstance(item.context_expr, ast.Call)
                and getattr(item.context_expr.func, "id", None) == "optional_imports"
                for item in node.items
            )
            pending += [(child, guarded or guards) for child in ast.iter_child_nodes(node)]
    return frozenset(
        (name, guarded)
        for name, guarded in found
        if name not in sys.stdlib_module_names and name not in ("neorl_industrial", "__future__")
    )


def test_the_core_layers_import_only_the_core_install_outside_functions():
    """A module of core/, functional/ or wrappers/ imports, outside its functions, only
    what the core's dependencies install, or an extra's package under
    ``optional_imports()`` (that module needs the extra, and only its own use imports it:
    the child below checks that the core's work loads none)."""
    providers = _providers()
    core = closure(PROJECT["dependencies"])
    package = ROOT / "src" / "neorl_industrial"
    for layer in ("core", "functional", "wrappers"):
        for path in sorted((package / layer).rglob("*.py")):
            for module, guarded in _module_level_imports(path):
                where = f"{path.relative_to(ROOT)}: {module}"
                if guarded:
                    assert extra_of(module) is not None, f"{where}: guarded but in no extra"
                    continue
                distributions = {canonicalize_name(d) for d in providers.get(module, [])}
                assert distributions & core, f"{where} is not core (optional_imports?)"


def test_the_modules_that_need_an_extra_say_so_on_import():
    """Outside the server's package (which checks for its extra on import), every
    module-level import of an extra's package is under ``optional_imports()``."""
    package = ROOT / "src" / "neorl_industrial"
    for path in sorted(package.rglob("*.py")):
        if "deployment" in path.parts or path.name == "policy_model.py":
            continue  # the server's package; the model code MLflow itself runs
        for module, guarded in _module_level_imports(path):
            assert guarded or extra_of(module) is None, f"{path.relative_to(ROOT)}: {module}"


def test_the_message_is_one_line_naming_the_extra_and_its_install_command():
    message = missing_extra_message("serve")
    assert message == "serving needs the 'serve' extra: pip install 'neorl-industrial[serve]'"
    for name in EXTRAS:
        assert "\n" not in missing_extra_message(name)
        assert f"pip install 'neorl-industrial[{name}]'" in missing_extra_message(name)
    assert extra_of("pyarrow.parquet") == "plant" and extra_of("mlflow") == "track"
    assert extra_of("numpy") is None and extra_of(None) is None
    with pytest.raises(KeyError):
        missing_extra_message("gpu")


def test_optional_imports_name_the_extra_and_let_other_errors_through():
    with pytest.raises(MissingExtraError) as caught, optional_imports():
        raise ModuleNotFoundError("No module named 'h5py'", name="h5py")
    assert caught.value.name == "h5py" and caught.value.extra == "plant"
    assert str(caught.value) == missing_extra_message("plant")
    assert isinstance(caught.value, ImportError)
    with pytest.raises(ModuleNotFoundError, match="nothing_like_it") as other, optional_imports():
        import nothing_like_it  # noqa: F401
    assert not isinstance(other.value, MissingExtraError)
    require("plant")  # installed here: nothing raised


def modules_outside(requirements: list[str]) -> list[str]:
    """The modules of the extras' table that an install of ``requirements`` lacks."""
    installed = closure(requirements)
    providers = _providers()
    return sorted(
        module
        for module in BLOCKED
        if not {canonicalize_name(d) for d in providers.get(module, [])} & installed
    )


#: A finder that refuses the modules ``$BLOCKED`` (a JSON list) names, as if they were not
#: installed; the names it refused are in ``refused``. Also a ``sitecustomize`` module.
FINDER = textwrap.dedent(
    """
    import importlib.abc, json, os, sys

    refused = set()

    class NotInstalled(importlib.abc.MetaPathFinder):
        blocked = frozenset(json.loads(os.environ["BLOCKED"]))

        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in self.blocked:
                refused.add(name.partition(".")[0])
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())
    """
)

#: The child: the core install, simulated.
CHILD = FINDER + textwrap.dedent(
    """
    import contextlib, io, tempfile

    from neorl_industrial.cli.runtime import enable_compilation_cache
    if os.environ["CACHE"]:
        enable_compilation_cache(os.environ["CACHE"], min_compile_seconds=0.0)

    import neorl_industrial
    from neorl_industrial.cli import main
    from neorl_industrial.extras import MissingExtraError
    from neorl_industrial.integration.datasets import DatasetCard, load_any, save_native
    from neorl_industrial.wrappers.agents import Agent
    from tests.wrappers.conftest import ib_shaped_dataset

    out = {}
    work = tempfile.mkdtemp()
    # Save and read a dataset, train, evaluate, save, load and export from Python (the
    # programs of tests/wrappers/agents/test_agent.py's td3bc, shared through the cache).
    card = DatasetCard(name="ib", env_id="IB-v0", cost_names=["fatigue", "consumption"])
    save_native(ib_shaped_dataset(), f"{work}/data", card)
    dataset, card = load_any(f"{work}/data")
    agent = Agent("td3bc", hidden=(8,))
    result = agent.fit(dataset, updates=10, chunk=10, evaluate=False)
    out["history"] = len(result.history)
    out["return"] = agent.evaluate(1, horizon=20)["summary"]["return"]["mean"]
    agent.save(f"{work}/agent")
    again = Agent.load(f"{work}/agent")
    observation = dataset.observations[0]
    out["same_action"] = bool((again.predict(observation) == agent.predict(observation)).all())
    out["exported"] = os.path.isfile(agent.export(f"{work}/policy") / "manifest.json")
    out["loaded"] = sorted({m.partition(".")[0] for m in sys.modules} & NotInstalled.blocked)

    # From Python, the packages and names that need an extra say which.
    errors = {}
    for label, statement in [
        ("deployment", "import neorl_industrial.integration.deployment"),
        ("plant_log", "from neorl_industrial.integration.datasets import load_plant_log"),
        ("tracker", "from neorl_industrial.integration.mlflow import MlflowTracker"),
    ]:
        try:
            exec(statement)
        except MissingExtraError as error:
            errors[label] = str(error)
    out["python"] = errors

    # The command line: exit status and what it writes to stderr.
    with open(f"{work}/run.yaml", "w") as file:
        file.write(f"data: {{path: {work}/data}}\\ntraining: {{updates: 2, chunk: 2}}\\n"
                   f"output: {work}/runs\\n")
    commands = {
        "serve": ["serve", "--model", f"{work}/policy", "--no-auth"],
        "models": ["models", "list"],
        "replay": ["mlflow", "replay", f"{work}/spool.jsonl"],
        "import": ["datasets", "import", os.environ["CSV"], "--schema", os.environ["SCHEMA"],
                   "--out", f"{work}/plant"],
        "train": ["train", "-c", f"{work}/run.yaml"],
        "onnx": ["export", f"{work}/agent", "--out", f"{work}/onnx", "--format", "onnx"],
    }
    out["cli"] = {}
    for label, argv in commands.items():
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            status = main(["--no-cache", *argv])
        out["cli"][label] = [status, stderr.getvalue()]
    out["refused"] = sorted(refused)
    print("RESULT " + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def core_install():
    """What the child interpreter did with only the core's packages importable."""
    cache = os.environ.get("NEORL_INDUSTRIAL_TEST_JAX_CACHE", "")
    if cache.lower() != "off":  # the suite's own cache, as tests/conftest.py sets it
        cache = cache or str(default_cache_dir().parent / "jax-tests")
    cache = "" if cache.lower() == "off" else cache
    example = ROOT / "examples" / "mixing-tank"
    environment = {
        **os.environ,
        "BLOCKED": json.dumps(modules_outside([PROJECT["name"]])),
        "CACHE": cache,
        "CSV": str(example / "mixing_tank.csv"),
        "SCHEMA": str(example / "schema.yaml"),
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": with_fast_compile(None),
        "MLFLOW_TRACKING_URI": "",
    }
    child = subprocess.run(
        [sys.executable, "-c", CHILD],
        env=environment,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stderr[-4000:]
    (line,) = [line for line in child.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


def test_the_core_install_trains_evaluates_saves_and_exports_from_python(core_install):
    assert core_install["history"] > 0
    assert isinstance(core_install["return"], float)
    assert core_install["same_action"] and core_install["exported"]
    # Nothing optional was loaded on the way, though something tried (the finder works).
    assert core_install["loaded"] == []
    assert core_install["refused"]


def test_importing_what_needs_an_extra_names_it(core_install):
    assert core_install["python"] == {
        "deployment": missing_extra_message("serve"),
        "plant_log": missing_extra_message("plant"),
        "tracker": missing_extra_message("track"),
    }


@pytest.mark.parametrize(
    ("command", "extra"),
    [
        ("serve", "serve"),
        ("models", "track"),
        ("replay", "track"),
        ("import", "plant"),
        ("train", "track"),  # tracking is on unless the run turns it off
        ("onnx", "onnx"),
    ],
)
def test_each_command_that_needs_an_extra_exits_2_with_one_line(core_install, command, extra):
    status, stderr = core_install["cli"][command]
    assert status == 2
    assert stderr.strip().splitlines() == [f"error: {missing_extra_message(extra)}"]
