"""Screenshots of the MLflow UI on a tracked training run, with headless Chromium.

    python docs/mlflow_screenshot.py                      # trains a demo run first
    python docs/mlflow_screenshot.py --store sqlite:///mlflow.db   # the newest run there

It starts ``mlflow ui`` on the store, opens the metric page of the newest parent run and
its seed runs (evaluation return over training, one line per run) and the registered
model's page, and writes PNGs to ``docs/images/``. Needs Debian's ``chromium``
(``apt-get install chromium``); no browser is downloaded.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
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


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise SystemExit("chromium not found: install Debian's package (apt-get install chromium)")


def _train_demo(store: str, workdir: Path) -> None:
    command = [sys.executable, "-m", "neorl_industrial.cli", "run"]
    for item in [*DEMO, f"tracking.uri={store}"]:
        command += ["--set", item]
    workdir.mkdir(parents=True, exist_ok=True)
    subprocess.run(command, check=True, cwd=workdir)


def _shoot(chromium: str, url: str, out: Path, size: str) -> None:
    subprocess.run(
        [
            chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            f"--window-size={size}", "--virtual-time-budget=25000", f"--screenshot={out}", url,
        ],
        check=True,
        capture_output=True,
        timeout=180,
    )  # fmt: skip
    if not out.exists() or out.stat().st_size < 20_000:
        raise SystemExit(f"{out}: the screenshot is missing or blank")
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="an MLflow store with a tracked run (default: train one)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "images"), help="PNG directory")
    parser.add_argument("--metric", default="eval/normalized_score")
    parser.add_argument("--model", default="ib-policy")
    args = parser.parse_args(argv)
    chromium = _chromium()
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

    port = free_port()
    env = interpreter_environment()
    ui = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store,
         "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        try:
            wait_for_http(f"http://127.0.0.1:{port}/health", ui)
        except RuntimeError as error:
            raise SystemExit(f"mlflow ui did not start: {error}") from None
        query = "&".join(
            f"{key}={urllib.parse.quote(json.dumps(value))}"
            for key, value in (
                ("runs", run_ids),
                ("metric", args.metric),
                ("experiments", [experiment.experiment_id]),
                ("plot_metric_keys", [args.metric]),
            )
        )
        query += "&x_axis=step&show_point=true"
        base = f"http://127.0.0.1:{port}/#"
        _shoot(chromium, f"{base}/metric?{query}", out / "mlflow-ui-metric.png", "1800,900")
        run_page = f"{base}/experiments/{experiment.experiment_id}/runs/{parent.info.run_id}"
        _shoot(chromium, run_page, out / "mlflow-ui-run.png", "1800,1100")
        _shoot(chromium, f"{base}/models/{args.model}", out / "mlflow-ui-model.png", "1800,900")
    finally:
        ui.terminate()
        ui.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
