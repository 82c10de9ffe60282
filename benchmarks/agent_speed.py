"""Offline training speed: gradient steps per second of BC, TD3+BC, IQL and CQL (and of
TD3+BC and CQL with implicit quantile critics), ours against d3rlpy 2.8 (PyTorch, CPU), in
one process on one machine, at two network sizes.

What is measured:

* **data** - the synthetic dataset of :mod:`benchmarks.data_sampling` (180-value
  observations, 3-value actions, 1000-step episodes). Both libraries train on the same
  values; training speed does not depend on them.
* **networks** - CORL's (256, 256) and the (64, 64) the learning studies use, where
  Python and dispatch overhead weigh more than the matrix products.
* **ours** - for each algorithm with its defaults (twin critics, CQL with 10 sampled
  actions), built by the registry, one jitted chunk of ``chunk_updates`` updates of batch
  256, the batches sampled inside the ``lax.scan`` (what :func:`train_offline` runs).
  Steps per second = ``chunk_updates / best chunk time``. ``*_iqn`` rows use implicit
  quantile critics as d3rlpy's ``IQNQFunctionFactory`` configured alike (32 sampled
  fractions for the TD loss and for the expectation, 64 cosine features).
* **d3rlpy** - the same algorithm from ``d3rlpy.algos`` with the same encoders
  (``VectorEncoderFactory`` of the same widths), two critics, 10 CQL action samples, the
  IQN Q-function for the ``*_iqn`` rows, batch 256, ``algo.update(batch)`` in a Python loop
  over batches sampled *before* the timed loop: d3rlpy's sampling is not timed, ours is.
  PyTorch uses its default thread count (printed in the config).
* **compile** - seconds to lower and compile one chunk of each algorithm, measured
  without the persistent compilation cache.
* **seeds** - 8 seeds vmapped in one program (separate parameters, one shared dataset)
  against 8 sequential runs of one seed: total steps per second of both.
* **FLOP/s** - XLA's count of floating-point operations of one update (its cost
  analysis; a ``lax.cond`` counts every branch, so TD3+BC's delayed policy update is
  counted on every step) times steps per second, against a measured matrix-product peak:
  a chain of dependent 256x256 and 1024x1024 products in one ``lax.scan``. The same count
  times d3rlpy's rate gives d3rlpy's fraction (the work per update is the same).
* **memory** - a child process loads a 1 M-transition dataset (1000 episodes of 1000
  steps) onto the device and trains TD3+BC on it; its peak resident memory is reported
  with the dataset's own size.

d3rlpy pins Gymnasium 1.0 and brings PyTorch: run the benchmark with the interpreter of
``make peer-env`` (``.venv-d3rlpy/bin/python -m benchmarks.run agent_speed``), which has
this package installed beside d3rlpy. Ratios are ours / d3rlpy from the same run. The
``targets`` entry records each goal (>= 3x d3rlpy for BC, TD3+BC, IQL; >= 5x for CQL, at
(256, 256); compile < 10 s) with its value and whether it was met; a miss is data, not an
error.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

from benchmarks.data_sampling import peak_rss_bytes, synthesize
from benchmarks.harness import Table, progress, ratio, time_best
from benchmarks.harness import evaluate_targets as harness_evaluate_targets

NAME = "agent_speed"
DESCRIPTION = (
    "Gradient steps/s of BC, TD3+BC, IQL, CQL (and IQN critics) vs d3rlpy 2.8 at (256, 256) "
    "and (64, 64); compile time; 8 seeds vmapped vs sequential; FLOP/s vs matmul peak; "
    "peak RSS on 1M transitions"
)

ALGORITHMS = ("bc", "td3bc", "iql", "cql", "td3bc_iqn", "cql_iqn")
HIDDEN_SIZES = ((256, 256), (64, 64))
BATCH_SIZE = 256
OBSERVATION_SIZE = 180
ACTION_SIZE = 3
N_SEEDS = 8
#: Implicit quantile critics of the ``*_iqn`` rows, the same for both libraries: 32
#: fractions per TD step and for the expectation, 64 cosines. d3rlpy's continuous-action
#: algorithms need its ``n_quantiles`` equal to ``n_greedy_quantiles`` (their targets are
#: drawn at the greedy count, and its IQN loss asserts the two shapes agree).
IQN_CRITIC = {"kind": "iqn", "n_quantiles": 32, "n_policy_quantiles": 32, "embedding_size": 64}

TARGETS: dict[str, tuple[str, float, str]] = {
    **{
        f"{name}_vs_d3rlpy": (">=", 3.0, f"{name} gradient steps/s at (256, 256), ours / d3rlpy")
        for name in ("bc", "td3bc", "iql")
    },
    "cql_vs_d3rlpy": (">=", 5.0, "cql gradient steps/s at (256, 256), ours / d3rlpy"),
    "max_compile_s": ("<", 10.0, "slowest compile of one training chunk, seconds"),
}

#: Relative cost of one update at (256, 256), to size each timed loop (BC = 1).
_COST = {"bc": 1, "td3bc": 4, "iql": 4, "cql": 40, "td3bc_iqn": 12, "cql_iqn": 100}


def row_name(name: str, hidden: tuple[int, ...]) -> str:
    """``td3bc@64x64``: one row of the results."""
    return f"{name}@{'x'.join(str(width) for width in hidden)}"


@dataclasses.dataclass(frozen=True)
class Settings:
    """Sizes of one run.

    Attributes:
        quick: the small version.
        repeats: timed calls per measurement (the best is kept).
        n_episodes: episodes of the training data.
        chunk_updates: updates per timed chunk of ours, per row.
        d3rlpy_updates: updates per timed d3rlpy loop, per row.
        seed_updates: updates per chunk in the 8-seed comparison, per row.
        memory_episodes: episodes of the dataset of the memory measurement (0: skip).
        memory_updates: TD3+BC updates in the memory measurement.
    """

    quick: bool
    repeats: int
    n_episodes: int
    chunk_updates: dict[str, int]
    d3rlpy_updates: dict[str, int]
    seed_updates: dict[str, int]
    memory_episodes: int
    memory_updates: int


def settings(quick: bool) -> Settings:
    """The full run, or with ``quick`` a small one (no memory measurement)."""
    rows = [(name, hidden) for hidden in HIDDEN_SIZES for name in ALGORITHMS]

    def per_row(budget: float, floor: int) -> dict[str, int]:
        # (64, 64) updates cost about a tenth of (256, 256) ones: ten times the updates.
        return {
            row_name(name, hidden): max(floor, int(budget / _COST[name] * (256 / hidden[0])))
            for name, hidden in rows
        }

    if quick:
        return Settings(
            quick=True,
            repeats=2,
            n_episodes=10,
            chunk_updates=dict.fromkeys((row_name(n, h) for n, h in rows), 4),
            d3rlpy_updates=dict.fromkeys((row_name(n, h) for n, h in rows), 2),
            seed_updates=dict.fromkeys((row_name(n, h) for n, h in rows), 2),
            memory_episodes=0,
            memory_updates=0,
        )
    return Settings(
        quick=False,
        repeats=3,
        n_episodes=100,
        chunk_updates=per_row(2000, 20),
        d3rlpy_updates=per_row(600, 8),
        seed_updates=per_row(250, 4),
        memory_episodes=1000,
        memory_updates=2000,
    )


# --------------------------------------------------------------------------- ours


def make_algorithm(name: str, hidden: tuple[int, ...] = (256, 256)) -> Any:
    """Our algorithm ``name`` (``*_iqn``: with implicit quantile critics) with its
    defaults and ``hidden`` layers, for the benchmark's shapes."""
    from neorl_industrial.core.agents.registry import build_algorithm

    base = name.removesuffix("_iqn")
    hyperparameters: dict[str, Any] = {"hidden": list(hidden)}
    if name.endswith("_iqn"):
        hyperparameters["critic"] = IQN_CRITIC
    return build_algorithm(base, OBSERVATION_SIZE, ACTION_SIZE, hyperparameters)[0]


