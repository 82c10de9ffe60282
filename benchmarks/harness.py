"""Shared pieces of every benchmark: system description, result files, timing and
statistics helpers.

Every benchmark run produces one :class:`BenchmarkResult`, saved as one JSON file in
``benchmarks/results/`` named ``<name>-<tag>-<YYYYmmddTHHMMSSZ>.json``. The file holds the
benchmark's configuration and measurements together with a description of the machine and
software they were taken on (:func:`system_info`), so that files from different runs can be
read side by side by ``python -m benchmarks.compare``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

#: Version of the JSON layout written by :meth:`BenchmarkResult.save`.
SCHEMA_VERSION = 1

#: The repository root (the parent of this package).
REPO_ROOT = Path(__file__).resolve().parent.parent

#: Where results are written unless told otherwise.
DEFAULT_RESULTS_DIR = Path(__file__).resolve().parent / "results"

#: Environment variables that change how JAX/XLA run, recorded with every result.
_RECORDED_ENV_VARS = (
    "JAX_PLATFORMS",
    "JAX_ENABLE_X64",
    "JAX_COMPILATION_CACHE_DIR",
    "XLA_FLAGS",
    "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
)

#: ``/proc/cpuinfo`` keys naming the CPU model (x86, then ARM and others).
_CPU_MODEL_KEYS = ("model name", "Model", "Hardware", "cpu model")

_FILENAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.]+")


# --------------------------------------------------------------------------- system


def _cpu_model() -> str:
    """The CPU model name from ``/proc/cpuinfo``, else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() in _CPU_MODEL_KEYS and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _cpu_affinity() -> list[int] | None:
    """The logical CPUs this process may run on, or None where the OS cannot say."""
    if hasattr(os, "sched_getaffinity"):
        try:
            return sorted(os.sched_getaffinity(0))
        except OSError:
            return None
    return None


def _memory_total_bytes() -> int | None:
    """Total physical memory in bytes, or None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024  # reported in kiB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def _git(*args: str) -> str | None:
    """Output of a git command run in the repository root, or None on any failure."""
    try:
        completed = subprocess.run(
            ["git", *args],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout.strip()


@functools.cache
def code_state() -> tuple[str | None, bool | None]:
    """The git commit of the code this process runs and whether the tree had uncommitted
    changes (None outside a git checkout), read once: when the harness is imported, so
    that a study running for hours records the code it started with, not the tree at its
    end."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return commit, bool(status) if status is not None else None


def system_info() -> dict[str, Any]:
    """Describes the machine and software a benchmark runs on.

    Imports JAX (and so initialises its default backend) to list the devices.

    Returns:
        A JSON-serialisable dict with the platform, Python, CPU model, logical CPU count,
        CPU affinity, total memory, JAX/jaxlib/numpy/package versions, the JAX devices
        and default backend, the git commit of the code (:func:`code_state`; None
        outside a git checkout) and whether the tree had uncommitted changes.
    """
    import jax
    import jaxlib
    import numpy as np

    try:
        import neorl_industrial

        package_version = getattr(neorl_industrial, "__version__", None)
    except ImportError:
        package_version = None

    affinity = _cpu_affinity()
    commit, dirty = code_state()
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python_version": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "cpu_model": _cpu_model(),
        "cpu_count_logical": os.cpu_count(),
        "cpu_affinity": affinity,
        "cpu_affinity_count": len(affinity) if affinity is not None else None,
        "memory_total_bytes": _memory_total_bytes(),
        "jax_version": jax.__version__,
        "jaxlib_version": getattr(jaxlib, "__version__", None)
        or getattr(getattr(jaxlib, "version", None), "__version__", None),
        "jax_devices": [str(device) for device in jax.devices()],
        "jax_default_backend": jax.default_backend(),
        "numpy_version": np.__version__,
        "package_version": package_version,
        "git_commit": commit,
        "git_dirty": dirty,
        "env": {name: os.environ[name] for name in _RECORDED_ENV_VARS if name in os.environ},
        "argv": portable_argv(sys.argv[1:]),
    }


