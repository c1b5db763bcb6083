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

The sequence is valid at any number of looks, and pays for it: it needs about 470 tasks to promote a
+0.1 child 94% of the time (``benchmarks/racing_gate.py``). A gate looks only a few times, at round
sizes fixed before it starts, so it can spend its error on those looks alone: a *group-sequential*
test (``sequential_decision``). Its looks double the gate draw up to a cap (24, 48, 96, 192); at look
k it promotes when the paired z statistic clears a boundary b_k from the Lan-DeMets spending function
of O'Brien-Fleming type (Lan and DeMets, Biometrika 1983), which spends almost nothing on the early
looks and keeps the last boundary near the fixed test's; it refuses a child behind its control at any
look after the first (a non-binding futility stop: stopping to refuse can only lower the error). The
boundaries hold the one-sided error at (1 - level) / 2, as the fixed gate's lower bound of a
``level`` interval does. They are computed by simulating the Brownian motion that the z statistics
of independent tasks follow at the looks' information fractions (a seeded simulation, so every run
draws the same boundaries).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist

import numpy as np

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


# ---- the group-sequential test a gate runs --------------------------------------------------------
PATHS = 400_000   # simulated paths per set of boundaries: each within about 0.01 of exact, but the first of
                  # several looks, whose error O'Brien-Fleming spends almost none of (a higher boundary by ~0.8)
FUTILITY_Z = 0.0  # refuse at a look after the first when the child is behind its control


def looks(first: int, cap: int) -> tuple[int, ...]:
    """The tasks read at each look: the gate draw, then doubling, the last look at ``cap``."""
    if first < 1 or cap < first:
        raise ValueError(f"need 1 <= first <= cap, got first {first}, cap {cap}")
    out = [first]
    while out[-1] < cap:
        out.append(min(2 * out[-1], cap))
    return tuple(out)


@functools.lru_cache(maxsize=64)
def boundaries(schedule: tuple[int, ...], alpha: float) -> tuple[float, ...]:
    """The z boundary of each look: the one-sided error ``alpha`` spent as the O'Brien-Fleming-type
    spending function says, ``alpha(t) = 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t))`` by information fraction
    t (all of alpha by t = 1), each boundary set so that a race under no effect first crosses it with
    exactly the error spent at that look."""
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"one-sided alpha must be in (0, 0.5), got {alpha}")
    normal = NormalDist()
    t = np.asarray(schedule, dtype=float) / schedule[-1]
    rng = np.random.default_rng(20231)
    steps = rng.standard_normal((PATHS, len(t))) * np.sqrt(np.diff(np.concatenate([[0.0], t])))
    z = np.cumsum(steps, axis=1) / np.sqrt(t)
    spent = [2.0 - 2.0 * normal.cdf(normal.inv_cdf(1.0 - alpha / 2.0) / math.sqrt(f)) for f in t]
    alive, out, before = np.ones(PATHS, dtype=bool), [], 0.0
    for k in range(len(t)):
        share = (spent[k] - before) * PATHS / max(int(alive.sum()), 1)   # of the paths not yet stopped
        b = float(np.quantile(z[alive, k], 1.0 - share)) if share < 1.0 else -math.inf
        out.append(b)
        alive &= ~(z[:, k] > b)
        before = spent[k]
    return tuple(out)


def z_statistic(deltas: Sequence[float], min_delta: float = 0.0) -> float:
    """The paired z statistic of ``mean(deltas) - min_delta`` (sample sd, n - 1)."""
    n = len(deltas)
    if n < 2:
        return 0.0
    mean = sum(deltas) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in deltas) / (n - 1))
    if sd == 0.0:   # every task the same delta: the sign of what is left decides
        return 0.0 if mean == min_delta else math.copysign(math.inf, mean - min_delta)
    return (mean - min_delta) / (sd / math.sqrt(n))


@dataclass
class SequentialDecision:
    """Where a group-sequential race stands after the tasks read so far."""
    stopped: str                # "promote" | "behind" | "cap" | "continue" (the next look needs more tasks)
    look: int                   # looks taken (1-based)
    n_tasks: int                # tasks the decision read
    z: float
    boundary: float
    schedule: tuple[int, ...]
    level: float

    @property
    def promote(self) -> bool:
        return self.stopped == "promote"

    def to_dict(self) -> dict:
        return asdict(self) | {"schedule": list(self.schedule)}


def sequential_decision(deltas: Sequence[float], schedule: Sequence[int], level: float = 0.9,
                        min_delta: float = 0.0) -> SequentialDecision:
    """Reads the per-task deltas (in the order the tasks were drawn) look by look and stops at the first
    that decides; "continue" when the deltas end before the next look (the gate verifies another
    round), "cap" after the last look. A child no better than ``min_delta`` is promoted with
    probability at most (1 - level) / 2 over the whole race."""
    schedule = tuple(schedule)
    if not schedule or list(schedule) != sorted(set(schedule)) or schedule[0] < 1:
        raise ValueError(f"a schedule is increasing task counts, got {list(schedule)}")
    bounds = boundaries(schedule, (1.0 - level) / 2.0)
    decision = SequentialDecision("continue", 0, 0, 0.0, bounds[0], schedule, level)
    for k, (n, b) in enumerate(zip(schedule, bounds)):
        if len(deltas) < n:
            return decision
        z = z_statistic(deltas[:n], min_delta)
        decision = SequentialDecision("continue", k + 1, n, z, b, schedule, level)
        if z > b:
            decision.stopped = "promote"
        elif k > 0 and z < FUTILITY_Z:
            decision.stopped = "behind"
        elif k == len(schedule) - 1:
            decision.stopped = "cap"
        if decision.stopped != "continue":
            return decision
    return decision
