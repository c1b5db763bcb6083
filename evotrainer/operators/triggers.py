"""Triggers: when a library entry or a skill applies to a health report.

A trigger is data, never code: a list of ``{"metric", "op", "value"}`` conditions that must all hold
over ``report_metrics(report)`` (the report's numeric metrics plus ``alert:<name> = 1`` for each alert
that fired). Library entries (``library_entry.py``) and skills (``loop/knowledge/skills.py``) read reports the
same way through this one module, so an entry and the skill it becomes fire on the same reports.
"""

from __future__ import annotations

import operator
from typing import Any

from evotrainer.records.numeric import finite_or_none

TRIGGER_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
               "!=": operator.ne}


def when(metric: str, op: str, value: float) -> dict[str, Any]:
    """One condition of a trigger: ``metric op value`` (``op`` one of ``TRIGGER_OPS``)."""
    return {"metric": metric, "op": op, "value": value}


def holds(condition: dict[str, Any], metrics: dict[str, Any]) -> bool:
    """A condition on a metric that is absent or not a number does not hold."""
    x = finite_or_none(metrics.get(condition["metric"]))
    return x is not None and TRIGGER_OPS[condition["op"]](x, float(condition["value"]))


def report_metrics(report: dict[str, Any]) -> dict[str, float]:
    """A health report (``HealthReport.to_dict()``) flattened into what triggers read: its numeric
    metrics plus ``alert:<name> = 1`` for every alert that fired (``findings`` in older reports)."""
    out = {k: x for k, v in (report.get("metrics") or {}).items() if (x := finite_or_none(v)) is not None}
    for a in report.get("alerts") or report.get("findings") or []:
        if isinstance(a, dict) and a.get("name"):
            out[f"alert:{a['name']}"] = 1.0
    return out
