"""The run history's typed records: a run's state.json reads back as the records it was written from, a
run written before the records were typed loads unchanged, and a damaged record is refused by name."""

from __future__ import annotations

import json

import pytest

from evotrainer.records.history import (HumanRecord, Outcome, ProposalRecord, RevertRecord, from_dict,
                                        proposal_of, to_dict)
from evotrainer.records.run_dir import RunDirError
from evotrainer.records.run_state import RunState, load_state, save_state, state_path

# What runs wrote before the history was typed (flat objects, as in a state.json of that time).
OLD = [
    {"generation": 1, "parent": "v0000", "parent_hash": "abc", "operator": "library", "factor": "hook:reward",
     "hypothesis": "partial credit revives dead groups", "expected": {"metric": "dead_group_ratio", "direction": "down"},
     "entry": "format_partial_credit", "outcome": "promoted", "child": "v0002", "heldout_accuracy": 0.4,
     "paired_delta": 0.125, "hypothesis_verdict": "confirmed"},
    {"generation": 1, "parent": "v0000", "parent_hash": "abc", "outcome": "operator_rejected", "kind": "parse",
     "reason": "no JSON in the reply"},
    {"generation": 2, "parent": "v0002", "parent_hash": "def", "merge": ["v0002", "v0003"], "combination": "ties",
     "outcome": "merge_refused", "reason": "r 16 vs 2"},
    {"generation": 3, "parent": "v0002", "operator": "revert", "factor": "revert", "outcome": "reverted",
     "to": "v0000", "reason": "CI lower bound below 0"},
    {"generation": 1, "human_gate": "completion", "version": "v0002", "action": "revise", "by": "ana",
     "at": "2026-12-01T10:00:00+00:00", "reason": "games the format", "outcome": {"from": "kept", "to": "rejected"}},
    {"generation": 1, "human_gate": "diagnosis", "version": "v0000", "action": "revise", "by": "ana",
     "at": "2026-12-01T09:00:00+00:00", "reason": "", "note": "try a curriculum"},
]


def test_records_written_before_the_types_read_back_as_typed_records_and_write_out_the_same():
    records = [from_dict(d) for d in OLD]
    assert [type(r) for r in records] == [ProposalRecord, ProposalRecord, ProposalRecord, RevertRecord,
                                          HumanRecord, HumanRecord]
    promoted, rejected, refused, revert, revised, note = records
    assert promoted.outcome is Outcome.PROMOTED and promoted.entry == "format_partial_credit" and not promoted.lost
    assert rejected.outcome is Outcome.OPERATOR_REJECTED and rejected.kind == "parse" and rejected.child is None
    assert refused.merge == ["v0002", "v0003"] and refused.outcome is Outcome.MERGE_REFUSED
    assert (revert.parent, revert.to) == ("v0002", "v0000")
    assert revised.point == "completion" and revised.extra == {"outcome": {"from": "kept", "to": "rejected"}}
    assert note.note == "try a curriculum" and note.point == "diagnosis"
    assert [to_dict(r) for r in records] == OLD          # what operators read, and the file, unchanged


def test_a_child_that_lost_on_fitness():
    def record(outcome, delta=None):
        return ProposalRecord(1, "v0", outcome=outcome, paired_delta=delta, child="v1")

    assert record(Outcome.REJECTED).lost and record(Outcome.INVALID).lost
    assert record(Outcome.KEPT, 0.0).lost and record(Outcome.PRUNED, -0.1).lost
    assert not record(Outcome.KEPT, 0.05).lost and not record(Outcome.KEPT).lost
    assert not record(Outcome.PROMOTED, 0.2).lost and not record(Outcome.BACKTEST_REJECTED).lost


def test_fields_no_reader_knows_are_kept_through_a_save(tmp_path):
    state = RunState(history=[from_dict({**OLD[0], "future_field": [1, 2]})])
    save_state(tmp_path, state)
    back = load_state(tmp_path)
    assert back.history == state.history and back.history[0].extra == {"future_field": [1, 2]}
    assert proposal_of(back.history, "v0002") is back.history[0] and proposal_of(back.history, "v0009") is None


def test_a_state_whose_history_is_damaged_is_refused_naming_the_record(tmp_path):
    save_state(tmp_path, RunState())
    data = json.loads(state_path(tmp_path).read_text())
    for damaged, says in [({"generation": 1, "parent": "v0", "outcome": "won"}, "unknown outcome 'won'"),
                          ({"parent": "v0", "outcome": "accepted"}, "lacks generation"),
                          ({"generation": "1", "parent": "v0"}, "generation must be an integer"),
                          ("v0001", "must be a JSON object")]:
        state_path(tmp_path).write_text(json.dumps({**data, "history": [damaged]}))
        with pytest.raises(RunDirError, match=says):
            load_state(tmp_path)


def test_open_human_decisions_read_back_typed_and_a_damaged_one_is_refused(tmp_path):
    from evotrainer.records.run_state import Approval, DecisionPoint

    state = RunState(approvals={"v0003": Approval.PENDING, "v0004": Approval.REVISED},
                     gates={"v0003": DecisionPoint("design", 2), "v0004": DecisionPoint("completion", 1)})
    save_state(tmp_path, state)
    back = load_state(tmp_path)
    assert back.approvals == state.approvals and back.gates == state.gates
    assert back.gates["v0003"] == DecisionPoint("design", 2) != DecisionPoint("design", 3)
    data = json.loads(state_path(tmp_path).read_text())
    for field, damaged, says in [("approvals", {"v0003": "maybe"}, "approvals: 'maybe'"),
                                 ("gates", {"v0003": {"point": "design"}}, "gates: v0003"),
                                 ("gates", {"v0003": "design"}, "gates: v0003")]:
        state_path(tmp_path).write_text(json.dumps({**data, field: damaged}))
        with pytest.raises(RunDirError, match=says):
            load_state(tmp_path)
