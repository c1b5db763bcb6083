"""The code domain: tasks (generated, HumanEval, user files), completion parsing, verdicts, config."""

from __future__ import annotations

import dataclasses
import json

import pytest

from evotrainer.config import ConfigError, parse_config
from evotrainer.domains import build_domain, get_domain
from evotrainer.domains.code.domain import CodeDomain
from evotrainer.domains.code.generated import make_splits
from evotrainer.domains.code.humaneval import humaneval_splits
from evotrainer.domains.code.loaders import TaskFormatError, load_code_tasks
from evotrainer.domains.code.parsing import extract_program
from evotrainer.domains.task import SPLITS, text_key


@pytest.fixture(scope="module")
def mixed():
    d = get_domain("code", n_train=8, n_heldout=4, n_test=4, difficulty=[1, 2, 3, 4], seed=1, workers=2)
    yield d
    d.close()


def test_generated_splits_are_disjoint_deterministic_and_solvable(mixed):
    a = make_splits(30, 10, 10, [1, 2, 3], seed=5)
    b = make_splits(30, 10, 10, [1, 2, 3], seed=5)
    assert [t.prompt for s in SPLITS for t in a[s]] == [t.prompt for s in SPLITS for t in b[s]]
    keys = [text_key(t.visible["header"]) for s in SPLITS for t in a[s]]
    assert len(keys) == len(set(keys)) == 50
    for t in a["train"][:6]:
        assert t.visible["tests"] and t.hidden["tests"] and not set(t.visible["tests"]) & set(t.hidden["tests"])
        shown = t.prompt.split("It must pass these tests:")[1]
        assert all(h.replace("candidate", t.visible["entry"]) not in shown for h in t.hidden["tests"])
    full = [mixed.verify_full(t, f"```python\n{t.answer}```") for t in a["heldout"][:6]]
    assert all(f["visible"]["correct"] and f["hidden"]["correct"] for f in full)
    with pytest.raises(ValueError, match="difficulty 3 has only"):
        make_splits(200, 0, 0, [3], seed=0)


LEVEL_SIZES = {1: 247, 2: 200, 3: 47}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_generated_task_has_one_answer_for_every_test(seed):
    """A task whose tests all expect the same value (count_above_35 on lists of small numbers) is
    solved by `return 0`: the visible tests of every task, and its hidden tests, each expect two
    different values or more."""
    for level, size in LEVEL_SIZES.items():
        tasks = [t for s in SPLITS for t in make_splits(size - 20, 10, 10, [level], seed=seed)[s]]
        assert len(tasks) == size
        for t in tasks:
            tests = t.visible["tests"] + t.hidden["tests"]
            assert len(tests) == 7, t.id
            for group in (t.visible["tests"], t.hidden["tests"]):
                values = [eval(c.split(" == ", 1)[1]) for c in group]
                assert any(v != values[0] for v in values), (t.id, group)


def test_a_constant_answer_solves_no_generated_task(mixed):
    tasks = [t for lv in (1, 2) for t in make_splits(LEVEL_SIZES[lv], 0, 0, [lv], seed=0)["train"]]
    held = [dataclasses.replace(t, split="heldout") for t in tasks]   # held-out: the hidden tests run
    consts = ("0", "[]", "False")
    completions = [f"```python\n{t.visible['header']}    return {c}\n```" for t in held for c in consts]
    verdicts = mixed.verify_batch([t for t in held for _ in consts], completions)
    solved = [(t.id, c) for (t, c), v in zip(((t, c) for t in held for c in consts), verdicts) if v["correct"]]
    assert solved == [], solved[:5]


