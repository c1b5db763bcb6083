"""The human gate: where a run pauses for a person's decision, what the person sees there, and what
approve, revise and abort do (``evolution.human_gate``; the guide is docs/guides/human-gates.md).

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

import getpass
import json
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evotrainer.config import HUMAN_GATE_POINTS
from evotrainer.genome.errors import GenomeError
from evotrainer.genome.program import HarnessProgram
from evotrainer.loop.human.decision_request import REQUEST_FILE, Pending, request_text
from evotrainer.loop.run_versions import RunVersions
from evotrainer.loop.stages.gating import gate_version
from evotrainer.loop.stages.proposals import backtest_child
from evotrainer.operators import Evidence, OperatorError
from evotrainer.operators.acceptance import make_intervention
from evotrainer.operators.intervention import Intervention
from evotrainer.records.run_dir import RunDirError
from evotrainer.records.run_state import RunState
from evotrainer.records.version import Status, write_atomic

if TYPE_CHECKING:
    from evotrainer.loop.experiment import Experiment

OUTCOMES = ("kept", "rejected")   # what a person may turn a gated child into at completion (never promoted)


class HumanGateError(RunDirError):
    """A decision the run's state does not allow; the message names it and what would be allowed."""


# ---- where the run stands ------------------------------------------------------------------------
def enabled(exp: Experiment, point: str) -> bool:
    return point in exp.cfg.evolution.human_gate


def point_of(exp: Experiment, vid: str) -> str:
    """The point ``vid``'s decision is taken at."""
    return exp.state.gates[vid]["point"]


def migrate(state: RunState, versions: RunVersions) -> bool:
    """A run from before the four points, brought up to date once, when it is loaded: each decision
    without a point was taken at backtest (the only point then), and a child approved there by that
    older CLI, which left its status awaiting, trains. True when anything changed (the caller saves)."""
    changed = False
    for vid, verdict in state.approvals.items():
        if vid in state.gates or not versions.vdir(vid).path.is_dir():
            continue
        meta = versions.vdir(vid).meta()
        state.gates[vid] = {"point": "backtest", "generation": meta.generation}
        if verdict == "approved" and meta.status == Status.AWAITING_APPROVAL:
            meta.status = Status.PENDING
            versions.vdir(vid).save_meta(meta)
        changed = True
    return changed


def pending(exp: Experiment) -> list[Pending]:
    s = exp.state
    return [Pending(v, point_of(exp, v), int((s.gates.get(v) or {}).get("generation", s.generation)))
            for v, verdict in s.approvals.items() if verdict == "pending"]


def open_decision(exp: Experiment, vid: str, point: str, generation: int) -> None:
    exp.state.approvals[vid] = "pending"
    exp.state.gates[vid] = {"point": point, "generation": generation}


def decided(exp: Experiment, vid: str, point: str, generation: int) -> bool:
    s = exp.state
    return s.gates.get(vid) == {"point": point, "generation": generation} and s.approvals.get(vid) not in (None, "pending")


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
    if not enabled(exp, "completion"):
        return False
    for vid in exp.state.live:
        if exp.vdir(vid).meta().operator is None:
            continue
        if decided(exp, vid, "completion", generation):
            gate_version(exp.gate_inputs(), vid, finish=True)
            exp.record(vid)
        elif exp.state.approvals.get(vid) != "pending" and holds_completion(exp, vid):
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
        if s.gates.get(v) != {"point": "diagnosis", "generation": generation}:
            open_decision(exp, v, "diagnosis", generation)
    return pause(exp)


def parents_for_children(exp: Experiment, generation: int) -> list[str]:
    """The survivors that may get children: those a person did not abort at diagnosis."""
    s = exp.state
    return [v for v in s.survivors if not (s.gates.get(v) == {"point": "diagnosis", "generation": generation}
                                           and s.approvals.get(v) == "rejected")]


