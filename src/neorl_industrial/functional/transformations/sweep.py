"""Hyperparameter sweeps as one program: a grid of configurations × seeds trained as one
vmapped computation with a leading *runs* axis.

A hyperparameter that does not decide a shape or a Python branch (a learning rate,
TD3+BC's ``alpha``, IQL's ``expectile`` and ``beta``, CQL's penalty weight, the discount,
a PID gain) is a *traced* value here: every run builds its algorithm from a config whose
swept fields are tracers of the compiled program, so one compilation serves every
configuration. The algorithms need nothing for it: their factories close over the
config's values, and closing over a tracer is what makes the value an input of the
program. A field that decides a shape (``hidden``, ``n_actions``) or Python control flow
cannot be traced; :func:`plan_sweep` finds out by tracing one update abstractly
(``jax.eval_shape``, nothing compiled or run) and names the field.

Every concrete value is validated first, as a single run's would be (the config's own
checks run on each grid point), so a sweep never trains a configuration a single run
would refuse.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from neorl_industrial.core.agents.registry import (
    HyperparameterError,
    algorithm_entry,
    validate_hyperparameters,
)
from neorl_industrial.core.agents.types import Algorithm, Batch
from neorl_industrial.core.safety.contract import SafetyContract
from neorl_industrial.core.utils.tree import merge_nested
from neorl_industrial.functional.state_management import Dataset, sample
from neorl_industrial.functional.state_management.train_state import (
    TrainState,
    donatable,
    init_train_state,
)
from neorl_industrial.functional.transformations.offline import (
    ChunkCallback,
    Sampler,
    Schedule,
    _warn_about_action_units,
    make_chunk,
    run_chunks,
)

__all__ = [
    "SweepError",
    "SweepPlan",
    "SweepResult",
    "available_device_bytes",
    "check_sweep_fits",
    "estimate_sweep_bytes",
    "expand_grid",
    "init_sweep",
    "make_sweep_chunk",
    "plan_sweep",
    "runs_mesh",
    "traced_config",
    "train_sweep",
]


class SweepError(ValueError):
    """A sweep that cannot be run as asked, with what is wrong named."""


def expand_grid(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """The configurations of a grid: every combination of the fields' values, the first
    field varying slowest.

    Raises:
        SweepError: for an empty grid or a field with no values.
    """
    if not grid:
        raise SweepError("grid: expected at least one hyperparameter to sweep")
    for field, values in grid.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise SweepError(f"grid.{field}: expected a list of values, got {values!r}")
        if len(values) == 0:
            raise SweepError(f"grid.{field}: expected at least one value, got an empty list")
    fields = list(grid)
    return [dict(zip(fields, combo, strict=True)) for combo in itertools.product(*grid.values())]


def _nested(point: Mapping[str, Any]) -> dict[str, Any]:
    """``{"critic.cvar_level": 0.1}`` as ``{"critic": {"cvar_level": 0.1}}``."""
    nested: dict[str, Any] = {}
    for path, value in point.items():
        *parents, leaf = path.split(".")
        target = nested
        for parent in parents:
            target = target.setdefault(parent, {})
        target[leaf] = value
    return nested


def _get(config: Any, path: str) -> Any:
    value = config
    for name in path.split("."):
        value = getattr(value, name)
    return value


def traced_config(config: Any, values: Mapping[str, Any]) -> Any:
    """A copy of the frozen config dataclass with the fields at the dotted ``values``
    paths replaced, *without* its validation (the values may be tracers; their concrete
    counterparts were validated by :func:`plan_sweep`).

    The fields of a fresh copy are set directly: ``dataclasses.replace`` would run the
    config's ``__post_init__``, whose checks (``alpha > 0``) cannot branch on a tracer.
    """
    grouped: dict[str, dict[str, Any]] = {}
    for path, value in values.items():
        head, _, rest = path.partition(".")
        grouped.setdefault(head, {})[rest] = value
    result = copy.copy(config)
    for head, children in grouped.items():
        if "" in children:
            object.__setattr__(result, head, children[""])
        else:
            object.__setattr__(result, head, traced_config(getattr(config, head), children))
    return result


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """What a sweep trains: runs are configurations × seeds, configuration-major.

    Attributes:
        algorithm: the registered algorithm's name.
        fields: the swept hyperparameters (dotted paths into its config).
        points: the configurations, ``{field: value}`` each.
        seeds: the seeds every configuration is trained with.
        configs: the validated config of each configuration.
        obs_size: observation length.
        action_size: action length (number of actions when discrete).
    """

    algorithm: str
    fields: tuple[str, ...]
    points: tuple[dict[str, Any], ...]
    seeds: tuple[int, ...]
    configs: tuple[Any, ...]
    obs_size: int
    action_size: int

    @property
    def n_runs(self) -> int:
        return len(self.points) * len(self.seeds)

    def runs(self) -> list[tuple[int, int]]:
        """``(configuration index, seed)`` of every run, in the runs axis' order."""
        return [(p, s) for p in range(len(self.points)) for s in self.seeds]

    def values(self) -> dict[str, np.ndarray]:
        """Each swept field's value per run (``[n_runs]``, the config field's type)."""
        columns = {}
        for field in self.fields:
            dtype = np.int32 if isinstance(_get(self.configs[0], field), int) else np.float32
            columns[field] = np.asarray(
                [self.points[p][field] for p, _ in self.runs()], dtype=dtype
            )
        return columns

    def build(self, values: Mapping[str, Any]) -> Algorithm:
        """The algorithm of one run, its swept fields set to ``values`` (tracers inside
        the compiled sweep)."""
        entry = algorithm_entry(self.algorithm)
        config = traced_config(self.configs[0], values)
        return entry.factory(config, self.obs_size, self.action_size)


