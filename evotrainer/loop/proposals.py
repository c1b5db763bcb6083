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
from typing import TYPE_CHECKING

from evotrainer.fitness.backtest import backtest
from evotrainer.genome.errors import GenomeError
from evotrainer.genome.program import HarnessProgram
from evotrainer.loop.selection import parents as select_parents
from evotrainer.loop.decision_request import notes_for
from evotrainer.loop.versions import new_version
from evotrainer.operators import Evidence, OperatorError
from evotrainer.operators.triggers import report_metrics
from evotrainer.records.version import write_atomic

if TYPE_CHECKING:
    from evotrainer.loop.experiment import Experiment


def evidence_for(exp: Experiment, vid: str) -> Evidence:
    """What operators see of a parent: its health report, the skills whose trigger fires on it (this
    run's and, unless ``user_skills`` is off, the user's from earlier experiments), recent history,
    and the diagnostic gaps (invalid branches no validity check flagged)."""
    vd = exp.vdir(vid)
    report = json.loads((vd.path / "health.json").read_text()) if (vd.path / "health.json").is_file() else {}
    notes = notes_for(exp, vid)   # a person's hints at the diagnosis gate (loop/human_gate.py), alerts first
    if notes:
        report = {**report, "alerts": [{"name": "person's note", "severity": "critical", "source": "human",
                                        "message": n, "suggestion": n} for n in notes] + list(report.get("alerts") or [])}
    metrics, domain = report_metrics(report), exp.cfg.domain.name
    found = exp.skills.matching(metrics, domain) + (exp.user_skills.matching(metrics, domain) if exp.user_skills else [])
    skills = list({s.id: s.prompt_dict() for s in reversed(found)}.values())[::-1][:3]   # run's first, no repeats
    known = {exp.vdir(v).meta().genome_hash for v in exp.versions()}
    gaps = [dict(vars(g)) for g in exp.labels.gaps[-5:]]
    return Evidence(health_report=report, skills=skills, history=exp.state.history[-20:], known_hashes=known,
                    allow_multi_factor=exp.cfg.evolution.allow_multi_factor, gaps=gaps, refuted=refuted(exp))


def refuted(exp: Experiment) -> set[str]:
    """``parent genome hash:entry`` of the library interventions whose children lost on fitness."""
    out = set()
    for h in exp.state.history:
        entry, outcome, delta = h.get("entry"), h.get("outcome"), h.get("paired_delta")
        lost = outcome in ("rejected", "invalid") or (outcome in ("kept", "pruned") and delta is not None
                                                      and delta <= 0)
        if entry and lost and h.get("child"):
            parent_hash = h.get("parent_hash") or _genome_hash(exp, h.get("parent"))
            if parent_hash:
                out.add(f"{parent_hash}:{entry}")
    return out


def _genome_hash(exp: Experiment, vid: str | None) -> str | None:
    return exp.vdir(vid).meta().genome_hash if vid and exp.vdir(vid).path.is_dir() else None


