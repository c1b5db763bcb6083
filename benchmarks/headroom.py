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

Runs go seed by seed (every variant for seed 0, then seed 1, ...), each written to ``--json`` as it
finishes; a rerun skips what is there, so a stopped benchmark resumes. ``--report`` prints the table
from the JSON alone.
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
from evotrainer.fitness.episodes import edited, episode_calls, progress, ran_tests, resolved, valid_calls
from evotrainer.fitness.paired_stats import bootstrap_ci, paired_deltas
from evotrainer.genome.program import HarnessProgram
from evotrainer.loop.seed import seed_program
from evotrainer.operators.library import default_entries
from evotrainer.records.version import VersionDir

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
    "swe_raise_learning_rate": ("raise_learning_rate", {"value": 4e-4}),   # the SWE seed's 1e-4, x4
}
# What an episode did, per test task (fitness/episodes.py): the figures a SWE comparison reports.
EPISODE_RATES = ("resolved", "valid_call_rate", "edited", "ran_tests", "progress")


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
        program = entry.apply(program, params)
    return program


def run_one(cfg, name: str, program: HarnessProgram, seed: int, steps: int, root: Path) -> dict:
    """Trains ``program`` from the seed for ``steps`` steps and verifies it on the test split."""
    import torch

    from evotrainer.domains import build_domain
    from evotrainer.genome.harness import Harness
    from evotrainer.loop.train_branch import train_branch
    from evotrainer.policy.base_model import load_base_model
    from evotrainer.policy.collect import prompt_fn
    from evotrainer.policy.engine_choice import build_engine
    from evotrainer.policy.lora import LoraSettings, Policy

    run_dir = root / name / f"seed{seed}"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    genome = root / name / "genome.py"      # beside the version dirs: train_branch owns those
    genome.write_text(program.source)
    c = cfg.model_copy(deep=True)
    c.run_dir, c.harness, c.seed = str(run_dir), str(genome), seed
    c.train.steps = steps
    c.grpo = type(cfg.grpo)()          # the genome holds the knobs already
    t0 = time.perf_counter()
    result = train_branch(c, validate=True, overwrite=True)
    train_s = time.perf_counter() - t0
    # The test split, asked as the harness asks (its prompt hook), greedy as the loop's final pick is.
    domain = build_domain(c.domain)
    model, tok = load_base_model(c.model, dtype=c.dtype, device=c.device, seed=c.seed)
    policy = Policy(model, tok, LoraSettings(**c.lora.model_dump()))
    policy.load("v0", result.version_dir / "adapter")
    engine = build_engine(c, policy, "transformers")
    with Harness(program, sandbox=c.sandbox) as harness, torch.no_grad():
        signals = score_test(c, domain, engine, policy, "v0", prompt_fn(harness))
    steps_log = result.steps
    return {
        "variant": name, "seed": seed, "steps": steps, "genome_hash": program.hash, **signals,
        "skipped_steps": sum(1 for m in steps_log if m.get("skipped")),
        "train_reward_last8": statistics.fmean(m.get("reward_mean", 0.0) for m in steps_log[-8:]) if steps_log else None,
        "truncation_last8": statistics.fmean(m.get("truncation_rate", 0.0) for m in steps_log[-8:]) if steps_log else None,
        "dead_group_ratio_mean": statistics.fmean(m.get("dead_group_ratio", 0.0) for m in steps_log) if steps_log else None,
        "train_seconds": train_s, "wall_s": time.perf_counter() - t0,
    }


SAMPLED_TASKS, SAMPLED_K = 48, 4   # the held-out size a run affords, k answers each at the training temperature


def score_test(cfg, domain, engine, policy, adapter, prompt) -> dict:
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


def episode_scores(rollouts) -> dict[str, dict[str, float]]:
    """Per test task (greedy, one episode each): resolved, the share of its calls the environment
    accepted, whether it edited a file, ran the tests, made any of that progress."""
    out: dict[str, dict[str, float]] = {k: {} for k in EPISODE_RATES}
    for r in rollouts:
        calls = len(episode_calls(r))
        for k, v in (("resolved", resolved(r)), ("valid_call_rate", valid_calls(r) / calls if calls else 0.0),
                     ("edited", edited(r)), ("ran_tests", ran_tests(r)), ("progress", progress(r))):
            out[k][r.task_id] = float(v)
    return out


def base_scores(cfg) -> dict:
    """The untrained model on the test split (the start every run is measured against)."""
    from evotrainer.domains import build_domain
    from evotrainer.policy.base_model import load_base_model
    from evotrainer.policy.collect import default_prompt
    from evotrainer.policy.engine_choice import build_engine
    from evotrainer.policy.lora import LoraSettings, Policy


    domain = build_domain(cfg.domain)
    model, tok = load_base_model(cfg.model, dtype=cfg.dtype, device=cfg.device, seed=cfg.seed)
    policy = Policy(model, tok, LoraSettings(**cfg.lora.model_dump()))
    return score_test(cfg, domain, build_engine(cfg, policy, "transformers"), policy, None, default_prompt)


