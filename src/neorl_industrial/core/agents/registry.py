"""Algorithms by name: what a config file or the command line asks for.

Each entry knows its factory, its frozen config dataclass (whose field defaults are the
published defaults) and whether it is cost-aware. ``build_algorithm`` validates the
hyperparameters a person wrote (unknown names, with a suggestion; wrong types, naming
the field) before anything is traced.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Mapping
from typing import Any

import pydantic

from neorl_industrial.core.agents.bc import BCConfig, make_bc
from neorl_industrial.core.agents.cost import DEFAULT_COST_LIMITS
from neorl_industrial.core.agents.cql import CQLConfig, make_cql
from neorl_industrial.core.agents.discrete import (
    DiscreteBCConfig,
    DiscreteCQLConfig,
    make_discrete_bc,
    make_discrete_cql,
)
from neorl_industrial.core.agents.iql import IQLConfig, make_iql
from neorl_industrial.core.agents.iql_lag import IQLLagConfig, make_iql_lag
from neorl_industrial.core.agents.mopo import (
    MOPOBCConfig,
    MOPOConfig,
    MOPOLagConfig,
    make_mopo,
    make_mopo_bc,
    make_mopo_lag,
)
from neorl_industrial.core.agents.networks import check_tuple
from neorl_industrial.core.agents.td3bc import TD3BCConfig, make_td3bc
from neorl_industrial.core.agents.td3bc_lag import TD3BCLagConfig, make_td3bc_lag
from neorl_industrial.core.agents.types import Algorithm
from neorl_industrial.core.safety.contract import SafetyContract, check_cost_limits

__all__ = [
    "ALGORITHMS",
    "RANGES",
    "AlgorithmEntry",
    "BCSafeConfig",
    "HyperparameterError",
    "Range",
    "algorithm_entry",
    "build_algorithm",
    "check_ranges",
    "validate_hyperparameters",
]


class HyperparameterError(ValueError):
    """A hyperparameter that does not fit the algorithm: names the field."""


@dataclasses.dataclass(frozen=True)
class BCSafeConfig(BCConfig):
    """BC-Safe (OSRL): behaviour cloning of the dataset's episodes whose cost stays within
    every limit. The selection happens on the data (``select_safe_episodes``); the
    network and loss are BC's.

    Attributes:
        cost_limits: episode cost limit of each cost channel.
    """

    cost_limits: tuple[float, ...] = DEFAULT_COST_LIMITS

    def __post_init__(self) -> None:
        super().__post_init__()
        check_cost_limits(self.cost_limits)
        check_tuple("cost_limits", self.cost_limits, float)


@dataclasses.dataclass(frozen=True)
class AlgorithmEntry:
    """One algorithm the platform offers.

    Attributes:
        name: the name people use (``td3bc-lag``).
        factory: ``factory(config, obs_size, action_size_or_num_actions) -> Algorithm``.
        config_type: the frozen dataclass of its hyperparameters.
        safe: it takes ``cost_limits`` (and ``discount``/``episode_length`` when its
            config has them) and respects them, by learning (a Lagrangian) or by data
            selection (``select_safe_data``).
        discrete: it acts on discrete actions.
        select_safe_data: it trains only on the episodes within the cost limits.
        summary: one line for listings.
        reward_scaling: how its rewards are scaled for training unless a run says
            otherwise (``REWARD_SCALINGS`` in ``functional.state_management``): IQL's is
            its paper's ``return_range`` (rewards times 1000 / the range of episode
            returns, which sets the scale its inverse temperature ``beta`` was tuned at);
            the others divide by the rewards' spread (``std``): TD3+BC's actor loss is
            invariant to the reward scale, and CQL's penalty weight was tuned on D4RL's
            rewards, whose per-step spread is about one.
        model_based: it trains on rollouts of a fitted plant model, which its factory
            takes as ``model=`` (a ``ModelHandle``; without one it can act, not train).
    """

    name: str
    factory: Callable[[Any, int, int], Algorithm]
    config_type: type
    safe: bool
    discrete: bool
    summary: str
    select_safe_data: bool = False
    reward_scaling: str = "std"
    model_based: bool = False

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(field.name for field in dataclasses.fields(self.config_type))

    def defaults(self) -> dict[str, Any]:
        """The published defaults of every hyperparameter, as plain values."""
        return _plain(dataclasses.asdict(self.config_type()))


ALGORITHMS: dict[str, AlgorithmEntry] = {
    entry.name: entry
    for entry in (
        AlgorithmEntry("bc", make_bc, BCConfig, False, False, "behaviour cloning"),
        AlgorithmEntry(
            "bc-safe",
            make_bc,
            BCSafeConfig,
            True,
            False,
            "behaviour cloning of the episodes within the cost limits",
            select_safe_data=True,
        ),
        AlgorithmEntry("td3bc", make_td3bc, TD3BCConfig, False, False, "TD3+BC"),
        AlgorithmEntry(
            "td3bc-lag",
            make_td3bc_lag,
            TD3BCLagConfig,
            True,
            False,
            "TD3+BC with cost critics and PID Lagrange multipliers",
        ),
        AlgorithmEntry(
            "iql",
            make_iql,
            IQLConfig,
            False,
            False,
            "implicit Q-learning",
            reward_scaling="return_range",
        ),
        AlgorithmEntry(
            "iql-lag",
            make_iql_lag,
            IQLLagConfig,
            True,
            False,
            "IQL with cost critics and PID Lagrange multipliers",
            reward_scaling="return_range",
        ),
        AlgorithmEntry(
            "cql",
            make_cql,
            CQLConfig,
            False,
            False,
            "conservative Q-learning (SAC actor; lagrange=true for CQL-α)",
        ),
        AlgorithmEntry(
            "mopo",
            make_mopo,
            MOPOConfig,
            False,
            False,
            "MOPO: SAC on real and uncertainty-penalized plant-model rollouts",
            model_based=True,
        ),
        AlgorithmEntry(
            "mopo-bc",
            make_mopo_bc,
            MOPOBCConfig,
            False,
            False,
            "MOPO-BC: TD3+BC, its critics on real and penalized plant-model rollouts",
            model_based=True,
        ),
        AlgorithmEntry(
            "mopo-lag",
            make_mopo_lag,
            MOPOLagConfig,
            True,
            False,
            "MOPO with TD3BC-Lag: shielded model rollouts, cost critics, PID multipliers",
            model_based=True,
        ),
        AlgorithmEntry(
            "discrete-bc", make_discrete_bc, DiscreteBCConfig, False, True, "discrete BC"
        ),
        AlgorithmEntry(
            "discrete-cql", make_discrete_cql, DiscreteCQLConfig, False, True, "discrete CQL"
        ),
    )
}


def algorithm_entry(name: str) -> AlgorithmEntry:
    """The registered algorithm ``name``.

    Raises:
        HyperparameterError: for an unknown name, with the closest known one.
    """
    key = str(name).strip().lower().replace("_", "-").replace("+", "")
    if key not in ALGORITHMS:
        close = difflib.get_close_matches(key, list(ALGORITHMS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise HyperparameterError(
            f"algorithm: unknown {name!r}{hint}; expected one of {sorted(ALGORITHMS)}"
        )
    return ALGORITHMS[key]


def validate_hyperparameters(
    name: str,
    hyperparameters: Mapping[str, Any] | None,
    contract: SafetyContract | None = None,
) -> Any:
    """The config dataclass of algorithm ``name`` with ``hyperparameters`` applied; a
    cost-aware algorithm's ``cost_limits`` are ``contract``'s (the one holder of a run's
    limits) when it is given.

    Raises:
        HyperparameterError: naming an unknown hyperparameter (with the closest known
            one), one whose value does not fit its type, or ``cost_limits`` given beside
            a contract.
    """
    entry = algorithm_entry(name)
    values = dict(hyperparameters or {})
    if contract is not None and entry.safe:
        if "cost_limits" in values:
            raise HyperparameterError(
                "algorithm.hyperparameters.cost_limits: the run's safety contract holds its "
                "cost limits; set them there (safety.cost_limits, or cost_limits=)"
            )
        values["cost_limits"] = [float(limit) for limit in contract.limits()]
    # Nested settings (a PID's gains) are merged over the algorithm's own defaults, so
    # ``pid: {kp: 0.1}`` changes one gain and keeps the others.
    values = _merge(entry.defaults(), values, "algorithm.hyperparameters")
    # Before the config's own checks, so that every refusal states the allowed range.
    check_ranges(values, "algorithm.hyperparameters")
    try:
        # Types checked by pydantic against the dataclass's annotations.
        config = pydantic.TypeAdapter(entry.config_type).validate_python(values, strict=False)
    except pydantic.ValidationError as error:
        problems = "; ".join(
            f"algorithm.hyperparameters.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
            if e["loc"]
            # The config's own check names its field first.
            else f"algorithm.hyperparameters.{e['msg'].removeprefix('Value error, ')}"
            for e in error.errors()
        )
        raise HyperparameterError(problems) from None
    except (TypeError, ValueError) as error:
        raise HyperparameterError(f"algorithm.hyperparameters ({entry.name}): {error}") from None
    found = _non_finite(dataclasses.asdict(config), "algorithm.hyperparameters")
    if found is not None:
        # A NaN learning rate or α trains silently into NaN parameters; no algorithm
        # reads infinity as a setting either.
        raise HyperparameterError(f"{found[0]}: expected a finite number, got {found[1]}")
    # Again on the coerced values: YAML reads ``1e308`` (no dot) as text, which the
    # first check cannot compare and the type check turns into a number.
    check_ranges(dataclasses.asdict(config), "algorithm.hyperparameters")
    return config


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a numeric hyperparameter may take: ``low`` to ``high``, each end
    included unless ``open_low``/``open_high``; ``what`` names the kind of setting."""

    low: float
    high: float
    what: str
    open_low: bool = False
    open_high: bool = False

    def holds(self, value: float) -> bool:
        above = value > self.low if self.open_low else value >= self.low
        below = value < self.high if self.open_high else value <= self.high
        return above and below

    def __str__(self) -> str:
        return (
            f"{'(' if self.open_low else '['}{self.low:g}, {self.high:g}"
            f"{')' if self.open_high else ']'}"
        )


