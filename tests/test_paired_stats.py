"""Paired promotion gate: child vs parent on the same held-out tasks and seeds."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evotrainer.config import GATE_LEVEL, EvolutionConfig
from evotrainer.fitness.gate_config import GateConfig
from evotrainer.fitness.paired_stats import (
    PairingError,
    PromotionDecision,
    bootstrap_ci,
    decide_promotion,
    paired_deltas,
)


def _scores(n, base, noise, seed):
    rng = np.random.default_rng(seed)
    return {f"t{i}": float(base[i] + noise * rng.standard_normal()) for i in range(n)}


def test_clearly_better_child_is_promoted():
    rng = np.random.default_rng(0)
    difficulty = rng.uniform(0.1, 0.7, 40)
    parent = {f"t{i}": float(difficulty[i]) for i in range(40)}
    child = {f"t{i}": float(difficulty[i] + 0.2 + 0.05 * rng.standard_normal()) for i in range(40)}
    d = decide_promotion(child, parent)
    assert isinstance(d, PromotionDecision)
    assert d.promote
    assert d.ci_low > 0 and d.ci_low <= d.mean_delta <= d.ci_high
    assert d.n_tasks == 40 and d.n_seeds == 1 and d.level == GATE_LEVEL
    assert d.mean_delta == pytest.approx(0.2, abs=0.03)
    assert "promoted" in d.reason and f"{d.ci_low:+.4f}" in d.reason and "40 task" in d.reason
    as_dict = d.to_dict()
    assert as_dict["promote"] is True and as_dict["mean_delta"] == d.mean_delta


def test_identical_scores_are_refused_with_a_point_ci():
    parent = {f"t{i}": float(i % 3) / 2 for i in range(20)}
    d = decide_promotion(dict(parent), parent)
    assert not d.promote
    assert (d.ci_low, d.ci_high) == (0.0, 0.0) and d.mean_delta == 0.0
    assert d.note and "no variability" in d.note and "refused" in d.reason


def test_noise_only_differences_are_refused():
    base = np.random.default_rng(1).uniform(0, 1, 30)
    refused = 0
    for trial in range(20):
        parent = _scores(30, base, 0.1, seed=2 * trial)
        child = _scores(30, base, 0.1, seed=2 * trial + 1)
        d = decide_promotion(child, parent, level=0.95, n_resamples=2000)
        assert d.ci_low <= d.mean_delta <= d.ci_high
        refused += not d.promote
    assert refused >= 17  # a 95% gate on pure noise promotes ~2.5% of the time


def test_the_default_level_is_the_gates():
    """Called without a level, decide_promotion judges at the level a loop's gate, GateConfig and
    `evotrainer gate` use: one constant, so a benchmark and a run cannot disagree by omission."""
    import inspect

    default = inspect.signature(decide_promotion).parameters["level"].default
    assert default == GATE_LEVEL == GateConfig().level == EvolutionConfig().gate_level == 0.9
    parent = {f"t{i}": 0.0 for i in range(30)}
    child = {f"t{i}": 0.1 * (i % 3) for i in range(30)}
    d = decide_promotion(child, parent)
    assert d.level == GATE_LEVEL and "90% CI" in d.reason
    assert (d.ci_low, d.ci_high) == (decide_promotion(child, parent, level=GATE_LEVEL).ci_low,
                                     decide_promotion(child, parent, level=GATE_LEVEL).ci_high)
    wide = decide_promotion(child, parent, level=0.95)
    assert wide.ci_low < d.ci_low and wide.ci_high > d.ci_high


def test_binary_scores_with_seeds_tie_is_refused():
    rng = np.random.default_rng(3)
    parent = {f"t{i}": rng.integers(0, 2, 4).astype(float).tolist() for i in range(25)}
    child = {k: rng.permutation(v).tolist() for k, v in parent.items()}  # same per-task mean
    d = decide_promotion(child, parent)
    assert not d.promote and d.mean_delta == 0.0 and d.n_seeds == 4


def test_mismatched_task_sets_raise_naming_the_ids():
    with pytest.raises(PairingError) as e:
        paired_deltas({"a": 1.0, "b": 0.0, "c": 1.0}, {"a": 1.0, "b": 1.0, "d": 0.0})
    msg = str(e.value)
    assert "'d'" in msg and "missing in child" in msg
    assert "'c'" in msg and "missing in parent" in msg
    with pytest.raises(PairingError):
        decide_promotion({"a": 1.0}, {"b": 1.0})


def test_different_seed_counts_raise():
    with pytest.raises(PairingError, match="seed"):
        paired_deltas({"a": [1.0, 0.0]}, {"a": [1.0, 0.0, 1.0]})


def test_bad_scores_raise():
    with pytest.raises(ValueError):
        paired_deltas({"a": []}, {"a": []})
    with pytest.raises(ValueError):
        paired_deltas({"a": float("nan")}, {"a": 0.0})
    with pytest.raises(ValueError):
        paired_deltas({}, {})


def test_seeds_are_averaged_per_task_before_resampling():
    child = {"a": [1.0, 0.0, 1.0, 1.0], "b": [0.0, 0.0], "c": 0.5}
    parent = {"a": [0.0, 0.0, 1.0, 0.0], "b": [1.0, 0.0], "c": 0.25}
    np.testing.assert_allclose(paired_deltas(child, parent), [0.5, -0.5, 0.25])
    # Resampling unit is the task: 10 tasks × 8 seeds gives the same decision as the 10 task means.
    rng = np.random.default_rng(4)
    p = {f"t{i}": rng.uniform(0, 1, 8).tolist() for i in range(10)}
    c = {k: (np.asarray(v) + rng.uniform(0, 0.2)).tolist() for k, v in p.items()}
    d_seeds = decide_promotion(c, p, min_tasks=2)
    d_means = decide_promotion({k: float(np.mean(v)) for k, v in c.items()},
                               {k: float(np.mean(v)) for k, v in p.items()}, min_tasks=2)
    assert d_seeds.n_tasks == 10 and d_seeds.n_seeds == 8
    assert d_seeds.mean_delta == pytest.approx(d_means.mean_delta)
    assert d_seeds.ci_low == pytest.approx(d_means.ci_low) and d_seeds.ci_high == pytest.approx(d_means.ci_high)


def test_determinism_with_seed():
    rng = np.random.default_rng(5)
    deltas = rng.normal(0.05, 0.2, 30)
    a, b = bootstrap_ci(deltas, seed=7), bootstrap_ci(deltas, seed=7)
    assert (a.low, a.high) == (b.low, b.high)
    c = bootstrap_ci(deltas, seed=8)
    assert (a.low, a.high) != (c.low, c.high)
    lo, hi = a  # unpacks as a pair
    assert lo < deltas.mean() < hi
    parent = {f"t{i}": 0.0 for i in range(30)}
    child = {f"t{i}": float(x) for i, x in enumerate(deltas)}
    assert decide_promotion(child, parent, seed=3).to_dict() == decide_promotion(child, parent, seed=3).to_dict()


def test_ci_level_widens_the_interval():
    deltas = np.random.default_rng(6).normal(0.0, 1.0, 25)
    narrow, wide = bootstrap_ci(deltas, level=0.8), bootstrap_ci(deltas, level=0.99)
    assert wide.low < narrow.low and wide.high > narrow.high


def test_min_delta_and_min_tasks():
    parent = {f"t{i}": 0.0 for i in range(30)}
    child = {f"t{i}": 0.1 + 0.01 * (i % 5) for i in range(30)}
    assert decide_promotion(child, parent).promote
    refused = decide_promotion(child, parent, min_delta=0.2)
    assert not refused.promote and "min_delta +0.2000" in refused.reason
    few = decide_promotion({k: child[k] for k in list(child)[:3]}, {k: 0.0 for k in list(child)[:3]})
    assert not few.promote and "min_tasks" in few.reason


def test_uniform_improvement_on_every_task_is_promoted():
    # All deltas equal and positive: a degenerate (point) CI above zero.
    parent = {f"t{i}": [0.0, 0.0] for i in range(12)}
    child = {f"t{i}": [1.0, 1.0] for i in range(12)}
    d = decide_promotion(child, parent)
    assert d.promote and (d.ci_low, d.ci_high) == (1.0, 1.0) and d.note


@settings(max_examples=40, deadline=None)
@given(data=st.data(), n_tasks=st.integers(2, 12), n_seeds=st.integers(1, 3))
def test_swapping_child_and_parent_flips_the_sign_and_never_promotes_both(data, n_tasks, n_seeds):
    seeds = st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]) | st.floats(0.0, 1.0), min_size=n_seeds,
                     max_size=n_seeds)
    child = {f"t{i}": data.draw(seeds) for i in range(n_tasks)}
    parent = {f"t{i}": data.draw(seeds) for i in range(n_tasks)}
    fwd = decide_promotion(child, parent, n_resamples=500, min_tasks=2)
    bwd = decide_promotion(parent, child, n_resamples=500, min_tasks=2)
    assert bwd.mean_delta == pytest.approx(-fwd.mean_delta, abs=1e-12)
    assert not (fwd.promote and bwd.promote)
    for d in (fwd, bwd):
        assert np.isfinite(d.ci_low) and np.isfinite(d.ci_high) and d.ci_low <= d.ci_high


# ---- minimum detectable effect ---------------------------------------------------------------------
def _demo_like(n=48):
    """The demo's gate: 48 tasks, control 12/48 (0.250), child 16/48 (0.333); 8 tasks only the child
    solves, 4 only the control, so the per-task deltas are +1 x8, -1 x4, 0 x36."""
    child = {f"t{i}": float(i < 16) for i in range(n)}
    control = {f"t{i}": float(8 <= i < 20) for i in range(n)}
    return child, control


def test_48_tasks_cannot_detect_8_points_at_the_demos_noise():
    from evotrainer.fitness.paired_stats import minimum_detectable_effect

    child, control = _demo_like()
    d = decide_promotion(child, control, level=0.9)
    assert d.mean_delta == pytest.approx(4 / 48) and not d.promote
    # sd of (+1 x8, -1 x4, 0 x36) = 0.498; MDE = (z_0.95 + z_0.8) * 0.498 / sqrt(48) = 0.179.
    assert d.sd_delta == pytest.approx(0.4981, abs=1e-3)
    assert d.mde == pytest.approx(0.179, abs=0.002) and d.mde > 0.08
    assert d.mde == pytest.approx(minimum_detectable_effect(d.sd_delta, 48, 0.9, 0.8))
    assert "minimum detectable effect +0.179 at 80% power" in d.reason
    # Four times the tasks halve it: the figure moves the way a sample-size calculation says.
    assert minimum_detectable_effect(d.sd_delta, 192, 0.9) == pytest.approx(d.mde / 2)


def test_a_true_effect_equal_to_the_mde_is_promoted_about_80_percent_of_the_time():
    """The stated MDE is what the gate detects: at a true delta equal to it, simulated gates of the
    same size and noise promote close to 80% of the time (and at a quarter of it, rarely)."""
    from evotrainer.fitness.paired_stats import minimum_detectable_effect

    n, discordant, level = 48, 0.25, 0.9
    delta = 0.1
    for _ in range(50):   # the MDE of the population sd, which itself depends on the true delta
        delta = minimum_detectable_effect(float(np.sqrt(discordant - delta ** 2)), n, level)
    rng = np.random.default_rng(0)

    def promote_rate(true_delta, reps=150):
        up, down = (discordant + true_delta) / 2, (discordant - true_delta) / 2
        hits = 0
        for _ in range(reps):
            u = rng.uniform(size=n)
            deltas = np.where(u < up, 1.0, np.where(u < up + down, -1.0, 0.0))
            hits += decide_promotion({f"t{i}": x for i, x in enumerate(deltas)}, {f"t{i}": 0.0 for i in range(n)},
                                     level=level, n_resamples=1000).promote
        return hits / reps

    assert 0.65 <= promote_rate(delta) <= 0.93, delta
    assert promote_rate(delta / 4) < 0.25


def test_no_variability_gives_no_mde_and_says_so():
    same = {f"t{i}": 1.0 for i in range(10)}
    d = decide_promotion(same, dict(same))
    assert d.mde is None and "minimum detectable effect not estimable" in d.reason