def test_humaneval_keeps_ids_and_splits_asserts(mixed):
    splits = humaneval_splits({"train": None, "heldout": None, "test": None}, seed=0)
    ids = [t.id for s in SPLITS for t in splits[s]]
    assert len(ids) == len(set(ids)) == 160 and all(i.startswith("HumanEval/") for i in ids)
    assert "HumanEval/32" not in ids   # one test statement: cannot be both visible and hidden
    t = next(t for s in SPLITS for t in splits[s] if t.id == "HumanEval/0")
    assert "def has_close_elements" in t.prompt and "assert has_close_elements(" in t.prompt
    assert len(t.visible["tests"]) == 2 and len(t.hidden["tests"]) == 5
    # The canonical solutions pass their hidden tests; an empty body fails them (a real checker).
    sample = [t for s in SPLITS for t in splits[s]][:12]
    good = mixed.verify_batch(sample, [t.answer.removeprefix(t.visible["header"]) for t in sample])
    assert all(v["correct"] for v in good), [(t.id, v["verdicts"]) for t, v in zip(sample, good) if not v["correct"]]
    bad = mixed.verify_batch(sample, ["    pass\n"] * len(sample))
    assert not any(v["correct"] for v in bad)
    with pytest.raises(ValueError, match="HumanEval has 160 usable problems"):
        humaneval_splits({"train": 150, "heldout": 10, "test": 10}, seed=0)


def test_mixed_levels_take_their_share(mixed):
    levels = [t.difficulty for t in mixed.tasks("train")]
    assert levels.count(4) == 2 and {1, 2, 3} <= set(levels)


def test_completion_parsing():
    vis = {"kind": "function", "entry": "f", "header": "def f(x):\n    \"\"\"Doc.\"\"\"\n", "context": "import math"}
    src, how = extract_program("Sure!\n```python\ndef f(x):\n    return math.floor(x)\n```\nDone.", vis)
    assert how == "fenced" and src.startswith("import math") and "return math.floor(x)" in src
    src, how = extract_program("def f(x):\n    return x\n\nThis returns x unchanged.", vis)
    assert how == "def" and compile(src, "s", "exec")
    src, how = extract_program("return x + 1", vis)
    assert how == "body" and src.endswith("    return x + 1\n")
    assert extract_program(None, vis) == ("", "none")
    assert extract_program("```python\nprint(input())\n```", {"kind": "stdio"}) == ("print(input())\n", "fenced")


def test_verify_survives_any_completion(mixed):
    t = mixed.tasks("train")[0]
    for junk in ["", None, 42, "```python\n", "\x00\x01" * 50, "def " * 2000, "```python\nimport os\nos._exit(3)\n```"]:
        v = mixed.verify(t, junk)
        assert v["correct"] is False and len(v["verdicts"]) == len(t.visible["tests"])
    # Past the parser's own limits (RecursionError, MemoryError in ast.parse): a program that does not
    # parse, graded as failing, never an exception in the engine's verification.
    entry = t.visible.get("entry", "f")
    for deep in ["1" + "+1" * 20000, "-" * 20000 + "1", f"def {entry}(x):\n    return " + "-" * 20000 + "x\n"]:
        v = mixed.verify(t, f"```python\n{deep}\n```")
        assert v["correct"] is False and len(v["verdicts"]) == len(t.visible["tests"])
        full = mixed.verify_full(t, deep)
        assert full["hidden"]["correct"] is False


def test_train_verdicts_hold_visible_tests_only(mixed):
    train, held = mixed.tasks("train")[0], mixed.tasks("heldout")[0]
    vt, vh = mixed.verify_batch([train, held], [f"```python\n{train.answer}```", f"```python\n{held.answer}```"])
    assert vt["correct"] and vt["total"] == len(train.visible["tests"]) and "visible_correct" not in vt
    assert vh["correct"] and vh["total"] == len(held.hidden["tests"]) and vh["visible_correct"]


def _write(tmp_path, name, records):
    p = tmp_path / name
    p.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return p


