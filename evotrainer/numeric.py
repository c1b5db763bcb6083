"""Small numeric helper shared by records that accept numbers from JSON, LLM replies or hooks."""

from __future__ import annotations

import math
from typing import Any


def finite_or_none(x: Any) -> float | None:
    """``float(x)`` when it is a finite number, else None (NaN, inf, None, text)."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None
