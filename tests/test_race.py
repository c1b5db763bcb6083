"""The racing gate's confidence sequence: it holds across every look (an A/A race rarely promotes however
often it looks), it sees a +0.1 child that a 24-task gate misses, and it stops early when the evidence
is plain."""

from __future__ import annotations

import numpy as np
import pytest

from evotrainer.fitness.race import confidence_sequence, race


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
