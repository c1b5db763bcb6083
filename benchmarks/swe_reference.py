"""SWE resolution rate of a model before and after N reference-harness GRPO steps, with the cost per episode.

Trains one fresh LoRA branch per seed under the reference SWE harness (reward 1 when the patch
resolves the issue: every FAIL_TO_PASS and PASS_TO_PASS test passes in a clean copy) on multi-turn
tool episodes, and runs the same held-out issues before and after (held-out episodes are sampled at
the train temperature of the engine's verify pass). Prints, side by side for before and after:
resolution rate, turns per episode, tool calls and their failure rate, generated tokens and seconds
per episode, and the training steps' reward and cost.

    python benchmarks/swe_reference.py [--config examples/evolve_swe.yaml] [--seeds 0] [--steps 2]
        [--prompts 2] [--generations 2] [--heldout 4] [--max-turns 4] [--turn-tokens 128]
        [--model smollm2-135m] [--json benchmarks/results/swe_reference_cpu.json]

The config's ``evolution`` section is ignored: this is ``evotrainer train`` (one branch, the seed harness).

Measured on 2 shared CPU cores (load average ~5), ``--steps 1 --prompts 1 --generations 2 --heldout 2
--max-turns 2 --turn-tokens 64`` (benchmarks/results/swe_reference_cpu.{txt,json}, 484 s): resolution
0.000 -> 0.000; every episode ended at the config's 120 s episode wall time after 1 turn of 64
tokens holding no well-formed tool call (tool-call failure rate 1.0), 67 s per held-out episode
before and 92 s after (generation under load). Steps 2 with 3 turns of 96-128 tokens did not finish
in 11 minutes on this machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

from evotrainer.config import load_config
from evotrainer.loop.compute.train_branch import train_branch
from evotrainer.records.version import VersionDir


def _config(args, seed: int):
    cfg = load_config(args.config)
    cfg.seed = seed
    cfg.run_dir = tempfile.mkdtemp(prefix=f"refswe-s{seed}-")
    cfg.train.steps = args.steps
    cfg.train.prompts_per_step = args.prompts
    cfg.grpo.num_generations = args.generations
    cfg.domain.n_heldout = args.heldout
    cfg.domain.episode.max_turns = args.max_turns
    cfg.domain.episode.max_turn_tokens = args.turn_tokens
    cfg.train.eval_max_new_tokens = args.turn_tokens   # grpo.max_completion_length (a knob) caps it too
    if args.model:
        cfg.model = args.model
    return cfg


def cost(rollouts) -> dict:
    """Per-episode means: resolution (hidden grade), turns, tool calls, failed calls, tokens, seconds."""
    calls = sum(len(r.tool_calls) for r in rollouts)
    failed = sum(1 for r in rollouts for c in r.tool_calls if c.get("error"))
    return {"episodes": len(rollouts),
            "resolved": statistics.fmean(bool(r.hidden.get("resolved")) for r in rollouts),
            "submitted": statistics.fmean(bool(r.episode.get("submitted")) for r in rollouts),
            "edited": statistics.fmean(bool(r.episode.get("patch")) for r in rollouts),
            "turns": statistics.fmean(r.turns for r in rollouts),
            "tool_calls": calls / len(rollouts),
            "tool_failure_rate": failed / calls if calls else 0.0,
            "tokens": statistics.fmean(r.num_tokens for r in rollouts),
            "seconds": statistics.fmean(r.gen_seconds for r in rollouts),   # generation
            "wall_seconds": statistics.fmean(float(r.episode.get("seconds") or 0.0) for r in rollouts),
            "stop_reasons": {s: sum(r.stop_reason == s for r in rollouts) for s in sorted({r.stop_reason for r in rollouts})}}


def _row(seed: int, res, seconds: float) -> dict:
    v = VersionDir(res.version_dir)
    train = v.rollouts("train")
    steps = res.steps
    return dict(seed=seed, before=cost(v.rollouts("heldout_base")), after=cost(v.rollouts("heldout")),
                train=cost([r for r in train]) | {"resolved": statistics.fmean(bool(r.visible.get("resolved"))
                                                                             for r in train)},
                train_reward_mean=statistics.fmean(s.get("reward_mean", 0.0) for s in steps) if steps else None,
                dead_group_ratio_mean=statistics.fmean(s.get("dead_group_ratio", 0) for s in steps) if steps else None,
                seconds=seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="examples/evolve_swe.yaml")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--generations", type=int, default=2)
    ap.add_argument("--heldout", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--turn-tokens", type=int, default=128, help="tokens per assistant turn (train and held-out)")
    ap.add_argument("--model", default=None, help="override model (e.g. tiny-random for a smoke run)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args()

    rows, t_all = [], time.perf_counter()
    for seed in map(int, args.seeds.split(",")):
        cfg = _config(args, seed)
        t0 = time.perf_counter()
        res = train_branch(cfg)
        rows.append(_row(seed, res, time.perf_counter() - t0))
        print(f"seed {seed}: held-out resolution {res.heldout_before:.3f} -> {res.heldout_after:.3f} "
              f"({rows[-1]['seconds']:.0f} s)", flush=True)
        _save(args, cfg, rows)   # after every seed, so a run cut short keeps what it measured

    d = cfg.domain
    print(f"\nmodel {cfg.model}, swe level {d.difficulty}, {args.steps} reference steps × {args.prompts} issues × "
          f"{args.generations} episodes, {args.heldout} held-out issues, ≤ {args.max_turns} turns × "
          f"{args.turn_tokens} tokens, torch threads {torch.get_num_threads()}")
    keys = ("resolved", "submitted", "edited", "turns", "tool_calls", "tool_failure_rate", "tokens", "seconds",
            "wall_seconds")
    for r in rows:
        print(f"seed {r['seed']} (per held-out episode)   before    after   | train episodes")
        for k in keys:
            print(f"  {k:<24} {r['before'][k]:>8.3f} {r['after'][k]:>8.3f}   | {r['train'][k]:>8.3f}")
        print(f"  stop reasons: before {r['before']['stop_reasons']}, after {r['after']['stop_reasons']}")
        print(f"  train reward mean {r['train_reward_mean']:.3f}, dead groups {r['dead_group_ratio_mean']:.2f}, "
              f"{r['seconds']:.0f} s in all")
    print(f"total {time.perf_counter() - t_all:.0f} s")


def _save(args, cfg, rows: list[dict]) -> None:
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": cfg.model, "args": vars(args), "torch_threads": torch.get_num_threads(),
                       "seeds": rows}, f, indent=2)


if __name__ == "__main__":
    main()
