"""Configs are frozen and hold their final form: ``__post_init__`` validates, ``create``
converts. Equal configs hash equal, so a config is a static argument of ``jit`` that does
not recompile."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import neorl_industrial
from neorl_industrial.core.agents import SACConfig, TD3BCConfig
from neorl_industrial.core.agents.fqe import FQEConfig
from neorl_industrial.core.agents.registry import ALGORITHMS, validate_hyperparameters
from neorl_industrial.core.environments import Task, TaskError
from neorl_industrial.core.models import DynamicsConfig

PACKAGE = Path(neorl_industrial.__file__).parent
LAYERS = ("core", "functional")

#: Where ``object.__setattr__`` may stay, with why: ``traced_config`` sets tracers on a
#: fresh copy of a config, which ``dataclasses.replace`` would validate by branching on them.
ALLOWED_SETATTR = {("functional/transformations/sweep.py", "traced_config")}

CONFIG_TYPES = sorted(
    {entry.config_type for entry in ALGORITHMS.values()} | {FQEConfig, SACConfig},
    key=lambda config_type: config_type.__name__,
)


def _setattr_uses(package: Path = PACKAGE) -> list[tuple[str, int, str]]:
    """``(file, line, enclosing function)`` of every ``object.__setattr__`` reference
    (a call or an alias) in the layers."""
    found = []
    for layer in LAYERS:
        for path in sorted((package / layer).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            relative = path.relative_to(package).as_posix()

            def visit(node: ast.AST, function: str, relative: str = relative) -> None:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    function = node.name
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr == "__setattr__"
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "object"
                ):
                    found.append((relative, node.lineno, function))
                for child in ast.iter_child_nodes(node):
                    visit(child, function)

            visit(tree, "<module>")
    return found


def test_no_post_init_in_core_or_functional_mutates_its_config():
    mutating = [
        f"{file}:{line}" for file, line, function in _setattr_uses() if function == "__post_init__"
    ]
    assert not mutating, f"object.__setattr__ in __post_init__ at {', '.join(mutating)}"


def test_object_setattr_stays_only_where_it_is_needed():
    unexpected = [
        f"{file}:{line} ({function})"
        for file, line, function in _setattr_uses()
        if (file, function) not in ALLOWED_SETATTR
    ]
    assert not unexpected, f"object.__setattr__ at {', '.join(unexpected)}"


def test_the_scan_finds_a_mutating_post_init(tmp_path):
    # The scan itself can fail: a config that converts its field in place is found.
    layer = tmp_path / "core"
    layer.mkdir()
    (layer / "bad.py").write_text(
        "class Config:\n"
        "    def __post_init__(self):\n"
        "        set_ = object.__setattr__\n"
        "        set_(self, 'hidden', tuple(self.hidden))\n"
    )
    assert _setattr_uses(tmp_path) == [("core/bad.py", 3, "__post_init__")]


@pytest.mark.parametrize("config_type", CONFIG_TYPES, ids=lambda t: t.__name__)
def test_a_config_built_from_lists_equals_and_hashes_as_one_from_tuples(config_type):
    mean32 = np.array([0.5, -1.25, 3.0], np.float32)
    values = {"hidden": [32, np.int64(16)], "obs_mean": mean32, "obs_std": [1, 2, 0.5]}
    stored = {"hidden": (32, 16), "obs_mean": (0.5, -1.25, 3.0), "obs_std": (1.0, 2.0, 0.5)}
    if "cost_limits" in {field for field in config_type.__dataclass_fields__}:
        values["cost_limits"] = np.array([25, 40])
        stored["cost_limits"] = (25.0, 40.0)
    from_lists = config_type.create(**values)
    from_tuples = config_type(**stored)
    assert from_lists == from_tuples
    assert hash(from_lists) == hash(from_tuples)
    assert type(from_lists.hidden) is tuple and type(from_lists.obs_mean[0]) is float
    # The direct constructor takes the final form only, and names the field.
    with pytest.raises(TypeError, match="hidden: expected a tuple of int values"):
        config_type(hidden=[32, 16])
    with pytest.raises(TypeError, match="obs_mean: expected a tuple of float values"):
        config_type(obs_mean=mean32, obs_std=stored["obs_std"])


def test_safe_configs_take_cost_limits_in_their_final_form():
    lag = ALGORITHMS["td3bc-lag"].config_type
    with pytest.raises(TypeError, match="cost_limits: expected a tuple of float values"):
        lag(cost_limits=[1.0])
    with pytest.raises(TypeError, match="cost_limits"):
        ALGORITHMS["bc-safe"].config_type(cost_limits=(1, 2))
    # Validation still raises through the constructor, naming the field.
    with pytest.raises(ValueError, match=r"cost_limits\[1\]: must be a finite number >= 0"):
        lag.create(cost_limits=[1, -2])


def test_create_names_the_field_it_cannot_convert_and_keeps_validation():
    with pytest.raises(ValueError, match=r"hidden\.0: .*integer"):
        TD3BCConfig.create(hidden=[8.5])
    with pytest.raises(ValueError, match=r"tau: must lie in \(0, 1\], got 0.0"):
        TD3BCConfig.create(tau=0.0)
    with pytest.raises(ValueError, match="obs_std: expected 3 values like obs_mean, got 2"):
        SACConfig.create(obs_mean=[0, 0, 0], obs_std=[1, 1])
    with pytest.raises(ValueError, match="obs_mean: expected finite numbers"):
        SACConfig.create(obs_mean=[0, math.nan], obs_std=[1, 1])


def test_replace_converts_like_create():
    config = FQEConfig(hidden=(8,))
    moments = np.zeros(3, np.float32), np.ones(3, np.float32)
    replaced = config.replace(obs_mean=moments[0], obs_std=moments[1])
    assert replaced == FQEConfig(hidden=(8,), obs_mean=(0.0,) * 3, obs_std=(1.0,) * 3)
    assert config.obs_mean is None  # the original is unchanged


def test_dynamics_config_from_a_saved_card_equals_the_one_saved():
    config = DynamicsConfig(hidden=(16, 8), n_members=3, n_elites=2)
    restored = DynamicsConfig.create(**config.to_dict())  # hidden as a JSON list
    assert restored == config and hash(restored) == hash(config)
    with pytest.raises(TypeError, match="hidden"):
        DynamicsConfig(**config.to_dict())


def test_hyperparameters_from_a_file_build_the_same_config():
    from_file = validate_hyperparameters("bc-safe", {"hidden": [8, 8], "cost_limits": [3, 4]})
    direct = ALGORITHMS["bc-safe"].config_type(hidden=(8, 8), cost_limits=(3.0, 4.0))
    assert from_file == direct and hash(from_file) == hash(direct)


def test_equal_configs_do_not_recompile_a_jitted_function():
    traces = []

    def scaled(config: TD3BCConfig, x: jax.Array) -> jax.Array:
        traces.append(config)
        return x * config.alpha * len(config.hidden)

    jitted = jax.jit(scaled, static_argnums=0)
    x = jnp.ones(2)
    first = jitted(TD3BCConfig.create(hidden=[4, 4], obs_mean=[0.0], obs_std=[1]), x)
    second = jitted(TD3BCConfig(hidden=(4, 4), obs_mean=(0.0,), obs_std=(1.0,)), x)
    np.testing.assert_allclose(first, second)
    assert len(traces) == 1
    jitted(TD3BCConfig.create(hidden=[4, 4, 4]), x)
    assert len(traces) == 2  # a different config is a different program


def test_a_task_from_lists_equals_one_from_tuples_and_the_stored_form_is_enforced():
    values = dict(
        name="tank",
        observation_names=["level", "temperature"],
        action_names=["valve"],
        action_low=[0],
        action_high=np.array([100.0]),
        observation_low=[0.0, -math.inf],
        cost_names=["alarm"],
        cost_limits={"alarm": 12},
    )
    from_lists = Task.create(**values)
    from_tuples = Task.create(
        **{key: tuple(value) if isinstance(value, list) else value for key, value in values.items()}
    )
    assert from_lists == from_tuples
    assert from_lists.action_high == (100.0,) and type(from_lists.action_high[0]) is float
    assert from_lists.observation_high == (math.inf, math.inf)
    assert from_lists.observation_units == (None, None)
    assert Task.from_dict(from_lists.to_dict()) == from_lists
    stored = {name: getattr(from_lists, name) for name in Task.__dataclass_fields__}
    assert Task(**stored) == from_lists
    with pytest.raises(TaskError, match="action_low: expected"):
        Task(**{**stored, "action_low": [0.0]})
    with pytest.raises(TaskError, match="observation_units: expected"):
        Task(**{**stored, "observation_units": None})
    with pytest.raises(TaskError, match="action_names: required"):
        Task.create(name="tank", observation_names=("level",))
