"""SWE grading in a clean copy, in the sandbox: resolved only when every target test ran and passed."""

from __future__ import annotations

import json

import pytest

from evotrainer.cli.app import main
from evotrainer.config import DomainConfig
from evotrainer.domains import build_domain, get_domain
from evotrainer.domains.code.executor import ExecLimits
from evotrainer.domains.swe.domain import SWEDomain, extract_patch
from evotrainer.domains.swe.patching import diff_files


@pytest.fixture(scope="module")
def domain():
    d = SWEDomain(n_train=4, n_heldout=2, n_test=2, difficulty=[1, 2, 3], seed=0, workers=1, limits=ExecLimits(timeout_s=1.0))
    yield d
    d.close()


def _edit(task, path, old, new):
    files = task.visible["files"]
    assert old in files[path]
    return diff_files(files, {**files, path: files[path].replace(old, new, 1)})


def test_reference_fix_resolves_and_no_patch_does_not(domain):
    task = domain.tasks("train")[0]
    full = domain.verify_full(task, f"Here is my fix:\n```diff\n{task.answer}```\n")
    hid = full["hidden"]
    assert full["method"] == "fenced" and hid["resolved"] and hid["correct"] and hid["patch_applied"]
    assert all(r["passed"] and r["verdict"] == "pass" for r in hid["fail_to_pass"].values())
    assert hid["passed"] == hid["total"] == len(task.hidden["FAIL_TO_PASS"]) + len(task.hidden["PASS_TO_PASS"])
    assert full["visible"]["correct"] and full["visible"]["total"] == len(task.hidden["PASS_TO_PASS"])
    empty = domain.verify(task, "I could not find it.")
    assert not empty["resolved"] and not empty["format_ok"] and empty["fail_to_pass"]
    assert all(r["verdict"] == "not_run" for r in empty["fail_to_pass"].values())


def test_a_wrong_patch_fails_fail_to_pass_and_a_breaking_one_fails_pass_to_pass(domain):
    task = domain.tasks("train")[0]
    module = f"{task.visible['package']}/{task.hidden['bug']['module']}.py"
    harmless = _edit(task, module, '"""', '"""Edited. ')
    res = domain.verify(task, harmless)
    assert res["patch_applied"] and not res["resolved"]
    assert not any(r["passed"] for r in res["fail_to_pass"].values())
    assert all(r["passed"] for r in res["pass_to_pass"].values())
    other = next(p for p in task.visible["files"] if p.endswith(".py") and "tests" not in p
                 and p != module and not p.endswith("__init__.py"))
    breaking = task.answer + _edit(task, other, "def ", "def _gone_")
    res = domain.verify(task, breaking)
    assert all(r["passed"] for r in res["fail_to_pass"].values()) and not res["resolved"]
    assert any(not r["passed"] for r in res["pass_to_pass"].values())


def test_test_edits_never_count_and_tests_are_restored(domain):
    task = domain.tasks("train")[1]
    # "Fix" by deleting the visible tests and planting a start-up file: both are left out.
    files = task.visible["files"]
    cheat = diff_files(files, {**{p: t for p, t in files.items() if not p.startswith("tests/")},
                               "sitecustomize.py": "import builtins\n"})
    res = domain.verify(task, cheat)
    assert not res["resolved"] and "sitecustomize.py" in res["ignored_paths"]
    assert any(p.startswith("tests/") for p in res["ignored_paths"])
    assert len(res["fail_to_pass"]) == len(task.hidden["FAIL_TO_PASS"])


def test_an_always_equal_object_cannot_forge_the_hidden_grade(domain):
    task = domain.tasks("train")[0]
    func = task.hidden["bug"]["function"]
    module = f"{task.visible['package']}/{task.hidden['bug']['module']}.py"
    src = task.visible["files"][module]
    hack = src + (f"\n\nclass _Any:\n    def __eq__(self, other):\n        return True\n\n\n"
                  f"def {func}(*args, **kwargs):\n    return _Any()\n")
    res = domain.verify(task, diff_files(task.visible["files"], {**task.visible["files"], module: hack}))
    assert res["patch_applied"] and not res["resolved"]
    assert any(f.startswith(f"{module}: eq_override") for f in res["tamper"])
    assert domain.verify(task, task.answer)["tamper"] == []


def test_a_batch_is_graded_in_one_run_in_order(domain):
    tasks = domain.tasks("train") + domain.tasks("heldout")
    wrong = tasks[1].answer
    res = domain.verify_batch(tasks, [t.answer if i != 1 else "" for i, t in enumerate(tasks)])
    assert [r["resolved"] for r in res] == [i != 1 for i in range(len(tasks))]
    assert set(res[0]["fail_to_pass"]) == set(tasks[0].hidden["FAIL_TO_PASS"])
    assert not domain.verify(tasks[0], wrong)["resolved"]   # another task's fix does not apply or fix this one
    with pytest.raises(ValueError, match="2 tasks but 1 completions"):
        domain.verify_batch(tasks[:2], [""])


def test_a_patch_that_does_not_apply_is_a_verdict(domain):
    task = domain.tasks("heldout")[0]
    res = domain.verify(task, "--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n")
    assert not res["resolved"] and "not in the repository" in res["patch_error"]
    res = domain.verify(task, "--- a/../x\n+++ b/../x\n@@ -1 +1 @@\n-a\n+b\n")
    assert not res["resolved"] and "outside the repository" in res["patch_error"]


