"""Continuations: at the propose stage each survivor goes on under its own harness, before any child
is proposed. A continuation is the control its parent's children are paired against at the gate
(``loop/stages/gating.py``), and it trains whether or not a child is proposed beside it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from evotrainer.loop.versions import new_version
from evotrainer.records.history import RevertRecord

if TYPE_CHECKING:
    from evotrainer.loop.experiment import Experiment


def continue_survivors(exp: Experiment, generation: int) -> None:
    """Each survivor goes on under its own harness: the control its children are paired against."""
    s = exp.state
    continued = {exp.vdir(v).meta().parents[0] for v in s.live if exp.vdir(v).meta().operator is None}
    reverts = {h.to: h for h in s.history if isinstance(h, RevertRecord) and h.generation == generation}
    for sid in s.survivors:
        if sid not in continued:
            parent, revert = exp.vdir(sid).meta(), reverts.get(sid)
            # A revert continues an ancestor: recorded as a continuation whose factor says so.
            extra = {"factor": f"revert of {revert.parent}",
                     "intervention": {"action": "revert", "replaces": revert.parent, "to": sid,
                                      "reason": revert.reason}} if revert else {}
            s.live.append(new_version(exp, parent, exp.vdir(sid).genome_source(), generation, **extra))
            exp.save()
