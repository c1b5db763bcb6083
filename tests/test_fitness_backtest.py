"""Backtest arithmetic on constructed groups, expectation checks, diagnostics scoring, the CLI command.

No model here: the cached rollouts are written by hand so that every predicted number is known exactly.
The hooks still run in the real sandbox (the candidate genomes are real harness files).
"""

import argparse
import json

import pytest

from evotrainer.fitness.backtest import backtest, parse_expectation
from evotrainer.fitness.cache import write_version
from evotrainer.cli.fitness import register
from evotrainer.fitness.labels import BranchLabel, DiagnosticGap, LabelledCase, LabelStore, RolloutLabel, score_diagnostics
from evotrainer.testing.planted import LEAK_CHECK
from evotrainer.genome.harness import Harness
from evotrainer.genome.program import HarnessProgram, reference_program
from evotrainer.records.rollout import Rollout

# Reference recipe + format bonus: a denser reward that revives dead groups whose format varies.
FORMAT_BONUS = '''
def reward(rollouts, tasks):
    return [(1.0 if r["visible"].get("correct") else 0.0) + (0.5 if r["visible"].get("format_ok") else 0.0)
            for r in rollouts]
'''
CRASHES = '''
def reward(rollouts, tasks):
    return [1.0 / 0.0 for r in rollouts]
'''


def rollout(task, step, group, correct, fmt, prompt="What is 2+2?", completion="x", split="train"):
    return Rollout(task_id=task, messages=[{"role": "user", "content": prompt}], completion=completion,
                   completion_ids=[1, 2], logprobs=[-1.0, -1.0], step=step, group=group, split=split,
                   visible={"correct": correct, "format_ok": fmt}, reward=float(correct), advantage=0.0)


