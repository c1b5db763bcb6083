"""Skills: created from confirmed interventions, confirmed, validated, matched, promoted to general,
persisted, merged into the user library."""

from __future__ import annotations

import json

import pytest

from evotrainer.loop.knowledge.skills import (
    SkillLibrary,
    SkillLibraryError,
    derive_trigger,
    normalise_diff,
    skill_id,
    user_library_path,
)
from evotrainer.operators.triggers import report_metrics

DIFF = """--- a/parent.py
+++ b/child.py
@@ -10,3 +10,3 @@ def keep_groups(groups):
     # keep everything
-    return [True for g in groups]
+    return [max(g.rewards) > min(g.rewards) for g in groups]
"""
# The same edit made on another parent: other context, other line numbers, other spacing.
SAME_EDIT = """--- a/p.py
+++ b/c.py
@@ -40,2 +40,2 @@
-    return [True   for g in groups]
+    return [max(g.rewards) >  min(g.rewards) for g in groups]
"""
INTERVENTION = {"factor": "hook:keep_groups", "diff": DIFF, "hypothesis": "dead groups carry no signal",
                "expected_effect": {"metric": "dead_group_ratio", "op": "<", "value": 0.3}}


def decision(child, parent="v000", delta=0.05):
    return {"child": child, "parent": parent, "promote": True, "valid": True,
            "paired": {"mean_delta": delta, "ci_low": delta - 0.03, "ci_high": delta + 0.03}}


def test_create_confirm_validate_and_match(tmp_path):
    lib = SkillLibrary(tmp_path / "skills.json", validate_after=2)
    s = lib.record_confirmed(INTERVENTION, decision("v002"), "math", {"dead_group_ratio": 0.8})
    assert s.trigger == [{"metric": "dead_group_ratio", "op": ">=", "value": 0.3}]
    assert s.evidence[0]["version"] == "v002" and s.evidence[0]["effect"] == 0.05
    assert s.evidence[0]["ci"] == pytest.approx([0.02, 0.08])
    assert (s.confirmations, s.validated, s.scope, s.domains) == (1, False, "domain", ["math"])
    # a resumed loop repeating the call does not count twice
    again = lib.record_confirmed(INTERVENTION, decision("v002"), "math", {"dead_group_ratio": 0.8})
    assert again.confirmations == 1
    # the same edit on another branch confirms the same skill, and validates it
    other = {**INTERVENTION, "diff": SAME_EDIT}
    s = lib.record_confirmed(other, decision("v007", "v003", 0.09), "math", {"dead_group_ratio": 0.5})
    assert s.id == skill_id("hook:keep_groups", DIFF) and len(lib) == 1
    assert (s.confirmations, s.validated) == (2, True)
    assert s.mean_effect == pytest.approx(0.07)
    assert [x.id for x in lib.matching({"dead_group_ratio": 0.6}, "math")] == [s.id]
    assert lib.matching({"dead_group_ratio": 0.1}, "math") == []        # trigger does not fire
    assert lib.matching({"pass_rate": 0.6}, "math") == []                # metric absent: does not fire
    prompt = s.prompt_dict()
    assert prompt["trigger"] == "dead_group_ratio >= 0.3" and prompt["expected_outcome"] == "dead_group_ratio < 0.3"
    assert "validated" in prompt["evidence"] and "hook:keep_groups" in prompt["intervention"]


def test_domain_scope_and_promotion_to_general(tmp_path):
    lib = SkillLibrary(tmp_path / "skills.json")
    lib.record_confirmed(INTERVENTION, decision("v002"), "math", {"dead_group_ratio": 0.8})
    assert lib.matching({"dead_group_ratio": 0.8}, "code") == []         # held only in math so far
    s = lib.record_confirmed(INTERVENTION, decision("c004"), "code", {"dead_group_ratio": 0.7})
    assert s.scope == "general" and sorted(s.domains) == ["code", "math"]
    assert [x.id for x in lib.matching({"dead_group_ratio": 0.8}, "swe")] == [s.id]


def test_validated_skills_come_first(tmp_path):
    lib = SkillLibrary(tmp_path / "skills.json", validate_after=2)
    knob = {"factor": "knob:learning_rate", "diff": "-    'default': 1e-5,\n+    'default': 3e-5,\n",
            "expected_effect": {"metric": "heldout_accuracy", "op": "delta>", "value": 0.0}}
    weak = lib.record_confirmed(knob, decision("v010"), "math", {"heldout_accuracy": 0.2, "dead_group_ratio": 0.8})
    assert weak.trigger == [{"metric": "heldout_accuracy", "op": "<=", "value": 0.2}]   # delta: the value then
    strong = lib.record_confirmed(INTERVENTION, decision("v002"), "math", {"dead_group_ratio": 0.8})
    lib.record_confirmed(INTERVENTION, decision("v003"), "math", {"dead_group_ratio": 0.8})
    assert [s.id for s in lib.matching({"heldout_accuracy": 0.1, "dead_group_ratio": 0.9}, "math")] == [strong.id, weak.id]
    # a later confirmation from a milder state widens the trigger
    lib.record_confirmed(knob, decision("v011"), "math", {"heldout_accuracy": 0.4})
    assert lib.get(weak.id).trigger[0]["value"] == 0.4


