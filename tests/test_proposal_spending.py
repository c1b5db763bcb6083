"""Where the propose stage spends (loop/stages/proposals.py): an intervention refuted on fitness is not
proposed from the same parent harness again, no child is proposed the step budget cannot train,
promoted factors are put together, and operators are credited for fitness, not for a confirmed
mechanism."""

import json
from pathlib import Path

from evotrainer.config import parse_config
from evotrainer.genome import reference_program as reference
from evotrainer.loop.experiment import Experiment
from evotrainer.loop.stages.proposals import children_the_budget_allows, compound, promoted_factors, propose_compound, refuted
from evotrainer.operators import Evidence, get_operator
from evotrainer.records.history import Outcome, ProposalRecord
from evotrainer.testing.learning_harness import always_learns

from tests.loop_runs import tiny_cfg

REPORT = json.loads((Path(__file__).parent / "fixtures" / "health_report_demo.json").read_text())


def test_an_entry_refuted_from_a_parent_harness_is_not_offered_for_it_again():
    op = get_operator("library")
    parent = reference()
    fired = {a.entry.id for a in op.applicable(parent, Evidence(health_report=REPORT))[0]}
    assert fired
    entry = sorted(fired)[0]
    found, skipped = op.applicable(parent, Evidence(health_report=REPORT, refuted={f"{parent.hash}:{entry}"}))
    assert entry not in {a.entry.id for a in found} and "refuted on fitness" in skipped[entry]
    # Refuted from another harness: this one may still try it.
    found, _ = op.applicable(parent, Evidence(health_report=REPORT, refuted={f"other:{entry}"}))
    assert entry in {a.entry.id for a in found}


def test_what_counts_as_refuted_on_fitness(tmp_path):
    exp = Experiment(parse_config(tiny_cfg(tmp_path / "run")))
    exp.state.history = [ProposalRecord(0, "v0", **{**d, "outcome": Outcome(d["outcome"])}) for d in [
        {"entry": "a", "child": "v1", "parent_hash": "p", "outcome": "rejected"},
        {"entry": "b", "child": "v2", "parent_hash": "p", "outcome": "kept", "paired_delta": 0.0},
        {"entry": "c", "child": "v3", "parent_hash": "p", "outcome": "kept", "paired_delta": 0.05},
        {"entry": "d", "child": "v4", "parent_hash": "p", "outcome": "promoted", "paired_delta": 0.2},
        {"entry": "e", "child": "v5", "parent_hash": "p", "outcome": "invalid"},
        {"entry": "f", "parent_hash": "p", "outcome": "backtest_rejected"},    # never trained: no fitness verdict
        {"entry": "g", "child": "v6", "parent_hash": "q", "outcome": "pruned", "paired_delta": -0.1},
    ]]
    assert refuted(exp) == {"p:a", "p:b", "p:e", "q:g"}
    exp.close()


def test_no_more_children_than_the_step_budget_can_train(tmp_path):
    exp = Experiment(parse_config(tiny_cfg(tmp_path / "run", generations=1, budget={"train_steps": 10},
                                           steps_per_generation=2, probe_steps=0)))
    exp.run()                       # gen 0 trains the seed: 2 steps; it survives
    exp.state.budget_used["train_steps"] = 5
    exp.continue_survivors(1)       # one continuation: 2 more steps, 3 left, room for 1 child of 2
    assert len(exp.state.live) == 1
    assert children_the_budget_allows(exp, 2) == 1
    exp.state.budget_used["train_steps"] = 8
    assert children_the_budget_allows(exp, 2) == 0
    assert any("0 child(ren) instead of 2" in e for e in exp.state.events)
    exp.close()


def test_promoted_factors_compound(tmp_path):
    """Two survivors whose lineages each carry a promoted knob change: the compound child is the one
    with the other's factor, a real child of the generation (backtested, pending, two parents)."""
    cfg = tiny_cfg(tmp_path / "run", generations=2, population_size=3, operators={"knobs": 1.0})
    # A reward with a length tie-break: the tiny model's groups carry signal, so the knobs operator draws
    # from every knob (on a parent whose every group was dead it leaves out those that act only in a step).
    # At the top of its range the learning rate cannot be raised: the tiny model's greedy answers barely
    # move, so adapter_stuck fires and triage would otherwise give every knob child the learning rate.
    harness = tmp_path / "learns.py"
    learns = always_learns()
    harness.write_text(learns.with_knobs(learning_rate=learns.knobs["learning_rate"]["range"][1]).source)
    exp = Experiment(parse_config({**cfg, "harness": str(harness)}))
    exp.run()
    children = [exp.vdir(v).meta() for v in exp.versions() if exp.vdir(v).meta().operator == "knobs"]
    a, b = children[0], next(c for c in children[1:] if c.factor != children[0].factor)
    for m in (a, b):
        m.status = "promoted"
        exp.vdir(m.id).save_meta(m)
    assert promoted_factors(exp, a.id) == [a.factor]
    pid, other, factor = compound(exp, [a.id, b.id])
    assert {pid, other} == {a.id, b.id} and factor == exp.vdir(other).meta().factor
    exp.state.status, exp.state.generation = "running", 2
    assert propose_compound(exp, pid, other, factor, 2)
    cid = exp.state.live[-1]
    child = exp.vdir(cid).meta()
    assert child.status == "pending" and child.parents == [pid, other] and child.factor == factor
    assert set(promoted_factors(exp, pid)) | {factor} == {a.factor, b.factor}
    assert compound(exp, [a.id, b.id]) != (pid, other, factor)    # the same compound is not proposed twice
    exp.close()


def test_operators_are_credited_for_promotions_only(tmp_path):
    from evotrainer.loop.knowledge.operator_mix import operator_mix

    cfg = parse_config(tiny_cfg(tmp_path / "run", operators={"library": 1.0, "knobs": 1.0}))
    history = [ProposalRecord(1, "v0000", operator="library", entry="more_generations", outcome=Outcome.REJECTED,
                              hypothesis_verdict="confirmed")] * 3
    mix = operator_mix(cfg, tmp_path, None, history)
    assert mix.outcomes["library"] == [0, 3]           # a confirmed mechanism is not a fitness win
    assert mix.entry_weights["more_generations"] < 0.5


def test_random_library_draws_entries_without_reading_the_report(tmp_path):
    """The best-of-N baseline: with no metrics at all (no trigger can fire) it still proposes, every
    entry it can, uniformly; the diagnosing library proposes nothing then."""
    import pytest

    from evotrainer.operators import OperatorError

    empty = Evidence(health_report={"metrics": {}})
    with pytest.raises(OperatorError, match="holds no health report"):
        get_operator("library").propose([reference()], empty)
    from evotrainer.operators.library import default_entries

    episode_entries = {e.id for e in default_entries() if e.episodes_only}
    assert {"swe_history_validity", "swe_history_validity_gap"} <= episode_entries
    seen = set()
    for seed in range(40):
        iv = get_operator("random_library", seed=seed).propose([reference()], empty)
        assert iv.operator == "random_library"
        seen.add(iv.details["entry"])
    assert len(seen) >= 5
    # Best-of-N over what could apply: never an episode entry (SWE tool calls, git history) for a
    # single-turn parent, which would be a child that cannot differ from its parent.
    assert not seen & episode_entries
    exp = Experiment(parse_config(tiny_cfg(tmp_path / "run", generations=2, mode="random-library")))
    exp.run()
    kids = [exp.vdir(v).meta() for v in exp.versions() if exp.vdir(v).meta().operator]
    assert kids and all(k.operator == "random_library" for k in kids)
    exp.close()
