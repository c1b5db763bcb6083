"""reference vs evolve vs random-library (vs recipe-search) on any domain, several seeds, two protocols.

Each (protocol, mode, seed) is a full run of the loop with the same engine, data, held-out tasks and
seeds. Two fair views of the same question (FIELD-NOTES), both reported:

- **total**: equal total training steps (``budget.train_steps = --steps`` for every mode). The
  search's cost is counted: siblings, controls and children share the budget, so the pick's lineage
  is shallower than the fixed recipe's one lineage (the exploit phase, on by default with a step
  budget, gives the end of the budget to the elite).
- **depth**: equal lineage depth, the method paper's protocol. Every mode runs ``--steps /
  steps_per_generation`` generations with no step budget, so the final pick has trained as many steps
  on its lineage as the reference; the harness-changing modes explore in the first half (exploit
  share 0.5 of the generations) and their exploration is reported as extra steps. The reference is
  one lineage of ``--steps`` steps under both protocols, so its total run stands for both (trained
  once; two runs of one config differ only by float noise, which is no reason to pay for it twice).

A run's result is its final pick: the best valid survivor on the held-out selection draw (or the
untrained model, when every survivor ranks below it), which the run itself verifies on the test split
at its end (nothing in the loop sees test). The selection score favours modes that try more versions
(a max over more draws), so the paired bootstrap CIs against `reference` are over (task, seed) pairs
of the test score. Prints each protocol's table (mean ± sd over seeds), the steps each mode spent,
and the share of wall time spent outside generation and gradient steps, with where that time went.
On SWE it also prints what each pick's test episodes did (calls accepted, edited, ran tests, any
progress), paired with `reference` the same way: the figures left to compare where nothing resolves.

    python benchmarks/compare_modes.py [--config examples/quickstart.yaml] [--seeds 0,1,2] [--steps 12]
    python benchmarks/compare_modes.py --model tiny-random --steps 4 --seeds 0,1   # smoke run
    python benchmarks/compare_modes.py --config examples/evolve_swe.yaml --modes reference,evolve --steps 8

Runs go seed by seed (reference, then the other modes, for seed 0, then seed 1, ...) so that a
stopped benchmark still holds paired results. With ``--json`` every finished run is written at once
and a rerun with the same ``--json`` skips the runs already there (delete the file to start over).
For the modes that change harnesses, each run also records every child it tried: the operator, the
intervention, its gate status, the paired held-out delta and the post-training verdict on its
hypothesis; the summary prints confirmation rates and the interventions on the winner's lineage.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from evotrainer.policy.collect import verify
from evotrainer.records.scores import by_seed, task_scores
from evotrainer.config import load_config
from evotrainer.fitness.episodes import is_episode
from evotrainer.loop.experiment import Experiment
from evotrainer.loop.stages.start import START
from evotrainer.records.version import VersionDir

# benchmarks/: the script's folder
from compare_modes_report import library_draws, mean_score, print_protocol, report_children, run_dir_of
from headroom_report import EPISODE_RATES, episode_scores

MODES = ("reference", "evolve", "random-library")
PROTOCOLS = ("total", "depth")


def best_version(exp: Experiment):
    """The run's own final pick (its best valid survivor on the selection draw, or the untrained model
    when every survivor ranks below it), as `evotrainer run` reports it; runs without one fall back to
    the best settled version on the gate draw."""
    from evotrainer.loop.stages.start import START, start_dir
    from evotrainer.records.version import BranchVersion

    final = exp.state.final or {}
    if final.get("version") == START:   # the start as a version record: its draws, no steps
        return BranchVersion(id=START, base_model=exp.cfg.model, genome_hash="", parents=[], metrics={
            "heldout_accuracy": exp.state.start["heldout_accuracy"],
            "selection_accuracy": exp.state.start["selection_accuracy"]}), start_dir(exp)
    if final.get("version"):
        return exp.vdir(final["version"]).meta(), exp.vdir(final["version"])
    metas = [exp.vdir(v).meta() for v in exp.versions()]
    valid = [m for m in metas if m.status in ("kept", "promoted", "pruned", "rejected") and "heldout_accuracy" in m.metrics]
    settled = [m for m in valid if m.status in ("kept", "promoted", "pruned")] or valid
    best = max(settled, key=lambda m: (m.metrics["heldout_accuracy"], -m.generation))
    return best, exp.vdir(best.id)


CORE = ("gen_seconds", "train_seconds", "verify_seconds")   # generation and gradient steps


def timing(exp: Experiment) -> dict[str, float]:
    """Wall time, the part in generation and gradient steps, and where the rest went (``*_seconds``
    the loop records: model load, adapters, health reports, gates, MLflow, backtests, the end)."""
    used = exp.state.budget_used
    wall = used.get("wall_time_s", 0.0)
    core = sum(used.get(k, 0.0) for k in CORE)
    llm = used.get("propose_seconds", 0.0)
    parts = {k[: -len("_seconds")]: v for k, v in used.items() if k.endswith("_seconds") and k not in CORE}
    parts["unaccounted"] = wall - core - sum(parts.values())
    return {"wall_s": wall, "gen_and_grad_s": core, "propose_s": llm, "overhead_parts_s": parts,
            "overhead_share": max(0.0, wall - core - llm) / wall if wall else float("nan"),
            "overhead_share_incl_propose": max(0.0, wall - core) / wall if wall else float("nan")}


def test_scores(exp: Experiment, vid: str) -> dict[str, list[float]]:
    """The pick's test-split scores: the run verified its final pick on the test split at its end
    (under the pick's own harness, so an evolved prompt is asked as it was trained); a version
    without those rollouts is verified here the same way."""
    from evotrainer.loop.stages.final_pick import TEST, report_test

    rollouts = exp.vdir(vid).rollouts(TEST)
    if not rollouts:
        report_test(exp)
        rollouts = exp.vdir(vid).rollouts(TEST)
    return by_seed(task_scores(rollouts))


def children(exp: Experiment) -> list[dict]:
    """Every proposed child: who proposed what, how its gate went and what became of its hypothesis."""
    out = []
    for vid in exp.versions():
        m = exp.vdir(vid).meta()
        if m.operator is None:
            continue
        iv = m.intervention or {}
        details = iv.get("details") or {}
        paired = (m.decision or {}).get("paired") or {}
        out.append({"id": vid, "parents": m.parents, "generation": m.generation, "operator": m.operator,
                    "factor": m.factor, "entry": details.get("entry"), "knob": details.get("knob"),
                    "new": details.get("new"), "hypothesis": iv.get("hypothesis"), "status": m.status,
                    "invalid": m.is_invalid, "heldout": m.heldout_accuracy,
                    "paired_delta": paired.get("mean_delta"), "ci": [paired.get("ci_low"), paired.get("ci_high")],
                    "verdict": (m.hypothesis or {}).get("verdict"), "verdict_reason": (m.hypothesis or {}).get("reason")})
    return out


def lineage(exp: Experiment, vid: str) -> list[str]:
    """``vid`` and its first parents back to the seed, oldest first."""
    chain = []
    while vid:
        chain.append(vid)
        parents = exp.vdir(vid).meta().parents
        vid = parents[0] if parents else None
    return chain[::-1]


def lineage_steps(exp: Experiment, vid: str) -> int:
    """Training steps behind ``vid``: its own and its first parents' back to the seed. At an equal
    total budget a population spreads its steps over siblings, so this is how deep the pick trained."""
    return sum(len(exp.vdir(v).steps()) for v in lineage(exp, vid))


def override(cfg, item: str) -> None:
    import yaml

    key, sep, value = item.partition("=")
    if not sep:
        raise SystemExit(f"--set {item!r}: expected KEY=VALUE, e.g. train.carry_optimizer=true")
    *path, name = key.split(".")
    target = cfg
    for part in path:
        target = getattr(target, part)
    if name not in type(target).model_fields:
        raise SystemExit(f"--set {item!r}: no field {name!r} in {'.'.join(path) or 'the config'}")
    setattr(target, name, yaml.safe_load(value))


def episode_rates(rollouts) -> dict | None:
    """On SWE, what each test episode did (resolved, calls accepted, edited, ran tests, progress): when
    every run resolves nothing, these are the figures a comparison can still tell apart."""
    return episode_scores(rollouts) if rollouts and all(is_episode(r) for r in rollouts) else None


def backfill_episode_rates(results: dict[str, list[dict]], root: Path) -> None:
    """Rows stored before the rates (or one of them) were recorded get them from their kept run dirs
    (``--out``)."""
    for name, rows in results.items():
        for r in rows:
            if set(EPISODE_RATES) <= set(r.get("episode_scores", {})) or "test_scores" not in r:
                continue
            run = run_dir_of(name, r, root)
            vd = VersionDir(run / START if r["best"] == START else run / "versions" / r["best"])
            rates = episode_rates(vd.rollouts("test"))
            if rates is not None:
                r["episode_scores"] = rates


def run_mode(config: str, mode: str, protocol: str, seed: int, steps: int, run_dir: Path, model: str | None = None,
             steps_per_generation: int | None = None, eval_size: int | None = None, sets: list[str] = (),
             test: bool = True) -> dict:
    """One full run of the loop in ``mode`` under ``protocol`` (total: ``steps`` training steps in all;
    depth: the pick's lineage trains ``steps``), and its result row (the pick, its held-out and test
    scores, steps, wall time; ``_exp`` is the finished experiment, for the caller to drop)."""
    cfg = load_config(config)
    cfg.seed, cfg.evolution.mode = seed, mode
    cfg.evolution.budget.wall_time_s = None
    cfg.evolution.user_skills = False
    if mode == "reference":
        cfg.evolution.population_size = 1
    if model:
        cfg.model = model
    if steps_per_generation:
        cfg.evolution.steps_per_generation = steps_per_generation
    if eval_size:
        cfg.train.eval_size = eval_size
    for item in sets:
        override(cfg, item)
    if protocol == "total":
        cfg.evolution.budget.train_steps = steps
        cfg.evolution.generations = 1000  # the step budget ends every run
    else:   # depth: the pick's lineage trains --steps steps; exploration is extra
        k = cfg.evolution.steps_per_generation
        if steps % k:
            raise SystemExit(f"--steps {steps} is not a multiple of steps_per_generation {k}")
        cfg.evolution.budget.train_steps = None
        cfg.evolution.generations = steps // k
        if cfg.evolution.exploit_share is None:
            cfg.evolution.exploit_share = 0.5
    cfg.run_dir = str(run_dir)
    exp = Experiment(cfg)
    exp.run()
    best, best_dir = best_version(exp)
    started = best.id == "start"   # every trained version ranked below the untrained model
    scores = by_seed(task_scores(best_dir.rollouts("heldout")))
    selection = best.metrics.get("selection_accuracy", best.metrics["heldout_accuracy"])
    row = {"seed": seed, "run_dir": cfg.run_dir, "best": best.id, "heldout": selection,
           "gate_heldout": best.metrics["heldout_accuracy"],
           "scores": scores, "lineage_steps": 0 if started else lineage_steps(exp, best.id),
           "train_steps": exp.state.budget_used.get("train_steps", 0), "stop_reason": exp.state.stop_reason,
           "versions": len(exp.versions()), **timing(exp)}
    if mode != "reference":
        row["children"] = children(exp)
        row["lineage"] = [] if started else lineage(exp, best.id)
    if test:
        row["test_scores"] = (by_seed(task_scores(best_dir.rollouts("test"))) if started
                              else test_scores(exp, best.id))
        row["test"] = mean_score(row["test_scores"])
        if (rates := episode_rates(best_dir.rollouts("test"))) is not None:
            row["episode_scores"] = rates
    row["_exp"] = exp
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="examples/quickstart.yaml")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=12, help="training-step budget of every run")
    ap.add_argument("--model", default=None)
    ap.add_argument("--steps-per-generation", type=int, default=None)
    ap.add_argument("--eval-size", type=int, default=None, help="held-out tasks verified per version")
    ap.add_argument("--modes", default=",".join(MODES), help="of reference, evolve, random-library, recipe-search")
    ap.add_argument("--protocols", default=",".join(PROTOCOLS), help="total (equal total steps), depth (equal "
                    "lineage depth), or both")
    ap.add_argument("--out", default=None, help="keep run dirs here (default: a temp dir)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-test", action="store_true", help="skip verifying each run's best version on the test split")
    ap.add_argument("--label", default=None, help="name the results of this invocation's one mode by this "
                    "instead (e.g. evolve-exploit with --set evolution.exploit_share=0.5), beside stored ones")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="config override for every run, e.g. train.carry_optimizer=true (YAML value)")
    ap.add_argument("--draws", action="store_true", help="print, from --json and the kept run dirs, the library "
                    "entries each explored parent's health report fired and their share of the draw, then stop")
    args = ap.parse_args()
    if args.draws:
        if not args.json or not Path(args.json).exists():
            raise SystemExit("--draws reads a results file: give --json RESULTS.json of an earlier run")
        print(library_draws(json.loads(Path(args.json).read_text())["results"], args.out or "runs"))
        return
    if args.label and "," in args.modes:
        raise SystemExit("--label names one mode's results: give one --modes")
    root = Path(args.out or tempfile.mkdtemp(prefix="compare-modes-"))
    results: dict[str, list[dict]] = {}
    done = Path(args.json) if args.json else None
    if done and done.exists():
        results = json.loads(done.read_text())["results"]
        backfill_episode_rates(results, root)
        print(f"resuming from {done}: " + ", ".join(f"{m} seeds {[r['seed'] for r in rs]}" for m, rs in results.items()))
    exp = None
    for seed, protocol, mode in [(s_, p_, m_) for s_ in map(int, args.seeds.split(","))
                                 for p_ in args.protocols.split(",") for m_ in args.modes.split(",")]:
            name = f"{args.label or mode}@{protocol}"
            if any(r["seed"] == seed for r in results.get(name, [])):
                continue
            same = results.get(f"{args.label or mode}@total", [])
            if mode == "reference" and protocol == "depth" and any(r["seed"] == seed for r in same):
                # One lineage trained --steps steps either way: the total protocol's run is this one.
                results.setdefault(name, []).append({**next(r for r in same if r["seed"] == seed), "same_run_as": "total"})
                print(f"{name:>13} seed {seed}: the reference@total run (one lineage of {args.steps} steps in both "
                      "protocols)", flush=True)
                continue
            row = run_mode(args.config, mode, protocol, seed, args.steps, root / f"{args.label or mode}-{protocol}-s{seed}",
                           model=args.model, steps_per_generation=args.steps_per_generation,
                           eval_size=args.eval_size, sets=args.set, test=not args.no_test)
            exp = row.pop("_exp")
            results.setdefault(name, []).append(row)
            if done:
                done.write_text(json.dumps({"args": vars(args), "base_test": None, "results": results}, indent=2))
            test = f" test {row['test']:.3f}," if "test" in row else ""
            print(f"{name:>13} seed {seed}: best {row['best']} held-out {row['heldout']:.3f},{test} {row['versions']} versions, "
                  f"{row['lineage_steps']} steps on its lineage, "
                  f"wall {row['wall_s']:.0f} s, overhead {row['overhead_share']:.1%} ("
                  + ", ".join(f"{k} {v:.1f}" for k, v in row["overhead_parts_s"].items()) + " s)", flush=True)


    base, base_rates = None, None
    if exp is None:   # everything came from --json: load one run for the base-model score
        cfg = load_config(args.config)
        if args.model:
            cfg.model = args.model
        for item in args.set:
            override(cfg, item)
        cfg.run_dir = str(root / "base-model")
        exp = Experiment(cfg)
    if not args.no_test:  # the untrained base model on the same split: does training help at all?
        tc = exp.cfg.train
        rt = exp.runtime
        untrained = verify(rt.engine, rt.domain, rt.domain.tasks("test"), None, max_new_tokens=tc.eval_max_new_tokens,
                           temperature=tc.eval_temperature, seeds=tc.eval_seeds)
        base, base_rates = mean_score(by_seed(task_scores(untrained))), episode_rates(untrained)

    for protocol in sorted({n.partition("@")[2] or "total" for n in results}):
        print_protocol(protocol, {n: rs for n, rs in results.items() if (n.partition("@")[2] or "total") == protocol},
                       base, args, base_rates)
    parts: dict[str, float] = {}
    for rows in results.values():
        for r in rows:
            for k, v in r["overhead_parts_s"].items():
                parts[k] = parts.get(k, 0.0) + v
    wall = sum(r["wall_s"] for rows in results.values() for r in rows)
    print("where the time outside generation and gradient steps went (all runs): "
          + ", ".join(f"{k} {v / wall:.1%}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])))
    report_children(results)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "base_test": base, "results": results}, indent=2))


if __name__ == "__main__":
    main()
