"""Run configuration: pydantic models, YAML files and command-line overrides.

One :class:`RunConfig` describes a training run end to end (environment, data,
algorithm, training, evaluation, safety, checkpoints, output). Files live under
``configs/``; every field has a default, so a file names only what it changes. Errors
name the file and the dotted field (``training.batch_size``) and what would be right.

Overrides are ``dotted.field=value`` strings whose value is read as YAML
(``training.seeds=[0,1,2]``, ``algorithm.hyperparameters.hidden=[64,64]``).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from neorl_industrial.core.agents.registry import (
    HyperparameterError,
    algorithm_entry,
    validate_hyperparameters,
)
from neorl_industrial.core.utils.limits import MAX_MAGNITUDE
from neorl_industrial.core.utils.tree import copy_nested, merge_nested
from neorl_industrial.wrappers.hostio import YamlError, load_yaml_text, read_yaml

__all__ = [
    "AlgorithmSection",
    "CheckpointSection",
    "ConfigError",
    "DataSection",
    "EnvSection",
    "EvaluationSection",
    "ExportSection",
    "OPESection",
    "OPESettings",
    "RunConfig",
    "SafetySection",
    "SweepSection",
    "TrackingSection",
    "TrainingSection",
    "apply_overrides",
]


class ConfigError(ValueError):
    """A configuration that cannot be used: names the file and field."""


class _Section(BaseModel):
    # NaN or infinity in a setting (``--set evaluation.ope.discount=.nan``) is a typo,
    # never a meaning: it is refused by name rather than trained into a NaN run.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class EnvSection(_Section):
    """The simulator of the process, when there is one: it generates data (without
    ``data.path``) and evaluates the policies. None: the task comes from the dataset
    (a plant log's card) and evaluation is off policy; without ``data.path`` either, the
    Industrial Benchmark (``IB-v0``)."""

    id: str | None = None
    #: Overrides of the environment's configuration and parameters (``setpoint``, ...);
    #: they reach data generation, and a dataset generated with other values is refused.
    params: dict[str, Any] = Field(default_factory=dict)


class DataSection(_Section):
    """Where the offline data comes from: a file, or generated from the environment's
    shipped behaviour policies."""

    #: A dataset in any supported format (native directory, NeoRL ``.npz``, Minari, plant
    #: log); None: generate one.
    path: str | None = None
    #: The YAML schema of a plant log.
    schema_path: str | None = Field(default=None, alias="schema")
    #: Behaviour-policy quality of a generated dataset.
    quality: Literal["random", "low", "medium", "high", "expert"] = "medium"
    #: Whole episodes of a generated dataset.
    trajectories: int = Field(default=20, ge=1)
    seed: int = 0
    #: Train on a dataset whose card disagrees with the run's environment or parameters
    #: (e.g. data logged at another setpoint) on purpose.
    allow_mismatch: bool = False

    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False
    )


def check_updates(
    value: Any,
    chunk: int,
    name: str = "updates",
    chunk_name: str = "chunk",
    *,
    allow_zero: bool = False,
) -> int:
    """The one check of a count of updates (a run's, or between evaluations or
    checkpoints): a positive integer (``allow_zero``: non-negative) and whole chunks of
    ``chunk`` updates, since one compiled call runs a chunk. The configuration and the
    :class:`~neorl_industrial.wrappers.training.Trainer` both call it.

    Raises:
        ValueError: naming ``name`` and, when it is not whole chunks, ``chunk_name``.
    """
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        kind = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{name}: expected a {kind} integer, got {value!r}")
    if value % chunk:
        raise ValueError(f"{name} ({value}): expected a multiple of {chunk_name} ({chunk})")
    return value


class AlgorithmSection(_Section):
    """The algorithm and the hyperparameters that differ from its published defaults."""

    name: str = "td3bc-lag"
    hyperparameters: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known(self) -> AlgorithmSection:
        try:
            entry = algorithm_entry(self.name)
            validate_hyperparameters(entry.name, self.hyperparameters)
        except HyperparameterError as error:
            raise ValueError(str(error)) from None
        return self


class TrainingSection(_Section):
    updates: int = Field(default=5000, ge=1)
    #: Updates fused into one compiled call (the host sees metrics once per chunk).
    chunk: int = Field(default=1000, ge=1)
    batch_size: int = Field(default=256, ge=1)
    #: One run per seed, all trained at once (vmapped, separate parameters).
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    #: Standardize observations with the dataset's statistics (kept in the policy).
    normalize_observations: bool = True
    #: How rewards are scaled for training: ``none``, ``std`` (divided by their spread),
    #: ``standardize`` (mean removed, then divided by the spread) or ``return_range``
    #: (times 1000 / the range of episode returns); unset: the algorithm's own (IQL's
    #: paper scaling ``return_range``, ``std`` for the others).
    reward_scaling: Literal["none", "std", "standardize", "return_range"] | None = None

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"expected distinct seeds, got {seeds}")
        if any(seed < 0 for seed in seeds):
            raise ValueError(f"expected non-negative seeds, got {seeds}")
        return seeds

    @model_validator(mode="after")
    def _whole_chunks(self) -> TrainingSection:
        check_updates(self.updates, self.chunk)
        return self


class OPESection(_Section):
    """Off-policy evaluation (FQE on held-out episodes): the evaluation of a task without
    a simulator, and beside the simulator's with ``always``."""

    #: Fraction of the episodes held out of training for FQE.
    holdout: float = Field(default=0.2, gt=0, lt=1)
    #: FQE updates per FQE seed.
    updates: int = Field(default=2000, ge=1)
    #: FQE seeds; their spread is the 95 % interval of an estimate.
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=2)
    #: Widths of FQE's critic.
    hidden: list[int] = Field(default_factory=lambda: [64, 64], min_length=1)
    #: γ of the estimates.
    discount: float = Field(default=0.99, gt=0, lt=1)
    #: Also when a simulator exists (estimates beside the simulator's numbers).
    always: bool = False
    #: Seed of the held-out split (a plant model that judges the runs is fitted with the
    #: same share and seed: ``model fit --holdout --split-seed``).
    split_seed: int = Field(default=0, ge=0)


