"""The real loop on one GPU: two generations of a population, with ``engine: vllm`` and with
``engine: transformers``, on a randomly initialised real architecture (no weights can travel to a
lent accelerator; the SmolLM2 tokenizer is carried in a folder).

Prints, per engine: the run's wall time and where it went (rollouts, gradient steps, verification,
...), rollout tokens per second of rollout time, seconds per gradient step, peak memory (CUDA's
allocator on a GPU, the process's resident set on a CPU), and the adapter check's outcome (every
version's status; a version refused because vLLM served other weights than trained says so).
``make test`` runs it on the CPU with the tiny architecture, so it cannot break unseen.

    python benchmarks/gpu_loop.py --tokenizer DIR --arch qwen2.5-1.5b --device cuda --json $OUT/gpu_loop.json
    python benchmarks/gpu_loop.py --arch tiny --device cpu --dtype float32 --json out.json   # the CPU test
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from evotrainer.config import parse_config  # noqa: E402
from evotrainer.loop.experiment import Experiment  # noqa: E402
from evotrainer.policy.base_model import CHATML_TEMPLATE, load_tokenizer, tiny_config  # noqa: E402
from evotrainer.policy.vllm_engine import TINY_VLLM_OVERRIDES  # noqa: E402
from evotrainer.testing.learning_harness import always_learns  # noqa: E402

# Architectures by their published shapes; the vocabulary is the carried tokenizer's.
ARCHS = {
    "tiny": ("llama", dict(TINY_VLLM_OVERRIDES)),
    "qwen2.5-1.5b": ("qwen2", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                   num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                                   rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                   use_sliding_window=False, initializer_range=0.02)),
}


def random_model(arch: str, tokenizer_dir: str | None, dtype: str):
    """(model, tokenizer): random weights of ``arch`` (seeded) and the carried tokenizer (default: the
    embedded one's), with a chat template."""
    tok = AutoTokenizer.from_pretrained(tokenizer_dir) if tokenizer_dir else load_tokenizer("tiny-random")
    if not tok.chat_template:
        tok.chat_template = CHATML_TEMPLATE
    kind, shape = ARCHS[arch]
    config = tiny_config(len(tok), **shape) if arch == "tiny" else AutoConfig.for_model(kind, vocab_size=len(tok), **shape)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype)), tok


def build_model(arch: str, tokenizer_dir: str | None, dtype: str, folder: Path) -> Path:
    """A Hugging Face folder with random weights of ``arch`` and the carried tokenizer."""
    if (folder / "config.json").is_file():
        return folder
    model, tok = random_model(arch, tokenizer_dir, dtype)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def loop_config(model: Path, engine: str, batch: int, args, run_dir: Path) -> dict:
    # A random model answers nothing right, so every group would be dead and no step would train (nor
    # any adapter reach vLLM's applied check): the reference harness with a length tie-break instead.
    harness = run_dir.parent / "always_learns.py"
    harness.write_text(always_learns().source)
    return {
        "model": str(model), "harness": str(harness), "dtype": args.dtype, "device": args.device, "engine": engine,
        "run_dir": str(run_dir),
        "domain": {"difficulty": [1, 2], "n_train": 64, "n_heldout": 16, "n_test": 8},
        "grpo": {"num_generations": 4, "max_completion_length": args.tokens},
        "train": {"prompts_per_step": args.prompts, "eval_max_new_tokens": args.tokens, "rollout_batch_size": batch},
        "evolution": {"population_size": 2, "children_per_generation": 2, "generations": args.generations,
                      "steps_per_generation": 2, "operators": {"knobs": 1.0}, "user_skills": False},
    }


def peak_memory_gib(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20   # kilobytes on Linux


def run_engine(model: Path, engine: str, batch: int, args, out: Path) -> dict:
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    run_dir = out / f"{engine}-b{batch}"
    exp = Experiment(parse_config(loop_config(model, engine, batch, args, run_dir)))
    t0 = time.perf_counter()
    try:
        state = exp.run()
    finally:
        exp.close()
    used = state.budget_used
    statuses = {v: exp.vdir(v).meta().status for v in exp.versions()}
    refused = [e for e in state.events if "AdapterNotApplied" in e or "differs from the trained" in e]
    return {"engine": engine, "rollout_batch": batch, "status": state.status, "wall_s": time.perf_counter() - t0,
            "rollout_tokens": used.get("rollout_tokens", 0), "train_steps": used.get("train_steps", 0),
            "tokens_per_s": used.get("rollout_tokens", 0) / max(used.get("gen_seconds", 0), 1e-9),
            "seconds_per_step": used.get("train_seconds", 0) / max(used.get("train_steps", 0), 1),
            "seconds": {k[:-8]: round(v, 2) for k, v in used.items() if k.endswith("_seconds")},
            "peak_gib": peak_memory_gib(args.device), "versions": statuses, "adapter_refusals": refused}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="qwen2.5-1.5b", choices=sorted(ARCHS))
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the embedded SmolLM2's)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--engines", default="vllm,transformers")
    ap.add_argument("--generations", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=8, help="tasks per step (x 4 rollouts)")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per rollout and per verification")
    ap.add_argument("--rollout-batch", default="32",
                    help="comma list of train.rollout_batch_size values (sequences sampled at once); one run each")
    ap.add_argument("--out", default="runs/gpu_loop")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    out = Path(args.out)
    model = build_model(args.arch, args.tokenizer, args.dtype, out / f"model-{args.arch}")
    rows = []
    result = {"arch": args.arch, "dtype": args.dtype, "device": args.device, "rows": rows}
    for engine in args.engines.split(","):
        for batch in (int(b) for b in args.rollout_batch.split(",")):
            print(f"[{time.strftime('%H:%M:%S')}] {engine}, rollout batch {batch}: {args.arch} {args.dtype} "
                  f"on {args.device} ...", flush=True)
            r = run_engine(model, engine, batch, args, out)
            rows.append(r)
            print(f"  {r['status']} in {r['wall_s']:.0f} s: {r['tokens_per_s']:.0f} rollout tok/s, "
                  f"{r['seconds_per_step']:.2f} s per step, peak {r['peak_gib']:.2f} GiB, "
                  f"adapter refusals {len(r['adapter_refusals'])}; time went to {r['seconds']}", flush=True)
            if args.json:   # after every run: a device lease that ends mid-script keeps the rows it measured
                Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