def hold_children(exp: Experiment) -> bool:
    """Before training: design-approved children are backtested now (and wait at backtest when that
    point is on); True (paused) while any child awaits a decision."""
    s = exp.state
    for vid in list(s.live):
        meta = exp.vdir(vid).meta()
        if meta.status == Status.AWAITING_APPROVAL and s.approvals.get(vid) != "pending" and point_of(exp, vid) == "design":
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
            _history_outcome(exp, vid, "backtest_rejected", reasons=backtested.reasons[:5])
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
        _set_status(exp, vid, Status.PENDING)


def holds_completion(exp: Experiment, vid: str) -> bool:
    """Whether the gate's verdict on child ``vid`` waits for a person before it counts."""
    if not enabled(exp, "completion"):
        return False
    meta = exp.vdir(vid).meta()
    gated = meta.status == Status.VERIFIED or "hypothesis" in (meta.decision or {})
    return meta.operator is not None and gated and not decided(exp, vid, "completion", meta.generation)


# ---- decisions -----------------------------------------------------------------------------------
def check_ids(exp: Experiment, ids: list[str] | None) -> list[str]:
    """``ids`` (all open decisions when empty), each one open; else a HumanGateError naming them."""
    waiting = [p.version for p in pending(exp)]
    if not waiting:
        raise HumanGateError(f"nothing awaits a decision in {exp.run_dir} (the run is {exp.state.status})")
    unknown = [i for i in ids or [] if i not in waiting]
    if unknown:
        raise HumanGateError(f"not awaiting a decision: {', '.join(unknown)}; awaiting: {', '.join(waiting)}")
    return list(ids or waiting)


def approve(exp: Experiment, ids: list[str] | None = None, reason: str = "", by: str | None = None) -> list[str]:
    """Each open decision goes ahead as proposed: a survivor gets children, a design is backtested on
    resume, a backtested child trains, a gated child's outcome counts."""
    ids = check_ids(exp, ids)
    for vid in ids:
        point = point_of(exp, vid)
        _record(exp, vid, point, "approve", reason, by)
        exp.state.approvals[vid] = "approved"
        if point == "backtest":
            _set_status(exp, vid, Status.PENDING, record=False)
        exp.record(vid)
    _settle(exp)
    return ids


def abort(exp: Experiment, ids: list[str] | None = None, reason: str = "", by: str | None = None) -> list[str]:
    """Drops each child named (status rejected, the reason recorded, never trained or counted); at
    diagnosis a survivor gets no children, and when every survivor is aborted the run is to stop: its
    ``stop_reason`` is set, and the next ``Experiment.run`` closes it cleanly (final pick, test report;
    ``evotrainer abort`` runs it at once)."""
    ids = check_ids(exp, ids)
    s = exp.state
    for vid in ids:
        point = point_of(exp, vid)
        _record(exp, vid, point, "abort", reason, by)
        s.approvals[vid] = "rejected"
        if point != "diagnosis":
            vd = exp.vdir(vid)
            meta = vd.meta()
            was = meta.status
            meta.status = Status.REJECTED
            mine = [f"rejected by a person at {point}{': ' + reason if reason else ''}"] + (
                [f"the gate's outcome was {was}"] if point == "completion" else [])
            meta.decision = {**(meta.decision or {})}
            meta.decision["reasons"] = mine + list(meta.decision.get("reasons") or [])   # the gate's stay
            vd.save_meta(meta)
            if vid in s.live and point != "completion":
                s.live.remove(vid)
                _history_outcome(exp, vid, "aborted", reason=reason)
        exp.record(vid)
    survivors = [v for v in ids if point_of(exp, v) == "diagnosis"]
    if survivors:
        if not parents_for_children(exp, s.gates[survivors[0]]["generation"]):
            s.stop_reason = f"aborted by {by or who()} at the diagnosis gate" + (f": {reason}" if reason else "")
    _settle(exp)
    return ids