#: The off-policy settings by their Python name (``Agent.fit(ope=OPESettings(...))``): the
#: configuration's ``evaluation.ope`` section itself, defined once.
OPESettings = OPESection


class EvaluationSection(_Section):
    """Evaluation of every run: in the task's simulator with the shield, or off policy
    (``ope``) when the task has none."""

    #: Updates between evaluations (a multiple of ``training.chunk``); 0: only at the end.
    every: int = Field(default=0, ge=0)
    #: Episodes per seed and evaluation, run side by side.
    episodes: int = Field(default=10, ge=1)
    #: Steps per evaluation episode; None: the environment's horizon.
    horizon: int | None = Field(default=None, ge=1)
    #: Pass every action through the shield (and count its overrides).
    shield: bool = True
    #: Stop when the selection score has not improved for this many evaluations.
    patience: int | None = Field(default=None, ge=1)
    seed: int = 0
    ope: OPESection = Field(default_factory=OPESection)


class SafetySection(_Section):
    """Hard constraints (the shield's) and cost limits (the safe agents')."""

    #: A ``ConstraintSpec`` YAML file; None: the task's default constraints. Feature and
    #: action names resolve against the task's (a plant's own column names).
    constraints: str | None = None
    #: Episode cost limit per cost channel; None: the spec's ``cost_limit`` values, else
    #: the dataset's (a plant schema's ``limit``). Checked against the channels in one
    #: place when the run is resolved.
    cost_limits: list[float] | None = None

    @field_validator("cost_limits")
    @classmethod
    def _sane_limits(cls, limits: list[float] | None) -> list[float] | None:
        # 1e308 is finite in Python but infinite in float32, where the limit is enforced:
        # a limit that large would switch the cost constraint off.
        for index, limit in enumerate(limits or []):
            if not 0.0 <= limit <= MAX_MAGNITUDE:
                raise ValueError(
                    f"[{index}]: {limit} is outside the allowed range [0, {MAX_MAGNITUDE:g}] "
                    "(an episode cost limit)"
                )
        return limits


class ExportSection(_Section):
    """The exported policy, signed by default (servers and the registry's promotion
    trust only signed policies)."""

    #: A directory holding the Ed25519 signing key (``policy-signing.key``, made by
    #: ``neorl-industrial keys generate``), relative to the working directory; ``keys``
    #: by default, where a server started in the same directory looks for the public
    #: key. None: the policy is exported unsigned (a warning says so; no server that
    #: requires signatures serves it and the registry never promotes it).
    signing_keys: str | None = "keys"
    #: Make the key pair in ``signing_keys`` when it holds none (the private key 0600).
    create_keys: bool = True