def plan_sweep(
    algorithm: str,
    grid: Mapping[str, Sequence[Any]],
    *,
    seeds: Sequence[int] = (0,),
    obs_size: int,
    action_size: int,
    hyperparameters: Mapping[str, Any] | None = None,
    check_traceable: bool = True,
    contract: SafetyContract | None = None,
) -> SweepPlan:
    """Checks a sweep and lays out its runs.

    Args:
        algorithm: a registered algorithm (``td3bc``, ``iql``, ...).
        grid: ``{field: [values]}``; a field is a hyperparameter of the algorithm's
            config, nested ones by dotted path (``critic.cvar_level``).
        seeds: trained for every configuration.
        obs_size: observation length.
        action_size: action length (number of actions when discrete).
        hyperparameters: the fixed hyperparameters every configuration starts from.
        check_traceable: refuse fields that cannot be traced (False: for
            :func:`plan_sweep_groups`, which groups by them).
        contract: the run's safety contract: a cost-aware algorithm's cost limits are
            its (never the hyperparameters' or the grid's).

    Raises:
        SweepError: an empty grid or list of seeds, a field that is not a hyperparameter
            (naming the closest one) or whose value its config refuses (naming the
            configuration), or a field that cannot be traced (it decides a shape or a
            Python branch: :func:`plan_sweep_groups` trains each of its values as a
            program of its own).
    """
    points = expand_grid(grid)
    seeds = tuple(int(seed) for seed in seeds)
    if not seeds:
        raise SweepError("seeds: expected at least one seed")
    if len(set(seeds)) != len(seeds):
        raise SweepError(f"seeds: {list(seeds)} repeats a seed; each run needs its own")
    base = dict(hyperparameters or {})
    configs = []
    for number, point in enumerate(points):
        try:
            merged = merge_nested(base, _nested(point))
            configs.append(validate_hyperparameters(algorithm, merged, contract))
        except (HyperparameterError, ValueError, TypeError) as error:
            raise SweepError(f"grid configuration {number} {point}: {error}") from error
    fields = tuple(grid)
    for field in fields if check_traceable else ():
        default = _get(configs[0], field)
        if isinstance(default, bool) or not isinstance(default, (int, float)):
            raise SweepError(
                f"grid.{field}: a {type(default).__name__} hyperparameter cannot be traced "
                "(only numbers can); sweep it as separate programs (plan_sweep_groups)"
            )
    plan = SweepPlan(
        algorithm=algorithm_entry(algorithm).name,
        fields=fields,
        points=tuple(points),
        seeds=seeds,
        configs=tuple(configs),
        obs_size=int(obs_size),
        action_size=int(action_size),
    )
    for field in fields if check_traceable else ():  # one at a time: the message names it
        _check_traceable(plan, field)
    return plan