def test_trigger_derivation():
    exp = {"metric": "dead_group_ratio", "op": "<", "value": 0.3}
    assert derive_trigger(exp, {"dead_group_ratio": 0.2}) == [{"metric": "dead_group_ratio", "op": ">=", "value": 0.2}]
    assert derive_trigger({**exp, "op": "delta<", "value": -0.1}, {"dead_group_ratio": 0.6}) == [
        {"metric": "dead_group_ratio", "op": ">=", "value": 0.6}]
    report = {"metrics": {"truncation_rate": 0.7, "x": None},
              "alerts": [{"name": "overlong", "severity": "warning", "message": "m"}]}
    flat = report_metrics(report)
    assert flat == {"truncation_rate": 0.7, "alert:overlong": 1.0}
    assert derive_trigger(None, flat) == [{"metric": "alert:overlong", "op": "==", "value": 1.0}]
    assert derive_trigger({"metric": "absent", "op": ">", "value": 1}, {}) == []
    assert normalise_diff(DIFF) == normalise_diff(SAME_EDIT)


def test_persistence_round_trip_and_refusals(tmp_path):
    path = tmp_path / "skills.json"
    lib = SkillLibrary(path)
    s = lib.record_confirmed(INTERVENTION, decision("v002"), "math", {"dead_group_ratio": 0.8})
    data = json.loads(path.read_text())
    assert data["skills"][0]["id"] == s.id and data["skills"][0]["confirmations"] == 1
    back = SkillLibrary(path).get(s.id)
    assert back.to_dict() == s.to_dict()
    with pytest.raises(ValueError, match="confirmed"):
        lib.record_confirmed(INTERVENTION, {**decision("v005"), "promote": False}, "math", {})
    with pytest.raises(ValueError, match="diff or template"):
        lib.record_confirmed({"factor": "hook:reward"}, decision("v006"), "math", {})
    template = lib.record_confirmed({"factor": "knob:temperature", "template": "set temperature to {value}"},
                                    decision("v008"), "math", {})
    assert template.intervention == {"factor": "knob:temperature", "template": "set temperature to {value}"}
    assert template.trigger == [] and lib.matching({"anything": 1.0}) == []     # listed, never retrieved
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        SkillLibrary(path)