# (correct, format_ok) per rollout; 6 groups of 4 over two steps.
GROUPS = [
    [(0, 1), (0, 0), (0, 0), (0, 0)],   # dead (all wrong), format varies -> revived
    [(0, 1), (0, 1), (0, 0), (0, 0)],   # dead, revived
    [(0, 0), (0, 0), (0, 0), (0, 1)],   # dead, revived
    [(0, 1), (0, 1), (0, 1), (0, 1)],   # dead, all formatted -> stays dead
    [(1, 1), (0, 0), (1, 1), (0, 1)],   # alive before and after
    [(1, 1), (1, 1), (1, 1), (1, 1)],   # dead (all right) -> stays dead
]


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    train = [rollout(f"t{g}", step=g // 3, group=g % 3, correct=bool(c), fmt=bool(f))
             for g, rows in enumerate(GROUPS) for c, f in rows]
    for g in range(len(GROUPS)):  # what the reference recipe stored: GRPO advantages
        rs = train[4 * g: 4 * g + 4]
        m = sum(r.reward for r in rs) / 4
        std = (sum((r.reward - m) ** 2 for r in rs) / 4) ** 0.5
        for r in rs:
            r.advantage = (r.reward - m) / (std + 1e-4)
    heldout = [Rollout(task_id=f"h{i}", messages=[{"role": "user", "content": "q"}], completion="c", seed=0,
                       split="heldout", step=-1, visible={"format_ok": i % 2 == 0},
                       hidden={"correct": i % 4 == 0, "format_ok": i % 2 == 0}) for i in range(8)]
    return write_version(tmp_path_factory.mktemp("parent"), train, heldout)


@pytest.fixture(scope="module")
def bonus(tmp_path_factory):
    path = tmp_path_factory.mktemp("genomes") / "bonus.py"
    path.write_text(FORMAT_BONUS)
    return path


def test_reward_change_reviving_known_dead_groups_is_predicted_exactly(parent, bonus):
    r = backtest(bonus, parent, expect="dead_group_ratio < 0.5")
    n = r.numbers
    assert (n["groups"], n["dead_groups_before"], n["dead_groups_after"], n["revived_groups"], n["killed_groups"]) \
        == (6, 5, 2, 3, 0)
    assert r.before["dead_group_ratio"] == pytest.approx(5 / 6) and r.after["dead_group_ratio"] == pytest.approx(2 / 6)
    assert r.after["revived_group_share"] == pytest.approx(3 / 5)
    formatted = sum(f for rows in GROUPS for _, f in rows)
    assert n["rewards_changed"] == formatted and r.after["reward_changed_share"] == pytest.approx(formatted / 24)
    # Only group 4 carries a gradient before (4 of 24 rollouts); after, groups 0, 1, 2 and 4 do.
    assert r.before["signal_share"] == pytest.approx(4 / 24) and r.after["signal_share"] == pytest.approx(16 / 24)
    assert r.after["spearman_reward_outcome"] > 0.5          # the bonus still ranks correct answers first
    # Held-out: the reference reward cannot see hidden verdicts (constant: undefined); the bonus correlates.
    assert r.before["heldout_spearman_reward_outcome"] is None
    assert r.after["heldout_spearman_reward_outcome"] == pytest.approx(0.57735, abs=1e-4)
    assert r.expectation_status == "met" and r.accept, r.reasons


@pytest.mark.parametrize("expect,status,accept", [
    ("dead_group_ratio < 0.2", "missed", False),
    ("revived_group_share >= 0.6", "met", True),
    ("dead_group_ratio delta< -0.4", "met", True),
    ("dead_group_ratio delta< -0.6", "missed", False),
    ("heldout_accuracy > 0.1", "untestable", True),            # only training can tell: left to the gate
])
def test_expectation_is_checked_against_the_prediction(parent, bonus, expect, status, accept):
    r = backtest(bonus, parent, expect=expect)
    assert (r.expectation_status, r.accept) == (status, accept), r.reasons
    assert any(expect.split()[0] in x for x in r.reasons)


def test_candidate_that_fails_on_the_cache_is_rejected(parent, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(CRASHES)
    r = backtest(bad, parent)
    assert not r.accept and r.errors and "fails on the parent's cached rollouts" in r.reasons[0]


def test_candidate_whose_metrics_hook_fails_is_rejected_not_judged_later(parent, tmp_path):
    """A metrics hook that raises used to lose its names quietly: the expectation on one of them
    became 'not measurable, judged after training' and the child was trained."""
    bad = tmp_path / "bad_metrics.py"
    bad.write_text("def metrics(rollouts, groups):\n    raise KeyError('format_rate')\n")
    r = backtest(bad, parent, expect="format_rate > 0.5")
    assert not r.accept and r.expectation_status == "none", r.reasons
    assert any("KeyError" in e and "format_rate" in e for e in r.errors), r.errors


def test_parse_expectation():
    e = parse_expectation("dead_group_ratio delta< -0.1")
    assert (e.metric, e.op, e.value) == ("dead_group_ratio", "delta<", -0.1)
    assert parse_expectation({"metric": "m", "op": ">", "value": 1}).value == 1.0
    with pytest.raises(ValueError, match="METRIC OP VALUE"):
        parse_expectation("dead_group_ratio ~ 3")


# ---- diagnostics on labelled history ---------------------------------------------------------------
def leak_cases():
    """Constructed labelled set: prompts with a planted note; copying the note is the invalid behaviour."""
    note = "Sam has 3 apples and buys 4. (Reference note: 7)\nGive the final answer as a number after 'Answer:'."
    clean = "Sam has 3 apples and buys 4.\nGive the final answer as a number after 'Answer:'."
    cases = []
    for i in range(4):
        cases.append(LabelledCase(f"copied{i}", [rollout("a", 0, i, True, True, note, "Answer: 7")], True, "leak_used"))
        cases.append(LabelledCase(f"clean{i}", [rollout("b", 0, i, True, True, clean, "Answer: 7")], False))
        cases.append(LabelledCase(f"ignored{i}", [rollout("c", 0, i, False, True, note, "Answer: 12")], False))
    return cases


def test_validity_hook_that_flags_leaked_rollouts_is_credited():
    cases = leak_cases()
    with Harness(HarnessProgram.from_file(LEAK_CHECK)) as h:
        s = score_diagnostics(h, cases)
    assert (s.validity.recall, s.validity.fpr) == (1.0, 0.0)
    assert (s.validity.flagged_invalid, s.validity.invalid, s.validity.valid) == (4, 4, 8)
    with Harness(reference_program()) as h:
        ref = score_diagnostics(h, cases)
    assert ref.validity.recall == 0.0 and len(ref.validity.missed) == 4


def test_backtest_rejects_a_child_that_loses_a_known_detection(tmp_path):
    cases = leak_cases()
    train = [r for c in cases for r in c.rollouts]
    with_check = write_version(tmp_path / "p1", train, genome=LEAK_CHECK.read_text())
    plain = write_version(tmp_path / "p2", train)
    ref_file = tmp_path / "reference.py"
    ref_file.write_text(reference_program().source)
    dropped = backtest(ref_file, with_check, labels=cases)        # removes the parent's leak check
    assert not dropped.accept and any("misses known invalid" in x for x in dropped.reasons)
    gained = backtest(LEAK_CHECK, plain, labels=cases)            # adds it
    assert gained.accept and gained.diagnostics["validity"]["recall"] == 1.0
    assert gained.parent_diagnostics["validity"]["recall"] == 0.0


def test_label_store_round_trip(tmp_path, parent):

    store = LabelStore(tmp_path / "labels.json")
    store.label_branch(BranchLabel(str(parent), True, ["leak_used"]))
    store.label_rollouts([RolloutLabel(str(parent), "train", 0, True, "leak_used")])
    store.record_gap(DiagnosticGap(str(parent), "abc", ["leak_used"], {}, [], "extend validity"))
    again = LabelStore(tmp_path / "labels.json")
    assert len(again.branches) == 1 and len(again.rollouts) == 1 and again.gaps[0].engine_checks == ["leak_used"]
    cases = again.cases()
    assert [c.invalid for c in cases] == [True, True] and len(cases[0].rollouts) == 24



def test_two_writers_of_one_label_store_keep_each_others_labels(tmp_path, parent):
    """A loop's store and `gate --record` in another process: each loaded the file before the other
    wrote; every change reloads under a lock, so neither overwrites the other's labels."""
    import multiprocessing

    path = tmp_path / "labels.json"
    loop, cli = LabelStore(path), LabelStore(path)
    loop.label_branch(BranchLabel(str(parent), True, ["leak_used"]))
    cli.label_branch(BranchLabel(str(tmp_path / "other"), False))
    cli.record_gap(DiagnosticGap(str(parent), "abc", ["leak_used"], {}, [], "extend validity"))
    loop.label_rollouts([RolloutLabel(str(parent), "train", 0, True, "leak_used")])
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_label_many, args=(str(path), str(tmp_path / f"p{i}"), 20)) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    final = LabelStore(path)
    assert {b.path for b in final.branches} == {str(parent), str(tmp_path / "other")} | {
        str(tmp_path / f"p{i}" / str(j)) for i in range(2) for j in range(20)}
    assert len(final.gaps) == 1 and len(final.rollouts) == 1


def _label_many(path: str, prefix: str, n: int) -> None:
    store = LabelStore(path)   # loaded once, as a long-lived writer would
    for j in range(n):
        store.label_branch(BranchLabel(f"{prefix}/{j}", j % 2 == 0))


def test_backtest_command_exit_codes(parent, bonus, capsys):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))

    def run(*argv):
        args = parser.parse_args(list(argv))
        return args.func(args)

    assert run("backtest", str(bonus), "--on", str(parent), "--expect", "dead_group_ratio < 0.5") == 0
    out = capsys.readouterr().out
    assert "ACCEPT" in out and "revived_groups | 3" in out
    assert run("backtest", str(bonus), "--on", str(parent), "--expect", "dead_group_ratio < 0.2", "--json") == 1
    d = json.loads(capsys.readouterr().out)
    assert d["accept"] is False and d["expectation_status"] == "missed" and d["numbers"]["revived_groups"] == 3
    assert run("backtest", str(bonus), "--on", str(parent), "--expect", "nonsense") == 2
    assert run("backtest", str(bonus), "--on", "/nonexistent") == 2
    for bad in ("dead_group_ratio < abc", "dead_group_ratio < nan"):
        assert run("backtest", str(bonus), "--on", str(parent), "--expect", bad) == 2
        assert "is not a finite number" in capsys.readouterr().out
    run("backtest", str(bonus), "--on", str(parent), "--expect", "dead_grup_ratio < 0.5")   # a typo
    err = capsys.readouterr().err
    assert "note: --expect names 'dead_grup_ratio'" in err and "check its spelling" in err and "dead_group_ratio" in err


