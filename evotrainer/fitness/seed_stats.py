"""Seed-level statistics for comparing two training recipes run under several seeds.

A gate (``paired_stats``) compares a child with its control inside one run: same tasks, same seeds,
one training history, so tasks are the unit of evidence there. Comparing two *recipes* is different:
each seed is a whole training run, and two runs of one recipe differ by far more than task noise
(on the embedded model, 16 identical steps moved held-out accuracy by +0.083 with one seed and -0.021
with another). Bootstrapping (task, seed) pairs as independent treats 3 seeds x 128 tasks as 384
independent draws and gives intervals several times too narrow.

So a recipe delta is resampled in two stages (a cluster bootstrap): draw seeds with replacement, then
tasks with replacement within each drawn seed, and average. The per-seed deltas are reported beside
the interval, since with 3-5 seeds they are the evidence a reader should see.

:func:`minimum_detectable_effect` turns a measured spread of per-seed deltas into the smallest true
delta a given number of seeds would show at a level and power (docs/concepts/gates.md has the table).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

LEVEL = 0.9          # every benchmark delta is reported with a 90% interval
N_RESAMPLES = 4000   # resamples x seeds x tasks stays under a second for 12 seeds x 128 tasks


@dataclass(frozen=True)
class SeedDelta:
    """A recipe delta (a - b) over seeds: the mean, its cluster-bootstrap interval, the per-seed deltas."""

    mean: float
    ci90: tuple[float, float]
    per_seed: dict[int, float]
    n_seeds: int
    n_tasks: int          # tasks per seed (the smallest count when seeds differ)
    level: float = LEVEL
    note: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ci90"] = list(self.ci90)
        d["per_seed"] = {str(k): v for k, v in self.per_seed.items()}
        return d

    def text(self) -> str:
        """``+0.031 [-0.040, +0.102]; per seed +0.02, -0.05, +0.12`` (the form the reports print)."""
        return (f"{self.mean:+.3f} [{self.ci90[0]:+.3f}, {self.ci90[1]:+.3f}]; per seed "
                + ", ".join(f"{v:+.3f}" for _, v in sorted(self.per_seed.items())))


def task_means(scores: Mapping[str, float | Sequence[float]]) -> dict[str, float]:
    """task -> its score, the mean over sampling seeds where a task has several."""
    return {t: float(np.mean(v)) if isinstance(v, Sequence) else float(v) for t, v in scores.items()}


def paired_by_seed(a: Mapping[int, Mapping[str, float | Sequence[float]]],
                   b: Mapping[int, Mapping[str, float | Sequence[float]]]) -> dict[int, dict[str, float]]:
    """seed -> task -> score(a) - score(b), on the seeds both sides ran and the tasks both scored in that
    seed. ``ValueError`` when they share no seed or a shared seed has no task in common."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError(f"no seed in common: one side ran seeds {sorted(a)}, the other {sorted(b)}")
    out = {}
    for s in seeds:
        x, y = task_means(a[s]), task_means(b[s])
        shared = sorted(set(x) & set(y))
        if not shared:
            raise ValueError(f"seed {s}: the two sides scored no task in common")
        out[s] = {t: x[t] - y[t] for t in shared}
    return out


def cluster_bootstrap(deltas: Mapping[int, Mapping[str, float]], level: float = LEVEL,
                      n_resamples: int = N_RESAMPLES, rng_seed: int = 0) -> SeedDelta:
    """Mean of per-seed mean deltas, with a percentile interval that resamples seeds, then tasks within
    each drawn seed (each seed weighs the same, whatever its task count)."""
    if not deltas:
        raise ValueError("no seeds to resample")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    arrays = {s: np.asarray(list(d.values()), dtype=float) for s, d in deltas.items()}
    empty = [s for s, v in arrays.items() if v.size == 0]
    if empty:
        raise ValueError(f"seeds {empty} have no task deltas")
    per_seed = {s: float(v.mean()) for s, v in sorted(arrays.items())}
    mean = float(np.mean(list(per_seed.values())))
    n_tasks = min(v.size for v in arrays.values())
    values = list(arrays.values())
    if all(np.ptp(v) == 0.0 for v in values) and len(set(per_seed.values())) == 1:
        return SeedDelta(mean, (mean, mean), per_seed, len(values), n_tasks, level,
                         "every task delta of every seed is equal: no variability to resample")
    rng = np.random.default_rng(rng_seed)
    k = len(values)
    picks = rng.integers(0, k, size=(n_resamples, k))           # stage 1: seeds
    total = np.zeros(n_resamples)
    for j in range(k):                                           # stage 2: tasks, afresh for each drawn slot
        slot = np.empty(n_resamples)
        for s, v in enumerate(values):
            rows = picks[:, j] == s
            if rows.any():
                slot[rows] = v[rng.integers(0, v.size, size=(int(rows.sum()), v.size))].mean(axis=1)
        total += slot
    boot = total / k
    alpha = (1.0 - level) / 2.0
    low, high = (float(x) for x in np.quantile(boot, [alpha, 1.0 - alpha]))
    note = "one seed: the interval resamples its tasks only and says nothing of seed variance" if k == 1 else ""
    return SeedDelta(mean, (low, high), per_seed, k, n_tasks, level, note)


def seed_delta(a: Mapping[int, Mapping[str, float | Sequence[float]]],
               b: Mapping[int, Mapping[str, float | Sequence[float]]], level: float = LEVEL,
               n_resamples: int = N_RESAMPLES) -> SeedDelta:
    """``a - b`` for two recipes' scores (seed -> task -> score or per-sampling-seed scores), paired
    within each seed on the tasks both scored, then :func:`cluster_bootstrap`."""
    return cluster_bootstrap(paired_by_seed(a, b), level, n_resamples)


def pooled_delta(per_setting: Mapping[str, Mapping[int, Mapping[str, float]]], level: float = LEVEL,
                 n_resamples: int = N_RESAMPLES) -> SeedDelta:
    """One delta over several settings: every (setting, seed) is a cluster of its own (the runs are
    independent), so the pooled interval resamples setting-seeds, then tasks within them."""
    clusters: dict[int, Mapping[str, float]] = {}
    for name in sorted(per_setting):
        for seed in sorted(per_setting[name]):
            clusters[len(clusters)] = per_setting[name][seed]
    return cluster_bootstrap(clusters, level, n_resamples)


def minimum_detectable_effect(seed_sd: float, n_seeds: int, level: float = LEVEL, power: float = 0.8) -> float:
    """The smallest true recipe delta that ``n_seeds`` seeds would show with probability ``power``:
    ``(z_(1-(1-level)/2) + z_power) * seed_sd / sqrt(n_seeds)``, where ``seed_sd`` is the sd of the
    per-seed deltas (it holds task noise at the task count it was measured at, and seed noise)."""
    if n_seeds < 1 or seed_sd < 0:
        raise ValueError(f"need n_seeds >= 1 and seed_sd >= 0, got {n_seeds}, {seed_sd}")
    z = stats.norm.ppf(1.0 - (1.0 - level) / 2.0) + stats.norm.ppf(power)
    return float(z * seed_sd / math.sqrt(n_seeds))
