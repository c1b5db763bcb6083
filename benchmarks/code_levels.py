"""How many generated code tasks the base policy solves per level: greedy, first N train tasks.

Each task is asked as the code reference harness asks it, generated greedily with the base model
(a fresh LoRA branch, B=0), and graded on both its visible and its hidden tests.

    python benchmarks/code_levels.py [--levels 1,2,3] [--n 20] [--max-new-tokens 128] [--json FILE]

Measured (SmolLM2-135M, 128 tokens, seed 0, 2 shared cores, OMP_NUM_THREADS=1;
benchmarks/results/code_levels_smollm2_fixed.json): level 1 19/20 visible and hidden, level 2 6/20,
level 3 6/20, every answer fenced.
"""

from __future__ import annotations

import argparse
import json
import time

from evotrainer.domains.code.domain import CodeDomain
from evotrainer.genome.harness import Harness
from evotrainer.genome.program import HarnessProgram
from evotrainer.loop.seed import DOMAIN_HARNESSES
from evotrainer.policy.base_model import load_base_model
from evotrainer.policy.collect import prompt_fn, verify
from evotrainer.policy.lora import LoraSettings, Policy
from evotrainer.policy.rollout_engine import TransformersEngine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="1,2,3")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    model, tok = load_base_model(args.model, seed=0)
    policy = Policy(model, tok, LoraSettings())
    policy.create("base")
    engine = TransformersEngine(policy)
    out = {"setup": f"{args.model} base (fresh LoRA, B=0), greedy, max_new_tokens={args.max_new_tokens}, "
                    f"CodeDomain(difficulty=L, seed={args.seed}) first {args.n} train tasks"}
    with Harness(HarnessProgram.from_file(DOMAIN_HARNESSES["code"])) as harness:
        for level in map(int, args.levels.split(",")):
            domain = CodeDomain(difficulty=level, seed=args.seed, n_train=max(args.n, 1), n_heldout=1, n_test=1)
            tasks = domain.tasks("train")[: args.n]
            t0 = time.perf_counter()
            rollouts = verify(engine, domain, tasks, "base", args.max_new_tokens, prompt=prompt_fn(harness))
            full = [domain.verify_full(domain.task_by_id(r.task_id), r.completion) for r in rollouts]
            row = {"n": len(full), "visible_correct": sum(f["visible"]["correct"] for f in full),
                   "hidden_correct": sum(f["hidden"]["correct"] for f in full),
                   "format_ok": sum(f["format_ok"] for f in full), "truncated": sum(r.truncated for r in rollouts),
                   "seconds": round(time.perf_counter() - t0, 1)}
            out[f"level_{level}"] = row
            print(f"level {level}: visible {row['visible_correct']}/{row['n']}, hidden {row['hidden_correct']}/{row['n']}, "
                  f"fenced {row['format_ok']}/{row['n']}, truncated {row['truncated']}/{row['n']} ({row['seconds']} s)",
                  flush=True)
            domain.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
