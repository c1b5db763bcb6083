"""What a person's decision does at a human gate (``loop/human/human_gate.py`` says where the run
pauses): approve goes on, abort drops what waits with its reason, revise changes what waits. Each
decision is appended to the version's ``meta.decision["human"]`` and the run's history, with who took
it, when and why; ``evotrainer resume`` then continues at the same point."""

from __future__ import annotations

import getpass
import json
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evotrainer.genome.errors import GenomeError
from evotrainer.genome.program import HarnessProgram
from evotrainer.loop.human.human_gate import history_outcome, parents_for_children, pending, point_of, set_status
from evotrainer.loop.stages.proposals import backtest_child
from evotrainer.operators import Evidence, OperatorError
from evotrainer.operators.acceptance import make_intervention
from evotrainer.operators.intervention import Intervention
from evotrainer.records.history import HumanRecord, Outcome, proposal_of
from evotrainer.records.run_dir import RunDirError
from evotrainer.records.run_state import Approval
from evotrainer.records.version import Status, write_atomic

if TYPE_CHECKING:
    from evotrainer.loop.experiment import Experiment

OUTCOMES = ("kept", "rejected")   # what a person may turn a gated child into at completion (never promoted)


class HumanGateError(RunDirError):
    """A decision the run's state does not allow; the message names it and what would be allowed."""


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
        exp.state.approvals[vid] = Approval.APPROVED
        if point == "backtest":
            set_status(exp, vid, Status.PENDING, record=False)
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
        s.approvals[vid] = Approval.REJECTED
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
                history_outcome(exp, vid, Outcome.ABORTED, reason=reason)
        exp.record(vid)
    survivors = [v for v in ids if point_of(exp, v) == "diagnosis"]
    if survivors:
        if not parents_for_children(exp, s.gates[survivors[0]].generation):
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
        exp.state.approvals[vid] = Approval.REVISED
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
    exp.state.approvals[vid] = Approval.REVISED


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
    record = proposal_of(exp.state.history, vid)
    if record is not None:
        record.factor, record.hypothesis, record.revised = iv.factor, iv.hypothesis, True


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
    gen = exp.state.gates[vid].generation if vid in exp.state.gates else meta.generation
    exp.state.history.append(HumanRecord(gen, point, vid, action, entry["by"], entry["at"], reason,
                                         note=extra.pop("note", None), extra=extra))
    exp.say(f"{vid}: {action} at the {point} gate by {entry['by']}" + (f": {reason}" if reason else ""))


