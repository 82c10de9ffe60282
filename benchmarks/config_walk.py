"""Walks a training run's configuration and its cost limit through the layers.

Two measurements of one source tree (``--src``, the repository's ``src`` by default):

* **The walk** (dynamic): a tiny training run (``cli.run_glue.run_training``: TD3BC-Lag on two
  generated IB episodes, 10 updates, nothing written to MLflow) under a profiler. A
  *hand-off* is a call from a function of one layer to a function of another that
  receives the run's settings: a configuration object (``RunConfig``, one of its
  sections, a run plan) or settings copied out of one (two or more arguments, or keys of
  a mapping, named after the training, evaluation or checkpoint fields: ``updates``,
  ``eval_every``, ...); a method of the settings object itself (``plan.ope``,
  ``contract.limits()``) is a read, not a hand-off. A *climb* is a function returning
  such settings to a caller in a higher layer. The same for the cost limit: a
  ``SafetyContract``, a ``SafetySection``, a plan or configuration, a mapping with
  ``cost_limits``, or a non-empty ``cost_limits`` argument. Each distinct pair of
  functions counts once; settings that cross each layer once make one hand-off into
  each layer they reach and no climb.
* **The reads** (static, AST), by layer: the places under ``src/`` that read a section
  of the configuration off a configuration or plan (``config.training``,
  ``plan.evaluation``, ``evaluation.ope``), and the places that read a cost limit (an
  attribute, keyword or subscript named ``cost_limits``, a ``.limits()`` call).

The definitions, in short:

* *hand-off*: a distinct (caller, callee) pair of functions in two layers, the callee
  receiving the settings (or the cost limit) in its arguments;
* *climb*: a distinct (callee, caller) pair where a function returns the settings (or a
  cost limit) to a caller in a higher layer;
* *crossing each layer once*: ``entries_per_layer`` is 1 for every layer the settings
  reach and ``climbs`` is 0;
* *read site*: one place in the source (an AST node) that reads a section or a limit;
  the reads are counted statically, whether or not the walk runs them.

``python -m benchmarks.config_walk`` prints both as JSON; ``--src`` measures another
tree (an older checkout's ``src``) with the same tool, so two trees compare in one run.
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

#: The layers and where the modules beside their packages stand: the architecture test's.
from tests.test_architecture import LAYERS, ROOT, TOP_LEVEL

#: Configuration types, by class name (their module moves between trees).
CONFIG_TYPES = {
    "RunConfig",
    "RunPlan",
    "OPESettings",
    "OPESection",
    "TrainingSection",
    "EvaluationSection",
    "CheckpointSection",
    "ExportSection",
    "TrackingSection",
    "SafetySection",
    "SweepSection",
}
#: Settings copied out of the configuration, by argument name.
SETTING_NAMES = {
    "updates",
    "seeds",
    "batch_size",
    "chunk",
    "eval_every",
    "eval_episodes",
    "eval_horizon",
    "eval_shield",
    "eval_seed",
    "patience",
    "checkpoint_every",
    "keep_checkpoints",
    "normalize_observations",
    "reward_scaling",
    "ope",
}
LIMIT_TYPES = {"SafetyContract", "SafetySection", "RunPlan", "RunConfig"}


def layer_of(module: str) -> str:
    parts = module.split(".")[1:] or ["__init__"]
    if parts[0] in LAYERS[:4]:
        return parts[0]
    return TOP_LEVEL.get(parts[0], "application")


# ----- the walk ----------------------------------------------------------------------------
def _is_carrier(value: Any, types: set[str]) -> bool:
    """A configuration object (or a contract), or settings copied out of one: a mapping
    with two or more setting names, or a tuple holding either."""
    if type(value).__name__ in types:
        return True
    if isinstance(value, dict):
        return len(SETTING_NAMES & set(map(str, value))) >= 2 or (
            "LIMIT" in types and bool(value.get("cost_limits"))
        )
    if isinstance(value, tuple):
        return any(_is_carrier(item, types) for item in value[:8])
    return False


def _carries(frame: Any) -> tuple[bool, bool, bool]:
    """Whether the call's arguments carry the settings, the cost limit, and whether the
    call is a method of a carrier itself (a read of it, not a hand-off)."""
    code = frame.f_code
    count = code.co_argcount + code.co_kwonlyargcount
    names = list(code.co_varnames[:count])
    if code.co_flags & 0x08:  # **kwargs
        names.append(code.co_varnames[count + bool(code.co_flags & 0x04)])
    values = frame.f_locals
    config = limit = False
    settings = 0
    for name in names:
        value = values.get(name)
        config = config or _is_carrier(value, CONFIG_TYPES)
        limit = limit or _is_carrier(value, LIMIT_TYPES | {"LIMIT"})
        if name == "cost_limits" and value is not None and len(value):
            limit = True
        if name in SETTING_NAMES and value is not None:
            settings += 1
    method = (
        bool(names)
        and names[0] == "self"
        and (type(values.get("self")).__name__ in CONFIG_TYPES | LIMIT_TYPES)
    )
    return config or settings >= 2, limit, method


def _summary(edges: set[tuple[str, str, str, str]], climbs: set[tuple[str, str]]) -> dict:
    """Hand-offs into each layer (distinct caller -> callee functions crossing into it)
    and climbs (distinct functions returning the settings to a caller above)."""
    entries: dict[str, int] = collections.Counter(edge[3] for edge in edges)
    return {
        "entries_per_layer": dict(entries),
        "handoffs": len(edges),
        "climbs": len(climbs),
        "handoff_edges": sorted(f"{a} -> {b}" for a, b, _, _ in edges),
        "climb_edges": sorted(f"{a} -> {b}" for a, b in climbs),
    }


def walk(src: Path) -> dict[str, Any]:
    """Runs a tiny training run from ``src`` under the profiler; returns both walks."""
    sys.path.insert(0, str(src))
    import neorl_industrial
    from neorl_industrial.wrappers.training import RunConfig

    try:  # the command's glue: under cli/ since the run became a function of its plan
        from neorl_industrial.cli.run_glue import run_training
    except ImportError:  # an older tree's
        from neorl_industrial.pipeline import run_training

    package = Path(neorl_industrial.__file__).resolve().parent
    if not package.is_relative_to(src.resolve()):
        raise SystemExit(f"{package}: imported instead of the package under {src}")
    found: dict[str, tuple[set, set]] = {"config": (set(), set()), "cost_limit": (set(), set())}

    def where(frame: Any) -> tuple[str, str] | None:
        module = frame.f_globals.get("__name__", "") if frame is not None else ""
        if not module.startswith(ROOT + "."):
            return None
        return f"{module}.{frame.f_code.co_name}", layer_of(module)

    def profile(frame: Any, event: str, value: Any) -> None:
        if event not in ("call", "return"):
            return
        callee = where(frame)
        if callee is None:
            return
        caller = where(frame.f_back)
        if caller is None or caller[1] == callee[1]:
            return
        if event == "call":
            config, limit, method = _carries(frame)
            if method:
                return
            for key, carried in (("config", config), ("cost_limit", limit)):
                if carried:
                    found[key][0].add((caller[0], callee[0], caller[1], callee[1]))
        elif LAYERS.index(caller[1]) > LAYERS.index(callee[1]):
            if type(value).__name__ in CONFIG_TYPES | LIMIT_TYPES:
                return  # a constructor or accessor of the settings themselves
            for key, types in (("config", CONFIG_TYPES), ("cost_limit", LIMIT_TYPES | {"LIMIT"})):
                if _is_carrier(value, types):
                    found[key][1].add((callee[0], caller[0]))

    with tempfile.TemporaryDirectory() as output:
        config = RunConfig.from_dict(
            {
                "name": "walk",
                "output": output,
                "data": {"quality": "random", "trajectories": 2},
                "algorithm": {"name": "td3bc-lag", "hyperparameters": {"hidden": [8]}},
                "training": {"updates": 10, "chunk": 10, "batch_size": 8},
                "evaluation": {"episodes": 1, "horizon": 10},
                "tracking": {"enabled": False},
                "export": {"signing_keys": None},
            }
        )
        sys.setprofile(profile)
        try:
            run_training(config, export=False)
        finally:
            sys.setprofile(None)
    return {key: _summary(*value) for key, value in found.items()}


# ----- the reads ---------------------------------------------------------------------------
#: The configuration's sections, as attributes read off a configuration or a plan.
SECTIONS = {"training", "evaluation", "ope", "checkpoints", "export", "tracking", "safety"}
#: The names a configuration (or plan, or section) goes by where it is read.
HOLDERS = ("config", "plan", "evaluation", "run")


def _modules(src: Path) -> Any:
    for path in sorted((src / ROOT).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), ast.parse(path.read_text())


def _by_layer(by_module: dict[str, int]) -> dict[str, Any]:
    per_layer: dict[str, int] = collections.Counter()
    for module, count in by_module.items():
        per_layer[layer_of(module)] += count
    return {
        "total": sum(by_module.values()),
        "per_layer": dict(per_layer),
        "modules": len(by_module),
        "by_module": by_module,
    }


def section_reads(src: Path) -> dict[str, Any]:
    """The places under ``src`` that read a section of a run's configuration off the
    configuration or a plan (``config.training``, ``plan.evaluation``,
    ``evaluation.ope``), by layer and module."""
    by_module: dict[str, int] = {}
    for module, tree in _modules(src):
        count = 0
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in SECTIONS:
                holder = ast.unparse(node.value).split(".")[-1]
                count += holder.endswith(HOLDERS)
        if count:
            by_module[module] = count
    return _by_layer(by_module)


def limit_reads(src: Path) -> dict[str, Any]:
    """The places under ``src`` that read a cost limit, by layer and module."""
    by_module: dict[str, int] = {}
    for module, tree in _modules(src):
        count = 0
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "cost_limits":
                count += isinstance(node.ctx, ast.Load)
            elif isinstance(node, ast.keyword) and node.arg == "cost_limits":
                count += 1
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                count += node.slice.value == "cost_limits"
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                count += node.func.attr == "limits" and not node.args
        if count:
            by_module[module] = count
    return _by_layer(by_module)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[1] / "src")
    parser.add_argument("--static-only", action="store_true", help="skip the training run")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {
        "src": str(args.src),
        "config_section_reads": section_reads(args.src),
        "cost_limit_reads": limit_reads(args.src),
    }
    if not args.static_only:
        result["walk"] = walk(args.src)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
