"""GPU smoke test and throughput of the policy substrate on a randomly initialised real architecture.

Runs where no weights can travel (a lent accelerator): the SmolLM2 tokenizer is read from a folder
and the model is built from a config with random weights. Prints, per architecture and dtype:
rollout tokens/s (LoRA adapter active), one GRPO step's seconds and peak memory, and the largest
gap between sampler logprobs and the trainer's recomputed logprobs (the importance-ratio noise).

    python benchmarks/gpu_smoke.py --tokenizer DIR [--device cuda] [--archs smollm2-135m,llama-1b]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from evotrainer.policy.base_model import CHATML_TEMPLATE, tiny_config
from evotrainer.policy.grpo import GRPOConfig, GRPOTrainer, group_advantages, per_token_logps
from evotrainer.policy.lora import LoraSettings, Policy
from evotrainer.policy.rollout_engine import SamplingParams, TransformersEngine
from evotrainer.records.rollout import Rollout

ARCHS = {
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, max_position_embeddings=8192, initializer_range=0.02),
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, max_position_embeddings=8192, initializer_range=0.02),
}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


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
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else float("nan")
    result = dict(arch=arch, dtype=dtype, batch=batch, new_tokens=new_tokens, gen_seconds=round(gen_s, 3),
                  tokens_per_s=round(n_tokens / gen_s, 1), grpo_step_seconds=round(step_s, 3),
                  peak_gib=round(peak, 2), sampler_vs_trainer_max_logp_gap=round(logp_gap, 4),
                  loss_finite=bool(torch.isfinite(torch.tensor(stats["loss"]))), grad_norm=round(stats["grad_norm"], 4))
    del policy, model, trainer, engine
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True, help="folder with the SmolLM2 tokenizer files")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--archs", default="smollm2-135m,llama-1b")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--batches", default="32,128")
    ap.add_argument("--new-tokens", type=int, default=64)
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
    with open(os.path.join(args.out, "gpu_smoke.json"), "w") as f:
        json.dump(results, f, indent=2)
    print("\narch          dtype batch  tokens/s  grpo step s  peak GiB  logp gap")
    for r in results:
        if "error" in r:
            print(f"{r['arch']:<13} {r['dtype']:<5} {r['batch']:>5}  ERROR {r['error'][:80]}")
        else:
            print(f"{r['arch']:<13} {r['dtype']:<5} {r['batch']:>5} {r['tokens_per_s']:>9} {r['grpo_step_seconds']:>12}"
                  f" {r['peak_gib']:>9} {r['sampler_vs_trainer_max_logp_gap']:>9}")


if __name__ == "__main__":
    main()
