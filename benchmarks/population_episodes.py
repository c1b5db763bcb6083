"""A population's SWE episodes, one version at a time against in lockstep, side by side in one run.

K branch adapters (random non-zero B, as a few training steps would leave them) each run one training
step's episodes on SWE level 1 (``--tasks`` issues × ``--group`` episodes, ``examples/evolve_swe.yaml``'s
turn limits): ``alone`` collects each branch's episodes with its own engine calls, one branch after
another (the loop before issue 48's episodic lockstep); ``together`` collects all of them with
``collect_many``, each turn of every branch's episodes in one ``generate_ids_many`` call. Prints the
sampled tokens/s of each and their ratio; ``--repeats`` alternates the two and reports medians.

    python benchmarks/population_episodes.py                          # embedded SmolLM2-135M, 4 branches
    python benchmarks/population_episodes.py --model tiny-random --tasks 1 --max-turns 2 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from evotrainer.domains.code.executor import ExecLimits  # noqa: E402
from evotrainer.domains.swe.domain import SWEDomain  # noqa: E402
from evotrainer.domains.swe.environment import EnvLimits  # noqa: E402
from evotrainer.policy.base_model import load_base_model  # noqa: E402
from evotrainer.policy.collect import CollectJob, collect_many, default_prompt  # noqa: E402
from evotrainer.policy.lora import LoraSettings, Policy  # noqa: E402
from evotrainer.policy.rollout_engine import SamplingParams, TransformersEngine  # noqa: E402
from population_rollouts import add_branches  # noqa: E402


def sampled_tokens(rollouts) -> int:
    return sum(r.num_tokens for r in rollouts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--branches", type=int, default=4)
    ap.add_argument("--tasks", type=int, default=2, help="issues per branch (one step's prompts_per_step)")
    ap.add_argument("--group", type=int, default=2, help="episodes per issue (num_generations)")
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--turn-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch_threads = os.environ.get("OMP_NUM_THREADS", "default")
    limits = EnvLimits(max_turns=args.max_turns, max_turn_tokens=args.turn_tokens, max_context_tokens=4096)
    domain = SWEDomain(n_train=args.tasks, n_heldout=1, n_test=1, difficulty=1, seed=0, workers=1,
                       limits=ExecLimits(timeout_s=10.0), episode_limits=limits)
    model, tok = load_base_model(args.model)
    policy = Policy(model, tok, LoraSettings(r=16, lora_alpha=32))
    names = add_branches(policy, args.branches, seed=0)
    engine = TransformersEngine(policy, decoder="kv")
    tasks = domain.tasks("train")[:args.tasks]
    jobs = [CollectJob(tasks, args.group, SamplingParams(temperature=1.0, max_new_tokens=args.turn_tokens, seed=b),
                       name, default_prompt, 0) for b, name in enumerate(names)]
    collect_many(engine, domain, jobs[:1])   # warm-up: the KV decoder's packed weights, the first compile
    runs: dict[str, list[dict]] = {"alone": [], "together": []}
    for r in range(args.repeats):
        for path in ("alone", "together") if r % 2 == 0 else ("together", "alone"):
            t0 = time.perf_counter()
            out = ([collect_many(engine, domain, [j])[0] for j in jobs] if path == "alone"
                   else collect_many(engine, domain, jobs))
            seconds = time.perf_counter() - t0
            n = sum(sampled_tokens(o) for o in out)
            runs[path].append({"seconds": seconds, "sampled_tokens": n, "tokens_per_s": n / seconds,
                               "turns": sum(x.turns for o in out for x in o)})
            print(f"repeat {r} {path:<8} {n:>6} sampled tokens in {seconds:6.1f} s: {n / seconds:7.1f} tok/s", flush=True)
    domain.close()
    med = {p: statistics.median(x["tokens_per_s"] for x in v) for p, v in runs.items()}
    ratio = med["together"] / med["alone"]
    print(f"\nmedian over {args.repeats}: alone {med['alone']:.1f} tok/s, together {med['together']:.1f} tok/s "
          f"({ratio:.2f}x), {args.branches} branches x {args.tasks} issues x {args.group} episodes, "
          f"up to {args.max_turns} turns of {args.turn_tokens} tokens, OMP_NUM_THREADS={torch_threads}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs, "median_tokens_per_s": med,
                                               "ratio": ratio, "omp_num_threads": torch_threads}, indent=1) + "\n")


if __name__ == "__main__":
    main()
