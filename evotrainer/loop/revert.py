"""Revert, a first-class action of the select stage: a survivor that regressed from an ancestor (by
the gate's own paired rule) is replaced by that ancestor, which the next generation continues."""

from __future__ import annotations

from typing import TYPE_CHECKING

from evotrainer.fitness.gates import GateConfig, paired_promotion
from evotrainer.fitness.paired_stats import PairingError
from evotrainer.loop.versions import SETTLED

if TYPE_CHECKING:
    from evotrainer.loop.experiment import Experiment


def revert_target(exp: Experiment, vid: str):
    """(ancestor id, paired decision) when ``vid`` regressed from its best ancestor, else None.

    The ancestors are the first-parent chain back to the seed, settled and valid. The best of them by
    held-out accuracy (the nearest one on a tie: it has had the most training) must beat ``vid`` on
    the same held-out tasks by the gate's own paired bootstrap rule (CI lower bound above
    ``min_delta``), so noise alone never triggers a revert.
    """
    meta = exp.vdir(vid).meta()
    current = meta.metrics.get("heldout_accuracy")
    if current is None:
        return None
    best, seen, pid = None, {vid}, (meta.parents[0] if meta.parents else None)
    while pid and pid not in seen and exp.vdir(pid).path.is_dir():
        seen.add(pid)
        anc = exp.vdir(pid).meta()
        acc = anc.metrics.get("heldout_accuracy")
        if anc.status in SETTLED and acc is not None and acc > (best[1] if best else current):
            best = (pid, acc)
        pid = anc.parents[0] if anc.parents else None
    if best is None:
        return None
    ev = exp.cfg.evolution
    gcfg = GateConfig(level=ev.gate_level, min_delta=ev.min_delta, seed=exp.cfg.seed)
    try:
        decision = paired_promotion(exp.vdir(best[0]).rollouts("heldout"), exp.vdir(vid).rollouts("heldout"), gcfg)
    except (PairingError, ValueError):
        return None   # not sampled on the same tasks and seeds: no evidence either way
    return (best[0], decision) if decision.promote else None


def plan_reverts(exp: Experiment, survivors: list[str], generation: int) -> tuple[list[str], list[dict]]:
    """(survivors after reverts, one history record per revert), writing nothing: the select stage
    saves the plan with the run state first and applies it after, so a crash in between loses no revert."""
    out: list[str] = []
    reverts: list[dict] = []
    for sid in survivors:
        target = revert_target(exp, sid)
        if target is None:
            out.append(sid)
            continue
        aid, decision = target
        reverts.append({"generation": generation + 1, "parent": sid, "operator": "revert", "factor": "revert",
                        "outcome": "reverted", "to": aid, "reason": decision.reason})
        if aid not in out:
            out.append(aid)
    return out, reverts


def apply_revert(exp: Experiment, revert: dict) -> None:
    """Marks the regressed version with the ancestor it was reverted to (idempotent)."""
    vd = exp.vdir(revert["parent"])
    meta = vd.meta()
    if (meta.decision or {}).get("reverted_to") == revert["to"]:
        return
    meta.decision = {**(meta.decision or {}), "reverted_to": revert["to"], "revert_reason": revert["reason"]}
    vd.save_meta(meta)


def revert_regressed(exp: Experiment, survivors: list[str], generation: int) -> list[str]:
    """Survivors that regressed from an ancestor are replaced by it: the next generation continues
    the ancestor (its adapter and harness), and the regressed version is pruned with the reason.
    (Plan and apply in one go; the select stage does the two with a state save between.)"""
    out, reverts = plan_reverts(exp, survivors, generation)
    for r in reverts:
        apply_revert(exp, r)
        exp.state.history.append(r)
        exp.say(f"gen {generation}: {r['parent']} regressed from {r['to']}; reverting to it ({r['reason'][:80]})")
    return out
