"""Headroom: which single harness changes beat the fixed recipe at this scale, and by how much.

Evolution can only find what the search space holds. This trains each candidate harness *alone*,
from the seed, for the whole step budget, under the same seeds and tasks as the reference recipe,
and scores every run on the test split (greedy accuracy, the figure users report), paired with the
reference over (task, seed). The candidates are the intervention library's entries and knob moves
that fire on the reference lineage's health reports (truncation, dead groups, a sampled-vs-greedy
gap) and the others a practitioner would try first; ``--combine`` adds the best ones applied together.
The table is the target the search must reach and the effect size its gate must be able to see.

    python benchmarks/headroom.py --json benchmarks/results/headroom_math.json            # math, quickstart levels
    python benchmarks/headroom.py --config examples/train_code.yaml --json .../headroom_code.json
    python benchmarks/headroom.py --combine longer_completions+lower_temperature --json ...
    python benchmarks/headroom.py --config examples/evolve_swe.yaml --steps 8 --n-test 16 --json .../headroom_swe.json
    python benchmarks/headroom.py --model tiny-random --steps 2 --seeds 0 --n-test 8 --variants reference,rloo_advantages
    python benchmarks/headroom.py --config examples/evolve_swe.yaml --init-adapter runs/.../seed0/adapter ...  # the next rung

``--init-adapter`` starts every run (and the "untrained" row) from a trained adapter instead of the
base model: the next rung of a ladder, each variant trained on from where an earlier run ended.

Runs go seed by seed (every variant for seed 0, then seed 1, ...), each written to ``--json`` as it
finishes; a rerun skips what is there, so a stopped benchmark resumes. ``--report`` prints the table
from the JSON alone; ``--fires`` which library entries the reference runs' own health reports trigger.
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
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from evotrainer.config import load_config
from evotrainer.genome.program import HarnessProgram
from evotrainer.loop.seed import seed_program
from evotrainer.operators.base import OperatorError
from evotrainer.operators.library import default_entries

from headroom_report import SAMPLED_K, SAMPLED_TASKS, episode_scores, fires, report, signals, versus  # noqa: E402

# name -> (library entry, its parameters): one representative setting per entry, the middle of its
# allowed values where it has several. Knob moves are relative to the seed's (the config's) values.
SINGLES: dict[str, tuple[str, dict]] = {
    "longer_completions": ("longer_completions", {"value": 64}),
    "mask_truncated": ("mask_truncated", {"value": True}),
    "dapo_overlong_shaping": ("dapo_overlong_shaping", {"buffer": 0.25, "scale": 0.5}),
    "length_penalty": ("length_penalty", {"weight": 0.1}),
    "lower_temperature": ("lower_temperature", {"value": 0.7}),
    "more_generations": ("more_generations", {"value": 8}),
    "dr_grpo_advantages": ("dr_grpo_advantages", {"value": "none"}),
    "rloo_advantages": ("rloo_advantages", {}),
    "dapo_dynamic_sampling": ("dapo_dynamic_sampling", {"signal": "reward"}),
    "pass_rate_curriculum": ("pass_rate_curriculum", {"low": 0.1, "high": 0.9}),
    "easy_first_curriculum": ("easy_first_curriculum", {"warmup": 8, "share": 0.5}),
    "raise_learning_rate": ("raise_learning_rate", {"value": 1e-3}),
    "lower_learning_rate": ("lower_learning_rate", {"value": 2.5e-4}),
    "format_partial_credit": ("format_partial_credit", {"credit": 0.1}),
}
CODE_SKIP = {"format_partial_credit"}   # math-only reward template
# SWE (multi-turn episodes): the entries that answer the SWE report's diagnosis (operators/swe_entries.py),
# at their strongest setting: the question is whether anything in the search space moves the 135M policy.
SWE_SINGLES: dict[str, tuple[str, dict]] = {
    "swe_call_form_credit": ("swe_call_form_credit", {"credit": 0.3}),
    "swe_worked_call_prompt": ("swe_worked_call_prompt", {"shots": 3}),
    "swe_give_up_penalty": ("swe_give_up_penalty", {"penalty": 0.2}),
    "swe_guided_tool_calls": ("swe_guided_tool_calls", {"value": 0.5}),
    "swe_imitate_guided_calls": ("swe_imitate_guided_calls", {"value": 1.0}),
    # x4 on the SWE seed's 1e-4 (the runs of 2026-12-02/03); the seed has been at 4e-4 since, where x2 is 8e-4
    "swe_raise_learning_rate": ("raise_learning_rate", {"value": 4e-4}),
    "swe_repeat_penalty": ("swe_repeat_penalty", {"weight": 0.3}),
    "swe_progress_credit": ("swe_progress_credit", {"credit": 0.3}),
    "swe_guided_tool_plan": ("swe_guided_tool_plan", {"value": 0.5}),
    "swe_grounded_calls_prompt": ("swe_grounded_calls_prompt", {}),
    "swe_guided_token_edits": ("swe_guided_token_edits", {"value": "token"}),
    "swe_guided_quoted_edits": ("swe_guided_quoted_edits", {"value": "quoted"}),
    # groups of 4 (the SWE example's 2, x2): with a plan share of 0.5, two guided members a group, so
    # guided edits are compared with each other and not only with a free member
    "swe_more_generations": ("more_generations", {"value": 4}),
}


def build_variant(name: str, seed: HarnessProgram) -> HarnessProgram:
    """The seed with the named entries applied in turn (``a+b`` combines)."""
    if name == "reference":
        return seed
    entries = {e.id: e for e in default_entries()}
    program = seed
    for part in name.split("+"):
        known = {**SINGLES, **SWE_SINGLES}
        if part not in known:
            raise SystemExit(f"unknown variant {part!r}; known: reference, {', '.join(known)}")
        entry_id, params = known[part]
        entry = entries[entry_id]
        reason = entry.unavailable(program)
        if reason:
            raise SystemExit(f"variant {name}: {entry_id} does not apply ({reason})")
        try:
            program = entry.apply(program, params)
        except OperatorError as err:   # a knob move relative to another seed's value, say: name it, no traceback
            raise SystemExit(f"variant {name}: {part} does not apply to this config's seed ({err})") from err
    return program


def run_one(cfg, name: str, program: HarnessProgram, seed: int, steps: int, root: Path,
            init_adapter: str | None = None, restart: bool = False) -> dict:
    """Trains ``program`` from the seed (or ``init_adapter``) for ``steps`` steps and verifies it on the
    test split."""
    from evotrainer.loop.compute.train_branch import train_branch

    run_dir = root / name / f"seed{seed}"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    genome = root / name / "genome.py"      # beside the version dirs: train_branch owns those
    genome.write_text(program.source)
    c = cfg.model_copy(deep=True)
    c.run_dir, c.harness, c.seed = str(run_dir), str(genome), seed
    c.train.steps = steps
    c.grpo = type(cfg.grpo)()          # the genome holds the knobs already
    t0 = time.perf_counter()
    # A seed killed mid-training continues from its checkpoint (train.save_steps), not from step 0.
    from evotrainer.loop.compute.checkpoint import CheckpointMismatch

    try:
        result = train_branch(c, validate=True, overwrite=True, init_adapter=init_adapter, restart=restart)
    except CheckpointMismatch as e:
        raise SystemExit(f"{name} seed {seed}: {e} (headroom.py: --restart)") from None
    earlier_s = result.elapsed_s - (time.perf_counter() - t0)   # the sittings before this one
    signals = test_signals(c, program, result.version_dir)
    steps_log = result.steps
    return {
        "variant": name, "seed": seed, "steps": steps, "genome_hash": program.hash, **signals,
        "skipped_steps": sum(1 for m in steps_log if m.get("skipped")),
        # guided_imitation: the imitated calls' mean negative log-likelihood, first step and last
        "imitation_nll": [m["imitation_nll"] for m in steps_log if "imitation_nll" in m][:1]
        + [m["imitation_nll"] for m in steps_log if "imitation_nll" in m][-1:],
        "train_reward_last8": statistics.fmean(m.get("reward_mean", 0.0) for m in steps_log[-8:]) if steps_log else None,
        "truncation_last8": statistics.fmean(m.get("truncation_rate", 0.0) for m in steps_log[-8:]) if steps_log else None,
        "dead_group_ratio_mean": statistics.fmean(m.get("dead_group_ratio", 0.0) for m in steps_log) if steps_log else None,
        "train_seconds": result.elapsed_s, "wall_s": earlier_s + time.perf_counter() - t0,
        "resumed_from_step": result.resumed_from,
    }


def test_signals(c, program: HarnessProgram, version_dir: Path, keep: str = "test.jsonl") -> dict:
    """The test split scored for the adapter in ``version_dir``, asked as the harness asks (its prompt
    hook), greedy as the loop's final pick is. SWE episodes are kept in ``rollouts/<keep>``."""
    import torch

    from evotrainer.domains import build_domain
    from evotrainer.genome.harness import Harness
    from evotrainer.policy.base_model import load_base_model
    from evotrainer.policy.collect import prompt_fn
    from evotrainer.policy.engine_choice import build_engine
    from evotrainer.policy.lora import LoraSettings, Policy

    domain = build_domain(c.domain)
    model, tok = load_base_model(c.model, dtype=c.dtype, device=c.device, seed=c.seed)
    policy = Policy(model, tok, LoraSettings(**c.lora.model_dump()))
    policy.load("v0", version_dir / "adapter")
    engine = build_engine(c, policy, "transformers")
    with Harness(program, sandbox=c.sandbox) as harness, torch.no_grad():
        return score_test(c, domain, engine, policy, "v0", prompt_fn(harness), save=version_dir / "rollouts" / keep)


