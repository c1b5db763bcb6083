"""Which finished runs would end on another final pick under the untrained model's bar on both
held-out draws pooled (``evolution.start_bar: both_draws``) than on the selection draw alone.

Offline and held-out only: it reads each run's state, its versions' meta and the row counts of their
held-out rollouts, never a test score, and applies this checkout's ``final_pick`` under both rules
(a run recorded before ``both_draws_accuracy`` existed gets it from its two draws' scores and sizes).
It also says whether the selection rule reproduces the pick each run recorded: a check that the
elite's order it applies is the one those runs ran.

    python benchmarks/start_bar_flips.py "runs/suite_ds52/*/*-s*" > benchmarks/results/start_bar_flips_ds52.txt

With ``--verify OUT.json`` (a run written after a rule change, on a fresh draw), each run whose pick
another rule changes also has that other rule's pick verified on the test split, as the run verified
its own: the paired test measure of the rule at the cost of a few verifications. OUT gains one row per
such run (it resumes: a run already in it is not verified again); run directories are only read.
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
from evotrainer.loop.stages.selection import START_BARS


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
        rules = {bar: final_pick(versions, survivors, start, bar) for bar in START_BARS}
    finally:
        shutil.rmtree(tmp)
    final = state.get("final") or {}
    applied = "both_draws" if final.get("bar") == "both held-out draws" else "selection"
    return {"recorded": final.get("version"), "applied": applied, **rules, "start": start, "scores": scores}



def test_rollouts(run: Path, vid: str) -> tuple:
    """(the run as a read-only experiment, ``vid``'s rollouts on the test split) through the run's own
    verification path: the untrained model's stored test rollouts, or the version asked on the test
    split under its own harness, greedy."""
    from evotrainer.loop.experiment import Experiment
    from evotrainer.loop.stages.final_pick import rollouts_on_test
    from evotrainer.loop.stages.start import start_dir

    exp = Experiment.resume(run, readonly=True)       # reads the run; nothing in it is written
    if vid == "start":
        rollouts, error = start_dir(exp).rollouts("test"), None
    else:
        rollouts, error = rollouts_on_test(exp.runtime, exp.vdir(vid), vid, exp.runtime.test_tasks, exp.cfg.sandbox,
                                           exp.cfg.train.eval_max_new_tokens)
    if error is not None or not rollouts:
        raise SystemExit(f"{run}: {vid} could not be verified on the test split ({error or 'no stored rollouts'})")
    return exp, rollouts


def verify_other(run: Path, p: dict) -> dict:
    """The test score of the pick the rule this run did not apply would have made (the run's own
    pick's is its final record)."""
    from evotrainer.records.scores import heldout_accuracy

    other = next(r for r in START_BARS if r != p["applied"])
    exp, rollouts = test_rollouts(run, p[other])
    final = exp.state.final or {}
    return {"run": str(run), "applied": p["applied"], "pick": p["recorded"], "pick_test": final.get("test_accuracy"),
            "other_rule": other, "other_pick": p[other], "other_test": heldout_accuracy(rollouts),
            "test_tasks": len(exp.runtime.test_tasks), "untrained_test": final.get("start_test_accuracy")}


def _fmt(vid: str, p: dict) -> str:
    m = p["start"] if vid == "start" else p["scores"].get(vid, {})
    return f"{vid} (selection {m.get('selection_accuracy', 0):.3f}, both draws {m.get('both_draws_accuracy', 0):.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run directories or glob patterns")
    ap.add_argument("--verify", type=Path, default=None, metavar="OUT.json",
                    help="verify, on the test split, the other rule's pick of each run whose pick it changes")
    args = ap.parse_args()
    runs = sorted({Path(p) for pattern in args.runs for p in glob.glob(pattern)})
    verified = json.loads(args.verify.read_text()) if args.verify and args.verify.is_file() else []
    done = 0
    flips = mismatches = 0
    for run in runs:
        p = picks(run)
        if p is None:
            continue
        done += 1
        flip = p["selection"] != p["both_draws"]
        flips += flip
        mismatches += p[p["applied"]] != p["recorded"]
        print(f"{'FLIP' if flip else 'same'} {run}: recorded {p['recorded']} (bar: {p['applied']}); "
              f"selection rule {_fmt(p['selection'], p)}; both draws {_fmt(p['both_draws'], p)}", flush=True)
        if flip and args.verify and str(run) not in {v["run"] for v in verified}:
            verified.append(row := verify_other(run, p))
            args.verify.write_text(json.dumps(verified, indent=1))     # after each: a stopped check resumes
            print(f"  test: {row['applied']} pick {row['pick']} {row['pick_test']:.3f}; {row['other_rule']} pick "
                  f"{row['other_pick']} {row['other_test']:.3f}", flush=True)
    print(f"{flips} of {done} finished runs pick another version under both draws; the rule each run applied "
          f"reproduces {done - mismatches} of {done} recorded picks")


if __name__ == "__main__":
    main()
