"""How many seeds a recipe comparison needs: the seed-level minimum detectable effect, from the spreads
of per-seed deltas measured in the committed raw results.

For every comparison with at least 3 paired seeds (a variant against the reference recipe, on the same
test tasks within each seed), the sd of its per-seed deltas holds both the task noise of one test split
and the noise of training itself. Their pooled sd per domain gives the minimum detectable effect at
90% (two-sided) and 80% power for 3, 5, 8 and 12 seeds (t quantiles) (``evotrainer.fitness.seed_stats``).
``docs/concepts/gates.md`` shows this table; a test fails when they differ.

    python benchmarks/seed_power.py
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from evotrainer.fitness.seed_stats import minimum_detectable_effect, paired_by_seed

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SEEDS = (3, 5, 8, 12)
# (domain, raw file, how its rows are kept): headroom files list runs by variant, compare_modes files
# list rows by mode@protocol.
SOURCES = (("math", "headroom_math.json", "headroom"), ("math", "compare_modes_math.json", "modes"),
           ("code", "headroom_code.json", "headroom"), ("code", "compare_modes_code.json", "modes"))


def _groups(data: dict, kind: str) -> dict[str, dict[int, dict]]:
    """variant -> seed -> test scores; the reference under the name ``reference``."""
    out: dict[str, dict[int, dict]] = {}
    if kind == "headroom":
        for r in data["runs"]:
            out.setdefault(r["variant"], {})[r["seed"]] = r["test_scores"]
    else:
        for name, rows in data["results"].items():
            mode, _, protocol = name.partition("@")
            key = "reference" if mode == "reference" else name
            if mode == "reference" and protocol == "depth":
                continue
            for r in rows:
                out.setdefault(key, {})[r["seed"]] = r["test_scores"]
    return out


def spreads() -> list[tuple[str, str, int, float]]:
    """(domain, comparison, seeds, sd of its per-seed deltas) for comparisons with >= 3 paired seeds."""
    found = []
    for domain, file, kind in SOURCES:
        groups = _groups(json.loads((RESULTS / file).read_text()), kind)
        ref = groups.get("reference", {})
        for name, runs in groups.items():
            if name == "reference" or len(set(runs) & set(ref)) < 3:
                continue
            deltas = [statistics.fmean(d.values()) for d in paired_by_seed(runs, ref).values()]
            found.append((domain, f"{file}: {name}", len(deltas), statistics.stdev(deltas)))
    return found


def table() -> str:
    rows = spreads()
    lines = ["| domain | comparisons (seeds each) | pooled sd of per-seed Δ | "
             + " | ".join(f"MDE, {n} seeds" for n in SEEDS) + " |", "|---|---|---|" + "---|" * len(SEEDS)]
    for domain in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == domain]
        dof = sum(n - 1 for _, _, n, _ in mine)
        sd = math.sqrt(sum((n - 1) * s * s for _, _, n, s in mine) / dof)
        lines.append(f"| {domain} | {len(mine)} ({', '.join(str(n) for _, _, n, _ in mine)}) | {sd:.3f} | "
                     + " | ".join(f"{minimum_detectable_effect(sd, n):.3f}" for n in SEEDS) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    for domain, name, n, sd in spreads():
        print(f"{domain:<5} {name:<60} {n} seeds, sd of per-seed Δ {sd:.3f}")
    print()
    print(table())
