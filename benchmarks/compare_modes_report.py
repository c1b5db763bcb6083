"""compare_modes.py's tables, from its results alone: per protocol, each mode against `reference` on
the test split, with a 90% CI that resamples seeds, then tasks within them, beside the per-seed Δs (on
SWE also what each pick's test episodes did), and what the harness-changing modes tried."""

from __future__ import annotations

import statistics
from pathlib import Path

from headroom_report import episode_report


def label(child: dict) -> str:
    what = child["entry"] or child["factor"] or "?"
    if child["knob"]:
        what = f"{child['knob']}={child['new']}"
    return f"{child['operator']}:{what}"


def mean_score(scores: dict[str, list[float]]) -> float:
    return statistics.fmean(v for vs in scores.values() for v in vs)


PROTOCOL_TITLES = {"total": "equal total training steps", "depth": "equal lineage depth (exploration is extra steps)"}


def print_protocol(protocol: str, results: dict[str, list[dict]], base: float | None, args,
                   base_rates: dict | None = None) -> None:
    """One protocol's table: each mode against reference (and evolve against random-library) on the
    test split (seed-level CI, per-seed Δs), with the steps the pick's lineage and the whole run trained."""
    from evotrainer.fitness.seed_stats import seed_delta

    print(f"\n{PROTOCOL_TITLES.get(protocol, protocol)}: --steps {args.steps}; seeds {args.seeds}")
    split = "held-out" if args.no_test else "test"
    key = "scores" if args.no_test else "test_scores"
    print(f"{'mode':>22}  selection  {split} mean ± sd   {split} vs reference: mean Δ [90% CI, seeds]; per seed   "
          "overhead (excl./incl. proposals)  pick's lineage steps  total steps")
    ref = next((rs for n, rs in results.items() if n.partition("@")[0] == "reference"), None)
    rand = next((rs for n, rs in results.items() if n.partition("@")[0] == "random-library"), None)
    if base is not None:
        print(f"{'untrained model':>22}  -          {base:.3f}              (no training)")

    def paired(rows, other):   # seed-level: resamples seeds, then tasks within them; per-seed Δs beside
        return seed_delta({r["seed"]: r[key] for r in rows}, {r["seed"]: r[key] for r in other}).text()

    for mode, rows in results.items():
        sel = statistics.fmean(r["heldout"] for r in rows)
        accs = [mean_score(r[key]) for r in rows]
        sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
        ci = paired(rows, ref) if ref and mode.partition("@")[0] != "reference" else ""
        ov = statistics.fmean(r["overhead_share"] for r in rows)
        ov2 = statistics.fmean(r["overhead_share_incl_propose"] for r in rows)
        depth = ", ".join(str(r.get("lineage_steps", "?")) for r in rows)
        total = ", ".join(f"{r['train_steps']:.0f}" if "train_steps" in r else "?" for r in rows)
        print(f"{mode:>22}  {sel:.3f}      {statistics.fmean(accs):.3f} ± {sd:.3f}        {ci:<56} "
              f"{ov:.1%} / {ov2:.1%}                {depth:<20}  {total}")
        if rand and mode.partition("@")[0] == "evolve":
            print(f"{'':>22}  evolve vs random-library: {paired(rows, rand)}")
        starts = [r["seed"] for r in rows if r["best"] == "start"]
        if starts:
            print(f"{'':>22}  seeds {starts}: every trained version ranked below the untrained model; it is the pick")
    episodes = {n.partition("@")[0]: rs for n, rs in results.items() if rs and all("episode_scores" in r for r in rs)}
    if episodes and not args.no_test:
        ref_rows = {r["seed"]: r for r in episodes.get("reference", [])}
        print(episode_report({"base": {"episode_scores": base_rates}} if base_rates else {}, episodes, ref_rows, 0.9))