def _pairs(runs: list[dict]) -> dict[str, float]:
    return {f"{t}@{r['seed']}": v for r in runs for t, v in r["test_scores"].items()}


def report(data: dict, level: float = 0.9) -> str:
    runs = data["runs"]
    by_variant: dict[str, list[dict]] = {}
    for r in runs:
        by_variant.setdefault(r["variant"], []).append(r)
    ref = {r["seed"]: r for r in by_variant.get("reference", [])}
    lines = [f"headroom on {data['domain']}: {data['steps']} training steps per run, test split of "
             f"{data.get('n_test', '?')} tasks (greedy), paired with reference over (task, seed); "
             f"untrained model {data['base']['test_accuracy']:.3f}" if data.get("base") else ""]
    head = f"{'variant':<42} {'seeds':>5} {'test mean ± sd':>15} {'Δ vs reference [' + f'{level:.0%}' + ' CI]':>32} " \
           f"{'skipped':>8} {'trunc':>6}"
    lines += [head, "-" * len(head)]
    rows = []
    for name, rs in by_variant.items():
        accs = [r["test_accuracy"] for r in sorted(rs, key=lambda r: r["seed"])]
        paired = [r for r in rs if r["seed"] in ref]
        delta = ci = None
        if name != "reference" and paired:
            d = paired_deltas(_pairs(paired), _pairs([ref[r["seed"]] for r in paired]))
            delta, ci = float(d.mean()), bootstrap_ci(d, level=level)
        rows.append((delta if delta is not None else -9, name, rs, accs, delta, ci))
    for _, name, rs, accs, delta, ci in sorted(rows, key=lambda x: -x[0]):
        sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
        dtxt = f"{delta:+.3f} [{ci.low:+.3f}, {ci.high:+.3f}]" if delta is not None else "-"
        skipped = statistics.fmean(r["skipped_steps"] for r in rs)
        trunc = statistics.fmean(r["truncation_last8"] or 0 for r in rs)
        lines.append(f"{name:<42} {len(rs):>5} {statistics.fmean(accs):>7.3f} ± {sd:.3f} {dtxt:>32} "
                     f"{skipped:>8.1f} {trunc:>6.2f}   per seed: {' / '.join(f'{a:.3f}' for a in accs)}"
                     + seed_level(rs, ref, level))
    if any("episode_scores" in r for r in runs):
        lines += ["", episode_report(data, by_variant, ref, level), "", form_ladder(data, by_variant)]
    return "\n".join(lines)


def seed_level(rs: list[dict], ref: dict[int, dict], level: float) -> str:
    """The comparison at the level of seeds: each seed's Δ of test accuracy and, from 3 seeds on, a t
    interval over them. The (task, seed) bootstrap treats a seed's tasks as independent draws; seed
    noise is larger than that, and this interval is the one that sizes a claim across seeds."""
    deltas = [r["test_accuracy"] - ref[r["seed"]]["test_accuracy"] for r in sorted(rs, key=lambda r: r["seed"])
              if r["seed"] in ref and r is not ref.get(r["seed"])]
    if len(deltas) < 2:
        return ""
    text = f"; Δ per seed {' / '.join(f'{d:+.3f}' for d in deltas)}"
    if len(deltas) >= 3:
        from scipy import stats

        half = stats.t.ppf(0.5 + level / 2, len(deltas) - 1) * statistics.stdev(deltas) / len(deltas) ** 0.5
        mean = statistics.fmean(deltas)
        text += f" (over seeds {mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}])"
    return text


def form_ladder(data: dict, by_variant: dict[str, list[dict]]) -> str:
    """How far up the tool-call form ladder the training episodes got (read from the run directories'
    train rollouts, first two steps vs last two): the share of turns with a fenced block, with the
    ```tool fence, and the calls the environment could parse (a named tool). Free episodes only: a guided
    one (``guided_call_share``) is well-formed by construction."""
    out = Path(data.get("out") or "runs/headroom_swe")
    lines = ["training episodes' call form, first two steps -> last two (share of turns fenced / with the ```tool "
             "fence; named calls)"]
    guided: list[str] = []
    for name, rs in by_variant.items():
        for r in sorted(rs, key=lambda r: r["seed"]):
            every = VersionDir(out / name / f"seed{r['seed']}").rollouts("train")
            guided += guided_line(name, r["seed"], every)
            rows = [x for x in every if not (x.episode or {}).get("guided")]
            if not rows:
                continue
            steps = sorted({x.step for x in rows})
            parts = []
            for chosen in (steps[:2], steps[-2:]):
                turns = [str(t.get("text", "")) for x in rows if x.step in chosen
                         for t in x.turn_log or [] if isinstance(t, dict)]
                named = sum(1 for x in rows if x.step in chosen for c in x.tool_calls or []
                            if isinstance(c, dict) and c.get("name"))
                n = max(1, len(turns))
                parts.append(f"{sum('```' in t for t in turns) / n:.2f} / {sum('```tool' in t for t in turns) / n:.2f}; "
                             f"{named}")
            lines.append(f"  {name} seed {r['seed']}: {parts[0]} -> {parts[1]}")
    if guided:
        lines += ["", "training episodes, guided vs free (per episode; accepted calls per call)"] + guided
    return "\n".join(lines)