@dataclasses.dataclass(frozen=True)
class SweepGroup:
    """Configurations of a grid that share their untraceable values: one program.

    Attributes:
        indices: the configurations' positions in the whole grid (``expand_grid`` order).
        fixed: the untraceable fields' values every configuration of the group shares.
        plan: the group's sweep of the traceable fields (``fields`` may be empty: then
            one configuration, its seeds).
    """

    indices: tuple[int, ...]
    fixed: dict[str, Any]
    plan: SweepPlan


def plan_sweep_groups(
    algorithm: str, grid: Mapping[str, Sequence[Any]], **settings: Any
) -> list[SweepGroup]:
    """A grid that may hold fields no program can trace (``hidden``, a shape or a Python
    branch), split into groups: the configurations sharing those fields' values form one
    group, trained as one program of the other (traced) fields, so each group compiles
    once. A grid of traceable fields only is one group, :func:`plan_sweep`'s plan.

    Args:
        algorithm, grid: as :func:`plan_sweep`'s.
        settings: :func:`plan_sweep`'s keywords (``seeds``, ``obs_size``,
            ``action_size``, ``hyperparameters``, ``contract``) but ``check_traceable``.

    Raises:
        SweepError: as :func:`plan_sweep` for the grid, the seeds and the values.
    """
    points = expand_grid(grid)
    whole = plan_sweep(algorithm, grid, **settings, check_traceable=False)
    fixed_fields = [field for field in whole.fields if not _traceable(whole, field)]
    traced = [field for field in whole.fields if field not in fixed_fields]
    members: dict[str, list[int]] = {}
    for index, point in enumerate(points):
        key = json.dumps([point[field] for field in fixed_fields], default=str)
        members.setdefault(key, []).append(index)
    groups = []
    for indices in members.values():
        fixed = {field: points[indices[0]][field] for field in fixed_fields}
        plan = dataclasses.replace(
            whole,
            fields=tuple(traced),
            points=tuple({field: points[i][field] for field in traced} for i in indices),
            configs=tuple(whole.configs[i] for i in indices),
        )
        groups.append(SweepGroup(indices=tuple(indices), fixed=fixed, plan=plan))
    return groups


def _traceable(plan: SweepPlan, field: str) -> bool:
    default = _get(plan.configs[0], field)
    if isinstance(default, bool) or not isinstance(default, (int, float)):
        return False
    try:
        _check_traceable(plan, field)
    except SweepError:
        return False
    return True


def _check_traceable(plan: SweepPlan, field: str) -> None:
    """Traces one initialization and one update with ``field`` as an input, abstractly."""
    dtype = jnp.int32 if isinstance(_get(plan.configs[0], field), int) else jnp.float32
    discrete = algorithm_entry(plan.algorithm).discrete
    n_costs = len(getattr(plan.configs[0], "cost_limits", None) or (0.0,))
    batch = _abstract_batch(plan.obs_size, plan.action_size, discrete, n_costs)

    def one_update(value: jax.Array) -> Any:
        algorithm = plan.build({field: value})
        state = algorithm.init(jax.random.PRNGKey(0))
        return algorithm.update(state, batch, jax.random.PRNGKey(1))

    try:
        jax.eval_shape(one_update, jax.ShapeDtypeStruct((), dtype))
    except (
        jax.errors.ConcretizationTypeError,
        jax.errors.TracerArrayConversionError,
        jax.errors.TracerIntegerConversionError,
        jax.errors.TracerBoolConversionError,
        TypeError,
    ) as error:
        raise SweepError(
            f"grid.{field}: cannot be traced: {plan.algorithm} uses it for a shape or a "
            "Python decision, so every value needs its own program; sweep it as separate "
            f"programs (plan_sweep_groups) ({type(error).__name__})"
        ) from error


def _abstract_batch(obs_size: int, action_size: int, discrete: bool, n_costs: int) -> Any:
    size = 2
    observations = jnp.zeros((size, obs_size), jnp.float32)
    return Batch(
        observations=observations,
        actions=(
            jnp.zeros((size,), jnp.int32)
            if discrete
            else jnp.zeros((size, action_size), jnp.float32)
        ),
        rewards=jnp.zeros((size,), jnp.float32),
        costs=jnp.zeros((size, n_costs), jnp.float32),
        next_observations=observations,
        terminals=jnp.zeros((size,), bool),
        discounts=jnp.full((size,), 0.99, jnp.float32),
    )