def portable_argv(argv: Sequence[str]) -> list[str]:
    """The command's arguments as a result records them: an absolute path (alone or
    after ``--option=``) relative to the repository when inside it, else its file name
    alone; the machine's own paths say nothing to another reader."""

    def portable(text: str) -> str:
        option, equals, value = text.partition("=") if text.startswith("--") else ("", "", text)
        if not value.startswith("/"):
            return text
        path = Path(value)
        try:
            shown = path.resolve().relative_to(REPO_ROOT).as_posix()
        except ValueError:
            shown = path.name
        return f"{option}{equals}{shown}"

    return [portable(str(arg)) for arg in argv]


def affinity_note(system: Mapping[str, Any]) -> str:
    """One line on CPU pinning, for printed summaries."""
    affinity = system.get("cpu_affinity")
    total = system.get("cpu_count_logical")
    if affinity is None:
        return "CPU affinity unknown on this platform; pin with `taskset -c 0` where available."
    cpus = ",".join(str(cpu) for cpu in affinity)
    if len(affinity) == 1:
        return f"Pinned to CPU {cpus} (1 of {total} logical CPUs): reference and JAX share it."
    return (
        f"Not pinned: may run on CPUs {cpus} ({len(affinity)} of {total}). For numbers that"
        " compare run for run, run under `taskset -c 0`."
    )


# --------------------------------------------------------------------------- results


def utc_timestamp() -> str:
    """The current time in UTC as ISO 8601 with seconds, e.g. ``2025-01-31T12:00:00+00:00``."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def compact_timestamp(timestamp: str) -> str:
    """``2025-01-31T12:00:00+00:00`` -> ``20250131T120000Z`` (for file names)."""
    moment = datetime.fromisoformat(timestamp)
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y%m%dT%H%M%SZ")


def safe_filename_part(text: str, default: str) -> str:
    """``text`` with every run of characters other than letters, digits, ``_`` and ``.``
    replaced by ``_``; ``default`` when nothing is left."""
    cleaned = _FILENAME_UNSAFE.sub("_", text).strip("_.")
    return cleaned or default


def to_jsonable(value: Any) -> Any:
    """Converts ``value`` to plain JSON types.

    Numpy/JAX scalars and arrays become numbers and lists, tuples and sets become lists,
    paths become strings, and non-finite floats become None (JSON has no NaN).

    Raises:
        TypeError: for any other type.
    """
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(item) for item in value]
    if isinstance(value, set | frozenset):
        return [to_jsonable(item) for item in sorted(value)]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist") and hasattr(value, "dtype"):  # numpy / jax arrays, scalars
        return to_jsonable(value.tolist())
    raise TypeError(f"value: cannot store {type(value).__name__} in a result: {value!r}")


def write_atomically(path: str | os.PathLike[str], text: str) -> None:
    """Writes ``text`` to ``path`` atomically (the package's ``write_text_atomic``): a
    reader sees the old file or the new one, never a part, and a failed write leaves
    nothing behind."""
    from neorl_industrial.wrappers.hostio import write_text_atomic

    written = write_text_atomic(path, text)
    os.chmod(written, 0o644)  # results and pages are for everyone to read


def save_study(
    name: str,
    args: Any,
    started: str,
    config: Mapping[str, Any],
    results: Mapping[str, Any],
    page: str,
) -> Path:
    """A study's JSON result (in ``args.results_dir``, with ``args.description``,
    ``args.tag`` and :func:`system_info`) and its markdown page (``args.doc``, written
    atomically after the result). Returns the result's path."""
    result = BenchmarkResult(
        name=name,
        description=args.description,
        tag=args.tag,
        timestamp=started,
        system=system_info(),
        config=dict(config),
        results=dict(results),
    )
    path = result.save(args.results_dir)
    write_atomically(args.doc, page)
    return path


