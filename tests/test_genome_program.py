"""HarnessProgram, the contract check and the edits (search/replace, rewrite, crossover, factors)."""

from __future__ import annotations

import textwrap

import pytest

from evotrainer.genome import (
    ContractError,
    EditError,
    HarnessProgram,
    SingleFactorError,
    apply_search_replace,
    check_contract,
    check_single_factor,
    crossover,
    factors_changed,
    reference_program,
    rewrite_hook,
)
from evotrainer.genome.program import HOOKS

REF = reference_program()


def prog(src: str) -> HarnessProgram:
    return HarnessProgram(textwrap.dedent(src))


def sr(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"


SMALL = prog('''\
    """A small harness."""
    import math

    SCALE = 2.0


    def _clip(x):
        return max(0.0, min(1.0, x))

    # EVOLVE-BLOCK-START
    KNOBS = {
        "temperature": {"value": 1.0, "range": [0.3, 1.5]},  # sampling
        "num_generations": {"value": 4, "choices": [2, 4, 8]},
    }
    # EVOLVE-BLOCK-END

    # EVOLVE-BLOCK-START
    def reward(rollouts, tasks):
        return [_clip(1.0 if r["visible"].get("correct") else 0.0) for r in rollouts]
    # EVOLVE-BLOCK-END

    # EVOLVE-BLOCK-START
    def keep_groups(groups):
        return [True for _ in groups]
    # EVOLVE-BLOCK-END

    # EVOLVE-BLOCK-START
    def metrics(rollouts, groups):
        return {"n": float(len(rollouts)) * SCALE, "x": _clip(0.5)}
    # EVOLVE-BLOCK-END


    def alerts(metrics, history):
        return []
    ''')


# ---- identity ------------------------------------------------------------------------------------------
def test_hash_ignores_comments_formatting_and_docstrings():
    a = prog('''\
        def reward(rollouts, tasks):
            """Docstring."""
            return [1.0 for r in rollouts]  # comment
        ''')
    b = prog('''\
        # a leading comment


        def reward( rollouts,
                    tasks ):
            return [ 1.0
                     for r in rollouts ]
        ''')
    assert a.hash == b.hash and a.source != b.source and len(a.hash) == 64
    assert prog("x = 'a'\n").hash == prog('x = "a"\n').hash
    assert prog("x = 1\n").hash != prog("x = 2\n").hash


def test_reference_program_meets_the_contract():
    check_contract(REF)
    assert set(REF.hooks) == set(HOOKS)
    assert REF.knob_values["learning_rate"] == 1e-04 and REF.knob_values["loss_type"] == "dapo"
    assert REF.knob_values["epsilon_high"] == 0.28 and REF.knob_values["beta"] == 0.0
    assert REF.knobs["learning_rate"]["log"] is True
    assert REF.hooks["reward"].startswith("def reward(rollouts, tasks):")


# ---- knobs ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("knobs,needle", [
    ('{"lr": {"range": [0, 1]}}', "no 'value'"),
    ('{"lr": {"value": 0.5}}', "exactly one of 'range' or 'choices'"),
    ('{"lr": {"value": 0.5, "range": [0, 1], "choices": [0.5]}}', "exactly one of"),
    ('{"lr": {"value": 2.0, "range": [0, 1]}}', "outside the range"),
    ('{"lr": {"value": 0.5, "range": [1, 0]}}', "lo <= hi"),
    ('{"g": {"value": 3, "choices": [2, 4]}}', "not one of the choices"),
    ('{"m": {"value": 1, "choices": [True, False]}}', "not one of the choices"),
    ('{"g": {"value": 2, "choices": []}}', "non-empty list"),
    ('{"lr": {"value": 0.5, "range": [0, 1], "log": True}}', "log-scaled range must be positive"),
    ('{"lr": {"value": 0.5, "rnage": [0, 1]}}', "unknown field"),
    ('{"lr": 0.5}', "must be a dict"),
    ('{"lr": {"value": LR, "range": [0, 1]}}', "must be a literal"),
    ('dict(lr=1)', "must be a dict literal"),
])
def test_bad_knobs_raise_contract_errors(knobs, needle):
    p = HarnessProgram(f"KNOBS = {knobs}\n")
    with pytest.raises(ContractError, match=needle.replace("(", r"\(")):
        _ = p.knobs
    with pytest.raises(ContractError):
        check_contract(p)


def test_no_knobs_is_an_empty_dict():
    assert prog("def reward(rollouts, tasks):\n    return []\n").knobs == {}


