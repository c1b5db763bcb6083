"""The propose stage: operators turn a selected parent's genome + health report + matching skills
into single-factor interventions; each is backtested on the parent's cached rollouts before any
training compute is spent on it, and an accepted one becomes a pending child version."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from evotrainer.fitness.backtest import backtest
from evotrainer.genome.program import HarnessProgram
from evotrainer.loop.selection import parents as select_parents
from evotrainer.loop.skills import report_metrics
from evotrainer.loop.versions import new_version
from evotrainer.operators import Evidence, OperatorError
from evotrainer.records.version import write_atomic

if TYPE_CHECKING:
    from evotrainer.loop.experiment import Experiment


def evidence_for(exp: Experiment, vid: str) -> Evidence:
    """What operators see of a parent: its health report, the skills whose trigger fires on it (this
    run's and, unless ``user_skills`` is off, the user's from earlier experiments), recent history,
    and the diagnostic gaps (invalid branches no validity check flagged)."""
    vd = exp.vdir(vid)
    report = json.loads((vd.path / "health.json").read_text()) if (vd.path / "health.json").is_file() else {}
    metrics, domain = report_metrics(report), exp.cfg.domain.name
    found = exp.skills.matching(metrics, domain) + (exp.user_skills.matching(metrics, domain) if exp.user_skills else [])
    skills = list({s.id: s.prompt_dict() for s in reversed(found)}.values())[::-1][:3]   # run's first, no repeats
    known = {exp.vdir(v).meta().genome_hash for v in exp.versions()}
    gaps = [dict(vars(g)) for g in exp.labels.gaps[-5:]]
    return Evidence(health_report=report, skills=skills, history=exp.state.history[-20:], known_hashes=known,
                    allow_multi_factor=exp.cfg.evolution.allow_multi_factor, gaps=gaps)


def propose_children(exp: Experiment, survivors: list[str], generation: int) -> None:
    """Operators propose single-factor interventions on selected parents; each is backtested on the
    parent's cached rollouts before any training compute is spent on it."""
    ev, state = exp.cfg.evolution, exp.state
    wanted = 0 if ev.mode == "reference" else ev.children_per_generation
    todo = wanted - len([v for v in state.live if exp.vdir(v).meta().operator is not None])
    picks = select_parents(exp.candidates(survivors), max(0, todo), ev.tournament_size,
                           seed=exp.cfg.seed * 7919 + generation)
    cases = exp.labels.cases() if picks and ev.backtest else []   # labelled history: read once per round
    for pid in picks:
        exp.budgets.guard()
        parent = exp.vdir(pid).meta()
        programs = [HarnessProgram(exp.vdir(pid).genome_source(), name=f"{pid}/genome.py")]
        second = next((s for s in survivors if exp.vdir(s).meta().genome_hash != parent.genome_hash), None)
        if second:
            programs.append(HarnessProgram(exp.vdir(second).genome_source(), name=f"{second}/genome.py"))
        record = {"generation": generation, "parent": pid}
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
        record.update(operator=iv.operator, factor=iv.factor, hypothesis=iv.hypothesis,
                      expected=iv.expected_effect.to_dict() if iv.expected_effect else None,
                      **({"entry": iv.details["entry"]} if iv.details.get("entry") else {}))
        bt = None
        if ev.backtest:
            t0 = time.perf_counter()
            bt = backtest(iv.child(), exp.vdir(pid).path, expect=iv.expected_effect, labels=cases)
            exp.budgets.spend(backtest_seconds=time.perf_counter() - t0)
            if not bt.accept:
                state.history.append({**record, "outcome": "backtest_rejected", "reasons": bt.reasons[:5]})
                exp.say(f"gen {generation}: {iv.operator} child of {pid} rejected by backtest: {bt.reasons[:1]}")
                exp.save()
                continue
        extra = [second] if second and len(iv.parent_hashes) > 1 else []
        status = "awaiting_approval" if ev.human_gate else "pending"
        cid = new_version(exp, parent, iv.child_source, generation, operator=iv.operator, factor=iv.factor,
                          intervention=iv.to_dict(), extra_parents=extra, status=status)
        if bt is not None:
            write_atomic(exp.vdir(cid).path / "backtest.json", bt.to_json())
        state.history.append({**record, "outcome": "accepted", "child": cid})
        state.live.append(cid)
        if ev.human_gate:
            state.approvals[cid] = "pending"
        exp.say(f"gen {generation}: {iv.operator} proposed {cid} from {pid} ({iv.factor})")
        exp.save()
