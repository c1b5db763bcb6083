"""One-token edits of a source line (domains/swe/token_edits.py): what a guided edit may write under
``guided_edit: token``. Every variant changes exactly one operator, comparison or integer; strings,
comments, names and unary signs are never touched, so a variant of a line that parses parses too."""

import ast

import pytest

from evotrainer.domains.swe.token_edits import MAX_VARIANTS, token_variants


def test_binary_operators_comparisons_and_integers_each_change_once():
    assert token_variants("    return a + b") == [f"    return a {op} b" for op in ("-", "*", "/", "//", "%")]
    got = token_variants("    if x < 10:")
    assert got[:5] == [f"    if x {op} 10:" for op in ("<=", ">", ">=", "==", "!=")]
    assert got[5:] == ["    if x < 9:", "    if x < 11:"]
    assert token_variants("    return n - 0") [-1] == "    return n - 1"   # no negative literal from 0
    assert "    return n - -1" not in token_variants("    return n - 0")


def test_strings_comments_names_and_unary_signs_are_left_alone():
    assert token_variants('    s = "a+b"  # x - y') == []
    assert token_variants("def f(x):") == []
    assert token_variants("    return -1") == ["    return -0", "    return -2"]   # never "return *1"
    assert all("(-x)" in v for v in token_variants("    return f(-x) - y"))
    assert token_variants("    y = 0x10 + 3.5")[0] == "    y = 0x10 - 3.5"         # only decimal integers move


@pytest.mark.parametrize("line", ["    return total // (n - 1)", "    if lo <= x < hi + 2:", "    x = [1, 2,",
                                  "    return a if a < 0 else -a", "    return '''", "        total += price * 3"])
def test_every_variant_differs_by_one_token_and_parses_where_the_line_did(line):
    variants = token_variants(line)
    assert len(variants) == len(set(variants)) <= MAX_VARIANTS and line not in variants
    for v in variants:
        assert v.split()[0] == line.split()[0] and len(v.split()) == len(line.split())
        assert sum(a != b for a, b in zip(v.split(), line.split())) <= 2   # "(n" vs "(n": one word may hold it
    try:
        ast.parse(line.strip())
    except SyntaxError:
        return
    for v in variants:
        ast.parse(v.strip())


def test_a_long_line_is_capped():
    line = "    x = " + " + ".join(f"a{i}" for i in range(20))
    assert len(token_variants(line)) == MAX_VARIANTS


def test_every_level_1_fix_is_a_variant_of_the_buggy_line_when_an_edit_can_name_it():
    """The grammar does not know the bug, but the fix is in its reach: for each level-1 bug of the
    catalogue whose buggy line its file holds once, the correct line is one of that line's variants."""
    from evotrainer.domains.swe.environment import unique_lines
    from evotrainer.domains.swe.generator import TEMPLATES, catalogue

    nameable = 0
    for bug in (b for b in catalogue() if b.level == 1):
        clean = TEMPLATES[bug.module]["source"]
        buggy = bug.mutation.apply(clean)
        before, after = (s.splitlines()[bug.mutation.line - 1] for s in (buggy, clean))
        if before in unique_lines(buggy):
            nameable += 1
            assert after in token_variants(before), bug.key
    assert nameable >= 70


def test_an_environment_says_whether_its_issue_quotes_a_line_a_token_edit_can_change():
    """Where `quoted` and `token` guided edits differ, read by the report (``quoted_line_rate``): every
    level-0 issue of the generator quotes its wrong line; no level-1, 2 or 3 issue quotes an editable line,
    though they quote calls and names. An episode's record carries it."""
    from evotrainer.domains import get_domain
    from evotrainer.domains.swe.environment import SWEEnvironment

    curriculum = get_domain("swe", n_train=24, n_heldout=5, n_test=5, difficulty=[0, 1], seed=3)
    levels = {0: [], 1: []}
    for task in curriculum.tasks("train") + curriculum.tasks("heldout"):
        levels[task.difficulty].append(curriculum.environment(task).quotes_a_line)
    assert levels[0] and all(levels[0]) and levels[1] and not any(levels[1])
    for level in (2, 3):
        domain = get_domain("swe", n_train=8, n_heldout=5, n_test=5, difficulty=level, seed=3)
        assert not any(domain.environment(t).quotes_a_line for t in domain.tasks("train"))
    files = {"pkg/mod.py": "def f(x):\n    return x + 1\n", "tests/test_mod.py": "def test_f():\n    assert f(1) == 2\n"}
    assert SWEEnvironment(files, issue="The wrong line: `return x + 1`.").quotes_a_line
    assert not SWEEnvironment(files, issue="`f(1)` returns the wrong value").quotes_a_line
    assert not SWEEnvironment(files, issue="The test line: `assert f(1) == 2`.").quotes_a_line   # a test file's line
