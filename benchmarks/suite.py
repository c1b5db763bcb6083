"""The benchmark suite: `evolve` as shipped against `reference` and `random-library`, on settings where
the recipe learns and where it fails, fixed in this file before it runs.

Each setting is a config in ``benchmarks/configs/suite/`` (domain, model, recipe; no evolution section,
so ``evolve`` and ``random-library`` run the default search) and a budget of total training steps. Every
mode of a setting runs the same seeds at equal total training steps; each run is a full loop whose final
pick is verified on the setting's test split, drawn with ``DOMAIN_SEED`` so that no earlier benchmark
looked at it. Nothing in a run sees the test split.

    python benchmarks/suite.py run                        # everything not yet run, seed by seed
    python benchmarks/suite.py run --settings math-learns --seeds 0,1
    python benchmarks/suite.py summary                    # suite_summary.json, the README's table, the ledger
    python benchmarks/suite.py plan --draw 55             # what a draw has left, with its time from the rows' walls

Raw output: one JSON per setting in ``benchmarks/results/suite_ds<DOMAIN_SEED>/`` (each run's row as it finishes, so a
stopped suite resumes where it was, with the commit and config hash of the code that ran it, and every
variant scored on that test split). ``summary`` writes ``benchmarks/results/suite_summary.json``: per
setting and pooled over settings x seeds, each delta with a 90% interval that resamples seeds, then
tasks within them (``evotrainer.fitness.seed_stats``), beside the per-seed deltas.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

CONFIGS = ROOT / "benchmarks" / "configs" / "suite"
MODES = ("reference", "evolve", "random-library")
# The suite's test draw: a domain seed no earlier benchmark drew its splits with. Each draw's rows live in
# benchmarks/results/suite_ds<seed>/. 46 was the first (7 runs, seen before the library's learning-rate
# entries changed); 47 ran 21 runs of `evolve` at 6fd63d7; `evolve` then changed after 47's test scores
# were seen (triage of a stuck adapter, its rungs, an exploit child for a stuck lineage), and each change
# was measured on a fresh draw (48, 49, 50). 51 is the draw of `evolve` at 4e183d1 (with the probes of
# 0c8b068, which act only at the 16-step settings' budgets): the headline. The elite's order that main's
# `evolve` has used since (written after 51's math-learns scores) is measured on draw 52.
# Later rules, each read from a draw's test scores, are measured on draws 53 (stopped), 54 (stopped after
# math-misfit-lr), 55 and 56 (probes that stop when they tie: code-2; docs/benchmarks/suite.md).
DOMAIN_SEED = 51
RESULTS = ROOT / "benchmarks" / "results" / f"suite_ds{DOMAIN_SEED}"


@dataclass(frozen=True)
class Setting:
    config: str          # in CONFIGS
    steps: int           # total training steps of every run (equal total steps)
    seeds: tuple[int, ...]
    why: str             # what the setting stands for


SETTINGS: dict[str, Setting] = {
    "math-learns": Setting("math_learns.yaml", 32, tuple(range(5)),
                           "math levels 2-3, the recipe learns (lr 5e-4, 32 tokens)"),
    "math-dead": Setting("math_dead.yaml", 32, tuple(range(5)),
                         "math levels 4-5: most groups dead under the recipe"),
    "math-misfit-lr": Setting("math_misfit_lr.yaml", 32, tuple(range(5)),
                              "math levels 2-3 at lr 1e-6 (TRL's default): the recipe cannot move a LoRA adapter"),
    "code-2": Setting("code_2.yaml", 16, tuple(range(5)), "code level 2 (generated functions with tests)"),
    "code-humaneval": Setting("code_humaneval.yaml", 16, tuple(range(5)),
                              "HumanEval (code level 4): the hard code level, 88 test problems"),
    "swe-1": Setting("swe_1.yaml", 16, tuple(range(3)),
                     "SWE level 1: one-token bugs in small repositories, tool episodes"),
}


def git_commit() -> str:
    """HEAD, with ``+dirty`` when tracked files differ from it (then the row is not reproducible)."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "evotrainer", "benchmarks/configs",
                            "benchmarks/suite.py", "benchmarks/compare_modes.py"],
                           cwd=ROOT).returncode
    return head + ("+dirty" if dirty else "")


