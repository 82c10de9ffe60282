"""Dataset sampling: batches per second from a large offline dataset, ours against d3rlpy.

What is measured, all in one process on one machine (run it pinned to one core with
``taskset -c 0`` so that JAX and the Python samplers get the same single CPU):

* **data** - a synthetic dataset (random float32 values, not environment data: sampling
  speed does not depend on the values) of ``n_episodes`` episodes of ``episode_length``
  steps with 180-value observations, 3-value actions and 2 costs, the shapes of ``IB-v0``.
  The episodes never terminate (they time out at their last step), like the Industrial
  Benchmark's. Ours is built with :meth:`Dataset.from_trajectories`; every other sampler
  reads the same values.
* **ours, fused** - for each sampler (``uniform``: one-step :func:`sample`; ``nstep``:
  :func:`sample_nstep` with ``n_step = 5``, ``gamma = 0.99``; ``windows``:
  :func:`sample_windows` of 32 steps), one jitted call draws ``n_batches`` batches of 256
  inside ``jax.lax.scan`` and sums every field of every batch (so XLA cannot drop any of
  it); the dispatch cost is paid once per call.
* **ours, per call** - ``jax.jit`` of the same sampler called once per batch in a Python
  loop, blocking on every batch: how a user who calls the sampler from Python sees it.
* **d3rlpy** - d3rlpy 2.8's ``MDPDataset`` built from the same flat data:
  ``sample_transition_batch(256)`` (one-step), the same with d3rlpy's
  ``MultiStepTransitionPicker(5, 0.99)`` (n-step) and ``sample_trajectory_batch(256, 32)``
  (windows). d3rlpy keeps one observation per step and no final next-observation, so each
  of its episodes gets one extra row holding the final observation (zero action and
  reward, the timeout flag); it then holds exactly our transitions.
* **python loop** - what a naive implementation does: for each of 256 random indices,
  index the numpy arrays in Python, then stack each field.
* **components** - the uniform sampler split into drawing the indices alone (RNG) and the
  gathers alone (indices drawn beforehand), both fused like above.
* **memory** - bytes per transition of our dataset against the raw flat data
  (``Dataset.nbytes() / Dataset.raw_nbytes()``), of d3rlpy's buffer (its episode arrays
  plus the Python objects it builds, traced with ``tracemalloc``) and the process's peak
  resident memory after each build.

Every sampler draws its indices inside the timed loop. Each time is the best of several
repeats after an untimed warm-up call. Ratios are ``batches_per_s / other batches_per_s``
from the same run. The ``targets`` entry records each goal (uniform fused >= 10x d3rlpy,
memory ratio <= 1.1) with its value and whether it was met; a miss is data, not an error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import resource
import sys
import time
import tracemalloc
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from benchmarks.harness import Table, progress, rate, ratio, time_best
from benchmarks.harness import evaluate_targets as harness_evaluate_targets

NAME = "data_sampling"
DESCRIPTION = (
    "Batches/s of uniform, n-step and window sampling from a 1M-transition dataset "
    "vs d3rlpy and a Python loop; memory per transition"
)

BATCH_SIZE = 256
N_STEP = 5
GAMMA = 0.99
WINDOW_LENGTH = 32
OBSERVATION_SIZE = 180
ACTION_SIZE = 3
N_COSTS = 2
SAMPLERS = ("uniform", "nstep", "windows")

#: Goals recorded with each run: name -> (comparison, threshold, what is compared).
TARGETS: dict[str, tuple[str, float, str]] = {
    "uniform_fused_vs_d3rlpy": (
        ">=",
        10.0,
        "uniform one-step batches/s, ours fused (lax.scan) / d3rlpy sample_transition_batch",
    ),
    "memory_ratio": ("<=", 1.1, "Dataset.nbytes() / Dataset.raw_nbytes()"),
}

Sampler = Callable[[Any, Any, Any], Any]


@dataclasses.dataclass(frozen=True)
class Settings:
    """Sizes of one run.

    Attributes:
        quick: the small version.
        repeats: timed calls per measurement (the best is kept).
        n_episodes: episodes of the synthetic dataset.
        episode_length: steps per episode.
        fused_batches: batches per fused call, per sampler.
        per_call_batches: batches per timed Python loop of jitted calls, per sampler.
        d3rlpy_batches: batches per timed d3rlpy loop, per sampler.
        python_batches: batches per timed Python-loop baseline, per sampler.
    """

    quick: bool
    repeats: int
    n_episodes: int
    episode_length: int
    fused_batches: dict[str, int]
    per_call_batches: dict[str, int]
    d3rlpy_batches: dict[str, int]
    python_batches: dict[str, int]

    @property
    def n_transitions(self) -> int:
        return self.n_episodes * self.episode_length


def settings(quick: bool) -> Settings:
    """The full run (1000 episodes of 1000 steps), or with ``quick`` a small one."""
    if quick:
        return Settings(
            quick=True,
            repeats=3,
            n_episodes=100,
            episode_length=1000,
            fused_batches={"uniform": 200, "nstep": 200, "windows": 20},
            per_call_batches={"uniform": 100, "nstep": 100, "windows": 10},
            d3rlpy_batches={"uniform": 10, "nstep": 10, "windows": 3},
            python_batches={"uniform": 10, "nstep": 10, "windows": 3},
        )
    return Settings(
        quick=False,
        repeats=5,
        n_episodes=1000,
        episode_length=1000,
        fused_batches={"uniform": 2000, "nstep": 2000, "windows": 200},
        per_call_batches={"uniform": 1000, "nstep": 1000, "windows": 100},
        d3rlpy_batches={"uniform": 100, "nstep": 100, "windows": 30},
        python_batches={"uniform": 100, "nstep": 100, "windows": 30},
    )


def peak_rss_bytes() -> int:
    """The process's peak resident memory so far, in bytes.

    On Linux this is ``VmHWM`` of ``/proc/self/status``: ``getrusage``'s ``ru_maxrss``
    survives ``exec``, so a child started by a large parent (``subprocess`` forks the
    parent's address space first) would report the parent's peak, not its own.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux reports kiB


def rss_bytes() -> int | None:
    """The process's resident memory now, in bytes (None where ``/proc`` is missing)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            resident_pages = int(handle.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident_pages * resource.getpagesize()


def memory_snapshot() -> dict[str, int | None]:
    """``{"peak_rss_bytes", "rss_bytes"}`` of the process now."""
    return {"peak_rss_bytes": peak_rss_bytes(), "rss_bytes": rss_bytes()}


# --------------------------------------------------------------------------- data


def synthesize(n_episodes: int, episode_length: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random trajectories in the layout of :meth:`Dataset.from_trajectories`.

    Returns:
        ``observations`` ``[n, T + 1, 180]``, ``actions`` ``[n, T, 3]`` in [-1, 1],
        ``rewards`` ``[n, T]``, ``costs`` ``[n, T, 2]`` (all float32) and ``terminated``
        ``[n, T]`` (all False: every episode times out).
    """
    rng = np.random.default_rng(seed)
    shape = (n_episodes, episode_length)
    return {
        "observations": rng.standard_normal(
            (n_episodes, episode_length + 1, OBSERVATION_SIZE), dtype=np.float32
        ),
        "actions": rng.uniform(-1.0, 1.0, (*shape, ACTION_SIZE)).astype(np.float32),
        "rewards": rng.standard_normal(shape, dtype=np.float32),
        "costs": rng.random((*shape, N_COSTS), dtype=np.float32),
        "terminated": np.zeros(shape, bool),
    }


def build_dataset(trajectories: Mapping[str, np.ndarray]) -> Any:
    """Our :class:`Dataset` from :func:`synthesize` output, ready on the device."""
    import jax

    from neorl_industrial.functional.state_management import Dataset

    dataset = Dataset.from_trajectories(
        trajectories["observations"],
        trajectories["actions"],
        trajectories["rewards"],
        trajectories["costs"],
        trajectories["terminated"],
    )
    return jax.block_until_ready(dataset)


def host_arrays(dataset: Any) -> dict[str, np.ndarray]:
    """The dataset's fields as numpy arrays (views of the device buffers on CPU)."""
    return {
        field.name: np.asarray(getattr(dataset, field.name))
        for field in dataclasses.fields(dataset)
    }


def d3rlpy_flat(trajectories: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same data as d3rlpy's flat ``MDPDataset`` arrays.

    d3rlpy stores one observation per step and no final next-observation: a timed-out
    episode of ``T + 1`` rows yields ``T`` transitions. Each episode therefore gets one
    extra row holding its final observation (zero action and reward, the timeout flag);
    the observations are a view of ``trajectories["observations"]``, not a copy.

    Raises:
        ValueError: when an episode terminates (d3rlpy would then drop the padding row's
            meaning); the synthetic data never does.
    """
    if np.any(trajectories["terminated"]):
        raise ValueError("terminated: the d3rlpy layout here supports timed-out episodes only")
    n, length = trajectories["rewards"].shape
    actions = np.zeros((n, length + 1, ACTION_SIZE), np.float32)
    actions[:, :length] = trajectories["actions"]
    rewards = np.zeros((n, length + 1), np.float32)
    rewards[:, :length] = trajectories["rewards"]
    timeouts = np.zeros((n, length + 1), np.float32)
    timeouts[:, -1] = 1.0
    return {
        "observations": trajectories["observations"].reshape(n * (length + 1), -1),
        "actions": actions.reshape(n * (length + 1), ACTION_SIZE),
        "rewards": rewards.reshape(-1),
        "terminals": np.zeros(n * (length + 1), np.float32),
        "timeouts": timeouts.reshape(-1),
    }


# --------------------------------------------------------------------------- ours


def our_samplers() -> dict[str, Sampler]:
    """Our samplers as ``fn(dataset, valid_window_starts, key) -> batch``.

    The window starts are an argument (not a closure): a closed-over array would be
    embedded into the compiled program as a constant.
    """
    from neorl_industrial.functional.state_management import (
        sample,
        sample_nstep,
        sample_windows,
    )

    return {
        "uniform": lambda dataset, starts, key: sample(dataset, key, BATCH_SIZE, GAMMA),
        "nstep": lambda dataset, starts, key: sample_nstep(dataset, key, BATCH_SIZE, N_STEP, GAMMA),
        "windows": lambda dataset, starts, key: sample_windows(
            dataset, starts, key, BATCH_SIZE, WINDOW_LENGTH
        ),
    }


def consume(tree: Any) -> Any:
    """The sum of every element of every leaf, as float32: a use of the whole batch."""
    import jax
    import jax.numpy as jnp

    return sum(
        (jnp.sum(leaf.astype(jnp.float32)) for leaf in jax.tree.leaves(tree)),
        jnp.zeros((), jnp.float32),
    )


def fused_sampler(sampler: Sampler, n_batches: int) -> Callable[[Any, Any, Any], Any]:
    """A jitted ``fn(dataset, starts, key) -> total`` drawing ``n_batches`` batches in one
    ``lax.scan``, each batch consumed by :func:`consume`."""
    import jax
    import jax.numpy as jnp

    def fused(dataset: Any, starts: Any, key: Any) -> Any:
        def body(total: Any, batch_key: Any) -> tuple[Any, None]:
            return total + consume(sampler(dataset, starts, batch_key)), None

        total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), jax.random.split(key, n_batches))
        return total

    return jax.jit(fused)


def _timing(n_batches: int, batch_size: int, best: float, times: list[float]) -> dict[str, Any]:
    batches_per_s = rate(n_batches, best)
    return {
        "n_batches": n_batches,
        "best_s": best,
        "all_s": times,
        "batches_per_s": batches_per_s,
        "samples_per_s": None if batches_per_s is None else batches_per_s * batch_size,
    }


def measure_fused(
    sampler: Sampler, dataset: Any, starts: Any, n_batches: int, repeats: int
) -> dict[str, Any]:
    """Batches/s of :func:`fused_sampler`, with its compile time."""
    import jax

    key = jax.random.PRNGKey(1)
    start = time.perf_counter()
    compiled = fused_sampler(sampler, n_batches).lower(dataset, starts, key).compile()
    compile_s = time.perf_counter() - start
    best, times = time_best(lambda: jax.block_until_ready(compiled(dataset, starts, key)), repeats)
    return {**_timing(n_batches, BATCH_SIZE, best, times), "compile_s": compile_s}


def measure_per_call(
    sampler: Sampler, dataset: Any, starts: Any, n_batches: int, repeats: int
) -> dict[str, Any]:
    """Batches/s of ``jax.jit(sampler)`` called once per batch from Python, blocking on
    each batch (keys are split beforehand, outside the timed loop)."""
    import jax

    jitted = jax.jit(sampler)
    keys = list(jax.random.split(jax.random.PRNGKey(2), n_batches))

    def loop() -> None:
        for key in keys:
            jax.block_until_ready(jitted(dataset, starts, key))

    best, times = time_best(loop, repeats)
    return _timing(n_batches, BATCH_SIZE, best, times)


def measure_components(dataset: Any, n_batches: int, repeats: int, seed: int = 3) -> dict[str, Any]:
    """The uniform sampler's parts, each fused over ``n_batches`` batches: drawing the
    indices alone (``rng_only``) and gathering the batch at indices drawn beforehand on
    the host (``gather_only``)."""
    import jax
    import jax.numpy as jnp

    from neorl_industrial.functional.state_management import (
        gather_transitions,
        sample_indices,
    )

    key = jax.random.PRNGKey(seed)
    indices = jnp.asarray(
        np.random.default_rng(seed).integers(
            0, dataset.n_transitions, (n_batches, BATCH_SIZE), dtype=np.int32
        )
    )

    @jax.jit
    def rng_only(dataset: Any, key: Any) -> Any:
        def body(total: Any, batch_key: Any) -> tuple[Any, None]:
            return total + jnp.sum(sample_indices(dataset, batch_key, BATCH_SIZE)), None

        return jax.lax.scan(body, jnp.zeros((), jnp.int32), jax.random.split(key, n_batches))[0]

    @jax.jit
    def gather_only(dataset: Any, indices: Any) -> Any:
        def body(total: Any, batch_indices: Any) -> tuple[Any, None]:
            return total + consume(gather_transitions(dataset, batch_indices, GAMMA)), None

        return jax.lax.scan(body, jnp.zeros((), jnp.float32), indices)[0]

    results = {}
    for name, call in (
        ("rng_only", lambda: rng_only(dataset, key)),
        ("gather_only", lambda: gather_only(dataset, indices)),
    ):
        best, times = time_best(lambda call=call: jax.block_until_ready(call()), repeats)
        entry = _timing(n_batches, BATCH_SIZE, best, times)
        entry["us_per_batch"] = best / n_batches * 1e6
        results[name] = entry
    return results


# --------------------------------------------------------------------------- python loop


def python_loop_uniform(
    arrays: Mapping[str, np.ndarray], indices: np.ndarray, gamma: float = GAMMA
) -> dict[str, np.ndarray]:
    """One-step transitions at ``indices``, one Python-indexed transition at a time.

    Args:
        arrays: :func:`host_arrays` of a dataset.
        indices: transition indices.
        gamma: discount of non-terminal transitions.

    Returns:
        The fields of :class:`~neorl_industrial.functional.state_management.Batch`.
    """
    observations, rows = arrays["observations"], arrays["observation_index"]
    transitions = []
    for index in indices:
        row = rows[index]
        terminal = arrays["terminals"][index]
        transitions.append(
            (
                observations[row],
                arrays["actions"][index],
                arrays["rewards"][index],
                arrays["costs"][index],
                observations[row + 1],
                terminal,
                0.0 if terminal else gamma,
            )
        )
    return _stack_fields(
        transitions,
        (
            "observations",
            "actions",
            "rewards",
            "costs",
            "next_observations",
            "terminals",
            "discounts",
        ),
    )


def python_loop_nstep(
    arrays: Mapping[str, np.ndarray], indices: np.ndarray, n_step: int, gamma: float = GAMMA
) -> dict[str, np.ndarray]:
    """``n_step`` returns from ``indices`` (truncated at the episode's end), one
    transition at a time; the same definition as :func:`gather_nstep`."""
    observations, rows = arrays["observations"], arrays["observation_index"]
    transitions = []
    for index in indices:
        horizon = min(n_step, int(arrays["steps_to_end"][index]))
        weights = gamma ** np.arange(horizon, dtype=np.float32)
        steps = slice(index, index + horizon)
        terminal = arrays["terminals"][index + horizon - 1]
        row = rows[index]
        transitions.append(
            (
                observations[row],
                arrays["actions"][index],
                weights @ arrays["rewards"][steps],
                weights @ arrays["costs"][steps],
                observations[row + horizon],
                terminal,
                0.0 if terminal else gamma**horizon,
            )
        )
    return _stack_fields(
        transitions,
        (
            "observations",
            "actions",
            "rewards",
            "costs",
            "next_observations",
            "terminals",
            "discounts",
        ),
    )


def python_loop_windows(
    arrays: Mapping[str, np.ndarray], starts: np.ndarray, length: int
) -> dict[str, np.ndarray]:
    """Windows of ``length`` steps beginning at ``starts``, one window at a time; the
    same fields as :func:`gather_windows`."""
    observations, rows = arrays["observations"], arrays["observation_index"]
    windows = []
    for start in starts:
        steps = slice(start, start + length)
        row = rows[start]
        windows.append(
            (
                observations[row : row + length + 1],
                arrays["actions"][steps],
                arrays["rewards"][steps],
                arrays["costs"][steps],
                arrays["terminals"][steps],
                arrays["timeouts"][steps],
                start,
            )
        )
    return _stack_fields(
        windows,
        ("observations", "actions", "rewards", "costs", "terminals", "timeouts", "start"),
    )


def _stack_fields(items: list[tuple[Any, ...]], names: tuple[str, ...]) -> dict[str, np.ndarray]:
    return {name: np.stack([item[i] for item in items]) for i, name in enumerate(names)}


def measure_python_loop(
    name: str,
    arrays: Mapping[str, np.ndarray],
    valid_starts: np.ndarray,
    n_batches: int,
    repeats: int,
    seed: int = 4,
) -> dict[str, Any]:
    """Batches/s of the Python-loop baseline for sampler ``name`` (indices drawn with
    numpy inside the timed loop)."""
    rng = np.random.default_rng(seed)
    n_transitions = len(arrays["rewards"])

    def one_batch() -> Any:
        if name == "uniform":
            return python_loop_uniform(arrays, rng.integers(0, n_transitions, BATCH_SIZE))
        if name == "nstep":
            return python_loop_nstep(arrays, rng.integers(0, n_transitions, BATCH_SIZE), N_STEP)
        choice = rng.integers(0, len(valid_starts), BATCH_SIZE)
        return python_loop_windows(arrays, valid_starts[choice], WINDOW_LENGTH)

    def loop() -> None:
        for _ in range(n_batches):
            one_batch()

    best, times = time_best(loop, repeats)
    return _timing(n_batches, BATCH_SIZE, best, times)


# --------------------------------------------------------------------------- d3rlpy


@contextlib.contextmanager
def _quiet() -> Any:
    """Silences standard output and error (d3rlpy's and gym's import messages and its
    structured log lines)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def _error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def measure_d3rlpy(flat: Mapping[str, np.ndarray], cfg: Settings) -> dict[str, Any]:
    """d3rlpy's buffer on the same data: build time, memory and batches/s per sampler.

    Never raises: a failure to import or build is recorded as ``error`` and a failing
    sampler as its own ``error`` entry.
    """
    try:
        with _quiet():
            import d3rlpy
            from d3rlpy.dataset import MDPDataset, MultiStepTransitionPicker, ReplayBuffer
    except Exception as error:  # any import failure is a result, not a crash
        return {"error": f"d3rlpy not available: {_error(error)}", "samplers": {}}

    result: dict[str, Any] = {
        "version": d3rlpy.__version__,
        "samplers": {},
        "memory_after_import": memory_snapshot(),
    }
    try:
        tracemalloc.start()
        start = time.perf_counter()
        with _quiet():
            dataset = MDPDataset(
                flat["observations"],
                flat["actions"],
                flat["rewards"],
                flat["terminals"],
                flat["timeouts"],
            )
        build_s = time.perf_counter() - start
        python_bytes, _ = tracemalloc.get_traced_memory()
    except Exception as error:
        return {**result, "error": f"building MDPDataset failed: {_error(error)}"}
    finally:
        tracemalloc.stop()

    n_transitions = int(dataset.transition_count)
    array_bytes = sum(
        int(episode.observations.nbytes + episode.actions.nbytes + episode.rewards.nbytes)
        for episode in dataset.episodes
    )
    result["build_s"] = build_s
    result["n_transitions"] = n_transitions
    result["n_episodes"] = len(dataset.episodes)
    result["memory"] = {
        "episode_array_bytes": array_bytes,
        "python_object_bytes": python_bytes,
        "bytes_per_transition": (array_bytes + python_bytes) / n_transitions,
        "array_bytes_per_transition": array_bytes / n_transitions,
        "python_bytes_per_transition": python_bytes / n_transitions,
        "how": "numpy nbytes of every episode's observations, actions and rewards (views of "
        "the flat arrays), plus the Python objects allocated while building (tracemalloc)",
    }
    result["memory_after_build"] = memory_snapshot()

    info = dataset.dataset_info
    with _quiet():
        nstep_buffer = ReplayBuffer(
            dataset.buffer,
            transition_picker=MultiStepTransitionPicker(n_steps=N_STEP, gamma=GAMMA),
            observation_signature=info.observation_signature,
            action_signature=info.action_signature,
            reward_signature=info.reward_signature,
            action_space=info.action_space,
            action_size=info.action_size,
        )
    calls: dict[str, tuple[str, Callable[[], Any]]] = {
        "uniform": (
            "MDPDataset.sample_transition_batch(256)",
            lambda: dataset.sample_transition_batch(BATCH_SIZE),
        ),
        "nstep": (
            f"ReplayBuffer(transition_picker=MultiStepTransitionPicker({N_STEP}, {GAMMA}))"
            ".sample_transition_batch(256), on the same buffer",
            lambda: nstep_buffer.sample_transition_batch(BATCH_SIZE),
        ),
        "windows": (
            f"MDPDataset.sample_trajectory_batch(256, {WINDOW_LENGTH})",
            lambda: dataset.sample_trajectory_batch(BATCH_SIZE, WINDOW_LENGTH),
        ),
    }
    np.random.seed(0)  # d3rlpy draws from numpy's global generator
    for name, (api, call) in calls.items():
        n_batches = cfg.d3rlpy_batches[name]
        progress(f"d3rlpy {name}: {n_batches} batches")

        def loop(call: Callable[[], Any] = call, n_batches: int = n_batches) -> None:
            for _ in range(n_batches):
                call()

        try:
            best, times = time_best(loop, cfg.repeats)
        except Exception as error:
            result["samplers"][name] = {"api": api, "error": _error(error), "batches_per_s": None}
            continue
        result["samplers"][name] = {"api": api, **_timing(n_batches, BATCH_SIZE, best, times)}
    return result


# --------------------------------------------------------------------------- targets


def evaluate_targets(
    values: Mapping[str, float | None],
    targets: Mapping[str, tuple[str, float, str]] = TARGETS,
) -> dict[str, dict[str, Any]]:
    """This benchmark's goals (see :func:`benchmarks.harness.evaluate_targets`)."""
    return harness_evaluate_targets(values, targets)


def sampler_ratios(entry: Mapping[str, Any]) -> dict[str, float | None]:
    """Ours (fused and per call) against d3rlpy and the Python loop for one sampler."""

    def batches(name: str) -> float | None:
        return (entry.get(name) or {}).get("batches_per_s")

    return {
        "fused_vs_d3rlpy": ratio(batches("ours_fused"), batches("d3rlpy")),
        "per_call_vs_d3rlpy": ratio(batches("ours_per_call"), batches("d3rlpy")),
        "fused_vs_python_loop": ratio(batches("ours_fused"), batches("python_loop")),
        "per_call_vs_python_loop": ratio(batches("ours_per_call"), batches("python_loop")),
        "fused_vs_per_call": ratio(batches("ours_fused"), batches("ours_per_call")),
    }


# --------------------------------------------------------------------------- entry points


def run(quick: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """Runs the benchmark.

    Args:
        quick: a small version (100 000 transitions, short loops) for smoke tests.

    Returns:
        ``(config, results)`` for a :class:`benchmarks.harness.BenchmarkResult`.
    """
    import jax

    from neorl_industrial.functional.state_management import window_starts

    cfg = settings(quick)
    process: dict[str, Any] = {"start": memory_snapshot()}

    progress(f"synthesizing {cfg.n_episodes} episodes x {cfg.episode_length} steps")
    start = time.perf_counter()
    trajectories = synthesize(cfg.n_episodes, cfg.episode_length)
    synthesize_s = time.perf_counter() - start
    process["after_synthesis"] = memory_snapshot()

    progress("building Dataset.from_trajectories")
    start = time.perf_counter()
    dataset = build_dataset(trajectories)
    build_s = time.perf_counter() - start
    starts = jax.block_until_ready(window_starts(dataset, WINDOW_LENGTH))
    process["after_dataset_build"] = memory_snapshot()

    memory_ours = {
        "nbytes": dataset.nbytes(),
        "raw_nbytes": dataset.raw_nbytes(),
        "ratio": dataset.nbytes() / dataset.raw_nbytes(),
        "bytes_per_transition": dataset.nbytes() / dataset.n_transitions,
        "raw_bytes_per_transition": dataset.raw_nbytes() / dataset.n_transitions,
        "window_starts_nbytes": int(starts.nbytes),
        "note": "window_starts (one int32 per valid start, for one window length) is held "
        "beside the dataset and not counted in nbytes",
    }

    samplers: dict[str, dict[str, Any]] = {name: {} for name in SAMPLERS}
    for name, sampler in our_samplers().items():
        progress(f"ours {name}: fused, {cfg.fused_batches[name]} batches per call")
        samplers[name]["ours_fused"] = measure_fused(
            sampler, dataset, starts, cfg.fused_batches[name], cfg.repeats
        )
        progress(f"ours {name}: one jitted call per batch, {cfg.per_call_batches[name]}")
        samplers[name]["ours_per_call"] = measure_per_call(
            sampler, dataset, starts, cfg.per_call_batches[name], cfg.repeats
        )

    progress("uniform components: RNG alone, gathers alone")
    components = measure_components(dataset, cfg.fused_batches["uniform"], cfg.repeats)
    fused_uniform = samplers["uniform"]["ours_fused"]
    components["fused"] = {
        "batches_per_s": fused_uniform["batches_per_s"],
        "us_per_batch": fused_uniform["best_s"] / fused_uniform["n_batches"] * 1e6,
    }

    arrays = host_arrays(dataset)
    valid_starts = np.asarray(starts)
    for name in SAMPLERS:
        progress(f"python loop {name}: {cfg.python_batches[name]} batches")
        samplers[name]["python_loop"] = measure_python_loop(
            name, arrays, valid_starts, cfg.python_batches[name], cfg.repeats
        )

    progress("d3rlpy: building MDPDataset")
    d3rlpy_result = measure_d3rlpy(d3rlpy_flat(trajectories), cfg)
    for stage in ("import", "build"):
        if f"memory_after_{stage}" in d3rlpy_result:
            process[f"after_d3rlpy_{stage}"] = d3rlpy_result.pop(f"memory_after_{stage}")
    for name in SAMPLERS:
        entry = d3rlpy_result.get("samplers", {}).get(name)
        samplers[name]["d3rlpy"] = entry or {
            "error": d3rlpy_result.get("error", "not measured"),
            "batches_per_s": None,
        }
        samplers[name]["ratios"] = sampler_ratios(samplers[name])
    process["end"] = memory_snapshot()

    d3rlpy_memory = d3rlpy_result.get("memory", {})
    summary = {
        name: {
            "ours_fused": samplers[name]["ours_fused"]["batches_per_s"],
            "ours_per_call": samplers[name]["ours_per_call"]["batches_per_s"],
            "d3rlpy": samplers[name]["d3rlpy"].get("batches_per_s"),
            "python_loop": samplers[name]["python_loop"]["batches_per_s"],
            **samplers[name]["ratios"],
        }
        for name in SAMPLERS
    }
    summary["memory_ratio"] = memory_ours["ratio"]
    summary["bytes_per_transition"] = memory_ours["bytes_per_transition"]
    summary["d3rlpy_bytes_per_transition"] = d3rlpy_memory.get("bytes_per_transition")

    results: dict[str, Any] = {
        "dataset": {
            "source": "synthetic: random float32 values (standard normal observations and "
            "rewards, uniform actions and costs), episodes time out, no terminals",
            "n_episodes": cfg.n_episodes,
            "episode_length": cfg.episode_length,
            "n_transitions": dataset.n_transitions,
            "observation_size": OBSERVATION_SIZE,
            "action_size": ACTION_SIZE,
            "n_costs": N_COSTS,
            "synthesize_s": synthesize_s,
            "build_s": build_s,
            "n_window_starts": int(starts.shape[0]),
        },
        "memory": {
            "ours": memory_ours,
            "d3rlpy": d3rlpy_memory or {"error": d3rlpy_result.get("error")},
            "process": process,
            "process_note": "peak_rss_bytes is the peak so far (VmHWM), rss_bytes the "
            "resident memory then; after_synthesis holds the synthetic host arrays, "
            "after_dataset_build also our device copy, after_d3rlpy_import adds torch and "
            "d3rlpy, after_d3rlpy_build its buffer (a view of the host arrays plus its index)",
        },
        "samplers": samplers,
        "components": {"uniform": components},
        "d3rlpy": {
            key: value for key, value in d3rlpy_result.items() if key not in ("samplers", "memory")
        },
        "summary": summary,
    }
    results["targets"] = evaluate_targets(
        {
            "uniform_fused_vs_d3rlpy": summary["uniform"]["fused_vs_d3rlpy"],
            "memory_ratio": memory_ours["ratio"],
        }
    )

    config = {
        "quick": cfg.quick,
        "repeats": cfg.repeats,
        "warmup": 1,
        "timing": "best of repeats after one untimed warm-up call; indices drawn inside "
        "the timed loop by every sampler",
        "batch_size": BATCH_SIZE,
        "n_step": N_STEP,
        "gamma": GAMMA,
        "window_length": WINDOW_LENGTH,
        "n_episodes": cfg.n_episodes,
        "episode_length": cfg.episode_length,
        "fused_batches": cfg.fused_batches,
        "per_call_batches": cfg.per_call_batches,
        "d3rlpy_batches": cfg.d3rlpy_batches,
        "python_batches": cfg.python_batches,
        "fused": "one jitted call: lax.scan over n_batches batches, each summed (all fields)",
        "per_call": "jax.jit(sampler) called once per batch from Python, block_until_ready "
        "on each; keys split beforehand",
        "targets": {name: {"comparison": c, "threshold": t} for name, (c, t, _) in TARGETS.items()},
    }
    return config, results


def report(config: dict[str, Any], results: dict[str, Any]) -> list[Table]:
    """Tables for the runner's printed summary."""
    dataset = results.get("dataset", {})
    rates = Table(
        f"data_sampling: batches/s of {config.get('batch_size', BATCH_SIZE)} from "
        f"{dataset.get('n_transitions')} transitions ({OBSERVATION_SIZE}-value observations)",
        [
            "sampler",
            "ours fused",
            "ours per call",
            "d3rlpy",
            "python loop",
            "fused/d3rlpy",
            "per call/d3rlpy",
            "fused/python",
            "per call/python",
        ],
        [],
        caption="ratios from this run; fused = lax.scan over many batches in one jitted call",
    )
    for name, entry in results.get("samplers", {}).items():
        ratios = entry.get("ratios", {})
        rates.rows.append(
            [
                name,
                entry.get("ours_fused", {}).get("batches_per_s"),
                entry.get("ours_per_call", {}).get("batches_per_s"),
                entry.get("d3rlpy", {}).get("batches_per_s"),
                entry.get("python_loop", {}).get("batches_per_s"),
                ratios.get("fused_vs_d3rlpy"),
                ratios.get("per_call_vs_d3rlpy"),
                ratios.get("fused_vs_python_loop"),
                ratios.get("per_call_vs_python_loop"),
            ]
        )
    error = results.get("d3rlpy", {}).get("error")
    if error:
        rates.caption = f"{rates.caption}; {error}"

    parts = Table("uniform sampler parts (fused)", ["part", "us per batch", "batches/s"], [])
    for name, entry in results.get("components", {}).get("uniform", {}).items():
        parts.rows.append([name, entry.get("us_per_batch"), entry.get("batches_per_s")])

    memory = results.get("memory", {})
    ours = memory.get("ours", {})
    d3 = memory.get("d3rlpy", {})
    memory_table = Table("memory", ["measurement", "value"], [])
    memory_table.rows += [
        ["ours bytes/transition", ours.get("bytes_per_transition")],
        ["raw flat bytes/transition", ours.get("raw_bytes_per_transition")],
        ["ours nbytes / raw_nbytes", ours.get("ratio")],
        ["d3rlpy bytes/transition (arrays + Python objects)", d3.get("bytes_per_transition")],
        ["d3rlpy Python-object bytes/transition", d3.get("python_bytes_per_transition")],
    ]
    for stage, value in memory.get("process", {}).items():
        memory_table.rows.append([f"RSS {stage} (peak so far), bytes", value.get("peak_rss_bytes")])
        memory_table.rows.append([f"RSS {stage} (now), bytes", value.get("rss_bytes")])

    targets = Table("targets", ["target", "value", "threshold", "met"], [])
    for name, entry in results.get("targets", {}).items():
        targets.rows.append(
            [
                name,
                entry.get("value"),
                f"{entry.get('comparison', '')} {entry.get('threshold')}",
                entry.get("passed"),
            ]
        )
    targets.caption = "; ".join(
        f"{name}: {entry.get('what', '')}" for name, entry in results.get("targets", {}).items()
    )
    return [rates, parts, memory_table, targets]