def test_merge_into_user_library(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    assert user_library_path() == tmp_path / "home" / "skills.json"
    run_a = SkillLibrary(tmp_path / "a" / "skills.json")
    run_b = SkillLibrary(tmp_path / "b" / "skills.json")
    run_a.record_confirmed(INTERVENTION, decision("v002"), "math", {"dead_group_ratio": 0.8})
    # another experiment: the same version id names another branch, so it is one more confirmation
    run_b.record_confirmed(INTERVENTION, decision("v002"), "code", {"dead_group_ratio": 0.6})
    user = SkillLibrary.user()
    assert run_a.merge_into(user) == 1 and run_a.merge_into(user) == 0    # merging twice adds nothing
    assert run_b.merge_into(user) == 1
    merged = SkillLibrary.user().get(skill_id("hook:keep_groups", DIFF))
    assert (merged.confirmations, merged.validated, merged.scope) == (2, True, "general")
    assert {e["run"] for e in merged.evidence} == {str(tmp_path / "a"), str(tmp_path / "b")}
    assert run_a.get(merged.id).confirmations == 1                       # the run's own library is unchanged


def test_skills_command(tmp_path, monkeypatch):
    import argparse

    from rich.console import Console

    from evotrainer.cli import run_views as run_commands

    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    SkillLibrary(tmp_path / "run" / "skills.json").record_confirmed(
        INTERVENTION, decision("v002"), "math", {"dead_group_ratio": 0.8})
    parser = argparse.ArgumentParser()
    run_commands.register(parser.add_subparsers(dest="command"))
    monkeypatch.setattr(run_commands, "console", Console(width=200, record=True, highlight=False))
    args = parser.parse_args(["skills", "--run", str(tmp_path / "run"), "--user"])
    assert args.func(args) == 0
    out = run_commands.console.export_text()
    assert "skill-" in out and "dead_group_ratio >= 0.3" in out and "candidate" in out
    assert "user library (0 skills)" in out


@pytest.mark.parametrize("content, needle", [
    ('[{"id": "x"}]', "expected"),
    ('{"skills": "abc"}', "not a list"),
    ('{"format": 2, "my_notes": "keep me", "skillz": []}', "unknown fields"),
    ('{"format": 1, "skills": [{"factor": "knob:temperature"}]}', "skill 0 is not a skill record"),
    ('{"format": 1, "skills": [{"id": "s1"}]}', "skill 0 is not a skill record"),
    ("\udcff".encode("utf-8", "surrogateescape").decode("latin-1"), "not valid JSON"),
])
def test_a_file_that_is_not_a_skill_library_is_refused_and_never_rewritten(tmp_path, monkeypatch, capsys,
                                                                           content, needle):
    from evotrainer.cli.app import main

    monkeypatch.setenv("EVOTRAINER_HOME", str(tmp_path / "home"))
    path = user_library_path()
    path.parent.mkdir(parents=True)
    path.write_text(content, encoding="latin-1")
    before = path.read_bytes()
    with pytest.raises(SkillLibraryError, match=needle):
        SkillLibrary.user()
    run = SkillLibrary(tmp_path / "run" / "skills.json")
    run.record_confirmed(INTERVENTION, decision("v002"), "math", {"dead_group_ratio": 0.8})
    with pytest.raises(SkillLibraryError):
        run.merge_into(SkillLibrary.user())
    assert main(["skills"]) == 2
    said = capsys.readouterr()
    err = " ".join((said.out + said.err).split())
    assert "skill library" in err and "nothing was changed" in err and "Traceback" not in err
    assert path.read_bytes() == before


def test_a_confirmed_library_change_is_tried_sooner_where_its_skill_fires(tmp_path):
    """Skills shape later search: a skill keeps the library entry it came from, and on a report its
    trigger fires on, the library offers that entry even where the entry's own trigger does not fire and
    draws it 1 + its confirmations times as often (llm_choice lists it earlier); a never-confirmed skill
    and the random-library baseline change nothing."""
    from evotrainer.genome import reference_program
    from evotrainer.operators import Evidence
    from evotrainer.operators.library import LibraryOperator, RandomLibraryOperator
    from evotrainer.operators.llm_choice import LLMChoiceOperator

    parent = reference_program()
    child = {**INTERVENTION, "details": {"entry": "pass_rate_curriculum", "params": {}}}
    lib = SkillLibrary(tmp_path / "skills.json", validate_after=2)
    for v in ("v002", "v005", "v009"):
        skill = lib.record_confirmed({**child, "diff": DIFF.replace("groups", f"groups_{v}")}, decision(v), "math",
                                     {"dead_group_ratio": 0.8})
    assert skill.intervention["entry"] == "pass_rate_curriculum"
    skills = [s.prompt_dict() for s in lib.matching({"dead_group_ratio": 0.8}, "math")]
    assert len(skills) == 3 and all(s["entry"] == "pass_rate_curriculum" and s["confirmations"] == 1 for s in skills)
    assert SkillLibrary(tmp_path / "skills.json").matching({"dead_group_ratio": 0.8})[0].intervention["entry"] \
        == "pass_rate_curriculum"   # persisted
    report = {"metrics": {"dead_group_ratio": 0.8, "truncation_rate": 0.6, "reward_std": 0.05, "train_reward_std": 0.05}}
    plain, steered = Evidence(health_report=report), Evidence(health_report=report, skills=skills)

    op = LibraryOperator(seed=0)
    assert op.draw_weights(steered)["pass_rate_curriculum"] == 4 * op.draw_weights(plain)["pass_rate_curriculum"]
    unconfirmed = [{**skills[0], "confirmations": 0}]
    assert op.draw_weights(Evidence(health_report=report, skills=unconfirmed)) == op.draw_weights(plain)
    assert RandomLibraryOperator(seed=0).draw_weights(steered) == RandomLibraryOperator(seed=0).draw_weights(plain)

    def share(make, evidence, n=60):
        picks = [make(seed).propose([parent], evidence).details["entry"] for seed in range(n)]
        return picks.count("pass_rate_curriculum") / n

    fired = len(op.applicable(parent, plain)[0])
    assert fired >= 4 and "pass_rate_curriculum" in {a.entry.id for a in op.applicable(parent, plain)[0]}
    assert share(lambda s: LibraryOperator(seed=s), plain) < 0.35 < share(lambda s: LibraryOperator(seed=s), steered)
    # A confirmed skill stands in for its entry's trigger: easy_first_curriculum does not fire on this
    # report (it wants train_correct_rate < 0.1), yet with its skill it is offered.
    easy = [{**skills[0], "entry": "easy_first_curriculum"}]
    assert "easy_first_curriculum" not in {a.entry.id for a in op.applicable(parent, plain)[0]}
    assert "easy_first_curriculum" in {a.entry.id for a in op.applicable(parent, Evidence(health_report=report,
                                                                                          skills=easy))[0]}
    assert "easy_first_curriculum" not in {a.entry.id for a in op.applicable(
        parent, Evidence(health_report=report, skills=[{**easy[0], "confirmations": 0}]))[0]}
    first = [LLMChoiceOperator(seed=s).options(parent, steered)[0][0].entry.id for s in range(60)]
    first_plain = [LLMChoiceOperator(seed=s).options(parent, plain)[0][0].entry.id for s in range(60)]
    assert first.count("pass_rate_curriculum") > first_plain.count("pass_rate_curriculum") + 10
