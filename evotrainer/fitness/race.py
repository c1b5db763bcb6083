"""A racing gate: child and control scored on held-out tasks in rounds, stopped as soon as the evidence
decides, with its error controlled across every look.

A fixed 24-task gate can only see effects of about 0.28 (``paired_stats``' minimum detectable effect on
the embedded model), so a +0.1 child is refused as often as a chance winner is promoted. Drawing more
tasks fixes the power, but looking after every round and stopping when the interval clears 0 inflates
the error of an ordinary interval. This module uses a confidence *sequence* instead: an interval that
holds at every number of tasks at once, so a gate may look as often as it likes.

The sequence is the predictable-plug-in empirical-Bernstein one of Waudby-Smith and Ramdas
("Estimating means of bounded random variables by betting", JRSS-B 2023, Theorem 2) for per-task
paired deltas ``child - control`` in [-1, 1] (each task's score a mean over its sampling seeds), mapped
to [0, 1]. Its guarantee is for tasks drawn independently from a population (with replacement). A
gate that draws without replacement from a pool much larger than its cap is close to that; racing
over a whole small pool is not covered by the theorem (the authors give a separate sequence for
sampling without replacement).

The race stops when the sequence's lower bound clears ``min_delta`` (promote); when its upper bound
falls below ``min_effect`` (refuse: whatever the child gains is smaller than the smallest gain worth
promoting); or at ``cap`` tasks (refuse: not separated).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

LAMBDA_MAX = 0.75   # the bet never stakes more than this (the paper's c)


def confidence_sequence(deltas: Sequence[float], alpha: float) -> tuple[float, float]:
    """The (1 - alpha) time-uniform interval of the mean of ``deltas`` (each in [-1, 1]) after all of them.

    Every prefix's interval holds at once with probability at least 1 - alpha, so stopping at any
    prefix the data pick keeps that guarantee."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if not deltas:
        return -1.0, 1.0
    log_term = math.log(2.0 / alpha)
    # Running estimates from the tasks before each one (predictable: the bet on task t uses 1..t-1).
    total = weighted = penalty = 0.0
    mean_prev, var_sum, x_sum = 0.5, 0.25, 0.0
    for t, d in enumerate(deltas, start=1):
        if not -1.0 - 1e-9 <= d <= 1.0 + 1e-9:
            raise ValueError(f"a paired delta must lie in [-1, 1], got {d}")
        x = (d + 1.0) / 2.0
        var_prev = var_sum / t                                    # sigma^2_{t-1}, with its 1/4 prior
        lam = min(math.sqrt(2.0 * log_term / (var_prev * t * math.log(1.0 + t))), LAMBDA_MAX)
        total += lam
        weighted += lam * x
        penalty += 4.0 * (x - mean_prev) ** 2 * (-math.log(1.0 - lam) - lam) / 4.0
        x_sum += x
        mean_prev = (0.5 + x_sum) / (t + 1)                      # mu_t, with its prior 1/2
        var_sum += (x - mean_prev) ** 2
    centre, width = weighted / total, (log_term + penalty) / total
    return 2.0 * max(0.0, centre - width) - 1.0, 2.0 * min(1.0, centre + width) - 1.0


@dataclass
class RaceDecision:
    promote: bool
    stopped: str                 # "promote" | "below_min_effect" | "cap"
    n_tasks: int
    mean_delta: float
    ci_low: float
    ci_high: float
    level: float
    looks: int

    def to_dict(self) -> dict:
        return asdict(self)


def race(deltas: Sequence[float], level: float = 0.9, min_delta: float = 0.0, min_effect: float = 0.05,
         round_size: int = 24, cap: int = 480) -> RaceDecision:
    """Reads ``deltas`` (per-task child - control, in the order the tasks were drawn) in rounds of
    ``round_size``, as a gate that verifies one round at a time would, and stops at the first look
    that decides. The error is controlled across all looks: a child no better than its control is
    promoted with probability at most (1 - level) / 2."""
    if round_size < 1 or cap < round_size:
        raise ValueError(f"need 1 <= round_size <= cap, got round_size {round_size}, cap {cap}")
    alpha = 1.0 - level
    looks, n = 0, 0
    available = min(len(deltas), cap)
    low, high = -1.0, 1.0
    while n < available:
        n = min(n + round_size, available)
        looks += 1
        low, high = confidence_sequence(deltas[:n], alpha)
        mean = sum(deltas[:n]) / n
        if low > min_delta:
            return RaceDecision(True, "promote", n, mean, low, high, level, looks)
        if high < min_effect:
            return RaceDecision(False, "below_min_effect", n, mean, low, high, level, looks)
    mean = sum(deltas[:n]) / n if n else 0.0
    return RaceDecision(False, "cap", n, mean, low, high, level, looks)