def build_dataset(n_episodes: int, episode_length: int = 1000, seed: int = 0) -> Any:
    """The synthetic dataset as our :class:`Dataset`, on the device."""
    import jax

    from neorl_industrial.functional.state_management import Dataset

    data = synthesize(n_episodes, episode_length, seed)
    dataset = Dataset.from_trajectories(
        data["observations"], data["actions"], data["rewards"], data["costs"], data["terminated"]
    )
    return jax.block_until_ready(dataset)


class OurRun:
    """One compiled training chunk of ``n_seeds`` vmapped seeds, ready to time."""

    def __init__(
        self, name: str, hidden: tuple[int, ...], dataset: Any, n_seeds: int, n_updates: int
    ) -> None:
        import jax
        import jax.numpy as jnp

        from neorl_industrial.functional.transformations.offline import (
            init_seeds,
            make_seeded_chunk,
        )

        self.algorithm = make_algorithm(name, hidden)
        self.dataset = dataset
        self.n_updates = n_updates
        self.n_seeds = n_seeds
        chunk = jax.jit(make_seeded_chunk(self.algorithm, BATCH_SIZE, n_updates), donate_argnums=0)
        self.states = jax.tree.map(jnp.copy, init_seeds(self.algorithm, list(range(n_seeds))))
        self.keys = jax.vmap(jax.random.PRNGKey)(jnp.arange(n_seeds, dtype=jnp.uint32))
        started = time.perf_counter()
        self.compiled = chunk.lower(self.states, dataset, self.keys).compile()
        self.compile_s = time.perf_counter() - started

    def __call__(self) -> None:
        import jax

        self.states, metrics = self.compiled(self.states, self.dataset, self.keys)
        jax.block_until_ready(metrics)


