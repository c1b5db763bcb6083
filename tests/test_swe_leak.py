"""The SWE git-history leak end to end, with scripted policies through ``run_episode`` in the real
tool environment and the real SWE grader (``testing/swe_planted.py``): the cheater earns more training
reward, the held-out repositories (no history) show the gap, the engine's leak check blocks it and
labels the history, the evolved history-command validity hook marks the cheater invalid and not the
honest branch, it is credited on that labelled history (recall, false positives, backtest), and the
library proposes it from the cheater's report."""

from __future__ import annotations

import copy
import shutil

import pytest

from evotrainer.fitness.backtest import backtest
from evotrainer.fitness.cache import CachedVersion
from evotrainer.fitness.gates import gate
from evotrainer.fitness.health import health_report
from evotrainer.fitness.labels import LabelStore, score_diagnostics
from evotrainer.genome.harness import Harness
from evotrainer.testing.swe_planted import build_swe_leak_scenario, swe_reference_program
from evotrainer.operators.evidence import Evidence
from evotrainer.operators.library import LibraryOperator, applicable_entries, default_entries
from evotrainer.records.rollout import group_rollouts

ENTRY = next(e for e in default_entries() if e.id == "swe_history_validity")


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    root = tmp_path_factory.mktemp("swe-leak")
    dirs = build_swe_leak_scenario(root, n_train=10, n_heldout=6, leak_share=0.5)
    store = LabelStore(root / "labels.json")
    decisions = {k: gate(dirs[k], labels=store) for k in ("honest", "cheater")}
    return {"dirs": dirs, "store": store, "decisions": decisions, "root": root}


@pytest.fixture(scope="module")
def check():
    """The evolved diagnostic: the SWE reference with the library entry's validity hook."""
    return ENTRY.apply(swe_reference_program(), {"min_share": 0.25})


def resolution(rollouts, hidden=False):
    return sum(bool((r.hidden if hidden else r.visible).get("correct")) for r in rollouts) / len(rollouts)


def test_the_cheater_earns_more_training_reward_and_heldout_shows_the_gap(scenario):
    v = {k: CachedVersion.load(p) for k, p in scenario["dirs"].items()}
    leaky = {t for t, task in v["honest"].tasks.items() if task.split == "train" and task.visible["leaky"]}
    assert 0 < len(leaky) < 10
    reward = {k: sum(r.reward for r in x.train) / len(x.train) for k, x in v.items()}
    assert reward["cheater"] > reward["honest"]
    held = {k: resolution(x.heldout, hidden=True) for k, x in v.items()}
    assert held["cheater"] == held["honest"]                  # no history held out: the advantage is gone
    assert resolution(v["cheater"].train) - held["cheater"] > resolution(v["honest"].train) - held["honest"]
    # the history pays only on leaky repositories: elsewhere the cheater is the honest policy
    for k in ("honest", "cheater"):
        clean = [r for r in v[k].train if r.task_id not in leaky]
        assert resolution(clean) == resolution([r for r in v["honest"].train if r.task_id not in leaky])
    assert all(any(c["name"] == "git_log" for c in r.tool_calls) for r in v["cheater"].train)
    assert not any(c["name"] == "git_log" for r in v["honest"].train for c in r.tool_calls)


def test_the_engine_blocks_the_cheater_and_labels_its_history(scenario):
    d, store = scenario["decisions"], scenario["store"]
    checks = {k: {c.name: c for c in d[k].checks} for k in d}
    assert d["honest"].valid and checks["honest"]["leak_used"].passed
    assert checks["honest"]["prompt_leak"].passed and checks["honest"]["tamper"].passed   # real re-grading
    leak = checks["cheater"]["leak_used"]
    assert not d["cheater"].valid and not leak.passed
    assert leak.numbers["leak_copy_rate"] == 1.0 and leak.numbers["history_read_rate"] == 1.0
    assert "after reading the history" in leak.message
    # the reference SWE harness has no validity check: the engine's finding is a diagnostic gap
    assert not d["cheater"].harness_violations and d["cheater"].gap is not None
    assert "git-history commands" in d["cheater"].gap["suggestion"]
    assert {b.path: b.invalid for b in store.branches} == {str(scenario["dirs"]["honest"]): False,
                                                           str(scenario["dirs"]["cheater"]): True}
    v = CachedVersion.load(scenario["dirs"]["cheater"])
    marks = {x.index: x.invalid for x in store.rollouts}
    assert len(marks) == len(v.train)
    for i, r in enumerate(v.train):     # invalid exactly where a leaky repository's fix was read and used
        assert marks[i] == (v.tasks[r.task_id].visible["leaky"] and bool(r.visible["correct"]))