class CheckpointSection(_Section):
    #: Updates between checkpoints (a multiple of ``training.chunk``); 0: none.
    every: int = Field(default=0, ge=0)
    #: Checkpoints kept (the newest); the best policy is kept apart.
    keep: int = Field(default=2, ge=1)


class TrackingSection(_Section):
    """MLflow tracking of the run (``integration.mlflow``)."""

    #: Log the run to MLflow.
    enabled: bool = True
    #: The tracking store; None: ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``.
    uri: str | None = None
    experiment: str = "neorl-industrial"
    #: Register the exported policy as a new version of this model; None: the
    #: environment family's ``<family>-policy`` (``ib-policy``).
    registered_model: str | None = None
    #: Log the exported policy as a pyfunc model and register it.
    log_model: bool = True
    #: Apply the promotion rule to the new version (safe first, then return).
    promote: bool = False
    #: Seconds to wait at the end for calls a slow server has not taken yet; what is
    #: left is written to a spool file for ``neorl-industrial mlflow replay``.
    flush_timeout: float = Field(default=60.0, ge=0, le=86_400)


#: The keys a sweep's grid may name: the algorithm's hyperparameters (traced in one
#: program) and the seeds.
SWEEP_PREFIX = "algorithm.hyperparameters."
SWEEP_SEEDS = "training.seeds"


class SweepSection(_Section):
    """A grid of configurations trained as one program by ``neorl-industrial sweep``:
    ``{"algorithm.hyperparameters.alpha": [1, 2.5, 5], "training.seeds": [0, 1, 2]}``.
    Only numeric hyperparameters that set no shape can be swept in one program; the seeds
    listed here replace ``training.seeds``."""

    grid: dict[str, list[Any]] = Field(default_factory=dict)

    @field_validator("grid")
    @classmethod
    def _sweepable(cls, grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in grid.items():
            if key != SWEEP_SEEDS and not (
                key.startswith(SWEEP_PREFIX) and len(key) > len(SWEEP_PREFIX)
            ):
                raise ValueError(
                    f"{key}: only {SWEEP_PREFIX}<name> and {SWEEP_SEEDS} can be swept in one "
                    "program; run other settings as separate sweeps"
                )
            if not values:
                raise ValueError(f"{key}: expected at least one value, got an empty list")
            if key == SWEEP_SEEDS and (
                any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values)
                or len(set(values)) != len(values)
            ):
                raise ValueError(f"{key}: expected distinct non-negative integers, got {values}")
        return grid

    def seeds(self, default: list[int]) -> list[int]:
        """The seeds a sweep trains: the grid's ``training.seeds``, else ``default``."""
        return list(self.grid.get(SWEEP_SEEDS) or default)

    def hyperparameter_grid(self) -> dict[str, list[Any]]:
        """The grid of the algorithm's hyperparameters, by their (dotted) names."""
        return {
            key[len(SWEEP_PREFIX) :]: list(values)
            for key, values in self.grid.items()
            if key != SWEEP_SEEDS
        }


