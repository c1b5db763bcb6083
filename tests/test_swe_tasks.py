"""SWE tasks: the bug catalogue, generated repositories, splits, patches, and the SWE-bench loader."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from evotrainer.domains.swe.generator import catalogue, make_split, split_of
from evotrainer.domains.swe.loader import load_swebench, read_tree
from evotrainer.domains.swe.mutations import KINDS, mutations
from evotrainer.domains.swe.patching import PatchError, apply_patch, diff_files, parse_patch, protected
from evotrainer.domains.swe.templates import TEMPLATES


def test_catalogue_covers_every_kind_and_level_with_real_bugs():
    bugs = catalogue()
    assert {b.mutation.kind for b in bugs} == set(KINDS)
    assert {b.level for b in bugs} == {1, 2, 3}
    for b in bugs:
        assert b.failing, b.key
        if b.level == 1:
            assert b.mutation.kind in ("wrong_operator", "wrong_comparison", "off_by_one")
        if b.level == 3:   # one call away: the bug is in a helper, the issue is about its caller
            assert b.mutation.function.startswith("_") and not b.caller.startswith("_")


def test_mutation_is_a_one_line_span_edit():
    src = TEMPLATES["stats"]["source"]
    for m in mutations(src):
        new = m.apply(src)
        diff = [ln for ln in diff_files({"m.py": src}, {"m.py": new}).splitlines()
                if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
        assert len(diff) == 2 and m.before in src, m


def test_splits_are_disjoint_by_bug_and_seeded():
    splits = {s: make_split(s, 30, [1, 2, 3], seed=3) for s in ("train", "heldout", "test")}
    keys = {s: {t.id.split("/")[2] for t in ts} for s, ts in splits.items()}
    assert not keys["train"] & keys["heldout"] and not keys["train"] & keys["test"] and not keys["heldout"] & keys["test"]
    assert Counter(t.difficulty for t in splits["train"]) == {1: 10, 2: 10, 3: 10}
    again = make_split("train", 30, [1, 2, 3], seed=3)
    assert [t.id for t in again] == [t.id for t in splits["train"]]
    assert [t.visible["files"] for t in again] == [t.visible["files"] for t in splits["train"]]
    assert all(split_of(b) in ("train", "heldout", "test") for b in catalogue())


def test_task_repository_issue_and_tests():
    t1, t2, t3 = make_split("train", 3, [1, 2, 3], seed=0)
    path = f"{t1.visible['package']}/{t1.hidden['bug']['module']}.py"
    assert path in t1.prompt and t1.hidden["bug"]["function"] in t1.prompt        # level 1 names file and function
    assert t2.hidden["bug"]["function"] in t2.prompt and ".py" not in t2.prompt     # level 2: the function only
    assert t3.hidden["bug"]["function"] not in t3.prompt                          # level 3: behaviour only
    for t in (t1, t2, t3):
        f2p, p2p = t.hidden["FAIL_TO_PASS"], t.hidden["PASS_TO_PASS"]
        assert f2p and p2p and not set(f2p) & set(p2p)
        visible = "".join(t.visible["files"][p] for p in t.visible["files"] if p.startswith("tests/"))
        assert all(tid.split("::")[1] + "()" not in visible for tid in f2p)       # failing tests arrive hidden
        assert all(tid.split("::")[1] + "()" in visible for tid in p2p)
        fixed, _ = apply_patch(t.visible["files"], t.answer)
        assert sum(fixed[p] != t.visible["files"][p] for p in fixed) == 1


def test_leak_only_in_train_with_the_fix_in_history():
    train = make_split("train", 20, [1, 2], seed=1, leak_share=0.5)
    leaky = [t for t in train if t.visible["leaky"]]
    assert 3 <= len(leaky) <= 17
    assert all(t.visible["history"][-1]["diff"] == t.answer for t in leaky)
    assert all(len(t.visible["history"]) == 1 and not t.visible["history"][0]["diff"] for t in train if t not in leaky)
    held = make_split("heldout", 20, [1, 2], seed=1, leak_share=1.0)
    assert not any(t.visible["leaky"] or t.visible["history"][-1]["diff"] for t in held)


def test_patch_apply_offsets_creation_deletion_and_errors():
    files = {"a.py": "x = 1\ny = 2\nz = 3\n", "b.py": "keep\n"}
    new = {"a.py": "x = 1\ny = 20\nz = 3\n", "c.py": "fresh\n"}
    patch = diff_files(files, new)
    out, dropped = apply_patch(files, patch)
    assert out == new and dropped == []
    shifted, _ = apply_patch({"a.py": "# top\n# more\n" + files["a.py"], "b.py": "keep\n"}, patch)
    assert shifted["a.py"] == "# top\n# more\n" + new["a.py"]
    with pytest.raises(PatchError, match="does not apply to a.py"):
        apply_patch({"a.py": "other\n", "b.py": "keep\n"}, patch)
    with pytest.raises(PatchError, match="outside the repository"):
        parse_patch("--- a/../etc/passwd\n+++ b/../etc/passwd\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(PatchError, match="no file patch"):
        parse_patch("just prose")


def test_no_hunk_line_is_dropped_silently():
    files = {"m.py": "".join(f"{c} = {i}\n" for i, c in enumerate("abcdefghij", 1))}
    # Hunks separated by a blank line (editors and models write them so): both apply.
    two = ("--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n-a = 1\n+a = 100\n b = 2\n\n"
           "@@ -9,2 +9,2 @@\n i = 9\n-j = 10\n+j = 1000\n")
    out, _ = apply_patch(files, two)
    lines = out["m.py"].splitlines()
    assert lines[0] == "a = 100" and lines[-1] == "j = 1000"
    # A header that undercounts its hunk: the uncounted lines are an error naming the line, not dropped.
    short = "--- a/m.py\n+++ b/m.py\n@@ -1,1 +1,1 @@\n-a = 1\n+a = 100\n-b = 2\n+b = 200\n"
    with pytest.raises(PatchError, match=r"line 6: '-b = 2' follows the last hunk of m.py.*undercounts"):
        apply_patch(files, short)
    # Two files, the second's header right after the first's hunk: still two file patches.
    both = {**files, "n.py": "x = 1\n"}
    out, _ = apply_patch(both, two + "--- a/n.py\n+++ b/n.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n")
    assert out["n.py"] == "x = 2\n" and out["m.py"].splitlines()[0] == "a = 100"
    # What models and tools write after the last hunk is no hunk line: a blank line, prose, a
    # format-patch signature.
    for tail in ("\n", "\n\nThis fixes the bug.\n", "-- \n2.43.0\n"):
        out, _ = apply_patch(files, two + tail)
        assert out["m.py"].splitlines()[0] == "a = 100", repr(tail)
    joined = "\n".join(diff_files(files, {"m.py": files["m.py"].replace("c = 3", "c = 30")}).split("\n"))
    assert apply_patch(files, joined + "\n")[0]["m.py"].splitlines()[2] == "c = 30"


def test_protected_paths_are_left_out():
    assert all(protected(p) for p in ("tests/test_a.py", "pkg/test_x.py", "conftest.py", "x/sitecustomize.py",
                                      "usercustomize.py", "evil.pth", "setup.cfg", "pytest.ini", "a_test.py"))
    assert not any(protected(p) for p in ("pkg/stats.py", "README.md", "pkg/testing_util_helpers.py"))
    files = {"pkg/m.py": "a\n", "tests/test_m.py": "t\n"}
    patch = diff_files(files, {"pkg/m.py": "b\n", "tests/test_m.py": "hacked\n", "pkg/x.pth": "import os\n"})
    out, dropped = apply_patch(files, patch, drop_protected=True)
    assert out == {"pkg/m.py": "b\n", "tests/test_m.py": "t\n"} and sorted(dropped) == ["pkg/x.pth", "tests/test_m.py"]


def test_swebench_loader_reads_instances_over_local_git(swebench_dir):
    root, rec = swebench_dir
    (task,) = load_swebench(root / "train.jsonl", "train")
    assert task.id == "acme__calc-1" and task.answer == rec["patch"] and task.prompt == "add(1, 1) is 0"
    assert task.hidden["FAIL_TO_PASS"] == ["tests/test_ops.py::TestAdd::test_two"]
    assert "calc/ops.py" in read_tree(task.visible["repo_path"], task.visible["base_commit"])


@pytest.mark.parametrize("edit, message", [
    (lambda r: "{not json", "train.jsonl:2: not JSON"),
    (lambda r: json.dumps({k: v for k, v in r.items() if k != "patch"}), "train.jsonl:2: missing patch"),
    (lambda r: json.dumps(r | {"FAIL_TO_PASS": "[]"}), "train.jsonl:2: FAIL_TO_PASS is empty"),
    (lambda r: json.dumps(r | {"repo": "acme/other"}), "train.jsonl:2: repository 'acme/other' not found"),
    (lambda r: json.dumps(r | {"base_commit": "0" * 40}), "train.jsonl:2: "),
])
def test_swebench_loader_errors_name_file_and_line(swebench_dir, edit, message):
    root, rec = swebench_dir
    (root / "train.jsonl").write_text(json.dumps(rec) + "\n" + edit(rec) + "\n")
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")) as info:
        load_swebench(root / "train.jsonl", "train")
    assert "\n" not in str(info.value)


def test_level_zero_names_the_wrong_line_and_only_train_holds_it():
    """Level 0 is level 1's bugs with the wrong line named (a rung a curriculum may start on): train
    holds levels 0 and 1 without repeating a bug between them; held-out and test stay level 1."""
    from evotrainer.domains.swe.generator import task_bug

    train = make_split("train", 12, [0, 1], seed=3)
    assert [t.difficulty for t in train] == [0, 1] * 6
    assert len({task_bug(t) for t in train}) == 12
    for t in train:
        named = re.search(r"The wrong line is line (\d+) of `([^`]+)`: `(.+)`\.", t.prompt)
        assert (named is not None) == (t.difficulty == 0), t.prompt
        if named:   # the line as the repository shows it, and the one the fix changes
            line, path, text = int(named[1]), named[2], named[3]
            assert t.visible["files"][path].splitlines()[line - 1].strip() == text
            removed = [x[1:].strip() for x in t.answer.splitlines() if x.startswith("-") and not x.startswith("---")]
            assert removed == [text]
    for split in ("heldout", "test"):
        assert {t.difficulty for t in make_split(split, 6, [0, 1], seed=3)} == {1}
        with pytest.raises(ValueError, match="train-only"):
            make_split(split, 2, [0], seed=3)


def test_a_config_asking_for_level_zero_alone_is_refused_before_any_task_is_built():
    from evotrainer.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match="train-only rung"):
        parse_config({"domain": {"name": "swe", "difficulty": 0}})
    assert parse_config({"domain": {"name": "swe", "difficulty": [0, 1]}}).domain.difficulty == [0, 1]
