"""One GRPO optimisation step: our ``GRPOTrainer.step`` vs TRL's ``GRPOTrainer``, side by side.

Like for like: the same base model and dtype, the same LoRA config (peft, r=16 on q/k/v/o, the
LoRA A matrices initialised identically on both sides, B = 0), the same pre-generated batch
(prompt ids + completion ids + sampler logprobs, sampled ONCE by our ``TransformersEngine`` and
fed to both), the same advantages, the same loss type, beta = 0, AdamW with the same learning
rate and grad-norm clipping at 1.0, one micro-batch holding the whole batch, no gradient
checkpointing on either side (TRL's config defaults it on; ``--trl-gradient-checkpointing`` turns
it back on). Timed on TRL's side: ``trainer.compute_loss(model, inputs)`` + backward + clip +
optimizer step + zero_grad; on ours: ``GRPOTrainer.step(rollouts, advantages)`` (which also
builds its padded tensors from the rollouts: that is part of our step).

Each side runs in its own subprocess so peak memory is its own: on CPU the process's peak RSS
(``ru_maxrss``) and the peak RSS growth during the timed steps over the RSS just before them (high
water mark reset through ``/proc/self/clear_refs``); on CUDA ``torch.cuda.max_memory_allocated``.
The warm-up step's loss and pre-clip gradient norm are printed for both sides: equal numbers show
that both optimise the same objective on the same inputs.

    python benchmarks/grpo_step_vs_trl.py                                   # SmolLM2-135M, CPU, fp32
    python benchmarks/grpo_step_vs_trl.py --model tiny-random --batch 8 --new-tokens 16
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch

from evotrainer.policy.base_model import EMBEDDED, load_base_model
from evotrainer.policy.lora import LoraSettings, Policy

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
ADAPTER = "default"  # TRL's adapter name; ours uses it too so parameter names line up
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")

PROMPTS = [
    "Tom has {a} marbles and finds {b} more. He gives away {c}. How many marbles does he have now?",
    "What is {a} + {b} - {c}? Give the final answer as a number.",
    "A train travels {a} km, then {b} km, then returns {c} km. How far is it from the start?",
    "Compute {a} plus {b}, then subtract {c}.",
]


# ---- memory -----------------------------------------------------------------------------------
def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def reset_peak_rss() -> bool:
    """Resets the kernel's RSS high-water mark (Linux >= 4.0); False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mib() -> float:
    """VmHWM (resettable) where readable, else ru_maxrss (the whole process's peak)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---- the shared batch -------------------------------------------------------------------------
def generate_batch(args, out: Path) -> dict:
    """Samples the batch once with our engine and writes it (rollouts + advantages) to ``out``."""
    from evotrainer.policy.grpo import group_advantages
    from evotrainer.policy.rollout_engine import SamplingParams, TransformersEngine
    from evotrainer.records.rollout import Rollout, save_rollouts

    model, tok = load_base_model(args.model, dtype=DTYPES[args.dtype], device=args.device)
    policy = Policy(model, tok, LoraSettings())
    policy.create(ADAPTER)
    engine = TransformersEngine(policy, batch_size=args.batch)
    n_groups = args.batch // args.group
    prompts = []
    for g in range(n_groups):
        a, b, c = 12 + 7 * g, 30 + 11 * g, 5 + 3 * g
        prompts += [[{"role": "user", "content": PROMPTS[g % len(PROMPTS)].format(a=a, b=b, c=c)}]] * args.group
    t0 = time.perf_counter()
    comps = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=args.seed))
    gen_s = time.perf_counter() - t0
    # Synthetic binary rewards, at least one 0 and one 1 per group: no dead group, every advantage set.
    g = torch.Generator().manual_seed(args.seed)
    rewards = torch.randint(0, 2, (n_groups, args.group), generator=g).float()
    rewards[:, 0], rewards[:, 1] = 1.0, 0.0
    advantages = group_advantages(rewards, "group").flatten().tolist()
    rollouts = [
        Rollout(task_id=f"g{i // args.group}", messages=p, completion=c.text, prompt_ids=c.prompt_ids,
                completion_ids=c.completion_ids, logprobs=c.logprobs, truncated=c.truncated,
                stop_reason=c.stop_reason, group=i // args.group, seed=args.seed)
        for i, (p, c) in enumerate(zip(prompts, comps))
    ]
    save_rollouts(out / "rollouts.jsonl", rollouts)
    (out / "advantages.json").write_text(json.dumps(advantages))
    lens = [len(c.completion_ids) for c in comps]
    return {"gen_seconds": gen_s, "completion_tokens": sum(lens), "mean_len": sum(lens) / len(lens),
            "prompt_len_max": max(len(c.prompt_ids) for c in comps)}


def load_batch(data: Path):
    from evotrainer.records.rollout import load_rollouts

    return load_rollouts(data / "rollouts.jsonl"), json.loads((data / "advantages.json").read_text())


def init_lora_identically(model) -> int:
    """Deterministic LoRA A (uniform ±1/sqrt(fan_in), seeded by the parameter's name) and B = 0."""
    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                if "lora_B" in name:
                    p.zero_()
                else:
                    key = name.replace(f".{ADAPTER}.", ".").replace("base_model.model.", "")
                    g = torch.Generator().manual_seed(zlib.crc32(key.encode()))
                    bound = 1.0 / p.shape[1] ** 0.5
                    p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) * bound)
                n += 1
    return n