class RunConfig(_Section):
    """A training run end to end. Every field has a default: ``RunConfig()`` is the
    main job's run (TD3BC-Lag on a generated IB dataset)."""

    name: str = "run"
    env: EnvSection = Field(default_factory=EnvSection)
    data: DataSection = Field(default_factory=DataSection)
    algorithm: AlgorithmSection = Field(default_factory=AlgorithmSection)
    training: TrainingSection = Field(default_factory=TrainingSection)
    evaluation: EvaluationSection = Field(default_factory=EvaluationSection)
    safety: SafetySection = Field(default_factory=SafetySection)
    checkpoints: CheckpointSection = Field(default_factory=CheckpointSection)
    export: ExportSection = Field(default_factory=ExportSection)
    tracking: TrackingSection = Field(default_factory=TrackingSection)
    #: The grid of ``neorl-industrial sweep`` (ignored by ``train`` and ``run``).
    sweep: SweepSection = Field(default_factory=SweepSection)
    #: Where the run writes its agent, checkpoints, export and report.
    output: str = "runs"

    @field_validator("name")
    @classmethod
    def _simple_name(cls, name: str) -> str:
        # The name is a directory under ``output``: ``.``/``..`` or a leading dot would
        # write into (or above) the output directory itself, or hide the run.
        if not name or name.startswith(".") or not all(c.isalnum() or c in "-_." for c in name):
            raise ValueError(
                f"expected letters, digits, '-', '_' or '.' not starting with '.', got {name!r}"
            )
        return name

    @model_validator(mode="after")
    def _aligned(self) -> RunConfig:
        chunk = self.training.chunk
        for where, value in (
            ("evaluation.every", self.evaluation.every),
            ("checkpoints.every", self.checkpoints.every),
        ):
            check_updates(value, chunk, where, "training.chunk", allow_zero=True)
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.output) / self.name

    # ----- files and overrides --------------------------------------------------------
    @classmethod
    def from_dict(cls, values: dict[str, Any], *, source: str = "config") -> RunConfig:
        try:
            return cls.model_validate(values)
        except pydantic.ValidationError as error:
            raise ConfigError(_describe(error, source)) from None

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: list[str] | None = None) -> RunConfig:
        """Reads a YAML file and applies ``dotted.field=value`` overrides.

        Raises:
            ConfigError: naming the file and field, for a missing or unreadable file, an
                unknown field (with a suggestion) or a value of the wrong kind.
        """
        return cls.from_files([path], overrides)

    @classmethod
    def from_files(cls, paths: list[str | Path], overrides: list[str] | None = None) -> RunConfig:
        """Merges YAML files in order (later files win, section by section; e.g. an
        environment file, then an algorithm file), then applies the overrides."""
        values: dict[str, Any] = {}
        for path in paths:
            values = merge_nested(values, _read(Path(path)))
        values = apply_overrides(values, overrides or [])
        source = " + ".join(str(path) for path in paths) or "config"
        if overrides:
            source += " with overrides"
        return cls.from_dict(values, source=source)

    def with_overrides(self, overrides: list[str]) -> RunConfig:
        values = apply_overrides(self.to_dict(), overrides)
        return RunConfig.from_dict(values, source="overrides")

    def with_grid(self, items: list[str]) -> RunConfig:
        """The configuration with ``key=[values]`` entries added to ``sweep.grid`` (the
        values read as YAML; a later entry of the same key wins).

        Raises:
            ConfigError: for an entry without ``=``, values that are not a list, or a key
                that cannot be swept (see :class:`SweepSection`).
        """
        values = self.to_dict()
        grid = values["sweep"]["grid"]
        for item in items:
            key, parsed = _assignment(
                item,
                f"--grid {item!r}",
                "key=[values], e.g. algorithm.hyperparameters.alpha=[1,2.5,5]",
            )
            if not isinstance(parsed, list):
                raise ConfigError(f"--grid {item!r}: expected a list of values in [...]")
            grid[key] = parsed
        return RunConfig.from_dict(values, source="--grid")

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def apply_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``values`` with every ``dotted.field=value`` applied (the value read as YAML).

    Raises:
        ConfigError: for an override without ``=`` or one that walks into a value.
    """
    result = copy_nested(values)
    for override in overrides:
        field, value = _assignment(
            override, f"override {override!r}", "dotted.field=value, e.g. training.updates=2000"
        )
        node = result
        parts = field.split(".")
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(
                    f"override {override!r}: {'.'.join(parts[: i + 1])} is a value, not a section"
                )
            node = child
        node[parts[-1]] = value
    return result


def _assignment(item: str, what: str, expected: str) -> tuple[str, Any]:
    """``(key, value)`` of ``key=value`` (the value read as YAML).

    Raises:
        ConfigError: naming ``what`` for an item without ``=`` or a key, or bad YAML.
    """
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"{what}: expected {expected}")
    try:
        return key, load_yaml_text(text, what)
    except YamlError as error:
        raise ConfigError(str(error)) from None


def _read(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"{path}: no such config file")
    try:
        values = read_yaml(path, what="config file") or {}
    except YamlError as error:
        raise ConfigError(str(error)) from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    return values


def _describe(error: pydantic.ValidationError, source: str) -> str:
    lines = []
    for problem in error.errors():
        location = ".".join(str(part) for part in problem["loc"])
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            message = "unknown field" + _suggestion(problem["loc"])
        if location and message.startswith(location):
            lines.append(f"{source}: {message}")  # the message names its own field
        else:
            lines.append(f"{source}: {location or '(top level)'}: {message}")
    return "; ".join(lines)  # one line, however many errors


def _suggestion(location: tuple[Any, ...]) -> str:
    model: Any = RunConfig
    for part in location[:-1]:
        field = model.model_fields.get(str(part)) if hasattr(model, "model_fields") else None
        if field is None:
            return ""
        model = field.annotation
    known = list(getattr(model, "model_fields", {}))
    close = difflib.get_close_matches(str(location[-1]), known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{hint}; known: {', '.join(known)}" if known else hint