def test_with_knobs_rewrites_only_the_values():
    child = REF.with_knobs(learning_rate=1e-4, loss_type="grpo", mask_truncated_completions=True)
    assert child.knob_values["learning_rate"] == 1e-4 and child.knob_values["loss_type"] == "grpo"
    assert child.knob_values["mask_truncated_completions"] is True
    changed = [(a, b) for a, b in zip(REF.lines, child.lines) if a != b]
    assert len(changed) == 3 and len(REF.lines) == len(child.lines)
    assert "# clip-higher (DAPO)" in child.source  # comments kept
    assert child.hash != REF.hash and REF.knob_values["learning_rate"] == 1e-04  # immutable
    with pytest.raises(ContractError, match="outside the range"):
        REF.with_knobs(temperature=9.0)
    with pytest.raises(ContractError, match="unknown knob"):
        REF.with_knobs(nope=1)


# ---- EVOLVE blocks ---------------------------------------------------------------------------------------
def test_evolve_blocks_are_line_spans_with_text():
    blocks = REF.evolve_blocks
    assert len(blocks) == 9  # KNOBS + eight hooks
    assert blocks[0].text.startswith("KNOBS = {")
    for b in blocks:
        assert REF.lines[b.start - 2].strip() == "# EVOLVE-BLOCK-START"
        assert REF.lines[b.end].strip() == "# EVOLVE-BLOCK-END"
        assert b.text == "\n".join(REF.lines[b.start - 1 : b.end])


@pytest.mark.parametrize("src,needle", [
    ("# EVOLVE-BLOCK-START\nx = 1\n", "never closed"),
    ("x = 1\n# EVOLVE-BLOCK-END\n", "without a START"),
    ("# EVOLVE-BLOCK-START\n# EVOLVE-BLOCK-START\n# EVOLVE-BLOCK-END\n", "inside an open"),
])
def test_unbalanced_evolve_markers(src, needle):
    with pytest.raises(ContractError, match=needle):
        _ = HarnessProgram(src).evolve_blocks


# ---- search / replace ----------------------------------------------------------------------------------
def test_search_replace_applies_inside_evolve_blocks():
    diff = "Make the reward denser.\n" + sr(
        '    return [1.0 if r["visible"].get("correct") else 0.0 for r in rollouts]',
        '    return [1.0 if r["visible"].get("correct") else 0.1 * bool(r["visible"].get("format_ok"))'
        ' for r in rollouts]')
    child = apply_search_replace(REF, diff)
    assert "0.1 * bool" in child.hooks["reward"]
    check_contract(child)
    assert check_single_factor(REF, child) == ["hook:reward"]


def test_search_replace_several_blocks_in_order():
    diff = sr('    "temperature": {"value": 1.0, "range": [0.3, 1.5]},  # sampling',
              '    "temperature": {"value": 0.7, "range": [0.3, 1.5]},  # sampling') + "\n" + \
        sr("    return [True for _ in groups]", "    return [len(g) > 1 for g in groups]")
    child = apply_search_replace(SMALL, diff)
    assert child.knob_values["temperature"] == 0.7
    assert factors_changed(SMALL, child) == ["knob:temperature", "hook:keep_groups"]


def test_search_replace_tolerates_trailing_whitespace_only():
    child = apply_search_replace(SMALL, sr("    return [True for _ in groups]   ", "    return [False]"))
    assert "False" in child.hooks["keep_groups"]
    with pytest.raises(EditError, match="not found"):
        apply_search_replace(SMALL, sr("return [True for _ in groups]", "return []"))  # indentation matters


@pytest.mark.parametrize("diff,needle", [
    (sr("    return nothing_like_this", "x"), "block 1: SEARCH text not found"),
    (sr("    return [True for _ in groups]", "    return []") + sr("    zzz", "y"), "block 2: SEARCH text not found"),
    (sr("# EVOLVE-BLOCK-END", ""), "block 1: edits must not add, move or remove EVOLVE-BLOCK markers"),
    (sr("def _clip(x):\n    return max(0.0, min(1.0, x))", "def _clip(x):\n    return x"),
     "block 1: lines 7-8 are outside"),
    (sr("    return []", "    return [1]"), "block 1: lines .* are outside"),
    (sr("", "x = 1"), "block 1: SEARCH is empty"),
    ("just prose, no blocks", "no SEARCH/REPLACE blocks"),
    ("<<<<<<< SEARCH\nx\n>>>>>>> REPLACE\n", "block 1: expected ======="),
    ("<<<<<<< SEARCH\nx\n=======\ny\n", "block 1: not closed"),
])
def test_search_replace_errors_name_the_block_and_reason(diff, needle):
    with pytest.raises(EditError, match=needle):
        apply_search_replace(SMALL, diff)