def run_printed_study(
    name: str,
    args: Any,
    study: Callable[[Any], Any],
    markdown: Callable[[Any], str],
) -> int:
    """Runs ``study(args)``, prints its markdown page and, unless ``args.no_save``, saves
    the per-dataset results and the seconds taken (with ``args.description``,
    ``args.tag`` and :func:`system_info`). Returns the exit code."""
    config = {key: value for key, value in vars(args).items() if key != "no_save"}
    started = time.perf_counter()
    results = study(args)
    print(markdown(results))
    if not args.no_save:
        result = BenchmarkResult(
            name=name,
            description=args.description,
            tag=args.tag,
            system=system_info(),
            config=config,
            results={"datasets": results, "seconds": time.perf_counter() - started},
        )
        progress(f"saved {result.save()}")
    return 0


def publish_study(
    name: str,
    args: Any,
    started: str,
    config: Mapping[str, Any],
    results: Mapping[str, Any],
    page: str,
) -> Path | None:
    """Prints a study's page and, unless ``args.no_save``, saves it with its result
    (:func:`save_study`) and says where on stderr. Returns the result's path (None when
    not saved)."""
    print(page)
    if args.no_save:
        return None
    path = save_study(name, args, started, config, results, page)
    print(f"Wrote {path} and {args.doc}", file=sys.stderr)
    return path


@dataclasses.dataclass
class BenchmarkResult:
    """One run of one benchmark.

    Attributes:
        name: the benchmark's registered name, e.g. ``env_throughput``.
        description: free text from the person running it (what changed, why).
        tag: a short label used in the file name and to filter runs, e.g. ``baseline``.
        timestamp: when the run started, UTC, ISO 8601.
        system: :func:`system_info` of the machine.
        config: the benchmark's settings (sizes, repeats, ids).
        results: the measurements.
        schema_version: layout version of the file.
    """

    name: str
    description: str = ""
    tag: str = "untagged"
    timestamp: str = dataclasses.field(default_factory=utc_timestamp)
    system: dict[str, Any] = dataclasses.field(default_factory=dict)
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    results: dict[str, Any] = dataclasses.field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        """The result as plain JSON types (see :func:`to_jsonable`)."""
        return to_jsonable(dataclasses.asdict(self))

    def to_json(self, indent: int | None = 2) -> str:
        """The result as a JSON document."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False) + "\n"

    def filename(self) -> str:
        """``<name>-<tag>-<YYYYmmddTHHMMSSZ>.json``."""
        return (
            f"{safe_filename_part(self.name, 'benchmark')}-"
            f"{safe_filename_part(self.tag, 'untagged')}-"
            f"{compact_timestamp(self.timestamp)}.json"
        )

    def save(self, directory: str | os.PathLike[str] = DEFAULT_RESULTS_DIR) -> Path:
        """Writes the result as JSON into ``directory`` (created if missing), atomically.

        The document is written to a temporary file in the same directory and moved into
        place with ``os.replace``, so a reader never sees a partial file and a failed write
        leaves nothing behind. An existing file is never overwritten: a second result with
        the same name, tag and second gets a ``-2``, ``-3``, ... suffix.

        Returns:
            The path of the written file.
        """
        text = self.to_json()  # serialise first: an unserialisable result writes nothing
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / self.filename()
        counter = 2
        while target.exists():
            target = directory / f"{Path(self.filename()).stem}-{counter}.json"
            counter += 1
        write_atomically(target, text)
        return target

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchmarkResult:
        """Builds a result from :meth:`to_dict` output; unknown keys are ignored.

        Raises:
            ValueError: when ``data`` is not a mapping with a ``name``.
        """
        if not isinstance(data, Mapping) or not isinstance(data.get("name"), str):
            raise ValueError("data: expected a benchmark result object with a 'name'")
        known = {field.name for field in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BenchmarkResult:
        """Reads a result written by :meth:`save`.

        Raises:
            OSError: when the file cannot be read.
            ValueError: when it is not a benchmark result (bad JSON included).
        """
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        return cls.from_dict(data)


# --------------------------------------------------------------------------- timing


def time_call(fn: Callable[[], Any], clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds one call of ``fn()`` takes (``fn`` must block until its work is done)."""
    start = clock()
    fn()
    return clock() - start