_RATE = Range(0.0, 1.0, "a learning rate", open_low=True)
_SHARE = Range(0.0, 1.0, "a share", open_low=True)
_GAIN = Range(0.0, 1000.0, "a gain")
#: The sane range of every numeric hyperparameter, by its name in any algorithm's config
#: (nested ones by their own name: ``pid.kp`` is ``kp``). A finite value far outside
#: these trains nothing (a learning rate of 1e308 turns every parameter into NaN in one
#: step; a 1e6 inverse temperature overflows IQL's weights), so it is refused before
#: anything is traced. Names not listed are held to ``_ANY``.
RANGES: dict[str, Range] = {
    **dict.fromkeys(
        (
            "learning_rate",
            "actor_lr",
            "critic_lr",
            "value_lr",
            "alpha_lr",
            "alpha_prime_lr",
            "cost_critic_lr",
            "lr",
        ),
        _RATE,
    ),
    "tau": Range(0.0, 1.0, "a target-network rate", open_low=True),
    "discount": Range(0.0, 1.0, "a discount", open_low=True),
    "gamma": Range(0.0, 1.0, "a discount", open_low=True),
    "expectile": Range(0.0, 1.0, "an expectile", open_low=True, open_high=True),
    "cost_expectile": Range(0.0, 1.0, "an expectile", open_low=True, open_high=True),
    "cvar_level": _SHARE,
    "real_ratio": Range(0.0, 1.0, "a share"),
    "alpha": Range(0.0, 1000.0, "TD3+BC's alpha", open_low=True),
    "beta": Range(0.0, 1000.0, "IQL's inverse temperature", open_low=True),
    "max_exp_advantage": Range(0.0, 1e4, "a weight clip", open_low=True),
    "cql_alpha": Range(0.0, 1000.0, "CQL's penalty weight"),
    "temperature": Range(0.0, 100.0, "a temperature", open_low=True),
    "target_action_gap": Range(0.0, 1e4, "CQL's target gap"),
    "penalty_coef": Range(0.0, 1000.0, "MOPO's lambda"),
    "policy_noise": Range(0.0, 2.0, "a noise scale in the policy's [-1, 1]"),
    "noise_clip": Range(0.0, 2.0, "a noise clip in the policy's [-1, 1]"),
    "kappa": Range(0.0, 100.0, "a Huber threshold", open_low=True),
    "wang_eta": Range(-10.0, 10.0, "a distortion"),
    "kp": _GAIN,
    "ki": _GAIN,
    "kd": _GAIN,
    "max_multiplier": Range(0.0, 1e6, "a multiplier bound", open_low=True),
    "initial": Range(0.0, 1e6, "a multiplier"),
    "initial_alpha": Range(0.0, 1000.0, "an entropy weight", open_low=True),
    "reward_scale": Range(0.0, 1e6, "a reward scale", open_low=True),
    "cost_floor": Range(0.0, 1e6, "a cost floor"),
    "max_grad_norm": Range(0.0, 1e6, "a gradient norm", open_low=True),
    "policy_freq": Range(1, 100, "updates per actor update"),
    "n_quantiles": Range(1, 1024, "a number of quantiles"),
    "n_policy_quantiles": Range(1, 1024, "a number of quantiles"),
    "embedding_size": Range(1, 4096, "a width"),
    "n_actions": Range(1, 1000, "sampled actions"),
    "n_critics": Range(1, 100, "critics"),
    "rollout_horizon": Range(1, 1000, "model steps"),
    "rollout_starts": Range(1, 1e6, "rollouts per update"),
    "buffer_size": Range(1, 1e8, "transitions"),
    "episode_length": Range(1, 1e8, "steps"),
    "bc_steps": Range(0, 1e9, "updates"),
}
#: Any other number (a reward shift, a target entropy): finite and of a plant's magnitude.
_ANY = Range(-1e6, 1e6, "a setting")
#: Data, not settings: the observation statistics come from the data, the cost limits
#: from the safety contract (checked where it is resolved).
_UNRANGED = ("obs_mean", "obs_std", "cost_limits", "hidden")


