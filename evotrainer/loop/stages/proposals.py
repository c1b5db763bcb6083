"""The propose stage: operators turn a selected parent's genome + health report + matching skills
into single-factor interventions; each is backtested on the parent's cached rollouts before any
training compute is spent on it, and an accepted one becomes a pending child version.

Three rules spend the proposals where they can pay. No more children are proposed than the step
budget can still train after the survivors' continuations. An intervention refuted on fitness from a
parent harness (its child lost, tied without gain, or was invalid) is not proposed from that harness
again, whatever its hypothesis said about its mechanism. And promoted factors compound: when two
survivors' lineages carry different promoted factors, the first child of the generation puts them
together (the one survivor with the other's factor), before any operator is asked.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

from evotrainer.fitness.backtest import BacktestResult, backtest
from evotrainer.genome.errors import GenomeError
from evotrainer.genome.program import HarnessProgram
from evotrainer.loop.stages.selection import rank_score
from evotrainer.loop.human.decision_request import notes_for
from evotrainer.loop.stages.exploit import exploring_slots
from evotrainer.loop.stages.probes import generation_steps
from evotrainer.loop.run_versions import RunVersions
from evotrainer.operators import Evidence, OperatorError
from evotrainer.operators.intervention import Intervention
from evotrainer.operators.registry import OperatorMix
from evotrainer.operators.triggers import report_metrics
from evotrainer.records.history import Outcome, ProposalRecord, proposals, to_dict
from evotrainer.records.run_state import Approval, DecisionPoint, RunState
from evotrainer.records.version import Status, write_atomic

if TYPE_CHECKING:
    from evotrainer.loop.experiment import Experiment


@dataclass(frozen=True)
class ProposalInputs:
    """What proposing and backtesting a child reads and changes of a run, and nothing more: the
    experiment builds one at its propose stage; a test builds one over version directories written by
    hand, with a run state of its own and no model. What may be costly or may log (the operators, the
    evidence, the labelled history) is built when first asked for, as the stage always did."""
    versions: RunVersions
    state: RunState                   # its history, live versions and open decisions (approvals, gates) change
    backtest: bool                    # evolution.backtest: replay each child on its parent's cached rollouts
    human_gate: tuple[str, ...]       # evolution.human_gate: "design" or "backtest" holds a child for a person
    new_child: Callable[..., str]     # loop/versions.new_version over the run, without its first argument
    operators: Callable[[], OperatorMix]
    evidence: Callable[[str], Evidence]   # what operators see of a parent (``evidence_for``)
    cases: Callable[[], list]             # the labelled history the backtest scores diagnostics on
    guard: Callable[[], None] = lambda: None            # Budgets.guard: raises once a budget is spent
    spend: Callable[..., None] = lambda **seconds: None  # Budgets.spend: the time proposing and backtesting took
    sync: Callable[[], None] = lambda: None             # LLM spend and operator statistics into the state
    save: Callable[[], None] = lambda: None
    say: Callable[[str], None] = lambda msg: None


def evidence_for(exp: Experiment, vid: str) -> Evidence:
    """What operators see of a parent: its health report, the skills whose trigger fires on it (this
    run's and, unless ``user_skills`` is off, the user's from earlier experiments), recent history,
    and the diagnostic gaps (invalid branches no validity check flagged)."""
    vd = exp.vdir(vid)
    report = json.loads((vd.path / "health.json").read_text()) if (vd.path / "health.json").is_file() else {}
    notes = notes_for(exp, vid)   # a person's hints at the diagnosis gate (loop/human/human_gate.py), alerts first
    if notes:
        report = {**report, "alerts": [{"name": "person's note", "severity": "critical", "source": "human",
                                        "message": n, "suggestion": n} for n in notes] + list(report.get("alerts") or [])}
    metrics, domain = report_metrics(report), exp.cfg.domain.name
    found = exp.skills.matching(metrics, domain) + (exp.user_skills.matching(metrics, domain) if exp.user_skills else [])
    skills = list({s.id: s.prompt_dict() for s in reversed(found)}.values())[::-1][:3]   # run's first, no repeats
    known = {exp.vdir(v).meta().genome_hash for v in exp.versions()}
    gaps = [dict(vars(g)) for g in exp.labels.gaps[-5:]]
    return Evidence(health_report=report, skills=skills, history=[to_dict(h) for h in exp.state.history[-20:]], known_hashes=known,
                    allow_multi_factor=exp.cfg.evolution.allow_multi_factor, gaps=gaps, refuted=refuted(exp),
                    adapter_trained=lineage_trained(exp, vid))


def lineage_trained(exp: Experiment, vid: str) -> bool:
    """Whether a step of ``vid`` or of any version its adapter descends from (every parent: a merge
    starts from its parents' merged adapters) had a gradient (``grad_norm`` above 0)."""
    seen, todo = set(), [vid]
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        vd = exp.vdir(v)
        if any(not m.get("skipped") and (m.get("grad_norm") or 0.0) > 0.0 for m in vd.steps()):
            return True
        todo += vd.meta().parents
    return False


def refuted(exp: Experiment) -> set[str]:
    """``parent genome hash:entry`` of the library interventions whose children lost on fitness."""
    out = set()
    for h in proposals(exp.state.history):
        if h.entry and h.lost and h.child:
            parent_hash = h.parent_hash or _genome_hash(exp, h.parent)
            if parent_hash:
                out.add(f"{parent_hash}:{h.entry}")
    return out


def _genome_hash(exp: Experiment, vid: str | None) -> str | None:
    return exp.vdir(vid).meta().genome_hash if vid and exp.vdir(vid).path.is_dir() else None


def children_the_budget_allows(exp: Experiment, wanted: int) -> int:
    """``wanted``, or fewer when the step budget cannot train more after this generation's
    continuations (each version trains its generation's steps, ``loop/stages/probes.py``); the log says so."""
    ev, state = exp.cfg.evolution, exp.state
    if ev.budget.train_steps is None or wanted <= 0:
        return wanted
    k = generation_steps(exp.cfg, state.exploit_from, state.generation + 1)
    continuing = sum(1 for v in state.live if exp.vdir(v).meta().operator is None)
    used = state.budget_used.get("train_steps", 0)
    left = ev.budget.train_steps - used - continuing * k
    room = max(0, int(left // k))
    if room < wanted:
        exp.say(f"gen {state.generation + 1}: {room} child(ren) instead of {wanted}: {max(0, left):.0f} train steps "
                f"are left after {continuing} continuation(s), {k} per version")
    slots = exploring_slots(exp.cfg, used, state.generation) if state.exploit_from is None else None
    if slots is not None and slots - continuing < min(wanted, room):   # a generation narrowed to fit the share
        room = max(0, slots - continuing)
        exp.say(f"gen {state.generation + 1}: {room} child(ren) instead of {wanted}: the exploration share holds "
                f"{slots} version(s) of {k} steps beside {continuing} continuation(s)")
    return min(wanted, room)


def promoted_factors(exp: Experiment, vid: str) -> list[str]:
    """The factors of the promoted interventions on ``vid``'s lineage (itself and its first parents)."""
    out, seen = [], set()
    while vid and vid not in seen and exp.vdir(vid).path.is_dir():
        seen.add(vid)
        meta = exp.vdir(vid).meta()
        if meta.operator is not None and meta.status == Status.PROMOTED and meta.factor and meta.factor not in out:
            out.append(meta.factor)
        vid = meta.parents[0] if meta.parents else None
    return out


def compound(exp: Experiment, survivors: list[str]) -> tuple[str, str, str] | None:
    """(survivor, other survivor, factor) when the other's lineage carries a promoted factor the
    survivor's harness lacks, and that crossover child is new; the best-ranked survivor first."""
    from evotrainer.genome.edits import crossover, factors_changed

    ranked = sorted(survivors, key=lambda v: -rank_score(exp.vdir(v).meta().metrics))
    known = {exp.vdir(v).meta().genome_hash for v in exp.versions()}
    for a in ranked:
        pa = HarnessProgram(exp.vdir(a).genome_source(), name=f"{a}/genome.py")
        for b in ranked:
            if b == a:
                continue
            pb = HarnessProgram(exp.vdir(b).genome_source(), name=f"{b}/genome.py")
            try:
                differ = set(factors_changed(pa, pb))
            except GenomeError:
                continue
            for factor in promoted_factors(exp, b):
                if factor in differ and factor not in promoted_factors(exp, a):
                    try:
                        if crossover(pa, pb, factor).hash not in known:
                            return a, b, factor
                    except GenomeError:
                        continue
    return None


def propose_child(run: ProposalInputs, pid: str, survivors: list[str], generation: int, cases: list) -> str | None:
    """One child of ``pid`` from the operators (with a second survivor's harness for those that cross
    two), backtested and admitted; its id, or None with the reason in the history and the log."""
    run.guard()
    parent = run.versions.vdir(pid).meta()
    programs = [HarnessProgram(run.versions.vdir(pid).genome_source(), name=f"{pid}/genome.py")]
    second = next((s for s in survivors if run.versions.vdir(s).meta().genome_hash != parent.genome_hash), None)
    if second:
        programs.append(HarnessProgram(run.versions.vdir(second).genome_source(), name=f"{second}/genome.py"))
    record = ProposalRecord(generation, pid, parent.genome_hash)
    t0 = time.perf_counter()
    try:
        iv = run.operators().propose(programs, run.evidence(pid), attempts=3,
                                     on_reject=lambda name, err: run.say(
                                         f"gen {generation}: {name} proposal for {pid} rejected ({err.kind}): "
                                         f"{err.reason[:160]}"))
    except OperatorError as e:
        run.state.history.append(replace(record, outcome=Outcome.OPERATOR_REJECTED, kind=e.kind, reason=e.reason[:300]))
        run.save()   # (each rejected attempt is already in the event log, through on_reject)
        return None
    finally:
        run.spend(propose_seconds=time.perf_counter() - t0)
        run.sync()
    extra = [second] if second and len(iv.parent_hashes) > 1 else []
    return admit(run, iv, pid, extra, record, generation, cases)


def backtest_child(run: ProposalInputs, iv: Intervention, pid: str, cases: list | None = None) -> BacktestResult:
    """The backtest of ``iv``'s child on ``pid``'s cached rollouts and the labelled history (``cases``,
    read here when not given), its time charged to the budget."""
    t0 = time.perf_counter()
    cases = run.cases() if cases is None else cases
    backtested = backtest(iv.child(), run.versions.vdir(pid).path, expect=iv.expected_effect, labels=cases)
    run.spend(backtest_seconds=time.perf_counter() - t0)
    return backtested


def admit(run: ProposalInputs, iv: Intervention, pid: str, extra_parents: list[str], record: ProposalRecord, generation: int,
          cases: list) -> str | None:
    """Backtests an intervention on ``pid``'s cached rollouts and, if it passes, makes it a pending
    child; the history records either outcome. Under a human gate at design the child waits before its
    backtest (which runs once a person approves, ``loop/human/human_gate.py``), at backtest after it."""
    state = run.state
    record = replace(record, operator=iv.operator, factor=iv.factor, hypothesis=iv.hypothesis,
                     expected=iv.expected_effect.to_dict() if iv.expected_effect else None,
                     entry=iv.details.get("entry") or None)
    gate = next((p for p in ("design", "backtest") if p in run.human_gate), None)
    backtested = None
    if run.backtest and gate != "design":
        backtested = backtest_child(run, iv, pid, cases)
        if not backtested.accept:
            state.history.append(replace(record, outcome=Outcome.BACKTEST_REJECTED, reasons=backtested.reasons[:5]))
            run.say(f"gen {generation}: {iv.operator} child of {pid} rejected by backtest: {backtested.reasons[:1]}")
            run.save()
            return None
    status = Status.AWAITING_APPROVAL if gate else Status.PENDING
    cid = run.new_child(run.versions.vdir(pid).meta(), iv.child_source, generation, operator=iv.operator,
                        factor=iv.factor, intervention=iv.to_dict(), extra_parents=extra_parents, status=status)
    if backtested is not None:
        write_atomic(run.versions.vdir(cid).path / "backtest.json", backtested.to_json())
    state.history.append(replace(record, outcome=Outcome.ACCEPTED, child=cid))
    state.live.append(cid)
    if gate:   # the decision is opened here, with the child, so a crash cannot leave one without it
        state.approvals[cid] = Approval.PENDING
        state.gates[cid] = DecisionPoint(gate, generation)
    run.say(f"gen {generation}: {iv.operator} proposed {cid} from {pid} ({iv.factor})")
    run.save()
    return cid


def propose_compound(exp: Experiment, pid: str, other: str, factor: str, generation: int) -> bool:
    """The child of ``pid`` that takes ``other``'s promoted ``factor`` (structural crossover, no LLM),
    backtested like any child; whether it was accepted."""
    from evotrainer.operators.structural import CrossoverOperator

    run = exp.proposal_inputs()
    parent = run.versions.vdir(pid).meta()
    programs = [HarnessProgram(run.versions.vdir(v).genome_source(), name=f"{v}/genome.py") for v in (pid, other)]
    record = ProposalRecord(generation, pid, parent.genome_hash, compound=factor)
    try:
        iv = CrossoverOperator(seed=exp.cfg.seed + generation, factor=factor).propose(programs, run.evidence(pid))
    except OperatorError as e:
        run.state.history.append(replace(record, outcome=Outcome.OPERATOR_REJECTED, kind=e.kind, reason=e.reason[:300]))
        run.say(f"gen {generation}: compounding {factor} of {other} into {pid} failed: {e.reason[:160]}")
        return False
    iv.hypothesis = (f"If {pid} takes {factor} (promoted on {other}'s lineage) beside its own promoted factors, "
                     "held-out score rises, because promoted factors that each beat their control add up.")
    run.say(f"gen {generation}: compounding promoted factors: {pid} with {other}'s {factor}")
    cases = run.cases() if run.backtest else []
    return admit(run, iv, pid, [other], record, generation, cases) is not None