def revise(exp: Experiment, vid: str, *, genome: str | Path | None = None, hypothesis: str | None = None,
           note: str | None = None, outcome: str | None = None, reason: str = "", by: str | None = None) -> str:
    """Changes what the decision is about, then leaves it open for approve or abort (diagnosis and
    completion: the revision is the decision). What each point accepts:

    * diagnosis: ``note``, a hint the operators see among the survivor's alerts when they propose
    * design, backtest: ``genome`` (a harness file) and/or ``hypothesis``; a new genome must pass every
      acceptance rule of a proposed child (one factor, not a known genome, the contract, loading in the
      sandbox) and, at backtest, its backtest; if it does not, nothing is changed
    * completion: ``outcome`` kept or rejected, to hold back what the gate decided (never to promote)
    """
    check_ids(exp, [vid])
    point = point_of(exp, vid)
    given = {"note": note, "genome": genome, "hypothesis": hypothesis, "outcome": outcome}
    allowed = {"diagnosis": ("note",), "design": ("genome", "hypothesis"), "backtest": ("genome", "hypothesis"),
               "completion": ("outcome",)}[point]
    wrong = [k for k, v in given.items() if v and k not in allowed]
    if wrong or not any(given[k] for k in allowed):
        raise HumanGateError(f"{vid} waits at {point}: revise it with {' and/or '.join('--' + k for k in allowed)}"
                             + (f" (not --{', --'.join(wrong)})" if wrong else ""))
    if point == "diagnosis":
        _record(exp, vid, point, "revise", reason, by, note=note)
        exp.state.approvals[vid] = "revised"
    elif point == "completion":
        _override_outcome(exp, vid, outcome, reason, by)
    else:
        _revise_child(exp, vid, point, Path(genome) if genome else None, hypothesis, reason, by)
    exp.record(vid)
    _settle(exp)
    return point


def _override_outcome(exp: Experiment, vid: str, outcome: str, reason: str, by: str | None) -> None:
    vd = exp.vdir(vid)
    meta = vd.meta()
    allowed = {Status.PROMOTED: OUTCOMES, Status.KEPT: (Status.REJECTED,)}.get(meta.status, ())
    if outcome not in allowed:
        raise HumanGateError(f"{vid} was gated {meta.status}: a person may hold a promotion back (to kept or "
                             f"rejected) or reject a kept child, never promote; {outcome!r} is not allowed here")
    was = meta.status
    _record(exp, vid, "completion", "revise", reason, by, outcome={"from": was, "to": outcome})
    meta = vd.meta()
    meta.status = outcome
    meta.decision.setdefault("reasons", []).append(
        f"{was} by the gate, {outcome} by a person" + (f": {reason}" if reason else ""))
    vd.save_meta(meta)
    exp.state.approvals[vid] = "revised"


