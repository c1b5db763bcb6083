"""GPU smoke test and throughput of the policy substrate on a randomly initialised real architecture.

Runs where no weights can travel (a lent accelerator): the SmolLM2 tokenizer is read from a folder
and the model is built from a config with random weights. Prints, per architecture and dtype:
rollout tokens/s (LoRA adapter active), one GRPO step's seconds and peak memory, and the largest
gap between sampler logprobs and the trainer's recomputed logprobs (the importance-ratio noise).
Then the population variant of ``benchmarks/population_rollouts.py`` per architecture: K branch
adapters' rollouts one adapter at a time, in one batch (decoded at the growing prefix and from a
captured CUDA graph), merged, and (where vllm is importable) in one vLLM
multi-LoRA call, tokens/s side by side and the weights' memory against base + K × adapter + 10%.

    python benchmarks/gpu_smoke.py --tokenizer DIR [--device cuda] [--archs smollm2-135m,llama-1b]
        [--population 8] [--population-prompts 16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from evotrainer.policy.base_model import CHATML_TEMPLATE, tiny_config
from evotrainer.policy.grpo import GRPOConfig, GRPOTrainer, group_advantages, per_token_logps
from evotrainer.policy.lora import LoraSettings, Policy
from evotrainer.policy.rollout_engine import SamplingParams, TransformersEngine
from evotrainer.policy.vllm_engine import TINY_VLLM_OVERRIDES
from evotrainer.records.rollout import Rollout

ARCHS = {
    "tiny": dict(TINY_VLLM_OVERRIDES),   # tiny_config with a head size vLLM-CPU has kernels for: the CPU smoke test
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, max_position_embeddings=8192, initializer_range=0.02),
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, max_position_embeddings=8192, initializer_range=0.02),
}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
VLLM_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_one(arch: str, dtype: str, tok, device: str, batch: int, new_tokens: int) -> dict:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(len(tok), **ARCHS[arch]), dtype=DTYPES[dtype]).to(device)
    model.generation_config.pad_token_id = tok.pad_token_id
    policy = Policy(model, tok, LoraSettings(r=16, lora_alpha=32))
    policy.create("b0")
    engine = TransformersEngine(policy, batch_size=batch)
    prompts = [[{"role": "user", "content": f"What is {i} + {i * 3}? Answer with a number."}] for i in range(batch)]
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=0)
    engine.generate(prompts[:4], SamplingParams(temperature=1.0, max_new_tokens=4, seed=0), "b0")  # warm-up
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    sync(device)
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params, "b0")
    sync(device)
    gen_s = time.perf_counter() - t0
    n_tokens = sum(len(o.completion_ids) for o in outs)

    rollouts = [Rollout(task_id=str(i // 4), messages=[], completion=o.text, prompt_ids=o.prompt_ids,
                        completion_ids=o.completion_ids, logprobs=o.logprobs, truncated=o.truncated)
                for i, o in enumerate(outs)]
    # Sampler vs trainer logprobs on the same tokens: how far the importance ratio starts from 1.
    o = outs[0]
    ids = torch.tensor([o.prompt_ids + o.completion_ids], device=device)
    with torch.no_grad(), policy.adapter("b0") as m:
        lp = per_token_logps(m, ids, torch.ones_like(ids), len(o.completion_ids), 1.0)[0].float().cpu()
    logp_gap = float((lp - torch.tensor(o.logprobs)).abs().max())

    cfg = GRPOConfig(learning_rate=1e-4, num_generations=4, max_completion_length=new_tokens,
                     per_device_train_batch_size=batch, loss_type="dapo")
    trainer = GRPOTrainer(policy, "b0", cfg)
    rewards = torch.rand(batch // 4, 4, generator=torch.Generator().manual_seed(0))
    adv = group_advantages(rewards).flatten().tolist()
    trainer.step(rollouts, adv)  # warm-up step
    sync(device)
    t1 = time.perf_counter()
    stats = trainer.step(rollouts, adv)
    sync(device)
    step_s = time.perf_counter() - t1
    policy.check_adapter_applied("b0")
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None  # JSON has no NaN
    result = dict(arch=arch, dtype=dtype, batch=batch, new_tokens=new_tokens, gen_seconds=round(gen_s, 3),
                  tokens_per_s=round(n_tokens / gen_s, 1), grpo_step_seconds=round(step_s, 3),
                  peak_gib=None if peak is None else round(peak, 2), sampler_vs_trainer_max_logp_gap=round(logp_gap, 4),
                  loss_finite=bool(torch.isfinite(torch.tensor(stats["loss"]))), grad_norm=round(stats["grad_norm"], 4))
    del policy, model, trainer, engine
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return result


def run_population(arch: str, dtype: str, tok, device: str, branches: int, prompts: int, new_tokens: int) -> dict:
    """population_rollouts.py's paths on a random-init ``arch`` (vLLM reads it from a saved folder)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from population_rollouts import add_branches, param_mib, prompts_for, run_paths

    from evotrainer.policy.vllm_engine import vllm_version

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(len(tok), **ARCHS[arch]), dtype=DTYPES[dtype]).to(device)
    model.generation_config.pad_token_id = tok.pad_token_id
    base_mib = param_mib(model.parameters())
    base_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    # One adapter at a time, then the population in one batch with the growing-prefix decode and with
    # the static one a CUDA graph replays (the default on a GPU), side by side in one call.
    paths = ["transformers", "together-dynamic", "together-static", "merged"] + (["vllm"] if vllm_version() else [])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / arch
        if "vllm" in paths:   # vLLM's base must hold these weights: saved before peft wraps the model
            model.save_pretrained(folder)
            tok.save_pretrained(folder)
        policy = Policy(model, tok, LoraSettings(r=16, lora_alpha=32))
        names = add_branches(policy, branches, 0)
        jobs = [prompts_for(i, prompts) for i in range(branches)]
        params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=0)
        results = run_paths(paths, policy, names, jobs, params, base_state, lambda: folder, VLLM_DTYPES[dtype])
        adapter_mib = param_mib(policy.parameters(names[0]))
    ref = results["transformers"]["tokens_per_s"]
    out = dict(arch=arch, dtype=dtype, branches=branches, prompts=prompts, new_tokens=new_tokens,
               vllm=vllm_version() or "not installed", base_mib=round(base_mib), adapter_mib=round(adapter_mib, 1),
               goal_mib=round((base_mib + branches * adapter_mib) * 1.1),
               paths={p: dict(tokens_per_s=round(r["tokens_per_s"], 1), ratio=round(r["tokens_per_s"] / ref, 2),
                              **{k: round(v, 1) for k, v in r.items() if k.endswith("seconds")}) for p, r in results.items()})
    del policy, model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True, help="folder with the SmolLM2 tokenizer files")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--archs", default="smollm2-135m,llama-1b")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--batches", default="32,128")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--population", type=int, default=8, help="branch adapters in the population variant (0: skip)")
    ap.add_argument("--population-prompts", type=int, default=16, help="prompts per branch there")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    tok.chat_template = tok.chat_template or CHATML_TEMPLATE
    tok.pad_token = tok.pad_token or tok.eos_token
    tok.padding_side = "left"
    if args.device.startswith("cuda"):
        print(f"device: {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    results = []
    for arch in args.archs.split(","):
        for dtype in args.dtypes.split(","):
            for batch in map(int, args.batches.split(",")):
                try:
                    r = run_one(arch, dtype, tok, args.device, batch, args.new_tokens)
                except Exception as e:  # report and go on: one failing shape must not hide the others
                    r = dict(arch=arch, dtype=dtype, batch=batch, error=f"{type(e).__name__}: {e}")
                results.append(r)
                print(json.dumps(r), flush=True)
    population = []
    for arch in args.archs.split(",") if args.population else []:
        for dtype in args.dtypes.split(","):
            try:
                r = run_population(arch, dtype, tok, args.device, args.population, args.population_prompts,
                                   args.new_tokens)
            except Exception as e:  # report and go on, as above
                r = dict(arch=arch, dtype=dtype, error=f"{type(e).__name__}: {e}")
            population.append(r)
            print(json.dumps(r), flush=True)
    with open(os.path.join(args.out, "gpu_smoke.json"), "w") as f:
        json.dump(results + [dict(population=population)], f, indent=2)
    print("\narch          dtype batch  tokens/s  grpo step s  peak GiB  logp gap")
    for r in results:
        if "error" in r:
            print(f"{r['arch']:<13} {r['dtype']:<5} {r['batch']:>5}  ERROR {r['error'][:80]}")
        else:
            print(f"{r['arch']:<13} {r['dtype']:<5} {r['batch']:>5} {r['tokens_per_s']:>9} {r['grpo_step_seconds']:>12}"
                  f" {r['peak_gib'] if r['peak_gib'] is not None else '-':>9} {r['sampler_vs_trainer_max_logp_gap']:>9}")


if __name__ == "__main__":
    main()