# ---- the two sides (each in its own subprocess) -----------------------------------------------
def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_steps(step, args) -> tuple[dict, list[float], dict]:
    """Warm-up step (returns its stats), then ``repeats`` timed steps, with memory around them."""
    cuda = args.device.startswith("cuda")
    rss_before = rss_mib()
    setup_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # model load, trainer set-up
    hwm_reset = reset_peak_rss()  # from here VmHWM (and ru_maxrss) track the steps only
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    first = step()
    times = []
    for _ in range(args.repeats):
        sync(args.device)
        t0 = time.perf_counter()
        step()
        sync(args.device)
        times.append(time.perf_counter() - t0)
    steps_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    mem = {"rss_before_mib": rss_before, "setup_peak_rss_mib": setup_peak,
           "peak_rss_during_mib": peak_rss_mib() if hwm_reset else None,
           "ru_maxrss_mib": max(setup_peak, steps_peak)}  # the process's peak, set-up and steps
    if hwm_reset:
        mem["peak_rss_delta_mib"] = mem["peak_rss_during_mib"] - rss_before
    if cuda:
        mem["cuda_max_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return first, times, mem


def load_model(args):
    """The base model, with any GGUF quantizer mark removed: the embedded model is converted from a
    GGUF file and its config still names the GGUF quantization, although its weights are plain
    dequantised tensors; HF's Trainer (under TRL) refuses to train a model so marked. Both sides get
    the same, unmarked model."""
    model, tok = load_base_model(args.model, dtype=DTYPES[args.dtype], device=args.device)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
        if "is_quantized" in vars(model):
            model.is_quantized = False
        for cfg in (model.config, getattr(model, "generation_config", None)):
            if cfg is not None and hasattr(cfg, "quantization_config"):
                delattr(cfg, "quantization_config")
    return model, tok


def worker_ours(args) -> dict:
    from evotrainer.policy.grpo import GRPOConfig, GRPOTrainer

    rollouts, advantages = load_batch(Path(args.data))
    model, tok = load_model(args)
    policy = Policy(model, tok, LoraSettings())
    policy.create(ADAPTER)
    init_lora_identically(policy.model)
    cfg = GRPOConfig(learning_rate=args.lr, num_generations=args.group, max_completion_length=args.new_tokens,
                     beta=0.0, epsilon=0.2, epsilon_high=0.28, loss_type=args.loss_type,
                     per_device_train_batch_size=args.batch, max_grad_norm=1.0)
    trainer = GRPOTrainer(policy, ADAPTER, cfg)

    def step():
        s = trainer.step(rollouts, advantages)
        return {"loss": s["loss"], "grad_norm": s["grad_norm"]}

    first, times, mem = time_steps(step, args)
    return {"side": "ours", "first": first, "times": times, "mem": mem,
            "trainable_params": sum(p.numel() for p in trainer.params)}


def trl_inputs(rollouts, advantages, pad_id: int, device: str) -> dict:
    """The dict TRL's ``compute_loss`` takes: left-padded prompts, right-padded completions."""
    P = max(len(r.prompt_ids) for r in rollouts)
    T = max(max(len(r.completion_ids) for r in rollouts), 1)
    pid, pm, cid, cm, old = [], [], [], [], []
    for r in rollouts:
        p, c = list(r.prompt_ids), list(r.completion_ids)
        pid.append([pad_id] * (P - len(p)) + p)
        pm.append([0] * (P - len(p)) + [1] * len(p))
        cid.append(c + [pad_id] * (T - len(c)))
        cm.append([1] * len(c) + [0] * (T - len(c)))
        old.append(list(r.logprobs) + [0.0] * (T - len(c)))
    cm_t = torch.tensor(cm, device=device)
    return {
        "prompt_ids": torch.tensor(pid, device=device), "prompt_mask": torch.tensor(pm, device=device),
        "completion_ids": torch.tensor(cid, device=device), "completion_mask": cm_t,
        "advantages": torch.tensor(advantages, device=device, dtype=torch.float32),
        "old_per_token_logps": torch.tensor(old, device=device, dtype=torch.float32),
        "num_items_in_batch": cm_t.sum(),
    }


def worker_trl(args) -> dict:
    import trl
    from datasets import Dataset
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    rollouts, advantages = load_batch(Path(args.data))
    model, tok = load_model(args)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TRLConfig(
            output_dir=tmp, report_to="none", use_cpu=not args.device.startswith("cuda"), bf16=False, fp16=False,
            per_device_train_batch_size=args.batch, gradient_accumulation_steps=1, num_generations=args.group,
            max_completion_length=args.new_tokens, temperature=1.0, beta=0.0, epsilon=0.2, epsilon_high=0.28,
            loss_type=args.loss_type, learning_rate=args.lr, weight_decay=0.0, max_grad_norm=1.0,
            optim="adamw_torch", gradient_checkpointing=args.trl_gradient_checkpointing, logging_steps=1,
            lr_scheduler_type="constant", warmup_steps=0,
        )
        data = Dataset.from_list([{"prompt": "hi"}] * args.batch)
        trainer = TRLTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=cfg,
                             train_dataset=data, processing_class=tok, peft_config=LoraSettings().peft_config())
        pmodel = trainer.model
        init_lora_identically(pmodel)
        if args.trl_gradient_checkpointing:
            pmodel.gradient_checkpointing_enable(gradient_checkpointing_kwargs=cfg.gradient_checkpointing_kwargs)
        trainer.create_optimizer()
        trainer.current_gradient_accumulation_steps = 1
        params = [p for p in pmodel.parameters() if p.requires_grad]
        optimizer = trainer.optimizer
        inputs = trl_inputs(rollouts, advantages, tok.pad_token_id, args.device)
        pmodel.train()

        def step():
            loss = trainer.compute_loss(pmodel, inputs)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return {"loss": float(loss.detach()), "grad_norm": float(norm)}

        first, times, mem = time_steps(step, args)
        return {"side": "trl", "first": first, "times": times, "mem": mem, "trl_version": trl.__version__,
                "trainable_params": sum(p.numel() for p in params),
                "gradient_checkpointing": bool(getattr(pmodel, "is_gradient_checkpointing", False)),
                "optimizer": type(optimizer).__name__}


