"""The propose stage (``loop/stages/proposals.py``) on a parent version directory written by hand: no
Experiment, no config, no model. The ``library`` operator (no LLM) proposes from the parent's health
report; the backtest replays the child's reward on the parent's cached rollouts in the real sandbox.

The parent ``v0000`` reports few formatted answers and many dead groups, so the library's
``format_partial_credit`` entry fires: a wrong but formatted answer earns partial credit. Whether its
claim (fewer dead groups) holds depends on the cached rollouts: it revives a dead group only where
the answer format varies within it.
"""

import dataclasses
import json

import pytest

from evotrainer.genome.edits import factors_changed
from evotrainer.genome.program import HarnessProgram, reference_program
from evotrainer.loop.budgets import BudgetReached
from evotrainer.loop.stages.proposals import ProposalInputs, propose_child
from evotrainer.loop.run_versions import RunVersions
from evotrainer.operators import Evidence
from evotrainer.operators.library_entries import ENTRIES
from evotrainer.operators.registry import OperatorMix
from evotrainer.records.rollout import Rollout
from evotrainer.records.run_state import DecisionPoint, RunState
from evotrainer.records.version import BranchVersion

ENTRY = next(e for e in ENTRIES if e.id == "format_partial_credit")
REPORT = {"metrics": {"format_compliance": 0.2, "dead_group_ratio": 0.8}}   # the entry's trigger fires
# (correct, format_ok) per rollout, 6 groups of 4 over two steps. Varying format: partial credit revives
# groups 0, 1 and 2 (5 dead before, 2 after). Uniform format: it revives none.
VARYING = [[(0, 1), (0, 0), (0, 0), (0, 0)], [(0, 1), (0, 1), (0, 0), (0, 0)], [(0, 0), (0, 0), (0, 0), (0, 1)],
           [(0, 1), (0, 1), (0, 1), (0, 1)], [(1, 1), (0, 0), (1, 1), (0, 1)], [(1, 1), (1, 1), (1, 1), (1, 1)]]
UNIFORM = [[(0, f)] * 4 for f in (1, 0, 1, 0, 1)] + [[(1, 1), (0, 0), (1, 1), (0, 1)]]


def cached_train(groups: list[list[tuple[int, int]]]) -> list[Rollout]:
    """Train rollouts as the reference recipe stored them (reward = correctness, GRPO advantages)."""
    out = []
    for g, rows in enumerate(groups):
        rs = [Rollout(task_id=f"t{g}", messages=[{"role": "user", "content": "What is 2+2?"}], completion="x",
                      completion_ids=[1, 2], logprobs=[-1.0, -1.0], step=g // 3, group=g % 3, split="train",
                      visible={"correct": bool(c), "format_ok": bool(f)}, reward=float(c), advantage=0.0)
              for c, f in rows]
        mean = sum(r.reward for r in rs) / 4
        std = (sum((r.reward - mean) ** 2 for r in rs) / 4) ** 0.5
        for r in rs:
            r.advantage = (r.reward - mean) / (std + 1e-4)
        out += rs
    return out


def cached_heldout() -> list[Rollout]:
    return [Rollout(task_id=f"h{i}", messages=[{"role": "user", "content": "q"}], completion="c", seed=0,
                    split="heldout", step=-1, visible={"format_ok": i % 2 == 0},
                    hidden={"correct": i % 4 == 0, "format_ok": i % 2 == 0}) for i in range(8)]


class Run:
    """A run's propose-stage inputs over hand-written version directories, and what the stage did."""

    def __init__(self, tmp_path, groups, human_gate=(), refuted=frozenset()):
        self.versions = RunVersions(tmp_path / "versions")
        self.state = RunState(next_id=1)   # v0000 exists
        self.said, self.spent, self.saves = [], [], 0
        self.parent = reference_program()
        vd = self.versions.vdir("v0000")
        vd.path.mkdir(parents=True)
        vd.save_genome(self.parent.source)
        vd.save_rollouts("train", cached_train(groups))
        vd.save_rollouts("heldout", cached_heldout())
        (vd.path / "health.json").write_text(json.dumps(REPORT))
        vd.save_meta(BranchVersion(id="v0000", base_model="constructed", genome_hash=self.parent.hash,
                                   status="kept", generation=0, metrics={"selection_accuracy": 0.25}))
        self.refuted = set(refuted)
        self.mix = OperatorMix({"library": 1.0}, seed=0, kwargs_by_name={"library": {"entries": [ENTRY]}})
        self.inputs = ProposalInputs(
            self.versions, self.state, backtest=True, human_gate=tuple(human_gate), new_child=self.new_child,
            operators=lambda: self.mix, evidence=self.evidence, cases=lambda: [], spend=self.spend,
            save=self.save, say=self.said.append)

    def evidence(self, vid: str) -> Evidence:
        report = json.loads((self.versions.vdir(vid).path / "health.json").read_text())
        return Evidence(health_report=report, refuted=self.refuted)

    def new_child(self, parent, source, generation, *, operator=None, factor=None, intervention=None,
                  extra_parents=(), status="pending") -> str:
        """The pending child as a version directory (the experiment's is ``loop/versions.new_version``,
        which also copies the parent's adapter: there is none here)."""
        vid = self.state.new_id()
        vd = self.versions.vdir(vid)
        vd.path.mkdir(parents=True)
        vd.save_genome(source)
        vd.save_meta(BranchVersion(id=vid, base_model="constructed", genome_hash=HarnessProgram(source).hash,
                                   parents=[parent.id, *extra_parents], status=status, generation=generation,
                                   operator=operator, factor=factor, intervention=intervention))
        return vid

    def spend(self, **seconds: float) -> None:
        self.spent += list(seconds)

    def save(self) -> None:
        self.saves += 1


