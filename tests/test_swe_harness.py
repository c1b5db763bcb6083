"""The reference SWE harness: contract-valid, the default for `domain.name: swe`, its behaviour and
efficiency metrics on constructed trajectories (both shapes a rollout may carry), its alert rules,
and the engine's rule for what reads the history. Hooks run in the real sandbox."""

from __future__ import annotations

import pytest

from evotrainer.config import parse_config
from evotrainer.domains.swe.history import history_calls, is_history_call
from evotrainer.genome.contract import check_contract
from evotrainer.genome.harness import Harness
from evotrainer.genome.program import HarnessProgram
from evotrainer.loop.seed import DOMAIN_HARNESSES, seed_program

ISSUE = "Repository `pkg` has an open issue.\n\n## mean is wrong\n\n`mean` in `pkg/stats.py` is wrong."


def call(name, ok=True, **args):
    return {"name": name, "args": args, "ok": ok}


def rollout(calls, resolved, group=0, completion="", turns=None, step=0):
    return {"task_id": f"t{group}", "messages": [{"role": "system", "content": "tools"},
                                                 {"role": "user", "content": ISSUE}],
            "completion": completion, "completion_ids": [], "logprobs": [], "truncated": False,
            "turns": turns if turns is not None else [{"role": "assistant", "content": "...", "tool": c["name"],
                                                       "ok": c["ok"]} for c in calls],
            "tool_calls": calls, "step": step, "group": group, "split": "train", "reward": None,
            "advantage": None, "visible": {"correct": resolved, "format_ok": True}}


# A localised, self-tested fix of the file the issue names.
GOOD = [call("search", pattern="def mean"), call("read_file", path="pkg/stats.py"),
        call("edit", path="pkg/stats.py", search="a", replace="b"), call("run_tests"), call("submit")]
# An edit of a test file only, a malformed call and a failing one, then a blind submit.
BLIND = [call(None, ok=False), call("edit", path="tests/test_stats.py", search="", replace="x"),
         call("read_file", ok=False, path="nope.py"), call("submit")]
# Reads the history, copies the fix into another file, submits untested.
COPY = [call("git_log"), call("edit", path="pkg/util.py", search="a", replace="b"), call("submit")]


@pytest.fixture(scope="module")
def harness():
    program = HarnessProgram.from_file(DOMAIN_HARNESSES["swe"])
    check_contract(program)
    with Harness(program) as h:
        yield h


def test_swe_configs_default_to_the_swe_harness():
    cfg = parse_config({"model": "tiny-random", "domain": {"name": "swe", "difficulty": 1}})
    assert seed_program(cfg).source.startswith('"""Reference SWE harness')
    assert not seed_program(parse_config({"model": "tiny-random"})).source.startswith('"""Reference SWE harness')


def test_behaviour_and_efficiency_metrics(harness):
    rs = [rollout(GOOD, True, 0, "diff A"), rollout(BLIND, False, 0, ""),
          rollout(COPY, True, 1, "diff A"), rollout(COPY, True, 1, "diff A")]
    assert harness.reward(rs, [{"id": "t"}] * 4) == [1.0, 0.0, 1.0, 1.0]
    m = harness.metrics(rs, [rs[:2], rs[2:]])
    assert m["correct_rate"] == 0.75 and m["turns_mean"] == (5 + 4 + 3 + 3) / 4
    assert m["tool_calls_mean"] == 15 / 4 and m["tool_calls_per_turn"] == 1.0
    assert m["tool_failure_rate"] == 2 / 15 and m["malformed_call_rate"] == 1 / 15
    assert m["self_test_rate"] == 0.25                       # only GOOD ran the tests before submitting
    assert m["edit_rate"] == 0.75 and m["files_edited_mean"] == 0.75      # a test-file edit is no fix
    assert m["issue_file_edit_rate"] == 0.25                 # only GOOD edited pkg/stats.py, which the issue names
    assert m["search_before_edit_rate"] == 1 / 3             # of the three episodes that edited source
    assert m["first_edit_turn_mean"] == (3 + 2 + 2) / 3
    assert m["submit_rate"] == 1.0 and m["submit_without_edit_rate"] == 0.25
    assert m["history_call_rate"] == 0.5 and m["history_calls_mean"] == 0.5
    assert m["solution_diversity"] == (1 / 2 + 1 / 2) / 2    # group 0: one non-empty diff of 2; group 1: one of 2


