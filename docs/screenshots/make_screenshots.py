"""Make the screenshots of docs/mlflow.md from real runs: two loops, one MLflow UI, headless Chromium.

1. runs the loop twice on the tiny random model (``evolve`` and ``reference``, same data and budget)
   through the CLI, each into its own run directory with its own ``mlflow.db``;
2. records both genealogies into one shared tracking store (``LineageTracker(..., tracking_uri=)``),
   so one ``mlflow ui`` shows them side by side;
3. starts ``mlflow ui`` on a free loopback port, takes Chromium screenshots of the views the doc walks
   through, and stops the server (its whole process group).

    PYTHONPATH=$PWD .venv/bin/python docs/screenshots/make_screenshots.py [--workdir DIR] [--keep]

Needs ``chromium`` on PATH (Debian: ``apt-get install chromium``). Only localhost is contacted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

import yaml

HERE = Path(__file__).resolve().parent
MLFLOW = Path(sys.executable).parent / "mlflow"
MAX_BYTES = 300_000
SORT = "metrics.`heldout_accuracy`"


def config(run_dir: Path, mode: str) -> dict:
    # tests/loop_runs.py::tiny_cfg, with one more generation so the genealogy has some depth
    return {
        "model": "tiny-random", "run_dir": str(run_dir), "seed": 0,
        "domain": {"difficulty": 2, "n_train": 16, "n_heldout": 6, "n_test": 4},
        "grpo": {"max_completion_length": 32, "num_generations": 2},
        "train": {"prompts_per_step": 2, "eval_max_new_tokens": 6},
        "evolution": {"mode": mode, "population_size": 2, "children_per_generation": 2, "generations": 3,
                      "steps_per_generation": 1, "user_skills": False,
                      **({"operators": {"knobs": 1.0, "crossover": 1.0}} if mode == "evolve" else {})},
    }


def run_loop(work: Path, mode: str) -> Path:
    run_dir = work / mode
    if (run_dir / "state.json").is_file():
        return run_dir                           # --workdir reused: the run is there already
    cfg = work / f"{mode}.yaml"
    cfg.write_text(yaml.safe_dump(config(run_dir, mode)))
    subprocess.run([sys.executable, "-m", "evotrainer.cli", "run", str(cfg)], check=True)
    return run_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ui(db: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen([str(MLFLOW), "ui", "--backend-store-uri", f"sqlite:///{db}", "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"], stdout=log.open("w"),
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2):
                return proc, base
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop(proc)
                raise SystemExit(f"mlflow ui did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.5)


def stop(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):     # the server forks workers: end its process group
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=15)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def shoot(url: str, out: Path, size: str = "1800,1000") -> None:
    profile = tempfile.mkdtemp(prefix="chromium-")
    try:
        subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                        f"--window-size={size}", "--virtual-time-budget=15000", "--hide-scrollbars",
                        f"--screenshot={out}", url], check=True, capture_output=True, timeout=180)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    if out.stat().st_size > MAX_BYTES:               # keep the repository small: fewer colours, same picture
        from PIL import Image

        Image.open(out).convert("P", palette=Image.Palette.ADAPTIVE, colors=128).save(out, optimize=True)
    print(f"{out.name}: {out.stat().st_size // 1024} KB  <- {url}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", help="where the runs go (default: a temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    from evotrainer.tracking.lineage import LineageTracker
    from evotrainer.tracking.plots import load_versions
    from evotrainer.tracking.view import ui_url

    work = Path(args.workdir or tempfile.mkdtemp(prefix="evotrainer-shots-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    runs = [run_loop(work, mode) for mode in ("evolve", "reference")]
    shared = work / "compare.db"
    trackers = []
    for run_dir in runs:
        t = LineageTracker(run_dir, tracking_uri=f"sqlite:///{shared}")
        t.record_all()
        t.log_plots()
        trackers.append(t)
    evolve, reference = trackers
    proc, base = start_ui(shared, work / "ui.log")
    try:
        exp = evolve.experiment_id
        summary = evolve._find("evotrainer.summary", "true")
        child = next(evolve.run_id(v.id) for v in load_versions(runs[0]) if v.operator)   # a mutated child
        ml = "workflowType=machine_learning"
        both = quote(json.dumps([exp, reference.experiment_id], separators=(",", ":")))
        last = quote("tags.`evotrainer.generation` = '2'")
        shots = {
            "01-runs-table.png": ui_url(exp, base),
            "02-genai-overview.png": f"{base}/#/experiments/{exp}",     # what a bare URL opens in MLflow 3
            "03-child-run.png": f"{base}/#/experiments/{exp}/runs/{child}?{ml}",
            "04-genealogy-artifact.png": f"{base}/#/experiments/{exp}/runs/{summary}/artifacts/genealogy.png?{ml}",
            "05-compare-experiments.png": f"{base}/#/compare-experiments/s?experiments={both}&searchFilter={last}"
                                          f"&orderByKey={quote(SORT)}&orderByAsc=false&{ml}",
        }
        for name, url in shots.items():     # the tables are wide: room for every lineage column
            shoot(url, HERE / name, "2400,1000" if name.startswith(("01", "05")) else "1800,1000")
    finally:
        stop(proc)
        if not args.workdir and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"runs and shared store kept in {work}")


if __name__ == "__main__":
    main()
