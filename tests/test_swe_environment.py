"""The SWE tool environment: every tool, malformed calls, limits, and the history leak channel."""

from __future__ import annotations

import json

import pytest

from evotrainer.domains.code.executor import ExecLimits
from evotrainer.domains.swe.domain import SWEDomain
from evotrainer.domains.swe.environment import EnvLimits, parse_call


def call(name, **args):
    return f"Let me look.\n```tool\n{json.dumps({'name': name, 'args': args})}\n```\n"


@pytest.fixture(scope="module")
def domain():
    d = SWEDomain(n_train=6, n_heldout=2, n_test=1, difficulty=[1], seed=0, leak_share=0.5, workers=1,
                  limits=ExecLimits(timeout_s=1.0))
    yield d
    d.close()


@pytest.fixture
def task(domain):
    return domain.tasks("train")[0]


def _module(task):
    return f"{task.visible['package']}/{task.hidden['bug']['module']}.py"


def test_list_read_and_search(domain, task):
    env = domain.environment(task)
    out, rec = env.step(call("list_files"))
    assert _module(task) in out.splitlines() and rec["name"] == "list_files" and rec["error"] is None
    assert env.step(call("list_files", path="tests"))[0].splitlines() == sorted(p for p in task.visible["files"]
                                                                               if p.startswith("tests/"))
    out, _ = env.step(call("read_file", path=_module(task), start=2, end=3))
    src = task.visible["files"][_module(task)].splitlines()
    assert out == f"   2 | {src[1]}\n   3 | {src[2]}"
    out, _ = env.step(call("search", pattern=r"^def " + task.hidden["bug"]["function"]))
    assert out.startswith(f"{_module(task)}:") and out.count("\n") == 0
    assert env.step(call("search", pattern="zzz_nowhere"))[0] == "no match for 'zzz_nowhere'"


def test_edit_view_diff_run_tests_and_submit(domain, task):
    env = domain.environment(task)
    path = _module(task)
    # the one changed line of the reference fix
    (line,) = [ln[1:] for ln in task.answer.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    (fixed,) = [ln[1:] for ln in task.answer.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    out, _ = env.step(call("edit", path=path, search=line, replace=fixed))
    assert out == f"edited {path}"
    assert env.step(call("view_diff"))[0] == env.diff() and f"+{fixed}" in env.diff()
    out, _ = env.step(call("run_tests"))
    assert out.startswith(f"{len(task.hidden['PASS_TO_PASS'])} passed, 0 failed")
    # a reproduction test of its own: created by an edit with an empty search, run by path
    env.step(call("edit", path="tests/test_repro.py", search="", replace="def test_no():\n    assert 1 == 2\n"))
    out, _ = env.step(call("run_tests", tests=["tests/test_repro.py"]))
    assert out.startswith("0 passed, 1 failed") and "tests/test_repro.py:2: assert 1 == 2" in out
    out, _ = env.step(call("submit"))
    assert env.done and env.submitted == env.diff() and out == "submitted"
    assert domain.verify(task, env.submitted)["resolved"]        # the repro test file is left out
    assert env.step(call("list_files"))[0] == "error: the episode is over (submitted)"


@pytest.mark.parametrize("text, message", [
    ("I think the bug is in stats.", "no tool call found"),
    ("```tool\n{not json}\n```", "not valid JSON"),
    ("```tool\n[1, 2]\n```", 'JSON object with a "name"'),
    ("```tool\n{\"name\": \"read_file\", \"args\": [1]}\n```", '"args" must be a JSON object'),
    (call("rm_rf"), "unknown tool 'rm_rf'"),
    (call("read_file"), "bad arguments for read_file"),
    (call("read_file", path="nope.py"), "no file 'nope.py'"),
    (call("read_file", path="../../etc/passwd"), "outside the repository"),
    (call("read_file", path=".git/config"), "outside the repository"),
    (call("list_files", path=3), "bad arguments for list_files"),
    (call("search", pattern="("), "bad pattern"),
    (call("edit", path="README.md", search="not there", replace="x"), "search text not found"),
    (call("edit", path="README.md", search="", replace="x"), "README.md exists"),
    (call("edit", path="README.md", search="e", replace="x"), "found"),
    (call("edit", path="README.md", search="# ", replace="# "), "changes nothing"),   # a no-op is no edit
    (call("run_tests", tests=["tests/none.py"]), "no tests match"),
    (call("run_tests", tests=7), "tests must be a list"),
])
def test_malformed_calls_get_an_error_back(domain, task, text, message):
    env = domain.environment(task)
    out, rec = env.step(text)
    assert out.startswith("error: ") and message in out and rec["error"]
    assert env.files == task.visible["files"] and not env.done


def test_a_hanging_test_run_is_cut_by_the_sandbox(domain, task):
    env = domain.environment(task)
    env.step(call("edit", path="tests/test_slow.py", search="",
                  replace="import time\n\n\ndef test_slow():\n    time.sleep(30)\n"))
    out, rec = env.step(call("run_tests", tests=["tests/test_slow.py"]))
    assert out.startswith("0 passed, 1 failed") and "timeout" in out and rec["seconds"] < 10


def test_a_test_file_that_does_not_parse_is_reported(domain, task):
    env = domain.environment(task)
    env.step(call("edit", path="tests/test_bad.py", search="", replace="def test_x(:\n"))
    out, _ = env.step(call("run_tests", tests=["tests/test_bad.py"]))
    assert out.startswith("error: tests/test_bad.py: cannot collect: SyntaxError")
    out, _ = env.step(call("run_tests"))
    assert ", 0 failed" in out and out.splitlines()[-1].startswith("tests/test_bad.py: cannot collect")


def test_results_are_cut_to_the_limit(domain, task):
    env = domain.environment(task, EnvLimits(max_result_chars=50))
    out, _ = env.step(call("read_file", path=_module(task)))
    assert out.endswith("[... cut at 50 characters]") and len(out) < 90


def test_leaky_repositories_show_the_fix_through_git_log(domain):
    train = domain.tasks("train")
    leaky = [t for t in train if t.visible["leaky"]]
    clean = [t for t in train if not t.visible["leaky"]] + domain.tasks("heldout")
    assert leaky and clean
    for t in leaky:
        env = domain.environment(t)
        out, _ = env.step(call("git_log"))
        assert t.answer in out and out.startswith("commit ") and env.history_calls == 1
    for t in clean:
        env = domain.environment(t)
        out, _ = env.step(call("git_log"))
        assert "Initial import" in out and "diff --git" not in out and env.history_calls == 1


def test_parse_call_takes_the_first_block():
    text = call("view_diff") + call("submit")
    assert parse_call(text) == ("view_diff", {})
