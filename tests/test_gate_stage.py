"""The gate stage (``loop/stages/gating.py``) on version directories written by hand: no Experiment, no
config, no model. Held-out scores are exactly what each test needs; the harness's own validity hook
still runs in the real sandbox.

One generation as the loop leaves it before its gate: the seed ``v0000`` (generation 0), its
continuation ``v0001`` under the same harness (the control) and a child ``v0002`` of ``v0000`` made
by an operator, both of generation 1 and ``verified``.
"""

import dataclasses
import json

import pytest

from evotrainer.fitness.gate_config import GateConfig
from evotrainer.genome.program import HarnessProgram, reference_program
from evotrainer.loop.stages.gating import GateInputs, gate_version
from evotrainer.loop.run_versions import RunVersions
from evotrainer.loop.knowledge.skills import SkillLibrary
from evotrainer.records.history import ProposalRecord
from evotrainer.records.rollout import Rollout
from evotrainer.records.version import BranchVersion

N = 16
FLAGS_EVERYTHING = '''
def validity(rollouts, metrics, history):
    return [{"name": "always", "message": "this harness flags every branch"}]
'''
INTERVENTION = {"factor": "knob:learning_rate", "diff": "-learning_rate = 1e-5\n+learning_rate = 2e-5\n",
                "expected_effect": {"metric": "heldout_accuracy", "op": "delta>", "value": 0.0}}


def heldout(n_correct: int) -> list[Rollout]:
    """The gate draw: the same N tasks and seed on every version, the first ``n_correct`` right."""
    return [Rollout(task_id=f"h{i}", messages=[{"role": "user", "content": "q"}], completion="c", seed=0,
                    step=-1, split="heldout", visible={"format_ok": True},
                    hidden={"correct": i < n_correct, "format_ok": True}) for i in range(N)]


def train() -> list[Rollout]:
    """Honest train rollouts (nothing leaked into the prompts): the engine's checks pass."""
    return [Rollout(task_id=f"t{i // 2}", messages=[{"role": "user", "content": "What is 3+4?"}],
                    completion="Answer: 7" if i % 4 == 0 else "Answer: 5", step=0, group=i // 2,
                    visible={"correct": i % 4 == 0, "format_ok": True}, reward=float(i % 4 == 0), advantage=0.0)
            for i in range(16)]


def write(versions: RunVersions, vid: str, parents: list[str], generation: int, n_correct: int | None,
          operator: str | None = None, genome: str | None = None, status: str = "verified") -> None:
    """A version directory as verification leaves it (``n_correct`` None: never verified)."""
    vd = versions.vdir(vid)
    vd.path.mkdir(parents=True)
    program = reference_program() if genome is None else HarnessProgram(genome)
    vd.save_genome(program.source)
    vd.save_rollouts("train", train())
    if n_correct is not None:
        vd.save_rollouts("heldout", heldout(n_correct))
    vd.save_meta(BranchVersion(id=vid, base_model="constructed", genome_hash=program.hash, parents=parents,
                               status=status, generation=generation, operator=operator,
                               intervention=INTERVENTION if operator else None,
                               metrics={} if n_correct is None else {"heldout_accuracy": n_correct / N}))


def generation(tmp_path, child_correct: int, control_correct: int | None = 4, child_genome: str | None = None):
    """(the gate's inputs, the messages it said): v0000 → control v0001, child v0002."""
    versions = RunVersions(tmp_path / "versions")
    write(versions, "v0000", [], 0, 4, status="kept")
    write(versions, "v0001", ["v0000"], 1, control_correct, status="verified" if control_correct is not None else "rejected")
    write(versions, "v0002", ["v0000"], 1, child_correct, operator="knobs", genome=child_genome)
    said: list[str] = []
    history = [ProposalRecord(1, "v0000", operator="knobs", child="v0002")]
    inputs = GateInputs(versions, GateConfig(), keep_ties=True, domain="math", history=history,
                        listeners=(SkillLibrary(tmp_path / "skills.json"),), say=said.append)
    return inputs, said


