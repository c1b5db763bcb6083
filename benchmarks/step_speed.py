"""Where a training step's time goes: today's path and the fast one, side by side in one process.

Today's path is ``TransformersEngine(decoder="generate")`` (transformers' ``generate`` with the
peft model), ``GRPOTrainer(shared_prompts=False)`` (every row's prompt and completion run whole,
TRL's way) and ``Policy(packed=False)`` (the default CPU matmul); the fast one is the KV decoder
(``policy/kv_decoder.py``, ``kv_sampler.py``), the trainer's shared prompts (``policy/logps.py``) and
packed frozen weights (``policy/packed_linear.py``). Each path has its own copy of the model, with the
same LoRA adapter (trained-looking: B is not zero). At the quickstart's shapes, on the same inputs:

- **sampling**: one training step's rollouts, 4 math tasks x 4 generations, 32 new tokens, T = 1.0;
  tokens per second (the tokens actually produced, EOS included);
- **sampling, 16 distinct prompts**: the same without a shared prompt (nothing to prefill once);
- **verification**: greedy, the held-out tasks (48), 48 new tokens: what every live version pays
  every generation;
- **GRPO step**: the update on those 16 rollouts (dapo, one micro-batch, AdamW);
- **train step**: ``train_step`` end to end (sampling, the harness in its sandbox: reward, filter,
  advantages, metrics; the update). The harness is the reference with a length tie-break added to
  its reward, so that no group is dead and every step learns: a step whose groups are all dead skips
  the update, and the two paths sample different tokens, so without it the ratio would be luck;
- **episode turns**: multi-turn continuation, each turn extending the last (the KV reuse of an episode).

Each row alternates the two paths (old, new, old, new, ...) so that a shared machine's drift hits
both; medians are printed with the ratio. First the machine's own limits: fp32 and bf16 matmul
GFLOP/s and a memory copy's GB/s. Last, the sampler-vs-trainer log-prob gap of each path
(max |sampler log-prob - trainer log-prob| over the sampled tokens, the first-pass importance
ratio's distance from 1): the fast path must not widen it.

    python benchmarks/step_speed.py                          # embedded SmolLM2-135M, fp32, CPU
    python benchmarks/step_speed.py --model tiny-random --repeats 1 --json out.json
    python benchmarks/step_speed.py --random-init qwen2.5-1.5b --device cuda --dtype bfloat16   # a GPU
    python benchmarks/step_speed.py ... --tasks 8 --generations 8 --new-tokens 128   # other shapes

On a GPU the packed weights do nothing (they are a CPU kernel), so "fast" there is the KV decoder and
the shared prompts; the machine's limits are still the CPU's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch

from evotrainer.domains import get_domain
from evotrainer.genome.harness import Harness
from evotrainer.policy.base_model import EMBEDDED, load_base_model
from evotrainer.policy.collect import collect_groups
from evotrainer.policy.grpo import GRPOConfig, GRPOTrainer
from evotrainer.policy.lora import LoraSettings, Policy
from evotrainer.policy.rollout_engine import SamplingParams, TransformersEngine
from evotrainer.policy.train_step import step_params, train_step
from evotrainer.testing.learning_harness import always_learns

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_loop import ARCHS, build_model  # noqa: E402  (a benchmark beside this one: random weights by shape)

PATHS = {"old": dict(decoder="generate", shared_prompts=False, packed=False),
         "new": dict(decoder="kv", shared_prompts=True, packed=True)}


# ---- the machine's limits ------------------------------------------------------------------------
def machine_limits(seconds: float = 1.0) -> dict[str, float]:
    def rate(fn, work: float) -> float:
        fn()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            fn()
            n += 1
        return work * n / (time.perf_counter() - t0)

    out = {}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = torch.randn(1024, 1024).to(dt), torch.randn(1024, 1024).to(dt)
        out[f"matmul_{name}_gflops"] = rate(lambda: a @ b, 2 * 1024 ** 3 / 1e9)
    src = torch.empty(64 * 2 ** 20 // 4)
    dst = torch.empty_like(src)
    out["memcpy_gbs"] = rate(lambda: dst.copy_(src), 2 * src.numel() * 4 / 1e9)   # read + write
    return out


# ---- the setup ---------------------------------------------------------------------------------
def setup(args, packed: bool):
    model, tok = load_base_model(args.model, dtype=args.dtype, device=args.device)
    policy = Policy(model, tok, LoraSettings(), packed=packed)
    torch.manual_seed(0)   # the same adapter in both paths' copies
    policy.create("branch")
    with torch.no_grad():   # a trained-looking adapter: a fresh one (B = 0) would be the base model
        for name, p in policy.model.named_parameters():
            if ".branch." in name and "lora_B" in name:
                p.normal_(0, 0.002)
    return policy


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def side_by_side(name: str, run, repeats: int, unit=None) -> dict:
    """``run(path) -> (seconds, units of work)``, alternated between the paths after one warm-up each."""
    for path in PATHS:
        run(path)
    got = {p: [] for p in PATHS}
    for _ in range(repeats):
        for path in PATHS:
            got[path].append(run(path))
    row = {"name": name}
    for path, samples in got.items():
        secs = [s for s, _ in samples]
        row[path] = {"median_s": statistics.median(secs), "seconds": [round(s, 3) for s in secs]}
        if unit:
            row[path][unit] = sum(w for _, w in samples) / sum(secs)
    row["speedup"] = row["old"]["median_s"] / row["new"]["median_s"]
    extra = f"   {unit}: {row['old'][unit]:.1f} -> {row['new'][unit]:.1f}" if unit else ""
    print(f"{name:<34} {row['old']['median_s']:8.2f} s {row['new']['median_s']:8.2f} s {row['speedup']:6.2f}x{extra}",
          flush=True)
    return row


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=EMBEDDED)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each path per row, after one warm-up")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument("--tasks", type=int, default=4, help="tasks per training step (default: the quickstart's)")
    ap.add_argument("--generations", type=int, default=4, help="rollouts per task")
    ap.add_argument("--new-tokens", type=int, default=32, help="new tokens per rollout")
    ap.add_argument("--random-init", default=None, choices=sorted(ARCHS),
                    help="random weights of this architecture instead of --model (a machine with no weights)")
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder for --random-init (default: the embedded's)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    built = None
    if args.random_init:   # written to a folder once, then loaded like any local model (both copies)
        built = Path(tempfile.mkdtemp(prefix="evotrainer-step-speed-"))
        args.model = str(build_model(args.random_init, args.tokenizer, args.dtype, built))

    limits = machine_limits()
    print(f"machine: {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, fp32 matmul "
          f"{limits['matmul_fp32_gflops']:.0f} GFLOP/s, bf16 matmul {limits['matmul_bf16_gflops']:.0f} GFLOP/s, "
          f"memory copy {limits['memcpy_gbs']:.1f} GB/s")
    policies = {path: setup(args, kw["packed"]) for path, kw in PATHS.items()}
    if built:
        shutil.rmtree(built)
    domain = get_domain("math", difficulty=[2, 3], n_train=200, n_heldout=48, n_test=32, seed=0)
    engines = {p: TransformersEngine(policies[p], decoder=kw["decoder"]) for p, kw in PATHS.items()}
    n_t, n_g, n_new = args.tasks, args.generations, args.new_tokens
    cfg = GRPOConfig(learning_rate=5e-4, num_generations=n_g, max_completion_length=n_new, loss_type="dapo")
    tasks = domain.tasks("train")[:n_t]
    heldout = domain.tasks("heldout")
    print(f"model {args.random_init or args.model} {args.dtype} on {args.device}; "
          f"shapes: {n_t} tasks x {n_g} generations x {n_new} tokens, "
          f"{len(heldout)} held-out tasks x 48 greedy tokens\n")
    print(f"{'':<34} {'today':>10} {'fast':>10} {'ratio':>7}")
    rows = []

    def sample(path, prompts, params):
        s, out = timed(lambda: engines[path].generate(prompts, params, "branch"))
        return s, sum(len(c.completion_ids) for c in out)

    group_prompts = [t.messages() for t in tasks for _ in range(n_g)]
    distinct = [t.messages() for t in domain.tasks("train")[n_t:n_t + n_t * n_g]]
    step = iter(range(10_000))
    rows.append(side_by_side(f"sampling {n_t}x{n_g} x {n_new} tok", lambda p: sample(
        p, group_prompts, SamplingParams(temperature=1.0, max_new_tokens=n_new, seed=next(step))), args.repeats, "tok/s"))
    rows.append(side_by_side(f"sampling {len(distinct)} distinct x {n_new} tok", lambda p: sample(
        p, distinct, SamplingParams(temperature=1.0, max_new_tokens=n_new, seed=next(step))), args.repeats, "tok/s"))
    rows.append(side_by_side(f"verification {len(heldout)} x 48 greedy", lambda p: sample(
        p, [t.messages() for t in heldout], SamplingParams(temperature=0, max_new_tokens=48)), args.repeats, "tok/s"))

    rollouts = collect_groups(engines["old"], domain, tasks, n_g, step_params(cfg, 0, 1), "branch", step=1)
    advantages = [(-1.0) ** i * 0.5 for i in range(len(rollouts))]
    trainers = {p: GRPOTrainer(policies[p], "branch", cfg, shared_prompts=kw["shared_prompts"])
                for p, kw in PATHS.items()}
    start = {p: {n: t.detach().clone() for n, t in pol.model.named_parameters() if t.requires_grad}
             for p, pol in policies.items()}

    def restore(path):   # the next run starts from the same adapter
        with torch.no_grad():
            for n, t in policies[path].model.named_parameters():
                if n in start[path]:
                    t.copy_(start[path][n])

    def grpo(path):
        s, _ = timed(lambda: trainers[path].step(rollouts, advantages))
        restore(path)
        return s, None

    rows.append(side_by_side(f"GRPO step ({len(rollouts)} rollouts)", grpo, args.repeats))

    with Harness(always_learns()) as harness:
        def whole_step(path):
            i = next(step)
            s, (_, metrics) = timed(lambda: train_step(policies[path], engines[path], trainers[path], harness, domain,
                                                       tasks, "branch", step=1 + i, seed=0))
            assert not metrics.get("skipped"), "the step did not learn"
            restore(path)
            return s, None

        rows.append(side_by_side("train step (sample + learn)", whole_step, args.repeats))

    def turns(path, n_turns=4):
        eng = engines[path]
        params = SamplingParams(temperature=1.0, max_new_tokens=24, seed=next(step))
        extra = eng.tokenizer("<|im_end|>\n<|im_start|>user\nok, go on<|im_end|>\n<|im_start|>assistant\n",
                              add_special_tokens=False)["input_ids"]
        seqs = eng.encode(group_prompts[:8])
        produced, t0 = 0, time.perf_counter()
        for _ in range(n_turns):
            outs = eng.generate_ids(seqs, params, "branch")
            produced += sum(len(c.completion_ids) for c in outs)
            seqs = [c.prompt_ids + c.completion_ids + extra for c in outs]
        return time.perf_counter() - t0, produced

    rows.append(side_by_side("episode turns (8 x 4 turns x 24)", turns, args.repeats, "tok/s"))

    gaps = {}
    params = SamplingParams(temperature=1.0, max_new_tokens=n_new, seed=123)
    for path in PATHS:
        outs = collect_groups(engines[path], domain, tasks, n_g, params, "branch", step=1)
        tr = trainers[path]
        batch = tr._batch(outs)
        with torch.no_grad(), policies[path].adapter("branch") as m:
            lp = tr._logps(m, batch)
        gaps[path] = float(((lp - batch["old_logps"]).abs() * batch["completion_mask"]).max())
    print(f"\nsampler-vs-trainer log-prob gap (max |Δ| over sampled tokens): today {gaps['old']:.2e}, "
          f"fast {gaps['new']:.2e}")
    result = {"args": vars(args), "machine": limits, "rows": rows, "logprob_gap": gaps}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