def init_sweep(plan: SweepPlan) -> TrainState:
    """Fresh runs of the sweep: each run's algorithm state initialized from its seed and
    its configuration (leading runs axis), in one compiled program."""
    values = {field: jnp.asarray(column) for field, column in plan.values().items()}
    seeds = jnp.asarray([seed for _, seed in plan.runs()], jnp.uint32)

    def one(run_values: dict[str, jax.Array], seed: jax.Array) -> TrainState:
        return init_train_state(plan.build(run_values), seed)

    return jax.jit(jax.vmap(one))(values, seeds)


def make_sweep_chunk(
    plan: SweepPlan, batch_size: int, n_updates: int, sampler: Sampler = sample
) -> Callable[[TrainState, dict[str, jax.Array], Dataset], tuple[TrainState, Any]]:
    """``chunk(state, values, dataset) -> (state, mean metrics)``: ``n_updates`` updates of
    every run (leading runs axis on ``state`` and on each ``values[field]``), each run's
    algorithm built from its own values. Pure; jit it at the call site."""

    def one(state: TrainState, run_values: dict[str, jax.Array], dataset: Dataset):
        chunk = make_chunk(plan.build(run_values), batch_size, n_updates, sampler)
        key, chunk_key = jax.random.split(state.key)
        agent, metrics = chunk(state.agent, dataset, chunk_key)
        return TrainState(agent=agent, key=key, updates=state.updates + n_updates), metrics

    return jax.vmap(one, in_axes=(0, 0, None))


def estimate_sweep_bytes(plan: SweepPlan, batch_size: int) -> int:
    """A lower bound on the device memory of training the sweep's runs at once: each run's
    state (parameters, optimizer moments, targets) three times over (the donated state,
    the new one and the gradients with the update's temporaries) and its batch, from an
    abstract initialization (nothing is computed)."""
    shapes = jax.eval_shape(lambda: init_train_state(plan.build({}), 0))
    state_bytes = sum(
        int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(shapes)
    )
    batch_bytes = batch_size * (2 * plan.obs_size + plan.action_size + 8) * 4
    return plan.n_runs * (3 * state_bytes + batch_bytes)


