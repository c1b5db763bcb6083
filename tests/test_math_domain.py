"""Behavioural tests of the math domain: generator, splits, planted leak, loaders, verifier."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evotrainer.domains import Domain, get_domain, known_domains, register_domain
from evotrainer.domains.math.domain import MathDomain
from evotrainer.domains.math.loaders import TaskFormatError, load_gsm8k, load_jsonl_tasks, load_math
from evotrainer.domains.math.tasks import (
    ANSWER_INSTRUCTION,
    LEVELS,
    TEMPLATE_FAMILIES,
    generate_tasks,
    level_capacity,
    make_splits,
)
from evotrainer.domains.math.verifier import extract_answer, verify_batch, verify_math
from evotrainer.domains.task import SPLITS, text_key

ALL_LEVELS = list(LEVELS)


def _as_dicts(splits):
    return {s: [t.to_dict() for t in ts] for s, ts in splits.items()}


# ---------------------------------------------------------------------------- generator / splits

def test_same_seed_same_tasks_other_seed_other_tasks():
    a = make_splits(20, 10, 10, ALL_LEVELS, seed=7)
    b = make_splits(20, 10, 10, ALL_LEVELS, seed=7)
    c = make_splits(20, 10, 10, ALL_LEVELS, seed=8)
    assert _as_dicts(a) == _as_dicts(b)
    assert [t.prompt for t in a["train"]] != [t.prompt for t in c["train"]]
    assert ([t.to_dict() for t in generate_tasks(15, "train", [2, 3], 1)]
            == [t.to_dict() for t in generate_tasks(15, "train", [2, 3], 1)])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n_train=st.integers(0, 40), n_heldout=st.integers(0, 20),
       n_test=st.integers(0, 20),
       levels=st.lists(st.sampled_from(ALL_LEVELS), min_size=1, max_size=5, unique=True))
def test_splits_are_disjoint_unique_and_sized(seed, n_train, n_heldout, n_test, levels):
    splits = make_splits(n_train, n_heldout, n_test, levels, seed)
    assert {s: len(ts) for s, ts in splits.items()} == {
        "train": n_train, "heldout": n_heldout, "test": n_test}
    keys = [text_key(t.prompt) for s in SPLITS for t in splits[s]]
    assert len(keys) == len(set(keys)), "a prompt appears twice (within or across splits)"
    ids = [t.id for s in SPLITS for t in splits[s]]
    assert len(ids) == len(set(ids))
    for s in SPLITS:
        assert all(t.split == s and t.domain == "math" and t.difficulty in levels
                   for t in splits[s])


def test_evaluation_sets_do_not_move_when_train_budget_changes():
    small = make_splits(10, 8, 8, [2, 3], seed=3)
    large = make_splits(50, 8, 8, [2, 3], seed=3)
    assert _as_dicts(small)["test"] == _as_dicts(large)["test"]
    assert _as_dicts(small)["heldout"] == _as_dicts(large)["heldout"]


def test_answers_recompute_from_stored_operands():
    for t in generate_tasks(300, "train", ALL_LEVELS, seed=11):
        expr = t.hidden["expression"]
        assert re.fullmatch(r"[\d +*-]+", expr)
        value = eval(expr)  # digits and + - * only (checked above)
        assert t.answer == t.hidden["answer"] == str(value)
        assert value >= 0
        assert [int(x) for x in re.findall(r"\d+", expr)] == t.hidden["operands"]
        for x in t.hidden["operands"]:  # the question states every operand
            assert re.search(rf"(?<!\d){x}(?!\d)", t.prompt)
        assert t.prompt.endswith("\n" + ANSWER_INSTRUCTION)


_LEVEL_SHAPES = {
    1: r"\d \+ \d",
    2: r"\d\d [+-] \d\d",
    3: r"\d+ [+-] \d+",
    4: r"\d+ \+ \d+ - \d+",
    5: r"\d+ [-+*] \d+ [-+*] \d+ [-+*] \d+",
}


@pytest.mark.parametrize("level", ALL_LEVELS)
def test_each_level_produces_its_template_family(level):
    tasks = generate_tasks(80, "train", level, seed=5)
    assert {t.difficulty for t in tasks} == {level}
    assert {t.hidden["template"] for t in tasks} == set(TEMPLATE_FAMILIES[level])
    for t in tasks:
        assert re.fullmatch(_LEVEL_SHAPES[level], t.hidden["expression"]), t.hidden
    if level <= 2:
        assert all(t.prompt.startswith("What is ") for t in tasks)
    else:  # word problems: names and objects, not a bare expression
        assert not any(t.prompt.startswith("What is ") for t in tasks)
    if level == 5:
        assert all("*" in t.hidden["expression"] for t in tasks)


def test_mixed_levels_are_balanced():
    tasks = generate_tasks(30, "heldout", [1, 3, 5], seed=2)
    assert sorted(t.difficulty for t in tasks) == [1] * 10 + [3] * 10 + [5] * 10


def test_exhausted_level_raises_clear_error():
    assert level_capacity(1) == 100
    assert len(generate_tasks(100, "train", 1, seed=0)) == 100  # the whole space is usable
    with pytest.raises(ValueError, match="difficulty 1 has only 100"):
        make_splits(60, 30, 20, 1, seed=0)
    with pytest.raises(ValueError, match="difficulty must be one of"):
        generate_tasks(5, "train", 9, seed=0)
    with pytest.raises(ValueError, match="split must be one of"):
        generate_tasks(5, "valid", 1, seed=0)


# ---------------------------------------------------------------------------- planted leak

def test_leak_only_in_train_at_requested_share():
    clean = make_splits(100, 20, 20, [2, 3, 4], seed=4)
    leaky = make_splits(100, 20, 20, [2, 3, 4], seed=4, leak_share=0.25)
    leaked = [t for t in leaky["train"] if "leak" in t.visible]
    assert len(leaked) == 25
    for t in leaked:
        assert t.visible["leak"] == t.answer and t.hidden["leaked"]
        assert f"(Reference note: {t.answer})" in t.prompt
        assert t.prompt.endswith(ANSWER_INSTRUCTION)
    unleaked = [t for t in leaky["train"] if "leak" not in t.visible]
    assert all("Reference note" not in t.prompt for t in unleaked)
    # Same problems, same order: the leak changes only the chosen prompts.
    assert [t.id for t in leaky["train"]] == [t.id for t in clean["train"]]
    for s in ("heldout", "test"):
        assert _as_dicts(leaky)[s] == _as_dicts(clean)[s]
        assert not any("leak" in t.visible or "Reference note" in t.prompt for t in leaky[s])
    assert not any("leak" in t.visible for t in clean["train"])
    with pytest.raises(ValueError, match="leak_share"):
        make_splits(10, 0, 0, 2, seed=0, leak_share=1.5)


# ---------------------------------------------------------------------------- loaders

def _write(tmp_path, name, lines):
    p = tmp_path / name
    p.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return p


def test_load_gsm8k_and_math_files(tmp_path):
    g = _write(tmp_path, "gsm.jsonl", [
        {"question": "Tom has 3 cats and buys 4. How many?", "answer": "3+4=<<3+4=7>>7\n#### 7"},
        "",
        {"question": "A farm sells 1234 eggs.", "answer": "so\n#### 1,234"},
    ])
    tasks = load_gsm8k(g, "train")
    assert [t.answer for t in tasks] == ["7", "1234"]
    assert tasks[1].hidden["line"] == 3 and tasks[0].hidden["answer"] == "7"
    assert tasks[0].prompt.startswith("Tom has 3 cats") and tasks[0].split == "train"
    m = _write(tmp_path, "math.jsonl", [
        {"problem": "Simplify $1/\\sqrt{2}$.", "level": "Level 4",
         "solution": "We get $\\boxed{\\frac{\\sqrt{2}}{2}}$."},
        {"problem": "Sets?", "solution": "\\boxed{1} at first, finally \\boxed{\\{1,{2}\\}}",
         "unique_id": "test/x/1.json"},
    ])
    tasks = load_math(m, "test")
    assert [t.answer for t in tasks] == ["\\frac{\\sqrt{2}}{2}", "\\{1,{2}\\}"]
    assert tasks[0].difficulty == 4 and tasks[1].id == "test/x/1.json"
    assert [t.answer for t in load_jsonl_tasks(m, "test")] == [t.answer for t in tasks]
    assert [t.answer for t in load_jsonl_tasks(g, "train", format="auto")] == ["7", "1234"]


_BAD = {
    "bad_json": ('{"question": "x", "answer": "#### 1"', "gsm8k", "invalid JSON"),
    "not_object": ('[1, 2]', "gsm8k", "JSON object"),
    "missing_question": ({"answer": "#### 3"}, "gsm8k", "'question'"),
    "no_hashes": ({"question": "q", "answer": "the answer is 3"}, "gsm8k", "####"),
    "missing_solution": ({"problem": "p"}, "math", "'solution'"),
    "no_boxed": ({"problem": "p", "solution": "it is 3"}, "math", "boxed"),
    "unclosed_boxed": ({"problem": "p", "solution": "\\boxed{\\frac{1}{2}"}, "math", "boxed"),
}


@pytest.mark.parametrize("case", sorted(_BAD))
def test_malformed_line_names_file_line_and_problem(tmp_path, case):
    bad, fmt, needle = _BAD[case]
    good = ({"question": "q", "answer": "#### 1"} if fmt == "gsm8k"
            else {"problem": "p", "solution": "\\boxed{1}"})
    path = _write(tmp_path, f"{case}.jsonl", [good, good, bad])
    with pytest.raises(TaskFormatError) as err:
        load_jsonl_tasks(path, "train", format=fmt)
    msg = str(err.value)
    assert str(path) in msg and ":3:" in msg and needle in msg
    assert err.value.lineno == 3 and isinstance(err.value, ValueError)


def test_unknown_format_and_empty_file(tmp_path):
    path = _write(tmp_path, "other.jsonl", [{"text": "hi"}])
    with pytest.raises(TaskFormatError, match=r"other.jsonl:1: cannot tell the format"):
        load_jsonl_tasks(path, "train")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(TaskFormatError, match="no tasks"):
        load_jsonl_tasks(empty, "train")


# ---------------------------------------------------------------------------- verifier

@pytest.mark.parametrize("completion, reference, correct, format_ok, method", [
    ("So the total is \\boxed{12}.", "12", True, True, "boxed"),
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{\\sqrt{2}}{2}", True, True, "boxed"),
    ("First \\boxed{3}, corrected: \\boxed{\\frac{3}{4}}", "0.75", True, True, "boxed"),
    ("5 + 7 = 12\nAnswer: 12", "12", True, True, "answer_tag"),
    ("The answer is: 12 apples.", "12", True, True, "answer_tag"),
    ("She has 5 and then 7 more, so 12", "12", True, False, "last_number"),
    ("Answer: **$12$**.", "12", True, True, "answer_tag"),
    ("Answer: 13", "12", False, True, "answer_tag"),
    ("I think 11", "12", False, False, "last_number"),
    ("Answer: 12.0", "12", True, True, "answer_tag"),
    ("Answer: -3", "-3", True, True, "answer_tag"),
    ("Answer: 3", "-3", False, True, "answer_tag"),
    ("It drops to -3 degrees", "-3", True, False, "last_number"),
    ("Answer: 1,000", "1000", True, True, "answer_tag"),
    ("\\boxed{1000}", "1,000", True, True, "boxed"),
    ("Answer: 3 + 5", "8", False, True, "answer_tag"),  # echoing the question is not an answer
    ("no numbers here", "8", False, False, "none"),
])
def test_verify_math_cases(completion, reference, correct, format_ok, method):
    v = verify_math(completion, reference)
    assert (v["correct"], v["format_ok"], v["method"]) == (correct, format_ok, method), v


def test_extract_answer_order():
    assert extract_answer("Answer: 4 but \\boxed{5} and 6") == ("5", "boxed")
    assert extract_answer("Answer: 4 and later 6") == ("4 and later 6", "answer_tag")
    assert extract_answer("4 then 6") == ("6", "last_number")
    # An echoed instruction is not an answer tag.
    assert extract_answer(f"{ANSWER_INSTRUCTION}\nI think 7") == ("7", "last_number")
    assert extract_answer(f"{ANSWER_INSTRUCTION} 7") == ("7", "answer_tag")


@pytest.mark.parametrize("garbage", [None, 123, "", "   ", "}}}{{\\boxed{", "\\boxed{}",
                                     "\x00\xff\ud7ff", "Answer: \\frac{", "((((((((", "$$$$"])
def test_garbage_is_incorrect_not_an_error(garbage):
    v = verify_math(garbage, "12")
    assert v["correct"] is False and set(v) >= {"correct", "format_ok", "extracted", "method"}


def test_expensive_input_does_not_hang():
    start = time.monotonic()
    for c in ("\\boxed{10^{10^{10^{10}}}}", "Answer: 9**9**9**9", "\\boxed{2^{99999999}}"):
        assert verify_math(c, "x^2")["correct"] is False
    assert verify_math("\\boxed{" * 20_000 + "\\boxed{12}", "12")["correct"] is True
    assert time.monotonic() - start < 30   # bounded (these would run for hours unscreened); slack for load


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=80))
def test_verify_never_raises(text):
    v = verify_math(text, "12")
    assert isinstance(v["correct"], bool) and isinstance(v["format_ok"], bool)


def test_symbolic_verify_works_off_the_main_thread():
    out = []
    th = threading.Thread(target=lambda: out.append(verify_math("\\boxed{x^2+1}", "1+x^2")))
    th.start()
    th.join(timeout=20)
    assert out and out[0]["correct"] is True


def test_verify_batch():
    res = verify_batch(["Answer: 1", "\\boxed{2}", "3"], ["1", "3", "3"])
    assert [r["correct"] for r in res] == [True, False, True]
    assert [r["format_ok"] for r in res] == [True, True, False]
    with pytest.raises(ValueError):
        verify_batch(["a"], [])


# ---------------------------------------------------------------------------- domain

def test_math_domain_generated_and_registry():
    d = get_domain("math", n_train=12, n_heldout=6, n_test=6, difficulty=[1, 2], seed=1)
    assert isinstance(d, Domain) and d.name == "math"
    assert [len(d.tasks(s)) for s in SPLITS] == [12, 6, 6]
    t = d.tasks("heldout")[0]
    assert d.verify(t, f"Answer: {t.answer}")["correct"]
    assert not d.verify(t, "Answer: -1")["correct"]
    assert [v["correct"] for v in d.verify_batch(d.tasks("test")[:2], ["0", "0"])] == [
        t.answer == "0" for t in d.tasks("test")[:2]]
    assert d.task_by_id(t.id) == t
    with pytest.raises(ValueError, match="known domains: .*math"):
        get_domain("chess")
    register_domain("toy", lambda **kw: MathDomain(n_train=2, n_heldout=1, n_test=1, **kw))
    assert "toy" in known_domains() and len(get_domain("toy", seed=3).tasks("train")) == 2


def test_math_domain_from_files_carves_heldout_and_rejects_overlap(tmp_path):
    rows = [{"question": f"What is {i} plus {i}?", "answer": f"#### {2 * i}"} for i in range(20)]
    train = _write(tmp_path, "train.jsonl", rows[:15])
    test = _write(tmp_path, "test.jsonl", rows[15:])
    d = MathDomain(files={"train": train, "test": test}, n_heldout=3, seed=0, leak_share=0.5)
    assert [len(d.tasks(s)) for s in SPLITS] == [12, 3, 5]
    keys = {s: {text_key(t.hidden["question"]) for t in d.tasks(s)} for s in SPLITS}
    assert not (keys["train"] & keys["heldout"]) and not (keys["train"] & keys["test"])
    assert sum("leak" in t.visible for t in d.tasks("train")) == 6
    assert not any("leak" in t.visible for s in ("heldout", "test") for t in d.tasks(s))
    overlap = _write(tmp_path, "overlap.jsonl", rows[10:])
    with pytest.raises(ValueError, match="overlap"):
        MathDomain(files={"train": train, "test": overlap})
    with pytest.raises(ValueError, match="unknown split"):
        MathDomain(files={"valid": train})


def test_a_users_files_are_read_whole_unless_a_size_is_set_and_a_missing_test_file_is_said(tmp_path):
    """domain.n_train/n_heldout/n_test (128/32/32) are the generator's sizes: a 300-problem file used to
    train on 128 of them, and with no test file the final pick's test score was silently missing."""
    import warnings

    from evotrainer.config import parse_config
    from evotrainer.domains import build_domain
    from evotrainer.loop.tools.validate import validate_resources

    rows = [{"question": f"What is {i} plus {i}?", "answer": f"#### {2 * i}"} for i in range(340)]
    train, test = _write(tmp_path, "train.jsonl", rows[:300]), _write(tmp_path, "test.jsonl", rows[300:])
    cfg = parse_config({"model": "tiny-random", "domain": {"files": {"train": str(train), "test": str(test)}}})
    assert (cfg.domain.n_train, cfg.domain.n_heldout, cfg.domain.n_test) == (None, None, None)
    d = build_domain(cfg.domain)
    assert len(d.tasks("train")) + len(d.tasks("heldout")) == 300 and len(d.tasks("test")) == 40
    again = parse_config(json.loads(cfg.model_dump_json()))   # what a resumed run reads from config.json
    assert [t.id for t in build_domain(again.domain).tasks("train")] == [t.id for t in d.tasks("train")]
    sized = parse_config({"model": "tiny-random", "domain": {"n_train": 50, "files": {"train": str(train)}}})
    assert len(build_domain(sized.domain).tasks("train")) == 50
    generated = parse_config({"model": "tiny-random"})
    assert (generated.domain.n_train, generated.domain.n_test) == (128, 32)
    said = []
    validate_resources(sized, loop=False, say=said.append)
    assert any("no test file" in m for m in said), said
    said.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        validate_resources(cfg, loop=False, say=said.append)
    assert not any("no test file" in m for m in said), said
