"""Rollout throughput of ``TransformersEngine``: generated tokens per second, per dtype.

Measures the path training uses: a ``Policy`` with a LoRA branch (``Policy.create``) sampled by
``TransformersEngine.generate`` at temperature 1.0, and the same model without any adapter (the
bare base model, before peft wraps it) for reference. ``generate`` has no ``min_new_tokens``, so
sequences may stop early at EOS: throughput counts the tokens actually produced (the sum of
``len(completion_ids)``) over wall seconds, after one warm-up call per path.

    python benchmarks/rollout_throughput.py                      # embedded SmolLM2-135M, CPU, bf16+fp32
    python benchmarks/rollout_throughput.py --model tiny-random --batch 8 --new-tokens 16 --repeats 1
    python benchmarks/rollout_throughput.py --device cuda --random-init llama-1b --batch 64 --repeats 5

``--random-init smollm2-135m|llama-1b`` builds a Llama of that shape with random weights (nothing is
loaded but the SmolLM2 tokenizer; ``--tokenizer PATH`` points at a folder holding it, for machines
without the embedded model). A random model rarely emits EOS, so its sequences run to full length.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch

from evotrainer.policy.base_model import CHATML_TEMPLATE, EMBEDDED, load_base_model, load_tokenizer
from evotrainer.policy.lora import LoraSettings, Policy
from evotrainer.policy.rollout_engine import SamplingParams, TransformersEngine

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}

# Shapes of real architectures, for random-weight runs (vocab = the tokenizer's length).
RANDOM_INIT_SHAPES = {
    "smollm2-135m": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                     "num_key_value_heads": 3, "head_dim": 64, "tie_word_embeddings": True, "rope_theta": 100000.0},
    "llama-1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "head_dim": 64, "tie_word_embeddings": True, "rope_theta": 500000.0},
}

PROMPT_TEMPLATES = [
    "What is {a} + {b}? Give the final answer as a number.",
    "A shop sells {a} apples in the morning and {b} in the afternoon. How many apples did it sell?",
    "Write a short Python function that returns the sum of {a} and {b}.",
    "Explain in two sentences why {a} is {parity}.",
]


def make_prompts(n: int) -> list[list[dict[str, str]]]:
    prompts = []
    for i in range(n):
        a, b = 7 + 13 * i % 89, 3 + 29 * i % 97
        text = PROMPT_TEMPLATES[i % len(PROMPT_TEMPLATES)].format(a=a, b=b, parity="even" if a % 2 == 0 else "odd")
        prompts.append([{"role": "user", "content": text}])
    return prompts


def build_random_model(shape: str, tokenizer, dtype: torch.dtype, device: str, seed: int = 0):
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=8192, rms_norm_eps=1e-5,
                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id, **RANDOM_INIT_SHAPES[shape])
    torch.manual_seed(seed)
    with torch.device(device):  # initialise on the target device: a 1B model inits in seconds on a GPU
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    return model


def load_bench_tokenizer(path: str | None):
    """The embedded SmolLM2 tokenizer, or one from a folder (no config.json needed), set up as
    ``load_tokenizer`` does: chat template, pad token, left padding."""
    if path is None:
        return load_tokenizer(EMBEDDED)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if not tok.chat_template:
        tok.chat_template = CHATML_TEMPLATE
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load(args, dtype: torch.dtype):
    if args.random_init:
        tok = load_bench_tokenizer(args.tokenizer)
        return build_random_model(args.random_init, tok, dtype, args.device), tok
    return load_base_model(args.model, dtype=dtype, device=args.device)


class _BarePolicy:
    """The engine's view of a model with no peft wrapping at all (the no-adapter reference)."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer

    @contextmanager
    def adapter(self, name):
        yield self.model


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(engine: TransformersEngine, prompts, params: SamplingParams, adapter, repeats: int, device: str) -> dict:
    engine.generate(prompts, params, adapter=adapter)  # warm-up (allocator, kernels, caches)
    seconds, tokens = [], []
    for r in range(repeats):
        p = dataclasses.replace(params, seed=params.seed + r + 1)  # fresh samples each call
        sync(device)
        t0 = time.perf_counter()
        out = engine.generate(prompts, p, adapter=adapter)
        sync(device)
        seconds.append(time.perf_counter() - t0)
        tokens.append(sum(len(c.completion_ids) for c in out))
    total_s, total_tok = sum(seconds), sum(tokens)
    return {
        "tokens_per_s": total_tok / total_s,
        "seqs_per_s": len(prompts) * repeats / total_s,
        "mean_completion_len": total_tok / (len(prompts) * repeats),
        "median_call_s": statistics.median(seconds),
        "calls_s": [round(s, 4) for s in seconds],
    }


