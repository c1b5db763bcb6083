"""The human gate: where a run pauses for a person's decision and what the person sees there
(``evolution.human_gate``; the guide is docs/guides/human-gates.md). What approve, revise and abort
do is ``loop/human/decisions.py``.

Four points, in the order a generation reaches them:

    diagnosis   after selection, before proposing: the health reports of the survivors about to get children
    design      after an operator proposed a child, before its backtest: intervention, hypothesis, diff
    backtest    after the backtest, before training: the backtest's result
    completion  after the gate judged a trained child, before its outcome counts for selection

At a point the run saves its state, sets status ``paused`` and writes what awaits a decision to
``RUN_DIR/awaiting_decision.md`` (``evotrainer status`` shows the same; ``loop/human/decision_request.py``).
Open decisions are ``state.approvals`` entries ``pending``; ``state.gates`` says at which point and
generation. Each
decision is appended to the version's ``meta.decision["human"]`` (MLflow receives it with meta.json on
``exp.record``) and to the run's history, with who took it, when and why. ``evotrainer resume`` then
continues at the same point; the stages skip what is decided, so no work is repeated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from evotrainer.config import HUMAN_GATE_POINTS
from evotrainer.loop.human.decision_request import REQUEST_FILE, Pending, request_text
from evotrainer.loop.run_versions import RunVersions
from evotrainer.loop.stages.gating import gate_version
from evotrainer.loop.stages.proposals import backtest_child
from evotrainer.operators.intervention import Intervention
from evotrainer.records.history import Outcome, proposal_of
from evotrainer.records.run_state import Approval, DecisionPoint, RunState
from evotrainer.records.version import Status, write_atomic

if TYPE_CHECKING:
    from evotrainer.loop.experiment import Experiment

# ---- where the run stands ------------------------------------------------------------------------
def enabled(exp: Experiment, point: str) -> bool:
    return point in exp.cfg.evolution.human_gate


def point_of(exp: Experiment, vid: str) -> str:
    """The point ``vid``'s decision is taken at."""
    return exp.state.gates[vid].point


def migrate(state: RunState, versions: RunVersions, write: bool = True) -> bool:
    """A run from before the four points, brought up to date once, when it is loaded: each decision
    without a point was taken at backtest (the only point then), and a child approved there by that
    older CLI, which left its status awaiting, trains (its meta is rewritten only with ``write``: a
    reader changes nothing on disk). True when the state changed (the caller saves it)."""
    changed = False
    for vid, verdict in state.approvals.items():
        if vid in state.gates:
            continue
        vd = versions.vdir(vid)
        meta = vd.meta() if vd.path.is_dir() else None
        state.gates[vid] = DecisionPoint("backtest", meta.generation if meta else state.generation)
        if write and meta is not None and verdict == Approval.APPROVED and meta.status == Status.AWAITING_APPROVAL:
            meta.status = Status.PENDING
            vd.save_meta(meta)
        changed = True
    return changed


def pending(exp: Experiment) -> list[Pending]:
    s = exp.state
    return [Pending(v, s.gates[v].point, s.gates[v].generation)
            for v, verdict in s.approvals.items() if verdict == Approval.PENDING]


def open_decision(exp: Experiment, vid: str, point: str, generation: int) -> None:
    exp.state.approvals[vid] = Approval.PENDING
    exp.state.gates[vid] = DecisionPoint(point, generation)


def decided(exp: Experiment, vid: str, point: str, generation: int) -> bool:
    s = exp.state
    return s.gates.get(vid) == DecisionPoint(point, generation) and s.approvals.get(vid) not in (None, Approval.PENDING)


def pause(exp: Experiment) -> bool:
    """When decisions are open: the run pauses (state saved), says what awaits and how to decide, and
    writes the decision material to ``RUN_DIR/awaiting_decision.md``; False when nothing is open."""
    waiting = pending(exp)
    if not waiting:
        return False
    exp.state.status = "paused"
    write_atomic(exp.run_dir / REQUEST_FILE, request_text(exp, waiting))
    exp.say(pause_line(exp, waiting))
    exp.save()
    return True


def pause_line(exp: Experiment, waiting: list[Pending]) -> str:
    points = sorted({p.point for p in waiting}, key=HUMAN_GATE_POINTS.index)
    return (f"human gate ({', '.join(points)}): {', '.join(p.version for p in waiting)} await a decision; read "
            f"{exp.run_dir / REQUEST_FILE} or `evotrainer status {exp.run_dir}`, then `evotrainer approve|revise|"
            f"abort {exp.run_dir} ...` and `evotrainer resume {exp.run_dir}`")


# ---- the checkpoint between stages ---------------------------------------------------------------
def checkpoint(exp: Experiment, stage: str, generation: int) -> bool:
    """Before ``stage`` of ``generation``: what people decided there is applied, and True (the run
    paused, its state saved) while a decision is still awaited. Design and backtest wait before train,
    completion before select, diagnosis before propose."""
    if stage == "train":
        return hold_children(exp)
    if stage == "select":
        return hold_completion(exp, generation)
    if stage == "propose":
        return pause_at_diagnosis(exp, generation)
    return False