def test_a_child_the_backtest_confirms_is_one_factor_from_its_parent_and_pending(tmp_path):
    run = Run(tmp_path, VARYING)
    cid = propose_child(run.inputs, "v0000", ["v0000"], 1, cases=[])
    assert cid == "v0001" and run.state.live == ["v0001"]
    child = run.versions.vdir(cid)
    meta = child.meta()
    assert (meta.status, meta.parents, meta.operator, meta.factor) == ("pending", ["v0000"], "library", "hook:reward")
    assert factors_changed(run.parent, HarnessProgram(child.genome_source())) == ["hook:reward"]
    # The backtest replayed the child's reward on v0000's cached rollouts: three dead groups revived.
    result = json.loads((child.path / "backtest.json").read_text())
    assert result["parent"] == str(run.versions.vdir("v0000").path) and result["accept"] is True
    n = result["numbers"]
    assert (n["groups"], n["dead_groups_before"], n["dead_groups_after"], n["revived_groups"]) == (6, 5, 2, 3)
    assert result["expectation_status"] == "met"
    assert result["before"]["heldout_spearman_reward_outcome"] is None   # the held-out draw was replayed too
    assert result["after"]["heldout_spearman_reward_outcome"] == pytest.approx(0.57735, abs=1e-4)
    (record,) = run.state.history
    assert record.outcome == "accepted" and record.child == cid and record.entry == ENTRY.id
    assert record.parent_hash == run.parent.hash and record.expected["metric"] == "dead_group_ratio"
    assert run.said == ["gen 1: library proposed v0001 from v0000 (hook:reward)"]
    assert run.spent == ["propose_seconds", "backtest_seconds"] and run.saves == 1
    assert run.mix.stats["library"].accepted == 1


def test_a_child_the_backtest_refutes_is_recorded_and_never_created(tmp_path):
    run = Run(tmp_path, UNIFORM)   # every dead group's format is uniform: partial credit revives none
    assert propose_child(run.inputs, "v0000", ["v0000"], 1, cases=[]) is None
    assert run.versions.ids() == ["v0000"] and run.state.live == [] and run.state.next_id == 1
    (record,) = run.state.history
    assert record.outcome == "backtest_rejected" and record.entry == ENTRY.id
    assert any("dead_group_ratio" in r and "MISSED" in r for r in record.reasons), record.reasons
    assert len(run.said) == 1 and run.said[0].startswith("gen 1: library child of v0000 rejected by backtest:")
    assert run.spent == ["propose_seconds", "backtest_seconds"] and run.saves == 1


def test_an_entry_refuted_on_fitness_from_this_harness_is_not_proposed_again(tmp_path):
    run = Run(tmp_path, VARYING, refuted={f"{reference_program().hash}:{ENTRY.id}"})
    assert propose_child(run.inputs, "v0000", ["v0000"], 1, cases=[]) is None
    (record,) = run.state.history
    assert record.outcome == "operator_rejected" and record.parent == "v0000"
    assert run.said and all("library proposal for v0000 rejected" in m for m in run.said)   # each attempt
    assert run.spent == ["propose_seconds"] and run.versions.ids() == ["v0000"]   # the time is charged still


def test_a_spent_budget_stops_before_any_operator_is_asked(tmp_path):
    run = Run(tmp_path, VARYING)

    def spent():
        raise BudgetReached("train_steps budget reached")

    with pytest.raises(BudgetReached):
        propose_child(dataclasses.replace(run.inputs, guard=spent), "v0000", ["v0000"], 1, cases=[])
    assert run.state.history == [] and run.spent == [] and run.mix.stats["library"].proposals == 0


def test_a_child_held_at_design_waits_for_a_person_before_its_backtest(tmp_path):
    run = Run(tmp_path, UNIFORM, human_gate=("design",))   # the backtest would refute it: it is not run yet
    cid = propose_child(run.inputs, "v0000", ["v0000"], 1, cases=[])
    assert run.versions.vdir(cid).meta().status == "awaiting_approval"
    assert not (run.versions.vdir(cid).path / "backtest.json").exists() and run.spent == ["propose_seconds"]
    assert run.state.approvals == {cid: "pending"} and run.state.gates == {cid: DecisionPoint("design", 1)}


def test_the_evidence_says_whether_any_step_of_the_lineage_moved_the_adapter(tmp_path):
    """``lineage_trained`` walks a version's parents (all of a merge's): a step with a gradient anywhere
    above it means its adapter is not the base model's; skipped steps and zero gradients do not."""
    from types import SimpleNamespace

    from evotrainer.loop.stages.proposals import lineage_trained

    versions = RunVersions(tmp_path / "versions")
    steps = {"v0000": [{"skipped": 1.0, "grad_norm": 0.0}], "v0001": [{"grad_norm": 0.0, "kl": 0.0}],
             "v0002": [{"grad_norm": 0.4}], "v0003": [{"skipped": 1.0}]}
    parents = {"v0000": [], "v0001": ["v0000"], "v0002": [], "v0003": ["v0001", "v0002"]}
    for vid, rows in steps.items():
        vd = versions.vdir(vid)
        vd.path.mkdir(parents=True)
        vd.save_meta(BranchVersion(id=vid, base_model="constructed", genome_hash="h", parents=parents[vid]))
        for row in rows:
            vd.append_step(row)
    exp = SimpleNamespace(vdir=versions.vdir)
    assert not lineage_trained(exp, "v0000")
    assert not lineage_trained(exp, "v0001")   # a KL step on an adapter equal to the base: no gradient
    assert lineage_trained(exp, "v0002")
    assert lineage_trained(exp, "v0003")       # through its second parent (a merge)