def run_dtype(args, name: str) -> dict[str, dict]:
    dtype = DTYPES[name]
    model, tok = load(args, dtype)
    prompts = make_prompts(args.batch)
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=args.seed)
    results: dict[str, dict] = {}
    if "base" in args.paths:  # before peft injects LoRA layers into the model
        results["base"] = measure(TransformersEngine(_BarePolicy(model, tok), args.batch), prompts, params, None,
                                  args.repeats, args.device)
        print(f"  {name:>5} base      {results['base']['tokens_per_s']:10.1f} tok/s", flush=True)
    if "lora" in args.paths or "disabled" in args.paths:
        policy = Policy(model, tok, LoraSettings())
        policy.create("bench")
        if args.device != "cpu":
            policy.model.to(args.device)
        engine = TransformersEngine(policy, args.batch)
        for path, adapter in (("lora", "bench"), ("disabled", None)):
            if path in args.paths:
                results[path] = measure(engine, prompts, params, adapter, args.repeats, args.device)
                print(f"  {name:>5} {path:<9} {results[path]['tokens_per_s']:10.1f} tok/s", flush=True)
    del model
    if args.device.startswith("cuda"):
        results["_cuda_max_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return results


PATH_LABEL = {"lora": "LoRA adapter", "base": "no adapter", "disabled": "peft, adapter off"}


def print_table(args, results: dict[str, dict[str, dict]]) -> None:
    model = f"random-init {args.random_init}" if args.random_init else args.model
    print(f"\nTransformersEngine throughput: {model}, device {args.device}, batch {args.batch} x "
          f"{args.new_tokens} new tokens, temperature 1.0, {args.repeats} timed call(s) after 1 warm-up, "
          f"torch threads {torch.get_num_threads()}")
    head = f"{'dtype':<6} {'path':<18} {'tokens/s':>10} {'seqs/s':>8} {'mean len':>9} {'median call s':>14}"
    print(head)
    print("-" * len(head))
    for dtype, per_path in results.items():
        for path in args.paths:
            r = per_path[path]
            print(f"{dtype:<6} {PATH_LABEL[path]:<18} {r['tokens_per_s']:10.1f} {r['seqs_per_s']:8.2f} "
                  f"{r['mean_completion_len']:9.1f} {r['median_call_s']:14.3f}")
        if "_cuda_max_mem_gib" in per_path:
            print(f"{dtype:<6} {'(cuda peak alloc)':<18} {per_path['_cuda_max_mem_gib']:9.2f} GiB")
    if "bf16" in results and "fp32" in results:
        for path in args.paths:
            ratio = results["bf16"][path]["tokens_per_s"] / results["fp32"][path]["tokens_per_s"]
            print(f"bf16/fp32 tokens/s ratio ({PATH_LABEL[path]}): {ratio:.2f}x")
    for dtype, per_path in results.items():
        if "lora" in per_path and "base" in per_path:
            print(f"LoRA/no-adapter tokens/s ratio ({dtype}): "
                  f"{per_path['lora']['tokens_per_s'] / per_path['base']['tokens_per_s']:.2f}x")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=EMBEDDED, help="smollm2-135m (embedded), tiny-random, or a local HF folder")
    ap.add_argument("--random-init", choices=sorted(RANDOM_INIT_SHAPES), default=None,
                    help="random weights of this shape instead of --model (SmolLM2 tokenizer)")
    ap.add_argument("--tokenizer", default=None, help="folder with the tokenizer for --random-init (default: embedded)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2, help="timed generate calls per path, after one warm-up")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--paths", default="lora,base", help="comma list of lora, base (no adapter), disabled "
                                                         "(peft model with the adapter disabled)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    args.paths = [p for p in args.paths.split(",") if p]
    bad = set(args.paths) - set(PATH_LABEL)
    if bad:
        ap.error(f"unknown --paths {sorted(bad)}; choose from {sorted(PATH_LABEL)}")
    dtypes = [d for d in args.dtypes.split(",") if d]
    if set(dtypes) - set(DTYPES):
        ap.error(f"--dtypes must be from {sorted(DTYPES)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda but torch sees no CUDA device")
    if args.threads:
        torch.set_num_threads(args.threads)

    results = {}
    for name in dtypes:
        print(f"measuring {name} ...", flush=True)
        results[name] = run_dtype(args, name)
    print_table(args, results)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    return results


if __name__ == "__main__":
    main()
