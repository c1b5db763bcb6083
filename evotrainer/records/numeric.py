"""The numeric helpers every part shares: one mean, one population std, one "dead group" rule.

Numbers arrive from JSON, LLM replies and harness hooks, so ``finite_or_none`` is the one gate
they pass; ``pstd`` is what GRPO normalises by, so "dead group" means exactly one thing across
training, reports, backtests and gates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

DEAD_STD = 1e-6   # a group whose reward std is below this carries no signal


def finite_or_none(x: Any) -> float | None:
    """``float(x)`` when it is a finite number, else None (NaN, inf, None, text)."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def mean(xs: Sequence[float]) -> float:
    """Mean of the finite values (NaN when there are none)."""
    xs = [x for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else math.nan


def pstd(xs: Sequence[float]) -> float:
    """Population std, what GRPO normalises by (0 for fewer than two values)."""
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def percentile(xs: Sequence[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def is_dead(rewards: Sequence[float]) -> bool:
    return pstd(rewards) < DEAD_STD