def time_best(
    fn: Callable[[], Any],
    repeats: int,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, list[float]]:
    """Times ``repeats`` calls of ``fn()`` after ``warmup`` untimed ones.

    ``fn`` must block until its work is done (for JAX, end with
    ``jax.block_until_ready``), otherwise only the dispatch is timed. The best (smallest)
    time is the least disturbed by other work on the machine.

    Args:
        fn: the work to time, called with no arguments.
        repeats: number of timed calls, at least 1.
        warmup: number of untimed calls first (compilation, caches).
        clock: the time source, in seconds.

    Returns:
        ``(best_seconds, all_seconds)``.

    Raises:
        ValueError: when ``repeats < 1`` or ``warmup < 0``.
    """
    if repeats < 1:
        raise ValueError(f"repeats: expected at least 1, got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup: expected at least 0, got {warmup}")
    for _ in range(warmup):
        fn()
    times = [time_call(fn, clock) for _ in range(repeats)]
    return min(times), times


def rate(count: float, seconds: float | None) -> float | None:
    """``count / seconds``, or None when ``seconds`` is missing or not positive."""
    if seconds is None or not seconds > 0:
        return None
    return count / seconds


def ratio(value: float | None, reference: float | None) -> float | None:
    """``value / reference``, or None when either is missing or ``reference`` is not
    positive."""
    if value is None or reference is None or not reference > 0:
        return None
    return value / reference


def mean_confidence_interval(values: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """Mean of ``values`` with the half-width of a Student-t confidence interval."""
    import numpy as np
    from scipy import stats

    data = np.asarray(values, np.float64)
    mean = float(data.mean())
    if data.size < 2:
        return {"mean": mean, "ci": None, "n": int(data.size)}
    half = stats.t.ppf(0.5 + level / 2, data.size - 1) * data.std(ddof=1) / np.sqrt(data.size)
    return {"mean": mean, "ci": float(half), "n": int(data.size)}


# --------------------------------------------------------------------------- formatting


def format_number(value: Any, digits: int = 3) -> str:
    """Human-readable number: ``2850833.3`` -> ``2.85M``, ``222029.2`` -> ``222k``,
    ``14428.8`` -> ``14,429``, ``0.0123`` -> ``0.0123``.

    Booleans print as ``yes``/``no``, None as ``-``, other values with ``str``.
    """
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) and abs(value) < 100_000:
        return str(value)
    if not isinstance(value, int | float):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    magnitude = abs(value)
    for threshold, scale, suffix in ((1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e5, 1e3, "k")):
        if magnitude >= threshold:
            return f"{value / scale:.{digits}g}{suffix}"
    if magnitude >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


@dataclasses.dataclass
class Table:
    """A titled table of values for printing; cells are formatted by :func:`format_number`.

    Attributes:
        title: printed above the table.
        columns: column headings.
        rows: one list of cells per row, as many as ``columns``.
        caption: printed below the table (notes, units).
        wrap: headings of the columns that may wrap (free text); the others never do.
    """

    title: str
    columns: list[str]
    rows: list[list[Any]]
    caption: str = ""
    wrap: tuple[str, ...] = ("description",)


def render_tables(tables: list[Table], file: Any = None) -> None:
    """Prints tables with ``rich`` when it is installed, else as aligned plain text.

    Args:
        tables: what to print, in order.
        file: a text stream; standard output by default.
    """
    stream = file if file is not None else sys.stdout
    try:
        from rich.console import Console
        from rich.table import Table as RichTable
    except ImportError:  # pragma: no cover - rich is a dependency of the package
        _render_plain(tables, stream)
        return
    console = Console(file=stream)
    if not console.is_terminal:  # files and pipes: wide enough for the comparison tables
        console = Console(file=stream, width=160)
    for table in tables:
        rich_table = RichTable(title=table.title, caption=table.caption or None)
        for index, column in enumerate(table.columns):
            text = all(
                row[index] is None or isinstance(row[index], str)
                for row in table.rows
                if index < len(row)
            )
            rich_table.add_column(
                column,
                justify="left" if text or column in table.wrap else "right",
                no_wrap=column not in table.wrap,
            )
        for row in table.rows:
            rich_table.add_row(*(format_number(cell) for cell in row))
        console.print(rich_table)


