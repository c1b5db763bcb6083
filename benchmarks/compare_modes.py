"""reference vs recipe-search vs evolve at equal budget on math, several seeds.

Each (mode, seed) is a full run of the loop with the same engine, data, held-out tasks and
training-step budget. A run's result is its best valid version by held-out accuracy (selection uses
held-out, so this is the selection score; `--test` also verifies that version on the test split).
Prints a table of held-out accuracy per mode (mean ± sd over seeds), paired bootstrap CIs of each
mode against `reference` over (task, seed) pairs, and the share of wall time spent outside
generation and gradient steps.

    python benchmarks/compare_modes.py [--config examples/quickstart.yaml] [--seeds 0,1,2] [--steps 12]
    python benchmarks/compare_modes.py --model tiny-random --steps 4 --seeds 0,1   # smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from evotrainer.collect import per_task_scores
from evotrainer.config import load_config
from evotrainer.experiment import Experiment

MODES = ("reference", "recipe-search", "evolve")


def best_version(exp: Experiment):
    metas = [exp.vdir(v).meta() for v in exp.versions()]
    valid = [m for m in metas if m.status in ("kept", "promoted", "pruned", "rejected") and "heldout_accuracy" in m.metrics]
    # rejected children lost their gate but are valid; a selection that keeps only winners uses kept/promoted
    settled = [m for m in valid if m.status in ("kept", "promoted", "pruned")] or valid
    return max(settled, key=lambda m: (m.metrics["heldout_accuracy"], -m.generation))


def timing(exp: Experiment) -> dict[str, float]:
    used = exp.state.budget_used
    wall = used.get("wall_time_s", 0.0)
    core = used.get("gen_seconds", 0.0) + used.get("train_seconds", 0.0) + used.get("verify_seconds", 0.0)
    llm = used.get("propose_seconds", 0.0)
    return {"wall_s": wall, "gen_and_grad_s": core, "propose_s": llm,
            "overhead_share": max(0.0, wall - core - llm) / wall if wall else float("nan"),
            "overhead_share_incl_propose": max(0.0, wall - core) / wall if wall else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="examples/quickstart.yaml")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=12, help="training-step budget of every run")
    ap.add_argument("--model", default=None)
    ap.add_argument("--steps-per-generation", type=int, default=None)
    ap.add_argument("--eval-size", type=int, default=None, help="held-out tasks verified per version")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", default=None, help="keep run dirs here (default: a temp dir)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="compare-modes-"))
    results: dict[str, list[dict]] = {}
    for mode in args.modes.split(","):
        for seed in map(int, args.seeds.split(",")):
            cfg = load_config(args.config)
            cfg.seed, cfg.evolution.mode = seed, mode
            cfg.evolution.budget.train_steps = args.steps
            cfg.evolution.budget.wall_time_s = None
            cfg.evolution.generations = 1000  # the step budget ends every run
            cfg.evolution.user_skills = False
            if mode == "reference":
                cfg.evolution.population_size = 1
            if args.model:
                cfg.model = args.model
            if args.steps_per_generation:
                cfg.evolution.steps_per_generation = args.steps_per_generation
            if args.eval_size:
                cfg.train.eval_size = args.eval_size
            cfg.run_dir = str(root / f"{mode}-s{seed}")
            exp = Experiment(cfg)
            exp.run()
            best = best_version(exp)
            scores = per_task_scores(exp.vdir(best.id).rollouts("heldout"))
            row = {"seed": seed, "best": best.id, "heldout": best.metrics["heldout_accuracy"], "scores": scores,
                   "versions": len(exp.versions()), **timing(exp)}
            results.setdefault(mode, []).append(row)
            print(f"{mode:>13} seed {seed}: best {best.id} held-out {row['heldout']:.3f}, {row['versions']} versions, "
                  f"wall {row['wall_s']:.0f} s, overhead {row['overhead_share']:.1%}", flush=True)

    from evotrainer.fitness.paired_stats import decide_promotion

    print(f"\nequal budget: {args.steps} training steps per run; seeds {args.seeds}")
    print(f"{'mode':>13}  held-out mean ± sd   vs reference: mean Δ [90% CI]   overhead (excl. / incl. proposals)")
    ref = results.get("reference")
    for mode, rows in results.items():
        accs = [r["heldout"] for r in rows]
        sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
        ci = ""
        if ref and mode != "reference":
            # Pair (task, seed): the same held-out task under the same run seed in both modes.
            child = {f"{t}@{r['seed']}": v for r in rows for t, v in r["scores"].items()}
            parent = {f"{t}@{r['seed']}": v for r in ref for t, v in r["scores"].items()}
            d = decide_promotion(child, parent, level=0.9)
            ci = f"{d.mean_delta:+.3f} [{d.ci_low:+.3f}, {d.ci_high:+.3f}]"
        ov = statistics.fmean(r["overhead_share"] for r in rows)
        ov2 = statistics.fmean(r["overhead_share_incl_propose"] for r in rows)
        print(f"{mode:>13}  {statistics.fmean(accs):.3f} ± {sd:.3f}        {ci:<32} {ov:.1%} / {ov2:.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