def update_flops(name: str, hidden: tuple[int, ...], dataset: Any) -> float | None:
    """XLA's floating-point operation count of one update (sampling included)."""
    import jax

    from neorl_industrial.functional.state_management import sample

    algorithm = make_algorithm(name, hidden)
    state = algorithm.init(jax.random.PRNGKey(0))

    def one(state, dataset, key):
        sample_key, update_key = jax.random.split(key)
        return algorithm.update(state, sample(dataset, sample_key, BATCH_SIZE), update_key)

    cost = jax.jit(one).lower(state, dataset, jax.random.PRNGKey(1)).compile().cost_analysis()
    if isinstance(cost, list):
        cost = cost[0] if cost else None
    flops = (cost or {}).get("flops")
    return float(flops) if flops else None


def matmul_peak(size: int, target_flop: float = 2e10) -> dict[str, float]:
    """FLOP/s of a chain of dependent ``size x size`` products (each step's input is the
    previous result, so nothing can be hoisted), best of three calls."""
    import jax

    steps = max(1, int(target_flop / (2 * size**3)))
    a = jax.random.normal(jax.random.PRNGKey(0), (size, size)) / np.sqrt(size)
    b = jax.random.normal(jax.random.PRNGKey(1), (size, size)) / np.sqrt(size)

    @jax.jit
    def chain(a, b):
        return jax.lax.scan(lambda x, _: (x @ b, None), a, None, length=steps)[0]

    best, _ = time_best(lambda: jax.block_until_ready(chain(a, b)), repeats=3)
    return {"size": size, "flop_per_s": 2 * size**3 * steps / best}


# --------------------------------------------------------------------------- d3rlpy


def d3rlpy_config(name: str, hidden: tuple[int, ...] = (256, 256)) -> Any:
    """d3rlpy's config of ``name`` with its defaults, our encoder widths, batch 256, and
    for ``*_iqn`` its IQN Q-function with the same settings as ours."""
    import d3rlpy
    from d3rlpy.models import IQNQFunctionFactory, VectorEncoderFactory

    base = name.removesuffix("_iqn")
    configs = {
        "bc": d3rlpy.algos.BCConfig,
        "td3bc": d3rlpy.algos.TD3PlusBCConfig,
        "iql": d3rlpy.algos.IQLConfig,
        "cql": d3rlpy.algos.CQLConfig,
    }
    encoder = VectorEncoderFactory(hidden_units=list(hidden))
    kwargs: dict[str, Any] = {"batch_size": BATCH_SIZE}
    if base == "bc":
        kwargs["encoder_factory"] = encoder
    else:
        kwargs["actor_encoder_factory"] = encoder
        kwargs["critic_encoder_factory"] = encoder
    if base == "iql":
        kwargs["value_encoder_factory"] = encoder
    if name.endswith("_iqn"):
        kwargs["q_func_factory"] = IQNQFunctionFactory(
            n_quantiles=IQN_CRITIC["n_quantiles"],
            n_greedy_quantiles=IQN_CRITIC["n_policy_quantiles"],
            embed_size=IQN_CRITIC["embedding_size"],
        )
    return configs[base](**kwargs)


def d3rlpy_dataset(n_episodes: int, seed: int = 0) -> Any:
    """The synthetic data as d3rlpy's ``MDPDataset`` (its flat layout)."""
    from d3rlpy.dataset import MDPDataset

    from benchmarks.data_sampling import d3rlpy_flat

    flat = d3rlpy_flat(synthesize(n_episodes, 1000, seed))
    return MDPDataset(
        flat["observations"], flat["actions"], flat["rewards"], flat["terminals"], flat["timeouts"]
    )