def rescore(cfg, data: dict, path: Path, variants: list[str] | None, seeds: list[int]) -> None:
    """Scores the test split again, with this code, for the runs of ``data`` whose adapters are still in
    their run directories (and the start row): what changed is printed, the JSON rewritten."""
    root = Path(data["out"])
    print("the start on the test split ...", flush=True)
    data["base"] = base_scores(cfg, data.get("init_adapter"))
    for r in data["runs"]:
        run_dir = root / r["variant"] / f"seed{r['seed']}"
        if (variants and r["variant"] not in variants) or r["seed"] not in seeds:
            continue
        if not (run_dir / "adapter").is_dir():
            print(f"  {r['variant']} seed {r['seed']}: no adapter in {run_dir}, left as it was", flush=True)
            continue
        c = cfg.model_copy(deep=True)
        c.run_dir, c.harness, c.seed = str(run_dir), str(root / r["variant"] / "genome.py"), r["seed"]
        stamp = time.strftime("%Y%m%d-%H%M%S")   # a new file: earlier episodes stay as they were
        fresh = test_signals(c, HarnessProgram.from_file(c.harness), run_dir, keep=f"test.rescored-{stamp}.jsonl")
        for k, v in fresh.items():
            if k == "episode_scores":
                for rate, by_task in v.items():
                    old = statistics.fmean(r[k][rate].values()) if r.get(k, {}).get(rate) else None
                    print(f"  {r['variant']} seed {r['seed']} {rate}: {old} -> {statistics.fmean(by_task.values()):.3f}")
            r[k] = v
        r["rescored"] = time.strftime("%Y-%m-%d %H:%M")
    path.write_text(json.dumps(data, indent=1))


