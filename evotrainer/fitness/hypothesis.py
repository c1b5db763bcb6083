"""Judging an intervention's expected effect after training: confirmed, refuted or untestable.

The falsifiable claim an operator attached to a child ("dead_group_ratio < 0.3", "heldout_accuracy
delta> 0") is checked against what was measured: the child's health-report metrics against its
control's, the parent continued under the parent's own harness for the same steps on the same tasks
and seeds. A claim on the fitness is judged by the gate's paired CI, not by the two means: confirmed
only when the CI's lower bound clears the claimed delta, so seed noise cannot confirm it. A claim on a
metric that neither side measured is untestable, and says so.
"""

from __future__ import annotations

from typing import Any

from evotrainer.operators.intervention import FITNESS_METRIC, ExpectedEffect
from evotrainer.records.numeric import finite_or_none

VERDICTS = ("confirmed", "refuted", "untestable")


def judge_effect(expected: dict[str, Any] | None, control: dict[str, Any], child: dict[str, Any],
                 paired: dict[str, Any] | None = None) -> dict[str, Any]:
    """The verdict on ``expected`` with the numbers it rests on (JSON-able, for the version record)."""
    if not expected:
        return {"verdict": "untestable", "reason": "the intervention stated no expected effect"}
    effect = ExpectedEffect.from_dict(expected)
    out: dict[str, Any] = {"expected": str(effect)}
    if paired and paired.get("basis") == "working_calls":   # a tie at nothing resolved (fitness/gates.py):
        paired = paired.get("resolution")                    # the fitness claim is judged on resolution
    if effect.metric == FITNESS_METRIC and effect.op.startswith("delta") and paired and "ci_low" in paired:
        lo, hi = float(paired["ci_low"]), float(paired["ci_high"])
        out.update(measured_delta=paired.get("mean_delta"), ci=[lo, hi])
        if effect.op == "delta>":
            ok = lo > effect.value
        else:
            ok = hi < effect.value
        out["verdict"] = "confirmed" if ok else "refuted"
        out["reason"] = (f"paired held-out delta {paired.get('mean_delta', 0):+.3f}, "
                         f"{100 * float(paired.get('level', 0.9)):.0f}% CI [{lo:+.3f}, {hi:+.3f}] "
                         f"{'clears' if ok else 'does not clear'} {effect.op} {effect.value:g}")
        return out
    now, then = finite_or_none(child.get(effect.metric)), finite_or_none(control.get(effect.metric))
    out.update(child=now, control=then)
    if now is None or (effect.op.startswith("delta") and then is None):
        out.update(verdict="untestable", reason=f"{effect.metric} was not measured on both the child and its control")
        return out
    ok = effect.check(control, child)
    out["verdict"] = "confirmed" if ok else "refuted"
    shown = f"{now:.4g}" + (f" vs control {then:.4g}" if then is not None else "")
    out["reason"] = f"measured {effect.metric} {shown}: {'meets' if ok else 'misses'} {effect}"
    return out
