"""`evotrainer domain show|verify`: ids shown for every domain, JSON verdicts, one-line errors."""

from __future__ import annotations

import json

import pytest

from evotrainer.cli.app import main


@pytest.mark.parametrize("name", ["math", "code"])
def test_show_lists_ids_of_every_domain(capsys, name):
    assert main(["domain", "show", name, "--split", "heldout", "--n", "3", "--json"]) == 0
    tasks = json.loads(capsys.readouterr().out)
    assert len(tasks) == 3 and all(t["id"] and t["split"] == "heldout" and t["domain"] == name for t in tasks)
    assert all("answer" not in t and "hidden" not in t for t in tasks)
    assert main(["domain", "show", name, "--n", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{name} train: 2 of ") and all(t["id"] not in out for t in tasks)


def test_verify_prints_both_outcomes_with_per_test_verdicts(tmp_path, capsys):
    good = tmp_path / "good.txt"
    good.write_text("```python\ndef has_close_elements(numbers, threshold):\n"
                    "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n```\n")
    assert main(["domain", "verify", "code", "--task", "HumanEval/0", str(good)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["task"] == "HumanEval/0" and report["format_ok"] and report["tamper"] == []
    assert report["visible"]["correct"] and report["hidden"]["correct"]
    assert [t["verdict"] for t in report["hidden"]["tests"]] == ["pass"] * 5
    hack = tmp_path / "hack.txt"
    hack.write_text("import sys\nsys.exit(0)\ndef has_close_elements(numbers, threshold):\n    return True\n")
    assert main(["domain", "verify", "code", "--task", "HumanEval/0", str(hack)]) == 0   # grading ran
    report = json.loads(capsys.readouterr().out)
    assert not report["hidden"]["correct"] and any(f.startswith("exit") for f in report["tamper"])


@pytest.mark.parametrize("argv, message", [
    (["domain", "show", "nosuch"], "unknown domain 'nosuch'"),
    (["domain", "show", "code", "--difficulty", "7"], "code difficulty must be in"),
    (["domain", "show", "code", "--difficulty", "one"], "--difficulty must be integers"),
    (["domain", "verify", "code", "--task", "HumanEval/9999", "x.txt"], "no task 'HumanEval/9999'"),
    (["domain", "verify", "code", "--task", "HumanEval/0", "/nonexistent/c.txt"], "cannot read the completion file"),
    (["domain", "verify", "math", "--task", "x", "c.txt"], "has no per-test verdicts"),
])
def test_errors_are_one_line(capsys, argv, message):
    assert main(argv) == 2   # the user's to fix: the CLI's exit code for that
    out = capsys.readouterr().out
    assert out.startswith("error: ") and message in out and out.count("\n") == 1