def check_ranges(values: Mapping[str, Any], where: str) -> None:
    """Raises :class:`HyperparameterError` naming the first number of ``values`` (a
    config as a dict, nested) outside its :data:`RANGES` entry, with the allowed range."""
    for name, value in values.items():
        location = f"{where}.{name}"
        if name in _UNRANGED:
            continue
        if isinstance(value, Mapping):
            check_ranges(value, location)
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            continue  # not a number (its type is checked next), or NaN (named as such)
        allowed = RANGES.get(name, _ANY)
        if not allowed.holds(value):
            raise HyperparameterError(
                f"{location}: expected {allowed.what} in {allowed}, got {value:g}"
            )


def build_algorithm(
    name: str,
    obs_size: int,
    action_size: int,
    hyperparameters: Mapping[str, Any] | None = None,
    *,
    contract: SafetyContract | None = None,
) -> tuple[Algorithm, Any]:
    """``(algorithm, config)`` for the registered ``name``, its hyperparameters validated
    (and a cost-aware one's limits taken from ``contract``) as
    :func:`validate_hyperparameters` does: the one call that checks and builds it.
    ``action_size`` is the number of actions for a discrete algorithm."""
    entry = algorithm_entry(name)
    config = validate_hyperparameters(name, hyperparameters, contract)
    return entry.factory(config, obs_size, action_size), config


def _merge(defaults: dict[str, Any], values: Mapping[str, Any], where: str) -> dict[str, Any]:
    merged = dict(defaults)
    for field, value in values.items():
        if field not in defaults:
            close = difflib.get_close_matches(str(field), list(defaults), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise HyperparameterError(
                f"{where}.{field}: no such hyperparameter{hint}; known: {', '.join(defaults)}"
            )
        if isinstance(defaults[field], dict) and isinstance(value, Mapping):
            merged[field] = _merge(defaults[field], value, f"{where}.{field}")
        else:
            merged[field] = value
    return merged


def _non_finite(value: Any, where: str) -> tuple[str, float] | None:
    """The dotted location and value of the first NaN or infinite number, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where, value
    if isinstance(value, dict):
        items: Any = ((f"{where}.{key}", item) for key, item in value.items())
    elif isinstance(value, list | tuple):
        items = ((f"{where}[{index}]", item) for index, item in enumerate(value))
    else:
        return None
    for location, item in items:
        found = _non_finite(item, location)
        if found is not None:
            return found
    return None


def _plain(value: Any) -> Any:
    """Tuples to lists, recursively (for JSON and YAML)."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value
