"""A tie at nothing resolved (fitness/gates.py, loop/stages/selection.py): when neither side of a gate
resolves a held-out issue, the paired test reads the share of working calls the environment accepted,
guarded by progress; selection breaks the same tie the same way. A submit-only episode, a child whose
progress fell, a branch whose reward rises without progress: none is promoted on its calls."""

from __future__ import annotations

import pytest

from evotrainer.fitness.cache import write_version
from evotrainer.fitness.episodes import working_call_rate, working_call_share
from evotrainer.fitness.gates import GateConfig, gate
from evotrainer.genome.program import HarnessProgram
from evotrainer.loop.stages.gating import child_outcome, gate_line
from evotrainer.loop.seed import DOMAIN_HARNESSES
from evotrainer.loop.stages.selection import Candidate, parents, rank_score, survivors
from tests.test_swe_interventions import ACCEPTED, EDIT, PROSE, REFUSED, episode

SWE = HarnessProgram.from_file(DOMAIN_HARNESSES["swe"])
N = 8   # held-out issues of each side's gate draw


def heldout(turns_of, resolved=()):
    """One episode a task: ``turns_of(i)`` its turns (the last may be a submit: ``"submit"``)."""
    out = []
    for i in range(N):
        turns = turns_of(i)
        submitted = turns[-1] == "submit"
        r = episode([t for t in turns if t != "submit"] or [PROSE], resolved=i in resolved, submitted=submitted,
                    task=f"h{i}")
        if turns == ["submit"]:   # a submit-only episode: its one call is the submit
            r.tool_calls, r.turn_log = [{"name": "submit", "args": {}, "error": None}], []
        r.hidden, r.split, r.seed = {"correct": i in resolved}, "heldout", 0
        out.append(r)
    return out


def train():
    """Two steps of dead groups: no reward, no progress, nothing for a validity check to flag."""
    rs = [episode([PROSE], step=s, group=g, reward=0.0, task=f"t{g}") for s in range(2) for g in range(4)]
    return rs


def version(tmp_path, name, held, rollouts=None):
    return write_version(tmp_path / name, train=rollouts or train(), heldout=held, genome=SWE.source)


def test_the_working_call_share_ignores_the_submit_and_scores_giving_up_at_zero():
    assert working_call_share(episode([ACCEPTED, REFUSED], submitted=True)) == pytest.approx(0.5)
    assert working_call_share(episode([PROSE, PROSE])) == 0.0                     # malformed calls
    give_up = episode([PROSE])
    give_up.tool_calls = [{"name": "submit", "args": {}, "error": None}]
    assert working_call_share(give_up) == 0.0                                      # one accepted call, a submit
    assert working_call_rate([episode([ACCEPTED]), episode([PROSE])]) == pytest.approx(0.5)
    assert working_call_rate([]) is None


def test_a_tie_at_nothing_resolved_is_broken_on_the_working_calls_accepted(tmp_path):
    parent = version(tmp_path, "parent", heldout(lambda i: [PROSE, PROSE]))
    child = version(tmp_path, "child", heldout(lambda i: [ACCEPTED, ACCEPTED if i % 2 else REFUSED]))
    d = gate(child, parent, GateConfig(level=0.9))
    assert d.valid and d.promote, d.reasons
    assert d.paired["basis"] == "working_calls" and d.paired["mean_delta"] == pytest.approx(0.75)
    assert d.paired["resolution"]["mean_delta"] == 0.0 and not d.paired["resolution"]["promote"]
    assert "nothing resolved" in d.reasons[-1] and "nothing resolved" in gate_line(d.paired)
    # The other way round, the parent's calls are significantly better: the child is rejected.
    back = gate(parent, child, GateConfig(level=0.9))
    assert not back.promote and child_outcome(back.paired, keep_ties=True) == "rejected"


def test_giving_up_is_not_promoted_on_its_accepted_submit(tmp_path):
    parent = version(tmp_path, "parent", heldout(lambda i: [PROSE, PROSE]))
    gives_up = version(tmp_path, "gives_up", heldout(lambda i: ["submit"]))
    d = gate(gives_up, parent, GateConfig(level=0.9))
    assert not d.promote and d.paired["basis"] == "working_calls" and d.paired["mean_delta"] == 0.0


def test_a_child_whose_progress_fell_is_not_promoted_on_its_calls(tmp_path):
    # The control edits on half its issues (and refuses its other calls); the child's calls are all
    # accepted reads and it never edits: more calls accepted, less progress.
    parent = version(tmp_path, "parent", heldout(lambda i: [EDIT, REFUSED, REFUSED, REFUSED] if i % 2 else [REFUSED]))
    child = version(tmp_path, "child", heldout(lambda i: [ACCEPTED, ACCEPTED]))
    d = gate(child, parent, GateConfig(level=0.9))
    assert not d.promote, d.reasons
    assert d.paired["ci_low"] > 0 and "progress" in d.paired["reason"] and "fell" in d.paired["reason"]
    assert d.paired["progress"] == {"child": 0.0, "parent": 0.5}


def test_resolution_decides_when_either_side_resolved_anything(tmp_path):
    parent = version(tmp_path, "parent", heldout(lambda i: [PROSE]))
    child = version(tmp_path, "child", heldout(lambda i: [ACCEPTED, ACCEPTED], resolved={0}))
    d = gate(child, parent, GateConfig(level=0.9))
    assert "basis" not in d.paired and not d.promote   # one resolution in 8 is within the noise