def test_calls_are_read_from_episode_turns_when_tool_calls_are_absent(harness):
    """The episode driver's own turn records: the call nested as ``tool_call`` with an ``error``."""
    turns = [{"index": i, "text": "...", "tool_call": {"name": n, "args": a, "error": e}, "result": "r"}
             for i, (n, a, e) in enumerate([("read_file", {"path": "pkg/stats.py"}, None),
                                            ("edit", {"path": "pkg/stats.py"}, "search text not found"),
                                            ("edit", {"path": "pkg/stats.py"}, None), ("submit", {}, None)])]
    r = rollout([], True, turns=turns)
    r["tool_calls"] = []
    m = harness.metrics([r], [[r]])
    assert m["turns_mean"] == 4 and m["tool_calls_mean"] == 4 and m["tool_failure_rate"] == 0.25
    assert m["first_edit_turn_mean"] == 3 and m["search_before_edit_rate"] == 1.0   # the failed edit is no edit
    single = {**rollout([], False), "turns": 1, "tool_calls": []}      # a single-turn record
    m = harness.metrics([single], [[single]])
    assert m["turns_mean"] == 1 and m["tool_calls_mean"] == 0 and "first_edit_turn_mean" not in m


def names(harness, metrics, history=()):
    return {a["name"]: a["severity"] for a in harness.alerts(metrics, list(history))}


def step(turns, calls, tests, solved, blind=0.0):
    return {"turns_mean": turns, "tool_calls_mean": calls, "self_test_rate": tests, "correct_rate": solved,
            "submit_without_edit_rate": blind, "tool_failure_rate": 0.05, "dead_group_ratio": 0.2}


def test_alert_rules(harness):
    healthy = [step(8, 8, 0.8, 0.3), step(8.5, 8, 0.8, 0.35), step(8, 8, 0.8, 0.4)]
    assert names(harness, step(8, 8, 0.8, 0.45), healthy) == {}
    echo = [step(6, 6, 0.8, 0.3), step(9, 9, 0.8, 0.3), step(13, 13, 0.8, 0.31)]
    assert names(harness, step(18, 18, 0.8, 0.3), echo) == {"echo_trap": "critical"}
    # turns rising with resolution rising too is learning to work, not an echo
    assert "echo_trap" not in names(harness, step(18, 18, 0.8, 0.6), echo)
    lazy = [step(10, 10, 0.9, 0.3), step(8, 8, 0.7, 0.3), step(6, 6, 0.5, 0.3)]
    assert names(harness, step(5, 5, 0.3, 0.3), lazy) == {"laziness": "warning"}
    assert "laziness" not in names(harness, step(5, 5, 0.3, 0.5), lazy)     # fewer calls, better resolution
    assert names(harness, step(1.2, 1.2, 0.0, 0.0, blind=0.9)) == {"giving_up": "critical"}
    assert names(harness, {**step(8, 8, 0.8, 0.3), "tool_failure_rate": 0.7}) == {"tool_failures": "critical"}


@pytest.mark.parametrize("c, reads", [
    ({"name": "git_log", "args": {}}, True),
    ({"tool": "git_log"}, True),
    ({"name": "bash", "args": {"cmd": "git  show HEAD~1"}}, True),
    ({"name": "bash", "args": {"cmd": "cd repo && git log -p | head"}}, True),
    ({"name": "bash", "args": {"cmd": "git diff HEAD~1 -- pkg/stats.py"}}, True),
    ({"name": "read_file", "args": {"path": ".git/ORIG_HEAD"}}, True),
    ({"name": "bash", "args": {"cmd": "cat repo/.git/logs/HEAD"}}, True),
    ({"name": "bash", "args": {"cmd": "git diff 3f2a9c1e -- pkg"}}, True),
    ({"name": "bash", "args": {"cmd": "git diff"}}, False),              # the working tree, not the history
    ({"name": "bash", "args": {"cmd": "git diff pkg/facade01.py"}}, False),
    ({"name": "read_file", "args": {"path": "pkg/gitlog.py"}}, False),
    ({"name": "search", "args": {"pattern": "digit"}}, False),
    ({"name": "view_diff", "args": {}}, False),
])
def test_engine_history_rule(c, reads):
    assert is_history_call(c) is reads
    assert history_calls({"tool_calls": [c, c]}) == (2 if reads else 0)


def test_history_is_counted_from_the_assistant_turns_only():
    turns = [{"role": "assistant", "tool": "git_log"}, {"role": "tool", "tool": "git_log", "content": "commit"}]
    assert history_calls({"turns": turns}) == 1 and history_calls({"turns": 3, "tool_calls": []}) == 0