# ---- driver -----------------------------------------------------------------------------------
def run_worker(side: str, args, data: Path) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_worker", side, "--_data", str(data),
           "--model", args.model, "--batch", str(args.batch), "--group", str(args.group),
           "--new-tokens", str(args.new_tokens), "--loss-type", args.loss_type, "--repeats", str(args.repeats),
           "--device", args.device, "--dtype", args.dtype, "--lr", str(args.lr), "--seed", str(args.seed)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.trl_gradient_checkpointing:
        cmd.append("--trl-gradient-checkpointing")
    print(f"running {side} ...", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    marker = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not marker:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"{side} worker failed (exit {proc.returncode})")
    return json.loads(marker[-1][len("RESULT "):])


def print_table(args, batch_info: dict, ours: dict, trl: dict) -> dict:
    med = {r["side"]: statistics.median(r["times"]) for r in (ours, trl)}
    ratio = med["trl"] / med["ours"]
    cuda = args.device.startswith("cuda")
    print(f"\nGRPO optimisation step, ours vs TRL {trl['trl_version']}: model {args.model}, {args.device}, "
          f"{args.dtype}, loss_type {args.loss_type}, beta 0, LoRA r=16 q/k/v/o "
          f"({ours['trainable_params']:,} vs {trl['trainable_params']:,} trainable params)")
    print(f"batch: {args.batch} sequences ({args.batch // args.group} groups x {args.group}), "
          f"{batch_info['completion_tokens']} completion tokens (mean {batch_info['mean_len']:.1f}, "
          f"max new {args.new_tokens}), prompts <= {batch_info['prompt_len_max']} tokens; "
          f"{args.repeats} timed step(s) after 1 warm-up; torch threads {args.threads or torch.get_num_threads()}")
    mem_head = "cuda max alloc MiB" if cuda else "process peak RSS MiB"
    head = (f"{'side':<6} {'median s/step':>13} {'min s':>8} {'max s':>8} {'warm-up loss':>14} {'grad norm':>10} "
            f"{mem_head:>25} {'step RSS delta MiB':>19}")
    print(head)
    print("-" * len(head))
    for r in (ours, trl):
        m = r["mem"]
        mem_val = m.get("cuda_max_allocated_mib") if cuda else m["ru_maxrss_mib"]
        delta = m.get("peak_rss_delta_mib")
        print(f"{r['side']:<6} {statistics.median(r['times']):13.3f} {min(r['times']):8.3f} {max(r['times']):8.3f} "
              f"{r['first']['loss']:14.6g} {r['first']['grad_norm']:10.6g} {mem_val:25.1f} "
              f"{delta if delta is not None else float('nan'):19.1f}")
    if not cuda:
        print("process peak RSS = ru_maxrss of the side's own subprocess (model, trainer, steps); step RSS delta = "
              "peak RSS during warm-up + timed steps minus RSS just before them")
    print(f"time ratio TRL/ours: {ratio:.2f}x ({'ours faster' if ratio >= 1 else 'TRL faster'}; goal >= 1.0)")
    def close(k: str) -> bool:
        a, b = ours["first"][k], trl["first"][k]
        return abs(a - b) <= 1e-6 + 1e-3 * max(abs(a), abs(b))

    same = close("loss") and close("grad_norm")
    print(f"same objective check (warm-up step loss and pre-clip grad norm): {'match' if same else 'MISMATCH'}; "
          f"TRL gradient checkpointing "
          f"{'on' if trl['gradient_checkpointing'] else 'off'}, TRL optimizer {trl['optimizer']}")
    return {"median_s": med, "ratio_trl_over_ours": ratio, "loss_match": same}


