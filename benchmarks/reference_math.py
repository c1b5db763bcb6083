"""Held-out accuracy of SmolLM2-135M on math before and after N reference-recipe steps, over seeds.

Each seed trains a fresh LoRA branch under the reference harness (its own task sample and sampling
seed; the held-out set is fixed) and verifies the same held-out tasks greedily before and after.
Prints a per-seed table, the mean and spread of the change, and a paired bootstrap CI over tasks.

    python benchmarks/reference_math.py [--config examples/train_math.yaml] [--seeds 0,1,2] [--steps 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from evotrainer.records.scores import by_seed, task_scores
from evotrainer.records.version import VersionDir
from evotrainer.config import load_config
from evotrainer.loop.compute.train_branch import train_branch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="examples/train_math.yaml")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=None, help="override train.steps")
    ap.add_argument("--model", default=None, help="override model (e.g. tiny-random for a smoke run)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()

    rows = []
    for seed in map(int, args.seeds.split(",")):
        cfg = load_config(args.config)
        cfg.seed = seed
        cfg.run_dir = tempfile.mkdtemp(prefix=f"refmath-s{seed}-")
        if args.steps is not None:
            cfg.train.steps = args.steps
        if args.model:
            cfg.model = args.model
        t0 = time.perf_counter()
        res = train_branch(cfg)
        v = VersionDir(res.version_dir)
        before = by_seed(task_scores(v.rollouts("heldout_base")))
        after = by_seed(task_scores(v.rollouts("heldout")))
        rows.append(dict(seed=seed, before=res.heldout_before, after=res.heldout_after,
                         delta=res.heldout_after - res.heldout_before, seconds=time.perf_counter() - t0,
                         train_reward_first=res.steps[0].get("reward_mean") if res.steps else None,
                         train_reward_last=res.steps[-1].get("reward_mean") if res.steps else None,
                         dead_group_ratio_mean=statistics.fmean(s.get("dead_group_ratio", 0) for s in res.steps)
                         if res.steps else None,
                         before_scores=before, after_scores=after))
        print(f"seed {seed}: held-out {res.heldout_before:.3f} -> {res.heldout_after:.3f} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)

    deltas = [r["delta"] for r in rows]
    print(f"\nmodel {cfg.model}, {cfg.train.steps} steps × {cfg.train.prompts_per_step} prompts × "
          f"{cfg.grpo.num_generations or 'knob'} generations, {len(rows[0]['before_scores'])} held-out tasks")
    print("seed  before  after   delta  dead-groups  seconds")
    for r in rows:
        print(f"{r['seed']:>4}  {r['before']:.3f}   {r['after']:.3f}  {r['delta']:+.3f}  "
              f"{r['dead_group_ratio_mean']:.2f}         {r['seconds']:.0f}")
    mean = statistics.fmean(deltas)
    spread = statistics.stdev(deltas) if len(deltas) > 1 else 0.0
    print(f"mean before {statistics.fmean(r['before'] for r in rows):.3f}, "
          f"mean after {statistics.fmean(r['after'] for r in rows):.3f}, delta {mean:+.3f} ± {spread:.3f} (sd over seeds)")
    try:
        from evotrainer.fitness.paired_stats import decide_promotion

        # Pool seeds: each held-out task's after-vs-before change, averaged over seeds.
        child = {t: [s for r in rows for s in r["after_scores"][t]] for t in rows[0]["after_scores"]}
        parent = {t: [s for r in rows for s in r["before_scores"][t]] for t in rows[0]["before_scores"]}
        d = decide_promotion(child, parent, level=0.95)   # the 95% CI its recorded results state
        print(f"paired bootstrap over tasks: mean delta {d.mean_delta:+.3f}, "
              f"{int(d.level * 100)}% CI [{d.ci_low:+.3f}, {d.ci_high:+.3f}]")
    except ImportError:
        pass
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