def test_search_replace_with_several_matches_is_refused():
    src = SMALL.source.replace("    return [True for _ in groups]",
                               "    x = 1\n    x = 1\n    return [True for _ in groups]")
    with pytest.raises(EditError, match=r"block 1: SEARCH text matches 2 places \(lines \d+, \d+\)"):
        apply_search_replace(HarnessProgram(src), sr("    x = 1", "    x = 2"))


# ---- rewrite and crossover --------------------------------------------------------------------------------
def test_rewrite_hook_replaces_the_function():
    new = "def keep_groups(groups):\n    return [len(set(r['completion'] for r in g)) > 1 for g in groups]\n"
    child = rewrite_hook(SMALL, "keep_groups", new)
    assert child.hooks["keep_groups"] == new.strip()
    assert factors_changed(SMALL, child) == ["hook:keep_groups"]
    assert child.evolve_blocks and len(child.evolve_blocks) == len(SMALL.evolve_blocks)


def test_rewrite_hook_appends_a_missing_hook_in_a_new_block():
    child = rewrite_hook(SMALL, "validity", "def validity(rollouts, metrics, history):\n    return []")
    assert "validity" in child.hooks and len(child.evolve_blocks) == len(SMALL.evolve_blocks) + 1
    check_contract(child)


@pytest.mark.parametrize("hook,src,needle", [
    ("reward", "def reward(rollouts, tasks)\n    return []", "syntax error"),
    ("reward", "def other(rollouts, tasks):\n    return []", "exactly one top-level 'def reward"),
    ("nope", "def nope():\n    pass", "not a hook"),
    ("alerts", "def alerts(metrics, history):\n    return [1]", "outside the EVOLVE blocks"),
])
def test_rewrite_hook_errors(hook, src, needle):
    with pytest.raises(EditError, match=needle):
        rewrite_hook(SMALL, hook, src)


def test_crossover_takes_one_knob_or_one_hook_from_b():
    b = SMALL.with_knobs(temperature=0.5)
    child = crossover(SMALL, b, "knob:temperature")
    assert child.knob_values["temperature"] == 0.5 and factors_changed(SMALL, child) == ["knob:temperature"]
    b2 = rewrite_hook(REF, "keep_groups",
                      "def keep_groups(groups):\n    return [_pstd([r['reward'] for r in g]) > 0 for g in groups]")
    child2 = crossover(SMALL, b2, "hook:keep_groups")  # carries the helper _pstd (and math, already there)
    assert "_pstd" in child2.source and factors_changed(SMALL, child2) == ["hook:keep_groups"]
    check_contract(child2)


def test_crossover_errors():
    with pytest.raises(EditError, match="no knob"):
        crossover(SMALL, REF, "knob:learning_rate")
    with pytest.raises(EditError, match="does not define hook"):
        crossover(REF, SMALL, "hook:validity")
    b = SMALL.with_source(SMALL.source.replace("return max(0.0, min(1.0, x))", "return x"))
    with pytest.raises(EditError, match="helper '_clip' differs"):
        crossover(SMALL, b, "hook:reward")
    with pytest.raises(EditError, match="factor must be"):
        crossover(SMALL, b, "reward")


# ---- the single-factor rule --------------------------------------------------------------------------------
def test_factors_and_the_single_factor_rule():
    assert check_single_factor(REF, REF.with_knobs(beta=0.1)) == ["knob:beta"]
    # Formatting and comments only: no factor changed -> rejected.
    cosmetic = REF.with_source(REF.source.replace("def reward(rollouts, tasks):", "def reward(rollouts, tasks):  # hi"))
    with pytest.raises(SingleFactorError, match="changes no factor") as info:
        check_single_factor(REF, cosmetic)
    assert info.value.factors == []
    two = REF.with_knobs(beta=0.1, temperature=0.8)
    with pytest.raises(SingleFactorError, match=r"2 factors \(knob:beta, knob:temperature\)") as info:
        check_single_factor(REF, two)
    assert info.value.factors == ["knob:beta", "knob:temperature"]
    assert check_single_factor(REF, two, allow_multi=True) == ["knob:beta", "knob:temperature"]


def test_a_helper_change_counts_for_every_hook_that_uses_it():
    child = SMALL.with_source(SMALL.source.replace("return max(0.0, min(1.0, x))", "return max(0.0, x)"))
    assert factors_changed(SMALL, child) == ["hook:reward", "hook:metrics"]
    const = SMALL.with_source(SMALL.source.replace("SCALE = 2.0", "SCALE = 3.0"))
    assert factors_changed(SMALL, const) == ["hook:metrics"]
    added = rewrite_hook(SMALL, "validity", "def validity(rollouts, metrics, history):\n    return []")
    assert factors_changed(SMALL, added) == ["hook:validity"]