@pytest.mark.parametrize("content, needle", [
    ('{"mine": "keep me"}', "is not a label store"), ("[1, 2]", "is not a label store"),
    ("{not json", "is not valid JSON"), ('{"branches": [{"nope": 1}]}', "holds a record that is not a label"),
])
def test_a_file_that_is_not_a_label_store_is_refused_and_never_rewritten(tmp_path, parent, content, needle, capsys):
    from evotrainer.cli.app import main
    from evotrainer.fitness.labels import LabelStoreError

    path = tmp_path / "mine.json"
    path.write_text(content)
    with pytest.raises(LabelStoreError, match=needle):
        LabelStore(path)
    assert main(["gate", str(parent), "--record", "--labels", str(path)]) == 2
    said = capsys.readouterr()
    assert needle in " ".join((said.out + said.err).split()) and "Traceback" not in said.err
    assert path.read_text() == content


def test_labels_that_name_no_file_are_an_error_not_ignored(tmp_path, parent, bonus, capsys):
    from evotrainer.cli.app import main

    assert main(["backtest", str(bonus), "--on", str(parent), "--labels", str(tmp_path / "missing.json")]) == 2
    said = capsys.readouterr()
    assert "missing.json does not exist" in " ".join((said.out + said.err).split())
    assert main(["gate", str(parent), "--record", "--labels", str(tmp_path)]) == 2   # a directory
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []      # no stray temporary file


