"""Does the skill prior transfer? `evolve` on a setting of the left-out domain, three ways on the same
draw and seeds: the prior built without that domain's screens (transfer), no prior
(``evolution.entry_prior=null``, every fired entry weighed alike) and the shipped prior (built with
that domain's screens: in-sample for its entries, though scored on another test draw).

    python benchmarks/entry_prior.py --leave-out math --out benchmarks/results/entry_prior_no_math.json
    python benchmarks/suite.py run --draw 52 --settings math-learns --modes evolve \\
        --set evolution.entry_prior=benchmarks/results/entry_prior_no_math.json \\
        --results benchmarks/results/suite_ds52_prior_no_math --out runs/suite_ds52_prior_no_math
    python benchmarks/suite.py run ... --set evolution.entry_prior=null --results benchmarks/results/suite_ds52_prior_null ...
    python benchmarks/prior_transfer.py            # the table; the JSON beside the rows

Every Δ pairs the arms within each seed on its test tasks and resamples seeds, then tasks
(``fitness/seed_stats.py``), with the per-seed Δs beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"

from evotrainer.fitness.seed_stats import seed_delta  # noqa: E402

ARMS = {"left out": "suite_ds{draw}_prior_no_{domain}", "none": "suite_ds{draw}_prior_null",
        "shipped": "suite_ds{draw}"}
DELTAS = (("left out", "none"), ("shipped", "none"), ("left out", "shipped"))


def arm_scores(folder: Path, setting: str) -> dict[int, dict[str, list[float]]]:
    path = folder / f"{setting}.json"
    rows = json.loads(path.read_text())["runs"].get("evolve", []) if path.exists() else []
    return {r["seed"]: r["test_scores"] for r in rows}


def compare(draw: int, domain: str, setting: str, results: Path = RESULTS) -> dict:
    arms = {name: arm_scores(results / f.format(draw=draw, domain=domain), setting) for name, f in ARMS.items()}
    out = {"draw": draw, "left_out": domain, "setting": setting,
           "arms": {n: {"folder": ARMS[n].format(draw=draw, domain=domain), "seeds": sorted(s),
                        "mean": {str(k): round(sum(map(sum, v.values())) / sum(map(len, v.values())), 4)
                                 for k, v in sorted(s.items())}} for n, s in arms.items()},
           "delta": {}}
    for a, b in DELTAS:
        common = sorted(set(arms[a]) & set(arms[b]))
        if common:
            d = seed_delta({s: arms[a][s] for s in common}, {s: arms[b][s] for s in common})
            out["delta"][f"{a} - {b}"] = {"mean": round(d.mean, 4), "ci90": [round(x, 4) for x in d.ci90],
                                          "per_seed": {str(k): round(v, 4) for k, v in d.per_seed.items()},
                                          **({"note": d.note} if d.note else {})}
    return out


def table(summary: dict) -> str:
    lines = ["| prior | Δ [90% CI, seeds then tasks] | per seed |", "|---|---|---|"]
    for name, d in summary["delta"].items():
        lines.append(f"| {name} | {d['mean']:+.3f} [{d['ci90'][0]:+.3f}, {d['ci90'][1]:+.3f}] | "
                     + ", ".join(f"{v:+.2f}" for v in d["per_seed"].values()) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draw", type=int, default=52)
    ap.add_argument("--leave-out", default="math")
    ap.add_argument("--setting", default="math-learns")
    args = ap.parse_args()
    summary = compare(args.draw, args.leave_out, args.setting)
    out = RESULTS / f"prior_transfer_{args.leave_out}_ds{args.draw}.json"
    out.write_text(json.dumps(summary, indent=1) + "\n")
    for name, arm in summary["arms"].items():
        print(f"{name}: seeds {arm['seeds']}, test {arm['mean']}")
    print(table(summary))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