def defers(exp: Experiment, vid: str) -> bool:
    """Whether the gate stage leaves child ``vid``'s effects (history, skills, operator credit) to the
    completion checkpoint: the completion point is on and no person has decided on it yet."""
    return enabled(exp, "completion") and exp.vdir(vid).meta().operator is not None and not decided(
        exp, vid, "completion", exp.vdir(vid).meta().generation)


def hold_completion(exp: Experiment, generation: int) -> bool:
    """After the gate: each gated child whose verdict awaits a person gets an open decision; one a
    person decided is finished now (its outcome told to the history and the listeners, idempotently)."""
    selection = exp.state.selection
    if not enabled(exp, "completion") or (selection and selection.get("generation") == generation):
        return False   # off, or passed: selection has planned this generation (a resume inside it)
    for vid in exp.state.live:
        if exp.vdir(vid).meta().operator is None:
            continue
        if decided(exp, vid, "completion", generation):
            gate_version(exp.gate_inputs(), vid, finish=True)
            exp.record(vid)
        elif exp.state.approvals.get(vid) != Approval.PENDING and holds_completion(exp, vid):
            open_decision(exp, vid, "completion", generation)
    return pause(exp)


# ---- the four points ---------------------------------------------------------------------------
def pause_at_diagnosis(exp: Experiment, generation: int) -> bool:
    """Before proposing the children of ``generation + 1``: True (paused) while the survivors' health
    reports await a decision; False once decided, or when no child is to be proposed."""
    s, ev = exp.state, exp.cfg.evolution
    children = (ev.mode != "reference" and ev.children_per_generation > 0 and s.exploit_from is None
                and generation + 1 < ev.generations)
    if not enabled(exp, "diagnosis") or not children or not s.survivors:
        return False
    if all(decided(exp, v, "diagnosis", generation) for v in s.survivors):
        return False
    for v in s.survivors:
        if s.gates.get(v) != DecisionPoint("diagnosis", generation):
            open_decision(exp, v, "diagnosis", generation)
    return pause(exp)


def parents_for_children(exp: Experiment, generation: int) -> list[str]:
    """The survivors that may get children: those a person did not abort at diagnosis."""
    s = exp.state
    return [v for v in s.survivors if not (s.gates.get(v) == DecisionPoint("diagnosis", generation)
                                           and s.approvals.get(v) == Approval.REJECTED)]


def hold_children(exp: Experiment) -> bool:
    """Before training: design-approved children are backtested now (and wait at backtest when that
    point is on); True (paused) while any child awaits a decision."""
    s = exp.state
    for vid in list(s.live):
        meta = exp.vdir(vid).meta()
        if meta.status == Status.AWAITING_APPROVAL and s.approvals.get(vid) != Approval.PENDING and point_of(exp, vid) == "design":
            _backtest_designed(exp, vid)
    return pause(exp)


def _backtest_designed(exp: Experiment, vid: str) -> None:
    vd, s = exp.vdir(vid), exp.state
    meta = vd.meta()
    iv = Intervention.from_dict(meta.intervention)
    if exp.cfg.evolution.backtest:
        backtested = backtest_child(exp.proposal_inputs(), iv, meta.parents[0])
        write_atomic(vd.path / "backtest.json", backtested.to_json())
        if not backtested.accept:
            meta.status = Status.REJECTED
            meta.decision = {**(meta.decision or {}), "reasons": [f"backtest: {r}" for r in backtested.reasons[:5]]}
            vd.save_meta(meta)
            history_outcome(exp, vid, Outcome.BACKTEST_REJECTED, reasons=backtested.reasons[:5])
            s.live.remove(vid)
            exp.record(vid)
            exp.say(f"gen {meta.generation}: {vid} rejected by backtest after design approval: "
                    f"{backtested.reasons[:1]}")
            exp.save()
            return
    if enabled(exp, "backtest"):
        open_decision(exp, vid, "backtest", meta.generation)
        exp.save()
    else:
        set_status(exp, vid, Status.PENDING)


def holds_completion(exp: Experiment, vid: str) -> bool:
    """Whether the gate's verdict on child ``vid`` waits for a person before it counts."""
    if not enabled(exp, "completion"):
        return False
    meta = exp.vdir(vid).meta()
    gated = meta.status == Status.VERIFIED or "hypothesis" in (meta.decision or {})
    return meta.operator is not None and gated and not decided(exp, vid, "completion", meta.generation)


def history_outcome(exp: Experiment, vid: str, outcome: Outcome, reason: str | None = None,
                    reasons: list[str] | None = None) -> None:
    """What became of child ``vid`` before it trained, on its proposal's record."""
    record = proposal_of(exp.state.history, vid)
    if record is not None:
        record.outcome = outcome
        record.reason, record.reasons = reason or record.reason, reasons or record.reasons


def set_status(exp: Experiment, vid: str, status: str, record: bool = True) -> None:
    vd = exp.vdir(vid)
    meta = vd.meta()
    meta.status = status
    vd.save_meta(meta)
    if record:
        exp.record(vid)
        exp.save()