def _revise_child(exp: Experiment, vid: str, point: str, genome: Path | None, hypothesis: str | None,
                  reason: str, by: str | None) -> None:
    """A new genome and/or hypothesis for an untrained child; nothing is written unless all checks pass."""
    vd = exp.vdir(vid)
    meta = vd.meta()
    old = Intervention.from_dict(meta.intervention)
    if hypothesis is not None and not hypothesis.strip():
        raise HumanGateError("--hypothesis is empty: say what the change should do and why")
    iv = old
    if genome is not None:
        child = HarnessProgram(genome.read_text(encoding="utf-8"), name=str(genome))
        parents = [HarnessProgram(exp.vdir(p).genome_source(), name=f"{p}/genome.py") for p in meta.parents]
        known = {exp.vdir(v).meta().genome_hash for v in exp.versions()} - {meta.genome_hash}
        try:
            iv = make_intervention(meta.operator, parents, child, Evidence(
                known_hashes=known, allow_multi_factor=exp.cfg.evolution.allow_multi_factor),
                hypothesis=old.hypothesis, expected_effect=old.expected_effect,
                details={**old.details, "revised_by_person": True})
        except (OperatorError, GenomeError) as e:
            raise HumanGateError(f"{genome}: the revised genome is refused ({getattr(e, 'kind', 'contract')}): "
                                 f"{getattr(e, 'reason', e)}; {vid} is unchanged") from None
        iv.evidence = old.evidence
    if hypothesis is not None:
        iv.hypothesis = hypothesis.strip()
    backtested = None
    if point == "backtest" and genome is not None and exp.cfg.evolution.backtest:
        backtested = backtest_child(exp.proposal_inputs(), iv, meta.parents[0])
        if not backtested.accept:
            raise HumanGateError(f"{genome}: the revised child fails its backtest "
                                 f"({'; '.join(backtested.reasons[:2])}); "
                                 f"{vid} is unchanged: approve or abort it as it is, or revise again")
    kept = _keep_revision(vd)
    _record(exp, vid, point, "revise", reason, by, previous=kept, genome_hash=HarnessProgram(iv.child_source).hash,
            **({"hypothesis": iv.hypothesis} if hypothesis is not None else {}))
    meta = vd.meta()
    vd.save_genome(iv.child_source)
    write_atomic(vd.path / "intervention.json", json.dumps(iv.to_dict(), indent=2, default=str))
    write_atomic(vd.path / "diff.patch", iv.diff)
    if backtested is not None:
        write_atomic(vd.path / "backtest.json", backtested.to_json())
    program = HarnessProgram(iv.child_source)
    meta.genome_hash, meta.knobs, meta.factor, meta.intervention = program.hash, program.knob_values, iv.factor, iv.to_dict()
    vd.save_meta(meta)
    for h in exp.state.history:
        if h.get("child") == vid:
            h.update(factor=iv.factor, hypothesis=iv.hypothesis, revised=True)


def _keep_revision(vd) -> str:
    """The files a revision replaces, kept under ``revisions/rN/`` (nothing recorded is lost)."""
    root = vd.path / "revisions"
    n = len(list(root.glob("r*"))) + 1 if root.is_dir() else 1
    dest = root / f"r{n}"
    dest.mkdir(parents=True)
    for name in ("genome.py", "intervention.json", "diff.patch", "backtest.json"):
        if (vd.path / name).is_file():
            shutil.copy2(vd.path / name, dest / name)
    return str(dest.relative_to(vd.path))


def _settle(exp: Experiment) -> None:
    """Once nothing awaits a decision the run may go on (``resume``); the state is saved either way."""
    if exp.state.status == "paused" and not pending(exp):
        exp.state.status = "running"
    exp.save()


def who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return os.environ.get("USER") or "unknown"


def _record(exp: Experiment, vid: str, point: str, action: str, reason: str, by: str | None, **extra: Any) -> None:
    """The decision on the version's record (meta.decision["human"]) and in the run's history."""
    entry = {"point": point, "action": action, "by": by or who(),
             "at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "reason": reason, **extra}
    vd = exp.vdir(vid)
    meta = vd.meta()
    meta.decision = {**(meta.decision or {})}
    meta.decision["human"] = list(meta.decision.get("human") or []) + [entry]
    vd.save_meta(meta)
    gen = (exp.state.gates.get(vid) or {}).get("generation", meta.generation)
    exp.state.history.append({"generation": gen, "human_gate": point, "version": vid,
                              **{k: v for k, v in entry.items() if k != "point"}})
    exp.say(f"{vid}: {action} at the {point} gate by {entry['by']}" + (f": {reason}" if reason else ""))


def _history_outcome(exp: Experiment, vid: str, outcome: str, **extra: Any) -> None:
    for h in exp.state.history:
        if h.get("child") == vid:
            h.update(outcome=outcome, **extra)


def _set_status(exp: Experiment, vid: str, status: str, record: bool = True) -> None:
    vd = exp.vdir(vid)
    meta = vd.meta()
    meta.status = status
    vd.save_meta(meta)
    if record:
        exp.record(vid)
        exp.save()
