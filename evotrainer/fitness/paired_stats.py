"""Paired statistics for promotion gates: a child branch against its parent on the same tasks.

A gate compares child and parent on the SAME held-out tasks, sampled with the SAME seeds, so the
unit of evidence is the per-task difference ``child - parent`` (the task's difficulty cancels out).
Several seeds per task are averaged per task *before* resampling: seeds of one task are not
independent evidence, tasks are. The confidence interval of the mean delta is a bootstrap over
tasks (``scipy.stats.bootstrap``, BCa by default), and the rule is conservative:

    promote  iff  lower CI bound of the mean per-task delta  >  min_delta

so a tie, or a difference the noise explains, is refused. Swapping child and parent negates every
delta; with ``min_delta >= 0`` at most one direction can be promoted.

Every decision also states its **minimum detectable effect**: the smallest true mean delta this gate
would promote with ``power`` (80%) probability, given its number of tasks, its level and the observed
sd of the per-task deltas (normal approximation of the CI's lower bound). A refusal whose MDE is
above the effect a user hoped for says "this gate could not have seen it", not "there is no effect".
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from evotrainer.config import GATE_LEVEL

Score = float | int | Sequence[float]
METHODS = ("BCa", "percentile", "basic")


class PairingError(ValueError):
    """Child and parent were not scored on the same tasks (or the same number of seeds)."""


# ---- per-task deltas ----------------------------------------------------------------------------
def _seed_scores(task_id, value, side: str) -> np.ndarray:
    if isinstance(value, numbers.Real):
        arr = np.asarray([float(value)])
    else:
        try:
            arr = np.asarray(list(value), dtype=float)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{side} score of task {task_id!r} must be a number or a list of numbers, "
                            f"got {value!r}") from e
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{side} has no scores for task {task_id!r}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{side} score of task {task_id!r} is not finite: {arr.tolist()}")
    return arr


def _check_same_tasks(child: Mapping, parent: Mapping) -> list:
    missing_in_child = set(parent) - set(child)
    missing_in_parent = set(child) - set(parent)
    if missing_in_child or missing_in_parent:
        parts = []
        if missing_in_child:
            parts.append(f"missing in child: {sorted(map(str, missing_in_child))}")
        if missing_in_parent:
            parts.append(f"missing in parent: {sorted(map(str, missing_in_parent))}")
        raise PairingError("child and parent must be scored on the same tasks; " + "; ".join(parts))
    if not child:
        raise ValueError("no tasks to compare")
    return sorted(child, key=lambda t: (str(type(t)), str(t)))


def _paired(child: Mapping, parent: Mapping) -> tuple[np.ndarray, list[int]]:
    """(per-task deltas, seeds per task), tasks in a fixed (sorted) order."""
    deltas, seeds = [], []
    for task in _check_same_tasks(child, parent):
        c, p = _seed_scores(task, child[task], "child"), _seed_scores(task, parent[task], "parent")
        if c.size != p.size:
            raise PairingError(f"task {task!r}: child has {c.size} seed score(s), parent {p.size}; a paired "
                               "comparison needs the same sampling seeds on both sides")
        deltas.append(float(c.mean() - p.mean()))
        seeds.append(int(c.size))
    return np.asarray(deltas, dtype=float), seeds


def paired_deltas(child: Mapping[object, Score], parent: Mapping[object, Score]) -> np.ndarray:
    """Per-task deltas ``mean(child seeds) - mean(parent seeds)``, one per task, tasks sorted by id.

    ``child`` / ``parent`` map task id → a score, or a list of scores (one per sampling seed, the same
    seeds on both sides). Raises :class:`PairingError` naming the task ids one side lacks, or a task
    whose seed counts differ.
    """
    return _paired(child, parent)[0]


# ---- bootstrap confidence interval --------------------------------------------------------------
@dataclass(frozen=True)
class ConfidenceInterval:
    """A CI of the mean delta. Unpacks as ``low, high = ci``; ``note`` explains any special case."""

    low: float
    high: float
    level: float
    method: str
    note: str = ""

    def __iter__(self) -> Iterator[float]:
        return iter((self.low, self.high))


def bootstrap_ci(deltas: Sequence[float] | np.ndarray, level: float = 0.95, n_resamples: int = 10_000,
                 seed: int = 0, method: str = "BCa") -> ConfidenceInterval:
    """Bootstrap CI of the mean of per-task deltas (resampling tasks, i.e. paired).

    Degenerate cases get a point interval and a note instead of scipy's warning and NaN: all deltas
    equal (no variability: the CI is ``(d, d)``, ``(0, 0)`` for a perfect tie), a single task. When BCa
    is undefined (e.g. very few distinct values) the percentile interval is used, with a note.
    """
    d = np.asarray(deltas, dtype=float).ravel()
    if d.size == 0:
        raise ValueError("no deltas: nothing to bootstrap")
    if not np.all(np.isfinite(d)):
        raise ValueError("deltas must be finite")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if np.ptp(d) == 0.0:
        v = float(d[0])
        return ConfidenceInterval(v, v, level, "degenerate",
                                  f"all {d.size} deltas equal {v:g}: no variability to resample, CI is a point")

    def run(m: str):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = stats.bootstrap((d,), np.mean, n_resamples=n_resamples, confidence_level=level, method=m,
                                  vectorized=True, rng=np.random.default_rng(seed))
        return float(res.confidence_interval.low), float(res.confidence_interval.high)

    low, high = run(method)
    note = ""
    if not (math.isfinite(low) and math.isfinite(high)) and method != "percentile":
        low, high = run("percentile")
        note = f"{method} interval undefined on these deltas; percentile interval used"
        method = "percentile"
    if not (math.isfinite(low) and math.isfinite(high)):
        m = float(d.mean())
        return ConfidenceInterval(m, m, level, "degenerate", "bootstrap gave no finite interval; CI is the mean")
    return ConfidenceInterval(low, high, level, method, note)


# ---- minimum detectable effect -------------------------------------------------------------------
def minimum_detectable_effect(sd: float, n_tasks: int, level: float = 0.95, power: float = 0.8,
                              min_delta: float = 0.0) -> float | None:
    """The smallest true mean delta the gate promotes with probability ``power``.

    The gate promotes when the lower bound of a two-sided ``level`` CI clears ``min_delta``, i.e. when
    the mean delta exceeds ``min_delta + z_(1-(1-level)/2) * se``; that happens with probability
    ``power`` when the true delta is ``min_delta + (z_(1-(1-level)/2) + z_power) * sd / sqrt(n)``.
    None when ``sd`` is 0 (no variability observed: nothing to extrapolate from) or n < 2.
    """
    if not 0.0 < power < 1.0:
        raise ValueError(f"power must be in (0, 1), got {power}")
    if n_tasks < 2 or not sd > 0.0:
        return None
    z = stats.norm.ppf(1.0 - (1.0 - level) / 2.0) + stats.norm.ppf(power)
    return float(min_delta + z * sd / math.sqrt(n_tasks))


# ---- the promotion decision ---------------------------------------------------------------------
@dataclass
class PromotionDecision:
    promote: bool
    mean_delta: float
    ci_low: float
    ci_high: float
    level: float
    n_tasks: int
    n_seeds: int            # sampling seeds per task (the smallest count when tasks differ)
    reason: str
    min_delta: float = 0.0
    method: str = "BCa"
    note: str = ""
    sd_delta: float | None = None     # sample sd of the per-task deltas
    mde: float | None = None          # minimum detectable effect at ``power`` (None: not estimable)
    power: float = 0.8

    def to_dict(self) -> dict:
        return asdict(self)


def decide_promotion(child: Mapping[object, Score], parent: Mapping[object, Score], level: float = GATE_LEVEL,
                     min_delta: float = 0.0, n_resamples: int = 10_000, seed: int = 0, method: str = "BCa",
                     min_tasks: int = 5, power: float = 0.8) -> PromotionDecision:
    """Promote the child iff the lower bound of the bootstrap CI of the mean per-task delta
    (child - parent, same tasks and seeds) exceeds ``min_delta``.

    Fewer than ``min_tasks`` tasks is refused outright (a bootstrap over a handful of tasks is not
    evidence). As a guard against a pathological interval, the mean delta itself must also exceed
    ``min_delta`` (a no-op whenever the CI contains the mean). The reason ends with the gate's
    minimum detectable effect at ``power`` (:func:`minimum_detectable_effect`).
    """
    deltas, seeds = _paired(child, parent)
    n_tasks, n_seeds = len(deltas), min(seeds)
    seeds_txt = f"{n_seeds} seed(s)/task" if min(seeds) == max(seeds) else f"{min(seeds)}–{max(seeds)} seeds/task"
    mean = float(deltas.mean())
    ci = bootstrap_ci(deltas, level=level, n_resamples=n_resamples, seed=seed, method=method)
    pct = f"{100 * level:g}%"
    numbers = (f"mean delta {mean:+.4f}, {pct} CI [{ci.low:+.4f}, {ci.high:+.4f}] ({ci.method}, "
               f"{n_resamples} resamples, seed {seed}) over {n_tasks} task(s), {seeds_txt}")
    if n_tasks < min_tasks:
        promote = False
        reason = f"refused: only {n_tasks} task(s) < min_tasks={min_tasks}; {numbers}"
    elif ci.low > min_delta and mean > min_delta:
        promote = True
        reason = f"promoted: CI lower bound {ci.low:+.4f} > min_delta {min_delta:+.4f}; {numbers}"
    else:
        promote = False
        reason = f"refused: CI lower bound {ci.low:+.4f} <= min_delta {min_delta:+.4f}; {numbers}"
    sd = float(deltas.std(ddof=1)) if n_tasks > 1 else None
    mde = minimum_detectable_effect(sd or 0.0, n_tasks, level, power, min_delta)
    reason += "; " + mde_text(mde, sd, n_tasks, power)
    if ci.note:
        reason += f"; note: {ci.note}"
    return PromotionDecision(promote=promote, mean_delta=mean, ci_low=ci.low, ci_high=ci.high, level=level,
                             n_tasks=n_tasks, n_seeds=n_seeds, reason=reason, min_delta=min_delta,
                             method=ci.method, note=ci.note, sd_delta=sd, mde=mde, power=power)


def mde_text(mde: float | None, sd: float | None, n_tasks: int, power: float = 0.8) -> str:
    """The minimum detectable effect as the gate's record states it."""
    if mde is None:
        return (f"minimum detectable effect not estimable (paired sd {sd or 0.0:.3g} over {n_tasks} task(s): "
                "no variability observed)")
    return (f"minimum detectable effect {mde:+.3f} at {100 * power:g}% power (paired sd {sd:.3g}, "
            f"{n_tasks} task(s))")
