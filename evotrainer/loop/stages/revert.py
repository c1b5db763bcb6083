"""Revert, a first-class action of the select stage: a survivor that regressed from an ancestor (by
the gate's own paired rule) is replaced by that ancestor, which the next generation continues.

Picking the best of k ancestors and then testing that winner on the data it was picked on is the
winner's curse: the maximum of k noisy scores is biased upwards, so the test confirms noise far more
often than its level says. The ancestor is therefore *chosen* on the selection draw of the held-out
pool (``selection_accuracy``) and *tested* on the gate draw (the ``heldout`` rollouts), tasks the
choice never saw; the test keeps its level (``tests/test_revert.py`` simulates both).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from evotrainer.fitness.gate_config import GateConfig
from evotrainer.fitness.gates import paired_promotion
from evotrainer.fitness.paired_stats import PairingError, PromotionDecision
from evotrainer.loop.run_versions import RunVersions
from evotrainer.records.history import RevertRecord
from evotrainer.records.rollout import Rollout
from evotrainer.records.version import SETTLED


@dataclass
class Side:
    """One version as a revert chooses among them: its id and its score on the selection draw."""
    id: str
    selection_score: float


def choose_revert(current: Side, ancestors: Sequence[Side], gate_rollouts: Callable[[str], Sequence[Rollout]],
                  cfg: GateConfig, say: Callable[[str], None] = lambda msg: None) -> tuple[str, PromotionDecision] | None:
    """(ancestor id, paired decision) when the ancestor that scores best on the selection draw (the
    first listed, i.e. the nearest, on a tie) beats ``current`` on its gate draw
    (``gate_rollouts(id)``) by the gate's paired rule; None otherwise (also when the two were not
    sampled on the same tasks and seeds)."""
    best = None
    for anc in ancestors:
        if anc.selection_score > (best.selection_score if best else current.selection_score):
            best = anc
    if best is None:
        return None
    try:
        decision = paired_promotion(list(gate_rollouts(best.id)), list(gate_rollouts(current.id)), cfg)
    except (PairingError, ValueError) as e:   # not sampled on the same tasks and seeds: no evidence either way
        say(f"revert check of {current.id} against its ancestor {best.id} not made: {e}")
        return None
    return (best.id, decision) if decision.promote else None


def revert_target(versions: RunVersions, vid: str, cfg: GateConfig,
                  say: Callable[[str], None] = lambda msg: None) -> tuple[str, PromotionDecision] | None:
    """(ancestor id, paired decision) when ``vid`` regressed from its best ancestor, else None.

    The ancestors are the first-parent chain back to the seed, settled and valid, nearest first. The
    best of them on the selection draw must beat ``vid`` on the gate draw by the gate's own paired
    bootstrap rule (CI lower bound above ``min_delta``), so neither noise nor the choice itself
    triggers a revert.
    """
    meta = versions.vdir(vid).meta()
    current = meta.metrics.get("selection_accuracy")
    if current is None:
        return None
    ancestors, seen, pid = [], {vid}, (meta.parents[0] if meta.parents else None)
    while pid and pid not in seen and versions.vdir(pid).path.is_dir():
        seen.add(pid)
        anc = versions.vdir(pid).meta()
        score = anc.metrics.get("selection_accuracy")
        if anc.status in SETTLED and score is not None:
            ancestors.append(Side(pid, score))
        pid = anc.parents[0] if anc.parents else None
    return choose_revert(Side(vid, current), ancestors, lambda v: versions.vdir(v).rollouts("heldout"), cfg, say)


def plan_reverts(versions: RunVersions, survivors: list[str], generation: int, cfg: GateConfig,
                 say: Callable[[str], None] = lambda msg: None) -> tuple[list[str], list[RevertRecord]]:
    """(survivors after reverts, one history record per revert), writing nothing: the select stage
    saves the plan with the run state first and applies it after, so a crash in between loses no revert."""
    out: list[str] = []
    reverts: list[RevertRecord] = []
    for sid in survivors:
        target = revert_target(versions, sid, cfg, say)
        if target is None:
            out.append(sid)
            continue
        aid, decision = target
        reverts.append(RevertRecord(generation + 1, parent=sid, to=aid, reason=decision.reason))
        if aid not in out:
            out.append(aid)
    return out, reverts


def apply_revert(versions: RunVersions, revert: RevertRecord) -> None:
    """Marks the regressed version with the ancestor it was reverted to (idempotent)."""
    vd = versions.vdir(revert.parent)
    meta = vd.meta()
    if (meta.decision or {}).get("reverted_to") == revert.to:
        return
    meta.decision = {**(meta.decision or {}), "reverted_to": revert.to, "revert_reason": revert.reason}
    vd.save_meta(meta)

