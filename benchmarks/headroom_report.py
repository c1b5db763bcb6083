"""The headroom benchmark's report, read from its JSON alone (``benchmarks/headroom.py --report``):
the table against the reference with seed-level CIs (seeds, then tasks within them); on SWE, what each test episode did,
the training episodes' call-form ladder and the guided-vs-free line; ``--signals``, which per-task
signal a gate should read; ``--fires``, which library entries the reference runs' own health reports
trigger (the candidates a diagnosing search would propose)."""

from __future__ import annotations

import statistics
from pathlib import Path

from evotrainer.fitness.episodes import (broke_tests, edited, episode_calls, progress, ran_tests, resolved, valid_calls,
                                        working_call_share)
from evotrainer.fitness.seed_stats import seed_delta
from evotrainer.records.version import VersionDir

SAMPLED_TASKS, SAMPLED_K = 48, 4   # the held-out size a run affords, k answers each at the training temperature
# What an episode did, per test task (fitness/episodes.py): the figures a SWE comparison reports.
EPISODE_RATES = ("resolved", "valid_call_rate", "working_calls", "edited", "ran_tests", "progress", "broke_tests")


def episode_scores(rollouts) -> dict[str, dict[str, float]]:
    """Per test task (greedy, one episode each): resolved, the share of its calls the environment
    accepted, the share of its working calls (all but submit) accepted, what the gate breaks a tie at
    nothing resolved with, whether it edited a file, ran the tests, made any of that progress, handed in
    a patch that breaks a test that passed before it."""
    out: dict[str, dict[str, float]] = {k: {} for k in EPISODE_RATES}
    for r in rollouts:
        calls = len(episode_calls(r))
        for k, v in (("resolved", resolved(r)), ("valid_call_rate", valid_calls(r) / calls if calls else 0.0),
                     ("working_calls", working_call_share(r)),
                     ("edited", edited(r)), ("ran_tests", ran_tests(r)), ("progress", progress(r)),
                     ("broke_tests", broke_tests(r))):
            out[k][r.task_id] = float(v)
    return out


def run_dir(data: dict, r: dict) -> Path:
    """Where a run's adapter and rollouts are: its own ``dir`` (a run merged in by :func:`versus`), else
    ``<out>/<variant>/seed<k>``."""
    return Path(r.get("dir") or Path(data.get("out") or "runs/headroom_swe") / r["variant"] / f"seed{r['seed']}")


def versus(data: dict, other: dict) -> dict:
    """``data`` with ``other``'s runs as its reference (``headroom.py --report --versus``): two benchmark
    files that started from the same adapter, with the same seeds and test issues, compared paired. Each
    merged run keeps its directory; ``data``'s own reference runs, if any, are left out."""
    if data.get("init_adapter") != other.get("init_adapter") or data.get("n_test") != other.get("n_test"):
        raise ValueError("--versus needs runs from the same start (init adapter) and the same test split size: "
                         f"{data.get('init_adapter')} / {data.get('n_test')} vs {other.get('init_adapter')} / "
                         f"{other.get('n_test')}")
    names = {r["variant"] for r in other["runs"]}
    if len(names) != 1:
        raise ValueError(f"--versus takes a file with one variant, not {sorted(names)}")
    own = [r for r in data["runs"] if r["variant"] != "reference"]
    merged = [{**r, "variant": "reference", "dir": str(run_dir(other, r))} for r in other["runs"]]
    return {**data, "runs": own + merged, "versus": names.pop()}


def test_rollouts(run: VersionDir) -> list:
    """A run's test episodes as last scored: the newest ``--rescore`` file, else the first scoring's."""
    rescored = sorted((run.path / "rollouts").glob("test.rescored-*.jsonl"))
    return run.rollouts(rescored[-1].name[: -len(".jsonl")] if rescored else "test")


def backfill(data: dict) -> None:
    """Rates added after a run was scored, read from its stored test episodes (no compute); a run
    whose directory is gone keeps what it has, and the report leaves that rate out."""
    for r in data["runs"]:
        scores = r.get("episode_scores")
        if scores is None or set(EPISODE_RATES) <= set(scores):
            continue
        test = test_rollouts(VersionDir(run_dir(data, r)))
        if test:
            fresh = episode_scores(test)
            for k in EPISODE_RATES:
                scores.setdefault(k, fresh[k])


