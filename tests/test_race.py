"""The racing gate's confidence sequence: it holds across every look (an A/A race rarely promotes however
often it looks), it sees a +0.1 child that a 24-task gate misses, and it stops early when the evidence
is plain."""

from __future__ import annotations

import numpy as np
import pytest

from evotrainer.fitness.race import boundaries, confidence_sequence, looks, race, sequential_decision, z_statistic


def paired(rng, n, effect, discordance=0.29):
    """Per-task deltas of two policies whose outcomes disagree on ``discordance`` of tasks when equal,
    the child winning a disagreement with probability 1/2 + effect / (2 * discordance)."""
    disagree = rng.random(n) < discordance
    child_wins = rng.random(n) < 0.5 + effect / (2 * discordance)
    return np.where(disagree, np.where(child_wins, 1.0, -1.0), 0.0).tolist()


def test_the_sequence_contains_the_mean_and_narrows():
    rng = np.random.default_rng(0)
    d = paired(rng, 800, 0.0)
    wide, narrow = confidence_sequence(d[:50], 0.1), confidence_sequence(d, 0.1)
    assert wide[0] < 0 < wide[1] and narrow[0] < 0 < narrow[1]
    assert narrow[1] - narrow[0] < 0.5 * (wide[1] - wide[0])
    assert confidence_sequence([], 0.1) == (-1.0, 1.0)
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        confidence_sequence([2.0], 0.1)


def test_an_a_a_race_rarely_promotes_however_often_it_looks():
    rng = np.random.default_rng(1)
    promoted = sum(race(paired(rng, 480, 0.0), level=0.9, round_size=12, cap=480).promote for _ in range(400))
    assert promoted / 400 <= 0.05 + 0.02       # at most (1 - level) / 2, with simulation noise


def test_a_planted_gain_is_promoted_and_a_plain_one_early():
    rng = np.random.default_rng(2)
    wins = [race(paired(rng, 960, 0.1), level=0.9, round_size=48, cap=960) for _ in range(200)]
    assert sum(w.promote for w in wins) / 200 >= 0.8
    big = race(paired(rng, 960, 0.25), level=0.9, round_size=48, cap=960)
    assert big.promote and big.n_tasks < 480 and big.looks == big.n_tasks // 48


def test_a_child_worse_than_worth_promoting_stops_before_the_cap():
    rng = np.random.default_rng(3)
    d = race(paired(rng, 960, -0.15), level=0.9, min_effect=0.05, round_size=48, cap=960)
    assert not d.promote and d.stopped == "below_min_effect" and d.n_tasks < 960
    tie = race([0.0] * 100, round_size=24, cap=100)
    assert not tie.promote and tie.n_tasks == 100 and tie.stopped in ("cap", "below_min_effect")


def paper_sequence(deltas, alpha):
    """Theorem 2 of Waudby-Smith and Ramdas (2023), written out vectorised from the paper's definitions."""
    x = (np.asarray(deltas, dtype=float) + 1) / 2
    t = np.arange(1, x.size + 1)
    mu = (0.5 + np.cumsum(x)) / (t + 1)                                   # mu_t, prior 1/2
    sigma2 = (0.25 + np.cumsum((x - mu) ** 2)) / (t + 1)                  # sigma^2_t, prior 1/4
    mu_prev, sigma2_prev = np.r_[0.5, mu[:-1]], np.r_[0.25, sigma2[:-1]]
    lam = np.minimum(np.sqrt(2 * np.log(2 / alpha) / (sigma2_prev * t * np.log(1 + t))), 0.75)
    psi = (-np.log(1 - lam) - lam) / 4
    centre = np.sum(lam * x) / np.sum(lam)
    width = (np.log(2 / alpha) + np.sum(4 * (x - mu_prev) ** 2 * psi)) / np.sum(lam)
    return 2 * max(0.0, centre - width) - 1, 2 * min(1.0, centre + width) - 1


@pytest.mark.parametrize("n", [1, 5, 50, 500])
def test_the_sequence_is_the_paper_s(n):
    d = paired(np.random.default_rng(n), n, 0.05)
    assert confidence_sequence(d, 0.1) == pytest.approx(paper_sequence(d, 0.1), abs=1e-12)


# ---- the group-sequential test the loop's racing gate runs -------------------------------------------
def test_looks_double_the_gate_draw_up_to_the_cap():
    assert looks(24, 192) == (24, 48, 96, 192)
    assert looks(24, 100) == (24, 48, 96, 100) and looks(24, 24) == (24,)
    with pytest.raises(ValueError, match="first <= cap"):
        looks(48, 24)


def test_one_look_has_the_fixed_tests_boundary_and_later_looks_spend_little_early():
    assert boundaries((24,), 0.05)[0] == pytest.approx(1.645, abs=0.02)
    b = boundaries(looks(24, 192), 0.05)
    assert b[0] > b[1] > b[2] > b[3] and b[0] > 4.0          # O'Brien-Fleming: almost nothing spent early
    assert b[-1] == pytest.approx(1.67, abs=0.05)             # the last look keeps the fixed test's power


def test_an_a_a_race_promotes_at_most_its_error_over_every_look():
    rng = np.random.default_rng(4)
    runs = [sequential_decision(paired(rng, 192, 0.0), looks(24, 192), level=0.9) for _ in range(1500)]
    assert sum(r.promote for r in runs) / len(runs) <= 0.05 + 0.015
    assert {r.stopped for r in runs} == {"promote", "behind", "cap"}
    assert sum(r.stopped == "behind" for r in runs) / len(runs) > 0.3     # futility saves tasks on ties


def test_a_planted_gain_of_a_tenth_is_promoted_at_least_four_times_in_five_by_384_tasks():
    rng = np.random.default_rng(5)
    runs = [sequential_decision(paired(rng, 384, 0.1), looks(24, 384), level=0.9) for _ in range(600)]
    assert sum(r.promote for r in runs) / len(runs) >= 0.8
    assert np.mean([r.n_tasks for r in runs]) < 300            # a clear win stops before the cap


def test_a_race_asks_for_more_tasks_until_its_next_look_and_reads_only_whole_looks():
    d = [1.0, 0.0, -1.0, 0.0] * 12                             # 48 tasks: a tie
    first = sequential_decision(d[:30], (24, 48, 96))
    assert first.stopped == "continue" and first.look == 1 and first.n_tasks == 24
    assert sequential_decision([], (24, 48)).stopped == "continue"
    second = sequential_decision(d, (24, 48, 96))
    assert second.look == 2 and second.n_tasks == 48 and second.stopped == "continue"   # z = 0: not behind
    assert sequential_decision([1.0] * 24, (24, 48)).stopped == "promote"
    assert sequential_decision([0.0] * 23 + [-1.0], (24, 48)).stopped == "continue"    # the first look never refuses
    assert sequential_decision([-1.0] * 48, (24, 48)).stopped == "behind"
    assert sequential_decision([0.0] * 48, (24, 48)).stopped == "cap"
    with pytest.raises(ValueError, match="increasing"):
        sequential_decision(d, (48, 24))


def test_the_z_statistic_is_the_paired_one_and_says_a_sign_when_every_delta_is_equal():
    assert z_statistic([1.0, 0.0, 1.0, 0.0]) == pytest.approx(0.5 / (np.std([1, 0, 1, 0], ddof=1) / 2))
    assert z_statistic([0.5, 0.5]) == float("inf") and z_statistic([0.0, 0.0]) == 0.0
    assert z_statistic([0.2, 0.2], min_delta=0.2) == 0.0 and z_statistic([0.1]) == 0.0 and z_statistic([]) == 0.0