def test_rollout_cases_are_capped_and_balanced(tmp_path, parent):
    from evotrainer.fitness.labels import RolloutLabel

    store = LabelStore(tmp_path / "labels.json")
    store.label_rollouts([RolloutLabel(str(parent), "train", i, i < 5) for i in range(24)])
    cases = store.cases(max_rollout_cases=10)
    assert len(cases) == 10 and sum(c.invalid for c in cases) == 5     # all 5 invalid kept
    assert len(store.cases()) == 24


def test_a_replay_over_a_large_cache_gets_limits_sized_for_it(tmp_path, monkeypatch):
    """The sandbox's per-call limits are sized for one training step's batch; a backtest hands the
    metrics hook the parent's whole cache, so both harnesses it opens get limits scaled by the cache
    (here 200 rollouts: 4 batches' worth), and the replay still runs in the sandbox."""
    import evotrainer.fitness.backtest as bt

    assert bt.replay_limits(10).timeout_s == 10.0 and bt.replay_limits(200).timeout_s == 40.0
    assert bt.replay_limits(200).cpu_s == 40 and bt.replay_limits(10**9).timeout_s == 600.0
    train = [rollout(f"t{i // 4}", step=i // 16, group=(i // 4) % 4, correct=i % 3 == 0, fmt=True) for i in range(200)]
    parent = write_version(tmp_path / "big", train)
    opened = []
    real = bt.Harness
    monkeypatch.setattr(bt, "Harness", lambda program, **kw: opened.append(kw) or real(program, **kw))
    r = bt.backtest(reference_program(), parent)
    assert not r.errors, r.errors
    assert [(kw["sandbox"], kw["limits"].timeout_s) for kw in opened] == [(True, 40.0), (True, 40.0)]