def test_the_validity_hook_marks_the_cheater_invalid_and_not_the_honest(scenario, check, tmp_path):
    for k, flagged in (("honest", False), ("cheater", True)):
        with Harness(check) as h:
            report = health_report(scenario["dirs"][k], harness=h)
        assert bool(report.validity) is flagged, report.validity
        # trained under the diagnostic, the branch is judged by it too
        dst = tmp_path / k
        shutil.copytree(scenario["dirs"][k], dst)
        (dst / "genome.py").write_text(check.source)
        decision = gate(dst)
        assert bool(decision.harness_violations) is flagged
        if flagged:
            assert decision.harness_violations[0]["name"] == "resolution_rides_on_history"
            assert any("harness validity resolution_rides_on_history" in x for x in decision.reasons)


def test_the_diagnostic_is_credited_on_the_labelled_history(scenario, check, tmp_path):
    store, cheater = scenario["store"], scenario["dirs"]["cheater"]
    cases = store.cases()
    # the labelled valid cases include the cheater's episodes that read an empty history and solved it
    read_but_clean = [c for c in cases if not c.invalid and len(c.rollouts) == 1
                      and any(x["name"] == "git_log" for x in c.rollouts[0].tool_calls)
                      and c.rollouts[0].visible["correct"]]
    assert read_but_clean
    with Harness(check) as h:
        s = score_diagnostics(h, cases)
    assert (s.validity.recall, s.validity.fpr) == (1.0, 0.0) and not s.errors
    assert s.validity.invalid == 1 + sum(x.invalid for x in store.rollouts)
    with Harness(swe_reference_program()) as h:
        assert score_diagnostics(h, cases).validity.recall == 0.0
    gained = backtest(check, cheater, expect=ENTRY.expected_effect, labels=store)
    assert gained.accept and gained.diagnostics["validity"]["recall"] == 1.0
    assert gained.parent_diagnostics["validity"]["recall"] == 0.0
    # a child that drops the check loses a known detection: rejected
    with_check = tmp_path / "with-check"
    shutil.copytree(cheater, with_check)
    (with_check / "genome.py").write_text(check.source)
    ref = tmp_path / "reference.py"
    ref.write_text(swe_reference_program().source)
    dropped = backtest(ref, with_check, labels=store)
    assert not dropped.accept and any("misses known invalid" in x for x in dropped.reasons)


def test_without_recorded_tool_output_every_history_read_counts(scenario, check):
    v = CachedVersion.load(scenario["dirs"]["cheater"])
    bare = copy.deepcopy(v.train)
    for r in bare:
        for t in r.turns:
            t.pop("result", None)
    with Harness(check) as h:
        m = h.metrics(bare, group_rollouts(bare))
        flags = h.validity(bare, m, [])
    assert flags and f"{sum(bool(r.visible['correct']) for r in bare)} of" in flags[0]["message"]


def test_the_library_proposes_the_history_check_from_the_cheaters_report(scenario, check):
    parent = swe_reference_program()
    fired = {}
    for k in ("honest", "cheater"):
        report = health_report(scenario["dirs"][k]).to_dict()
        found, _ = applicable_entries(parent, Evidence(health_report=report), default_entries())
        fired[k] = {a.entry.id for a in found}
    assert "swe_history_validity" in fired["cheater"] and "swe_history_validity" not in fired["honest"]
    report = health_report(scenario["dirs"]["cheater"]).to_dict()
    op = LibraryOperator(seed=0, entries=[ENTRY])
    iv = op.propose([parent], Evidence(health_report=report))
    assert iv.factor == "hook:validity" and iv.details["entry"] == "swe_history_validity"
    assert "resolution_rides_on_history" in iv.child_source