def report_children(results: dict[str, list[dict]]) -> None:
    """What the harness-changing modes tried, what was promoted, how often hypotheses held."""
    for mode, rows in results.items():
        kids = [c for r in rows for c in r.get("children", [])]
        if not kids:
            continue
        judged = [c for c in kids if c["verdict"] in ("confirmed", "refuted")]
        confirmed = sum(c["verdict"] == "confirmed" for c in judged)
        print(f"\n{mode}: {len(kids)} children over {len(rows)} runs; hypotheses judged {len(judged)}, "
              f"confirmed {confirmed} ({confirmed / len(judged):.0%})" if judged else
              f"\n{mode}: {len(kids)} children over {len(rows)} runs; no hypothesis could be judged")
        by: dict[str, list[dict]] = {}
        for c in kids:
            by.setdefault(label(c), []).append(c)
        untrained = [c for c in kids if c["status"] == "pruned" and c["paired_delta"] is None and c["verdict"] is None]
        if untrained:
            print(f"  {len(untrained)} of them never trained (proposed when the step budget was spent, or pruned "
                  "before their gate); they count in `tried` and `pruned` below")
        print(f"  {'intervention':<40} tried  promoted  kept(tie)  rejected  pruned  invalid  confirmed/judged  mean paired Δ")
        for name, cs in sorted(by.items(), key=lambda kv: -len(kv[1])):
            deltas = [c["paired_delta"] for c in cs if isinstance(c["paired_delta"], (int, float))]
            j = [c for c in cs if c["verdict"] in ("confirmed", "refuted")]
            print(f"  {name:<40} {len(cs):>5}  {sum(c['status'] == 'promoted' for c in cs):>8}  "
                  f"{sum(c['status'] == 'kept' for c in cs):>9}  {sum(c['status'] == 'rejected' for c in cs):>8}  "
                  f"{sum(c['status'] == 'pruned' for c in cs):>6}  "
                  f"{sum(c['invalid'] for c in cs):>7}  {sum(c['verdict'] == 'confirmed' for c in j):>9}/{len(j):<6}  "
                  + (f"{statistics.fmean(deltas):+.3f}" if deltas else "-"))
        for r in rows:
            on_path = {c["id"]: c for c in r.get("children", [])}
            steps = [label(on_path[v]) for v in r.get("lineage", []) if v in on_path]
            print(f"  seed {r['seed']}: best {r['best']} (test {r.get('test', float('nan')):.3f}) came through: "
                  + (" -> ".join(steps) if steps else "no harness change (a continuation of the seed harness)"))


def run_dir_of(name: str, row: dict, root: str | Path) -> Path:
    """Where a result row's run was kept: its own ``run_dir``, or (rows stored before that was recorded)
    ``--out``/MODE-PROTOCOL-sSEED, a depth row of the reference standing on its total run."""
    protocol = row.get("same_run_as") or name.partition("@")[2] or "total"
    return Path(row.get("run_dir") or Path(root) / f"{name.partition('@')[0]}-{protocol}-s{row['seed']}")


def library_draws(results: dict[str, list[dict]], root: str = "runs") -> str:
    """For each parent a harness-changing run proposed children from: the library entries its health
    report fired and each one's share of the library operator's draw (the run's own learned weights and
    skills aside), beside what was proposed. How likely a search is to chain the changes a headroom
    ladder needed, read from the runs' own reports (their directories, ``--out``)."""
    import json

    from evotrainer.genome.program import HarnessProgram
    from evotrainer.operators.evidence import Evidence
    from evotrainer.operators.library import LibraryOperator

    lines = ["the library's draw on each parent's health report (share of the draw per fired entry) and the "
             "children proposed from it"]
    for mode, rows in results.items():
        for r in rows:
            kids, run = r.get("children") or [], run_dir_of(mode, r, root)
            for pid in sorted({c["parents"][0] for c in kids if c["parents"]}):
                vdir = run / "versions" / pid
                if not (vdir / "health.json").is_file():
                    lines.append(f"  {mode} seed {r['seed']} {pid}: no health report at {vdir} (run from where the "
                                 "benchmark ran)")
                    continue
                evidence = Evidence(health_report=json.loads((vdir / "health.json").read_text()))
                library = LibraryOperator()   # the shipped entries at their own weights, nothing learned yet
                found, _ = library.applicable(HarnessProgram.from_file(vdir / "genome.py"), evidence)
                weights = library.draw_weights(evidence)
                total = sum(weights[a.entry.id] for a in found) or 1.0
                fired = ", ".join(f"{a.entry.id} {weights[a.entry.id] / total:.2f}" for a in found) or "none"
                made = ", ".join(label(c) for c in kids if c["parents"] and c["parents"][0] == pid)
                lines.append(f"  {mode} seed {r['seed']} {pid}: fires {fired}; proposed {made}")
    return "\n".join(lines)