def test_a_branch_whose_reward_rises_without_progress_is_invalid_whatever_its_calls(tmp_path):
    hacked = [episode([PROSE], step=0, group=g, reward=0.0, task=f"t{g}") for g in range(8)]
    hacked += [episode([ACCEPTED, ACCEPTED], step=s, group=g, reward=0.2 if g % 2 else 0.1, task=f"t{g}")
               for s in (1, 2, 3) for g in range(8)]
    parent = version(tmp_path, "parent", heldout(lambda i: [PROSE, PROSE]))
    child = version(tmp_path, "child", heldout(lambda i: [ACCEPTED, ACCEPTED]), rollouts=hacked)
    d = gate(child, parent, GateConfig(level=0.9))
    assert not d.valid and not d.promote
    assert any("episode_progress" in r for r in d.reasons), d.reasons


def test_selection_breaks_a_tie_in_accuracy_by_the_working_calls_and_never_above_a_resolution():
    tied = {"selection_accuracy": 0.0, "selection_working_calls": 0.9}
    assert rank_score(tied) > rank_score({"selection_accuracy": 0.0, "selection_working_calls": 0.1})
    assert rank_score({"selection_accuracy": 0.0}) == 0.0                        # single-turn domains: accuracy
    assert rank_score({"selection_accuracy": 1 / 999_999}) > rank_score(tied)    # one resolution in a million
    cands = [Candidate("idle", rank_score({"selection_accuracy": 0.0, "selection_working_calls": 0.0}), 10.0),
             Candidate("calls", rank_score(tied), 90.0)]
    assert survivors(cands, 1) == ["calls"]   # the elite, though it costs more tokens


def test_a_tie_in_calls_too_is_broken_by_the_training_groups_that_had_a_gradient():
    idle = {"selection_accuracy": 0.0, "selection_working_calls": 0.0, "train_live_groups": 0.0}
    learns = idle | {"train_live_groups": 0.5}
    assert rank_score(learns) > rank_score(idle) == rank_score({"selection_accuracy": 0.0})
    # never above a working call accepted in a million, nor above a resolution
    assert rank_score(idle | {"selection_working_calls": 1 / 999_999}) > rank_score(learns | {"train_live_groups": 1.0})
    assert rank_score({"selection_accuracy": 1 / 999_999}) > rank_score(learns | {"selection_working_calls": 1.0})
    # the elite, though it costs more tokens; and what a tournament for parents prefers
    cands = [Candidate("plan", rank_score(idle), 10.0), Candidate("credit", rank_score(learns), 90.0),
             Candidate("other", rank_score(idle), 20.0)]
    assert survivors(cands, 1) == ["credit"]
    assert set(parents(cands, 20, tournament_size=3, seed=1)) >= {"credit"}
    # an invalid version is never selected, however much its groups carried
    cands[1].valid = False
    assert "credit" not in survivors(cands, 2)


def test_the_final_pick_breaks_a_tie_at_nothing_resolved_by_the_working_calls(tmp_path):
    from evotrainer.loop.stages.final_pick import final_pick
    from evotrainer.loop.run_versions import RunVersions
    from evotrainer.records.version import BranchVersion, VersionDir

    versions = RunVersions(tmp_path / "versions")
    for vid, calls, cost in (("v1", 0.0, 10.0), ("v2", 0.6, 50.0), ("v3", 0.2, 5.0)):
        VersionDir(versions.root / vid).save_meta(BranchVersion(
            vid, "m", "h", status="kept",
            metrics={"selection_accuracy": 0.0, "selection_working_calls": calls, "cost": cost}))
    assert final_pick(versions, ["v1", "v2", "v3"], start={"selection_accuracy": 0.0}) == "v2"


def test_a_handed_in_patch_that_breaks_passing_tests_is_not_promoted_on_its_calls(tmp_path):
    parent = version(tmp_path, "parent", heldout(lambda i: [PROSE, PROSE]))
    held = heldout(lambda i: [ACCEPTED, EDIT, "submit"])
    for r in held[:2]:   # two of its patches replace a def line with "...": the module's tests fail
        r.hidden |= {"patch_applied": True, "pass_to_pass": {"t::a": {"passed": False}, "t::b": {"passed": True}}}
    for r in held[2:]:
        r.hidden |= {"patch_applied": True, "pass_to_pass": {"t::a": {"passed": True}}}
    d = gate(version(tmp_path, "vandal", held), parent, GateConfig(level=0.9))
    assert not d.promote and d.paired["ci_low"] > 0, d.reasons
    assert d.paired["broke_tests"] == {"child": 0.25, "parent": 0.0} and "break a test" in d.paired["reason"]


def test_a_claim_on_the_fitness_is_judged_on_resolution_not_on_the_tie_break(tmp_path):
    from evotrainer.fitness.hypothesis import judge_effect

    parent = version(tmp_path, "parent", heldout(lambda i: [PROSE, PROSE]))
    child = version(tmp_path, "child", heldout(lambda i: [ACCEPTED, ACCEPTED]))
    d = gate(child, parent, GateConfig(level=0.9))
    assert d.promote and d.paired["mean_delta"] == 1.0
    verdict = judge_effect({"metric": "heldout_accuracy", "op": "delta>", "value": 0.0}, {}, {}, d.paired)
    assert verdict["verdict"] == "refuted" and verdict["measured_delta"] == 0.0
