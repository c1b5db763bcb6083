"""Which finished runs would end on another final pick under the untrained model's bar on both
held-out draws pooled (``evolution.start_bar: both_draws``) than on the selection draw alone.

Offline and held-out only: it reads each run's state, its versions' meta and the row counts of their
held-out rollouts, never a test score, and applies this checkout's ``final_pick`` under both rules
(a run recorded before ``both_draws_accuracy`` existed gets it from its two draws' scores and sizes).
It also says whether the selection rule reproduces the pick each run recorded: a check that the
elite's order it applies is the one those runs ran.

    python benchmarks/start_bar_flips.py "runs/suite_ds52/*/*-s*" > benchmarks/results/start_bar_flips_ds52.txt
"""

from __future__ import annotations

import argparse
import glob
import json
import shutil
import tempfile
from pathlib import Path

from evotrainer.loop.run_versions import RunVersions
from evotrainer.loop.stages.final_pick import final_pick


def _rows(path: Path) -> int:
    return sum(1 for _ in open(path)) if path.is_file() else 0


def pooled(metrics: dict, rollouts: Path) -> dict:
    """``metrics`` with ``both_draws_accuracy`` from its two draws' scores and sizes, where both exist."""
    g, s = _rows(rollouts / "heldout.jsonl"), _rows(rollouts / "selection.jsonl")
    if g and s and "selection_accuracy" in metrics and "heldout_accuracy" in metrics:
        metrics = dict(metrics, both_draws_accuracy=(g * metrics["heldout_accuracy"] + s * metrics["selection_accuracy"])
                       / (g + s))
    return metrics


def picks(run: Path) -> dict | None:
    """(recorded pick, the pick under each rule) of one finished run; None when it is not finished or
    has no scored start."""
    state = json.loads((run / "state.json").read_text()) if (run / "state.json").is_file() else {}
    if state.get("status") not in ("finished", "stopped") or "selection_accuracy" not in (state.get("start") or {}):
        return None
    start = pooled(state["start"], run / "start" / "rollouts")
    tmp = Path(tempfile.mkdtemp(prefix="start_bar_"))
    try:
        scores = {}
        for vdir in sorted((run / "versions").iterdir()):
            meta = json.loads((vdir / "meta.json").read_text())
            meta["metrics"] = pooled(meta.get("metrics") or {}, vdir / "rollouts")
            scores[vdir.name] = meta["metrics"]
            (tmp / vdir.name).mkdir()
            (tmp / vdir.name / "meta.json").write_text(json.dumps(meta))
            if (vdir / "health.json").is_file():    # the elite's order reads adapter_stuck from it
                shutil.copy(vdir / "health.json", tmp / vdir.name / "health.json")
        versions, survivors = RunVersions(tmp), state.get("survivors") or []
        rules = {bar: final_pick(versions, survivors, start, bar) for bar in ("selection", "both_draws")}
    finally:
        shutil.rmtree(tmp)
    return {"recorded": (state.get("final") or {}).get("version"), **rules, "start": start, "scores": scores}


def _fmt(vid: str, p: dict) -> str:
    m = p["start"] if vid == "start" else p["scores"].get(vid, {})
    return f"{vid} (selection {m.get('selection_accuracy', 0):.3f}, both draws {m.get('both_draws_accuracy', 0):.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run directories or glob patterns")
    args = ap.parse_args()
    runs = sorted({Path(p) for pattern in args.runs for p in glob.glob(pattern)})
    done = 0
    flips = mismatches = 0
    for run in runs:
        p = picks(run)
        if p is None:
            continue
        done += 1
        flips += p["selection"] != p["both_draws"]
        mismatches += p["selection"] != p["recorded"]
        print(f"{'FLIP' if p['selection'] != p['both_draws'] else 'same'} {run}: recorded {p['recorded']}; "
              f"selection rule {_fmt(p['selection'], p)}; both draws {_fmt(p['both_draws'], p)}")
    print(f"{flips} of {done} finished runs pick another version under both draws; the selection rule "
          f"reproduces {done - mismatches} of {done} recorded picks")


if __name__ == "__main__":
    main()