def main(argv: list[str] | None = None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=EMBEDDED, help="smollm2-135m (embedded), tiny-random, or a local HF folder")
    ap.add_argument("--batch", type=int, default=16, help="sequences per step (one micro-batch)")
    ap.add_argument("--group", type=int, default=4, help="generations per prompt (GRPO group size)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--loss-type", default="dapo", choices=LOSS_TYPES)
    ap.add_argument("--repeats", type=int, default=3, help="timed steps per side after one warm-up")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads in each worker")
    ap.add_argument("--trl-gradient-checkpointing", action="store_true",
                    help="turn TRL's default gradient checkpointing back on (ours has none)")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    ap.add_argument("--_worker", choices=("ours", "trl"), help=argparse.SUPPRESS)
    ap.add_argument("--_data", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.batch % args.group:
        ap.error("--batch must be a multiple of --group")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    if args._worker:
        args.data = args._data
        result = worker_ours(args) if args._worker == "ours" else worker_trl(args)
        print("RESULT " + json.dumps(result), flush=True)
        return None

    with tempfile.TemporaryDirectory(prefix="grpo-bench-") as tmp:
        data = Path(tmp)
        print(f"sampling the shared batch with TransformersEngine ({args.model}) ...", flush=True)
        batch_info = generate_batch(args, data)
        ours = run_worker("ours", args, data)
        trl = run_worker("trl", args, data)
    summary = print_table(args, batch_info, ours, trl)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if not k.startswith("_")},
                                               "batch": batch_info, "ours": ours, "trl": trl, "summary": summary},
                                              indent=2))
    return summary


if __name__ == "__main__":
    main()
