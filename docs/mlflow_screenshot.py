"""Screenshots of the MLflow UI on a tracked training run, with headless Chromium.

    python docs/mlflow_screenshot.py                      # trains a demo run first
    python docs/mlflow_screenshot.py --store sqlite:///mlflow.db   # the newest run there

It starts ``mlflow ui`` on the store and opens the pages docs/tracking.md names, as a run
prints their links: the experiment's training runs (``#/experiments/<id>/runs``), the
newest parent run's page, the metric page of that run and its seed runs (evaluation score
over training, one line per run) and the registered model's page. It writes PNGs to
``docs/images/`` and checks that none is blank and that each page names the run and its
dataset. Needs Debian's ``chromium`` (``apt-get install chromium``); no browser is
downloaded. ``tests/integration/mlflow/test_tracking.py`` opens the same pages.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: benchmarks/ is a sibling package

from benchmarks.harness import free_port, interpreter_environment, wait_for_http  # noqa: E402

DEMO = [
    "data.trajectories=10",
    "training.updates=3000",
    "training.chunk=250",
    "evaluation.every=250",
    "evaluation.episodes=5",
    "checkpoints.every=0",
    "tracking.promote=true",
]
#: The query that opens MLflow 3's machine-learning pages (its GenAI pages otherwise).
WORKFLOW = "workflowType=machine_learning"
#: Window sizes of the pictures (wide enough for the run page's two columns beside the
#: UI's assistant panel).
SIZES = {
    "mlflow-ui-runs.png": "1800,700",
    "mlflow-ui-run.png": "1800,1100",
    "mlflow-ui-metric.png": "1800,900",
    "mlflow-ui-model.png": "1800,900",
}


def find_chromium() -> str | None:
    """The path of a Chromium (or Chrome) binary, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@contextlib.contextmanager
def mlflow_ui(store: str, log: Path | None = None, timeout: float = 300.0) -> Iterator[str]:
    """``mlflow ui`` on ``store`` (one worker, no job runner, a free port) while the block
    runs; yields its address (``http://127.0.0.1:<port>``).

    Raises:
        RuntimeError: when it does not answer within ``timeout`` seconds.
    """
    port = free_port()
    output = subprocess.DEVNULL if log is None else log.open("w")
    ui = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store,
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        # Without the job runner (the GenAI pages' judges and schedules): it sets up the
        # store's tables beside the first requests, which then fail now and then.
        env=interpreter_environment(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),
        stdout=output, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for_http(f"{base}/health", ui, timeout=timeout, log=log)
        # The first request of each kind loads its handler: served once here, the
        # browser's first page does not wait for them one after the other.
        for path in ("/", "/ajax-api/3.0/mlflow/server-info"):
            wait_for_http(f"{base}{path}", ui, timeout=timeout, log=log)
        yield base
    finally:
        ui.terminate()
        try:
            ui.wait(30)
        except subprocess.TimeoutExpired:
            ui.kill()
            ui.wait(30)
        if log is not None:
            output.close()


def browse(chromium: str, url: str, out: Path, size: str = "1400,900", attempts: int = 3) -> str:
    """Opens ``url`` in headless Chromium, writes a screenshot of it to ``out`` and returns
    the page's text as rendered (its DOM). A browser that has not finished after 75 s is
    stopped and started again (``attempts`` in all): now and then, on a loaded machine,
    headless Chromium waits for good on the first page a fresh ``mlflow ui`` serves.

    Raises:
        RuntimeError: for a screenshot that is missing or blank (one colour, or nearly),
            or a browser that never finished.
    """
    command = [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        f"--window-size={size}", "--virtual-time-budget=15000", f"--screenshot={out}",
        "--dump-dom", url,
    ]  # fmt: skip
    for _ in range(attempts):
        out.unlink(missing_ok=True)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=75)
        except subprocess.TimeoutExpired:
            continue
        share = _main_colour_share(out) if out.exists() else 1.0
        if share > 0.98:
            raise RuntimeError(
                f"{out}: the screenshot of {url} is missing or blank ({share:.1%} one "
                f"colour); chromium said: {done.stderr.strip()[-500:]}"
            )
        return done.stdout
    raise RuntimeError(f"{url}: headless Chromium did not finish in {attempts} tries of 75 s")


def _main_colour_share(png: Path) -> float:
    """The share of the picture's pixels that have its most common colour."""
    from PIL import Image

    with Image.open(png) as image:
        pixels = image.convert("RGB")
        colours = pixels.getcolors(maxcolors=pixels.width * pixels.height)
    return max(count for count, _ in colours) / (pixels.width * pixels.height)


def pages(
    base: str, experiment_id: str, run_id: str, run_ids: list[str], metric: str, model: str
) -> dict[str, str]:
    """The UI's pages the docs show, by picture name."""
    query = "&".join(
        f"{key}={urllib.parse.quote(json.dumps(value))}"
        for key, value in (
            ("runs", run_ids),
            ("metric", metric),
            ("experiments", [experiment_id]),
            ("plot_metric_keys", [metric]),
        )
    )
    runs = f"{base}/#/experiments/{experiment_id}/runs"
    return {
        "mlflow-ui-runs.png": f"{runs}?{WORKFLOW}",
        "mlflow-ui-run.png": f"{runs}/{run_id}?{WORKFLOW}",
        "mlflow-ui-metric.png": f"{base}/#/metric?{query}&x_axis=step&show_point=true&{WORKFLOW}",
        "mlflow-ui-model.png": f"{base}/#/models/{model}?{WORKFLOW}",
    }


def _train_demo(store: str, workdir: Path) -> None:
    command = [sys.executable, "-m", "neorl_industrial.cli", "run"]
    for item in [*DEMO, f"tracking.uri={store}"]:
        command += ["--set", item]
    workdir.mkdir(parents=True, exist_ok=True)
    subprocess.run(command, check=True, cwd=workdir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="an MLflow store with a tracked run (default: train one)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "images"), help="PNG directory")
    parser.add_argument("--metric", default="eval/normalized_score")
    parser.add_argument("--model", default="ib-policy")
    args = parser.parse_args(argv)
    chromium = find_chromium()
    if chromium is None:
        raise SystemExit("chromium not found: install Debian's package (apt-get install chromium)")
    scratch = Path(tempfile.mkdtemp(prefix="neorl-screenshot-"))
    store = args.store or f"sqlite:///{scratch}/mlflow.db"
    if args.store is None:
        _train_demo(store, scratch)

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=store, registry_uri=store)
    experiment = client.get_experiment_by_name("neorl-industrial")
    if experiment is None:
        raise SystemExit(f"{store}: no experiment 'neorl-industrial'; train a run first")
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"])
    parent = next(run for run in runs if "mlflow.parentRunId" not in run.data.tags)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    run_ids = [parent.info.run_id, *(r.info.run_id for r in children)]
    dataset = parent.inputs.dataset_inputs[0].dataset.name if parent.inputs.dataset_inputs else ""

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        with mlflow_ui(store) as base:
            shown = pages(
                base,
                experiment.experiment_id,
                parent.info.run_id,
                run_ids,
                args.metric,
                args.model,
            )
            for name, url in shown.items():
                text = browse(chromium, url, out / name, SIZES[name])
                if name in ("mlflow-ui-runs.png", "mlflow-ui-run.png"):
                    missing = [s for s in (parent.info.run_name, dataset) if s not in text]
                    if missing:
                        raise SystemExit(f"{url}: the page does not show {missing}")
                print(f"wrote {out / name}  ({url})")
    except RuntimeError as error:
        raise SystemExit(str(error)) from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