def report(data: dict, level: float = 0.9) -> str:
    runs = data["runs"]
    by_variant: dict[str, list[dict]] = {}
    for r in runs:
        by_variant.setdefault(r["variant"], []).append(r)
    ref = {r["seed"]: r for r in by_variant.get("reference", [])}
    if any("episode_scores" in r for r in runs):
        backfill(data)
    lines = [f"reference: the runs of {data['versus']} (--versus)"] if data.get("versus") else []
    lines += [f"headroom on {data['domain']}: {data['steps']} training steps per run, test split of "
             f"{data.get('n_test', '?')} tasks (greedy), paired with reference within each seed, the CI resampling "
             f"seeds, then tasks; "
             f"untrained model {data['base']['test_accuracy']:.3f}" if data.get("base") else ""]
    head = f"{'variant':<42} {'seeds':>5} {'test mean ± sd':>15} {'Δ vs reference [' + f'{level:.0%}' + ' CI, seeds]':>32} " \
           f"{'skipped':>8} {'trunc':>6}"
    lines += [head, "-" * len(head)]
    rows = []
    for name, rs in by_variant.items():
        accs = [r["test_accuracy"] for r in sorted(rs, key=lambda r: r["seed"])]
        paired = [r for r in rs if r["seed"] in ref]
        d = seed_delta({r["seed"]: r["test_scores"] for r in paired},
                       {r["seed"]: ref[r["seed"]]["test_scores"] for r in paired}, level) \
            if name != "reference" and paired else None
        rows.append((d.mean if d is not None else -9, name, rs, accs, d))
    for _, name, rs, accs, d in sorted(rows, key=lambda x: -x[0]):
        sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
        dtxt = f"{d.mean:+.3f} [{d.ci90[0]:+.3f}, {d.ci90[1]:+.3f}]" if d is not None else "-"
        skipped = statistics.fmean(r["skipped_steps"] for r in rs)
        trunc = statistics.fmean(r["truncation_last8"] or 0 for r in rs)
        lines.append(f"{name:<42} {len(rs):>5} {statistics.fmean(accs):>7.3f} ± {sd:.3f} {dtxt:>32} "
                     f"{skipped:>8.1f} {trunc:>6.2f}   per seed: {' / '.join(f'{a:.3f}' for a in accs)}"
                     + (f"; Δ per seed {' / '.join(f'{v:+.3f}' for v in d.per_seed.values())}" if d else ""))
    if any("episode_scores" in r for r in runs):
        lines += ["", episode_report(data, by_variant, ref, level), "", form_ladder(data, by_variant)]
    return "\n".join(lines)


def form_ladder(data: dict, by_variant: dict[str, list[dict]]) -> str:
    """How far up the tool-call form ladder the training episodes got (read from the run directories'
    train rollouts, first two steps vs last two): the share of turns with a fenced block, with the
    ```tool fence, and the calls the environment could parse (a named tool). Free episodes only: a guided
    one (``guided_call_share``) is well-formed by construction."""
    lines = ["training episodes' call form, first two steps -> last two (share of turns fenced / with the ```tool "
             "fence; named calls)"]
    guided: list[str] = []
    patches: list[str] = []
    for name, rs in by_variant.items():
        for r in sorted(rs, key=lambda r: r["seed"]):
            run = VersionDir(run_dir(data, r))
            every = run.rollouts("train")
            guided += guided_line(name, r["seed"], every)
            patches += patch_line(name, r["seed"], run)
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
    if patches:
        lines += ["", "handed-in patches that apply, and of those the ones that break a test that passed before "
                  "(PASS_TO_PASS): test split (greedy); training, guided / free"] + patches
    return "\n".join(lines)