# ---- contract check ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("src,needle", [
    ("def reward(rollouts, tasks)\n    return []\n", "syntax error at line 1"),
    ("x = 1\n\ndef f(:\n    pass\n", "syntax error at line 3"),
    ("def reward(rollouts):\n    return []\n", r"hook reward must take \(rollouts, tasks\), got \(rollouts\)"),
    ("def advantages(groups, rewards, extra):\n    return []\n", "hook advantages must take"),
    ("def metrics(*args):\n    return {}\n", r"got \(\*args\)"),
    ("def alerts(metrics, history, **kw):\n    return []\n", "hook alerts must take"),
    ("async def reward(rollouts, tasks):\n    return []\n", "must be a plain def"),
    ("reward = lambda rollouts, tasks: []\n", "must be defined with def"),
    ("import os\n", "line 1: import of 'os' is not allowed"),
    ("import numpy.linalg\nfrom collections import Counter\nimport subprocess as sp\n",
     "line 3: import of 'subprocess'"),
    ("from os import path\n", "import from 'os' is not allowed"),
    ("from . import x\n", "relative imports"),
    ("x = ().__class__.__base__.__subclasses__()\n", "dunder attribute '__subclasses__'"),
    ("def f(g):\n    return g.__globals__\n", "dunder attribute '__globals__'"),
    ("y = eval('1')\n", "use of 'eval'"),
    ("exec('x = 1')\n", "use of 'exec'"),
    ("c = compile('1', 'f', 'eval')\n", "use of 'compile'"),
    ("f = open('/etc/passwd')\n", "use of 'open'"),
    ("m = __import__('os')\n", "use of '__import__'"),
    ("b = __builtins__\n", "use of '__builtins__'"),
    ("v = getattr(int, '__subclasses__')\n", "getattr.. needs a constant, public attribute"),
    ("v = getattr(int, name)\n", "getattr.. needs a constant"),
])
def test_contract_violations_are_one_clear_line(src, needle):
    with pytest.raises(ContractError, match=needle) as info:
        check_contract(src)
    assert "\n" not in str(info.value)


def test_contract_size_limits_and_allow_list():
    with pytest.raises(ContractError, match="bytes; the limit is 100"):
        check_contract(REF, max_bytes=100)
    with pytest.raises(ContractError, match="lines; the limit is 10"):
        check_contract(REF, max_lines=10)
    check_contract("import numpy as np\nx = getattr(np, 'mean')\nif __name__ == 'x':\n    pass\n")
    with pytest.raises(ContractError, match="'numpy' is not allowed"):
        check_contract("import numpy\n", allowed_imports=("math",))


def test_a_genome_nested_past_the_parsers_limit_is_a_contract_error():
    # An LLM's genome of thousands of chained operators makes ast.parse raise RecursionError or
    # MemoryError: a genome that does not parse, refused with a reason, never a crash of the engine.
    for expr in ["1" + "+1" * 20000, "-" * 20000 + "1"]:
        p = HarnessProgram(f"def reward(rollouts, tasks):\n    return [{expr}]\n")
        with pytest.raises(ContractError, match="unparseable source"):
            check_contract(p)
    with pytest.raises(EditError, match="does not parse"):
        rewrite_hook(reference_program(), "reward",
                     "def reward(rollouts, tasks):\n    return [" + "-" * 20000 + "1]\n")


def test_hooks_reading_names_the_hooks_that_read_a_knob_through_helpers_and_fallbacks():
    """scale_rewards is read by the reference's advantages hook only; a genome's own helper that reads a knob
    counts for the hook that calls it; the KNOBS literal itself (which names every knob) does not."""
    from evotrainer.genome.edits import hooks_reading

    ref = reference_program()
    assert hooks_reading(ref, "scale_rewards") == {"advantages"}
    assert hooks_reading(ref, "learning_rate") == set()   # a trainer setting: no hook reads it
    helper = ref.with_source(ref.source + '''

def _bonus():
    return KNOBS["scale_rewards"]["value"] == "none"


def reward(rollouts, tasks):
    return [float(bool(r["visible"].get("correct"))) + (0.1 if _bonus() else 0.0) for r in rollouts]
''')
    assert hooks_reading(helper, "scale_rewards") == {"advantages", "reward"}