def score_test(cfg, domain, engine, policy, adapter, prompt, save: Path | None = None) -> dict:
    """The test split three ways, per task: greedy correctness (what users report); the share of
    ``SAMPLED_K`` sampled answers that are correct (seeds 0..k-1, the same for every variant, so two
    variants' samples share their random numbers), on the first ``SAMPLED_TASKS`` tasks; and the
    log-probability of the reference answer. The last two are candidate fitness signals for gates."""
    from evotrainer.policy.answer_logprob import answer_logprobs
    from evotrainer.policy.collect import verify
    from evotrainer.records.scores import heldout_accuracy, task_scores

    tasks = domain.tasks("test")
    greedy = verify(engine, domain, tasks, adapter, max_new_tokens=cfg.train.eval_max_new_tokens, prompt=prompt)
    if cfg.domain.name == "swe":   # episodes: what each one did; sampled episodes cost too much here
        if save is not None:
            from evotrainer.records.rollout import save_rollouts
            save_rollouts(save, greedy)
        return {"test_accuracy": heldout_accuracy(greedy),
                "test_scores": {t: s[0] for t, s in task_scores(greedy).items()},
                "episode_scores": episode_scores(greedy)}
    sampled = verify(engine, domain, tasks[:SAMPLED_TASKS], adapter, max_new_tokens=cfg.train.eval_max_new_tokens,
                     temperature=1.0, seeds=tuple(range(SAMPLED_K)), prompt=prompt)
    refs = [(t, domain.reference_completion(t)) for t in tasks]
    refs = [(t, r) for t, r in refs if r is not None]
    lls = answer_logprobs(policy, adapter, [prompt(t) for t, _ in refs], [r for _, r in refs])
    return {"test_accuracy": heldout_accuracy(greedy),
            "test_scores": {t: s[0] for t, s in task_scores(greedy).items()},
            "sampled_scores": {t: sum(s.values()) / len(s) for t, s in task_scores(sampled).items()},
            "answer_logprob": {t.id: v for (t, _), v in zip(refs, lls)}}