def children_the_budget_allows(exp: Experiment, wanted: int) -> int:
    """``wanted``, or fewer when the step budget cannot train more after this generation's
    continuations (each version trains ``steps_per_generation`` steps); the log says so."""
    ev, state = exp.cfg.evolution, exp.state
    if ev.budget.train_steps is None or wanted <= 0:
        return wanted
    k = ev.steps_per_generation
    continuing = sum(1 for v in state.live if exp.vdir(v).meta().operator is None)
    left = ev.budget.train_steps - state.budget_used.get("train_steps", 0) - continuing * k
    room = max(0, int(left // k))
    if room < wanted:
        exp.say(f"gen {state.generation + 1}: {room} child(ren) instead of {wanted}: {max(0, left):.0f} train steps "
                f"are left after {continuing} continuation(s), {k} per version")
    return min(wanted, room)


def promoted_factors(exp: Experiment, vid: str) -> list[str]:
    """The factors of the promoted interventions on ``vid``'s lineage (itself and its first parents)."""
    out, seen = [], set()
    while vid and vid not in seen and exp.vdir(vid).path.is_dir():
        seen.add(vid)
        meta = exp.vdir(vid).meta()
        if meta.operator is not None and meta.status == "promoted" and meta.factor and meta.factor not in out:
            out.append(meta.factor)
        vid = meta.parents[0] if meta.parents else None
    return out


def compound(exp: Experiment, survivors: list[str]) -> tuple[str, str, str] | None:
    """(survivor, other survivor, factor) when the other's lineage carries a promoted factor the
    survivor's harness lacks, and that crossover child is new; the best-ranked survivor first."""
    from evotrainer.genome.edits import crossover, factors_changed

    ranked = sorted(survivors, key=lambda v: -(exp.vdir(v).meta().metrics.get("selection_accuracy") or 0.0))
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


def propose_children(exp: Experiment, survivors: list[str], generation: int) -> None:
    """Operators propose single-factor interventions on selected parents; each is backtested on the
    parent's cached rollouts before any training compute is spent on it."""
    ev, state = exp.cfg.evolution, exp.state
    wanted = 0 if ev.mode == "reference" else ev.children_per_generation
    todo = children_the_budget_allows(exp, wanted) - len([v for v in state.live
                                                          if exp.vdir(v).meta().operator is not None])
    if todo > 0 and ev.mode == "evolve" and (pair := compound(exp, survivors)):
        if propose_compound(exp, *pair, generation):
            todo -= 1
    from evotrainer.loop.merging import propose_merge_child   # (merging builds on this module's admit)

    if todo > 0 and propose_merge_child(exp, survivors, generation):   # evolution.merge decides whether and when
        todo -= 1
    picks = select_parents(exp.candidates(survivors), max(0, todo), ev.tournament_size,
                           seed=exp.cfg.seed * 7919 + generation, min_cells=ev.diversity.min_cells,
                           say=lambda msg: exp.say(f"gen {generation}: {msg}"))
    cases = exp.labels.cases() if picks and ev.backtest else []   # labelled history: read once per round
    for pid in picks:
        exp.budgets.guard()
        parent = exp.vdir(pid).meta()
        programs = [HarnessProgram(exp.vdir(pid).genome_source(), name=f"{pid}/genome.py")]
        second = next((s for s in survivors if exp.vdir(s).meta().genome_hash != parent.genome_hash), None)
        if second:
            programs.append(HarnessProgram(exp.vdir(second).genome_source(), name=f"{second}/genome.py"))
        record = {"generation": generation, "parent": pid, "parent_hash": parent.genome_hash}
        t0 = time.perf_counter()
        try:
            iv = exp.mix.propose(programs, evidence_for(exp, pid), attempts=3,
                                 on_reject=lambda name, err: exp.say(
                                     f"gen {generation}: {name} proposal for {pid} rejected ({err.kind}): "
                                     f"{err.reason[:160]}"))
        except OperatorError as e:
            state.history.append({**record, "outcome": "operator_rejected", "kind": e.kind, "reason": e.reason[:300]})
            exp.save()   # (each rejected attempt is already in the event log, through on_reject)
            continue
        finally:
            exp.budgets.spend(propose_seconds=time.perf_counter() - t0)
            exp.sync_budgets()
        extra = [second] if second and len(iv.parent_hashes) > 1 else []
        admit(exp, iv, pid, extra, record, generation, cases)


def backtest_child(exp: Experiment, iv, pid: str, cases: list | None = None):
    """The backtest of ``iv``'s child on ``pid``'s cached rollouts and the labelled history (``cases``,
    read here when not given), its time charged to the budget."""
    t0 = time.perf_counter()
    cases = exp.labels.cases() if cases is None else cases
    backtested = backtest(iv.child(), exp.vdir(pid).path, expect=iv.expected_effect, labels=cases)
    exp.budgets.spend(backtest_seconds=time.perf_counter() - t0)
    return backtested


def admit(exp: Experiment, iv, pid: str, extra_parents: list[str], record: dict, generation: int,
          cases: list) -> str | None:
    """Backtests an intervention on ``pid``'s cached rollouts and, if it passes, makes it a pending
    child; the history records either outcome. Under a human gate at design the child waits before its
    backtest (which runs once a person approves, ``loop/human_gate.py``), at backtest after it."""
    ev, state = exp.cfg.evolution, exp.state
    record.update(operator=iv.operator, factor=iv.factor, hypothesis=iv.hypothesis,
                  expected=iv.expected_effect.to_dict() if iv.expected_effect else None,
                  **({"entry": iv.details["entry"]} if iv.details.get("entry") else {}))
    gate = next((p for p in ("design", "backtest") if p in ev.human_gate), None)
    backtested = None
    if ev.backtest and gate != "design":
        backtested = backtest_child(exp, iv, pid, cases)
        if not backtested.accept:
            state.history.append({**record, "outcome": "backtest_rejected", "reasons": backtested.reasons[:5]})
            exp.say(f"gen {generation}: {iv.operator} child of {pid} rejected by backtest: {backtested.reasons[:1]}")
            exp.save()
            return None
    status = "awaiting_approval" if gate else "pending"
    cid = new_version(exp, exp.vdir(pid).meta(), iv.child_source, generation, operator=iv.operator,
                      factor=iv.factor, intervention=iv.to_dict(), extra_parents=extra_parents, status=status)
    if backtested is not None:
        write_atomic(exp.vdir(cid).path / "backtest.json", backtested.to_json())
    state.history.append({**record, "outcome": "accepted", "child": cid})
    state.live.append(cid)
    if gate:   # the decision is opened here, with the child, so a crash cannot leave one without it
        state.approvals[cid] = "pending"
        state.gates[cid] = {"point": gate, "generation": generation}
    exp.say(f"gen {generation}: {iv.operator} proposed {cid} from {pid} ({iv.factor})")
    exp.save()
    return cid


def propose_compound(exp: Experiment, pid: str, other: str, factor: str, generation: int) -> bool:
    """The child of ``pid`` that takes ``other``'s promoted ``factor`` (structural crossover, no LLM),
    backtested like any child; whether it was accepted."""
    from evotrainer.operators.structural import CrossoverOperator

    parent = exp.vdir(pid).meta()
    programs = [HarnessProgram(exp.vdir(v).genome_source(), name=f"{v}/genome.py") for v in (pid, other)]
    record = {"generation": generation, "parent": pid, "parent_hash": parent.genome_hash, "compound": factor}
    try:
        iv = CrossoverOperator(seed=exp.cfg.seed + generation, factor=factor).propose(programs, evidence_for(exp, pid))
    except OperatorError as e:
        exp.state.history.append({**record, "outcome": "operator_rejected", "kind": e.kind, "reason": e.reason[:300]})
        exp.say(f"gen {generation}: compounding {factor} of {other} into {pid} failed: {e.reason[:160]}")
        return False
    iv.hypothesis = (f"If {pid} takes {factor} (promoted on {other}'s lineage) beside its own promoted factors, "
                     "held-out score rises, because promoted factors that each beat their control add up.")
    exp.say(f"gen {generation}: compounding promoted factors: {pid} with {other}'s {factor}")
    cases = exp.labels.cases() if exp.cfg.evolution.backtest else []
    return admit(exp, iv, pid, [other], record, generation, cases) is not None