def test_apps_and_livecodebench_files(tmp_path, mixed):
    apps = _write(tmp_path, "apps.jsonl", [
        {"problem_id": "a1", "question": "Print the sum of two integers.", "difficulty": "introductory",
         "input_output": json.dumps({"inputs": ["1 2\n", "3 4\n", "10 -1\n"], "outputs": ["3\n", "7\n", "9\n"]})},
        {"problem_id": "a2", "question": "Return twice x.", "starter_code": "def twice(x):",
         "input_output": {"fn_name": "twice", "inputs": [[1], [5], [-2]], "outputs": [[2], [10], [-4]]}}])
    lcb = _write(tmp_path, "lcb.jsonl", [
        {"question_id": "l1", "question_content": "Print n squared.", "difficulty": "easy",
         "public_test_cases": json.dumps([{"input": "3\n", "output": "9\n", "testtype": "stdin"}]),
         "private_test_cases": json.dumps([{"input": "4\n", "output": "16\n", "testtype": "stdin"},
                                           {"input": "0\n", "output": "0\n", "testtype": "stdin"}])},
        {"question_id": "l2", "question_content": "Add a and b.", "starter_code": "class Solution:\n    def add(self, a, b):",
         "metadata": json.dumps({"func_name": "add"}),
         "public_test_cases": [{"input": "1\n2", "output": "3", "testtype": "functional"}],
         "private_test_cases": [{"input": "5\n5", "output": "10", "testtype": "functional"}]}])
    d = CodeDomain(files={"train": apps, "test": lcb}, n_heldout=0, workers=1)
    try:
        a1, a2 = d.tasks("train")
        l1, l2 = d.tasks("test")
        assert (a1.id, a1.difficulty, a1.visible["kind"], a2.visible["kind"]) == ("a1", 1, "stdio", "function")
        assert "Input:\n1 2" in a1.prompt and "10 -1" not in a1.prompt
        answers = {"a1": "a, b = map(int, input().split())\nprint(a + b)", "a2": "def twice(x):\n    return 2 * x",
                   "l1": "n = int(input())\nprint(n * n)",
                   "l2": "class Solution:\n    def add(self, a, b):\n        return a + b"}
        for t in (a1, a2, l1, l2):
            full = d.verify_full(t, f"```python\n{answers[t.id]}\n```")
            assert full["visible"]["correct"] and full["hidden"]["correct"], (t.id, full)
            wrong = d.verify_full(t, "```python\nprint(0)\n```")
            assert not wrong["hidden"]["correct"]
    finally:
        d.close()


@pytest.mark.parametrize("line, problem", [
    ("{not json", "invalid JSON"),
    (json.dumps({"input_output": {"inputs": ["1"], "outputs": ["1"]}}), "missing field 'question'"),
    (json.dumps({"question": "q", "input_output": {"inputs": ["1", "2"], "outputs": ["1"]}}), "same length"),
    (json.dumps({"question": "q", "input_output": "eJzT0yMAAGTvBe8="}), "not JSON"),
    (json.dumps({"question_content": "q", "public_test_cases": [], "private_test_cases": []}), "at least one public"),
])
def test_a_malformed_line_names_file_and_line(tmp_path, line, problem):
    good = json.dumps({"question": "ok", "input_output": {"inputs": ["1", "2"], "outputs": ["1", "2"]}})
    path = _write(tmp_path, "bad.jsonl", [good, line])
    with pytest.raises(TaskFormatError, match=problem) as err:
        load_code_tasks(path, "train")
    assert str(err.value).startswith(f"{path}:2: ")


def test_config_accepts_code_and_validates_its_levels():
    cfg = parse_config({"domain": {"name": "code", "difficulty": [1, 4], "n_train": 4, "n_heldout": 2, "n_test": 2}})
    d = build_domain(cfg.domain)
    assert isinstance(d, CodeDomain) and {t.difficulty for t in d.tasks("train")} == {1, 4}
    with pytest.raises(ConfigError, match="not a level of the code domain"):
        parse_config({"domain": {"name": "code", "difficulty": 5}})
    with pytest.raises(ValueError, match="leak_share plants answers in math prompts only"):
        CodeDomain(n_train=2, n_heldout=1, n_test=1, leak_share=0.5)
