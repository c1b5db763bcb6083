"""Seed-level statistics: the cluster bootstrap resamples seeds, then tasks within them, so seed variance
widens the interval that a (task, seed)-pair bootstrap would call significant."""

from __future__ import annotations

import numpy as np
import pytest

from evotrainer.fitness.paired_stats import decide_promotion
from evotrainer.fitness.seed_stats import (cluster_bootstrap, minimum_detectable_effect, paired_by_seed,
                                           pooled_delta, seed_delta)


def scores(rng, n_tasks, p):
    return {f"t{i}": float(rng.random() < p) for i in range(n_tasks)}


def test_per_seed_deltas_and_their_mean():
    a = {0: {"x": 1.0, "y": 1.0}, 1: {"x": 0.0, "y": [1.0, 0.0]}, 2: {"x": 1.0}}
    b = {0: {"x": 0.0, "y": 1.0}, 1: {"x": 0.0, "y": [0.0, 0.0]}, 3: {"x": 1.0}}
    d = paired_by_seed(a, b)
    assert d == {0: {"x": 1.0, "y": 0.0}, 1: {"x": 0.0, "y": 0.5}}     # seeds 2 and 3 unpaired
    r = cluster_bootstrap(d)
    assert r.per_seed == {0: 0.5, 1: 0.25} and r.mean == pytest.approx(0.375) and r.n_seeds == 2
    assert r.ci90[0] <= r.mean <= r.ci90[1]
    assert "+0.375" in r.text() and "+0.500, +0.250" in r.text()


def test_disagreeing_seeds_widen_what_pairs_would_call_significant():
    # Three runs of a recipe against the same reference: one lucky seed fixes 40 of 128 tasks, the
    # other two break 3 each.
    base = {f"t{i}": float(i % 3 == 0) for i in range(128)}
    wrong = [t for t, v in base.items() if v == 0.0]
    right = [t for t, v in base.items() if v == 1.0]
    ref = {s: dict(base) for s in range(3)}
    new = {0: {**base, **{t: 1.0 for t in wrong[:40]}},
           1: {**base, **{t: 0.0 for t in right[:3]}}, 2: {**base, **{t: 0.0 for t in right[3:6]}}}
    cluster = seed_delta(new, ref)
    pairs = decide_promotion({f"{t}@{s}": v for s, ts in new.items() for t, v in ts.items()},
                             {f"{t}@{s}": v for s, ts in ref.items() for t, v in ts.items()}, level=0.9)
    assert pairs.ci_low > 0                                    # the pair bootstrap calls it a gain ...
    assert cluster.ci90[0] < 0 < cluster.ci90[1]               # ... the seeds say it may be none
    assert cluster.ci90[1] - cluster.ci90[0] > 2 * (pairs.ci_high - pairs.ci_low)


def test_the_interval_covers_a_null_effect_under_seed_variance():
    """200 simulated 5-seed comparisons of equal recipes whose runs differ by seed (sd 0.12): the
    cluster interval covers 0 about as often as it claims; the (task, seed)-pair interval far less."""
    rng = np.random.default_rng(7)
    covered, pair_covered, n = 0, 0, 200
    for _ in range(n):
        deltas = {}
        for s in range(5):
            shift = rng.normal(0, 0.12)
            deltas[s] = {f"t{i}": float(rng.random() < 0.4 + shift) - float(rng.random() < 0.4) for i in range(64)}
        r = cluster_bootstrap(deltas, n_resamples=600, rng_seed=int(rng.integers(1 << 30)))
        covered += r.ci90[0] <= 0 <= r.ci90[1]
        flat = np.array([v for d in deltas.values() for v in d.values()])
        boot = flat[rng.integers(0, flat.size, (600, flat.size))].mean(axis=1)
        lo, hi = np.quantile(boot, [0.05, 0.95])
        pair_covered += lo <= 0 <= hi
    assert covered / n >= 0.78          # 90% nominal; a percentile bootstrap of 5 clusters runs a little short
    assert pair_covered / n < covered / n - 0.15


def test_pooled_delta_treats_each_setting_seed_as_a_cluster_and_never_drops_a_setting():
    a = {"m": {0: {"x": 0.1}, 1: {"x": 0.3}}, "c": {0: {"y": -0.1}}}
    r = pooled_delta(a)
    assert r.n_seeds == 3 and r.mean == pytest.approx(0.1)
    assert set(r.per_seed) == {0, 1, 2}
    # Setting c's one seed is in every resample (stratified), so no resample's mean reaches 0.3 or -0.1.
    assert r.ci90[0] > -0.1 + 1e-9 and r.ci90[1] < 0.3 - 1e-9 and not r.note
    assert "tasks only" in pooled_delta({"m": {0: {"x": 0.1, "z": 0.2}}, "c": {0: {"y": -0.1}}}).note


def test_degenerate_and_bad_inputs():
    r = cluster_bootstrap({0: {"x": 0.0, "y": 0.0}, 1: {"x": 0.0}})
    assert r.ci90 == (0.0, 0.0) and "no variability" in r.note
    one = cluster_bootstrap({0: {"x": 1.0, "y": 0.0, "z": 0.0}})
    assert "one seed" in one.note
    with pytest.raises(ValueError, match="no seed in common"):
        paired_by_seed({0: {"x": 1}}, {1: {"x": 1}})
    with pytest.raises(ValueError, match="no task in common"):
        paired_by_seed({0: {"x": 1}}, {0: {"y": 1}})
    with pytest.raises(ValueError, match="no seeds"):
        cluster_bootstrap({})


def test_minimum_detectable_effect_uses_t_quantiles_over_seeds():
    from scipy import stats

    t = stats.t.ppf(0.95, 3) + stats.t.ppf(0.8, 3)
    assert minimum_detectable_effect(0.1, 4) == pytest.approx(t * 0.05)
    assert minimum_detectable_effect(0.1, 3) > 1.5 * (1.6449 + 0.8416) * 0.1 / 3 ** 0.5   # t at 2 dof is far wider
    assert minimum_detectable_effect(0.1, 12) < minimum_detectable_effect(0.1, 3) / 2
    with pytest.raises(ValueError):
        minimum_detectable_effect(0.1, 1)