def available_device_bytes(device: Any | None = None) -> int | None:
    """Memory the device can still give: an accelerator's free memory, the host's
    available memory for a CPU device; None where it cannot be told."""
    device = device if device is not None else jax.devices()[0]
    stats = None
    try:
        stats = device.memory_stats()
    except (AttributeError, NotImplementedError, RuntimeError):
        stats = None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def check_sweep_fits(
    plan: SweepPlan, batch_size: int, available: int | None = None, n_devices: int = 1
) -> int:
    """The estimate of :func:`estimate_sweep_bytes` per device (the runs spread over
    ``n_devices``); raises :class:`SweepError` before anything is compiled when it exceeds
    the memory a device has (``available``, or :func:`available_device_bytes`)."""
    needed = -(-estimate_sweep_bytes(plan, batch_size) // n_devices)
    available = available if available is not None else available_device_bytes()
    if available is not None and needed > available:
        raise SweepError(
            f"sweep: {plan.n_runs} runs need at least {needed / 2**20:,.0f} MiB of device "
            f"memory at once and {available / 2**20:,.0f} MiB are available; sweep fewer "
            "configurations or seeds at a time, smaller networks, or shard the runs over "
            "more devices"
        )
    return needed


@dataclasses.dataclass
class SweepResult:
    """A trained sweep.

    Attributes:
        plan: the runs.
        state: every run's :class:`TrainState` (leading runs axis, ``plan.runs()``'s order).
        history: per chunk, the updates done, seconds, updates per second (all runs) and
            the mean metrics per run.
    """

    plan: SweepPlan
    state: TrainState
    history: list[dict[str, Any]]

    def run_state(self, index: int) -> Any:
        """The algorithm state of run ``index`` (no runs axis)."""
        return jax.tree.map(lambda leaf: leaf[index], self.state.agent)


def runs_mesh(devices: Sequence[Any] | None = None) -> Mesh:
    """A one-axis mesh (``"runs"``) over ``devices`` (default: every device)."""
    return Mesh(np.asarray(list(devices) if devices is not None else jax.devices()), ("runs",))


def _shardings(mesh: Mesh, n_runs: int) -> tuple[NamedSharding, NamedSharding]:
    """``(over runs, replicated)`` on ``mesh``; the runs must divide over its devices."""
    n_devices = int(mesh.devices.size)
    if n_runs % n_devices:
        raise SweepError(
            f"sweep: {n_runs} runs do not divide over {n_devices} devices; give a number "
            f"of configurations × seeds that is a multiple of {n_devices}, or fewer devices"
        )
    return NamedSharding(mesh, PartitionSpec("runs")), NamedSharding(mesh, PartitionSpec())


def train_sweep(
    plan: SweepPlan,
    dataset: Dataset,
    schedule: Schedule,
    *,
    sampler: Sampler = sample,
    callback: ChunkCallback | None = None,
    state: TrainState | None = None,
    mesh: Mesh | None = None,
) -> SweepResult:
    """Trains every run of ``plan`` on ``dataset`` in one vmapped program per chunk.

    Run ``(configuration c, seed s)`` ends with the same parameters as
    ``train_offline`` of configuration ``c`` with seed ``s`` (up to floating-point
    reassociation): the same initialization, keys and batches.

    Args:
        plan: from :func:`plan_sweep`.
        dataset: the data, on device, shared by every run.
        schedule: updates per run in this call, per compiled chunk, and the batch size.
        sampler: how batches are drawn.
        callback: called on the host after every chunk with the metrics per run.
        state: continue these runs instead of starting fresh ones.
        mesh: lay the runs axis over this mesh's devices (:func:`runs_mesh`; the dataset
            is replicated on each) and compile with those shardings; each device trains
            its share of the runs. None: one device, as ``train_offline``.

    Raises:
        SweepError: for a state of another number of runs, runs that do not divide over
            the mesh's devices, or a sweep larger than the device's memory.
    """
    batch_size, chunk_updates = schedule.batch_size, schedule.chunk
    if not algorithm_entry(plan.algorithm).discrete:
        _warn_about_action_units(dataset)
    check_sweep_fits(plan, batch_size, n_devices=1 if mesh is None else int(mesh.devices.size))
    if state is None:
        state = init_sweep(plan)
    elif state.n_seeds != plan.n_runs:
        raise SweepError(f"state: holds {state.n_seeds} runs, the plan {plan.n_runs}")
    values = {field: jnp.asarray(column) for field, column in plan.values().items()}
    program = make_sweep_chunk(plan, batch_size, chunk_updates, sampler)
    state = donatable(state)  # donated below; the caller's state survives
    if mesh is None:
        chunk = jax.jit(program, donate_argnums=0)
    else:
        over_runs, replicated = _shardings(mesh, plan.n_runs)
        state = place(state, over_runs)
        values = place(values, over_runs)
        dataset = place(dataset, replicated)
        chunk = jax.jit(
            program,
            donate_argnums=0,
            in_shardings=(over_runs, over_runs, replicated),
            out_shardings=(over_runs, over_runs),
        )
    state, history = run_chunks(
        lambda state: chunk(state, values, dataset),
        state,
        schedule,
        plan.n_runs,
        callback,
        to_host=to_host,
    )
    if jax.process_count() > 1:
        # Every process gets every run's state (for evaluation and process 0's logging).
        state = jax.tree.map(jnp.asarray, to_host(state))
    return SweepResult(plan=plan, state=state, history=history)


def place(tree: Any, sharding: NamedSharding) -> Any:
    """``tree``'s arrays as global arrays of ``sharding``, each device holding its part
    (every process passes the same full values; works across hosts)."""

    def put(leaf: Any) -> jax.Array:
        host = np.asarray(leaf)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree.map(put, tree)


def to_host(tree: Any) -> Any:
    """Numpy copies of ``tree``'s arrays, gathered from every process when there are
    several (a replicated array is read from this process's own copy)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        def gather(leaf: Any) -> Any:
            if isinstance(leaf, jax.Array) and leaf.is_fully_replicated:
                return np.asarray(leaf.addressable_data(0))
            return multihost_utils.process_allgather(leaf, tiled=True)

        return jax.tree.map(gather, tree)
    return jax.device_get(tree)