def test_a_hanging_patch_times_out_in_the_sandbox(domain):
    task = domain.tasks("train")[0]
    module = f"{task.visible['package']}/{task.hidden['bug']['module']}.py"
    res = domain.verify(task, task.answer + _edit(task, module, '"""\n', '"""\nimport time\ntime.sleep(60)\n'))
    verdicts = [r["verdict"] for r in [*res["fail_to_pass"].values(), *res["pass_to_pass"].values()]]
    assert not res["resolved"] and verdicts[0] == "timeout" and set(verdicts[1:]) <= {"timeout", "not_run"}


@pytest.mark.parametrize("code", ["import os\nos._exit(0)\n", "raise SystemExit(0)\n"])
def test_a_patch_that_ends_the_process_early_is_not_a_pass(domain, code):
    task = domain.tasks("train")[0]
    init = f"{task.visible['package']}/__init__.py"
    res = domain.verify(task, task.answer + _edit(task, init, '"""\n', '"""\n' + code))
    assert res["patch_applied"] and not res["resolved"]
    assert not any(r["passed"] for r in res["fail_to_pass"].values())


def test_extract_patch_methods():
    assert extract_patch("```diff\n--- a/x\n+++ b/x\n```")[1] == "fenced"
    assert extract_patch("so:\ndiff --git a/x b/x\n--- a/x\n")[0].startswith("diff --git")
    assert extract_patch("nothing") == ("", "none")


def test_registered_and_configured():
    cfg = DomainConfig(name="swe", difficulty=[1, 3], n_train=2, n_heldout=1, n_test=1, leak_share=0.5)
    d = build_domain(cfg)
    assert isinstance(d, SWEDomain) and [len(d.tasks(s)) for s in ("train", "heldout", "test")] == [2, 1, 1]
    with pytest.raises(ValueError, match="not a level of the swe domain"):
        DomainConfig(name="swe", difficulty=[4])
    with pytest.raises(ValueError, match="swe difficulty"):
        get_domain("swe", difficulty=5)


def test_swebench_instance_graded_with_its_test_patch(swebench_dir):
    root, rec = swebench_dir
    d = SWEDomain(files={"train": root / "train.jsonl"}, workers=1)
    try:
        (task,) = d.tasks("train")
        good = d.verify_full(task, rec["patch"])
        assert good["hidden"]["resolved"], good
        assert good["visible"]["correct"] and list(good["visible"]["tests"]) == ["tests/test_ops.py::test_zero"]
        bad = d.verify(task, rec["test_patch"])   # only test edits: left out, the bug remains
        assert not bad["resolved"] and bad["ignored_paths"] == ["tests/test_ops.py"]
        detail = bad["fail_to_pass"]["tests/test_ops.py::TestAdd::test_two"]["detail"]
        assert detail.startswith("FAILED tests/test_ops.py:") and "add(1, 1) == 2" in detail
        env = d.environment(task)   # the tools work over the clone's files at base_commit
        assert "calc/ops.py" in env.call("list_files", {}) and env.call("git_log", {}) == "no history"
        env.call("edit", {"path": "calc/ops.py", "search": "a - b", "replace": "a + b"})
        assert env.call("run_tests", {}) == "1 passed, 0 failed"
        env.call("submit", {})
        assert d.verify(task, env.submitted)["resolved"]
    finally:
        d.close()


def test_cli_show_and_verify(tmp_path, capsys):
    assert main(["domain", "show", "swe", "--split", "heldout", "--n", "2", "--json", "--difficulty", "1,2"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert len(shown) == 2 and all(s["split"] == "heldout" and s["issue"] and s["files"] for s in shown)
    assert all("answer" not in s and "hidden" not in s for s in shown)
    task = get_domain("swe", difficulty=[1, 2]).task_by_id(shown[0]["id"])
    patch = tmp_path / "fix.diff"
    patch.write_text(task.answer)
    assert main(["domain", "verify", "swe", "--difficulty", "1,2", "--task", task.id, str(patch)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["task"] == task.id and report["hidden"]["resolved"] and report["visible"]["correct"]
    assert set(report["hidden"]["fail_to_pass"]) == set(task.hidden["FAIL_TO_PASS"])
    assert main(["domain", "verify", "swe", "--task", "swe/none", str(patch)]) == 2
    assert capsys.readouterr().out.startswith("error: no task 'swe/none'")


def test_cli_builds_swe_from_a_config(tmp_path, capsys):
    cfg = tmp_path / "swe.yaml"
    cfg.write_text("domain:\n  name: swe\n  difficulty: [3]\n  n_train: 2\n  n_heldout: 1\n  n_test: 1\n"
                   "  leak_share: 1.0\n")
    assert main(["domain", "show", "swe", "--config", str(cfg), "--json", "--n", "0"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert len(shown) == 2 and all(s["difficulty"] == 3 and s["leaky"] for s in shown)
    assert main(["domain", "show", "swe", "--config", str(cfg), "--split", "test"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("swe test: 1 of 1 tasks") and "has an open issue" in out


def test_a_test_file_nested_past_the_parsers_limit_is_reported_not_raised():
    from evotrainer.domains.swe.runner import collect_tests

    errors: list[str] = []
    files = {"tests/test_deep.py": "X = " + "-" * 20000 + "1\n", "tests/test_ok.py": "def test_a():\n    pass\n"}
    assert collect_tests(files, errors) == ["tests/test_ok.py::test_a"]
    assert len(errors) == 1 and errors[0].startswith("tests/test_deep.py: cannot collect:")