def test_a_child_better_on_the_paired_gate_draw_is_promoted_and_its_skill_recorded(tmp_path):
    run, said = generation(tmp_path, child_correct=12)   # 12/16 against its control's 4/16, task by task
    gate_version(run, "v0002")
    meta = run.versions.vdir("v0002").meta()
    assert meta.status == "promoted" and not meta.violations
    assert meta.decision["paired"]["mean_delta"] == pytest.approx(0.5) and meta.decision["paired"]["ci_low"] > 0
    assert meta.hypothesis["verdict"] == "confirmed"
    assert json.loads((run.versions.vdir("v0002").path / "decision.json").read_text())["promote"] is True
    assert run.history[0].outcome == "promoted" and run.history[0].paired_delta == pytest.approx(0.5)
    skill = next(iter(run.listeners[0]))
    assert skill.factor == "knob:learning_rate" and skill.evidence[0]["version"] == "v0002"
    assert skill.domains == ["math"] and skill.evidence[0]["parent"] == "v0001"
    assert any("v0002 vs v0001: promoted" in m for m in said)


def test_a_child_worse_on_the_paired_gate_draw_is_rejected(tmp_path):
    run, _ = generation(tmp_path, child_correct=0, control_correct=12)
    gate_version(run, "v0002")
    meta = run.versions.vdir("v0002").meta()
    assert meta.status == "rejected" and meta.decision["paired"]["ci_high"] < 0
    assert meta.hypothesis["verdict"] == "refuted" and run.history[0].outcome == "rejected"
    assert len(run.listeners[0]) == 0


def test_a_tie_lives_on_as_a_branch_only_when_ties_are_kept(tmp_path):
    run, _ = generation(tmp_path, child_correct=4)
    gate_version(run, "v0002")
    assert run.versions.vdir("v0002").meta().status == "kept"
    strict, _ = generation(tmp_path / "strict", child_correct=4)
    gate_version(dataclasses.replace(strict, keep_ties=False), "v0002")
    assert strict.versions.vdir("v0002").meta().status == "rejected"


def test_a_child_its_own_validity_hook_flags_is_invalid_however_well_it_scores(tmp_path):
    run, _ = generation(tmp_path, child_correct=12, child_genome=FLAGS_EVERYTHING)
    gate_version(run, "v0002")
    meta = run.versions.vdir("v0002").meta()
    assert meta.status == "invalid" and meta.decision["paired"]["promote"]   # better by the numbers, still blocked
    assert [v["message"] for v in meta.violations] == ["harness validity always: this harness flags every branch"]
    assert meta.hypothesis["verdict"] == "refuted" and run.history[0].outcome == "invalid"


def test_a_child_whose_control_has_no_gate_draw_is_paired_with_its_parent(tmp_path):
    run, said = generation(tmp_path, child_correct=12, control_correct=None)
    gate_version(run, "v0002")
    meta = run.versions.vdir("v0002").meta()
    assert meta.status == "promoted" and meta.decision["spend"]["control"]["heldout_rollouts"] == N
    assert any("v0002's control v0001 has no held-out scores" in m and "against its parent v0000" in m for m in said)


def test_a_verdict_held_for_a_person_changes_nothing_beyond_the_version(tmp_path):
    run, _ = generation(tmp_path, child_correct=12)
    gate_version(run, "v0002", finish=False)
    assert run.versions.vdir("v0002").meta().status == "promoted"
    assert run.history[0].outcome == "accepted" and len(run.listeners[0]) == 0
    gate_version(run, "v0002")   # the person decided: the gate's effects follow, once
    assert run.history[0].outcome == "promoted" and len(run.listeners[0]) == 1


def test_the_seed_and_continuations_are_kept_without_a_comparison(tmp_path):
    run, said = generation(tmp_path, child_correct=12)
    gate_version(run, "v0001")
    assert run.versions.vdir("v0001").meta().status == "kept" and not said and run.history[0].outcome == "accepted"


def test_the_gate_tells_its_listeners_the_outcome_without_knowing_them(tmp_path):
    """Any object with ``observe`` hears each gated child's outcome, typed: the skill library and the
    operator mix are two such listeners, not names the gate calls."""
    from evotrainer.records.outcome import GateOutcome

    run, _ = generation(tmp_path, child_correct=0, control_correct=12)
    heard: list[GateOutcome] = []
    recorder = type("Recorder", (), {"observe": lambda self, o: heard.append(o)})()
    run = dataclasses.replace(run, listeners=run.listeners + (recorder,))
    gate_version(run, "v0002")
    (o,) = heard
    assert (o.child, o.control, o.operator, o.status, o.domain) == ("v0002", "v0001", "knobs", "rejected", "math")
    assert o.paired_delta == pytest.approx(-0.75) and o.verdict == "refuted" and not o.promoted