def patch_line(name: str, seed: int, run: VersionDir) -> list[str]:
    """What the edits a run handed in did to the repository: the vandalism a credit for any applied edit
    paid for shows as patches that apply and break passing tests. No line for a run that applied none."""
    def count(rows) -> str:
        applied = [x for x in rows if (x.hidden or x.visible).get("patch_applied")]
        return f"{len(applied)} of {len(rows)} applied, {sum(broke_tests(x) for x in applied)} break tests"

    test, train = test_rollouts(run), run.rollouts("train")
    if not any((x.hidden or x.visible).get("patch_applied") for x in [*test, *train]):
        return []
    steered = [x for x in train if (x.episode or {}).get("guided")]
    free = [x for x in train if not (x.episode or {}).get("guided")]
    return [f"  {name} seed {seed}: test {count(test)}; training guided {count(steered)} / free {count(free)}"]


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
    """Per variant, each episode rate on the test split (mean over seeds and tasks) and its difference
    with the reference, paired within each seed, with a CI that resamples seeds, then tasks."""
    base = (data.get("base") or {}).get("episode_scores")
    rows = [r for rs in by_variant.values() for r in rs] + list(ref.values())
    known = {k for k in EPISODE_RATES if all(k in r["episode_scores"] for r in rows)}
    untrained = [f"{k} {statistics.fmean(base[k].values()):.3f}" for k in EPISODE_RATES if k in known and k in base] \
        if base else []
    lines = ["episode rates on the test split (greedy; per episode: resolved, share of calls accepted, edited, "
             "ran tests, any progress, a patch breaking a passing test), paired with reference within each seed, the "
             "CI resampling seeds, then tasks"
             + ("; untrained: " + ", ".join(untrained) if untrained else "")]
    for name, rs in by_variant.items():
        cells = []
        for k in EPISODE_RATES:
            if k not in known:
                continue   # a rate added after some of these runs were scored
            m = statistics.fmean(v for r in rs for v in r["episode_scores"][k].values())
            paired = [r for r in rs if r["seed"] in ref]
            if name != "reference" and paired:
                d = seed_delta({r["seed"]: r["episode_scores"][k] for r in paired},
                               {r["seed"]: ref[r["seed"]]["episode_scores"][k] for r in paired}, level)
                cells.append(f"{k} {m:.3f} ({d.mean:+.3f} [{d.ci90[0]:+.3f}, {d.ci90[1]:+.3f}])")
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


def fires(data: dict) -> str:
    """Which library entries each reference run's own health report triggers (the candidates the
    ``library`` operator would propose from that state), set against the screen: an entry that fires
    and beats the recipe is what a diagnosing search should find; one that beats it without firing is
    out of the search's sight. Reads the reference runs' directories (``--out``) in a sandbox."""
    from evotrainer.fitness.cache import CachedVersion
    from evotrainer.fitness.health import health_report
    from evotrainer.operators.evidence import Evidence
    from evotrainer.operators.library import applicable_entries, default_entries

    acc: dict[str, dict[int, float]] = {}
    for r in data["runs"]:
        acc.setdefault(r["variant"], {})[r["seed"]] = r["test_accuracy"]
    ref = acc.get("reference", {})
    if not ref:
        return "no reference run in the JSON: nothing to diagnose"

    def delta(name: str) -> str:
        seeds = sorted(set(acc.get(name, {})) & set(ref))
        if not seeds:
            return "not screened"
        return f"{statistics.fmean(acc[name][s] - ref[s] for s in seeds):+.3f} over {len(seeds)} seed(s)"

    lines = ["library entries the reference runs' health reports trigger (Δ: the entry's screened test "
             "accuracy minus the reference's, mean over paired seeds)"]
    fired_any: set[str] = set()
    for seed in sorted(ref):
        run_dir = Path(data.get("out") or "runs/headroom") / "reference" / f"seed{seed}"
        if not (run_dir / "meta.json").exists():
            lines.append(f"  seed {seed}: no run directory at {run_dir} (run from where the benchmark ran)")
            continue
        version = CachedVersion.load(run_dir)
        rep = health_report(version).to_dict()
        found, _ = applicable_entries(version.program, Evidence(health_report=rep), default_entries())
        alerts = sorted(a["name"] for a in rep.get("alerts") or [] if isinstance(a, dict) and a.get("name"))
        lines.append(f"  reference seed {seed}: alerts {', '.join(alerts) or 'none'}")
        for a in found:
            fired_any.add(a.entry.id)
            lines.append(f"    fires {a.entry.id:<26} {delta(a.entry.id)}")
    unseen = sorted(n for n in acc if n != "reference" and "+" not in n and n not in fired_any)
    if unseen:
        lines.append("  screened, fired on no reference report: " + "; ".join(f"{n} {delta(n)}" for n in unseen))
    return "\n".join(lines)