def guided_line(name: str, seed: int, rows) -> list[str]:
    """What a run's guided training episodes did (``guided_call_share``): accepted calls, edits, test
    runs, resolutions, against its free episodes; no line for a run without guided episodes."""
    if not any((x.episode or {}).get("guided") for x in rows):
        return []
    cells = []
    for label, want in (("guided", True), ("free", False)):
        eps = [x for x in rows if bool((x.episode or {}).get("guided")) == want]
        calls = sum(len(episode_calls(x)) for x in eps)
        cells.append(f"{label} {len(eps)}: accepted calls {sum(valid_calls(x) for x in eps) / max(1, calls):.2f}, "
                     f"edited {statistics.fmean(edited(x) for x in eps):.2f}, "
                     f"ran tests {statistics.fmean(ran_tests(x) for x in eps):.2f}, "
                     f"resolved {statistics.fmean(resolved(x) for x in eps):.2f}")
    return [f"  {name} seed {seed}: " + "; ".join(cells) + guided_logprob(rows)]


def guided_logprob(rows) -> str:
    """How close the free policy came to writing the guided calls itself: the policy's own (unguided)
    log-probability of the tokens the grammar let through, per token and over the first turn's first
    three tokens (where it decides whether to open a call at all; later turns can copy the first from
    the context), first step -> last. A greedy free call appears only once those opening tokens are
    the policy's own argmax."""
    guided = [x for x in rows if (x.episode or {}).get("guided")]
    steps = sorted({x.step for x in guided})

    def at(step: int) -> tuple[float, float]:
        every, opening = [], []
        for x in (x for x in guided if x.step == step):
            lps = iter(x.logprobs)
            turn: list[float] = []
            first = True
            for m in list(x.completion_mask) + [0]:      # a turn is a run of sampled tokens
                if m:
                    turn.append(next(lps))
                elif turn:
                    every += turn
                    opening += turn[:3] if first else []
                    turn, first = [], False
        return statistics.fmean(every or [float("nan")]), statistics.fmean(opening or [float("nan")])

    (a, c), (b, d) = at(steps[0]), at(steps[-1])
    return (f"; the policy's own log p of the guided calls, step {steps[0]} -> {steps[-1]}: per token "
            f"{a:.2f} -> {b:.2f}, the first turn's first 3 tokens {c:.2f} -> {d:.2f}")


def episode_report(data: dict, by_variant: dict[str, list[dict]], ref: dict[int, dict], level: float) -> str:
    """Per variant, each episode rate on the test split (mean over seeds and tasks) and its paired
    difference with the reference over (task, seed), with the bootstrap CI."""
    def pairs(rs: list[dict], key: str) -> dict[str, float]:
        return {f"{t}@{r['seed']}": v for r in rs for t, v in r["episode_scores"][key].items()}

    base = (data.get("base") or {}).get("episode_scores")
    lines = ["episode rates on the test split (greedy; per episode: resolved, share of calls accepted, edited, "
             "ran tests, any progress), paired with reference over (task, seed)"
             + ("; untrained: " + ", ".join(f"{k} {statistics.fmean(base[k].values()):.3f}" for k in EPISODE_RATES)
                if base else "")]
    for name, rs in by_variant.items():
        cells = []
        for k in EPISODE_RATES:
            m = statistics.fmean(v for r in rs for v in r["episode_scores"][k].values())
            paired = [r for r in rs if r["seed"] in ref]
            if name != "reference" and paired:
                d = paired_deltas(pairs(paired, k), pairs([ref[r["seed"]] for r in paired], k))
                ci = bootstrap_ci(d, level=level)
                cells.append(f"{k} {m:.3f} ({float(d.mean()):+.3f} [{ci.low:+.3f}, {ci.high:+.3f}])")
            else:
                cells.append(f"{k} {m:.3f}")
        lines.append(f"  {name} ({len(rs)} seed(s)): " + "; ".join(cells))
    return "\n".join(lines)


