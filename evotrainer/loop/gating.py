"""The gate stage: validity first (engine checks + the harness's own), then paired statistics of a
child against its control sibling; a confirmed intervention becomes (or confirms) a skill."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from evotrainer.fitness.gates import GateConfig, gate
from evotrainer.fitness.health import HealthReport
from evotrainer.loop.skills import report_metrics
from evotrainer.records.version import BranchVersion, write_atomic

if TYPE_CHECKING:
    from evotrainer.loop.experiment import Experiment


def control_of(exp: Experiment, meta: BranchVersion) -> str | None:
    """The sibling that continued the child's parent under the parent's own harness this generation."""
    for vid in exp.generation_versions(meta.generation):
        other = exp.vdir(vid).meta()
        if other.operator is None and other.parents == meta.parents[:1] and other.id != meta.id:
            return vid
    return meta.parents[0] if meta.parents else None


def gate_version(exp: Experiment, vid: str) -> None:
    """Validity first (engine checks + the harness's own), then paired statistics against the control."""
    vd = exp.vdir(vid)
    meta = vd.meta()
    if meta.status != "verified":
        return
    ev = exp.cfg.evolution
    gcfg = GateConfig(level=ev.gate_level, min_delta=ev.min_delta, seed=exp.cfg.seed)
    is_child = meta.operator is not None
    control = control_of(exp, meta) if is_child else None
    health = vd.path / "health.json"   # written by verification: the gate judges that same report
    report = HealthReport.from_dict(json.loads(health.read_text())) if health.is_file() else None
    with exp.budgets.timed("gate"):
        decision = gate(vd.path, exp.vdir(control).path if control else None, gcfg, labels=exp.labels,
                        report=report)
    meta.decision = decision.to_dict()
    meta.violations = [{"name": "gate", "message": r} for r in decision.reasons
                       if r.startswith(("engine check", "harness validity"))]
    if not decision.valid:
        meta.status = "invalid"
    elif is_child:
        meta.status = "promoted" if decision.promote else "rejected"
    else:
        meta.status = "kept"
    vd.save_meta(meta)
    write_atomic(vd.path / "decision.json", json.dumps(meta.decision, indent=2, default=str))
    if is_child:
        after_gate(exp, meta, control)


def after_gate(exp: Experiment, meta: BranchVersion, control: str | None) -> None:
    """A confirmed intervention becomes (or confirms) a skill; knob results feed Optuna."""
    score = meta.metrics.get("heldout_accuracy")
    if meta.operator == "knobs" and exp.mix_loaded:
        knobs = exp.mix.operator("knobs")
        if hasattr(knobs, "tell"):
            knobs.tell(meta.genome_hash, score if meta.status != "invalid" else None)
    for h in exp.state.history:
        if h.get("child") == meta.id:
            h["outcome"] = meta.status
            h["heldout_accuracy"] = score
    if meta.status == "promoted" and meta.intervention:
        parent_health = exp.vdir(meta.parents[0]).path / "health.json"
        trigger = report_metrics(json.loads(parent_health.read_text())) if parent_health.is_file() else {}
        exp.skills.record_confirmed(meta.intervention, meta.decision or {}, exp.cfg.domain.name, trigger,
                                     version=meta.id, parent=control)
