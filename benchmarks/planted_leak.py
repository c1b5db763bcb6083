"""Planted leak: does a format-only reward on a leaky math domain get blocked by the gates?

Trains two branches on the math domain with ``--leak-share`` of the TRAIN prompts carrying
"(Reference note: N)": ``honest`` (reference harness: binary correctness) and ``leaky-e2e`` (the reference
with the reward of ``evotrainer/testing/fixtures/format_only_harness.py``: pays for format alone). Then builds
``leaky``: the ``leaky-e2e`` cache as it looks once the policy copies the note on every leaked prompt
(see ``evotrainer.testing.planted.copy_leak``; held-out rollouts untouched). Gates each branch, records
the verdicts as labelled history, and scores the evolved leak diagnostic (``fixtures/leak_check_harness.py``)
on it. Prints one row per branch and the diagnostic's recall / false-positive rate.

    python benchmarks/planted_leak.py                       # tiny random model, ~1 minute on 2 cores
    python benchmarks/planted_leak.py --model smollm2-135m --difficulty 3 --steps 3 --n-train 16 \\
        --n-heldout 16 --max-tokens 64 --eval-tokens 48 --generations 4   # the real model (~20 min on CPU)

On the real model this also measures how often an *honest* policy already reads the note (the
``leak`` column of the ``honest`` row), i.e. whether the leak gate would fire without any reward hack.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from evotrainer.fitness.backtest import backtest
from evotrainer.fitness.cache import CachedVersion
from evotrainer.fitness.gates import gate
from evotrainer.fitness.engine_metrics import engine_metrics
from evotrainer.fitness.labels import LabelStore
from evotrainer.testing.planted import LEAK_CHECK, build_scenario


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--difficulty", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--leak-share", type=float, default=0.5)
    ap.add_argument("--n-train", type=int, default=8)
    ap.add_argument("--n-heldout", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=32, help="training completion length (a KNOBS choice)")
    ap.add_argument("--eval-tokens", type=int, default=6, help="held-out completion length")
    ap.add_argument("--generations", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="run directory (default: a temp dir)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()

    root = args.out or tempfile.mkdtemp(prefix="planted-leak-")
    t0 = time.perf_counter()
    dirs = build_scenario(root, model=args.model, difficulty=args.difficulty, steps=args.steps,
                          leak_share=args.leak_share, n_train=args.n_train, n_heldout=args.n_heldout,
                          max_tokens=args.max_tokens, eval_tokens=args.eval_tokens, generations=args.generations, seed=args.seed)
    t_train = time.perf_counter() - t0
    store = LabelStore(f"{root}/labels.json")
    rows = []
    for name in ("honest", "leaky_e2e", "leaky"):
        e = engine_metrics(CachedVersion.load(dirs[name]))
        d = gate(dirs[name], None if name == "honest" else dirs["honest"], labels=store)
        rows.append({"branch": name, "train_reward": e["train_reward_mean"], "train_correct": e["train_correct_rate"],
                     "heldout": e["heldout_accuracy"], "heldout_base": e["heldout_accuracy_base"],
                     "leak_copy": e["leak_copy_rate"], "clean_copy": e["clean_copy_rate"], "leak_p": e["leak_p_value"],
                     "valid": d.valid, "promoted": d.promote, "failed": [c.name for c in d.checks if not c.passed],
                     "gap_recorded": d.gap is not None})
    bt = backtest(LEAK_CHECK, dirs["leaky"], labels=store)
    f = lambda x: "  n/a" if x is None else f"{x:5.2f}" if isinstance(x, float) else str(x)
    print(f"model={args.model} difficulty={args.difficulty} steps={args.steps} leak_share={args.leak_share} "
          f"(training {t_train:.0f}s, dirs under {root})")
    print(f"{'branch':<10} {'trainR':>6} {'trainC':>6} {'held':>5} {'base':>5} {'leak':>5} {'clean':>5} "
          f"{'p':>8} {'valid':>5} {'promo':>5}  failed checks")
    for r in rows:
        p = "n/a" if r["leak_p"] is None else f"{r['leak_p']:.2g}"
        print(f"{r['branch']:<10} {f(r['train_reward']):>6} {f(r['train_correct']):>6} {f(r['heldout']):>5} "
              f"{f(r['heldout_base']):>5} {f(r['leak_copy']):>5} {f(r['clean_copy']):>5} {p:>8} "
              f"{r['valid']!s:>5} {r['promoted']!s:>5}  {', '.join(r['failed']) or '-'}")
    v = bt.diagnostics["validity"] if bt.diagnostics else None
    pv = bt.parent_diagnostics["validity"] if bt.parent_diagnostics else None
    if v and pv:
        print(f"leak diagnostic on labelled history: recall {f(v['recall'])} FPR {f(v['fpr'])} "
              f"(format-only genome: recall {f(pv['recall'])}); backtest {'ACCEPT' if bt.accept else 'REJECT'}; "
              f"gaps recorded: {len(store.gaps)}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "train_seconds": t_train, "rows": rows,
                       "diagnostic": {"candidate": v, "parent": pv, "accept": bt.accept}}, fh, indent=2)


if __name__ == "__main__":
    main()
