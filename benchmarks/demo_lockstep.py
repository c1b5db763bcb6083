"""`make demo`'s wall time with the population's rollouts in one batch and one version at a time, side by side.

`make demo` is ``evotrainer run examples/quickstart.yaml``. Each arm runs exactly that config in its own
process, into its own run directory, with one change: the wall-time budget is raised (``--wall-budget``)
so that neither arm is cut short and both do the same work. ``together`` is the loop as shipped (the
live versions' groups sampled in one ``generate_many`` call per step, their held-out draws in one
verification batch); ``alone`` is the same loop with ``collect.shares_batches`` answering no, so every
version samples and verifies with its own engine calls, one after another (the loop before issue 48).
Prints both wall times, their ratio, where the time went, and whether the two runs reached the same
versions, statuses and held-out scores (same seed: they should, see docs/concepts/limits.md).

    python benchmarks/demo_lockstep.py --json benchmarks/results/demo_lockstep_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "quickstart.yaml"
ARMS = ("together", "alone")

# The child process: the CLI's `run`, with batching switched off for the `alone` arm. The executor
# and the training stage import ``shares_batches`` by name, so each module's own binding is replaced.
CHILD = """
import sys
arm, config, run_dir = sys.argv[1:4]
if arm == "alone":
    import evotrainer.loop.compute.executor as executor
    import evotrainer.loop.stages.training as training
    import evotrainer.policy.collect as collect
    for module in (executor, training, collect):
        module.shares_batches = lambda engine, domain, versions: False
import logging
trace = logging.getLogger("evotrainer.policy.rollout_engine.batches")   # one line per shared sampling batch
trace.setLevel(logging.DEBUG)
trace.addHandler(logging.FileHandler(run_dir + ".batches.log"))
trace.propagate = False
from evotrainer.cli.app import main
sys.exit(main(["run", config, "--run-dir", run_dir]))
"""


def outcome(run_dir: Path) -> dict:
    """What a run reached: every version's status and held-out scores, the final pick, the budget spent."""
    state = json.loads((run_dir / "state.json").read_text())
    versions = {}
    for meta in sorted((run_dir / "versions").glob("*/meta.json")):
        m = json.loads(meta.read_text())
        versions[m["id"]] = {"status": m["status"], "factor": m.get("factor"),
                             "heldout_accuracy": (m.get("metrics") or {}).get("heldout_accuracy"),
                             "selection_accuracy": (m.get("metrics") or {}).get("selection_accuracy")}
    return {"versions": versions, "final": state.get("final"), "budget_used": state.get("budget_used"),
            "status": state.get("status"), "stop_reason": state.get("stop_reason")}


BATCH = re.compile(r"^(batch|alone \(no KV decoder\)): (\d+) jobs, (\d+) rows, (.*), ([\d.]+) s$")


def batches(log: Path) -> dict:
    """The together arm's sampling calls by how many versions' jobs shared each batch, and by settings:
    where the population's sampling did and did not share (the alone arm samples outside
    ``generate_many`` and writes no lines)."""
    by_jobs: dict[str, dict] = {}
    by_settings: dict[str, dict] = {}
    for line in log.read_text().splitlines() if log.is_file() else []:
        m = BATCH.match(line)
        if not m:
            continue
        jobs, rows, settings, seconds = int(m[2]), int(m[3]), m[4], float(m[5])
        key = f"{jobs} jobs" + ("" if m[1] == "batch" else " (no KV decoder)")
        for table, k in ((by_jobs, key), (by_settings, settings)):
            row = table.setdefault(k, {"calls": 0, "rows": 0, "seconds": 0.0})
            row["calls"] += 1
            row["rows"] += rows
            row["seconds"] += seconds
    return {"by_jobs": dict(sorted(by_jobs.items())), "by_settings": by_settings}


def run_arm(arm: str, config: Path, run_dir: Path) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, arm, str(config), str(run_dir)], cwd=ROOT,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"the {arm} arm failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    row = {"arm": arm, "wall_s": wall, **outcome(run_dir)}
    if arm == "together":
        row["batches"] = batches(Path(str(run_dir) + ".batches.log"))
    return row


def same(a: dict, b: dict) -> dict:
    """Where two arms' runs agree: the version ids, their statuses and held-out scores, the final pick."""
    va, vb = a["versions"], b["versions"]
    return {"versions": sorted(va) == sorted(vb),
            "statuses": {k: v["status"] for k, v in va.items()} == {k: v["status"] for k, v in vb.items()},
            "heldout_scores": {k: v["heldout_accuracy"] for k, v in va.items()}
            == {k: v["heldout_accuracy"] for k, v in vb.items()},
            "final": (a["final"] or {}).get("version") == (b["final"] or {}).get("version")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wall-budget", type=float, default=7200.0,
                    help="evolution.budget.wall_time_s of both arms (the demo's 1800 would cut the slower arm short)")
    ap.add_argument("--out", default=None, help="where the two run directories go (default: a temporary folder)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--model", default=None, help="smoke runs only: another model (tiny-random)")
    ap.add_argument("--generations", type=int, default=None, help="smoke runs only: fewer generations")
    ap.add_argument("--arms", default=",".join(ARMS),
                    help="'together' alone: only where the shipped loop's sampling batches did and did not share")
    args = ap.parse_args()
    if not set(args.arms.split(",")) <= set(ARMS):
        ap.error(f"--arms takes {' and/or '.join(ARMS)}, comma-separated; got {args.arms!r}")
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["evolution"]["budget"]["wall_time_s"] = args.wall_budget
    if args.model:
        cfg["model"] = cfg["evolution"]["llm"]["model"] = args.model
    if args.generations:
        cfg["evolution"]["generations"] = args.generations
    out = Path(args.out or tempfile.mkdtemp(prefix="demo_lockstep_"))
    out.mkdir(parents=True, exist_ok=True)
    config = out / "quickstart.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    rows = {}
    for arm in args.arms.split(","):
        print(f"{arm}: evotrainer run examples/quickstart.yaml (wall budget {args.wall_budget:g} s) ...", flush=True)
        rows[arm] = run_arm(arm, config, out / arm)
        used = rows[arm]["budget_used"]
        print(f"{arm}: {rows[arm]['wall_s']:.0f} s, {used['train_steps']} train steps, "
              f"{len(rows[arm]['versions'])} versions, final {(rows[arm]['final'] or {}).get('version')}", flush=True)
    for key, b in rows.get("together", {}).get("batches", {}).get("by_jobs", {}).items():
        print(f"together, batches of {key}: {b['calls']} calls, {b['rows']} rows, {b['seconds']:.0f} s", flush=True)
    ratio = agree = None
    if "alone" in rows and "together" in rows:
        ratio = rows["alone"]["wall_s"] / rows["together"]["wall_s"]
        agree = same(rows["together"], rows["alone"])
        print(f"make demo: {rows['together']['wall_s']:.0f} s in one batch, {rows['alone']['wall_s']:.0f} s one "
              f"version at a time: {ratio:.2f}x; the runs agree on {', '.join(k for k, v in agree.items() if v) or 'nothing'}"
              + (f", differ in {', '.join(k for k, v in agree.items() if not v)}" if not all(agree.values()) else ""))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "config": "examples/quickstart.yaml", "wall_budget_s": args.wall_budget, "model": cfg["model"],
            "generations": cfg["evolution"]["generations"], "arms": rows,
            "alone_over_together": ratio, "agree": agree,
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "default")},
            "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                     text=True).stdout.strip()}, indent=1))


if __name__ == "__main__":
    main()