def _render_plain(tables: list[Table], stream: Any) -> None:
    for table in tables:
        cells = [[format_number(cell) for cell in row] for row in table.rows]
        widths = [
            max([len(column)] + [len(row[index]) for row in cells if index < len(row)])
            for index, column in enumerate(table.columns)
        ]
        print(table.title, file=stream)
        print(
            "  ".join(c.ljust(w) for c, w in zip(table.columns, widths, strict=True)), file=stream
        )
        for row in cells:
            print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=False)), file=stream)
        if table.caption:
            print(table.caption, file=stream)
        print(file=stream)


def require_positive(parser: Any, args: Any, names: Sequence[str]) -> None:
    """``parser.error`` naming the first option of ``names`` (attributes of ``args``) that
    is below 1: ``--max-updates: expected a positive integer``."""
    for name in names:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected a positive integer")


def progress(message: str) -> None:
    """One line on standard error, so that a long run shows where it is."""
    print(f"  {message}", file=sys.stderr, flush=True)


def evaluate_targets(
    values: Mapping[str, float | None],
    targets: Mapping[str, tuple[str, float, str]],
) -> dict[str, dict[str, Any]]:
    """Each goal with its measured value and whether it was met.

    Args:
        values: measured value of each goal (None or missing when not measured).
        targets: name -> ``(comparison, threshold, what)``; comparison is one of
            ``>=``, ``>``, ``<=``, ``<``.

    Returns:
        name -> ``{"value", "comparison", "threshold", "passed", "what"}``, ``passed``
        None when the value is missing.

    Raises:
        ValueError: for an unknown comparison.
    """
    checks: dict[str, Callable[[float, float], bool]] = {
        ">=": lambda value, threshold: value >= threshold,
        ">": lambda value, threshold: value > threshold,
        "<=": lambda value, threshold: value <= threshold,
        "<": lambda value, threshold: value < threshold,
    }
    evaluated = {}
    for name, (comparison, threshold, what) in targets.items():
        if comparison not in checks:
            raise ValueError(f"{name}: unknown comparison {comparison!r}")
        value = values.get(name)
        passed = None if value is None else bool(checks[comparison](value, threshold))
        evaluated[name] = {
            "value": value,
            "comparison": comparison,
            "threshold": threshold,
            "passed": passed,
            "what": what,
        }
    return evaluated


def targets_table(targets: Mapping[str, Mapping[str, Any]], title: str = "Targets") -> Table:
    """The table of :func:`evaluate_targets`' result: each goal, its value, and whether
    it was met (``-`` when it was not measured)."""
    verdicts = {True: "yes", False: "no", None: "-"}
    return Table(
        title,
        ["target", "value", "goal", "met"],
        [
            [name, t["value"], f"{t['comparison']} {t['threshold']}", verdicts[t["passed"]]]
            for name, t in targets.items()
        ],
    )


# ----- servers on loopback (benchmarks, tests, doc scripts) -------------------------------
def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def interpreter_environment(**extra: str) -> dict[str, str]:
    """This process's environment with this interpreter's ``bin`` first on ``PATH`` (the
    servers MLflow starts, e.g. uvicorn, are found there), plus ``extra``."""
    binary = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{binary}{os.pathsep}{os.environ.get('PATH', '')}", **extra}


def wait_for_http(
    url: str, process: subprocess.Popen, timeout: float = 120.0, log: Path | None = None
) -> None:
    """Polls ``url`` until it answers 200.

    Raises:
        RuntimeError: when ``process`` exits or ``timeout`` seconds pass first; the message
            holds the end of ``log`` when given.
    """
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            tail = f":\n{log.read_text()[-4000:]}" if log is not None and log.exists() else ""
            raise RuntimeError(f"{url}: the server did not come up{tail}")
        time.sleep(0.3)


# The code's commit as the process starts (studies save their results hours later).
code_state()