def measure_d3rlpy(
    name: str, hidden: tuple[int, ...], dataset: Any, n_updates: int, repeats: int
) -> dict[str, Any]:
    """d3rlpy's updates per second on pre-sampled batches."""
    algo = d3rlpy_config(name, hidden).create(device="cpu:0")
    algo.build_with_dataset(dataset)
    batches = [dataset.sample_transition_batch(BATCH_SIZE) for _ in range(min(n_updates, 64))]

    def loop() -> None:
        for i in range(n_updates):
            algo.update(batches[i % len(batches)])

    best, times = time_best(loop, repeats=repeats)
    return {"steps_per_s": n_updates / best, "seconds": times, "updates": n_updates}


# --------------------------------------------------------------------------- memory


def memory_child(n_episodes: int, n_updates: int) -> dict[str, Any]:
    """Runs in a child process: trains TD3+BC on ``n_episodes`` x 1000 transitions."""
    from neorl_industrial.functional.transformations.offline import Schedule, train_offline

    dataset = build_dataset(n_episodes)
    loaded = peak_rss_bytes()
    chunk = min(n_updates, 500)
    train_offline(
        make_algorithm("td3bc", (256, 256)),
        dataset,
        seeds=(0,),
        schedule=Schedule(n_updates=n_updates, chunk_updates=chunk),
    )
    return {
        "n_transitions": int(dataset.n_transitions),
        "dataset_bytes": int(dataset.nbytes()),
        "peak_rss_after_load_bytes": loaded,
        "peak_rss_bytes": peak_rss_bytes(),
        "updates": n_updates,
    }


def measure_memory(n_episodes: int, n_updates: int) -> dict[str, Any]:
    """:func:`memory_child` in a fresh interpreter, so nothing else counts."""
    code = (
        "import json, sys; from benchmarks.agent_speed import memory_child; "
        f"print(json.dumps(memory_child({n_episodes}, {n_updates})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "NEORL_INDUSTRIAL_JAX_CACHE": "0"},
    )
    values = json.loads(result.stdout.strip().splitlines()[-1])
    values["peak_rss_over_dataset"] = values["peak_rss_bytes"] / values["dataset_bytes"]
    return values


# --------------------------------------------------------------------------- run