@dataclass(frozen=True)
class Options:
    """What a suite invocation changes: smoke runs (model, sets, steps), and a fresh test draw
    (``domain_seed``) on which an `evolve` changed after the suite's test scores were seen is measured
    again (its rows go to ``results/suite_ds<seed>/``, beside reference and random-library rows of
    that draw, never mixed with the suite's own)."""
    results: Path = RESULTS
    model: str | None = None
    sets: tuple[str, ...] = ()
    steps: int | None = None
    domain_seed: int = DOMAIN_SEED

    def overrides(self) -> list[str]:
        return [f"domain.seed={self.domain_seed}", *([f"model={self.model}"] if self.model else []), *self.sets]


def draw_results(domain_seed: int) -> Path:
    """Where a draw's rows go (the suite's own draw included)."""
    return RESULTS.parent / f"suite_ds{domain_seed}"


def setting_config(name: str, opts: Options = Options()):
    """The setting's config as every run of it starts (the suite's domain seed set)."""
    from compare_modes import override
    from evotrainer.config import load_config

    cfg = load_config(CONFIGS / SETTINGS[name].config)
    for item in opts.overrides():
        override(cfg, item)
    return cfg


def steps_of(name: str, opts: Options) -> int:
    return opts.steps or SETTINGS[name].steps


