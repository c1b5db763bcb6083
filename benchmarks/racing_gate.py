"""How often a gate promotes, and how many held-out tasks it reads: the fixed gate (a paired bootstrap on
one draw of 24 or 48 tasks) against the racing gates of ``evotrainer.fitness.race``: rounds of tasks
until a confidence sequence decides, up to a cap; and the group-sequential test the loop runs
(``evolution.race_cap``: looks at 24, 48, 96, ... tasks, O'Brien-Fleming-type boundaries, a child
behind its control refused), on the same paired outcomes.

Two sources of paired outcomes, both printed:

- **embedded**: the embedded model's own test outcomes from committed runs
  (``results/headroom_math.json``: the reference recipe trained under 5 seeds, 128 test tasks each).
  Two seeds of one recipe are the same recipe under different training noise: not a null for a gate,
  which compares two *models* (their deltas on the whole 128-task pool span about -0.12 to +0.12),
  so a gate that reads more tasks separates them more often. **embedded, sign-flipped** is the null
  on the same outcomes: each task's delta negated at random (the paired permutation null), so the
  discordance is the embedded model's and the mean is 0. A planted effect flips enough of one side's
  disagreements its way to add +0.1 in expectation.
- **model**: per-task outcomes of two policies that disagree on 29% of tasks when equal (the
  discordance measured between the headroom runs, ``docs/concepts/gates.md``), the child winning a
  disagreement with probability 1/2 + effect / 0.58; enough tasks for any cap.

    python benchmarks/racing_gate.py [--sims 400] [--json results/racing_gate.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path

import numpy as np

from evotrainer.fitness.paired_stats import decide_promotion
from evotrainer.fitness.race import looks, race, sequential_decision
from evotrainer.fitness.seed_stats import task_means

ROOT = Path(__file__).resolve().parents[1]
DISCORDANCE = 0.29


def modelled(rng, n: int, effect: float) -> list[float]:
    disagree = rng.random(n) < DISCORDANCE
    wins = rng.random(n) < 0.5 + effect / (2 * DISCORDANCE)
    return np.where(disagree, np.where(wins, 1.0, -1.0), 0.0).tolist()


def embedded_pairs() -> list[list[float]]:
    """Per-task deltas of every ordered pair of the reference recipe's seeds (same test tasks)."""
    data = json.loads((ROOT / "benchmarks" / "results" / "headroom_math.json").read_text())
    runs = {r["seed"]: task_means(r["test_scores"]) for r in data["runs"] if r["variant"] == "reference"}
    pairs = []
    for a, b in itertools.permutations(sorted(runs), 2):
        tasks = sorted(set(runs[a]) & set(runs[b]))
        pairs.append([runs[a][t] - runs[b][t] for t in tasks])
    return pairs


def plant(rng, deltas: list[float], effect: float) -> list[float]:
    """Turns losses into ties and ties into wins at random until the mean rises by ``effect``."""
    d = list(deltas)
    need = round(effect * len(d))
    order = rng.permutation(len(d))
    for i in order:
        if need <= 0:
            break
        if d[i] <= 0.0:   # a loss becomes a tie, a tie a win: a delta stays in [-1, 1]
            d[i] += 1.0
            need -= 1
    return d


def fixed(deltas: list[float], n: int, level: float) -> bool:
    child = {i: max(d, 0.0) for i, d in enumerate(deltas[:n])}
    control = {i: max(-d, 0.0) for i, d in enumerate(deltas[:n])}
    return decide_promotion(child, control, level=level, n_resamples=2000).promote


def gates(draw, sims: int, level: float, caps: list[int], seq_caps: list[int]) -> dict:
    rows = {}
    for n in (24, 48):
        rows[f"fixed {n}"] = {"promote": statistics.fmean(fixed(draw(), n, level) for _ in range(sims)), "tasks": n}
    for cap in caps:
        ds = [race(draw(), level=level, round_size=24, cap=cap) for _ in range(sims)]
        rows[f"race, cap {cap}"] = {"promote": statistics.fmean(d.promote for d in ds),
                                    "tasks": statistics.fmean(d.n_tasks for d in ds)}
    for cap in seq_caps:
        ds = [sequential_decision(draw(), looks(24, cap), level=level) for _ in range(sims)]
        rows[f"sequential, cap {cap}"] = {"promote": statistics.fmean(d.promote for d in ds),
                                          "tasks": statistics.fmean(d.n_tasks for d in ds)}
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=400)
    ap.add_argument("--level", type=float, default=0.9)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    pairs = embedded_pairs()
    out = {}
    out["embedded, sign-flipped (null)"] = gates(
        lambda: [d * rng.choice((-1.0, 1.0)) for d in rng.permutation(pairs[rng.integers(len(pairs))])],
        args.sims, args.level, [128], [128])
    for effect in (0.0, 0.1):
        out[f"embedded, two seeds, effect {effect:+.1f}"] = gates(
            lambda e=effect: plant(rng, list(rng.permutation(pairs[rng.integers(len(pairs))])), e),
            args.sims, args.level, [128], [128])
        out[f"model, effect {effect:+.1f}"] = gates(lambda e=effect: modelled(rng, 960, e), args.sims, args.level,
                                                    [240, 480, 960], [192, 384])
    print(f"promotion rate and held-out tasks read per gate, level {args.level}, {args.sims} races each "
          f"(embedded: {len(pairs)} ordered pairs of the reference's seeds on 128 test tasks)")
    for source, rows in out.items():
        print(f"\n{source}")
        for gate, r in rows.items():
            print(f"  {gate:<20} promotes {r['promote']:.3f}   tasks {r['tasks']:.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": out}, indent=2))


if __name__ == "__main__":
    main()
