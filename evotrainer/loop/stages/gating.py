"""The gate stage: validity first (engine checks + the harness's own), then paired statistics of a
child against its control sibling; then the intervention's own claim is judged against what was
measured, and the outcome is told to the run's listeners (the skills, the operators' weights and the
knob study) without the gate knowing who they are.

A child is ``promoted`` when the paired CI's lower bound clears ``min_delta``; ``rejected`` when it is
significantly worse (the CI's upper bound below zero) or cannot be paired; otherwise it tied its
control and, with ``evolution.keep_ties``, lives on as a branch of its own (``kept``): a living
population rather than one lineage with short-lived children.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass
from typing import Callable, ContextManager

from evotrainer.fitness.gate_config import GateConfig
from evotrainer.fitness.gates import RACE, TIE_BASIS, gate
from evotrainer.fitness.health import HealthReport
from evotrainer.fitness.hypothesis import judge_effect
from evotrainer.fitness.labels import LabelStore
from evotrainer.loop.crash import crash_point
from evotrainer.loop.run_versions import RunVersions
from evotrainer.records.history import HistoryRecord, Outcome, proposal_of
from evotrainer.records.outcome import GateListener, GateOutcome
from evotrainer.records.version import BranchVersion, Status, VersionDir, write_atomic


def _untimed(key: str) -> ContextManager[None]:
    return contextlib.nullcontext()


@dataclass(frozen=True)
class GateInputs:
    """What the gate stage reads and changes of a run, and nothing more: the experiment builds one at
    its gate stage; a test builds one over version directories written by hand, without a model."""
    versions: RunVersions
    config: GateConfig
    keep_ties: bool                 # evolution.keep_ties: a tie lives on as a branch of its own
    domain: str                     # a confirmed skill records the domain it was confirmed on
    history: list[HistoryRecord]    # the run state's history: the gate fills in its children's outcomes
    listeners: tuple[GateListener, ...] = ()   # told each child's outcome: the skill library, the operator mix
    labels: LabelStore | None = None   # where a validity gap (a check the harness missed) is recorded
    timed: Callable[[str], ContextManager[None]] = _untimed   # Budgets.timed: where the run's time went
    say: Callable[[str], None] = lambda msg: None
    race: Callable[[str], None] | None = None   # racing gate: verifies an undecided child's further rounds


def control_of(versions: RunVersions, meta: BranchVersion, say: Callable[[str], None] | None = None) -> str | None:
    """The sibling that continued the child's parent under the parent's own harness this generation.
    When that continuation failed before it was verified (its harness or sandbox worker failed: it
    has no held-out scores), the parent itself, verified on the same tasks a generation earlier: the
    child is then judged against where both started rather than rejected for its sibling's failure
    (and ``say`` is told so)."""
    for vid in versions.of_generation(meta.generation):
        other = versions.vdir(vid).meta()
        if other.operator is None and other.parents == meta.parents[:1] and other.id != meta.id:
            if versions.vdir(vid).rollouts_path("heldout").is_file():
                return vid
            if say:
                say(f"gen {meta.generation}: {meta.id}'s control {vid} has no held-out scores ({other.status}); "
                    f"{meta.id} is gated against its parent {meta.parents[0]} instead")
            break
    return meta.parents[0] if meta.parents else None


def gate_version(run: GateInputs, vid: str, finish: bool = True) -> None:
    """Validity first (engine checks + the harness's own), then paired statistics against the control.
    ``finish=False`` (a human gate at completion): the verdict is saved, its effects (history, skills,
    operator credit) wait for the person's decision and a later call."""
    vd = run.versions.vdir(vid)
    meta = vd.meta()
    if meta.status != Status.VERIFIED:
        if finish and meta.operator is not None and "hypothesis" in (meta.decision or {}):   # gated, then a crash
            finish_gate(run, vd, meta, control_of(run.versions, meta))
        return
    is_child = meta.operator is not None
    control = control_of(run.versions, meta, say=run.say) if is_child else None
    control_dir = run.versions.vdir(control) if control else None
    health = vd.path / "health.json"   # written by verification: the gate judges that same report
    report = HealthReport.from_dict(json.loads(health.read_text())) if health.is_file() else None
    config = run.config
    if is_child and control is not None and control == meta.parents[0] and config.race_cap is not None:
        # Against its parent (its sibling failed) the child has trained k more steps: a race would read
        # that, not the change, so the fixed gate draw decides (loop/stages/racing.py skips it too).
        config = dataclasses.replace(config, race_cap=None)
    with run.timed("gate"):
        decision = gate(vd.path, control_dir.path if control_dir else None, config, labels=run.labels,
                        report=report)
    if run.race is not None and decision.valid and ((decision.paired or {}).get("race") or {}).get("stopped") == "continue":
        run.race(vid)   # the gate draw left it open: further rounds for both sides (loop/stages/racing.py)
        with run.timed("gate"):
            decision = gate(vd.path, control_dir.path, config, labels=run.labels, report=report)
    human = (meta.decision or {}).get("human")   # a person's earlier decisions on it (loop/human/human_gate.py)
    meta.decision = decision.to_dict() | ({"human": human} if human else {})
    meta.violations = [{"name": "gate", "message": r} for r in decision.reasons
                       if r.startswith(("engine check", "harness validity"))]
    if not decision.valid:
        meta.status = Status.INVALID
    elif is_child:
        meta.status = Status.PROMOTED if decision.promote else child_outcome(decision.paired, run.keep_ties)
    else:
        meta.status = Status.KEPT
    if is_child:
        meta.hypothesis = hypothesis_verdict(meta, control_dir, report, decision.paired)
        meta.decision["hypothesis"] = meta.hypothesis
        meta.decision["spend"] = spend_record(vd, control_dir)
    vd.save_meta(meta)   # the commit point: what follows is repeated on resume until the state is saved
    crash_point("gate:meta-saved")
    if is_child:
        run.say(f"gen {meta.generation}: {vid} vs {control}: {meta.status}; {gate_line(decision.paired)}")
    if is_child and finish:
        finish_gate(run, vd, meta, control)
    else:
        write_atomic(vd.path / "decision.json", json.dumps(meta.decision, indent=2, default=str))


def gate_line(paired: dict | None) -> str:
    """The paired numbers of a gate in one line, with the smallest effect the gate could have detected."""
    if not paired or "mean_delta" not in paired:
        return (paired or {}).get("reason", "no paired comparison")
    mde = paired.get("mde")
    basis = f"{TIE_BASIS}; on the working calls accepted: " if paired.get("basis") == "working_calls" else ""
    return basis + (f"delta {paired['mean_delta']:+.3f}, CI [{paired['ci_low']:+.3f}, {paired['ci_high']:+.3f}] over "
            f"{paired['n_tasks']} gate-draw task(s); minimum detectable effect "
            + (f"{mde:+.3f}" if mde is not None else "not estimable") + f" at {100 * paired.get('power', 0.8):g}% power")


def finish_gate(run: GateInputs, vd: VersionDir, meta: BranchVersion, control: str | None) -> None:
    """The gate's effects beyond the version's meta: decision.json, the knob study, the bandit, the
    history, the skills. Skipped once the run state's history records the outcome: each effect is
    idempotent except the bandit's in-memory count, which is replayed from that same history."""
    write_atomic(vd.path / "decision.json", json.dumps(meta.decision, indent=2, default=str))
    record = proposal_of(run.history, meta.id)
    if record is not None and record.outcome == meta.status:
        return
    after_gate(run, meta, control)


def spend_of(vd: VersionDir) -> dict[str, int]:
    """What one version spent, read from what it left on disk: optimisation steps, train rollouts and
    generated tokens, held-out rollouts and generated tokens."""
    train = vd.rollouts("train")
    heldout = vd.rollouts("heldout") + vd.rollouts("selection") + vd.rollouts(RACE)   # both draws and any race
    return {"train_steps": len(vd.steps()), "train_rollouts": len(train),
            "train_tokens": sum(r.num_tokens for r in train), "heldout_rollouts": len(heldout),
            "heldout_tokens": sum(r.num_tokens for r in heldout)}


def spend_record(child: VersionDir, control: VersionDir | None) -> dict:
    """Both sides' spend, for the decision record: the same steps are not the same compute (a child
    with num_generations 8 draws twice its control's rollouts per step), and held-out verification
    runs under train.eval_max_new_tokens for both, whatever either trains with."""
    record: dict = {"child": spend_of(child), "control": spend_of(control) if control and control.path.exists() else None}
    if record["control"]:
        c, k = record["child"], record["control"]
        record["train_rollouts_ratio"] = c["train_rollouts"] / k["train_rollouts"] if k["train_rollouts"] else None
        record["train_tokens_ratio"] = c["train_tokens"] / k["train_tokens"] if k["train_tokens"] else None
    return record


def child_outcome(paired: dict | None, keep_ties: bool) -> Status:
    """A valid child the gate did not promote: rejected when significantly worse than its control (or
    not comparable), kept as a tie otherwise (when ties live on). A raced child that its race found
    behind its control, or could not separate from it by the cap, is dropped: the race read enough
    to say its change is worth less than a branch, and the population's slot goes to another."""
    if not paired or "ci_high" not in paired:
        return Status.REJECTED
    worse = float(paired["ci_high"]) < 0.0
    raced_out = (paired.get("race") or {}).get("stopped") in ("behind", "cap")
    return Status.REJECTED if worse or raced_out or not keep_ties else Status.KEPT


def hypothesis_verdict(meta: BranchVersion, control: VersionDir | None, report: HealthReport | None,
                       paired: dict | None) -> dict:
    """The intervention's expected effect judged against the child's and its control's measurements."""
    expected = (meta.intervention or {}).get("expected_effect")
    if meta.status == Status.INVALID:
        return {"verdict": "refuted", "expected": expected, "reason": "the branch is invalid: whatever it "
                "scores, the intervention did not do what it claimed"}
    child = report.metrics if report else {}
    health = control.path / "health.json" if control else None
    before = json.loads(health.read_text()).get("metrics", {}) if health and health.is_file() else {}
    return judge_effect(expected, before, child, paired)


def after_gate(run: GateInputs, meta: BranchVersion, control: str | None) -> None:
    """The run's history records the child's outcome, and every listener is told it (``records/outcome.py``):
    the operator mix (credit, the knob study) and the skill library."""
    delta = (meta.decision or {}).get("paired", {}) or {}
    outcome = GateOutcome(
        child=meta.id, control=control, operator=meta.operator,
        entry=((meta.intervention or {}).get("details") or {}).get("entry"), genome_hash=meta.genome_hash,
        status=meta.status, paired_delta=delta.get("mean_delta"), heldout_accuracy=meta.metrics.get("heldout_accuracy"),
        verdict=(meta.hypothesis or {}).get("verdict"), domain=run.domain, intervention=meta.intervention,
        decision=meta.decision or {},
        parent_report=run.versions.vdir(meta.parents[0]).path / "health.json" if meta.parents else None)
    record = proposal_of(run.history, meta.id)
    if record is not None:   # (a child the history lost in a crash is still told to the listeners)
        record.outcome = Outcome(outcome.status)
        record.heldout_accuracy, record.paired_delta = outcome.heldout_accuracy, outcome.paired_delta
        record.hypothesis_verdict = outcome.verdict
    for listener in run.listeners:
        listener.observe(outcome)