def evaluate_targets(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The goals of :data:`TARGETS` against ``results``."""
    values: dict[str, float | None] = {
        f"{name}_vs_d3rlpy": results["algorithms"]
        .get(row_name(name, (256, 256)), {})
        .get("vs_d3rlpy")
        for name in ("bc", "td3bc", "iql", "cql")
    }
    compiles = [row.get("compile_s") for row in results["algorithms"].values()]
    values["max_compile_s"] = max(compiles) if compiles and None not in compiles else None
    return harness_evaluate_targets(values, TARGETS)


def measure_row(
    name: str,
    hidden: tuple[int, ...],
    cfg: Settings,
    ours_data: Any,
    theirs_data: Any,
    peak: float,
) -> dict[str, Any]:
    """Ours (one seed, and 8 vmapped) and d3rlpy on one algorithm and network size."""
    row = row_name(name, hidden)
    progress(f"{row}: ours, one seed")
    single = OurRun(name, hidden, ours_data, 1, cfg.chunk_updates[row])
    best, _ = time_best(single, repeats=cfg.repeats)
    ours_rate = cfg.chunk_updates[row] / best
    progress(f"{row}: ours, {N_SEEDS} seeds vmapped")
    seeded = OurRun(name, hidden, ours_data, N_SEEDS, cfg.seed_updates[row])
    seeded_best, _ = time_best(seeded, repeats=cfg.repeats)
    vmapped_rate = N_SEEDS * cfg.seed_updates[row] / seeded_best
    progress(f"{row}: d3rlpy")
    theirs = measure_d3rlpy(name, hidden, theirs_data, cfg.d3rlpy_updates[row], cfg.repeats)
    flops = update_flops(name, hidden, ours_data)
    achieved = None if flops is None else flops * ours_rate
    return {
        "algorithm": name,
        "hidden": list(hidden),
        "steps_per_s": ours_rate,
        "compile_s": single.compile_s,
        "compile_s_8_seeds": seeded.compile_s,
        "d3rlpy_steps_per_s": theirs["steps_per_s"],
        "vs_d3rlpy": ratio(ours_rate, theirs["steps_per_s"]),
        "seeds_vmapped_steps_per_s": vmapped_rate,
        # Eight sequential runs of one seed go at the single-seed rate.
        "seeds_sequential_steps_per_s": ours_rate,
        "vmapped_vs_sequential": ratio(vmapped_rate, ours_rate),
        "flop_per_update": flops,
        "flop_per_s": achieved,
        "fraction_of_peak": ratio(achieved, peak),
        "d3rlpy_fraction_of_peak": (
            None if flops is None else ratio(flops * theirs["steps_per_s"], peak)
        ),
    }


def run(quick: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """Runs the benchmark; ``(config, results)`` for a :class:`BenchmarkResult`."""
    import jax
    import torch

    jax.config.update("jax_enable_compilation_cache", False)
    cfg = settings(quick)
    progress(f"data: {cfg.n_episodes} episodes x 1000 steps")
    ours_data = build_dataset(cfg.n_episodes)
    theirs_data = d3rlpy_dataset(cfg.n_episodes)

    peaks = [matmul_peak(size) for size in (256, 1024)]
    peak = max(entry["flop_per_s"] for entry in peaks)
    algorithms: dict[str, dict[str, Any]] = {}
    for hidden in HIDDEN_SIZES:
        for name in ALGORITHMS:
            row = row_name(name, hidden)
            algorithms[row] = measure_row(name, hidden, cfg, ours_data, theirs_data, peak)
    results: dict[str, Any] = {"algorithms": algorithms, "matmul_peak": peaks}
    if cfg.memory_episodes:
        progress(f"memory: TD3+BC on {cfg.memory_episodes * 1000:,} transitions (child process)")
        results["memory"] = measure_memory(cfg.memory_episodes, cfg.memory_updates)
    results["targets"] = evaluate_targets(results)
    config = {
        **dataclasses.asdict(cfg),
        "batch_size": BATCH_SIZE,
        "observation_size": OBSERVATION_SIZE,
        "action_size": ACTION_SIZE,
        "n_seeds": N_SEEDS,
        "hidden_sizes": [list(hidden) for hidden in HIDDEN_SIZES],
        "iqn_critic": IQN_CRITIC,
        "torch_threads": torch.get_num_threads(),
        "jax_backend": jax.default_backend(),
    }
    return config, results


def report(config: dict[str, Any], results: dict[str, Any]) -> list[Table]:
    """Tables for the runner's printed summary."""
    speed = Table(
        f"agent_speed: gradient steps/s, batch {config.get('batch_size')}, "
        f"{config.get('observation_size')}-value observations",
        [
            "algorithm",
            "ours",
            "d3rlpy",
            "ratio",
            "compile s",
            f"{config.get('n_seeds')} seeds vmapped",
            "vmapped / sequential",
            "GFLOP/s",
            "of peak",
            "d3rlpy of peak",
        ],
        [],
        caption=f"torch threads {config.get('torch_threads')}; matmul peak "
        + ", ".join(
            f"{entry['size']}: {entry['flop_per_s'] / 1e9:.0f} GFLOP/s"
            for entry in results.get("matmul_peak", [])
        ),
    )
    for name, row in results.get("algorithms", {}).items():
        flop_per_s = row.get("flop_per_s")
        speed.rows.append(
            [
                name,
                row.get("steps_per_s"),
                row.get("d3rlpy_steps_per_s"),
                row.get("vs_d3rlpy"),
                row.get("compile_s"),
                row.get("seeds_vmapped_steps_per_s"),
                row.get("vmapped_vs_sequential"),
                None if flop_per_s is None else flop_per_s / 1e9,
                row.get("fraction_of_peak"),
                row.get("d3rlpy_fraction_of_peak"),
            ]
        )
    tables = [speed]
    memory = results.get("memory")
    if memory:
        tables.append(
            Table(
                "agent_speed: memory while training TD3+BC",
                ["transitions", "dataset MB", "peak RSS MB", "peak RSS / dataset"],
                [
                    [
                        memory["n_transitions"],
                        memory["dataset_bytes"] / 1e6,
                        memory["peak_rss_bytes"] / 1e6,
                        memory["peak_rss_over_dataset"],
                    ]
                ],
            )
        )
    targets = results.get("targets", {})
    tables.append(
        Table(
            "agent_speed: targets",
            ["goal", "value", "target", "met"],
            [
                [name, t["value"], f"{t['comparison']} {t['threshold']}", t["passed"]]
                for name, t in targets.items()
            ],
        )
    )
    return tables