def config_hash(name: str, opts: Options = Options()) -> str:
    """What a run's results depend on besides the code and the seed: the setting's config and budget."""
    cfg = setting_config(name, opts).model_dump(mode="json")
    cfg.pop("run_dir", None)
    cfg.pop("seed", None)
    blob = json.dumps({"config": cfg, "steps": steps_of(name, opts)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load(name: str, opts: Options = Options()) -> dict:
    p = opts.results / f"{name}.json"
    if p.exists():
        data = json.loads(p.read_text())
        if data.get("domain_seed", opts.domain_seed) != opts.domain_seed:   # two draws never share a file
            raise SystemExit(f"{p} holds rows of domain seed {data['domain_seed']}, not {opts.domain_seed}: "
                             "give this draw its own --results folder")
        return data
    s = SETTINGS[name]
    return {"setting": name, "why": s.why, "config": f"benchmarks/configs/suite/{s.config}",
            "steps": steps_of(name, opts), "domain_seed": opts.domain_seed, "overrides": opts.overrides(),
            "protocol": "equal total training steps", "runs": {}, "scored_on_test": []}


def save(name: str, data: dict, opts: Options = Options()) -> None:
    """Atomically: a stopped suite never leaves a half-written file, and rows already there stay."""
    opts.results.mkdir(parents=True, exist_ok=True)
    path = opts.results / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


@contextlib.contextmanager
def locked(name: str, opts: Options = Options()):
    """Holds ``<results>/<name>.lock``: two suite processes on one setting take turns to score the
    untrained model and to add a row, so neither runs that score twice (two writers of one run
    directory: the second stopped) nor drops the other's row between its read and its write."""
    opts.results.mkdir(parents=True, exist_ok=True)
    with open(opts.results / f"{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def claim_run(run_dir: Path):
    """The writer's lock of one run's directory, or None (said) when another suite process is training
    that run: two processes whose seed lists overlap then split the runs between them, each training
    what the other has not claimed, where the second used to stop on the first's run directory."""
    from evotrainer.records.run_dir import RunDirError, acquire

    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        return acquire(run_dir, "benchmarks/suite.py run")
    except RunDirError as err:
        print(f"skipped here: {err}; its process adds the row", flush=True)
        return None


class SplitError(ValueError):
    """A setting whose test split repeats tasks: it is not run."""


def test_split_check(name: str, out: Path, opts: Options = Options()) -> dict:
    """The setting's test split, distinct tasks only, and the untrained model's score on it."""
    from compare_modes import episode_rates
    from evotrainer.loop.experiment import Experiment
    from evotrainer.policy.collect import verify
    from evotrainer.records.scores import by_seed, task_scores

    cfg = setting_config(name, opts)
    cfg.run_dir = str(out / name / "untrained")
    exp = Experiment(cfg)
    rt, tc = exp.runtime, exp.cfg.train
    tasks = rt.domain.tasks("test")
    distinct = len({(t.prompt, t.answer) for t in tasks})
    if distinct < len(tasks):
        raise SplitError(f"{name}: the test split holds {len(tasks)} tasks but only {distinct} distinct ones; "
                         "a rate over repeated tasks is not a rate: lower domain.n_test in "
                         f"{CONFIGS / SETTINGS[name].config} or grow the domain's generator")
    t0 = time.perf_counter()
    rollouts = verify(rt.engine, rt.domain, tasks, None, max_new_tokens=tc.eval_max_new_tokens,
                      temperature=tc.eval_temperature, seeds=tc.eval_seeds)
    scores = by_seed(task_scores(rollouts))
    out_ = {"n_test": len(tasks), "distinct_prompts": distinct, "test_scores": scores,
            "test": sum(v for vs in scores.values() for v in vs) / sum(len(vs) for vs in scores.values()),
            "wall_s": time.perf_counter() - t0}
    if (rates := episode_rates(rollouts)) is not None:
        out_["episode_scores"] = rates
    return out_


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def run(names: list[str], seeds: list[int] | None, modes: list[str], out: Path, opts: Options = Options()) -> None:
    """Every (setting, seed, mode) not yet in its results file, seed-major across settings, so that a
    stopped suite holds paired seeds of every setting rather than every seed of one."""
    from compare_modes import run_mode

    if "OMP_NUM_THREADS" not in os.environ and (os.cpu_count() or 1) <= 2:
        print(f"note: torch takes one thread per core ({os.cpu_count()}); if another suite process shares these "
              "cores, start both with OMP_NUM_THREADS=1 (two threads each spin against each other)", flush=True)
    order = [(seed, name, mode) for seed in range(max(len(SETTINGS[n].seeds) for n in names))
             for name in names for mode in modes]
    refused: dict[str, str] = {}
    for index, name, mode in order:
        s = SETTINGS[name]
        if name in refused or index >= len(s.seeds) or (seeds is not None and s.seeds[index] not in seeds):
            continue
        seed = s.seeds[index]
        with locked(name, opts):
            data = load(name, opts)
            if any(r["seed"] == seed for r in data["runs"].get(mode, [])):
                continue
            if "untrained" not in data:
                print(f"{name}: the untrained model on the test split", flush=True)
                try:
                    data["untrained"] = test_split_check(name, out, opts)
                except SplitError as err:
                    refused[name] = str(err)
                    print(f"not run: {err}", flush=True)
                    continue
                save(name, data, opts)
        run_dir = out / name / f"{mode}-s{seed}"
        if (claim := claim_run(run_dir)) is None:
            continue
        with claim:
            with locked(name, opts):     # finished by another process between our look and our claim?
                if any(r["seed"] == seed for r in load(name, opts)["runs"].get(mode, [])):
                    continue
            started = time.time()
            row = run_mode(str(CONFIGS / s.config), mode, "total", seed, steps_of(name, opts), run_dir,
                           sets=opts.overrides())
        row.pop("_exp").close()     # its run directory lock and executor: the next run needs neither
        # the threads each run's torch used: two processes of two threads on two cores spin against each other
        # (docs/benchmarks/suite.md, "Two processes, one thread each"), which shows in wall_s
        row.update(commit=git_commit(), config_hash=config_hash(name, opts), started=started,
                   torch_threads=torch_threads())
        with locked(name, opts):
            data = load(name, opts)      # re-read: another process may have added a row meanwhile
            data["runs"].setdefault(mode, []).append(row)
            variant = {"variant": mode, "commit": row["commit"], "config_hash": row["config_hash"]}
            if variant not in data["scored_on_test"]:
                data["scored_on_test"].append(variant)
            save(name, data, opts)
        print(f"{name} {mode} seed {seed}: test {row['test']:.3f} (untrained {data['untrained']['test']:.3f}), "
              f"pick {row['best']} of {row['versions']} versions, {row['lineage_steps']} steps on its lineage, "
              f"wall {row['wall_s']:.0f} s", flush=True)
    for name, why in refused.items():
        print(f"not run: {why}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run what is missing (resumes)")
    r.add_argument("--settings", default=",".join(SETTINGS), help=f"of {', '.join(SETTINGS)}")
    r.add_argument("--seeds", default=None, help="only these seeds (default: each setting's own)")
    r.add_argument("--modes", default=",".join(MODES))
    r.add_argument("--out", default="runs/suite", help="run directories (kept: the rows name them)")
    r.add_argument("--results", default=str(RESULTS), help="where the raw JSON goes (smoke runs: elsewhere)")
    r.add_argument("--model", default=None, help="smoke runs only: another model (e.g. tiny-random)")
    r.add_argument("--steps", type=int, default=None, help="smoke runs only: every setting's total steps")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="smoke runs only: a config override")
    r.add_argument("--draw", type=int, default=None, metavar="DOMAIN_SEED",
                   help=f"a fresh test draw (not {DOMAIN_SEED}): rows go to benchmarks/results/suite_ds<seed>/ "
                        "and runs to runs/suite_ds<seed>/ unless --results and --out say otherwise")
    sm = sub.add_parser("summary", help="write suite_summary.json and the README's table from the raw results")
    sm.add_argument("--draw", type=int, default=None, metavar="DOMAIN_SEED",
                    help="summarise a fresh draw's rows instead (printed and written beside them; the README "
                         "keeps the suite's table)")
    pl = sub.add_parser("plan", help="what a draw has left to run, with the time it takes from its rows' walls")
    pl.add_argument("--draw", type=int, default=None, metavar="DOMAIN_SEED", help="a fresh draw's rows (default: the suite's)")
    pl.add_argument("--settings", default=None, help=f"of {', '.join(SETTINGS)} (default: all)")
    pl.add_argument("--modes", default=None, help=f"of {', '.join(MODES)} (default: all)")
    args = ap.parse_args()
    if args.command == "plan":
        from suite_plan import main as plan_main

        plan_main(draw_results(args.draw) if args.draw is not None else None, args.settings, args.modes)
    elif args.command == "run":
        names = args.settings.split(",")
        unknown = [n for n in names if n not in SETTINGS]
        if unknown:
            raise SystemExit(f"--settings: unknown {unknown}; the suite's settings are {', '.join(SETTINGS)}")
        seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else None
        if args.draw is not None and args.draw == DOMAIN_SEED:
            raise SystemExit(f"--draw: {DOMAIN_SEED} is the suite's own draw; a fresh draw is another domain seed")
        results = Path(args.results) if args.results != str(RESULTS) or args.draw is None else draw_results(args.draw)
        out = Path(args.out) if args.out != "runs/suite" or args.draw is None else Path(f"runs/suite_ds{args.draw}")
        opts = Options(results, args.model, tuple(args.set), args.steps, args.draw if args.draw is not None else DOMAIN_SEED)
        run(names, seeds, args.modes.split(","), out, opts)   # (a draw's runs never resume another draw's)
    elif args.draw is not None and args.draw != DOMAIN_SEED:
        from suite_summary import draw_table, summarize

        summary = summarize(draw_results(args.draw))
        # beside the draw's folder, not in it: the folder holds one raw file per setting
        draw_results(args.draw).with_name(f"suite_ds{args.draw}_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        print(draw_table(summary, args.draw))
    else:
        from split_ledger import write_ledger
        from suite_summary import write_summary

        write_summary(planned={n: len(s.seeds) * len(MODES) for n, s in SETTINGS.items()})
        write_ledger()


if __name__ == "__main__":
    main()