def _t(a: dict, b: dict, keys: list[str]) -> tuple[float, float]:
    """Mean paired difference of a and b over keys, and its t statistic (nan when it has no spread)."""
    d = [a[k] - b[k] for k in keys]
    sd = statistics.stdev(d) if len(d) > 1 else 0.0
    return statistics.fmean(d), (statistics.fmean(d) / (sd / len(d) ** 0.5) if sd > 0 else float("nan"))


def signals(data: dict) -> str:
    """Which per-task signal a gate on ``SAMPLED_TASKS`` held-out tasks should read. For every pair of
    trained runs of one seed (and the untrained model against each), each signal's paired difference
    on the first ``SAMPLED_TASKS`` test tasks is set against the greedy difference on the other test
    tasks (disjoint, so the truth shares no task with the signal): a signal is worth its t statistic
    only where it points the same way. Last, the greedy gate's minimum detectable effect at one-sided
    5% and 80% power, from the pairs' discordant-task rate, at the draw sizes a run could afford."""
    base = data["base"]
    if len(base["test_scores"]) <= len(base["sampled_scores"]):
        return (f"the test split holds no task beyond the first {len(base['sampled_scores'])}: nothing to set the "
                "signals against (run with --n-test above it)")
    models = [("untrained", None, base)] + [(r["variant"], r["seed"], r) for r in data["runs"]]
    pairs = [(a, b) for i, a in enumerate(models) for b in models[i + 1:]
             if a[1] is None or b[1] is None or a[1] == b[1]]
    head = f"{'pair':<52} {'truth (other)':>13} {'greedy Δ, t':>14} {'sampled Δ, t':>14} {'answer LL Δ, t':>15}"
    lines = [f"signals on the first {SAMPLED_TASKS} test tasks against greedy on the rest (k = {SAMPLED_K} "
             "sampled answers at T = 1; answer LL: log-probability of the reference answer)", head, "-" * len(head)]
    agree = {"greedy": [], "sampled": [], "answer LL": []}
    discordant = []
    for (na, sa, a), (nb, sb, b) in pairs:
        first = list(a["sampled_scores"])
        rest = [k for k in a["test_scores"] if k not in a["sampled_scores"]]
        truth = statistics.fmean(a["test_scores"][k] - b["test_scores"][k] for k in rest)
        got = {"greedy": _t(a["test_scores"], b["test_scores"], first),
               "sampled": _t(a["sampled_scores"], b["sampled_scores"], first),
               "answer LL": _t(a["answer_logprob"], b["answer_logprob"], first)}
        discordant.append(statistics.fmean(a["test_scores"][k] != b["test_scores"][k] for k in a["test_scores"]))
        for name, (m, _) in got.items():
            if truth != 0 and m != 0:
                agree[name].append((m > 0) == (truth > 0))
        label = f"{na}{'' if sa is None else f'@{sa}'} - {nb}{'' if sb is None else f'@{sb}'}"
        lines.append(f"{label:<52} {truth:>+13.3f} " + " ".join(
            f"{m:>+7.3f} {t:>+6.2f}" + (" " if n == "answer LL" else "") for n, (m, t) in got.items()))
    lines.append("")
    for name, ok in agree.items():
        lines.append(f"{name:<10} points the way of the other tasks' greedy difference in {sum(ok)} of {len(ok)} pairs")
    rate = statistics.fmean(discordant)
    mde = ", ".join(f"{n} tasks {2.486 * (rate / n) ** 0.5:.3f}" for n in (24, 48, 96, 128, 256))
    lines.append(f"greedy gate MDE (discordant-task rate {rate:.2f}): {mde}")
    return "\n".join(lines)


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
    ap.add_argument("--report", action="store_true", help="print the table from --json and stop")
    ap.add_argument("--signals", action="store_true", help="print which gate signal agrees with the test split, and stop")
    args = ap.parse_args(argv)
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if path.exists() else {"runs": []}
    if args.report or args.signals:
        print(report(data) if args.report else signals(data))
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
    data.update(domain=cfg.domain.name, steps=args.steps, n_test=args.n_test, config=args.config, model=cfg.model,
                out=args.out)
    if "base" not in data:
        print("untrained model on the test split ...", flush=True)
        data["base"] = base_scores(cfg)
        path.write_text(json.dumps(data, indent=1))
    done = {(r["variant"], r["seed"]) for r in data["runs"]}
    for seed in [int(s) for s in args.seeds.split(",")]:
        for name in names:
            if (name, seed) in done:
                continue
            print(f"[{time.strftime('%H:%M:%S')}] {name} seed {seed} ...", flush=True)
            r = run_one(cfg, name, programs[name], seed, args.steps, Path(args.out))
            data["runs"].append(r)
            path.write_text(json.dumps(data, indent=1))
            print(f"  test {r['test_accuracy']:.3f}, {r['skipped_steps']} skipped steps, {r['wall_s']:.0f} s", flush=True)
    print(report(data))


if __name__ == "__main__":
    main()