def base_scores(cfg, init_adapter: str | None = None) -> dict:
    """The untrained model (or ``init_adapter``) on the test split: the start every run is measured against."""
    from evotrainer.domains import build_domain
    from evotrainer.policy.base_model import load_base_model
    from evotrainer.policy.collect import default_prompt
    from evotrainer.policy.engine_choice import build_engine
    from evotrainer.policy.lora import LoraSettings, Policy


    domain = build_domain(cfg.domain)
    model, tok = load_base_model(cfg.model, dtype=cfg.dtype, device=cfg.device, seed=cfg.seed)
    policy = Policy(model, tok, LoraSettings(**cfg.lora.model_dump()))
    if init_adapter:
        policy.load("v0", init_adapter)
    return score_test(cfg, domain, build_engine(cfg, policy, "transformers"), policy,
                      "v0" if init_adapter else None, default_prompt)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="examples/quickstart.yaml")
    ap.add_argument("--model", default=None)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--n-test", type=int, default=128)
    ap.add_argument("--variants", default=None, help="comma list (default: reference and every single)")
    ap.add_argument("--combine", action="append", default=[], help="a+b[+c]: entries applied together")
    ap.add_argument("--out", default="runs/headroom", help="run directories (adapters, rollouts)")
    ap.add_argument("--json", required=True)
    ap.add_argument("--init-adapter", default=None, help="start every run from this LoRA adapter (a version's "
                    "adapter/ folder) instead of the base model")
    ap.add_argument("--restart", action="store_true", help="discard the checkpoint of a seed killed mid-training "
                    "(by default it continues from it) and train it from step 0")
    ap.add_argument("--report", action="store_true", help="print the table from --json and stop")
    ap.add_argument("--versus", default=None, help="with --report: another headroom JSON (one variant, the same start "
                    "and test split) whose runs stand in for the reference, paired over (task, seed)")
    ap.add_argument("--fires", action="store_true", help="print which library entries the reference runs' health "
                    "reports trigger, and stop")
    ap.add_argument("--signals", action="store_true", help="print which gate signal agrees with the test split, and stop")
    ap.add_argument("--rescore", action="store_true", help="score the test split again for the runs in --json whose "
                    "adapters are in --out (after a change to how it is scored), and stop")
    args = ap.parse_args(argv)
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if path.exists() else {"runs": []}
    if args.report or args.signals or args.fires:
        if args.versus:
            try:
                data = versus(data, json.loads(Path(args.versus).read_text()))
            except (OSError, ValueError) as e:
                raise SystemExit(f"--versus {args.versus}: {e}") from None
        print(report(data) if args.report else signals(data) if args.signals else fires(data))
        return
    cfg = load_config(args.config)
    if args.model:
        cfg.model = args.model
    cfg.domain.n_test = args.n_test
    cfg.domain.n_heldout = max(cfg.domain.n_heldout or 0, 8)
    cfg.train.eval_size = 8            # train_branch's own held-out check; the test split is what counts
    seed_prog = seed_program(cfg)
    singles = SWE_SINGLES if cfg.domain.name == "swe" else SINGLES
    names = args.variants.split(",") if args.variants else ["reference"] + [
        n for n in singles if not (cfg.domain.name == "code" and n in CODE_SKIP)]
    names += args.combine
    programs = {n: build_variant(n, seed_prog) for n in names}
    if data["runs"] and data.get("init_adapter") != args.init_adapter:
        raise SystemExit(f"{path} holds runs that started from {data.get('init_adapter') or 'the base model'}, not "
                         f"{args.init_adapter or 'the base model'}: use another --json")
    if args.init_adapter:
        from evotrainer.loop.compute.train_branch import check_init_adapter

        check_init_adapter(cfg, args.init_adapter)   # a wrong folder is said before any compute
    if args.rescore:
        rescore(cfg, data, path, args.variants.split(",") if args.variants else None,
                [int(s) for s in args.seeds.split(",")])
        print(report(data))
        return
    data.update(domain=cfg.domain.name, steps=args.steps, n_test=args.n_test, config=args.config, model=cfg.model,
                out=args.out, init_adapter=args.init_adapter)
    if "base" not in data:
        print(f"{'the init adapter' if args.init_adapter else 'untrained model'} on the test split ...", flush=True)
        data["base"] = base_scores(cfg, args.init_adapter)
        path.write_text(json.dumps(data, indent=1))
    done = {(r["variant"], r["seed"]) for r in data["runs"]}
    for seed in [int(s) for s in args.seeds.split(",")]:
        for name in names:
            if (name, seed) in done:
                continue
            print(f"[{time.strftime('%H:%M:%S')}] {name} seed {seed} ...", flush=True)
            r = run_one(cfg, name, programs[name], seed, args.steps, Path(args.out), args.init_adapter, args.restart)
            data["runs"].append(r)
            path.write_text(json.dumps(data, indent=1))
            print(f"  test {r['test_accuracy']:.3f}, {r['skipped_steps']} skipped steps, {r['wall_s']:.0f} s", flush=True)
    print(report(data))


if __name__ == "__main__":
    main()
